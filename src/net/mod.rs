//! Transports and addresses: `tls:HOST:PORT[#ed25519:KEY]` (default; TLS 1.3, mTLS with
//! self-signed Ed25519 certificates, ALPN `awp/0`), `tcp:HOST:PORT` (plaintext, loopback
//! and private addresses only unless allowed), `unix:/path`. See `spec/tls-binding.md`.
//!
//! Nothing above this module touches bytes: [`LineReader`] frames lines with the 1 MiB cap
//! and the writer half takes whole lines.

pub mod address;
pub mod circuit;
pub mod framing;
pub mod tls;
pub mod tls_stream;

#[cfg(test)]
mod tests;

pub use address::{Address, AddressError};
pub use framing::{LineReader, ReadError};
pub use tls::TlsConfig;

use crate::wire::PeerKey;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// Boxed read half of a connection.
pub type BoxReader = Box<dyn AsyncRead + Send + Unpin>;
/// Boxed write half of a connection.
pub type BoxWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Time allowed for name resolution plus the TCP (or Unix) connect of one dial.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Time allowed for the TLS handshake, on either side. The AWP handshake timeout (30 s
/// from accept to auth verified, protocol-notes §Handshake) is enforced above this module.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Time an accepted socket has to send its first byte (the TLS ClientHello, or the hello
/// line on `tcp:` and `unix:`). Dialers write at once (protocol-notes §Handshake), so only
/// an idle socket waits this long; it then frees its handshake slot (issue 8 §4b).
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where an accepted socket comes from, for per-source limits: an IPv4 address, an IPv6
/// /64 prefix (IPv4-mapped IPv6 counts as IPv4), or for a Unix socket the peer's process
/// id from `SO_PEERCRED` (`UnixPid(None)` when the kernel gives none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address.
    V4(std::net::Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6Prefix(u64),
    /// A Unix socket peer's process id.
    UnixPid(Option<i32>),
}

impl Source {
    /// The source of a TCP peer at `ip`.
    pub fn of_ip(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4),
                None => Source::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// Which binding a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `tls:`: TLS 1.3 over TCP with mutual certificate authentication.
    Tls,
    /// `tcp:`: plaintext TCP.
    Tcp,
    /// `unix:`: Unix domain stream socket.
    Unix,
}

/// An established transport connection, before the AWP handshake.
pub struct Conn {
    /// Incoming lines, framed with the 1 MiB cap.
    pub reader: LineReader,
    /// Outgoing bytes: write whole `\n`-terminated lines, then flush (TLS buffers records).
    pub writer: BoxWriter,
    /// For TLS: the Ed25519 key of the peer's certificate (already checked not weak, and
    /// equal to the address pin when dialing a pinned address).
    pub peer_cert_key: Option<PeerKey>,
    /// The binding in use.
    pub transport: Transport,
    /// Human-readable remote end (`ip:port` or the socket path).
    pub remote: String,
}

/// Transport failures.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Socket-level failure (connect refused, bind in use, timeouts as `TimedOut`).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// TLS handshake or configuration failure, including a refused certificate or pin
    /// mismatch, a missing client certificate, and ALPN not `awp/0`.
    #[error("TLS: {0}")]
    Tls(String),
    /// `tcp:` to, or bound on, an address that is not loopback or private, without
    /// [`DialOptions::allow_plaintext`]. Nothing was sent or bound.
    #[error(
        "plaintext tcp to {0} refused: not a loopback or private address (use --allow-plaintext)"
    )]
    PlaintextRefused(String),
    /// An address string did not parse.
    #[error("address: {0}")]
    Address(#[from] AddressError),
}

/// Dial options.
#[derive(Debug, Clone, Default)]
pub struct DialOptions {
    /// Allow `tcp:` to public addresses.
    pub allow_plaintext: bool,
}

