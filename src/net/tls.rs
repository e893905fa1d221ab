//! rustls configuration (ring provider, TLS 1.3 only, ALPN `awp/0`, mutual auth with a
//! self-signed X.509 certificate for the node's Ed25519 key, no CA).

use crate::identity::Identity;

/// ALPN protocol id.
pub const ALPN: &[u8] = b"awp/0";

/// Server and client configurations for one identity.
pub struct TlsConfig {}

impl TlsConfig {
    /// Build both configs from `identity` (certificate generated in memory).
    pub fn new(identity: &Identity) -> Result<TlsConfig, super::NetError> {
        let _ = identity;
        todo!()
    }
}
