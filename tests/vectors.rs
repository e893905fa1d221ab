//! Known-answer vectors of `../shared/vectors.md` §1–§5, one named test per value pinned.

use awp_node::canonical::{canonical_json, sign_object, verify_object};
use awp_node::identity::{auth_transcript, Identity};
use awp_node::wire::parse::strict_from_str;
use awp_node::wire::{b64, ids::IdGen, time, KeyError, PeerKey};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use ulid::Ulid;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn seed(first: u8) -> [u8; 32] {
    std::array::from_fn(|i| first + i as u8)
}

const A_KEY: &str = "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";
const B_KEY: &str = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc";
const C_KEY: &str = "ed25519:JUO5L_EJVRFHatyDadtt3JM2ZaEZeN2hQE7hBmypVZ0";

fn a() -> Identity {
    Identity::from_seed(&seed(0x00))
}
fn b() -> Identity {
    Identity::from_seed(&seed(0x20))
}

// §1 Fixed identities

#[test]
fn identity_a_key_from_seed() {
    let id = a();
    assert_eq!(id.key().to_string(), A_KEY);
    assert_eq!(
        hex(id.key().as_bytes()),
        "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
    );
}

#[test]
fn identity_b_key_from_seed() {
    let id = b();
    assert_eq!(id.key().to_string(), B_KEY);
    assert_eq!(
        hex(id.key().as_bytes()),
        "29acbae141bccaf0b22e1a94d34d0bc7361e526d0bfe12c89794bc9322966dd7"
    );
}

#[test]
fn key_files_in_keys_dir_match_their_seeds() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("keys");
    for (file, first, key) in [
        ("A.json", 0x00, A_KEY),
        ("B.json", 0x20, B_KEY),
        ("C.json", 0x40, C_KEY),
    ] {
        let id = Identity::load(&dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(id.key().to_string(), key, "{file}");
        assert_eq!(id.key(), Identity::from_seed(&seed(first)).key(), "{file}");
    }
}

// §2 Auth transcript

const A_HELLO: &str = r#"{"t":"hello","id":"01K00000000000000000000000","ts":"2026-01-01T00:00:00.000Z","v":0,"key":"ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg","name":"a@vector","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","caps":["chat","blob","grant","introduce"],"about":"vector A"}"#;
const B_HELLO: &str = r#"{"t":"hello","id":"01K00000000000000000000001","ts":"2026-01-01T00:00:00.001Z","v":0,"key":"ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc","name":"b@vector","nonce":"__________________________________________8","caps":["chat"],"about":"vector B"}"#;
const A_AUTH_SIG: &str =
    "QqzNG9TqSRyYTuKs3bHXn59_wbvQ7jwV0uXGM4VrGIcW9I2hCCaQ9s0MrGd6SmdY-pkCQzcbj09uAg5T2Pe8Cw";
const B_AUTH_SIG: &str =
    "w4GpNHwHcP7YLZlaWPNO2cb6E4HcyPUBQAmU3MBPd7PTXK9w5yEZF05ghIRSJa1UjYEvtLKroPpvUWl3RXY7BA";

#[test]
fn auth_context_bytes() {
    assert_eq!(
        hex(awp_node::identity::AUTH_CONTEXT),
        "6177702d617574682d7630"
    );
    assert_eq!(
        hex(&auth_transcript(b"a", b"b")),
        "6177702d617574682d763000610062"
    );
}

#[test]
fn auth_transcript_a_length_and_sha256() {
    let t = auth_transcript(A_HELLO.as_bytes(), B_HELLO.as_bytes());
    assert_eq!(t.len(), 544);
    assert_eq!(
        hex(&Sha256::digest(&t)),
        "cfeecac9c9b54ee1e3919eb479390139fa026d886ae2d51b020065af3db1a5d3"
    );
}

#[test]
fn auth_transcript_b_sha256() {
    let t = auth_transcript(B_HELLO.as_bytes(), A_HELLO.as_bytes());
    assert_eq!(
        hex(&Sha256::digest(&t)),
        "5a4ef8ed0c200c7b9ecffb1f45114b866705f09827c7f43f7adaac543a55e477"
    );
}

#[test]
fn auth_signature_a_byte_exact_and_verifies() {
    let t = auth_transcript(A_HELLO.as_bytes(), B_HELLO.as_bytes());
    let sig = a().sign(&t);
    assert_eq!(b64::encode_url(&sig), A_AUTH_SIG);
    assert!(PeerKey::parse(A_KEY).unwrap().verify_b64(&t, A_AUTH_SIG));
}