/// Whether plaintext TCP may use `ip` without [`DialOptions::allow_plaintext`]: loopback
/// (127.0.0.0/8, ::1), private (RFC 1918: 10/8, 172.16/12, 192.168/16; RFC 4193:
/// fc00::/7) or link-local (169.254/16, fe80::/10); IPv4-mapped IPv6 follows the IPv4
/// rule. Everything else is public, including the unspecified `0.0.0.0` / `::` (a listener
/// bound there is reachable from every network) and shared address space 100.64/10.
pub fn is_private_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_private() || v4.is_link_local(),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private_ip(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
    }
}

/// Resolve `host` (a literal IP needs no lookup) within [`CONNECT_TIMEOUT`].
async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, NetError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let found = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| timed_out(format!("resolving {host}")))??;
    let addrs: Vec<SocketAddr> = found.collect();
    if addrs.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host} has no addresses"),
        )
        .into());
    }
    Ok(addrs)
}

fn timed_out(what: String) -> NetError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: timed out")).into()
}

/// Refuse plaintext when any resolved address is public (a name that mixes public and
/// private answers is refused as a whole, so the outcome never depends on answer order).
fn check_plaintext(host: &str, addrs: &[SocketAddr], opts: &DialOptions) -> Result<(), NetError> {
    if opts.allow_plaintext {
        return Ok(());
    }
    match addrs.iter().find(|a| !is_private_ip(a.ip())) {
        None => Ok(()),
        Some(a) if host.parse::<IpAddr>().is_ok() => Err(NetError::PlaintextRefused(a.to_string())),
        Some(a) => Err(NetError::PlaintextRefused(format!("{host} ({a})"))),
    }
}

/// Connect to the first address that answers, within [`CONNECT_TIMEOUT`] in total.
async fn connect_tcp(addrs: &[SocketAddr]) -> Result<TcpStream, NetError> {
    let attempt = async {
        let mut last = None;
        for a in addrs {
            match TcpStream::connect(a).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no addresses to connect to")))
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .map_err(|_| timed_out(format!("connecting to {addrs:?}")))??;
    refuse_self_connection(&stream)?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A socket connected to itself is refused (`ConnectionRefused`, as if nobody listened).
///
/// Dialing a port of the ephemeral range on this host while nothing listens there can
/// pick that very port as the local end: TCP simultaneous open then connects the socket to
/// itself, and the TLS handshake would meet its own ClientHello (issue 8 §3). Local
/// address equal to remote address is that case.
pub fn refuse_self_connection(stream: &TcpStream) -> std::io::Result<()> {
    let (local, peer) = (stream.local_addr()?, stream.peer_addr()?);
    if local == peer {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("connection to {peer} refused (the socket connected to itself)"),
        ));
    }
    Ok(())
}

/// The ALPN and certificate checks shared by both sides after a TLS handshake.
fn tls_peer_key(state: &rustls::CommonState) -> Result<PeerKey, NetError> {
    if state.alpn_protocol() != Some(tls::ALPN) {
        return Err(NetError::Tls(format!(
            "peer did not negotiate ALPN {}",
            String::from_utf8_lossy(tls::ALPN)
        )));
    }
    let cert = state
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| NetError::Tls("peer presented no certificate".into()))?;
    tls::certificate_key(cert.as_ref()).map_err(|e| NetError::Tls(e.to_string()))
}

/// A failed TLS handshake as [`NetError::Tls`], with our own certificate refusals (pin
/// mismatch, weak key, …) in plain words rather than rustls' debug form.
fn tls_failure(e: std::io::Error) -> NetError {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))) = inner {
        return NetError::Tls(format!("peer certificate refused: {}", other.0));
    }
    NetError::Tls(e.to_string())
}

fn into_conn<S>(
    stream: S,
    peer_cert_key: Option<PeerKey>,
    transport: Transport,
    remote: String,
) -> Conn
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    Conn {
        reader: LineReader::new(Box::new(r)),
        writer: Box::new(w),
        peer_cert_key,
        transport,
        remote,
    }
}

