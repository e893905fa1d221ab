#!/usr/bin/env bash
# Artifact threads through two `awp daemon` nodes in temporary homes on 127.0.0.1 (TLS):
#  1. edits/s: the guest, holding artifact:write, queues N edit commands (1,000 per
#     control request, packed up to 256 per AWP msg) on one artifact thread; the host
#     applies each and answers each msg with its results and events (state, event log,
#     dedup results and reply in the fsynced transaction of the received batch). Time from the first request until
#     the guest's replica holds every resulting event.
#     Goal: >= 5,000 edits/s.
#  2. catch-up: the guest is stopped, the host makes 10,000 edits of its own; the guest
#     restarts and dials the host; time until its replica has applied all 10,000 events.
#     Goal: <= 1 s.
# Besides wall time it counts CPU (utime + stime of each daemon, from /proc): per command
# on each node in part 1, and per caught-up event on the restarted guest (its whole run)
# in part 2, which the machine's load blurs less than wall time.
# Both nodes are killed when the run ends.
#
# Usage: scripts/bench-artifact.sh [N]   (N edits for part 1, default 10000; AWP_BIN: the
# binary, default: the release build cargo reports; AWP_BENCH_DIR: where the temporary homes
# go; BENCH_ARTIFACT_PERF=FILE: `perf record -g` the restarted guest into FILE during the
# catch-up)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-10000}
CATCHUP=${BENCH_ARTIFACT_CATCHUP:-10000}
# shellcheck source=lib.sh
. "$ROOT/scripts/lib.sh"
cd "$ROOT"
AWP=${AWP_BIN:-$(awp_exe --release)}
DRIVER=$(cargo_exe artifact_bench --release --example artifact_bench)

WORK=$(mktemp -d "${AWP_BENCH_DIR:-${TMPDIR:-/tmp}}/awp-artifact.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

TICK_MS=$((1000 / $(getconf CLK_TCK)))
cpu_ms() { # pid: CPU used so far (user + system), ms
    awk -v t="$TICK_MS" '{ print ($14 + $15) * t }' "/proc/$1/stat"
}

ADDR=""
start() { # home name; sets ADDR
    local home=$1 name=$2
    "$AWP" --home "$home" daemon --listen tls:127.0.0.1:0 --name "$name" >/dev/null 2>>"$home.log" &
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

mkdir -p "$WORK/host" "$WORK/guest"
start "$WORK/host" host@bench
HOST_ADDR=$ADDR
HOST_PID=${PIDS[-1]}
start "$WORK/guest" guest@bench
GUEST_PID=${PIDS[-1]}
"$AWP" --home "$WORK/guest" connect "$HOST_ADDR" >/dev/null
GUEST_KEY=$("$AWP" --home "$WORK/guest" --json whoami | sed -E 's/.*"key":"([^"]+)".*/\1/')
"$AWP" --home "$WORK/host" grant "$GUEST_KEY" artifact:write --ttl 1h >/dev/null
printf '[0]\n' >"$WORK/plan.md"
NEW=$("$AWP" --home "$WORK/host" --json artifact new "$GUEST_KEY" --kind markdown --title bench --text-file "$WORK/plan.md")
TH=$(echo "$NEW" | sed -E 's/.*"th":"([^"]+)".*/\1/')
ART=$(echo "$NEW" | sed -E 's/.*"artifact_id":"([^"]+)".*/\1/')
for _ in $(seq 1 200); do
    "$AWP" --home "$WORK/guest" --json artifact list | grep -q "$TH" && break
    sleep 0.05
done

H0=$(cpu_ms "$HOST_PID")
G0=$(cpu_ms "$GUEST_PID")
"$DRIVER" edits "$WORK/guest" "$TH" "$ART" "$N" | awk -F'[:,}]' '{
    for (i = 1; i < NF; i++) { if ($i ~ /"edits_per_s"/) r = $(i+1); if ($i ~ /"seconds"/) s = $(i+1); if ($i ~ /"queue_s"/) q = $(i+1); if ($i ~ /"build_s"/) b = $(i+1) }
    printf "artifact %d edits guest→host on one thread, durable results: %.2f s, %.0f edits/s (goal >= 5000: %s; the client built them in %.3f s, the guest node queued them in %.3f s)\n", '"$N"', s, r, (r >= 5000 ? "met" : "NOT met"), b, q
}'

H1=$(cpu_ms "$HOST_PID")
G1=$(cpu_ms "$GUEST_PID")
awk -v h=$((H1 - H0)) -v g=$((G1 - G0)) -v n="$N" 'BEGIN {
    printf "artifact edits CPU per command: host %.3f ms, guest %.3f ms\n", h / n, g / n }'

# Catch-up: the guest goes away, the host edits, the guest comes back.
kill -9 "$GUEST_PID"
sleep 0.2
"$DRIVER" host-edits "$WORK/host" "$TH" "$ART" "$CATCHUP" >/dev/null
HEAD=$("$AWP" --home "$WORK/host" --json artifact list | sed -E 's/.*"head_seq":([0-9]+).*/\1/' | head -1)
start "$WORK/guest" guest@bench
GUEST_PID=${PIDS[-1]}
H2=$(cpu_ms "$HOST_PID")
PERF_PID=""
if [ -n "${BENCH_ARTIFACT_PERF:-}" ]; then
    perf record -q -g -o "$BENCH_ARTIFACT_PERF" -p "$GUEST_PID" 2>/dev/null &
    PERF_PID=$!
fi
"$DRIVER" catchup "$WORK/guest" "$TH" "$HEAD" "$HOST_ADDR" | awk -F'[:,}]' '{
    for (i = 1; i < NF; i++) { if ($i ~ /"seconds"/) s = $(i+1); if ($i ~ /"head_before_dial"/) b = $(i+1) }
    printf "artifact replica catch-up of '"$CATCHUP"' events after a reconnect: %.3f s (goal <= 1 s: %s; replica head at the dial: %d)\n", s, (s <= 1 ? "met" : "NOT met"), b
}'
G3=$(cpu_ms "$GUEST_PID")
H3=$(cpu_ms "$HOST_PID")
if [ -n "$PERF_PID" ]; then
    kill -INT "$PERF_PID"
    wait "$PERF_PID" || true
fi
awk -v g="$G3" -v h=$((H3 - H2)) -v n="$CATCHUP" 'BEGIN {
    printf "artifact catch-up CPU: restarted guest %.3f ms per event (its whole run: %d ms), host %d ms\n", g / n, g, h }'
