#!/usr/bin/env bash
# Relay benchmark: one `awp relay` and N raw TLS clients (one load-generator process,
# examples/relay_load.rs) that handshake with `presence` in their hello caps.
# Reports the relay's memory per connection (RSS delta / connections) and the time until a
# new document from one client has reached all the others (several rounds).
#
#   scripts/bench-relay.sh [CLIENTS]      (default 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
clients=${1:-2000}

# Each client is one socket here and one in the relay, plus the relay's own files.
need=$((clients * 2 + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi

AWP=$(awp_exe --release)
RELAY_LOAD=$(cargo_exe relay_load --release --example relay_load)
work=$(mktemp -d)
relay_pid=""
cleanup() {
    if [ -n "$relay_pid" ]; then kill "$relay_pid" 2>/dev/null || true; wait "$relay_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=warn "$AWP" --home "$work/relay" relay \
    --listen "tls:127.0.0.1:$port" --max-connections $((clients + 100)) \
    >"$work/relay.log" 2>&1 &
relay_pid=$!
for _ in $(seq 100); do
    "$AWP" --home "$work/relay" relay status >/dev/null 2>&1 && break
    sleep 0.1
done

result=$("$RELAY_LOAD" "tls:127.0.0.1:$port" "$clients" "$relay_pid" 5 "$work/relay")
echo "$result"
python3 - "$result" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
r = json.loads(sys.argv[1])
print(f"\nrelay with {r['connected']}/{r['clients']} connected clients (connect took {r['connect_s']} s; "
      f"load average {sys.argv[2]})")
kib = r['relay_kib_per_connection']
if r['connected'] >= 10000:
    verdict = "MET" if kib <= 16 else "MISSED"
else:
    verdict = "not judged (the goal is at 10,000 connections)"
print(f"  memory per connection: {kib} KiB "
      f"(RSS {r['relay_rss_before_kib']} -> {r['relay_rss_after_kib']} KiB); "
      f"goal <= 16 KiB at 10,000 (issue 10): {verdict}")
print(f"  one document to all others: median {r['fanout_median_ms']} ms, rounds {r['fanout_ms']} ms")
s = r.get("relay_status") or {}
if s:
    print(f"  relay status (clients connected): {s.get('connections')} connections, "
          f"{s.get('documents')} documents held, {s.get('forwarded')} forwarded in "
          f"{s.get('forward_lines')} lines, {s.get('dropped')} dropped, "
          f"{s.get('forward_dropped')} lines dropped (queue full)")
EOF
