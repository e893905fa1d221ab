#!/usr/bin/env bash
# Run `awp conform` against our own node over each binding (TLS, TCP, Unix): start a node
# in a temporary home listening on all three, run the conformance scenarios against each
# address, stop the node. Exits non-zero when any scenario fails on any binding.
# Output lines are prefixed with the binding, e.g. `[tcp]   ok    ping  §9.4  …`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib.sh"
AWP=$(awp_exe --manifest-path "$ROOT/Cargo.toml")
WORK=$(mktemp -d)
H="$WORK/home"

cleanup() {
    "$AWP" --home "$H" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

"$AWP" --home "$H" up --name conform-self@ci \
    --listen tls:127.0.0.1:0 \
    --listen tcp:127.0.0.1:0 \
    --listen "unix:$WORK/n.sock" >/dev/null

failed=0
for scheme in tls tcp unix; do
    addr=$("$AWP" --home "$H" address | grep "^$scheme:" | head -1 || true)
    if [ -z "$addr" ]; then
        echo "[$scheme] the node lists no $scheme: address" >&2
        failed=1
        continue
    fi
    echo "[$scheme] awp conform $addr"
    if ! "$AWP" conform "$addr" "$@" >"$WORK/$scheme.out"; then
        failed=1
    fi
    sed "s/^/[$scheme] /" "$WORK/$scheme.out"
    # Our node announces every capability the scenarios need: nothing may be skipped.
    if [ $# -eq 0 ] && ! grep -q '^15 passed, 0 failed, 0 skipped$' "$WORK/$scheme.out"; then
        echo "[$scheme] expected 15 passed, 0 failed, 0 skipped" >&2
        failed=1
    fi
done

if [ "$failed" -ne 0 ]; then
    echo "conform-self: FAILED on at least one binding" >&2
    exit 1
fi
echo "conform-self: every binding conforms"
