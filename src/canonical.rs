//! Canonical JSON (RFC 8785, JSON Canonicalization Scheme) and the signed-object helpers
//! built on it: grants (§10.2) and presence documents are signed over the canonical JSON
//! of the object without its `sig` field.
//!
//! This is the one place that canonicalises; verification always works on the object as
//! received (a parsed `Value`), never on a re-serialised struct, so that unknown fields
//! stay covered by the signature.

use crate::identity::Identity;
use crate::wire::{b64, PeerKey};
use serde_json::{Map, Value};

/// Why a value could not be canonicalised.
#[derive(Debug, thiserror::Error)]
#[error("cannot canonicalise JSON: {0}")]
pub struct CanonicalError(#[from] serde_json::Error);

/// RFC 8785 canonical bytes of `v`: object keys sorted by their UTF-16 code units, no
/// whitespace, numbers in ECMAScript form (`1.0` → `1`, `1e21` → `1e+21`, `-0` → `0`),
/// strings with only the mandatory escapes (control characters as `\u00xx`, except
/// `\b \f \n \r \t`; `<>&`, `/` and non-ASCII raw).
///
/// Integers beyond ±(2^53−1) are rounded by ECMAScript formatting; keep them off the wire
/// (the parser refuses them). Errors only if the serializer fails (a `Value` cannot hold
/// NaN or infinities).
///
/// Written here rather than through `serde_jcs::to_vec` for speed (signed lines put every
/// content line through it on both ends; `serde_jcs` re-parses each key and allocates per
/// map entry): a walk of the `Value` that borrows keys and sorts references. Strings use
/// `serde_json`'s escaping (the same set RFC 8785 §3.2.2.2 mandates) and numbers that are
/// not integers within ±2^53 go through `serde_jcs` (ECMAScript number form, §3.2.2.3).
/// The tests hold it byte-equal to `serde_jcs` on arbitrary values.
pub fn canonical_json(v: &Value) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::with_capacity(256);
    write_value(&mut out, v)?;
    Ok(out)
}

/// The bytes an object's `sig` covers: the canonical JSON of `obj` without its `sig` key
/// (the object is not copied).
pub fn signing_bytes(obj: &Map<String, Value>) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::with_capacity(256);
    write_object(&mut out, obj, Some("sig"))?;
    Ok(out)
}

/// Largest integer ECMAScript prints exactly as its decimal digits (2^53).
const EXACT_INT: u64 = 1 << 53;

fn write_value(out: &mut Vec<u8>, v: &Value) -> Result<(), CanonicalError> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(u) = n.as_u64().filter(|u| *u <= EXACT_INT) {
                out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
            } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= EXACT_INT) {
                out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            } else {
                serde_jcs::to_writer(&mut *out, n)?;
            }
        }
        Value::String(s) => serde_json::to_writer(&mut *out, s)?,
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, x)?;
            }
            out.push(b']');
        }
        Value::Object(m) => write_object(out, m, None)?,
    }
    Ok(())
}

/// `m` with its keys in UTF-16 code-unit order (RFC 8785 §3.2.3), leaving out `skip`.
fn write_object(
    out: &mut Vec<u8>,
    m: &Map<String, Value>,
    skip: Option<&str>,
) -> Result<(), CanonicalError> {
    let mut entries: Vec<(&String, &Value)> =
        m.iter().filter(|(k, _)| Some(k.as_str()) != skip).collect();
    entries.sort_unstable_by(|a, b| utf16_order(a.0, b.0));
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, k)?;
        out.push(b':');
        write_value(out, v)?;
    }
    out.push(b'}');
    Ok(())
}

/// Order of two strings by their UTF-16 code units. It equals byte (code point) order
/// except between characters above U+FFFF (surrogate pairs, 0xD800..) and U+E000..U+FFFF,
/// so the UTF-16 comparison runs only for keys that are not both ASCII.
fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.as_bytes().cmp(b.as_bytes())
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// Sign `obj` (any `sig` field in it is ignored) and return the signature as unpadded
/// base64url (64 bytes), ready to be stored as the object's `sig`.
pub fn sign_object(identity: &Identity, obj: &Map<String, Value>) -> String {
    let bytes = signing_bytes(obj).expect("a serde_json::Value always canonicalises");
    b64::encode_url(&identity.sign(&bytes))
}

