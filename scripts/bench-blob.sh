#!/usr/bin/env bash
# Blob throughput: two `awp daemon` nodes in temporary homes on 127.0.0.1 (TLS); one sends
# a random file (default 50 MiB, the default blob limit) to the other with `awp send -f`.
# Prints the time from the send request to the receiver listing the blob as complete
# (every chunk fsynced, the SHA-256 checked against the sender's) and the throughput in
# MB/s (10^6 bytes per second), then the disk's own copy rate of the same file in the same
# run (`dd ... conv=fsync`, the yardstick of issue 10) and the goal: >= 400 MB/s or >= 25%
# of that copy rate (MET/MISSED). Both nodes are killed when the run ends.
#
# Usage: scripts/bench-blob.sh [MiB]   (AWP_BIN: the binary; default the release build,
# built when out of date; AWP_BENCH_DIR: where the temporary homes go)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MIB=${1:-50}
. "$ROOT/scripts/lib.sh"
if [ -n "${AWP_BIN:-}" ]; then
    AWP=$AWP_BIN
else
    AWP=$(awp_exe --manifest-path "$ROOT/Cargo.toml" --release)
fi

WORK=$(mktemp -d "${AWP_BENCH_DIR:-${TMPDIR:-/tmp}}/awp-blob.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ADDR=""
start() { # home name; sets ADDR
    local home=$1 name=$2
    AWP_BLOB_LIMIT=$((MIB * 1024 * 1024)) "$AWP" --home "$home" daemon \
        --listen tls:127.0.0.1:0 --name "$name" >/dev/null 2>"$home.log" &
    PIDS+=($!)
    disown "$!"
    for _ in $(seq 1 200); do
        if out=$("$AWP" --home "$home" --json address 2>/dev/null); then
            ADDR=$(echo "$out" | sed -E 's/.*"address":"([^"]+)".*/\1/')
            return 0
        fi
        sleep 0.05
    done
    echo "node $name did not start; see $home.log" >&2
    return 1
}

mkdir -p "$WORK/a" "$WORK/b"
start "$WORK/a" alice@bench
start "$WORK/b" bob@bench
"$AWP" --home "$WORK/a" connect "$ADDR" >/dev/null

FILE="$WORK/payload.bin"
head -c $((MIB * 1024 * 1024)) /dev/urandom >"$FILE"
WANT=$(sha256sum "$FILE" | cut -d' ' -f1)

t0=$(date +%s.%N)
"$AWP" --home "$WORK/a" --json send bob@bench -f "$FILE" >"$WORK/sent.json"
t_queued=$(date +%s.%N)
# Block until the msg naming the blob arrives (it is stored with, or after, the last
# chunk), then confirm with the listing: a CLI process every 20 ms from the start would
# take CPU from the two nodes on a small machine.
"$AWP" --home "$WORK/b" wait --timeout 120s >/dev/null 2>&1 || true
got=""
for _ in $(seq 1 6000); do
    listing=$("$AWP" --home "$WORK/b" --json blobs || true)
    if echo "$listing" | grep -q '"status":"complete"'; then
        got=$(echo "$listing" | grep '"status":"complete"' |
            sed -E 's/.*"sha256":"([0-9a-f]+)".*/\1/' | head -1)
        break
    fi
    sleep 0.02
done
t1=$(date +%s.%N)
if [ -z "$got" ]; then
    echo "blob: FAILED: not complete within 120 s" >&2
    exit 1
fi
if [ "$got" != "$WANT" ]; then
    echo "blob: FAILED: SHA-256 differs ($got, want $WANT)" >&2
    exit 1
fi
# The yardstick: the disk copying the same file with an fsync, in the same run.
d0=$(date +%s.%N)
dd if="$FILE" of="$WORK/copy.bin" bs=1M conv=fsync status=none
d1=$(date +%s.%N)
rm -f "$WORK/copy.bin"
awk -v t0="$t0" -v tq="$t_queued" -v t1="$t1" -v d0="$d0" -v d1="$d1" -v mib="$MIB" 'BEGIN {
    s = t1 - t0; bytes = mib * 1048576; rate = bytes / s / 1e6; dd = bytes / (d1 - d0) / 1e6;
    printf "blob     %d MiB file node to node over TLS: %.2f s, %.1f MB/s (send request to complete and fsynced at the receiver, SHA-256 equal; queueing took %.2f s)\n", mib, s, rate, tq - t0
    goal = (rate >= 400 || rate >= 0.25 * dd) ? "MET" : "MISSED";
    printf "blob     dd conv=fsync of the same file: %.1f MB/s; goal >= 400 MB/s or >= 25%% of dd (%.1f MB/s): %s (%.0f%% of dd)\n", dd, 0.25 * dd, goal, 100 * rate / dd
}'