#[test]
fn auth_signature_b_byte_exact_and_verifies() {
    let t = auth_transcript(B_HELLO.as_bytes(), A_HELLO.as_bytes());
    let sig = b().sign(&t);
    assert_eq!(b64::encode_url(&sig), B_AUTH_SIG);
    assert!(PeerKey::parse(B_KEY).unwrap().verify_b64(&t, B_AUTH_SIG));
}

#[test]
fn auth_signature_does_not_cross_verify() {
    let ta = auth_transcript(A_HELLO.as_bytes(), B_HELLO.as_bytes());
    let tb = auth_transcript(B_HELLO.as_bytes(), A_HELLO.as_bytes());
    let ka = PeerKey::parse(A_KEY).unwrap();
    let kb = PeerKey::parse(B_KEY).unwrap();
    assert!(
        !ka.verify_b64(&tb, A_AUTH_SIG),
        "A's sig over B's transcript"
    );
    assert!(!kb.verify_b64(&ta, A_AUTH_SIG), "A's sig under B's key");
    assert!(!ka.verify_b64(&ta, B_AUTH_SIG), "B's sig under A's key");
}

#[test]
fn auth_hello_lines_parse_and_reencode_byte_exact() {
    for line in [A_HELLO, B_HELLO] {
        let parsed = awp_node::wire::parse_line(line.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(parsed.encode()).unwrap(), line);
    }
}

// §3 Grants

const GRANT_CANONICAL: &str = r#"{"caps":["exec","fs:read"],"exp":"2099-01-01T00:00:00Z","iss":"ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","sub":"ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc"}"#;
const GRANT_SIG: &str =
    "8QNWRNjTCQlkIX549_B9yT7ry0KEGK8JlKFqJEhegC6niiRfBgyFMdJj3-s6zcSMbJgmljFyw325zjtep999CA";