/// Check `obj_as_received`'s `sig` (a string, any base64 form, 64 bytes) against `key`
/// with strict verification over the canonical JSON of the object without `sig`. False when
/// `sig` is missing, not a string, not base64, or does not verify.
///
/// Pass the object exactly as parsed (duplicate keys are already refused by
/// [`crate::wire::parse_line`]), not a re-serialised struct.
pub fn verify_object(key: &PeerKey, obj_as_received: &Map<String, Value>) -> bool {
    let Some(Value::String(sig)) = obj_as_received.get("sig") else {
        return false;
    };
    match signing_bytes(obj_as_received) {
        Ok(bytes) => key.verify_b64(&bytes, sig),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: Value) -> String {
        String::from_utf8(canonical_json(&v).unwrap()).unwrap()
    }

    #[test]
    fn sorts_nested_keys_and_drops_whitespace() {
        assert_eq!(
            canon(json!({"b": 1, "a": {"z": [1, 2], "y": null}})),
            r#"{"a":{"y":null,"z":[1,2]},"b":1}"#
        );
    }

    #[test]
    fn sign_then_verify_and_tamper() {
        let id = Identity::from_seed(&[7u8; 32]);
        let mut obj = json!({"iss": id.key().to_string(), "caps": ["exec"], "x": 1})
            .as_object()
            .unwrap()
            .clone();
        let sig = sign_object(&id, &obj);
        obj.insert("sig".into(), Value::String(sig));
        assert!(verify_object(&id.key(), &obj));
        obj.insert("x".into(), json!(2));
        assert!(!verify_object(&id.key(), &obj));
    }

    /// Arbitrary JSON with the awkward parts of RFC 8785: keys outside the BMP and in
    /// U+E000..U+FFFF (where UTF-16 and code point order differ), control characters,
    /// floats, and integers on both sides of 2^53.
    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof![
            "[a-z]{0,3}",
            "[\\u{0}-\\u{7f}]{0,3}",
            "[\\u{e000}-\\u{ffff}\\u{10000}-\\u{10ffff}a\\u{7f}-\\u{ff}]{1,3}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|u| json!(u)),
            (-(1i64 << 54)..(1i64 << 54)).prop_map(|i| json!(i)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            prop_oneof![Just(-0.0f64), Just(1e21), Just(1e-7), Just(0.1)].prop_map(|f| json!(f)),
            "\\PC{0,6}".prop_map(Value::String),
            "[\\u{0}-\\u{1f}\"\\\\/\\u{7f}\\u{2028}]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn equals_serde_jcs_on_any_value(v in any_json()) {
            proptest::prop_assert_eq!(canonical_json(&v).unwrap(), serde_jcs::to_vec(&v).unwrap());
        }

        #[test]
        fn signing_bytes_equal_serde_jcs_without_sig(v in any_json(), sig in any_json()) {
            let mut obj = match v {
                Value::Object(m) => m,
                other => Map::from_iter([("x".to_string(), other)]),
            };
            obj.insert("sig".into(), sig);
            let mut unsigned = obj.clone();
            unsigned.remove("sig");
            proptest::prop_assert_eq!(
                signing_bytes(&obj).unwrap(),
                serde_jcs::to_vec(&Value::Object(unsigned)).unwrap()
            );
        }
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_code_points() {
        // U+10000 is a surrogate pair (0xD800 0xDC00) in UTF-16: before U+E000 there, after
        // it in code point (UTF-8 byte) order.
        let v = json!({"\u{e000}": 1, "\u{10000}": 2, "a": 3, "": 4});
        assert_eq!(
            String::from_utf8(canonical_json(&v).unwrap()).unwrap(),
            "{\"\":4,\"a\":3,\"\u{10000}\":2,\"\u{e000}\":1}"
        );
    }

    #[test]
    fn large_integers_take_the_ecmascript_double_form() {
        assert_eq!(
            canonical_json(&json!(9007199254740992u64)).unwrap(),
            b"9007199254740992"
        );
        assert_eq!(
            canonical_json(&json!(9007199254740993u64)).unwrap(),
            b"9007199254740992"
        );
        assert_eq!(
            canonical_json(&json!(u64::MAX)).unwrap(),
            b"18446744073709552000"
        );
        assert_eq!(canonical_json(&json!(-0.0)).unwrap(), b"0");
        assert_eq!(canonical_json(&json!(1e21)).unwrap(), b"1e+21");
    }

    #[test]
    fn missing_or_non_string_sig_fails() {
        let id = Identity::from_seed(&[7u8; 32]);
        let mut obj = Map::new();
        assert!(!verify_object(&id.key(), &obj));
        obj.insert("sig".into(), json!(5));
        assert!(!verify_object(&id.key(), &obj));
    }
}
