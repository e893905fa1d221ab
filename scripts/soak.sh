#!/usr/bin/env bash
# Crash soak: two nodes over TLS on 127.0.0.1 exchange messages both ways in many threads
# (`awp send`, as a user would) while a driver SIGKILLs a random node, and sometimes an
# in-flight `awp send`, at random moments and restarts it on the same port. At the end both
# outboxes must drain; it prints cycles, messages each way, LOST, DUP, REORDER, sends of
# uncertain outcome and how many of them arrived, restart failures, drain time and peak RSS.
#
#   scripts/soak.sh [--cycles N] [--minutes M] [--release] [--threads T] [--seed S] [--keep]
#   scripts/soak.sh --store [--cycles N] [--minutes M] [--release] [--threads T]
#
# --store: SIGKILL a process doing heavy concurrent writes to one store (the store_crash
# example), reopen the store after each kill and check it holds every record whose flush
# returned. Default 30 cycles. Exits non-zero on any loss, duplicate, reorder, restart
# failure or failed store check. More options: python3 scripts/soak.py --help.
# Needs Rust and python3 (standard library only). Honours CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROFILE=()
STORE=0
PASS=()
for arg in "$@"; do
    case "$arg" in
        --release) PROFILE=(--release) ;;
        --store) STORE=1; PASS+=("$arg") ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) PASS+=("$arg") ;;
    esac
done
command -v python3 >/dev/null 2>&1 || { echo "soak.sh needs python3" >&2; exit 2; }

# The executables cargo built (wherever its target directory is), with the features of the
# test build (scripts/lib.sh: awp_exe says why).
. "$ROOT/scripts/lib.sh"
AWP=$(awp_exe --locked --manifest-path "$ROOT/Cargo.toml" "${PROFILE[@]}")
ARGS=(--awp "$AWP")
if [ "$STORE" = 1 ]; then
    ARGS+=(--store-writer "$(cargo_exe store_crash --locked --manifest-path "$ROOT/Cargo.toml" \
        "${PROFILE[@]}" --example store_crash)")
fi
exec python3 "$ROOT/scripts/soak.py" "${ARGS[@]}" "${PASS[@]+"${PASS[@]}"}"
