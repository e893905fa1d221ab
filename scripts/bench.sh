#!/usr/bin/env bash
# Benchmark of one release build on this machine, printed in one run: fsync latency of the
# disk that holds the node homes, handshake time, durable msg→ack round trip, pipelined
# throughput, resume replay of a prefilled outbox, CLI command start and the peak RSS of
# every node (benches/node.rs), then signed lines, blob transfer, relay memory, disk growth
# and artifact threads, and at the end the table of issue 10: every figure with its goal and
# MET/MISSED, next to the yardsticks of the same run (fsync p50, the `dd … conv=fsync` copy
# rate of a file of the blob's size, the spawn time of /bin/true). Nodes run as
# `awp daemon` processes in temporary homes on 127.0.0.1; they are killed when the run
# ends, also on failure or Ctrl-C.
#
# Usage: scripts/bench.sh [--quick]
#   --quick: the regression guard for CI (well under 60 s once built): small counts, only
#   fsync, round trip, pipelined (plain and with signed lines), replay, CLI start and the
#   per-line cost of signing and verifying, then the table. Fails (exit 1) only
#   on a gross regression: pipelined below 10,000 msgs/s, or round trip p50 above 5 × the
#   same run's fsync p50 but never below 1 ms (a disk whose fsync is far under the loopback
#   and TLS floor, about 0.4 ms on a 2-core VM, would otherwise fail a healthy build), or a
#   phase that could not run. A run over a bound is measured once more; only two in a
#   row fail (a busy moment of a shared machine passes). Figures are of the release build
#   either way (the goals are release figures; a debug build is several times slower and
#   would flake the guard on a loaded machine).
#
# Optional environment: AWP_BENCH_DIR (where the temporary homes go; default $TMPDIR or
# /tmp), BENCH_FSYNC_N, BENCH_HANDSHAKE_N, BENCH_RTT_N, BENCH_PIPE_N, BENCH_REPLAY_N,
# BENCH_CLI_N, BENCH_CIRCUIT_N (0 in --quick), BENCH_PHASE_LIMIT_S (see benches/node.rs), BENCH_BLOB_MIB (blob size,
# default 50), BENCH_RELAY_CLIENTS (default 10000), BENCH_DISK_N (lines of the disk-growth
# run, default 119000), BENCH_ARTIFACT_N.
set -euo pipefail

QUICK=0
case "${1:-}" in
--quick) QUICK=1 ;;
"") ;;
*)
    echo "usage: scripts/bench.sh [--quick]" >&2
    exit 2
    ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

WORK=$(mktemp -d "${AWP_BENCH_DIR:-${TMPDIR:-/tmp}}/awp-bench.XXXXXX")
PIDS="$WORK/pids"
SUMMARY="$WORK/summary"
: >"$PIDS"
: >"$SUMMARY"

