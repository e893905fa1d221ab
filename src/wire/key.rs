//! Peer keys: `ed25519:` + unpadded base64url of 32 bytes (protocol-notes §Envelope).

/// The key prefix of the only algorithm in v0.
pub const PREFIX: &str = "ed25519:";

/// Why a key string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("key must start with `ed25519:`")]
    Prefix,
    #[error("key is not base64")]
    Encoding,
    /// Base64 whose last character carries bits beyond the 32 bytes (e.g. a valid key with
    /// its last character changed): refused, as every decoder must (protocol-notes
    /// §Envelope, canonical encodings), and never read as some other key.
    #[error("not a valid key: non-canonical encoding (its last character does not end a 32-byte key; check for a typo)")]
    NonCanonical,
    #[error("key must be 32 bytes, got {0}")]
    Length(usize),
    #[error("key is not a valid Ed25519 point")]
    Invalid,
    #[error("key is weak (small order)")]
    Weak,
}

/// Whether `s` decodes as base64 (either alphabet, padded or not) once bits beyond its
/// last whole byte are allowed: then it is base64 with a non-canonical last character.
fn lenient_decodes(s: &str) -> bool {
    use base64::alphabet::{STANDARD, URL_SAFE};
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine;
    let cfg = GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent);
    [&URL_SAFE, &STANDARD]
        .into_iter()
        .any(|a| GeneralPurpose::new(a, cfg).decode(s).is_ok())
}

/// A validated, non-weak Ed25519 public key. Ordered by its 32 raw bytes (the
/// simultaneous-open tie break compares raw bytes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerKey([u8; 32]);

impl PeerKey {
    /// Parse `ed25519:<b64>`, accepting base64url or standard, padded or not; refuse weak keys.
    ///
    /// Errors: [`KeyError::Prefix`] without `ed25519:`, [`KeyError::Encoding`] when the rest
    /// is not base64, [`KeyError::NonCanonical`] when its last character has bits set that
    /// no 32-byte value gives, [`KeyError::Length`] unless it decodes to 32 bytes, then as
    /// [`PeerKey::from_bytes`].
    pub fn parse(s: &str) -> Result<PeerKey, KeyError> {
        let b64 = s.strip_prefix(PREFIX).ok_or(KeyError::Prefix)?;
        let bytes = super::b64::decode_any(b64).map_err(|_| match lenient_decodes(b64) {
            true => KeyError::NonCanonical,
            false => KeyError::Encoding,
        })?;
        let bytes: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::Length(bytes.len()))?;
        PeerKey::from_bytes(&bytes)
    }
    /// From raw bytes; refuses points that do not decompress ([`KeyError::Invalid`]) and
    /// small-order points ([`KeyError::Weak`], `VerifyingKey::is_weak`).
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PeerKey, KeyError> {
        let vk = ed25519_dalek::VerifyingKey::from_bytes(bytes).map_err(|_| KeyError::Invalid)?;
        if vk.is_weak() {
            return Err(KeyError::Weak);
        }
        Ok(PeerKey(*bytes))
    }
    /// [`PeerKey::from_bytes`], remembering the last key this thread accepted: a scan over
    /// records keyed by peer (sorted, so runs of one key) decompresses each key once instead
    /// of once per record (a point decompression and a small-order check cost tens of
    /// microseconds). Same errors as `from_bytes`; only bytes that passed it are remembered.
    pub fn from_bytes_cached(bytes: &[u8; 32]) -> Result<PeerKey, KeyError> {
        thread_local! {
            static LAST: std::cell::Cell<Option<[u8; 32]>> = const { std::cell::Cell::new(None) };
        }
        if LAST.with(|l| l.get().as_ref() == Some(bytes)) {
            return Ok(PeerKey(*bytes));
        }
        let key = PeerKey::from_bytes(bytes)?;
        LAST.with(|l| l.set(Some(*bytes)));
        Ok(key)
    }
    /// The 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    /// For strict signature verification.
    pub fn verifying_key(&self) -> ed25519_dalek::VerifyingKey {
        // Checked to decompress when the PeerKey was built.
        ed25519_dalek::VerifyingKey::from_bytes(&self.0)
            .expect("PeerKey holds a valid point by construction")
    }
    /// Verify `sig` (must be exactly 64 bytes) over `msg` with `verify_strict`
    /// (protocol-notes §Envelope). False on a wrong length or a bad signature.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Ok(sig) = ed25519_dalek::Signature::from_slice(sig) else {
            return false;
        };
        self.verifying_key().verify_strict(msg, &sig).is_ok()
    }
    /// Verify a base64 signature string (any form accepted by [`super::b64::decode_any`]).
    pub fn verify_b64(&self, msg: &[u8], sig_b64: &str) -> bool {
        super::b64::decode_any(sig_b64).is_ok_and(|sig| self.verify(msg, &sig))
    }
    /// `SHA256:` + standard base64 (unpadded) of SHA-256 of the 32 key bytes.
    pub fn fingerprint(&self) -> String {
        use base64::Engine;
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.0);
        format!(
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }
}

