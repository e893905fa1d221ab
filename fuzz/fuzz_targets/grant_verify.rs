//! A grant object from a peer (auth.grants, a grant line, an introduce): strict JSON, then
//! `grant::verify`, then the honoring rules. Nothing may panic, and a grant that verified
//! must verify again from the object it kept (what the node stores and re-sends).
#![no_main]

use awp_node::grant::{self, Policy, Verified};
use awp_node::wire::{parse::strict_from_str, PeerKey};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// 2026-09-21T12:53:20Z: a fixed clock, so runs are reproducible.
const NOW_MS: u64 = 1_790_000_000_000;
/// Identities A and B of the known-answer vectors (public keys only).
const ME: &str = "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";
const TRUSTED: &str = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(Value::Object(obj)) = strict_from_str(text) else {
        return;
    };
    let Ok(v) = grant::verify(&obj) else {
        return;
    };
    let again = grant::verify(&v.object).expect("a verified grant verifies from its kept object");
    assert_eq!(again.hash, v.hash);
    let _ = v.to_wire();
    let _ = v.expired_at(NOW_MS);

    let me = PeerKey::parse(ME).unwrap();
    let trust = [PeerKey::parse(TRUSTED).unwrap()];
    // The grant itself stands in for an introduce grant its subject holds, so the
    // one-level introduction path runs too.
    let held = v.clone();
    let intros = move |k: &PeerKey| -> Vec<Verified> {
        if *k == held.sub {
            vec![held.clone()]
        } else {
            vec![]
        }
    };
    let revoked = |h: &str| h.starts_with("00");
    for now in [NOW_MS, 0, u64::MAX] {
        let policy = Policy {
            me,
            trust: &trust,
            revoked: &revoked,
            introduce_grants_of: &intros,
        };
        if let Ok(caps) = grant::honored_caps(&v, &policy, now) {
            assert!(
                caps.iter().all(|c| v.caps.contains(c)),
                "honored a cap the grant lacks"
            );
        }
    }
});
