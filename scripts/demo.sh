#!/usr/bin/env bash
# Two nodes in temporary homes on 127.0.0.1 over TLS: a delegation thread (msg, state
# working, reply, state done), a SIGKILL of bob while alice has messages queued for him, a
# restart, and a check that every queued message arrives exactly once.
# Exits non-zero when a message is missing or duplicated. Needs only Rust (and bash).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib.sh"
AWP=$(awp_exe --manifest-path "$ROOT/Cargo.toml")
WORK=$(mktemp -d)
A="$WORK/alice"
B="$WORK/bob"

cleanup() {
    "$AWP" --home "$A" down >/dev/null 2>&1 || true
    "$AWP" --home "$B" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }
alice() { echo "alice\$ awp $*" >&2; "$AWP" --home "$A" "$@"; }
bob() { echo "bob\$ awp $*" >&2; "$AWP" --home "$B" "$@"; }
# A string field of one JSON object on stdin.
field() { sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" | head -1; }
# A number field of one JSON object on stdin.
number() { sed -n "s/.*\"$1\":\\([0-9]*\\).*/\\1/p" | head -1; }
fail() { echo "FAIL: $*" >&2; exit 1; }

say "start alice and bob (TLS on 127.0.0.1, ephemeral ports)"
alice up --listen tls:127.0.0.1:0 --name alice@demo
bob up --listen tls:127.0.0.1:0 --name bob@demo
BOB_ADDR=$(bob address | head -1)
BOB_PORT=$(echo "$BOB_ADDR" | sed -n 's/^tls:127\.0\.0\.1:\([0-9]*\)#.*/\1/p')
[ -n "$BOB_PORT" ] || fail "could not read bob's address: $BOB_ADDR"
alice connect "$BOB_ADDR"

say "alice delegates a CI run to bob"
TH=$(alice send bob "Run the suite on main" -s "CI run" --data '{"commit":"a1b2c3"}' --wait-ack 10s --json | field th)
[ -n "$TH" ] || fail "no thread id"
echo "thread $TH"
bob wait -t "$TH" --timeout 10s >/dev/null
bob state alice "$TH" working -n "running the suite" --wait-ack 10s
bob send -t "$TH" "3 failing; fixing them now" --wait-ack 10s

say "SIGKILL bob mid-thread, while alice queues 5 follow-ups"
BOB_PID=$(bob status --json | number pid)
[ -n "$BOB_PID" ] || fail "no pid for bob"
kill -9 "$BOB_PID"
for _ in $(seq 1 100); do kill -0 "$BOB_PID" 2>/dev/null || break; sleep 0.1; done
for i in 1 2 3 4 5; do
    alice send -t "$TH" "follow-up $i"
done
QUEUED=$(alice status --json | number outbox)
echo "alice's outbox: $QUEUED line(s)"
[ "$QUEUED" -ge 5 ] || fail "expected 5 queued lines, found $QUEUED"

say "restart bob on the same port; alice redials and replays her outbox"
bob up --listen "tls:127.0.0.1:$BOB_PORT" --name bob@demo
outbox() { "$AWP" --home "$A" status --json | number outbox; }
for _ in $(seq 1 300); do
    [ "$(outbox)" = "0" ] && break
    sleep 0.1
done
[ "$(outbox)" = "0" ] || fail "alice's outbox did not drain within 30 s"

say "every message reached bob exactly once"
LOG=$(bob tail --once -t "$TH" --json)
check_once() {
    local n
    n=$(printf '%s\n' "$LOG" | grep '"dir":"in"' | grep -c "\"text\":\"$1\"" || true)
    printf '  %-24s %s\n' "$1" "$n"
    [ "$n" = "1" ] || fail "\"$1\" arrived $n times"
}
check_once "Run the suite on main"
for i in 1 2 3 4 5; do check_once "follow-up $i"; done
bob tail --once -t "$TH"

say "bob finishes the thread; alice sees it"
bob state "$TH" done -n "all green" --wait-ack 10s
alice wait -t "$TH" --state done --timeout 10s >/dev/null
alice threads
echo
echo "PASS: delegation thread completed; 6 of 6 messages delivered exactly once across a SIGKILL"
