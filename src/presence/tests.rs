//! The presence rules with a fake clock: one test per refusal, seq, hops, expiry, rate.

use super::doc::{self, DocInputs, PeerEntry, ThreadEntry};
use super::*;
use crate::canonical::sign_object;
use crate::identity::Identity;
use serde_json::json;

const NOW: u64 = 1_790_000_000_000;

fn id(seed: u8) -> Identity {
    Identity::from_seed(&[seed; 32])
}

fn signed(who: &Identity, seq: u64, ts_ms: u64, extra: Value) -> Map<String, Value> {
    let mut d = Map::new();
    d.insert("origin".into(), json!(who.key().to_string()));
    d.insert("seq".into(), json!(seq));
    d.insert("ts".into(), json!(wire::time::format_ms(ts_ms)));
    if let Value::Object(m) = extra {
        d.extend(m);
    }
    let sig = sign_object(who, &d);
    d.insert("sig".into(), json!(sig));
    d
}

fn table() -> PresenceTable {
    PresenceTable::new(id(1).key())
}

fn from() -> PeerKey {
    id(2).key()
}

#[test]
fn accepts_a_valid_document_and_forwards_with_one_more_hop() {
    let mut t = table();
    let a = t.accept(signed(&id(3), 5, NOW, json!({})), 0, from(), NOW);
    assert_eq!(
        a,
        Ok(Accepted {
            origin: id(3).key(),
            seq: 5,
            forward_to_hops: Some(1)
        })
    );
    let held = t.get(&id(3).key(), NOW).unwrap();
    assert_eq!((held.seq, held.hops, held.via), (5, 0, from()));
    assert_eq!(t.counters().accepted, 1);
    assert_eq!(t.counters().forwarded, 1);
}

#[test]
fn unknown_fields_stay_covered_by_the_signature() {
    let mut t = table();
    let d = signed(&id(3), 5, NOW, json!({"x-new": {"a": [1, 2]}, "name": "n"}));
    assert!(t.accept(d.clone(), 0, from(), NOW).is_ok());
    let mut tampered = signed(&id(4), 5, NOW, json!({"x-new": 1}));
    tampered.insert("x-new".into(), json!(2));
    assert_eq!(
        t.accept(tampered, 0, from(), NOW),
        Err(Refusal::BadSignature)
    );
}

#[test]
fn forged_signature_is_refused() {
    let mut t = table();
    let mut d = signed(&id(3), 5, NOW, json!({}));
    // Signed by someone else, claiming origin 3.
    let forged = sign_object(&id(4), &d);
    d.insert("sig".into(), json!(forged));
    assert_eq!(t.accept(d, 0, from(), NOW), Err(Refusal::BadSignature));
    assert!(t.is_empty());
    assert_eq!(t.counters().refused["bad_signature"], 1);
}

#[test]
fn weak_origin_key_is_refused() {
    let mut t = table();
    // The identity point (small order), base64url of [1, 0, …, 0].
    let mut weak = [0u8; 32];
    weak[0] = 1;
    let mut d = signed(&id(3), 5, NOW, json!({}));
    d.insert(
        "origin".into(),
        json!(format!("ed25519:{}", wire::b64::encode_url(&weak))),
    );
    assert_eq!(
        t.accept(d, 0, from(), NOW),
        Err(Refusal::BadOrigin(wire::KeyError::Weak))
    );
}

#[test]
fn stale_and_future_timestamps_are_refused() {
    let mut t = table();
    let old = NOW - MAX_AGE_MS - 1;
    assert_eq!(
        t.accept(signed(&id(3), 5, old, json!({})), 0, from(), NOW),
        Err(Refusal::Stale)
    );
    let ahead = NOW + MAX_FUTURE_MS + 1;
    assert_eq!(
        t.accept(signed(&id(3), 5, ahead, json!({})), 0, from(), NOW),
        Err(Refusal::Future)
    );
    // The edges are inside the window.
    assert!(t
        .accept(
            signed(&id(3), 5, NOW - MAX_AGE_MS, json!({})),
            0,
            from(),
            NOW
        )
        .is_ok());
    assert!(t
        .accept(
            signed(&id(4), 5, NOW + MAX_FUTURE_MS, json!({})),
            0,
            from(),
            NOW
        )
        .is_ok());
}

