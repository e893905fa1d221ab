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

# awp_exe [CARGO BUILD ARGS…]   (e.g. --release, --manifest-path …)
# Build the awp executable and print its path, with the features `cargo test` and
# `cargo bench` build it with. Cargo resolves the features of a build without the
# dev-dependencies unless the build includes a target that uses them (resolver 2), and
# the dev-dependencies add features to shared crates (tokio's `test-util`, rmcp's client,
# hyper's client): `cargo build --bin awp` alone would compile the library and every
# crate that depends on tokio a second time next to the test or bench build (minutes on
# a 2-core machine), and the two builds would overwrite each other's target/*/awp. So
# the smallest example (examples/mitm_relay.rs, 55 lines) is built with it. tokio's
# `test-util` costs a running node one atomic load per clock read while time was never
# paused (tokio/src/time/clock.rs), and no code path of the node pauses it.
awp_exe() {
    cargo_exe awp "$@" --bin awp --example mitm_relay
}
