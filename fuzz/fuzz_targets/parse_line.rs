//! Peer input to `parse_line`: it must never panic, and whatever it accepts must encode to a
//! line that parses again to the same value.
#![no_main]

use awp_node::wire::{parse_line, MAX_LINE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = parse_line(data) {
        let encoded = line.encode();
        let again = parse_line(&encoded);
        // Re-encoding compacts whitespace and drops unknown fields, so it never grows past
        // the cap unless the input was already near it.
        if encoded.len() <= MAX_LINE {
            let again = again.expect("re-encoded line must parse");
            assert_eq!(again, line, "round trip changed the line");
        }
    }
});
