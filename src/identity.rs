//! The node's Ed25519 identity: `$AWP_HOME/identity.json`
//! `{"key":"ed25519:…","seed":"<base64url 32 bytes>"}`, mode 0600, written atomically,
//! created on first start; a key that does not match its seed is an error.

use crate::wire::PeerKey;
use std::path::Path;

/// Context string of the auth transcript (§7.2).
pub const AUTH_CONTEXT: &[u8] = b"awp-auth-v0";

/// Why the identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid identity file: {detail}")]
    Malformed { path: String, detail: String },
    #[error("{path}: key {key} does not match its seed")]
    Mismatch { path: String, key: String },
}

/// A signing identity.
pub struct Identity {
    signing: ed25519_dalek::SigningKey,
    key: PeerKey,
}

impl Identity {
    /// From a 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> Identity {
        todo!("{seed:?}")
    }
    /// Fresh random identity.
    pub fn generate() -> Identity {
        todo!()
    }
    /// Load `home/identity.json`, or create it (0600, atomic rename) when absent.
    pub fn load_or_create(home: &Path) -> Result<Identity, IdentityError> {
        todo!("{home:?}")
    }
    /// Our public key.
    pub fn key(&self) -> PeerKey {
        self.key
    }
    /// Ed25519 signature (64 bytes) over `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        todo!("{msg:?}{:?}", self.signing)
    }
    /// PKCS#8 v1 DER of the private key (for rustls / rcgen).
    pub fn pkcs8_der(&self) -> Vec<u8> {
        todo!()
    }
}

/// The bytes signed by auth: `"awp-auth-v0" || 0x00 || my_hello || 0x00 || peer_hello`,
/// hello lines exactly as sent/received without the newline (§7.2).
pub fn auth_transcript(my_hello: &[u8], peer_hello: &[u8]) -> Vec<u8> {
    todo!("{my_hello:?}{peer_hello:?}")
}