fn obj(text: &str) -> Map<String, Value> {
    match strict_from_str(text).unwrap() {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn a_to_b_grant() -> Map<String, Value> {
    obj(&format!(
        r#"{{"iss":"{A_KEY}","sub":"{B_KEY}","caps":["exec","fs:read"],"exp":"2099-01-01T00:00:00Z","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}"#
    ))
}

#[test]
fn grant_a_to_b_canonical_bytes() {
    let bytes = canonical_json(&Value::Object(a_to_b_grant())).unwrap();
    assert_eq!(bytes.len(), 230);
    assert_eq!(String::from_utf8(bytes).unwrap(), GRANT_CANONICAL);
}

#[test]
fn grant_a_to_b_signature_byte_exact_and_verifies() {
    let mut g = a_to_b_grant();
    assert_eq!(sign_object(&a(), &g), GRANT_SIG);
    g.insert("sig".into(), GRANT_SIG.into());
    assert!(verify_object(&PeerKey::parse(A_KEY).unwrap(), &g));
    assert!(!verify_object(&PeerKey::parse(B_KEY).unwrap(), &g));
}

const PUBLISHED_ISS: &str = "ed25519:4ypZnypm77nHtEjcuPHYf0KO6L3XClTwNG8t4d3u9iI";

fn published(caps: &str) -> String {
    format!(
        r#"{{"iss":"{PUBLISHED_ISS}","sub":"ed25519:SzOoZZ93chgozsW4_k3Bng7bw8nm9jhE8F_MT7DwsZM","caps":{caps},"exp":"2026-09-25T20:00:00Z","nonce":"mi7aguVbYbdo0OZSdAyKig","sig":"KIc8YtMgZ0mjshD6ypfayh4E3QHHeRlpX2yL9HU1cpPHoqgIXYh9Ry00Shafa34OvFif31huoA1v5YbnsmUEDg"}}"#
    )
}

#[test]
fn grant_published_signature_verifies_and_is_expired() {
    let g = obj(&published(r#"["exec","fs:read"]"#));
    assert!(verify_object(&PeerKey::parse(PUBLISHED_ISS).unwrap(), &g));
    let exp = g["exp"].as_str().unwrap();
    assert_eq!(
        time::parse_rfc3339(exp).unwrap(),
        1_790_366_400 * 1_000_000_000
    );
    // Expired when now >= exp (§10.2): at the instant itself, and now, but not a ms before.
    let exp_ms = 1_790_366_400_000;
    assert!(time::is_expired(exp, exp_ms).unwrap());
    assert!(!time::is_expired(exp, exp_ms - 1).unwrap());
    assert_eq!(
        time::is_expired(exp, time::now_ms()).unwrap(),
        time::now_ms() >= exp_ms
    );
}

#[test]
fn grant_published_with_admin_caps_fails_signature() {
    let g = obj(&published(r#"["admin"]"#));
    assert!(!verify_object(&PeerKey::parse(PUBLISHED_ISS).unwrap(), &g));
}

#[test]
fn grant_published_reserialised_with_spaces_and_other_order_verifies() {
    let text = r#"{ "sig" : "KIc8YtMgZ0mjshD6ypfayh4E3QHHeRlpX2yL9HU1cpPHoqgIXYh9Ry00Shafa34OvFif31huoA1v5YbnsmUEDg",
        "nonce" : "mi7aguVbYbdo0OZSdAyKig", "exp" : "2026-09-25T20:00:00Z",
        "caps" : [ "exec" , "fs:read" ],
        "sub" : "ed25519:SzOoZZ93chgozsW4_k3Bng7bw8nm9jhE8F_MT7DwsZM",
        "iss" : "ed25519:4ypZnypm77nHtEjcuPHYf0KO6L3XClTwNG8t4d3u9iI" }"#;
    assert!(verify_object(
        &PeerKey::parse(PUBLISHED_ISS).unwrap(),
        &obj(text)
    ));
}

#[test]
fn grant_with_extra_field_verifies_over_its_canonical_form() {
    let mut g = a_to_b_grant();
    g.insert("ext".into(), serde_json::json!({"why": "ci"}));
    let sig = sign_object(&a(), &g);
    g.insert("sig".into(), sig.into());
    let key = PeerKey::parse(A_KEY).unwrap();
    assert!(verify_object(&key, &g));
    // The extra field is covered: dropping it breaks the signature.
    g.remove("ext");
    assert!(!verify_object(&key, &g));
}

// §4 Canonical JSON (RFC 8785)

fn canon(text: &str) -> String {
    String::from_utf8(canonical_json(&strict_from_str(text).unwrap()).unwrap()).unwrap()
}

#[test]
fn jcs_numbers_and_utf16_key_order() {
    assert_eq!(
        canon(r#"{"b":1,"a":[1.0,1e21,-0.0,"é😀"],"é":0,"😀":1,"10":1,"9":2}"#),
        r#"{"10":1,"9":2,"a":[1,1e+21,0,"é😀"],"b":1,"é":0,"😀":1}"#
    );
}

#[test]
fn jcs_surrogate_pair_sorts_before_private_use() {
    assert_eq!(
        canon(r#"{"\uffff":1,"\ud83d\ude00":2,"\ue000":3}"#),
        "{\"😀\":2,\"\u{e000}\":3,\"\u{ffff}\":1}"
    );
}

#[test]
fn jcs_nested_objects_sorted() {
    assert_eq!(
        canon(r#"{"b":1,"a":[true,null,"é"],"c":{"z":0,"y":"x"}}"#),
        r#"{"a":[true,null,"é"],"b":1,"c":{"y":"x","z":0}}"#
    );
}

#[test]
fn jcs_string_escaping() {
    assert_eq!(
        canon(r#"["\u0001\u001f\b\f\n\r\t\"\\<>&/é\u007f"]"#),
        "[\"\\u0001\\u001f\\b\\f\\n\\r\\t\\\"\\\\<>&/é\u{7f}\"]"
    );
}

#[test]
fn jcs_nan_and_infinity_cannot_be_canonicalised() {
    // A serde_json::Value cannot hold them at all…
    assert!(serde_json::Number::from_f64(f64::NAN).is_none());
    assert!(serde_json::Number::from_f64(f64::INFINITY).is_none());
    // …and the canonicaliser refuses them when given directly.
    assert!(serde_jcs::to_vec(&f64::NAN).is_err());
    assert!(serde_jcs::to_vec(&f64::NEG_INFINITY).is_err());
}

// §5 Encodings

#[test]
fn key_decodes_from_all_base64_forms() {
    let canonical = PeerKey::parse(A_KEY).unwrap();
    let body = A_KEY.strip_prefix("ed25519:").unwrap();
    let padded = format!("ed25519:{body}=");
    let std = format!("ed25519:{}", body.replace('-', "+").replace('_', "/"));
    let std_padded = format!("{std}=");
    for form in [padded, std, std_padded] {
        let k = PeerKey::parse(&form).unwrap_or_else(|e| panic!("{form}: {e}"));
        assert_eq!(k, canonical, "{form}");
        assert_eq!(k.to_string(), A_KEY, "encoders emit the canonical form");
    }
}

#[test]
fn base64_small_values() {
    assert_eq!(b64::decode_any("aGk=").unwrap(), b"hi");
    assert_eq!(b64::decode_any("aGk").unwrap(), b"hi");
    assert_eq!(b64::decode_any("-_8").unwrap(), [0xfb, 0xff]);
    assert_eq!(b64::decode_any("+/8").unwrap(), [0xfb, 0xff]);
}

#[test]
fn rejected_keys() {
    assert_eq!(PeerKey::parse(""), Err(KeyError::Prefix));
    assert!(PeerKey::parse("ed25519:").is_err());
    assert_eq!(PeerKey::parse("rsa:AAAA"), Err(KeyError::Prefix));
    assert_eq!(PeerKey::parse("ed25519:AAAA"), Err(KeyError::Length(3)));
    let k31 = format!("ed25519:{}", b64::encode_url(&[7u8; 31]));
    assert_eq!(PeerKey::parse(&k31), Err(KeyError::Length(31)));
    assert_eq!(
        PeerKey::parse("ed25519:AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        Err(KeyError::Weak)
    );
}

#[test]
fn weak_key_signature_never_verifies() {
    // The identity point accepts one fixed signature for any message under plain
    // `verify`; it must be refused before any verification.
    let mut identity = [0u8; 32];
    identity[0] = 1;
    assert_eq!(PeerKey::from_bytes(&identity), Err(KeyError::Weak));
}

#[test]
fn fingerprint_form() {
    let fp = PeerKey::parse(A_KEY).unwrap().fingerprint();
    let expected = {
        use base64::Engine;
        let d = Sha256::digest(PeerKey::parse(A_KEY).unwrap().as_bytes());
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d)
    };
    assert_eq!(fp, format!("SHA256:{expected}"));
    assert_eq!(fp.len(), "SHA256:".len() + 43);
}

const NS: i128 = 1_000_000_000;

#[test]
fn rfc3339_utc_seconds() {
    assert_eq!(
        time::parse_rfc3339("2026-09-25T17:03:11Z").unwrap(),
        1_790_355_791 * NS
    );
}

#[test]
fn rfc3339_positive_offset_with_fraction() {
    assert_eq!(
        time::parse_rfc3339("2026-09-25T17:03:11.250+02:00").unwrap(),
        1_790_348_591 * NS + 250_000_000
    );
}

#[test]
fn rfc3339_negative_half_hour_offset() {
    let a = time::parse_rfc3339("2026-09-25T15:30:00-04:30").unwrap();
    assert_eq!(a, time::parse_rfc3339("2026-09-25T20:00:00Z").unwrap());
    assert_eq!(a, 1_790_366_400 * NS);
}

#[test]
fn rfc3339_keeps_nanoseconds() {
    assert_eq!(
        time::parse_rfc3339("2026-09-25T20:00:00.123456789Z").unwrap(),
        1_790_366_400 * NS + 123_456_789
    );
}

#[test]
fn rfc3339_refuses_words() {
    assert!(time::parse_rfc3339("yesterday").is_err());
    assert!(time::parse_rfc3339("").is_err());
}

const FROZEN_MS: u64 = 1_790_366_400_000;

#[test]
fn ids_ten_thousand_with_frozen_clock_strictly_increase() {
    let mut g = IdGen::new(None);
    let mut prev: Option<String> = None;
    for _ in 0..10_000 {
        let id = g.next_at(FROZEN_MS).to_string();
        assert_eq!(id.len(), 26);
        if let Some(p) = &prev {
            assert!(id.as_str() > p.as_str(), "{id} <= {p}");
        }
        prev = Some(id);
    }
}

#[test]
fn ids_clock_step_back_one_hour_still_larger() {
    let mut g = IdGen::new(None);
    let before = g.next_at(FROZEN_MS).to_string();
    let after = g.next_at(FROZEN_MS - 3_600_000).to_string();
    assert!(after > before, "{after} <= {before}");
}

#[test]
fn ids_after_observing_future_id_are_larger() {
    let mut g = IdGen::new(None);
    let future = Ulid::from_parts(FROZEN_MS + 86_400_000, 12345);
    g.observe(future);
    let next = g.next_at(FROZEN_MS);
    assert!(next.to_string() > future.to_string());
}

#[test]
fn ids_seeded_from_last_sent_survive_restart() {
    let last = IdGen::new(None).next_at(FROZEN_MS);
    let mut restarted = IdGen::new(Some(last));
    assert!(restarted.next_at(FROZEN_MS - 1) > last);
}
