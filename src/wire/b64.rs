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
    base64_simd::STANDARD.encode_to_string(bytes)
}

/// [`encode_std`] appended to `out` (for chunk lines built around their data: one copy).
pub fn encode_std_append(bytes: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(bytes, out);
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
    // The standard alphabet first, the form senders emit for chunk data: its decoder
    // refuses `-` and `_`, so a success is what the choice below would have given, and
    // only other strings pay for the scan that picks the alphabet (a pass over 1 MiB).
    let standard = if padded {
        &base64_simd::STANDARD
    } else {
        &base64_simd::STANDARD_NO_PAD
    };
    out.clear();
    if standard.decode_append(s.as_bytes(), out).is_ok() {
        return Ok(());
    }
    // A byte scan (the characters are ASCII): `str::contains` with a char set decodes
    // UTF-8 as it goes, which cost more than the base64 decode itself on 1 MiB chunks.
    let url = memchr::memchr2(b'-', b'_', s.as_bytes()).is_some();
    let engines: [&base64::engine::GeneralPurpose; 2] = match (url, padded) {
        (true, false) => [&URL_SAFE_NO_PAD, &STANDARD_NO_PAD],
        (true, true) => [&URL_SAFE, &STANDARD],
        (false, false) => [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD],
        (false, true) => [&STANDARD, &URL_SAFE],
    };
    // The SIMD decoder (about 4 times the speed of the `base64` crate's on 1 MiB chunks,
    // issue 10 §3) accepts exactly what the engine of the same form accepts (canonical
    // padding, zero trailing bits: `simd_and_engine_agree` below); on a failure the
    // engines decide and give the error.
    // The standard form's SIMD decoder already refused `s` above.
    if url {
        let simd = if padded {
            &base64_simd::URL_SAFE
        } else {
            &base64_simd::URL_SAFE_NO_PAD
        };
        out.clear();
        if simd.decode_append(s.as_bytes(), out).is_ok() {
            return Ok(());
        }
    }
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

    proptest::proptest! {
        /// The SIMD codec and the `base64` engines agree on every string over the
        /// alphabets and `=`: the same strings decode, to the same bytes, and encoding
        /// gives the same text.
        #[test]
        fn simd_and_engine_agree(
            s in "[A-Za-z0-9+/=_-]{0,80}",
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            last in "[A-Za-z0-9+/=_-]",
        ) {
            for (simd, engine) in [
                (&base64_simd::STANDARD, &STANDARD),
                (&base64_simd::STANDARD_NO_PAD, &STANDARD_NO_PAD),
                (&base64_simd::URL_SAFE, &URL_SAFE),
                (&base64_simd::URL_SAFE_NO_PAD, &URL_SAFE_NO_PAD),
            ] {
                proptest::prop_assert_eq!(simd.decode_to_vec(&s).ok(), engine.decode(&s).ok(), "{}", s);
                let text = engine.encode(&bytes);
                proptest::prop_assert_eq!(simd.encode_to_string(&bytes), text.clone());
                proptest::prop_assert_eq!(simd.decode_to_vec(&text).ok(), Some(bytes.clone()));
                // A valid text with its last symbol replaced: trailing bits and padding.
                let mut near = text.clone();
                if let Some(i) = near.trim_end_matches('=').len().checked_sub(1) {
                    near.replace_range(i..i + 1, &last);
                    proptest::prop_assert_eq!(simd.decode_to_vec(&near).ok(), engine.decode(&near).ok(), "{}", near);
                }
            }
            let mut appended = b"x".to_vec();
            encode_std_append(&bytes, &mut appended);
            let want = STANDARD.encode(&bytes);
            proptest::prop_assert_eq!(&appended[1..], want.as_bytes());
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
