#!/usr/bin/env bash
# Disk growth of the store over a long run: replays the store traffic of N msg lines of
# about 1.5 KB between a sender and a receiver (queue, receive, group-commit flush, ack,
# retire; see examples/disk_growth.rs) and prints, at each quarter of the run, the bytes
# the database directories take on disk against the data they hold (lines at full
# length), and the ratio. Target: ratio ≤ 1.5. Two text kinds: prose-like `text` and
# incompressible `random` (base64 of random bytes, like blob chunks).
#
# Usage: scripts/bench-disk.sh [N] [SIZE]   (default 119000 lines of 1500 bytes;
# AWP_BENCH_DIR: where the temporary databases go)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-${BENCH_DISK_N:-119000}}
SIZE=${2:-1500}
# shellcheck source=lib.sh
. "$ROOT/scripts/lib.sh"
BIN=$(cd "$ROOT" && cargo_exe disk_growth --release --example disk_growth)

WORK=$(mktemp -d "${AWP_BENCH_DIR:-${TMPDIR:-/tmp}}/awp-disk.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

echo "8. disk growth: $N lines of ~$SIZE bytes (scripts/bench-disk.sh; target ratio ≤ 1.5)"
for kind in text random; do
    "$BIN" "$WORK/$kind" "$N" "$SIZE" "$kind" | while read -r line; do
        python3 - "$line" <<'PY'
import json, sys
v = json.loads(sys.argv[1])
mb = lambda b: f"{b / 1e6:.1f}"
s, r = v["sender"], v["receiver"]
ok = "ok" if max(s["ratio"], r["ratio"]) <= 1.5 else "OVER"
print(f"   {v['text']:<7} {v['n']:>8}  sender {mb(s['disk'])}/{mb(s['data'])} MB = {s['ratio']:.2f}x"
      f"  receiver {mb(r['disk'])}/{mb(r['data'])} MB = {r['ratio']:.2f}x  {ok}")
PY
    done
    rm -rf "${WORK:?}/$kind"
done
