#!/usr/bin/env bash
# Benchmark of one release build on this machine, printed in one run: fsync latency of the
# disk that holds the node homes, handshake time, durable msg→ack round trip, pipelined
# throughput, resume replay of a prefilled outbox, and the peak RSS of every node, with the
# targets and whether each was met. Nodes run as `awp daemon` processes in temporary homes
# on 127.0.0.1; they are killed when the run ends, also on failure or Ctrl-C.
#
# Optional environment: AWP_BENCH_DIR (where the temporary homes go; default $TMPDIR or
# /tmp), BENCH_FSYNC_N, BENCH_HANDSHAKE_N, BENCH_RTT_N, BENCH_PIPE_N, BENCH_REPLAY_N,
# BENCH_PHASE_LIMIT_S (see benches/node.rs), BENCH_BLOB_MIB (blob size, default 50),
# BENCH_DISK_N (lines of the disk-growth run, default 119000).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

WORK=$(mktemp -d "${AWP_BENCH_DIR:-${TMPDIR:-/tmp}}/awp-bench.XXXXXX")
PIDS="$WORK/pids"
: >"$PIDS"

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
AWP=$(cargo_exe awp --release --bin awp)
cargo bench --quiet --bench node --no-run

echo "commit   $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src modified)')"
echo "kernel   $(uname -sr)"
echo "fs       $(df -PT "$WORK" | awk 'NR==2 {print $2 " on " $1 " mounted at " $7}')"

AWP_BIN="$AWP" \
AWP_BENCH_DIR="$WORK" \
AWP_BENCH_PIDS="$PIDS" \
    cargo bench --quiet --bench node

echo
echo "signed lines (benches/sig.rs; the pipelined figure above is with signing on, the default)"
cargo bench --quiet --bench sig

echo
AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" bash "$ROOT/scripts/bench-blob.sh" "${BENCH_BLOB_MIB:-50}"

echo
echo "7. relay: 2,000 connected nodes (scripts/bench-relay.sh)"
bash "$ROOT/scripts/bench-relay.sh" "${BENCH_RELAY_CLIENTS:-2000}"

echo
bash "$ROOT/scripts/bench-disk.sh" "${BENCH_DISK_N:-119000}"
echo "9. artifact threads (scripts/bench-artifact.sh)"
AWP_BIN="$AWP" AWP_BENCH_DIR="$WORK" bash "$ROOT/scripts/bench-artifact.sh" "${BENCH_ARTIFACT_N:-10000}"
