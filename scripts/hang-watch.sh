#!/usr/bin/env bash
# Watch for a test binary that hangs: while the process given as the first argument lives,
# any process started from target/*/deps/ that has run longer than LIMIT seconds (default
# 600; no test binary needs more than a few minutes) gets its thread stacks printed (gdb
# when it is installed, else the kernel's view from /proc) and is killed, so the test run
# fails at once with the evidence instead of running into the CI time cap.
#
#   bash scripts/hang-watch.sh <pid to outlive> [LIMIT]
set -uo pipefail
watched=$1
limit=${2:-600}
deadline=$((SECONDS + 4 * 3600))

stacks() {
    local pid=$1
    if command -v gdb >/dev/null 2>&1; then
        timeout 120 gdb -p "$pid" -batch -ex "thread apply all bt" 2>&1 \
            | grep -v "^\[New LWP\|^warning:" | head -3000
    else
        for t in /proc/"$pid"/task/*; do
            echo "-- thread ${t##*/} $(cat "$t"/comm 2>/dev/null) wchan=$(cat "$t"/wchan 2>/dev/null)"
            cat "$t"/stack 2>/dev/null
        done
    fi
}

while kill -0 "$watched" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    sleep "${HANG_WATCH_EVERY:-20}"
    for pid in $(pgrep -f '/target/[^ ]*/deps/' 2>/dev/null); do
        [ "$pid" = "$$" ] && continue
        # The binary itself must live in deps/ (rustc's command lines name deps/ too).
        argv0=$(tr '\0' '\n' </proc/"$pid"/cmdline 2>/dev/null | head -1)
        case "$argv0" in */target/*/deps/*) ;; *) continue ;; esac
        age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
        [ -n "$age" ] && [ "$age" -gt "$limit" ] || continue
        cmd=$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-200)
        echo "== HANG: pid $pid has run ${age} s (over ${limit} s): $cmd" >&2
        echo "== its threads:" >&2
        stacks "$pid" >&2
        echo "== end of the threads of pid $pid; killing it" >&2
        kill -9 "$pid" 2>/dev/null
    done
done
exit 0