/// Connect to `addr`. For a pinned TLS address the TLS handshake fails when the server's
/// certificate is for another key.
///
/// - `tls:` resolves, connects (TCP_NODELAY), runs the TLS 1.3 handshake with our
///   certificate and returns the server's certificate key in [`Conn::peer_cert_key`].
/// - `tcp:` refuses with [`NetError::PlaintextRefused`] before connecting when any resolved
///   address is public (see [`is_private_ip`]) unless `opts.allow_plaintext`.
/// - `unix:` connects to the socket path.
///
/// Bounded by [`CONNECT_TIMEOUT`] plus [`TLS_HANDSHAKE_TIMEOUT`] (timeouts are
/// [`NetError::Io`] with kind `TimedOut`).
pub async fn dial(addr: &Address, tls: &TlsConfig, opts: &DialOptions) -> Result<Conn, NetError> {
    match addr {
        Address::Tls { host, port, pin } => {
            let config = tls.client_config(*pin)?;
            let addrs = resolve(host, *port).await?;
            let tcp = connect_tcp(&addrs).await?;
            let remote = tcp.peer_addr()?.to_string();
            let conn = rustls::client::UnbufferedClientConnection::new(config, tls::server_name())
                .map_err(|e| NetError::Tls(e.to_string()))?;
            let stream = tokio::time::timeout(
                TLS_HANDSHAKE_TIMEOUT,
                tls_stream::TlsStream::handshake(conn, tcp),
            )
            .await
            .map_err(|_| NetError::Tls(format!("handshake with {remote} timed out")))?
            .map_err(tls_failure)?;
            let key = tls_peer_key(stream.common())?;
            if let Some(want) = pin {
                // The verifier already refused other keys; re-check what we hand up.
                if key != *want {
                    return Err(NetError::Tls(format!(
                        "certificate key {key} does not match the pinned {want}"
                    )));
                }
            }
            Ok(into_conn(stream, Some(key), Transport::Tls, remote))
        }
        Address::Tcp { host, port } => {
            let addrs = resolve(host, *port).await?;
            check_plaintext(host, &addrs, opts)?;
            let tcp = connect_tcp(&addrs).await?;
            let remote = tcp.peer_addr()?.to_string();
            Ok(into_conn(tcp, None, Transport::Tcp, remote))
        }
        Address::Relay { .. } => circuit::dial(addr, tls).await,
        Address::Unix { path } => {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path))
                .await
                .map_err(|_| timed_out(format!("connecting to {}", path.display())))??;
            Ok(into_conn(
                stream,
                None,
                Transport::Unix,
                path.display().to_string(),
            ))
        }
    }
}

enum Bound {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
        /// (device, inode) of the socket file we created, to remove only our own on drop.
        id: Option<(u64, u64)>,
    },
}

/// A bound listener. A Unix listener removes its socket file when dropped (only if the
/// file is still the one it created).
pub struct Listener {
    bound: Bound,
    local: Address,
    acceptor: Option<std::sync::Arc<rustls::ServerConfig>>,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// An accepted socket whose TLS handshake (if any) is still to run: call
/// [`Incoming::handshake`] in its own task so a slow peer never blocks other accepts.
pub struct Incoming {
    stream: Stream,
    remote: String,
    source: Source,
    acceptor: Option<std::sync::Arc<rustls::ServerConfig>>,
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Make `path` free for a new Unix listener: absent is fine; a socket nobody answers on
/// (connection refused) is stale and removed; a live socket or any other kind of file is
/// an error (`AddrInUse` / `AlreadyExists`), never deleted.
async fn clear_stale_socket(path: &Path) -> Result<(), NetError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )
        .into());
    }
    match tokio::time::timeout(Duration::from_secs(1), UnixStream::connect(path)).await {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)?;
            Ok(())
        }
        Ok(Err(e)) => Err(e.into()),
        Ok(Ok(_)) | Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{} is in use by a running listener", path.display()),
        )
        .into()),
    }
}

