#!/usr/bin/env bash
# Relay circuit benchmark on loopback (spec/relay-circuits.md), in two parts:
# 1. the stream: one `awp relay` and one load process (examples/circuit_bench.rs) comparing
#    a direct TLS connection with a circuit through the relay (TLS end to end, copied as is
#    by the relay): raw throughput of 16 KiB lines, round-trip time, the relay's CPU per GiB
#    and its memory per idle circuit, in ROUNDS rounds alternating the two paths (medians);
# 2. nodes: phase 8 of benches/node.rs, durable msgs pipelined to an `awp daemon` directly
#    and through a circuit of an `awp relay` it keeps a standing connection to (`--via`),
#    ROUNDS rounds alternating (BENCH_CIRCUIT_N msgs per round, default 30,000).
# Goals (issue 14): circuit >= 80% of direct throughput, <= +0.2 ms round trip. On a
# 2-core machine the stream figure is a stress case (both TLS ends, the relay and the
# kernel's two loopback TCP hops share two cores; its rounds vary by a factor of two);
# the nodes' figure is what a node gets through a circuit.
#
#   scripts/bench-circuit.sh [MIB [CIRCUITS [ROUNDS]]]   (default 256 MiB, 200 circuits, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
mib=${1:-256}
circuits=${2:-200}
rounds=${3:-3}
need=$((circuits * 4 + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi

AWP=$(awp_exe --release)
BENCH=$(cargo_exe circuit_bench --release --example circuit_bench)
work=$(mktemp -d)
relay_pid=""
cleanup() {
    if [ -n "$relay_pid" ]; then kill "$relay_pid" 2>/dev/null || true; wait "$relay_pid" 2>/dev/null || true; fi
    # Part 2's nodes, should the bench process itself have been killed.
    if [ -f "$work/pids" ]; then
        while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
    fi
    rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/relay"; chmod 700 "$work/relay"
printf '[relay]\nmax_circuits_per_key = %d\nmax_circuits = %d\n' $((circuits + 10)) $((circuits + 10)) \
    >"$work/relay/config.toml"
RUST_LOG=warn "$AWP" --home "$work/relay" relay --listen "tls:127.0.0.1:$port" \
    --max-connections $((circuits * 2 + 100)) >"$work/relay.log" 2>&1 &
relay_pid=$!
key=""
for _ in $(seq 100); do
    key=$("$AWP" --home "$work/relay" --json status 2>/dev/null | sed -n 's/.*"key":"\([^"]*\)".*/\1/p') && [ -n "$key" ] && break
    sleep 0.1
done
result=$("$BENCH" "tls:127.0.0.1:$port#$key" "$relay_pid" "$mib" "$circuits" "$rounds")
echo "$result"
python3 - "$result" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
d, c = r["direct"], r["circuit"]
ratio, added = r["throughput_ratio"], r["added_rtt_us_p50"]
met = lambda ok: "MET" if ok else "MISSED"
print(f"\ncircuit through the relay vs direct, loopback, medians of {len(d['rounds'])} rounds "
      f"(load average {sys.argv[2]}):")
print(f"  throughput: direct {d['mib_per_s']:.0f} MiB/s, circuit {c['mib_per_s']:.0f} MiB/s = "
      f"{ratio * 100:.0f} % of direct (rounds "
      f"{', '.join(f'{x * 100:.0f} %' for x in r['throughput_ratios'])}); "
      f"goal >= 80 %: {met(ratio >= 0.8)}")
print(f"  round trip p50: direct {d['rtt_us_p50']:.1f} us, circuit {c['rtt_us_p50']:.1f} us = "
      f"+{added / 1000:.3f} ms; goal <= +0.2 ms: {met(added <= 200)}")
print(f"  relay CPU: {r['relay_cpu_s_per_gib']:.2f} s per GiB through the circuit (round trips included)")
print(f"  relay memory per idle circuit: {r['relay_kib_per_circuit']:.1f} KiB ({r['circuits']} circuits)")
EOF

# Part 2 runs its own relay: stop this one first, so it is not a neighbour there.
kill "$relay_pid" 2>/dev/null || true
wait "$relay_pid" 2>/dev/null || true
relay_pid=""
echo
AWP_BIN="$AWP" AWP_BENCH_PIDS="$work/pids" BENCH_ONLY=circuit BENCH_CIRCUIT_ROUNDS="$rounds" \
    cargo bench --quiet --bench node
