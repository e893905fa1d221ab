//! base64 forms of protocol-notes §Envelope: encoders emit the canonical form, decoders
//! accept base64url or standard, padded or not.

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;

/// Unpadded base64url (RFC 4648 §5) of `bytes`: the form of keys, nonces and signatures.
pub fn encode_url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Standard base64 (RFC 4648 §4) with `=` padding: the form of chunk `data`.
pub fn encode_std(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Decode any of the four forms (base64url or standard alphabet, padded or not), as
/// receivers must accept (protocol-notes §Envelope). The alphabets may not be mixed within
/// one string. Errors with the last decoder's error when no form fits.
pub fn decode_any(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    let mut out = Vec::new();
    decode_any_into(s, &mut out)?;
    Ok(out)
}

/// [`decode_any`] into `out` (cleared first, its allocation reused; its content is
/// unspecified after an error): for chunk data, decoded into one buffer per receiver.
pub fn decode_any_into(s: &str, out: &mut Vec<u8>) -> Result<(), base64::DecodeError> {
    let padded = s.ends_with('=');
    // A byte scan (the characters are ASCII): `str::contains` with a char set decodes
    // UTF-8 as it goes, which cost more than the base64 decode itself on 1 MiB chunks.
    let url = memchr::memchr2(b'-', b'_', s.as_bytes()).is_some();
    let engines: [&base64::engine::GeneralPurpose; 2] = match (url, padded) {
        (true, false) => [&URL_SAFE_NO_PAD, &STANDARD_NO_PAD],
        (true, true) => [&URL_SAFE, &STANDARD],
        (false, false) => [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD],
        (false, true) => [&STANDARD, &URL_SAFE],
    };
    out.clear();
    if engines[0].decode_vec(s, out).is_ok() {
        return Ok(());
    }
    out.clear();
    engines[1].decode_vec(s, out)
}

/// Decode `s` only when it is exactly the canonical form [`encode_url`] emits: base64url
/// alphabet, no padding, zero trailing bits (the form of hello and grant nonces).
/// Errors with `base64::DecodeError` otherwise.
pub fn decode_canonical_url(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    // The engine refuses padding, the standard alphabet and non-zero trailing bits.
    URL_SAFE_NO_PAD.decode(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoders_emit_canonical_forms() {
        assert_eq!(encode_url(&[0xfb, 0xff]), "-_8");
        assert_eq!(encode_std(&[0xfb, 0xff]), "+/8=");
        assert_eq!(encode_std(b""), "");
    }

    #[test]
    fn decoder_accepts_all_four_forms() {
        for s in ["aGk=", "aGk"] {
            assert_eq!(decode_any(s).unwrap(), b"hi");
        }
        for s in ["-_8", "+/8", "-_8=", "+/8="] {
            assert_eq!(decode_any(s).unwrap(), [0xfb, 0xff], "{s}");
        }
    }

    #[test]
    fn canonical_url_decoder_refuses_every_other_form() {
        assert_eq!(decode_canonical_url("-_8").unwrap(), [0xfb, 0xff]);
        for s in ["+/8", "-_8=", "-_9", "a", "!!!"] {
            assert!(decode_canonical_url(s).is_err(), "{s}");
        }
    }

    #[test]
    fn decoder_refuses_garbage_and_mixed_alphabets() {
        assert!(decode_any("a").is_err());
        assert!(decode_any("a!b=").is_err());
        assert!(decode_any("+_8").is_err());
        assert!(decode_any("aGk==").is_err());
    }
}
