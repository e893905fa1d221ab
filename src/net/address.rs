//! Address syntax (spec/tls-binding.md): `tls:HOST:PORT[#ed25519:KEY]`, `tcp:HOST:PORT`,
//! `unix:/path`. IPv6 hosts in brackets: `tls:[::1]:7700`.

use crate::wire::PeerKey;
use std::path::PathBuf;

/// A parsed address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tls {
        host: String,
        port: u16,
        pin: Option<PeerKey>,
    },
    Tcp {
        host: String,
        port: u16,
    },
    Unix {
        path: PathBuf,
    },
}

/// Why an address did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    #[error("unknown scheme in {0:?}: use tls:HOST:PORT, tcp:HOST:PORT or unix:/path")]
    Scheme(String),
    #[error("bad address {0:?}: {1}")]
    Malformed(String, String),
}

impl std::str::FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        todo!("{s}")
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl Address {
    /// The pinned key of a TLS address.
    pub fn pin(&self) -> Option<PeerKey> {
        match self {
            Address::Tls { pin, .. } => *pin,
            _ => None,
        }
    }
    /// The same address pinned to `key` (TLS only; others unchanged).
    pub fn with_pin(&self, key: PeerKey) -> Address {
        todo!("{key}")
    }
}