#[test]
fn replayed_or_equal_seq_is_not_newer() {
    let mut t = table();
    let o = id(3);
    t.accept(signed(&o, 10, NOW, json!({})), 0, from(), NOW)
        .unwrap();
    let later = NOW + 5000;
    assert_eq!(
        t.accept(signed(&o, 9, NOW, json!({})), 0, from(), later),
        Err(Refusal::NotNewer { got: 9, held: 10 })
    );
    assert_eq!(
        t.accept(signed(&o, 10, NOW, json!({})), 1, id(5).key(), later),
        Err(Refusal::NotNewer { got: 10, held: 10 })
    );
    assert_eq!(t.get(&o.key(), later).unwrap().seq, 10);
    assert_eq!(
        t.accept(signed(&o, 11, later, json!({})), 0, from(), later)
            .unwrap()
            .seq,
        11
    );
}

#[test]
fn hop_bound_seven_is_kept_but_not_forwarded() {
    let mut t = table();
    let a = t
        .accept(signed(&id(3), 1, NOW, json!({})), 6, from(), NOW)
        .unwrap();
    assert_eq!(a.forward_to_hops, Some(7));
    let b = t
        .accept(signed(&id(4), 1, NOW, json!({})), 7, from(), NOW)
        .unwrap();
    assert_eq!(b.forward_to_hops, None);
    assert!(t.get(&id(4).key(), NOW).is_some());
    assert_eq!(t.counters().forwarded, 1);
    // A hop count far beyond the bound does not overflow.
    let c = t
        .accept(signed(&id(5), 1, NOW, json!({})), u64::MAX, from(), NOW)
        .unwrap();
    assert_eq!(c.forward_to_hops, None);
}

#[test]
fn own_document_echoed_back_is_ignored() {
    let mut t = table();
    assert_eq!(
        t.accept(signed(&id(1), 99, NOW, json!({})), 1, from(), NOW),
        Err(Refusal::Own)
    );
    assert!(t.is_empty());
}

#[test]
fn oversized_document_is_refused() {
    let mut t = table();
    let big = "x".repeat(MAX_DOC_BYTES);
    let d = signed(&id(3), 1, NOW, json!({ "about": big }));
    assert!(matches!(
        t.accept(d, 0, from(), NOW),
        Err(Refusal::TooLarge(n)) if n > MAX_DOC_BYTES
    ));
}

#[test]
fn malformed_documents_are_refused() {
    let mut t = table();
    let cases = [
        json!({"seq": 1, "ts": "2026-01-01T00:00:00Z", "sig": "AA"}),
        json!({"origin": 5, "seq": 1, "ts": "2026-01-01T00:00:00Z", "sig": "AA"}),
        json!({"origin": id(3).key().to_string(), "seq": -1, "ts": "2026-01-01T00:00:00Z", "sig": "AA"}),
        json!({"origin": id(3).key().to_string(), "seq": 1.5, "ts": "2026-01-01T00:00:00Z", "sig": "AA"}),
        json!({"origin": id(3).key().to_string(), "seq": 1, "ts": "yesterday", "sig": "AA"}),
        json!({"origin": id(3).key().to_string(), "seq": 1, "ts": "2026-01-01T00:00:00Z"}),
    ];
    for c in cases {
        let Value::Object(m) = c else { unreachable!() };
        assert!(
            matches!(
                t.accept(m.clone(), 0, from(), NOW),
                Err(Refusal::Malformed(_))
            ),
            "{m:?}"
        );
    }
    // A known optional field of the wrong type, even when signed.
    let d = signed(&id(3), 1, NOW, json!({"peers": "many"}));
    assert!(matches!(
        t.accept(d, 0, from(), NOW),
        Err(Refusal::Malformed(_))
    ));
    let d = signed(&id(3), 1, NOW, json!({}));
    let mut bad_origin = d.clone();
    bad_origin.insert("origin".into(), json!("ed25519:short"));
    assert!(matches!(
        t.accept(bad_origin, 0, from(), NOW),
        Err(Refusal::BadOrigin(_))
    ));
}

