# Shared helpers for the scripts in this directory; source it:
#   . "$(dirname "$0")/lib.sh"

# cargo_exe NAME [CARGO BUILD ARGS…]
# Build with `cargo build ARGS…` and print the path of the executable NAME that cargo
# reports (`--message-format=json`), so that CARGO_TARGET_DIR, --release, --target and
# build.target-dir in cargo config are all honoured. Diagnostics go to stderr. Fails when
# the build fails or built no executable named NAME.
cargo_exe() {
    local name=$1 out exe
    shift
    out=$(cargo build --quiet --message-format=json-render-diagnostics "$@") || return 1
    exe=$(printf '%s\n' "$out" |
        grep '"reason":"compiler-artifact"' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' |
        grep "/$name\$" | tail -n 1) || true
    if [ -z "$exe" ]; then
        echo "cargo build $* produced no executable named $name" >&2
        return 1
    fi
    printf '%s\n' "$exe"
}
