//! Transports and addresses: `tls:HOST:PORT[#ed25519:KEY]` (default; TLS 1.3, mTLS with
//! self-signed Ed25519 certificates, ALPN `awp/0`), `tcp:HOST:PORT` (plaintext, loopback
//! and private addresses only unless allowed), `unix:/path`. See `spec/tls-binding.md`.
//!
//! Nothing above this module touches bytes: [`LineReader`] frames lines with the 1 MiB cap
//! and the writer half takes whole lines.

pub mod address;
pub mod framing;
pub mod tls;

pub use address::{Address, AddressError};
pub use framing::{LineReader, ReadError};
pub use tls::TlsConfig;

use crate::wire::PeerKey;
use tokio::io::{AsyncRead, AsyncWrite};

/// Boxed read half of a connection.
pub type BoxReader = Box<dyn AsyncRead + Send + Unpin>;
/// Boxed write half of a connection.
pub type BoxWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Which binding a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tls,
    Tcp,
    Unix,
}

/// An established transport connection, before the AWP handshake.
pub struct Conn {
    pub reader: LineReader,
    pub writer: BoxWriter,
    /// For TLS: the Ed25519 key of the peer's certificate (already checked not weak, and
    /// equal to the address pin when dialing a pinned address).
    pub peer_cert_key: Option<PeerKey>,
    pub transport: Transport,
    /// Human-readable remote end (`ip:port` or the socket path).
    pub remote: String,
}

/// Transport failures.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error(
        "plaintext tcp to {0} refused: not a loopback or private address (use --allow-plaintext)"
    )]
    PlaintextRefused(String),
    #[error("address: {0}")]
    Address(#[from] AddressError),
}

/// Dial options.
#[derive(Debug, Clone, Default)]
pub struct DialOptions {
    /// Allow `tcp:` to public addresses.
    pub allow_plaintext: bool,
}

/// Connect to `addr`. For a pinned TLS address the TLS handshake fails when the server's
/// certificate is for another key.
pub async fn dial(addr: &Address, tls: &TlsConfig, opts: &DialOptions) -> Result<Conn, NetError> {
    todo!("{addr}{:?}{opts:?}", tls as *const _)
}

/// A bound listener.
pub struct Listener {}

/// An accepted socket whose TLS handshake (if any) is still to run: call
/// [`Incoming::handshake`] in its own task so a slow peer never blocks other accepts.
pub struct Incoming {}

impl Listener {
    /// Bind `addr` (port 0 picks a free port; a `unix:` path is replaced if stale).
    pub async fn bind(
        addr: &Address,
        tls: &TlsConfig,
        opts: &DialOptions,
    ) -> Result<Listener, NetError> {
        todo!("{addr}{:?}{opts:?}", tls as *const _)
    }
    /// The bound address (actual port).
    pub fn local_address(&self) -> Address {
        todo!()
    }
    /// Next accepted socket.
    pub async fn accept(&self) -> Result<Incoming, NetError> {
        todo!()
    }
}

impl Incoming {
    /// Remote end, for logs.
    pub fn remote(&self) -> String {
        todo!()
    }
    /// Finish the transport handshake (TLS) and return the connection.
    pub async fn handshake(self) -> Result<Conn, NetError> {
        todo!()
    }
}

/// Addresses another host can dial for a listener bound to `bound` (for `0.0.0.0` / `::`:
/// one per non-loopback interface address, loopback last), each TLS one pinned with `key`.
pub fn dialable_addresses(bound: &Address, key: &PeerKey) -> Vec<Address> {
    todo!("{bound}{key}")
}
