#!/usr/bin/env bash
# Relay circuit benchmark on loopback (spec/relay-circuits.md): one `awp relay` and one load
# process (examples/circuit_bench.rs) comparing a direct TLS connection with a circuit
# through the relay (TLS end to end, copied as is by the relay): throughput, round-trip time,
# and the relay's memory per idle circuit. Goals: >= 80% of direct throughput, <= +0.2 ms.
#
#   scripts/bench-circuit.sh [MIB [CIRCUITS]]     (default 256 MiB, 200 circuits)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
mib=${1:-256}
circuits=${2:-200}
need=$((circuits * 4 + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi

AWP=$(cargo_exe awp --release --bin awp)
BENCH=$(cargo_exe circuit_bench --release --example circuit_bench)
work=$(mktemp -d)
relay_pid=""
cleanup() {
    if [ -n "$relay_pid" ]; then kill "$relay_pid" 2>/dev/null || true; wait "$relay_pid" 2>/dev/null || true; fi
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
"$BENCH" "tls:127.0.0.1:$port#$key" "$relay_pid" "$mib" "$circuits"
