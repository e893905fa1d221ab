//! A presence document from a peer: strict JSON, then `PresenceTable::accept` with a fixed
//! clock. The first byte is the hop count. Nothing may panic; an accepted document is held,
//! and the same document a second time is refused as not newer.
#![no_main]

use awp_node::presence::{PresenceTable, Refusal};
use awp_node::wire::{parse::strict_from_str, PeerKey};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// 2026-09-21T12:53:20Z.
const NOW_MS: u64 = 1_790_000_000_000;
const ME: &str = "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";
const FROM: &str = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc";

fuzz_target!(|data: &[u8]| {
    let Some((&hops, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(Value::Object(doc)) = strict_from_str(text) else {
        return;
    };
    let me = PeerKey::parse(ME).unwrap();
    let from = PeerKey::parse(FROM).unwrap();
    let mut table = PresenceTable::with_max_origins(me, 2);
    let hops = u64::from(hops);
    match table.accept(doc.clone(), hops, from, NOW_MS) {
        Ok(a) => {
            assert_eq!(a.forward_to_hops.is_some(), hops + 1 < 8);
            assert!(
                table.get(&a.origin, NOW_MS).is_some(),
                "accepted but not held"
            );
            let second = table.accept(doc, hops, from, NOW_MS);
            assert!(
                matches!(second, Err(Refusal::NotNewer { .. })),
                "the same document twice: {second:?}"
            );
            assert_eq!(table.fresh(NOW_MS).len(), 1);
        }
        Err(_) => assert!(table.is_empty()),
    }
    table.expire(u64::MAX);
    assert!(table.is_empty());
    let c = table.counters();
    assert_eq!(
        c.accepted + c.dropped(),
        if c.accepted == 1 { 2 } else { 1 }
    );
});
