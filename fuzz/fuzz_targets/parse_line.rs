//! Peer input to `parse_line`: it must never panic, and whatever it accepts must encode to a
//! line that parses again to the same value. The same bytes, cut at `\n`, go through the
//! reader's batch parse (`session::preparse`) with and without a signer: it agrees with
//! `parse_line` line by line, and a line it reports verified verifies alone. When the first
//! byte is odd, lines that parse are first signed with the signer's key (so that valid,
//! then mutated, signatures are common).
#![no_main]

use awp_node::identity::Identity;
use awp_node::session::preparse;
use awp_node::wire::{parse_line, sig, MAX_LINE};
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
    let identity = Identity::from_seed(&[7u8; 32]);
    let key = identity.key();
    let sign_first = data.first().is_some_and(|b| b & 1 == 1);
    let lines: Vec<Vec<u8>> = data
        .split(|b| *b == b'\n')
        .take(64)
        .map(|l| match sig::sign_encoded(&identity, l) {
            Ok(signed) if sign_first => signed,
            _ => l.to_vec(),
        })
        .collect();
    for signer in [None, Some(&key)] {
        let out = preparse(lines.clone(), signer);
        assert_eq!(out.len(), lines.len());
        for p in &out {
            let alone = parse_line(p.raw());
            assert_eq!(
                p.line().ok(),
                alone.as_ref().ok(),
                "batch and single parse differ"
            );
            if p.verified() == Some(true) {
                assert!(signer.is_some());
                assert_eq!(
                    sig::verify_line(&key, p.raw()),
                    Ok(()),
                    "accepted a bad sig"
                );
            }
        }
    }
});
