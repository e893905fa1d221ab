#!/usr/bin/env bash
# `awp mcp` checked by the official MCP inspector CLI (npm package
# @modelcontextprotocol/inspector-cli, a client this project did not write): two nodes in
# temporary homes on 127.0.0.1, the inspector lists alice's tools, calls awp_send on alice
# and awp_read (with wait_seconds) on bob, and the text must arrive, fenced as peer content.
# Skipped with one line when npx is missing. INSPECTOR overrides the npm package spec.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib.sh"

if ! command -v npx >/dev/null 2>&1; then
    echo "npx not found: skipping the MCP inspector check (install Node.js with npm to run it)"
    exit 0
fi
# The package the issue names; its 1.x line runs on Node 18+ (the 2.x inspector needs 22.19+).
INSPECTOR=${INSPECTOR:-@modelcontextprotocol/inspector-cli@1.0.3}

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
fail() { echo "FAIL: $*" >&2; exit 1; }

# inspector-cli 1.0.3 looks for its own package.json with `fs.existsSync("../package.json")`
# relative to the working directory but imports it relative to its module: run it from a
# directory whose parent holds a package.json, so the check passes and the import finds its
# own file.
mkdir -p "$WORK/npx/run"
echo '{"private": true}' >"$WORK/npx/package.json"

# inspect HOME ARGS…: one inspector CLI call against `awp --home HOME mcp`.
inspect() {
    local home=$1
    shift
    (cd "$WORK/npx/run" && timeout 300 npx -y "$INSPECTOR" --cli "$AWP" --home "$home" mcp "$@")
}

echo "== start alice and bob"
"$AWP" --home "$A" up --listen tls:127.0.0.1:0 --name alice@inspector >/dev/null
"$AWP" --home "$B" up --listen tls:127.0.0.1:0 --name bob@inspector >/dev/null
BOB_ADDR=$("$AWP" --home "$B" address | head -1)
BOB_KEY=$("$AWP" --home "$B" whoami --json | sed -n 's/.*"key":"\([^"]*\)".*/\1/p')
"$AWP" --home "$A" connect "$BOB_ADDR" >/dev/null

echo "== inspector: tools/list on alice"
TOOLS=$(inspect "$A" --method tools/list)
for t in awp_status awp_peers awp_connect awp_send awp_read awp_state awp_threads \
    awp_grant awp_grants awp_revoke awp_artifact_show awp_artifact_edit awp_artifact_propose; do
    grep -q "\"$t\"" <<<"$TOOLS" || fail "tool $t not listed: $TOOLS"
done
echo "13 tools checked of $(grep -o '"name": *"awp_[a-z_]*"' <<<"$TOOLS" | wc -l) listed"

echo "== inspector: awp_send on alice"
SENT=$(inspect "$A" --method tools/call --tool-name awp_send \
    --tool-arg "peer=$BOB_KEY" --tool-arg "text=hello from the inspector" \
    --tool-arg "wait_ack_seconds=10")
echo "$SENT"
grep -q 'delivered ' <<<"$SENT" || fail "awp_send did not deliver: $SENT"

echo "== inspector: awp_read on bob"
READ=$(inspect "$B" --method tools/call --tool-name awp_read --tool-arg "wait_seconds=10")
echo "$READ"
grep -q 'hello from the inspector' <<<"$READ" || fail "awp_read did not return the text: $READ"
grep -q 'BEGIN UNTRUSTED PEER CONTENT' <<<"$READ" || fail "peer text not fenced: $READ"
grep -q '"isError": *false' <<<"$READ" || fail "awp_read reported an error: $READ"
echo "MCP inspector: tools listed, awp_send and awp_read between two nodes ok"
