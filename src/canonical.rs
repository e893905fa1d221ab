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
pub fn canonical_json(v: &Value) -> Result<Vec<u8>, CanonicalError> {
    Ok(serde_jcs::to_vec(v)?)
}

/// The bytes an object's `sig` covers: the canonical JSON of `obj` without its `sig` key.
pub fn signing_bytes(obj: &Map<String, Value>) -> Result<Vec<u8>, CanonicalError> {
    let mut unsigned = obj.clone();
    unsigned.remove("sig");
    canonical_json(&Value::Object(unsigned))
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

    #[test]
    fn missing_or_non_string_sig_fails() {
        let id = Identity::from_seed(&[7u8; 32]);
        let mut obj = Map::new();
        assert!(!verify_object(&id.key(), &obj));
        obj.insert("sig".into(), json!(5));
        assert!(!verify_object(&id.key(), &obj));
    }
}
