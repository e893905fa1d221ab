#!/usr/bin/env bash
# Run every fuzz target for a bounded time and print how many inputs each executed and
# how big its corpus grew (seed inputs + inputs the run added).
#
#   scripts/fuzz.sh [SECONDS]        # default 30 s per target
#   FUZZ_TARGETS="parse_line grant_verify" scripts/fuzz.sh 10
#   FUZZ_RUNS=10000000 FUZZ_TARGETS=session_lines nice -n 19 scripts/fuzz.sh 3600
#
# SECONDS is the time limit per target. With FUZZ_RUNS=N a target also stops after N
# executions (libFuzzer -runs=N), whichever comes first.
#
# Targets (fuzz/fuzz_targets/): parse_line (wire parsing round trip), grant_verify (grant
# objects through verify and the honoring rules), presence_accept (presence documents
# through PresenceTable::accept), session_lines (lines into an authenticated Session).
# chunk_handling (chunk lines and blob-naming msgs in any order through the blob receiver
# against one store), artifact_parts (artifact command parts applied by a host, event
# parts offered to a replica), control_lines (lines on the local control socket, parsed
# and answered by one live node).
#
# Works on stable Rust: `-s none` turns the sanitizer off (the default AddressSanitizer
# needs nightly), and everything else cargo-fuzz passes is a stable `-C` flag. If a
# toolchain ever refuses a flag as nightly-only, the script retries the build with
# RUSTC_BOOTSTRAP=1, which lets a stable compiler accept nightly flags; that is for
# fuzzing builds only, never for the node itself.
#
# Seed inputs live in fuzz/corpus/<target>/ and are only read: what the fuzzer finds goes
# to a temporary directory, removed at the end. A crash is kept in fuzz/artifacts/<target>/
# and makes the script exit 1; reproduce it with
#   cargo fuzz run -s none <target> fuzz/artifacts/<target>/<file>
# Not part of .ci/run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

SECONDS_PER_TARGET=${1:-30}
case "$SECONDS_PER_TARGET" in
'' | *[!0-9]*)
    echo "usage: scripts/fuzz.sh [SECONDS]" >&2
    exit 2
    ;;
esac
RUNS=${FUZZ_RUNS:-}
case "$RUNS" in
*[!0-9]*)
    echo "FUZZ_RUNS must be a number of executions" >&2
    exit 2
    ;;
esac
TARGETS=${FUZZ_TARGETS:-"parse_line grant_verify presence_accept session_lines chunk_handling artifact_parts control_lines tls_records"}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/awp-fuzz.XXXXXX")
cleanup() {
    rm -rf "$WORK"
    # session_lines and chunk_handling keep a sled store, control_lines a node home, in a
    # temp dir they cannot remove at the end (libFuzzer exits without running destructors).
    rm -rf "${TMPDIR:-/tmp}"/awp-fuzz-session-* "${TMPDIR:-/tmp}"/awp-fuzz-chunk-* \
        "${TMPDIR:-/tmp}"/awp-fuzz-control-* 2>/dev/null || true
}
trap cleanup EXIT

echo "== building fuzz targets (cargo fuzz build -s none)"
if ! cargo fuzz build -s none 2>"$WORK/build.err"; then
    if grep -qi "nightly" "$WORK/build.err"; then
        echo "   stable refused a nightly-only flag: retrying with RUSTC_BOOTSTRAP=1"
        export RUSTC_BOOTSTRAP=1
        cargo fuzz build -s none
    else
        cat "$WORK/build.err" >&2
        exit 1
    fi
fi

declare -A EXECS CORPUS STATUS
failed=0
for t in $TARGETS; do
    echo "== $t: ${SECONDS_PER_TARGET} s"
    mkdir -p "$WORK/corpus/$t" "fuzz/artifacts/$t"
    log="$WORK/$t.log"
    # The first corpus directory receives new inputs; the seed directory is only read.
    limits=(-max_total_time="$SECONDS_PER_TARGET")
    if [ -n "$RUNS" ]; then
        limits+=(-runs="$RUNS")
    fi
    set +e
    cargo fuzz run -s none "$t" "$WORK/corpus/$t" "fuzz/corpus/$t" -- \
        "${limits[@]}" -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    # libFuzzer ends with `#N DONE ...` and, with -print_final_stats, a line
    # `stat::number_of_executed_units: N`; a crash prints neither DONE nor always the stat.
    n=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    if [ -z "$n" ]; then
        n=$(sed -n 's/^#\([0-9]*\)[[:space:]]*DONE.*/\1/p' "$log" | tail -n 1)
    fi
    EXECS[$t]=${n:-?}
    # Corpus at the end: the seeds plus what the run added (the fuzzer keeps an input only
    # when it reaches new coverage).
    seeds=$(find "fuzz/corpus/$t" -type f | wc -l)
    found=$(find "$WORK/corpus/$t" -type f | wc -l)
    CORPUS[$t]="$seeds+$found"
    if [ "$rc" -eq 0 ]; then
        STATUS[$t]=ok
    else
        STATUS[$t]="FAILED (exit $rc)"
        failed=1
        echo "   $t failed; last lines of its log:" >&2
        tail -n 40 "$log" >&2
    fi
done

echo
printf '%-18s %14s %12s  %s\n' TARGET EXECUTIONS SEEDS+NEW STATUS
for t in $TARGETS; do
    printf '%-18s %14s %12s  %s\n' "$t" "${EXECS[$t]}" "${CORPUS[$t]}" "${STATUS[$t]}"
done
exit "$failed"