#[test]
fn one_document_per_origin_per_second() {
    let mut t = table();
    let o = id(3);
    t.accept(signed(&o, 1, NOW, json!({})), 0, from(), NOW)
        .unwrap();
    // Signed 999 ms after the held one: dropped, however late it arrives.
    assert_eq!(
        t.accept(signed(&o, 2, NOW + 999, json!({})), 0, from(), NOW + 5000),
        Err(Refusal::RateLimited)
    );
    assert_eq!(t.counters().refused["rate_limited"], 1);
    assert_eq!(t.get(&o.key(), NOW).unwrap().seq, 1);
    // Signed a second later: accepted even when it arrives right after the first.
    assert!(t
        .accept(signed(&o, 3, NOW + 1000, json!({})), 0, from(), NOW + 1)
        .is_ok());
    // Another origin is not affected.
    assert!(t
        .accept(signed(&id(4), 1, NOW, json!({})), 0, from(), NOW + 1001)
        .is_ok());
}

#[test]
fn documents_expire_after_ten_minutes() {
    let mut t = table();
    t.accept(signed(&id(3), 1, NOW, json!({})), 0, from(), NOW)
        .unwrap();
    t.accept(signed(&id(4), 1, NOW + 60_000, json!({})), 0, from(), NOW)
        .unwrap();
    let later = NOW + MAX_AGE_MS + 1;
    assert!(t.get(&id(3).key(), later).is_none());
    assert_eq!(t.fresh(later).len(), 1);
    assert_eq!(t.expire(later), 1);
    assert_eq!(t.len(), 1);
    assert_eq!(t.counters().expired, 1);
}

#[test]
fn storage_is_capped_by_evicting_the_oldest() {
    const CAP: usize = 16;
    let mut t = PresenceTable::with_max_origins(id(1).key(), CAP);
    for i in 0..CAP as u64 {
        let who = Identity::from_seed(&{
            let mut s = [0u8; 32];
            s[..8].copy_from_slice(&i.to_be_bytes());
            s[31] = 0xaa;
            s
        });
        // From four peers: one alone may fill only its share of the table.
        let via = id(200 + (i % 4) as u8).key();
        t.accept(signed(&who, 1, NOW + i, json!({})), 0, via, NOW + i)
            .unwrap();
    }
    assert_eq!(t.len(), CAP);
    let newest = id(250);
    t.accept(
        signed(&newest, 1, NOW + 5000, json!({})),
        0,
        from(),
        NOW + 5000,
    )
    .unwrap();
    assert_eq!(t.len(), CAP);
    assert_eq!(t.counters().evicted, 1);
    // The document with the oldest ts (i = 0) went.
    assert_eq!(t.fresh(NOW + 5000).last().unwrap().ts_ms, NOW + 1);
}

#[test]
fn seq_never_goes_back() {
    assert_eq!(doc::next_seq(None, NOW), NOW);
    assert_eq!(doc::next_seq(Some(NOW - 10), NOW), NOW);
    // Clock stepped back: last + 1.
    assert_eq!(doc::next_seq(Some(NOW + 500), NOW), NOW + 501);
    assert_eq!(doc::next_seq(Some(NOW), NOW), NOW + 1);
}

fn inputs() -> DocInputs {
    DocInputs {
        name: Some("alice@laptop".into()),
        about: None,
        version: Some("0.1.0".into()),
        harness: Some("claude".into()),
        model: None,
        host: Some("laptop".into()),
        active_ms: Some(NOW + 29_999),
        peers: vec![PeerEntry {
            key: id(7).key(),
            name: Some("bob".into()),
            up: true,
            rtt_ms: None,
        }],
        threads: vec![ThreadEntry {
            th: "thr_1".into(),
            peer: id(7).key(),
            subject: Some("CI".into()),
            mine: Some("waiting".into()),
            theirs: Some("working".into()),
            updated_ms: NOW,
            unread: 2,
        }],
        outbox: 3,
        unread: 2,
        circuits: vec![],
    }
}

#[test]
fn circuit_addresses_are_published_bounded() {
    let me = id(9);
    let mut inp = inputs();
    let d = doc::build_signed(&me, &inp, NOW, NOW);
    assert!(d.get("circuits").is_none(), "none without --via");
    let c = format!("relay:tls:relay.example:7700#{}/{}", id(3).key(), me.key());
    inp.circuits = vec![c.clone(); doc::MAX_CIRCUITS + 3];
    inp.circuits.insert(0, "x".repeat(doc::MAX_CIRCUIT_LEN + 1));
    let d = doc::build_signed(&me, &inp, NOW, NOW);
    assert_eq!(d["circuits"], json!(vec![c; doc::MAX_CIRCUITS]));
    assert!(table().accept(d, 0, from(), NOW).is_ok());
}