impl std::fmt::Display for PeerKey {
    /// Canonical `ed25519:` + unpadded base64url.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}{}", super::b64::encode_url(&self.0))
    }
}

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for PeerKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PeerKey::parse(s)
    }
}

impl serde::Serialize for PeerKey {
    /// As its canonical string.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PeerKey {
    /// From any accepted key string; refuses what [`PeerKey::parse`] refuses.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        PeerKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";

    #[test]
    fn display_is_canonical() {
        let k = PeerKey::parse(A).unwrap();
        assert_eq!(k.to_string(), A);
        assert_eq!(format!("{k:?}"), A);
    }

    #[test]
    fn serde_round_trip() {
        let k = PeerKey::parse(A).unwrap();
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, format!("\"{A}\""));
        assert_eq!(serde_json::from_str::<PeerKey>(&json).unwrap(), k);
        assert!(serde_json::from_str::<PeerKey>("\"ed25519:AAAA\"").is_err());
    }

    /// Usability #7: a pinned key with its last character changed is "not a valid key
    /// (non-canonical encoding)", not "not base64".
    #[test]
    fn a_changed_last_character_is_a_non_canonical_key() {
        // `g` (100000) ends A; `h` (100001) sets a bit beyond the 32 bytes.
        let bad = format!("{}h", &A[..A.len() - 1]);
        let e = PeerKey::parse(&bad).unwrap_err();
        assert_eq!(e, KeyError::NonCanonical);
        let text = e.to_string();
        assert!(
            text.contains("not a valid key") && text.contains("non-canonical"),
            "{text}"
        );
        assert!(!text.contains("not base64"), "{text}");
    }

    #[test]
    fn refusals_name_the_reason() {
        assert_eq!(PeerKey::parse("rsa:AAAA"), Err(KeyError::Prefix));
        assert_eq!(PeerKey::parse("ed25519:!!"), Err(KeyError::Encoding));
        assert_eq!(PeerKey::parse("ed25519:AAAA"), Err(KeyError::Length(3)));
        assert_eq!(
            PeerKey::parse("ed25519:AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
            Err(KeyError::Weak)
        );
    }

    #[test]
    fn non_point_is_invalid() {
        // y = 2 is not on the curve.
        let mut b = [0u8; 32];
        b[0] = 2;
        assert_eq!(PeerKey::from_bytes(&b), Err(KeyError::Invalid));
    }

    /// The cache only skips the checks for the key it last accepted: refusals stay
    /// refusals before and after a valid key is remembered.
    #[test]
    fn cached_decoding_refuses_what_from_bytes_refuses() {
        let good = *PeerKey::parse(A).unwrap().as_bytes();
        let mut not_point = [0u8; 32];
        not_point[0] = 2;
        let mut weak = [0u8; 32];
        weak[0] = 1;
        for _ in 0..2 {
            assert_eq!(
                PeerKey::from_bytes_cached(&not_point),
                Err(KeyError::Invalid)
            );
            assert_eq!(PeerKey::from_bytes_cached(&weak), Err(KeyError::Weak));
            assert_eq!(*PeerKey::from_bytes_cached(&good).unwrap().as_bytes(), good);
            assert_eq!(*PeerKey::from_bytes_cached(&good).unwrap().as_bytes(), good);
        }
    }

    #[test]
    fn verify_refuses_wrong_length_signature() {
        let k = PeerKey::parse(A).unwrap();
        assert!(!k.verify(b"x", &[0u8; 63]));
        assert!(!k.verify_b64(b"x", "not base64!"));
    }
}
