//! Issue 8: one connection's share of the table (§4), and freshness by seq with a `ts`
//! believed at most [`BELIEVED_AHEAD_MS`] ahead (§4b: an origin whose clock ran fast,
//! restarted with the right clock, stayed shown with its old document and its newer
//! documents were dropped).

use super::doc;
use super::*;
use crate::canonical::sign_object;
use crate::identity::Identity;
use serde_json::json;

const NOW: u64 = 1_790_000_000_000;
const FAST: u64 = 4 * 60 * 1000;

fn id(seed: u8) -> Identity {
    Identity::from_seed(&[seed; 32])
}

fn signed(who: &Identity, seq: u64, ts_ms: u64, name: &str) -> Map<String, Value> {
    let mut d = Map::new();
    d.insert("origin".into(), json!(who.key().to_string()));
    d.insert("seq".into(), json!(seq));
    d.insert("ts".into(), json!(wire::time::format_ms(ts_ms)));
    d.insert("name".into(), json!(name));
    let sig = sign_object(who, &d);
    d.insert("sig".into(), json!(sig));
    d
}

fn name_held(t: &PresenceTable, who: &Identity, now: u64) -> Option<String> {
    t.get(&who.key(), now)
        .and_then(|h| h.doc.get("name").and_then(Value::as_str).map(str::to_owned))
}

/// The origin publishes by the seq rule of `doc::next_seq` (seq persisted across the
/// restart) with a clock 4 minutes fast, then restarts with the right clock: its next
/// documents replace the old one at once, and the old one is not kept past 10 minutes
/// of our clock.
#[test]
fn an_origin_restarted_with_a_corrected_clock_is_shown_with_its_new_document_at_once() {
    let (origin, via) = (id(3), id(2).key());
    let mut t = PresenceTable::new(id(1).key());
    // Fast clock: seq and ts 4 minutes ahead of ours.
    let seq1 = doc::next_seq(None, NOW + FAST);
    t.accept(signed(&origin, seq1, NOW + FAST, "fast"), 0, via, NOW)
        .unwrap();
    // Restart 30 s later with the right clock: seq keeps growing, ts is true time.
    let seq2 = doc::next_seq(Some(seq1), NOW + 30_000);
    assert!(seq2 > seq1);
    let a = t.accept(
        signed(&origin, seq2, NOW + 30_000, "corrected"),
        0,
        via,
        NOW + 30_000,
    );
    assert!(a.is_ok(), "{a:?}");
    assert_eq!(
        name_held(&t, &origin, NOW + 30_000).as_deref(),
        Some("corrected")
    );
    // And the one after it, a heartbeat later.
    let seq3 = doc::next_seq(Some(seq2), NOW + 90_000);
    assert!(t
        .accept(
            signed(&origin, seq3, NOW + 90_000, "later"),
            0,
            via,
            NOW + 90_000
        )
        .is_ok());
    assert_eq!(t.counters().refused.get("rate_limited"), None);
    assert_eq!(t.counters().refused.get("not_newer"), None);
}

#[test]
fn a_document_from_the_future_ages_from_our_clock() {
    let (origin, via) = (id(3), id(2).key());
    let mut t = PresenceTable::new(id(1).key());
    t.accept(signed(&origin, 1, NOW + FAST, "fast"), 0, via, NOW)
        .unwrap();
    let h = t.get(&origin.key(), NOW).unwrap();
    assert_eq!(h.believed_ts_ms(), NOW + BELIEVED_AHEAD_MS);
    // Gone 10 minutes (and the believed 5 s) after it arrived, not 10 after its ts.
    let gone = NOW + BELIEVED_AHEAD_MS + MAX_AGE_MS + 1;
    assert!(t.get(&origin.key(), gone - 2).is_some());
    assert!(t.get(&origin.key(), gone).is_none());
    assert_eq!(t.expire(gone), 1);
}

#[test]
fn believing_less_of_the_future_does_not_lift_the_rate_limit() {
    let (origin, via) = (id(3), id(2).key());
    let mut t = PresenceTable::new(id(1).key());
    // Documents 5 minutes ahead, one per ms: one believed second each at most.
    let mut accepted = 0;
    for i in 0..2_000u64 {
        let ts = NOW + MAX_FUTURE_MS - 2_000 + i;
        if t.accept(signed(&origin, 1 + i, ts, "x"), 0, via, NOW + i)
            .is_ok()
        {
            accepted += 1;
        }
    }
    // 2 s of our time, plus the first: at most 3 documents.
    assert!(accepted <= 3, "{accepted} accepted");
    assert!(accepted >= 1);
    // seq decides newer: a lower seq stays refused, whatever its ts.
    assert_eq!(
        t.accept(
            signed(&origin, 1, NOW + 60_000, "old"),
            0,
            via,
            NOW + 60_000
        ),
        Err(Refusal::NotNewer {
            got: 1,
            held: t
                .marks()
                .iter()
                .find(|(k, _)| *k == origin.key())
                .unwrap()
                .1
                .seq
        })
    );
}

/// §4: one connection could fill the whole table with origins of its own. It brings at
/// most its share; others still bring theirs; a place comes back when an origin leaves.
#[test]
fn one_connection_cannot_fill_the_table_alone() {
    let limits = Limits {
        burst_origins: 1_000,
        ..Limits::default()
    };
    let mut t = PresenceTable::with_limits(id(1).key(), 8, limits);
    let (flood, honest) = (id(2).key(), id(200).key());
    let mut refused = 0;
    for i in 0..20u8 {
        match t.accept(signed(&id(10 + i), 1, NOW, "x"), 0, flood, NOW) {
            Ok(_) => {}
            Err(Refusal::ConnShare) => refused += 1,
            Err(e) => panic!("unexpected refusal {e}"),
        }
    }
    // 75 % of 8.
    assert_eq!((t.len(), refused), (6, 14));
    assert_eq!(t.counters().refused["conn_share"], 14);
    // Newer documents of its held origins still pass.
    assert!(t
        .accept(signed(&id(10), 2, NOW + 1_000, "y"), 0, flood, NOW + 1_000)
        .is_ok());
    // Another peer brings new origins into the rest of the table.
    for i in 0..2u8 {
        assert!(t
            .accept(signed(&id(100 + i), 1, NOW, "h"), 0, honest, NOW)
            .is_ok());
    }
    assert_eq!(t.len(), 8);
    // When the flood's origins expire, its share is free again.
    let later = NOW + BELIEVED_AHEAD_MS + MAX_AGE_MS + 1;
    t.expire(later);
    assert!(t
        .accept(signed(&id(50), 1, later, "z"), 0, flood, later)
        .is_ok());
}