#[test]
fn own_document_is_signed_and_accepted_by_others() {
    let me = id(9);
    let d = doc::build_signed(&me, &inputs(), NOW, NOW);
    assert_eq!(d["waiting"], json!(true));
    // 1_790_000_029_999 rounds down to a 30 s boundary.
    let active = wire::time::parse_rfc3339(d["active"].as_str().unwrap()).unwrap() / 1_000_000;
    assert_eq!(active as u64 % doc::ACTIVE_GRANULARITY_MS, 0);
    assert!(active as u64 <= NOW + 29_999 && active as u64 > NOW + 29_999 - 30_000);
    assert!(d.get("model").is_none());
    assert!(d["peers"][0].get("rtt").is_none());
    let mut t = table();
    assert!(t.accept(d, 0, from(), NOW).is_ok());
}

#[test]
fn own_document_stays_under_the_size_limit() {
    let mut inp = inputs();
    inp.threads = (0..1000)
        .map(|i| ThreadEntry {
            th: format!("thr_{i:0>150}"),
            peer: id(7).key(),
            subject: Some("s".repeat(500)),
            mine: None,
            theirs: None,
            updated_ms: NOW + i,
            unread: 0,
        })
        .collect();
    let d = doc::build_signed(&id(9), &inp, NOW, NOW);
    assert!(encoded_len(&d) <= MAX_DOC_BYTES);
    let threads = d["threads"].as_array().unwrap();
    assert!(!threads.is_empty());
    // The most recently updated thread is kept.
    assert_eq!(
        threads[0]["updated"],
        json!(wire::time::format_ms(NOW + 999))
    );
}

/// A document of about `bytes` bytes (padding in an unknown field the signature covers).
fn padded(who: &Identity, seq: u64, ts_ms: u64, bytes: usize) -> Map<String, Value> {
    signed(who, seq, ts_ms, json!({ "x-pad": "p".repeat(bytes) }))
}

/// Issue #11: one connection sent 1,000 fresh-origin documents of 60 KB, and every one was
/// accepted and forwarded. Now its byte budget runs out after the burst.
#[test]
fn one_connection_cannot_flood_fresh_origins_of_60_kb() {
    let mut t = table();
    let n = 80u8;
    let mut accepted = 0u64;
    let mut by_budget = 0;
    for i in 0..n {
        let d = padded(&id(10 + i), 5, NOW, 60_000);
        match t.accept(d, 0, from(), NOW) {
            Ok(_) => accepted += 1,
            Err(Refusal::ConnBytes) => by_budget += 1,
            Err(e) => panic!("unexpected refusal {e}"),
        }
    }
    assert!(by_budget > 0, "the flood was not limited");
    assert!(accepted * 60_000 <= CONN_BURST_BYTES, "{accepted} accepted");
    assert_eq!(t.counters().refused.get("conn_bytes"), Some(&by_budget));
    // Another peer is not held back by the first one's budget.
    assert!(t
        .accept(padded(&id(200), 5, NOW, 60_000), 0, id(5).key(), NOW)
        .is_ok());
    // The budget refills with time: a few seconds later, a few more fit.
    let later = NOW + 2_000;
    assert!(t
        .accept(padded(&id(201), 5, later, 60_000), 0, from(), later)
        .is_ok());
}

/// Small documents of ever new origins from one connection run out of its new-origin
/// budget (they would evict other origins' documents); the budget refills with time.
#[test]
fn one_connection_cannot_bring_unbounded_new_origins() {
    let limits = Limits {
        burst_origins: 6,
        origins_per_sec: 1,
        ..Limits::default()
    };
    let mut t = PresenceTable::with_limits(id(1).key(), MAX_ORIGINS, limits);
    let mut refused = 0;
    for i in 0..10u8 {
        match t.accept(signed(&id(10 + i), 5, NOW, json!({})), 0, from(), NOW) {
            Ok(_) => {}
            Err(Refusal::ConnOrigins) => refused += 1,
            Err(e) => panic!("unexpected refusal {e}"),
        }
    }
    assert_eq!((t.len(), refused), (6, 4));
    // Newer documents of origins already held cost no origin token.
    let next = NOW + 1_000;
    assert!(t
        .accept(signed(&id(10), 6, next, json!({})), 0, from(), NOW)
        .is_ok());
    // One second later, one more new origin.
    assert!(t
        .accept(signed(&id(30), 5, next, json!({})), 0, from(), next)
        .is_ok());
    assert_eq!(
        t.accept(signed(&id(31), 5, next, json!({})), 0, from(), next),
        Err(Refusal::ConnOrigins)
    );
}