impl Listener {
    /// Bind `addr` (port 0 picks a free port; a `unix:` path is replaced if stale).
    ///
    /// - `tls:` binds TCP; the pin, if any, is ignored (it names a remote key).
    /// - `tcp:` follows the plaintext rule of [`dial`] for the bind address: `0.0.0.0`,
    ///   `::` and public addresses need `opts.allow_plaintext`
    ///   ([`NetError::PlaintextRefused`]).
    /// - `unix:` removes a stale socket file (nothing answers on it), refuses a live one or
    ///   a non-socket file, binds and sets the file mode to 0600 (owner only). The mode is
    ///   set right after bind; put the socket in a directory only the owner can enter to
    ///   close that window.
    pub async fn bind(
        addr: &Address,
        tls: &TlsConfig,
        opts: &DialOptions,
    ) -> Result<Listener, NetError> {
        match addr {
            Address::Tls { host, port, .. } | Address::Tcp { host, port } => {
                let is_tls = matches!(addr, Address::Tls { .. });
                let addrs = resolve(host, *port).await?;
                if !is_tls {
                    check_plaintext(host, &addrs, opts)?;
                }
                let listener = TcpListener::bind(addrs.as_slice()).await?;
                let local = listener.local_addr()?;
                let host = local.ip().to_string();
                let port = local.port();
                let (local, acceptor) = if is_tls {
                    (
                        Address::Tls {
                            host,
                            port,
                            pin: None,
                        },
                        Some(tls.server_config()),
                    )
                } else {
                    (Address::Tcp { host, port }, None)
                };
                Ok(Listener {
                    bound: Bound::Tcp(listener),
                    local,
                    acceptor,
                })
            }
            Address::Relay { .. } => Err(NetError::Address(AddressError::Malformed(
                addr.to_string(),
                "a relay circuit address cannot be listened on (use --via)".into(),
            ))),
            Address::Unix { path } => {
                use std::os::unix::fs::PermissionsExt;
                clear_stale_socket(path).await?;
                let listener = UnixListener::bind(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                Ok(Listener {
                    bound: Bound::Unix {
                        listener,
                        path: path.clone(),
                        id: file_id(path),
                    },
                    local: addr.clone(),
                    acceptor: None,
                })
            }
        }
    }

    /// The bound address (actual port; no pin).
    pub fn local_address(&self) -> Address {
        self.local.clone()
    }

    /// Next accepted socket, returned before any TLS handshake. Errors are those of the
    /// OS accept (e.g. out of file descriptors): the caller should log, pause briefly and
    /// call again.
    pub async fn accept(&self) -> Result<Incoming, NetError> {
        match &self.bound {
            Bound::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(Incoming {
                    stream: Stream::Tcp(s),
                    remote: peer.to_string(),
                    source: Source::of_ip(peer.ip()),
                    acceptor: self.acceptor.clone(),
                })
            }
            Bound::Unix { listener, path, .. } => {
                let (s, _) = listener.accept().await?;
                let pid = s.peer_cred().ok().and_then(|c| c.pid());
                Ok(Incoming {
                    stream: Stream::Unix(s),
                    remote: path.display().to_string(),
                    source: Source::UnixPid(pid),
                    acceptor: None,
                })
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Bound::Unix { path, id, .. } = &self.bound {
            if id.is_some() && file_id(path) == *id {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Incoming {
    /// Remote end, for logs.
    pub fn remote(&self) -> String {
        self.remote.clone()
    }

    /// Where the socket comes from (for per-source limits).
    pub fn source(&self) -> Source {
        self.source
    }

    /// Wait until the peer has sent its first byte (the TLS ClientHello, or the first
    /// byte of its hello line), at most [`FIRST_BYTE_TIMEOUT`]; else [`NetError::Io`] with
    /// kind `TimedOut`. Nothing is consumed. The node calls it before
    /// [`Incoming::handshake`], so a socket that says nothing frees its handshake slot soon.
    pub async fn first_byte(&self) -> Result<(), NetError> {
        tokio::time::timeout(FIRST_BYTE_TIMEOUT, first_byte(&self.stream))
            .await
            .map_err(|_| timed_out(format!("first byte from {}", self.remote)))??;
        Ok(())
    }

    /// Finish the transport handshake (TLS, bounded by [`TLS_HANDSHAKE_TIMEOUT`]) and
    /// return the connection. For TLS the client must present an Ed25519 certificate
    /// (non-weak key) and negotiate ALPN `awp/0`; else [`NetError::Tls`].
    pub async fn handshake(self) -> Result<Conn, NetError> {
        match (self.stream, self.acceptor) {
            (Stream::Tcp(s), Some(acceptor)) => {
                let conn = rustls::server::UnbufferedServerConnection::new(acceptor)
                    .map_err(|e| NetError::Tls(e.to_string()))?;
                let stream = tokio::time::timeout(
                    TLS_HANDSHAKE_TIMEOUT,
                    tls_stream::TlsStream::handshake(conn, s),
                )
                .await
                .map_err(|_| NetError::Tls(format!("handshake with {} timed out", self.remote)))?
                .map_err(tls_failure)?;
                let key = tls_peer_key(stream.common())?;
                Ok(into_conn(stream, Some(key), Transport::Tls, self.remote))
            }
            (Stream::Tcp(s), None) => Ok(into_conn(s, None, Transport::Tcp, self.remote)),
            (Stream::Unix(s), _) => Ok(into_conn(s, None, Transport::Unix, self.remote)),
        }
    }
}

/// Wait until the socket has a byte to read (or is at EOF), leaving it unread.
/// (`readable()` alone may report readiness before anything arrived.)
async fn first_byte(stream: &Stream) -> std::io::Result<()> {
    let mut b = [0u8; 1];
    match stream {
        Stream::Tcp(s) => s.peek(&mut b).await.map(|_| ()),
        Stream::Unix(s) => loop {
            s.readable().await?;
            let peek = s.try_io(tokio::io::Interest::READABLE, || {
                rustix::net::recv(s, &mut b, rustix::net::RecvFlags::PEEK)
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
            match peek {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        },
    }
}

/// Addresses another host can dial for a listener bound to `bound` (for `0.0.0.0` / `::`:
/// one per non-loopback interface address, loopback last), each TLS one pinned with `key`.
///
/// `0.0.0.0` lists IPv4 interface addresses; `::` lists IPv4 and IPv6 (Linux listens
/// dual-stack by default). IPv6 link-local addresses are left out (they need a zone id,
/// which the address syntax does not carry). A specific IP, a host name or a Unix path is
/// returned as is (TLS pinned). If the interfaces cannot be listed, only loopback is
/// returned.
pub fn dialable_addresses(bound: &Address, key: &PeerKey) -> Vec<Address> {
    let ip = match bound.ip() {
        Some(ip) if ip.is_unspecified() => ip,
        _ => return vec![bound.with_pin(*key)],
    };
    let want_v6 = ip.is_ipv6();
    let mut ips: Vec<IpAddr> = match if_addrs::get_if_addrs() {
        Ok(ifaces) => ifaces.into_iter().map(|i| i.ip()).collect(),
        Err(_) => Vec::new(),
    };
    ips.retain(|ip| {
        let link_local_v6 = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        (ip.is_ipv4() || want_v6) && !ip.is_unspecified() && !link_local_v6
    });
    if !ips.iter().any(|ip| ip.is_loopback()) {
        ips.push(if want_v6 {
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        });
    }
    // Non-loopback first (stable), loopback last; no duplicates.
    ips.sort_by_key(|ip| ip.is_loopback());
    let mut seen = std::collections::HashSet::new();
    ips.retain(|ip| seen.insert(*ip));
    ips.into_iter()
        .map(|ip| with_host(bound, ip.to_string()).with_pin(*key))
        .collect()
}

/// `addr` with another host (TCP-based addresses; a Unix address is returned unchanged).
fn with_host(addr: &Address, host: String) -> Address {
    match addr {
        Address::Tls { port, pin, .. } => Address::Tls {
            host,
            port: *port,
            pin: *pin,
        },
        Address::Tcp { port, .. } => Address::Tcp { host, port: *port },
        Address::Unix { .. } | Address::Relay { .. } => addr.clone(),
    }
}