cleanup() {
    # The bench kills its nodes itself; this catches a bench that was killed first.
    while read -r pid; do
        [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    done <"$PIDS"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$ROOT/scripts/lib.sh"
echo "building (release)…" >&2
# One build for the node and the harnesses: the awp executable is built with the
# dev-dependencies' features, as `cargo bench` builds it (scripts/lib.sh, awp_exe), so the
# library is compiled once and the awp the benches start is the one they were built with.
AWP=$(awp_exe --release)
cargo bench --quiet --bench node --bench sig --no-run

echo "commit   $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)')"
echo "kernel   $(uname -sr)"
echo "fs       $(df -PT "$WORK" | awk 'NR==2 {print $2 " on " $1 " mounted at " $7}')"
[ "$QUICK" = 1 ] && echo "mode     --quick (small counts; fails only on a gross regression)"

# name value → the summary file (read back for the table).
put() { echo "$1 $2" >>"$SUMMARY"; }
get() { awk -v k="$1" '$1 == k {v = $2} END {print v}' "$SUMMARY"; }

node_rc=0
if [ "$QUICK" = 1 ]; then
    AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" AWP_BENCH_PIDS="$PIDS" AWP_BENCH_SUMMARY="$SUMMARY" \
        BENCH_FSYNC_N="${BENCH_FSYNC_N:-100}" BENCH_HANDSHAKE_N="${BENCH_HANDSHAKE_N:-5}" \
        BENCH_RTT_N="${BENCH_RTT_N:-300}" BENCH_PIPE_N="${BENCH_PIPE_N:-30000}" \
        BENCH_REPLAY_N="${BENCH_REPLAY_N:-20000}" BENCH_CLI_N="${BENCH_CLI_N:-20}" \
        BENCH_PHASE_LIMIT_S="${BENCH_PHASE_LIMIT_S:-20}" BENCH_CIRCUIT_N="${BENCH_CIRCUIT_N:-0}" \
        cargo bench --quiet --bench node || node_rc=$?
    echo
    echo "signed lines (benches/sig.rs, 2,000 lines; phase 4b above is the pipelined figure with signed lines)"
    BENCH_SIG_N="${BENCH_SIG_N:-2000}" cargo bench --quiet --bench sig
else
    AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" AWP_BENCH_PIDS="$PIDS" AWP_BENCH_SUMMARY="$SUMMARY" \
        cargo bench --quiet --bench node || node_rc=$?

    echo
    echo "signed lines (benches/sig.rs; phase 4b above is the pipelined figure with signed lines)"
    cargo bench --quiet --bench sig

    echo
    MIB=${BENCH_BLOB_MIB:-50}
    # The disk's own copy rate, the yardstick of the blob figure: dd of a file of the
    # blob's size with fsync, on the file system of the homes.
    head -c $((MIB * 1024 * 1024)) /dev/urandom >"$WORK/dd.in"
    sync "$WORK/dd.in" 2>/dev/null || sync
    dd_out=$(LC_ALL=C dd if="$WORK/dd.in" of="$WORK/dd.out" bs=1M conv=fsync 2>&1 | tail -n 1)
    rm -f "$WORK/dd.in" "$WORK/dd.out"
    dd_mbs=$(echo "$dd_out" | awk '{for (i = 1; i < NF; i++) if ($(i+1) ~ /^s,?$/) s = $i; print $1 / s / 1e6}')
    echo "dd       $MIB MiB copy with conv=fsync: $dd_mbs MB/s ($dd_out)"
    put dd_mbs "$dd_mbs"
    blob_out=$(AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" bash "$ROOT/scripts/bench-blob.sh" "$MIB") || true
    echo "$blob_out"
    put blob_mbs "$(echo "$blob_out" | sed -n -E 's/.* ([0-9.]+) MB\/s.*/\1/p' | head -n 1)"

    echo
    CLIENTS=${BENCH_RELAY_CLIENTS:-10000}
    echo "7. relay: $CLIENTS connected nodes (scripts/bench-relay.sh)"
    relay_out=$(bash "$ROOT/scripts/bench-relay.sh" "$CLIENTS") || true
    echo "$relay_out"
    put relay_kib "$(echo "$relay_out" | sed -n -E 's/.*memory per connection: ([0-9.]+) KiB.*/\1/p' | head -n 1)"
    put relay_n "$(echo "$relay_out" | sed -n -E 's/^relay with ([0-9]+)\/.*/\1/p' | head -n 1)"

    echo
    bash "$ROOT/scripts/bench-disk.sh" "${BENCH_DISK_N:-119000}"
    echo "9. artifact threads (scripts/bench-artifact.sh)"
    AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" bash "$ROOT/scripts/bench-artifact.sh" "${BENCH_ARTIFACT_N:-10000}"
fi

# The table of issue 10: figure, value, goal, verdict. A figure that was not measured is
# MISSED in the full run and only reported in --quick (its guard is below).
echo
echo "Issue 10 table ($(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ))"
python3 - "$SUMMARY" "$QUICK" <<'PY'
import sys
vals = {}
for line in open(sys.argv[1]):
    k, _, v = line.strip().partition(" ")
    try:
        vals[k] = float(v)
    except ValueError:
        pass
quick = sys.argv[2] == "1"
g = vals.get
rows = []
def row(name, value, goal, met):
    verdict = "NOT MEASURED" if value is None else ("MET" if met else "MISSED")
    rows.append((name, "-" if value is None else value, goal, verdict))
fs = g("fsync_p50_ms")
pipe = g("pipe_msgs_s")
row("pipelined durable msgs (200 B, one TLS conn)", pipe and f"{pipe:,.0f} msgs/s", ">= 100,000 msgs/s", pipe is not None and pipe >= 100_000)
sp = g("pipe_signed_msgs_s")
row("pipelined durable msgs, signed lines (issue 13)", sp and f"{sp:,.0f} msgs/s", ">= 25,000 msgs/s", sp is not None and sp >= 25_000)
rtt = g("rtt_p50_ms")
if rtt is not None and fs:
    row("durable msg->ack round trip p50", f"{rtt:.3f} ms = {rtt / fs:.2f} x fsync p50", "<= 1.2 x fsync p50", rtt <= 1.2 * fs)
else:
    row("durable msg->ack round trip p50", None, "<= 1.2 x fsync p50", False)
if not quick:
    blob, dd = g("blob_mbs"), g("dd_mbs")
    goal = f">= 25% of dd ({0.25 * dd:.0f} MB/s)" if dd else ">= 25% of dd"
    row("50 MiB blob node to node over TLS", blob and f"{blob:.1f} MB/s", goal, blob is not None and dd is not None and blob >= 0.25 * dd)
    kib, n = g("relay_kib"), g("relay_n")
    row("relay memory per connection", kib and f"{kib:.1f} KiB at {n or 0:,.0f}", "<= 16 KiB at 10,000", kib is not None and kib <= 16 and (n or 0) >= 10_000)
    cr = g("circuit_ratio")
    row("pipelined through a relay circuit (issue 14)", cr and f"{cr * 100:.0f} % of direct", ">= 80 % of direct", cr is not None and cr >= 0.8)
rs, rn = g("replay_s"), g("replay_n")
if rs is not None and rn:
    goal = 0.25 * rn / 100_000
    row(f"resume replay of {rn:,.0f} lines", f"{rs:.3f} s", f"<= {goal:.3f} s (0.25 s per 100k)", rs <= goal)
else:
    row("resume replay", None, "<= 0.25 s per 100k lines", False)
cli = g("cli_p50_ms")
row("CLI command start p50 (awp status)", cli and f"{cli:.2f} ms", "<= 2 ms", cli is not None and cli <= 2.0)
w = [max(len(str(r[i])) for r in rows) for i in range(3)]
for r in rows:
    print(f"   {r[0]:<{w[0]}}  {str(r[1]):<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
yard = []
if fs:
    yard.append(f"fsync p50 {fs:.3f} ms")
if g("dd_mbs"):
    yard.append(f"dd copy {g('dd_mbs'):.0f} MB/s")
if g("spawn_p50_ms"):
    yard.append(f"/bin/true spawn p50 {g('spawn_p50_ms'):.2f} ms")
print("   yardsticks of this run: " + ("; ".join(yard) or "none measured"))
PY

if [ "$QUICK" = 1 ]; then
    # Gross-regression guard: generous bounds so a noisy shared machine does not flake it.
    guard() {
        python3 - "$(get pipe_msgs_s)" "$(get rtt_p50_ms)" "$(get fsync_p50_ms)" "$node_rc" <<'PY'
import sys
pipe, rtt, fs, rc = sys.argv[1:5]
bad = []
if rc != "0":
    bad.append(f"a bench phase failed (exit {rc})")
if not pipe or float(pipe) < 10_000:
    bad.append(f"pipelined {pipe or 'not measured'} msgs/s < 10,000")
# 5 x fsync, floored at 1 ms: see the usage note at the top.
if not rtt or not fs or float(rtt) > max(5 * float(fs), 1.0):
    bad.append(f"round trip p50 {rtt or '?'} ms > max(5 x fsync p50 {fs or '?'} ms, 1 ms)")
for b in bad:
    print(f"REGRESSION: {b}")
sys.exit(1 if bad else 0)
PY
    }
    if ! guard; then
        [ "$node_rc" = 0 ] || exit 1
        # A busy moment of a shared machine passes the second time; a regression fails
        # both. The second run's figures (appended to the summary) are the ones judged.
        echo "measuring once more: a gross regression fails twice in a row"
        AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" AWP_BENCH_PIDS="$PIDS" AWP_BENCH_SUMMARY="$SUMMARY" \
            BENCH_FSYNC_N="${BENCH_FSYNC_N:-100}" BENCH_HANDSHAKE_N="${BENCH_HANDSHAKE_N:-5}" \
            BENCH_RTT_N="${BENCH_RTT_N:-300}" BENCH_PIPE_N="${BENCH_PIPE_N:-30000}" \
            BENCH_REPLAY_N="${BENCH_REPLAY_N:-20000}" BENCH_CLI_N="${BENCH_CLI_N:-20}" \
            BENCH_PHASE_LIMIT_S="${BENCH_PHASE_LIMIT_S:-20}" BENCH_CIRCUIT_N="${BENCH_CIRCUIT_N:-0}" \
            cargo bench --quiet --bench node >/dev/null || node_rc=$?
        echo "second run: pipelined $(get pipe_msgs_s) msgs/s, round trip p50 $(get rtt_p50_ms) ms, fsync p50 $(get fsync_p50_ms) ms"
        guard || exit 1
    fi
    echo "quick guard: passed (pipelined >= 10,000 msgs/s, round trip <= max(5 x fsync p50, 1 ms))"
fi
exit "$node_rc"