/// Issue #11: a flood evicted the victim's current document, after which its older
/// document was accepted again. The seq watermark outlives the document.
#[test]
fn an_evicted_origin_does_not_roll_back() {
    let mut t = PresenceTable::with_max_origins(id(1).key(), 4);
    let victim = id(3);
    let old = signed(&victim, 100, NOW, json!({"name": "old"}));
    let new = signed(&victim, 200, NOW + 2_000, json!({"name": "new"}));
    assert!(t.accept(new, 0, from(), NOW + 2_000).is_ok());
    // Fresher documents of other origins, from other peers, push the victim out.
    for i in 0..4u8 {
        let d = signed(&id(20 + i), 5, NOW + 3_000, json!({}));
        assert!(t.accept(d, 0, id(40 + i).key(), NOW + 3_000).is_ok());
    }
    assert!(
        t.get(&victim.key(), NOW + 3_000).is_none(),
        "victim evicted"
    );
    assert_eq!(
        t.accept(old.clone(), 0, id(50).key(), NOW + 3_000),
        Err(Refusal::NotNewer {
            got: 100,
            held: 200
        })
    );
    // The marks survive a restart through encode/decode and restore.
    let saved = encode_marks(&t.marks());
    assert!(t.take_marks_changed());
    let mut fresh = PresenceTable::with_max_origins(id(1).key(), 4);
    fresh.restore_marks(decode_marks(&saved), NOW + 3_000);
    assert_eq!(
        fresh.accept(old, 0, id(50).key(), NOW + 3_000),
        Err(Refusal::NotNewer {
            got: 100,
            held: 200
        })
    );
    // Marks are forgotten once every document at or below them is stale anyway.
    let much_later = NOW + 3_000 + MAX_AGE_MS + 1;
    fresh.expire(much_later);
    assert!(fresh.marks().is_empty());
}

#[test]
fn marks_decode_skips_bad_keys_and_short_tails() {
    let good = (id(3).key(), Mark { seq: 9, ts_ms: 7 });
    let mut bytes = encode_marks(&[good]);
    let mut weak = vec![0u8; MARK_BYTES];
    weak[0] = 1; // the identity point: a weak key
    bytes.extend_from_slice(&weak);
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(decode_marks(&bytes), vec![good]);
}

/// Issue 16.5: the document is kept and forwarded as the bytes received, numbers included.
#[test]
fn documents_are_kept_as_the_bytes_received() {
    let who = id(3);
    let text = format!(
        r#"{{"origin":"{}","seq":5,"ts":"{}","x":[1e21, 0.000001,100.50,9007199254740993.0]}}"#,
        who.key(),
        wire::time::format_ms(NOW)
    );
    let unsigned: Map<String, Value> = serde_json::from_str(&text).unwrap();
    let sig = sign_object(&who, &unsigned);
    let raw = format!(r#"{},"sig":"{sig}"}}"#, &text[..text.len() - 1]);
    let parsed: Map<String, Value> = serde_json::from_str(&raw).unwrap();
    let mut t = table();
    assert!(t
        .accept_raw(parsed, Some(raw.clone()), 0, from(), NOW)
        .is_ok());
    assert_eq!(&*t.get(&who.key(), NOW).unwrap().raw, raw.as_str());
    let line = encode_line(
        "01K00000000000000000000009",
        "2026-01-01T00:00:00.000Z",
        &raw,
        1,
    )
    .unwrap();
    let line = String::from_utf8(line).unwrap();
    assert!(
        line.contains(&format!(r#""doc":{raw},"hops":1}}"#)),
        "{line}"
    );
    assert!(line.contains("1e21, 0.000001,100.50,9007199254740993.0"));
    // A padded text counts at its received size.
    let padded = format!("{raw}{}", " ".repeat(MAX_DOC_BYTES));
    let parsed: Map<String, Value> = serde_json::from_str(&padded).unwrap();
    assert!(matches!(
        table().accept_raw(parsed, Some(padded), 0, from(), NOW),
        Err(Refusal::TooLarge(_))
    ));
}
