//! Peer keys: `ed25519:` + unpadded base64url of 32 bytes (protocol-notes §Envelope).

/// Why a key string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("key must start with `ed25519:`")]
    Prefix,
    #[error("key is not base64")]
    Encoding,
    #[error("key must be 32 bytes, got {0}")]
    Length(usize),
    #[error("key is not a valid Ed25519 point")]
    Invalid,
    #[error("key is weak (small order)")]
    Weak,
}

/// A validated, non-weak Ed25519 public key. Ordered by its 32 raw bytes (the
/// simultaneous-open tie break compares raw bytes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerKey([u8; 32]);

impl PeerKey {
    /// Parse `ed25519:<b64>`, accepting base64url or standard, padded or not; refuse weak keys.
    pub fn parse(s: &str) -> Result<PeerKey, KeyError> {
        todo!("{s}")
    }
    /// From raw bytes; refuses invalid and weak points.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PeerKey, KeyError> {
        todo!("{bytes:?}")
    }
    /// The 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    /// For strict signature verification.
    pub fn verifying_key(&self) -> ed25519_dalek::VerifyingKey {
        todo!()
    }
    /// Verify `sig` (64 bytes) over `msg` with `verify_strict`.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        todo!("{msg:?}{sig:?}")
    }
    /// `SHA256:` + standard base64 (unpadded) of SHA-256 of the 32 key bytes.
    pub fn fingerprint(&self) -> String {
        todo!()
    }
}

impl std::fmt::Display for PeerKey {
    /// Canonical `ed25519:` + unpadded base64url.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ed25519:{:?}", self.0)
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
