//! Relay circuits (spec/relay-circuits.md): reaching a node that accepts no inbound
//! connections through a relay it keeps a standing connection to, with the ordinary
//! end-to-end TLS 1.3 handshake run *inside* the spliced byte stream, so the relay sees
//! only ciphertext and cannot impersonate either end.
//!
//! Every circuit connection is an outer TLS 1.3 connection to the relay (mutual, the
//! relay pinned, ALPN [`ALPN`]) whose first line is one signed request ([`Kind`]):
//! - `circuit_listen`: the standing connection of a node reachable through this relay;
//!   the relay answers `circuit_ready`, then sends `circuit_offer` lines (and `ping`).
//! - `circuit_connect`: a dialer asks for a circuit to `to`; the relay offers it to `to`
//!   over its standing connection and waits for the join.
//! - `circuit_join`: the target's fresh connection for one offered circuit.
//!
//! The relay answers each with one line (`circuit_ok` or `circuit_err`); after
//! `circuit_ok` both connections carry raw bytes, spliced by the relay ([`splice`]).
//!
//! This module holds the client side ([`dial`], [`listen`], [`join`]) and the relay side
//! ([`RelayCircuits`]); the node wires them in `crate::node::circuits`.

use super::{connect_tcp, into_conn, resolve, tls_failure, tls_peer_key, Address, Conn};
use super::{Incoming, NetError, TlsConfig, Transport, TLS_HANDSHAKE_TIMEOUT};
use crate::wire::{self, PeerKey};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// ALPN id of circuit connections to a relay (the relay also offers `awp/0`). Version 1:
/// after `circuit_ok` the spliced connections leave the outer TLS and carry the end-to-end
/// TLS directly on TCP (spec/relay-circuits.md §Splicing).
pub const ALPN: &[u8] = b"awp-circuit/1";
/// Longest control line (request, reply, offer), in bytes without the `\n`.
pub const MAX_CONTROL_LINE: usize = 8 * 1024;
/// A request's `ts` may differ from the receiver's clock by at most this (ms).
pub const MAX_SKEW_MS: u64 = 5 * 60 * 1000;
/// How long the relay waits for the target's join after offering a circuit.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may take to send its first line (and a dialer to get its reply
/// beyond [`JOIN_TIMEOUT`]).
pub const LINE_TIMEOUT: Duration = Duration::from_secs(10);
/// The relay pings a standing connection this often.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// A standing connection silent this long (either side) is dead.
pub const STANDING_SILENCE: Duration = Duration::from_secs(75);
/// Copy buffer per direction while bytes flow where no kernel pipe can be had; none is
/// held while a direction is idle.
const SPLICE_BUF: usize = 64 * 1024;
/// Kernel pipe per direction while bytes flow (Linux, `splice(2)`): its capacity in bytes
/// (the system's default, 64 KiB, where this size is not allowed).
const PIPE_SIZE: usize = 1024 * 1024;
/// At most this many pipes of the process are enlarged to [`PIPE_SIZE`] at once; others
/// keep the system's default size. The kernel counts pipe buffers per user
/// (`/proc/sys/fs/pipe-user-pages-soft`, 64 MiB by default): past it, every new pipe of
/// that user, in any of its processes, gets one page. 16 enlarged pipes hold at most
/// 16 MiB, so a busy relay neither starves its user's other processes nor holds more
/// than that in the kernel for circuits whose target does not read.
const ENLARGED_PIPES: usize = 16;
/// A direction keeps its pipe this long after its last bytes (a new pipe costs four
/// system calls: `pipe2`, `F_SETPIPE_SZ` and two `close`); an idle circuit holds none.
const PIPE_KEEP: Duration = Duration::from_secs(1);
/// Offers waiting to be written to one standing connection.
const OFFER_QUEUE: usize = 64;
/// Longest circuit id and nonce, in characters.
const MAX_TOKEN: usize = 64;

/// A byte stream (TLS over TCP, or anything else in tests).
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
/// A boxed [`Io`].
pub type BoxIo = Box<dyn Io>;

/// TLS record header: type (1), version (2), length (2).
const RECORD_HEADER: usize = 5;

/// The transport under a circuit connection's outer TLS: TCP that, while `exact`, never
/// reads past the end of the TLS record in progress (a read returns at most the rest of
/// the 5-byte header, or of the record body it announced). So when the last control line
/// has been read nothing after it is buffered by TLS, and the connection can leave the
/// outer TLS ([`to_raw_client`], [`to_raw_server`]): what follows on the socket is the
/// spliced end-to-end stream. Writes pass through.
pub struct Records<T> {
    io: T,
    exact: bool,
    /// Reading a header (else a body).
    in_header: bool,
    /// Bytes left of the header or body in progress.
    left: usize,
    header: [u8; RECORD_HEADER],
}

impl<T> Records<T> {
    /// Wrap `io`, reading record by record.
    pub fn new(io: T) -> Records<T> {
        Records {
            io,
            exact: true,
            in_header: false,
            left: 0,
            header: [0; RECORD_HEADER],
        }
    }

    /// Stop reading record by record (a connection that stays TLS to its end).
    pub fn relax(&mut self) {
        self.exact = false;
    }

    /// Whether the reads so far ended exactly at a record boundary.
    fn at_boundary(&self) -> bool {
        !self.exact || self.left == 0 || (self.in_header && self.left == RECORD_HEADER)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Records<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let me = self.get_mut();
        if !me.exact {
            return std::pin::Pin::new(&mut me.io).poll_read(cx, buf);
        }
        if me.left == 0 {
            me.in_header = true;
            me.left = RECORD_HEADER;
        }
        let want = me.left.min(buf.remaining());
        let mut part = tokio::io::ReadBuf::new(&mut buf.initialize_unfilled()[..want]);
        std::task::ready!(std::pin::Pin::new(&mut me.io).poll_read(cx, &mut part))?;
        let n = part.filled().len();
        if me.in_header {
            let at = RECORD_HEADER - me.left;
            me.header[at..at + n].copy_from_slice(part.filled());
        }
        buf.advance(n);
        if n == 0 {
            return std::task::Poll::Ready(Ok(()));
        }
        me.left -= n;
        if me.in_header && me.left == 0 {
            me.in_header = false;
            me.left = u16::from_be_bytes([me.header[3], me.header[4]]) as usize;
        }
        std::task::Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Records<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A circuit connection to a relay, as its client: outer TLS over [`Records`].
pub type OuterClient = tokio_rustls::client::TlsStream<Records<TcpStream>>;
/// A circuit connection accepted by a relay: outer TLS over [`Records`].
pub type OuterServer = tokio_rustls::server::TlsStream<Records<TcpStream>>;

/// Leave the outer TLS after the last control line: the socket, provided TLS holds nothing
/// unread or unsent (no plaintext after the line, no partial record, nothing queued).
/// Anything else means the other side broke the protocol: `InvalidData`.
fn leave_tls(
    records: Records<TcpStream>,
    mut conn: rustls::Connection,
) -> std::io::Result<TcpStream> {
    let state = conn
        .process_new_packets()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if state.plaintext_bytes_to_read() > 0 || !records.at_boundary() || conn.wants_write() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bytes inside the outer TLS after the last control line",
        ));
    }
    Ok(records.io)
}

/// `leave_tls` for the dialing or joining end.
pub fn to_raw_client(s: OuterClient) -> std::io::Result<TcpStream> {
    let (records, conn) = s.into_inner();
    leave_tls(records, conn.into())
}

/// `leave_tls` for the relay's end.
pub fn to_raw_server(s: OuterServer) -> std::io::Result<TcpStream> {
    let (records, conn) = s.into_inner();
    leave_tls(records, conn.into())
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `circuit_listen`: keep this connection standing; offers arrive on it.
    Listen,
    /// `circuit_connect`: a circuit to the node `to`.
    Connect { to: PeerKey },
    /// `circuit_join`: the target's connection for offered circuit `circuit`.
    Join { circuit: String },
}

impl Kind {
    fn tag(&self) -> &'static str {
        match self {
            Kind::Listen => "circuit_listen",
            Kind::Connect { .. } => "circuit_connect",
            Kind::Join { .. } => "circuit_join",
        }
    }
}

/// A verified request line.
#[derive(Debug, Clone)]
pub struct Request {
    /// The signer (must equal the outer TLS certificate key at the relay).
    pub key: PeerKey,
    /// What it asks for.
    pub kind: Kind,
    /// The object as received (forwarded in offers so the target can check it).
    pub raw: Map<String, Value>,
}

/// Why a request (or an offer's embedded request) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not a JSON object of the expected shape (the reason).
    #[error("malformed request: {0}")]
    Malformed(String),
    /// `relay` names another relay.
    #[error("request is for another relay")]
    WrongRelay,
    /// `ts` is more than [`MAX_SKEW_MS`] away from our clock.
    #[error("request time is off by more than 5 minutes")]
    Clock,
    /// `sig` does not verify under `key`.
    #[error("bad signature")]
    BadSignature,
}

fn malformed(why: impl Into<String>) -> RequestError {
    RequestError::Malformed(why.into())
}

/// A circuit id or nonce: 1 to 64 characters of the base64url alphabet.
fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_TOKEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn random_token() -> String {
    let mut b = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    wire::b64::encode_url(&b)
}

/// The signed request line (with its `\n`) of `kind` for the relay `relay`, signed by
/// `tls`'s key: `{"t","key","relay","ts","nonce",("to"|"circuit"),"sig"}`, `sig` being
/// Ed25519 over the canonical JSON (RFC 8785) of the object without `sig`.
pub fn request_line(
    tls: &TlsConfig,
    relay: PeerKey,
    kind: &Kind,
    now_ms: u64,
) -> Result<Vec<u8>, NetError> {
    let mut obj = Map::new();
    obj.insert("t".into(), json!(kind.tag()));
    obj.insert("key".into(), json!(tls.key().to_string()));
    obj.insert("relay".into(), json!(relay.to_string()));
    obj.insert("ts".into(), json!(now_ms));
    obj.insert("nonce".into(), json!(random_token()));
    match kind {
        Kind::Listen => {}
        Kind::Connect { to } => {
            obj.insert("to".into(), json!(to.to_string()));
        }
        Kind::Join { circuit } => {
            obj.insert("circuit".into(), json!(circuit));
        }
    }
    let bytes = crate::canonical::signing_bytes(&obj)
        .map_err(|e| NetError::Tls(format!("signing a circuit request: {e}")))?;
    obj.insert(
        "sig".into(),
        json!(wire::b64::encode_url(&tls.sign(&bytes)?)),
    );
    let mut line = serde_json::to_vec(&Value::Object(obj))
        .map_err(|e| NetError::Tls(format!("encoding a circuit request: {e}")))?;
    line.push(b'\n');
    Ok(line)
}

/// Parse a control line as a strict JSON object (no duplicate keys, integers within
/// ±(2^53−1), at most [`MAX_CONTROL_LINE`] bytes).
fn parse_object(line: &[u8]) -> Result<Map<String, Value>, RequestError> {
    if line.len() > MAX_CONTROL_LINE {
        return Err(malformed("line too long"));
    }
    let text = std::str::from_utf8(line).map_err(|_| malformed("not UTF-8"))?;
    match wire::parse::parse_json_value(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(malformed("not a JSON object")),
        Err(e) => Err(malformed(e)),
    }
}

fn str_field<'a>(obj: &'a Map<String, Value>, k: &str) -> Result<&'a str, RequestError> {
    obj.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format!("`{k}` missing or not a string")))
}

fn key_field(obj: &Map<String, Value>, k: &str) -> Result<PeerKey, RequestError> {
    PeerKey::parse(str_field(obj, k)?).map_err(|e| malformed(format!("`{k}`: {e}")))
}

/// Check a request object: shape, `relay` = `relay`, `ts` within [`MAX_SKEW_MS`] of
/// `now_ms`, and the signature under `key` (strict Ed25519). Errors: [`RequestError`].
pub fn verify_request(
    obj: Map<String, Value>,
    relay: &PeerKey,
    now_ms: u64,
) -> Result<Request, RequestError> {
    let kind = match str_field(&obj, "t")? {
        "circuit_listen" => Kind::Listen,
        "circuit_connect" => Kind::Connect {
            to: key_field(&obj, "to")?,
        },
        "circuit_join" => {
            let c = str_field(&obj, "circuit")?;
            if !valid_token(c) {
                return Err(malformed("bad `circuit`"));
            }
            Kind::Join {
                circuit: c.to_string(),
            }
        }
        other => return Err(malformed(format!("unknown request {other:?}"))),
    };
    let key = key_field(&obj, "key")?;
    if key_field(&obj, "relay")? != *relay {
        return Err(RequestError::WrongRelay);
    }
    let ts = obj
        .get("ts")
        .and_then(Value::as_u64)
        .ok_or_else(|| malformed("`ts` missing or not a whole number"))?;
    if ts.abs_diff(now_ms) > MAX_SKEW_MS {
        return Err(RequestError::Clock);
    }
    if !valid_token(str_field(&obj, "nonce")?) {
        return Err(malformed("bad `nonce`"));
    }
    if !crate::canonical::verify_object(&key, &obj) {
        return Err(RequestError::BadSignature);
    }
    Ok(Request {
        key,
        kind,
        raw: obj,
    })
}

/// Parse and check one request line ([`verify_request`]).
pub fn parse_request(line: &[u8], relay: &PeerKey, now_ms: u64) -> Result<Request, RequestError> {
    verify_request(parse_object(line)?, relay, now_ms)
}

/// Read one `\n`-terminated line of at most [`MAX_CONTROL_LINE`] bytes, byte by byte so
/// that nothing after it is consumed (raw circuit bytes may follow). `Ok(None)` at EOF
/// before any byte.
pub async fn read_control_line<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let mut b = [0u8; 1];
        if r.read(&mut b).await? == 0 {
            if line.is_empty() {
                return Ok(None);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed inside a control line",
            ));
        }
        if b[0] == b'\n' {
            return Ok(Some(line));
        }
        if line.len() >= MAX_CONTROL_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "control line over 8 KiB",
            ));
        }
        line.push(b[0]);
    }
}

async fn write_line<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, v: &Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await
}

fn refused(what: String) -> NetError {
    std::io::Error::new(std::io::ErrorKind::ConnectionRefused, what).into()
}

fn timed_out(what: &str) -> NetError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{what}: timed out")).into()
}

/// Read the relay's reply: `circuit_ok` (returns it) or `circuit_err` (an error with its
/// code and detail). The relay is not trusted: the line is parsed strictly.
async fn read_reply<S: AsyncRead + Unpin>(
    outer: &mut S,
    within: Duration,
) -> Result<Map<String, Value>, NetError> {
    let line = tokio::time::timeout(within, read_control_line(outer))
        .await
        .map_err(|_| timed_out("waiting for the relay"))??
        .ok_or_else(|| refused("relay closed the circuit connection".into()))?;
    let obj = parse_object(&line).map_err(|e| refused(format!("relay: {e}")))?;
    match obj.get("t").and_then(Value::as_str) {
        Some("circuit_ok") | Some("circuit_ready") => Ok(obj),
        Some("circuit_err") => {
            let code = obj.get("code").and_then(Value::as_str).unwrap_or("?");
            let detail = obj.get("detail").and_then(Value::as_str).unwrap_or("");
            Err(refused(format!(
                "relay refused the circuit: {} {}",
                crate::blob::cut(code, 64),
                crate::blob::cut(detail, 256)
            )))
        }
        _ => Err(refused("relay sent an unexpected line".into())),
    }
}

/// An address the relay reports having seen (`observed` fields), if it is `IP:PORT`.
fn observed(obj: &Map<String, Value>, k: &str) -> Option<std::net::SocketAddr> {
    obj.get(k)?.as_str()?.parse().ok()
}

/// The outer connection: TLS 1.3 to the relay at `host:port`, pinned to `relay`, ALPN
/// [`ALPN`], read record by record ([`Records`]). Returns the stream, the relay's
/// `ip:port` and our local address of the TCP connection.
/// A TCP socket with SO_REUSEADDR and SO_REUSEPORT, bound to `local` (port 0: any), so
/// that the direct upgrade can dial and listen from the port the relay observed.
fn reuse_socket(local: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let s = if local.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    s.set_reuseport(true)?;
    s.bind(local)?;
    Ok(s)
}

/// Connect from a reusable port (see [`reuse_socket`]) within [`super::CONNECT_TIMEOUT`].
async fn connect_reusable(addrs: &[SocketAddr]) -> Result<tokio::net::TcpStream, NetError> {
    let mut last = None;
    for a in addrs {
        let any: SocketAddr = if a.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let sock = reuse_socket(any)?;
        match tokio::time::timeout(super::CONNECT_TIMEOUT, sock.connect(*a)).await {
            Ok(Ok(s)) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => return Err(timed_out("connecting to the relay")),
        }
    }
    // Fall back to an ordinary connect (e.g. where SO_REUSEPORT is refused).
    match last {
        Some(_) => connect_tcp(addrs).await,
        None => Err(std::io::Error::other("no addresses to connect to").into()),
    }
}

async fn dial_outer(
    host: &str,
    port: u16,
    relay: PeerKey,
    tls: &TlsConfig,
) -> Result<(OuterClient, String, SocketAddr), NetError> {
    let mut config = (*tls.client_config(Some(relay))?).clone();
    config.alpn_protocols = vec![ALPN.to_vec()];
    let addrs = resolve(host, port).await?;
    let tcp = connect_reusable(&addrs).await?;
    let remote = tcp.peer_addr()?.to_string();
    let local = tcp.local_addr()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::time::timeout(
        TLS_HANDSHAKE_TIMEOUT,
        connector.connect(super::tls::server_name(), Records::new(tcp)),
    )
    .await
    .map_err(|_| NetError::Tls(format!("handshake with relay {remote} timed out")))?
    .map_err(|e| {
        let refused = e
            .get_ref()
            .and_then(|i| i.downcast_ref::<rustls::Error>())
            .is_some_and(|r| {
                matches!(
                    r,
                    rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol)
                )
            });
        if refused {
            // The relay offers only `awp/0` (RFC 7301 §3.2: no shared protocol).
            NetError::Tls(format!(
                "{remote} does not serve circuits (it refused ALPN {}; a node serves them with [relay] serve_circuits = true, `awp relay` always does)",
                String::from_utf8_lossy(ALPN)
            ))
        } else {
            tls_failure(e)
        }
    })?;
    if stream.get_ref().1.alpn_protocol() != Some(ALPN) {
        return Err(NetError::Tls(format!(
            "{remote} is not a circuit relay (no ALPN {})",
            String::from_utf8_lossy(ALPN)
        )));
    }
    Ok((stream, remote, local))
}

/// What a circuit told us about the two ends' public addresses, as the relay saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Our own address as the relay saw it.
    pub me: Option<std::net::SocketAddr>,
    /// The other end's address as the relay saw it.
    pub peer: Option<std::net::SocketAddr>,
    /// Our local address of the circuit's TCP connection (the port the relay observed
    /// through any NAT).
    pub local: Option<std::net::SocketAddr>,
}

/// Run the end-to-end TLS 1.3 handshake inside a circuit, as the client, pinned to
/// `peer` (ALPN `awp/0`, exactly as a direct dial).
async fn inner_client<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    outer: S,
    tls: &TlsConfig,
    peer: PeerKey,
    remote: String,
) -> Result<Conn, NetError> {
    let connector = tokio_rustls::TlsConnector::from(tls.client_config(Some(peer))?);
    let stream = tokio::time::timeout(
        TLS_HANDSHAKE_TIMEOUT,
        connector.connect(super::tls::server_name(), outer),
    )
    .await
    .map_err(|_| NetError::Tls(format!("end-to-end handshake through {remote} timed out")))?
    .map_err(tls_failure)?;
    let key = tls_peer_key(stream.get_ref().1)?;
    if key != peer {
        return Err(NetError::Tls(format!(
            "certificate key {key} inside the circuit does not match {peer}"
        )));
    }
    Ok(into_conn(stream, Some(key), Transport::Tls, remote))
}

/// Dial a `relay:` address: connect to the relay, ask for a circuit to the peer, then run
/// the end-to-end TLS handshake inside it (pinned to the peer, so a relay that terminates
/// TLS itself fails here). [`Conn::remote`] reads `circuit via IP:PORT`.
///
/// Errors: those of a TLS dial to the relay; `ConnectionRefused` when the relay refuses
/// (`circuit_err`: not_here, forbidden, busy, timeout); `TimedOut`.
pub async fn dial(addr: &Address, tls: &TlsConfig) -> Result<Conn, NetError> {
    dial_observed(addr, tls).await.map(|(c, _)| c)
}

/// [`dial`], also returning the addresses the relay observed.
pub async fn dial_observed(addr: &Address, tls: &TlsConfig) -> Result<(Conn, Observed), NetError> {
    let Address::Relay {
        host,
        port,
        relay,
        peer,
    } = addr
    else {
        return Err(NetError::Address(super::AddressError::Malformed(
            addr.to_string(),
            "not a relay: address".into(),
        )));
    };
    let (mut outer, remote, local) = dial_outer(host, *port, *relay, tls).await?;
    let line = request_line(
        tls,
        *relay,
        &Kind::Connect { to: *peer },
        wire::time::now_ms(),
    )?;
    outer.write_all(&line).await?;
    outer.flush().await?;
    let ok = read_reply(&mut outer, JOIN_TIMEOUT + LINE_TIMEOUT).await?;
    let seen = Observed {
        me: observed(&ok, "observed"),
        peer: observed(&ok, "peer_observed"),
        local: Some(local),
    };
    // From here the socket carries the circuit: the end-to-end TLS runs on it directly.
    let raw = to_raw_client(outer)?;
    let conn = inner_client(raw, tls, *peer, format!("circuit via {remote}")).await?;
    remember_path(tls.key(), *peer, seen.clone());
    Ok((conn, seen))
}

/// A circuit offered to us over a standing connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The relay's circuit id.
    pub circuit: String,
    /// The dialer (signer of the embedded request; its TLS key inside must match).
    pub from: PeerKey,
    /// The dialer's address as the relay saw it.
    pub observed: Option<std::net::SocketAddr>,
}

/// Check an offer line from the relay `relay` to `me`: the embedded request must be a
/// `circuit_connect` to `me` through `relay`, signed by its `key`, within the clock window.
pub fn verify_offer(
    obj: &Map<String, Value>,
    me: &PeerKey,
    relay: &PeerKey,
    now_ms: u64,
) -> Result<Offer, RequestError> {
    let circuit = str_field(obj, "circuit")?;
    if !valid_token(circuit) {
        return Err(malformed("bad `circuit`"));
    }
    let Some(Value::Object(req)) = obj.get("req") else {
        return Err(malformed("`req` missing"));
    };
    let req = verify_request(req.clone(), relay, now_ms)?;
    match req.kind {
        Kind::Connect { to } if to == *me => {}
        _ => return Err(malformed("the request is not a circuit to us")),
    }
    Ok(Offer {
        circuit: circuit.to_string(),
        from: req.key,
        observed: observed(obj, "observed"),
    })
}

/// A standing connection to a relay (`circuit_listen`), receiving offers.
pub struct Standing {
    stream: BoxIo,
    me: PeerKey,
    relay: PeerKey,
    /// Our address as the relay saw it.
    pub observed: Option<std::net::SocketAddr>,
    /// The relay's `ip:port`.
    pub remote: String,
}

/// Open a standing connection to the relay at `relay_addr` (a pinned `tls:` address).
pub async fn listen(relay_addr: &Address, tls: &TlsConfig) -> Result<Standing, NetError> {
    let Address::Tls {
        host,
        port,
        pin: Some(relay),
    } = relay_addr
    else {
        return Err(NetError::Address(super::AddressError::Malformed(
            relay_addr.to_string(),
            "a relay is named by a pinned tls: address (tls:HOST:PORT#ed25519:KEY)".into(),
        )));
    };
    let (mut outer, remote, _) = dial_outer(host, *port, *relay, tls).await?;
    // The standing connection stays TLS to its end.
    outer.get_mut().0.relax();
    let line = request_line(tls, *relay, &Kind::Listen, wire::time::now_ms())?;
    outer.write_all(&line).await?;
    outer.flush().await?;
    let ready = read_reply(&mut outer, LINE_TIMEOUT).await?;
    Ok(Standing {
        stream: Box::new(outer),
        me: tls.key(),
        relay: *relay,
        observed: observed(&ready, "observed"),
        remote,
    })
}

impl Standing {
    /// The next valid offer. Pings are answered here; offers that fail
    /// [`verify_offer`] are logged and skipped. Errors: the connection ended, or was
    /// silent for [`STANDING_SILENCE`].
    pub async fn next_offer(&mut self) -> Result<Offer, NetError> {
        loop {
            let line = tokio::time::timeout(STANDING_SILENCE, read_control_line(&mut self.stream))
                .await
                .map_err(|_| timed_out("standing connection to the relay"))??
                .ok_or_else(|| {
                    NetError::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "relay closed the standing connection",
                    ))
                })?;
            let Ok(obj) = parse_object(&line) else {
                tracing::info!(relay = %self.relay, "relay sent a malformed line on the standing connection");
                continue;
            };
            match obj.get("t").and_then(Value::as_str) {
                Some("ping") => write_line(&mut self.stream, &json!({"t":"pong"})).await?,
                Some("circuit_offer") => {
                    match verify_offer(&obj, &self.me, &self.relay, wire::time::now_ms()) {
                        Ok(o) => return Ok(o),
                        Err(e) => {
                            tracing::info!(relay = %self.relay, "circuit offer refused: {e}")
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Accept an offered circuit: open a fresh connection to the relay, join the circuit, and
/// run the end-to-end TLS handshake inside it as the server. The client certificate key
/// must be the offer's signer: a relay that terminates TLS itself (or splices someone
/// else in) is refused here.
pub async fn join(
    relay_addr: &Address,
    tls: &TlsConfig,
    offer: &Offer,
) -> Result<(Conn, Observed), NetError> {
    let Address::Tls {
        host,
        port,
        pin: Some(relay),
    } = relay_addr
    else {
        return Err(NetError::Tls("relay address without its key".into()));
    };
    let (mut outer, remote, local) = dial_outer(host, *port, *relay, tls).await?;
    let line = request_line(
        tls,
        *relay,
        &Kind::Join {
            circuit: offer.circuit.clone(),
        },
        wire::time::now_ms(),
    )?;
    outer.write_all(&line).await?;
    outer.flush().await?;
    let ok = read_reply(&mut outer, LINE_TIMEOUT).await?;
    let seen = Observed {
        me: observed(&ok, "observed"),
        peer: observed(&ok, "peer_observed").or(offer.observed),
        local: Some(local),
    };
    let raw = to_raw_client(outer)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
    let stream = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(raw))
        .await
        .map_err(|_| NetError::Tls(format!("end-to-end handshake through {remote} timed out")))?
        .map_err(tls_failure)?;
    let key = tls_peer_key(stream.get_ref().1)?;
    if key != offer.from {
        return Err(NetError::Tls(format!(
            "certificate key {key} inside the circuit is not the requester {}",
            offer.from
        )));
    }
    remember_path(tls.key(), key, seen.clone());
    Ok((
        into_conn(
            stream,
            Some(key),
            Transport::Tls,
            format!("circuit via {remote}"),
        ),
        seen,
    ))
}

/// Recently established circuits' [`Observed`] addresses by (our key, peer key), for the
/// direct upgrade (the node takes them when the circuit's connection is up). Bounded.
static PATHS: Mutex<Option<HashMap<(PeerKey, PeerKey), Observed>>> = Mutex::new(None);
/// Entries kept at most in [`PATHS`].
const MAX_PATHS: usize = 4096;

fn remember_path(me: PeerKey, peer: PeerKey, seen: Observed) {
    let mut p = PATHS.lock().unwrap_or_else(|p| p.into_inner());
    let map = p.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_PATHS {
        map.clear();
    }
    map.insert((me, peer), seen);
}

/// The addresses observed by the last circuit between `me` and `peer` (taken: once).
pub fn take_path(me: &PeerKey, peer: &PeerKey) -> Option<Observed> {
    PATHS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&(*me, *peer)))
}

/// Connect attempts of a direct upgrade.
pub const PUNCH_ATTEMPTS: u32 = 8;
/// Pause between attempts that failed at once (a reset: the other side not yet dialing).
pub const PUNCH_PAUSE: Duration = Duration::from_millis(250);
/// One attempt's connect timeout (SYNs are retransmitted meanwhile).
pub const PUNCH_TIMEOUT: Duration = Duration::from_secs(3);

/// Hole punching (spec/relay-circuits.md §Direct upgrade): from our circuit's local port
/// `seen.local`, dial the peer's observed address `seen.peer` repeatedly and, at the same
/// time, accept on that port (so either a TCP simultaneous open or the other side's SYN
/// reaching us gives the connection). Only a connection from the peer's observed IP is
/// taken. `None` when no TCP connection formed within [`PUNCH_ATTEMPTS`].
pub async fn punch(seen: &Observed) -> Option<tokio::net::TcpStream> {
    let (local, peer) = (seen.local?, seen.peer?);
    if local.is_ipv4() != peer.is_ipv4() {
        return None;
    }
    let listener = match reuse_socket(local).and_then(|s| s.listen(4)) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::debug!(%local, "punch: no listener on the circuit's port: {e}");
            None
        }
    };
    let accept = async {
        match &listener {
            Some(l) => loop {
                match l.accept().await {
                    Ok((s, from)) if from.ip() == peer.ip() => return s,
                    Ok(_) => continue,
                    Err(_) => std::future::pending::<()>().await,
                }
            },
            None => std::future::pending().await,
        }
    };
    let dial = async {
        for _ in 0..PUNCH_ATTEMPTS {
            let started = Instant::now();
            match reuse_socket(local) {
                Ok(sock) => match tokio::time::timeout(PUNCH_TIMEOUT, sock.connect(peer)).await {
                    Ok(Ok(s)) => return Some(s),
                    Ok(Err(e)) => tracing::debug!(%local, %peer, "punch: {e}"),
                    Err(_) => tracing::debug!(%local, %peer, "punch: timed out"),
                },
                Err(e) => tracing::debug!(%local, "punch: binding the circuit's port: {e}"),
            }
            if started.elapsed() < PUNCH_PAUSE {
                tokio::time::sleep(PUNCH_PAUSE).await;
            }
        }
        None
    };
    let s = tokio::select! {
        s = accept => Some(s),
        s = dial => s,
    }?;
    let _ = s.set_nodelay(true);
    Some(s)
}

/// The end-to-end TLS handshake over a punched TCP connection: as the client (pinned to
/// `peer`) when we dialed the circuit, else as the server (the client key must be
/// `peer`). Roles follow the circuit's, so both ends agree without another message.
pub async fn direct(
    tcp: tokio::net::TcpStream,
    tls: &TlsConfig,
    peer: PeerKey,
    client: bool,
) -> Result<Conn, NetError> {
    let remote = tcp.peer_addr()?.to_string();
    if client {
        return inner_client(tcp, tls, peer, remote).await;
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
    let stream = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| NetError::Tls(format!("handshake with {remote} timed out")))?
        .map_err(tls_failure)?;
    let key = tls_peer_key(stream.get_ref().1)?;
    if key != peer {
        return Err(NetError::Tls(format!(
            "certificate key {key} on the direct connection is not {peer}"
        )));
    }
    Ok(into_conn(stream, Some(key), Transport::Tls, remote))
}

/// Who may use a relay's circuits and how much (config.toml `[relay]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Keys allowed to listen, dial and be dialed (both ends must be listed); empty: any.
    pub allow: Vec<String>,
    /// Circuits at most per key (counting either end, pending ones too). Default 16.
    pub max_circuits_per_key: usize,
    /// Circuits at most in total. Default 1024.
    pub max_circuits: usize,
    /// Bytes per second per circuit and direction; 0: unlimited. Default 0.
    pub circuit_rate: u64,
    /// A circuit that carried no byte for this many seconds is closed. Default 300.
    pub circuit_idle_secs: u64,
    /// Serve circuits on a node that is not an `awp relay` (its listener then also offers
    /// [`ALPN`]). Default false; `awp relay` serves circuits either way.
    pub serve_circuits: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allow: Vec::new(),
            max_circuits_per_key: 16,
            max_circuits: 1024,
            circuit_rate: 0,
            circuit_idle_secs: 300,
            serve_circuits: false,
        }
    }
}

impl Policy {
    /// The allowlist as keys. Errors: the first entry that is not a key.
    pub fn allowed_keys(&self) -> Result<Vec<PeerKey>, String> {
        self.allow
            .iter()
            .map(|k| PeerKey::parse(k).map_err(|e| format!("relay.allow {k:?}: {e}")))
            .collect()
    }
}

/// A token bucket limiting one direction of a circuit to `rate` bytes per second (burst:
/// a quarter second of rate, at least 64 KiB).
#[derive(Debug)]
pub struct Bucket {
    rate: u64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket; `rate` 0 means unlimited.
    pub fn new(rate: u64, now: Instant) -> Bucket {
        Bucket {
            rate,
            tokens: Self::burst(rate),
            at: now,
        }
    }

    fn burst(rate: u64) -> f64 {
        (rate as f64 / 4.0).max(64.0 * 1024.0)
    }

    /// Take `n` bytes at `now`; how long to wait before passing them on (None: at once).
    pub fn take(&mut self, n: usize, now: Instant) -> Option<Duration> {
        if self.rate == 0 {
            return None;
        }
        let rate = self.rate as f64;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * rate).min(Self::burst(self.rate)) - n as f64;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / rate))
    }
}

/// Counters of one live circuit.
#[derive(Debug)]
pub struct LiveCircuit {
    /// The relay's id.
    pub id: String,
    /// The dialer.
    pub from: PeerKey,
    /// The target.
    pub to: PeerKey,
    /// When it was spliced.
    pub since: Instant,
    /// Bytes dialer → target.
    pub up: AtomicU64,
    /// Bytes target → dialer.
    pub down: AtomicU64,
}

/// Copy one direction of a circuit, `r` to `w`, until EOF (then shut `w`'s write side
/// down) or an error.
///
/// On Linux the bytes go through a kernel pipe with `splice(2)`: socket to pipe, pipe to
/// socket, never copied into the relay's memory. The pipe (two descriptors, at most
/// [`PIPE_SIZE`] bytes of kernel buffer) is taken when bytes arrive and given back once
/// the direction was quiet for [`PIPE_KEEP`], so an idle circuit holds none. Where no
/// pipe can be had (another system, or out of descriptors) a copy buffer of
/// [`SPLICE_BUF`] bytes is used instead, held only while the reader has bytes.
///
/// With a `rate` (bytes per second, 0: unlimited) each chunk read is at most one burst of
/// the [`Bucket`] and waits its turn of the rate before it is written; `count` and `last`
/// (ms since `epoch`) are updated once a chunk is written.
async fn pump(
    r: &TcpStream,
    w: &TcpStream,
    count: &AtomicU64,
    rate: u64,
    last: &AtomicU64,
    epoch: Instant,
) -> std::io::Result<()> {
    let mut bucket = Bucket::new(rate, Instant::now());
    // A rate-limited direction reads at most one burst at a time, so one chunk never
    // runs far ahead of the rate.
    let limit = match rate {
        0 => usize::MAX,
        _ => Bucket::burst(rate) as usize,
    };
    let mut pipe: Option<pipe::Pipe> = None;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        match &pipe {
            Some(_) => {
                if tokio::time::timeout(PIPE_KEEP, r.readable()).await.is_err() {
                    pipe = None;
                    r.readable().await?;
                }
            }
            None => r.readable().await?,
        }
        if pipe.is_none() && buf.is_empty() {
            pipe = pipe::Pipe::new();
        }
        let read = match &mut pipe {
            Some(p) => r.try_io(tokio::io::Interest::READABLE, || p.fill(r, limit)),
            None => {
                if buf.is_empty() {
                    buf = vec![0u8; SPLICE_BUF.min(limit)];
                }
                r.try_read(&mut buf)
            }
        };
        let n = match read {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Drained: an idle direction holds no copy buffer.
                buf = Vec::new();
                continue;
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            let _ = rustix::net::shutdown(w, rustix::net::Shutdown::Write);
            return Ok(());
        }
        if let Some(wait) = bucket.take(n, Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let mut done = 0;
        while done < n {
            w.writable().await?;
            let wrote = match &mut pipe {
                Some(p) => w.try_io(tokio::io::Interest::WRITABLE, || p.drain(w, n - done)),
                None => w.try_write(&buf[done..n]),
            };
            match wrote {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(m) => done += m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// The kernel pipe of [`pump`] (Linux), or none elsewhere.
mod pipe {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub use linux::Pipe;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    mod linux {
        use rustix::fd::{AsFd, OwnedFd};
        use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};
        use std::sync::atomic::{AtomicUsize, Ordering};

        /// Pipes of this process enlarged now (at most [`super::super::ENLARGED_PIPES`]).
        static ENLARGED: AtomicUsize = AtomicUsize::new(0);

        /// A pipe and the bytes it holds.
        pub struct Pipe {
            read: OwnedFd,
            write: OwnedFd,
            /// Its capacity in bytes.
            size: usize,
            /// Counted in [`ENLARGED`] (given back on drop).
            enlarged: bool,
        }

        impl Pipe {
            /// A non-blocking pipe of [`super::super::PIPE_SIZE`] bytes while fewer than
            /// [`super::super::ENLARGED_PIPES`] are, else (or where that size is not
            /// allowed) of the system's default size; `None` when none can be made.
            pub fn new() -> Option<Pipe> {
                let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).ok()?;
                let slot = ENLARGED
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < super::super::ENLARGED_PIPES).then_some(n + 1)
                    })
                    .is_ok();
                let grown = if slot {
                    fcntl_setpipe_size(&write, super::super::PIPE_SIZE).ok()
                } else {
                    None
                };
                if slot && grown.is_none() {
                    ENLARGED.fetch_sub(1, Ordering::AcqRel);
                }
                let size = match grown {
                    Some(size) => size,
                    None => rustix::pipe::fcntl_getpipe_size(&write).ok()?,
                };
                Some(Pipe {
                    read,
                    write,
                    size,
                    enlarged: grown.is_some(),
                })
            }

            /// Its capacity in bytes.
            #[cfg(test)]
            pub fn size(&self) -> usize {
                self.size
            }

            /// Move at most `max` bytes from the socket `from` into the (empty) pipe.
            /// `WouldBlock` when the socket has none; 0 at its end.
            pub fn fill(&mut self, from: impl AsFd, max: usize) -> std::io::Result<usize> {
                let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
                Ok(splice(
                    from,
                    None,
                    &self.write,
                    None,
                    max.min(self.size),
                    flags,
                )?)
            }

            /// Move at most `max` of the bytes in the pipe to the socket `to`.
            /// `WouldBlock` when the socket takes none now.
            pub fn drain(&mut self, to: impl AsFd, max: usize) -> std::io::Result<usize> {
                let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
                Ok(splice(&self.read, None, to, None, max, flags)?)
            }
        }

        impl Drop for Pipe {
            /// Gives back its place among the enlarged pipes.
            fn drop(&mut self) {
                if self.enlarged {
                    ENLARGED.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// No pipe here: [`super::pump`] copies.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub enum Pipe {}

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    impl Pipe {
        pub fn new() -> Option<Pipe> {
            None
        }
        pub fn fill(&mut self, _: &tokio::net::TcpStream, _: usize) -> std::io::Result<usize> {
            match *self {}
        }
        pub fn drain(&mut self, _: &tokio::net::TcpStream, _: usize) -> std::io::Result<usize> {
            match *self {}
        }
    }
}

/// Copy bytes both ways between the sockets `a` (dialer) and `b` (target), which carry
/// the end-to-end TLS directly, until both directions end, one fails, nothing moved for
/// `idle`, or `stop` fires. Each direction is limited to `rate` bytes per second (0:
/// unlimited) and counted in `live`. The bytes are never parsed.
pub async fn splice(
    a: TcpStream,
    b: TcpStream,
    live: &LiveCircuit,
    rate: u64,
    idle: Duration,
    stop: &CancellationToken,
) {
    let epoch = Instant::now();
    let last = AtomicU64::new(0);
    let up = pump(&a, &b, &live.up, rate, &last, epoch);
    let down = pump(&b, &a, &live.down, rate, &last, epoch);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        let quiet = Duration::from_millis(
            (epoch.elapsed().as_millis() as u64).saturating_sub(last.load(Ordering::Relaxed)),
        );
        if quiet >= idle {
            tracing::info!(circuit = %live.id, "circuit idle: closing");
            return;
        }
        tokio::select! {
            r = &mut up, if !up_done => {
                up_done = true;
                if r.is_err() { return; }
            }
            r = &mut down, if !down_done => {
                down_done = true;
                if r.is_err() { return; }
            }
            _ = tokio::time::sleep(idle - quiet) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// A connection accepted by a relay, routed by its ALPN.
pub enum Routed {
    /// An ordinary AWP connection (`awp/0`, or not TLS).
    Awp(Conn),
    /// A circuit connection: the stream, its certificate key, its remote `ip:port`.
    Circuit(Box<OuterServer>, PeerKey, String),
}

struct Pending {
    target: PeerKey,
    join: oneshot::Sender<(OuterServer, String)>,
}

#[derive(Default)]
struct State {
    /// Standing connections by key: (registration id, where offers go, remote).
    listeners: HashMap<PeerKey, (u64, mpsc::Sender<Value>, String)>,
    pending: HashMap<String, Pending>,
    live: HashMap<String, Arc<LiveCircuit>>,
    /// Circuits (pending and live) per key, either end.
    per_key: HashMap<PeerKey, usize>,
    total: usize,
}

/// The relay side of circuits: routes accepted connections, keeps standing connections,
/// matches joins to pending circuits, enforces [`Policy`] and splices.
pub struct RelayCircuits {
    key: PeerKey,
    policy: Policy,
    allow: Vec<PeerKey>,
    server: Arc<rustls::ServerConfig>,
    state: Mutex<State>,
    next_id: AtomicU64,
    opened: AtomicU64,
    refused: AtomicU64,
    bytes: AtomicU64,
}

/// Bytes of a ClientHello looked at when routing: one full record and its header.
const HELLO_PEEK: usize = 16 * 1024 + RECORD_HEADER;
/// Looks at a ClientHello that has not fully arrived, 10 ms apart, at most this often.
const HELLO_PEEK_TRIES: u32 = 100;

/// How an accepted TLS socket is handled, from its ClientHello's ALPN offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `awp/0` offered (the server prefers it): the unbuffered TLS stream
    /// ([`super::tls_stream`]), which holds no buffer while idle (issue 10: relay memory
    /// per connection).
    Awp,
    /// Only the circuit [`ALPN`], or a hello that did not arrive or parse in time: TLS
    /// over record-exact reads ([`Records`]), so that a circuit connection can leave TLS
    /// later; the negotiated ALPN then decides, as it did before routing by the hello.
    Records,
}

/// The route of the ClientHello waiting on `s` (peeked, not consumed; see [`Route`]).
async fn route_by_hello(s: &TcpStream) -> Route {
    let mut buf = vec![0u8; HELLO_PEEK];
    for _ in 0..HELLO_PEEK_TRIES {
        let n = match s.peek(&mut buf).await {
            Ok(n) if n > 0 => n,
            _ => return Route::Records,
        };
        let mut acceptor = rustls::server::Acceptor::default();
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            match acceptor.read_tls(&mut rest) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let offers_awp = accepted
                    .client_hello()
                    .alpn()
                    .is_some_and(|mut a| a.any(|p| p == super::tls::ALPN));
                return if offers_awp {
                    Route::Awp
                } else {
                    Route::Records
                };
            }
            Ok(None) if n < buf.len() => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => return Route::Records,
        }
    }
    Route::Records
}

/// Releases a circuit's slots when dropped.
struct Slot<'a> {
    relay: &'a RelayCircuits,
    keys: [PeerKey; 2],
    id: String,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut st = self.relay.lock();
        for k in self.keys {
            if let Some(n) = st.per_key.get_mut(&k) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.per_key.remove(&k);
                }
            }
        }
        st.total = st.total.saturating_sub(1);
        st.pending.remove(&self.id);
        if let Some(live) = st.live.remove(&self.id) {
            self.relay.bytes.fetch_add(
                live.up.load(Ordering::Relaxed) + live.down.load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
    }
}

impl RelayCircuits {
    /// A relay for `tls`'s key under `policy`. Errors: an allowlist entry that is not a key.
    pub fn new(tls: &TlsConfig, policy: Policy) -> Result<Arc<RelayCircuits>, String> {
        let allow = policy.allowed_keys()?;
        let mut server = (*tls.server_config()).clone();
        server.alpn_protocols = vec![super::tls::ALPN.to_vec(), ALPN.to_vec()];
        Ok(Arc::new(RelayCircuits {
            key: tls.key(),
            policy,
            allow,
            server: Arc::new(server),
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            opened: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn allowed(&self, k: &PeerKey) -> bool {
        self.allow.is_empty() || self.allow.contains(k)
    }

    /// Finish the transport handshake of an accepted socket offering both `awp/0` and
    /// [`ALPN`], and route it. Errors as [`Incoming::handshake`].
    pub async fn accept(&self, inc: Incoming) -> Result<Routed, NetError> {
        let Incoming {
            stream,
            remote,
            source,
            acceptor,
        } = inc;
        let s = match (stream, acceptor) {
            (super::Stream::Tcp(s), Some(_)) => s,
            (stream, acceptor) => {
                return Incoming {
                    stream,
                    remote,
                    source,
                    acceptor,
                }
                .handshake()
                .await
                .map(Routed::Awp)
            }
        };
        if route_by_hello(&s).await == Route::Awp {
            // Not a circuit: the unbuffered TLS stream, which holds no buffer while idle.
            return Incoming {
                stream: super::Stream::Tcp(s),
                remote,
                source,
                acceptor: Some(self.server.clone()),
            }
            .handshake()
            .await
            .map(Routed::Awp);
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server.clone());
        let mut stream =
            tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(Records::new(s)))
                .await
                .map_err(|_| NetError::Tls(format!("handshake with {remote} timed out")))?
                .map_err(tls_failure)?;
        let state = stream.get_ref().1;
        if state.alpn_protocol() == Some(ALPN) {
            let cert = state
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or_else(|| NetError::Tls("peer presented no certificate".into()))?;
            let key = super::tls::certificate_key(cert.as_ref())
                .map_err(|e| NetError::Tls(e.to_string()))?;
            return Ok(Routed::Circuit(Box::new(stream), key, remote));
        }
        let key = tls_peer_key(state)?;
        // An ordinary connection stays TLS to its end: read as much as TLS asks for.
        stream.get_mut().0.relax();
        Ok(Routed::Awp(into_conn(
            stream,
            Some(key),
            Transport::Tls,
            remote,
        )))
    }

    /// Serve one circuit connection (from [`RelayCircuits::accept`]) to its end.
    pub async fn serve(
        &self,
        stream: Box<OuterServer>,
        key: PeerKey,
        remote: String,
        stop: CancellationToken,
    ) {
        let mut stream = *stream;
        let line = match tokio::time::timeout(LINE_TIMEOUT, read_control_line(&mut stream)).await {
            Ok(Ok(Some(l))) => l,
            _ => return,
        };
        let req = match parse_request(&line, &self.key, wire::time::now_ms()) {
            Ok(r) if r.key == key => r,
            Ok(_) => {
                self.refuse(
                    &mut stream,
                    "auth",
                    "request key is not the certificate key",
                )
                .await;
                return;
            }
            Err(e) => {
                tracing::info!(%remote, peer = %key, "circuit request refused: {e}");
                self.refuse(&mut stream, "bad_request", &e.to_string())
                    .await;
                return;
            }
        };
        if !self.allowed(&key) {
            self.refuse(&mut stream, "forbidden", "key not allowed on this relay")
                .await;
            return;
        }
        match req.kind.clone() {
            Kind::Listen => self.standing(stream, key, remote, stop).await,
            Kind::Connect { to } => self.connect(stream, req, to, remote, stop).await,
            Kind::Join { circuit } => {
                let pending = {
                    let mut st = self.lock();
                    match st.pending.get(&circuit) {
                        Some(p) if p.target == key => st.pending.remove(&circuit),
                        _ => None,
                    }
                };
                match pending {
                    Some(p) => {
                        let _ = p.join.send((stream, remote));
                    }
                    None => {
                        self.refuse(&mut stream, "not_here", "no such circuit")
                            .await
                    }
                }
            }
        }
    }

    async fn refuse<S: AsyncWrite + Unpin>(&self, stream: &mut S, code: &str, detail: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let _ = write_line(
            stream,
            &json!({"t":"circuit_err","code":code,"detail":detail}),
        )
        .await;
        let _ = stream.shutdown().await;
    }

    async fn standing(
        &self,
        mut stream: OuterServer,
        key: PeerKey,
        remote: String,
        stop: CancellationToken,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::channel::<Value>(OFFER_QUEUE);
        // A new standing connection of the same key replaces the old one (its sender is
        // dropped, so the old task ends).
        self.lock().listeners.insert(key, (id, tx, remote.clone()));
        stream.get_mut().0.relax();
        tracing::info!(peer = %key, %remote, "circuit listener up");
        if write_line(&mut stream, &json!({"t":"circuit_ready","observed":remote}))
            .await
            .is_ok()
        {
            let (mut r, mut w) = tokio::io::split(stream);
            let mut ping = tokio::time::interval(PING_INTERVAL);
            let epoch = tokio::time::Instant::now();
            let heard = AtomicU64::new(0);
            let reader = async {
                // Only pongs are expected; anything else is read and dropped.
                loop {
                    match read_control_line(&mut r).await {
                        Ok(Some(_)) => {
                            heard.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed)
                        }
                        _ => return,
                    }
                }
            };
            tokio::pin!(reader);
            loop {
                tokio::select! {
                    _ = &mut reader => break,
                    o = rx.recv() => match o {
                        Some(offer) => if write_line(&mut w, &offer).await.is_err() { break },
                        None => break,
                    },
                    _ = ping.tick() => {
                        if write_line(&mut w, &json!({"t":"ping"})).await.is_err() { break }
                    }
                    _ = tokio::time::sleep_until(
                        epoch + Duration::from_millis(heard.load(Ordering::Relaxed)) + STANDING_SILENCE
                    ) => {
                        if epoch.elapsed() >= Duration::from_millis(heard.load(Ordering::Relaxed)) + STANDING_SILENCE {
                            break;
                        }
                    }
                    _ = stop.cancelled() => break,
                }
            }
        }
        let mut st = self.lock();
        if st.listeners.get(&key).is_some_and(|l| l.0 == id) {
            st.listeners.remove(&key);
        }
        tracing::info!(peer = %key, "circuit listener down");
    }

    async fn connect(
        &self,
        mut stream: OuterServer,
        req: Request,
        to: PeerKey,
        remote: String,
        stop: CancellationToken,
    ) {
        let from = req.key;
        if to == from {
            self.refuse(&mut stream, "bad_request", "a circuit to oneself")
                .await;
            return;
        }
        if !self.allowed(&to) {
            self.refuse(&mut stream, "forbidden", "target not allowed on this relay")
                .await;
            return;
        }
        let circuit = random_token();
        let (join_tx, join_rx) = oneshot::channel();
        let reserved = {
            let mut st = self.lock();
            let per_key = |st: &State, k: &PeerKey| st.per_key.get(k).copied().unwrap_or(0);
            match st.listeners.get(&to).map(|l| l.1.clone()) {
                None => Err(("not_here", "the target has no standing connection here")),
                Some(_)
                    if st.total >= self.policy.max_circuits
                        || per_key(&st, &from) >= self.policy.max_circuits_per_key
                        || per_key(&st, &to) >= self.policy.max_circuits_per_key =>
                {
                    Err(("busy", "circuit limit reached"))
                }
                Some(offers) => {
                    *st.per_key.entry(from).or_default() += 1;
                    *st.per_key.entry(to).or_default() += 1;
                    st.total += 1;
                    st.pending.insert(
                        circuit.clone(),
                        Pending {
                            target: to,
                            join: join_tx,
                        },
                    );
                    Ok(offers)
                }
            }
        };
        let offers = match reserved {
            Ok(o) => o,
            Err((code, detail)) => {
                self.refuse(&mut stream, code, detail).await;
                return;
            }
        };
        let _slot = Slot {
            relay: self,
            keys: [from, to],
            id: circuit.clone(),
        };
        let offer = json!({
            "t": "circuit_offer",
            "circuit": circuit,
            "req": Value::Object(req.raw),
            "observed": remote,
        });
        if offers.try_send(offer).is_err() {
            self.refuse(&mut stream, "busy", "the target's offer queue is full")
                .await;
            return;
        }
        let (mut target, target_remote) = match tokio::time::timeout(JOIN_TIMEOUT, join_rx).await {
            Ok(Ok(j)) => j,
            _ => {
                self.refuse(&mut stream, "timeout", "the target did not join")
                    .await;
                return;
            }
        };
        let ok_dialer = json!({"t":"circuit_ok","circuit":circuit,"observed":remote,"peer_observed":target_remote});
        let ok_target = json!({"t":"circuit_ok","circuit":circuit,"observed":target_remote,"peer_observed":remote});
        if write_line(&mut stream, &ok_dialer).await.is_err()
            || write_line(&mut target, &ok_target).await.is_err()
        {
            return;
        }
        // Both ends now leave the outer TLS: the relay copies the end-to-end TLS as it is.
        let (a, b) = match (to_raw_server(stream), to_raw_server(target)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::info!(%circuit, "circuit refused: {e}");
                self.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let live = Arc::new(LiveCircuit {
            id: circuit.clone(),
            from,
            to,
            since: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        });
        self.lock().live.insert(circuit.clone(), live.clone());
        self.opened.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%circuit, %from, %to, "circuit spliced");
        splice(
            a,
            b,
            &live,
            self.policy.circuit_rate,
            Duration::from_secs(self.policy.circuit_idle_secs.max(1)),
            &stop,
        )
        .await;
        tracing::info!(
            %circuit,
            up = live.up.load(Ordering::Relaxed),
            down = live.down.load(Ordering::Relaxed),
            "circuit closed"
        );
    }

    /// For `awp relay status`: `{listeners, circuits: [{id, from, to, age_secs, up,
    /// down}], opened, refused, bytes}` (bytes: of closed and live circuits).
    pub fn status(&self) -> Value {
        let st = self.lock();
        let mut live_bytes = 0;
        let circuits: Vec<Value> = st
            .live
            .values()
            .map(|c| {
                let (up, down) = (c.up.load(Ordering::Relaxed), c.down.load(Ordering::Relaxed));
                live_bytes += up + down;
                json!({
                    "id": c.id,
                    "from": c.from.to_string(),
                    "to": c.to.to_string(),
                    "age_secs": c.since.elapsed().as_secs(),
                    "up": up,
                    "down": down,
                })
            })
            .collect();
        json!({
            "listeners": st.listeners.len(),
            "pending": st.pending.len(),
            "circuits": circuits,
            "opened": self.opened.load(Ordering::Relaxed),
            "refused": self.refused.load(Ordering::Relaxed),
            "bytes": self.bytes.load(Ordering::Relaxed) + live_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn tls(seed: u8) -> TlsConfig {
        TlsConfig::new(&Identity::from_seed(&[seed; 32])).unwrap()
    }

    const NOW: u64 = 1_800_000_000_000;

    /// However many circuits move bytes at once, at most [`ENLARGED_PIPES`] pipes of the
    /// process are enlarged; the rest keep the system's default size (still usable).
    #[cfg(target_os = "linux")]
    #[test]
    fn only_a_bounded_number_of_pipes_are_enlarged() {
        let held: Vec<pipe::Pipe> = (0..ENLARGED_PIPES + 4)
            .map(|_| pipe::Pipe::new().expect("a pipe"))
            .collect();
        let big = held.iter().filter(|p| p.size() == PIPE_SIZE).count();
        assert!(big <= ENLARGED_PIPES, "{big} enlarged");
        assert!(
            held.iter().filter(|p| p.size() < PIPE_SIZE).count() >= 4,
            "pipes past the bound keep the default size"
        );
        assert!(held.iter().all(|p| p.size() > 0));
    }

    type Edit = Box<dyn Fn(&mut Map<String, Value>)>;

    /// A signed request object from `who` to relay `relay`, with `edit` applied before
    /// signing.
    fn signed(
        who: &TlsConfig,
        relay: PeerKey,
        kind: &Kind,
        edit: impl FnOnce(&mut Map<String, Value>),
    ) -> Vec<u8> {
        let line = request_line(who, relay, kind, NOW).unwrap();
        let mut obj = parse_object(&line[..line.len() - 1]).unwrap();
        obj.remove("sig");
        edit(&mut obj);
        let bytes = crate::canonical::signing_bytes(&obj).unwrap();
        obj.insert(
            "sig".into(),
            json!(wire::b64::encode_url(&who.sign(&bytes).unwrap())),
        );
        serde_json::to_vec(&Value::Object(obj)).unwrap()
    }

    #[test]
    fn a_request_line_round_trips() {
        let (a, r, b) = (tls(1), tls(2), tls(3));
        for kind in [
            Kind::Listen,
            Kind::Connect { to: b.key() },
            Kind::Join {
                circuit: "abc_-1".into(),
            },
        ] {
            let line = request_line(&a, r.key(), &kind, NOW).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            let req = parse_request(&line[..line.len() - 1], &r.key(), NOW + 1000).unwrap();
            assert_eq!(req.key, a.key());
            assert_eq!(req.kind, kind);
        }
    }

    #[test]
    fn each_bad_request_is_refused() {
        let (a, r, b) = (tls(1), tls(2), tls(3));
        let relay = r.key();
        let connect = Kind::Connect { to: b.key() };
        let m = |s: &str| {
            matches!(
                parse_request(s.as_bytes(), &relay, NOW),
                Err(RequestError::Malformed(_))
            )
        };
        // Not JSON, not an object, not UTF-8, too long, duplicate keys.
        assert!(m("not json"));
        assert!(m("[1]"));
        assert!(matches!(
            parse_request(b"{\"t\":\"\xff\"}", &relay, NOW),
            Err(RequestError::Malformed(_))
        ));
        let long = format!("{{\"t\":\"{}\"}}", "x".repeat(MAX_CONTROL_LINE));
        assert!(m(&long));
        assert!(m(r#"{"t":"circuit_listen","t":"circuit_listen"}"#));
        // Unknown type, missing fields, wrong types.
        let cases: Vec<(&str, Edit)> = vec![
            (
                "unknown t",
                Box::new(|o| {
                    o.insert("t".into(), json!("circuit_teleport"));
                }),
            ),
            (
                "no key",
                Box::new(|o| {
                    o.remove("key");
                }),
            ),
            (
                "bad key",
                Box::new(|o| {
                    o.insert("key".into(), json!("ed25519:AAAA"));
                }),
            ),
            (
                "no relay",
                Box::new(|o| {
                    o.remove("relay");
                }),
            ),
            (
                "no ts",
                Box::new(|o| {
                    o.remove("ts");
                }),
            ),
            (
                "string ts",
                Box::new(|o| {
                    o.insert("ts".into(), json!("1"));
                }),
            ),
            (
                "negative ts",
                Box::new(|o| {
                    o.insert("ts".into(), json!(-1));
                }),
            ),
            (
                "no nonce",
                Box::new(|o| {
                    o.remove("nonce");
                }),
            ),
            (
                "bad nonce",
                Box::new(|o| {
                    o.insert("nonce".into(), json!("a b"));
                }),
            ),
            (
                "long nonce",
                Box::new(|o| {
                    o.insert("nonce".into(), json!("a".repeat(65)));
                }),
            ),
            (
                "no to",
                Box::new(|o| {
                    o.remove("to");
                }),
            ),
            (
                "bad to",
                Box::new(|o| {
                    o.insert("to".into(), json!(7));
                }),
            ),
        ];
        for (what, edit) in cases {
            let line = signed(&a, relay, &connect, edit);
            assert!(
                matches!(
                    parse_request(&line, &relay, NOW),
                    Err(RequestError::Malformed(_))
                ),
                "{what}"
            );
        }
        let join = Kind::Join {
            circuit: "c".into(),
        };
        for bad in [json!(""), json!("a/b"), json!("a".repeat(65)), json!(1)] {
            let line = signed(&a, relay, &join, |o| {
                o.insert("circuit".into(), bad.clone());
            });
            assert!(
                matches!(
                    parse_request(&line, &relay, NOW),
                    Err(RequestError::Malformed(_))
                ),
                "{bad}"
            );
        }
        // Another relay.
        let line = request_line(&a, b.key(), &connect, NOW).unwrap();
        assert_eq!(
            parse_request(&line[..line.len() - 1], &relay, NOW).unwrap_err(),
            RequestError::WrongRelay
        );
        // Clock: 5 minutes either way is fine, beyond is not.
        let line = request_line(&a, relay, &connect, NOW).unwrap();
        let line = &line[..line.len() - 1];
        assert!(parse_request(line, &relay, NOW + MAX_SKEW_MS).is_ok());
        assert!(parse_request(line, &relay, NOW - MAX_SKEW_MS).is_ok());
        assert_eq!(
            parse_request(line, &relay, NOW + MAX_SKEW_MS + 1).unwrap_err(),
            RequestError::Clock
        );
        assert_eq!(
            parse_request(line, &relay, NOW - MAX_SKEW_MS - 1).unwrap_err(),
            RequestError::Clock
        );
        // Signature: altered after signing, signed by another key, or missing.
        let mut obj = parse_object(line).unwrap();
        obj.insert("to".into(), json!(a.key().to_string()));
        assert_eq!(
            verify_request(obj, &relay, NOW).unwrap_err(),
            RequestError::BadSignature
        );
        let forged = signed(&b, relay, &connect, |o| {
            o.insert("key".into(), json!(a.key().to_string()));
        });
        assert_eq!(
            parse_request(&forged, &relay, NOW).unwrap_err(),
            RequestError::BadSignature
        );
        let mut obj = parse_object(line).unwrap();
        obj.remove("sig");
        assert_eq!(
            verify_request(obj, &relay, NOW).unwrap_err(),
            RequestError::BadSignature
        );
    }

    #[test]
    fn an_offer_must_carry_a_request_to_us_through_this_relay() {
        let (a, r, b, c) = (tls(1), tls(2), tls(3), tls(4));
        let req = |to: PeerKey, relay: PeerKey| {
            let l = request_line(&a, relay, &Kind::Connect { to }, NOW).unwrap();
            parse_object(&l[..l.len() - 1]).unwrap()
        };
        let offer = |circuit: Value, req: Value| match json!({"t":"circuit_offer","circuit":circuit,"req":req,"observed":"192.0.2.1:4000"})
        {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let ok = verify_offer(
            &offer(json!("c1"), Value::Object(req(b.key(), r.key()))),
            &b.key(),
            &r.key(),
            NOW,
        )
        .unwrap();
        assert_eq!(ok.from, a.key());
        assert_eq!(ok.circuit, "c1");
        assert_eq!(ok.observed, Some("192.0.2.1:4000".parse().unwrap()));
        // A request for someone else, through another relay, of another kind, none, bad id.
        assert!(verify_offer(
            &offer(json!("c1"), Value::Object(req(c.key(), r.key()))),
            &b.key(),
            &r.key(),
            NOW
        )
        .is_err());
        assert_eq!(
            verify_offer(
                &offer(json!("c1"), Value::Object(req(b.key(), c.key()))),
                &b.key(),
                &r.key(),
                NOW
            )
            .unwrap_err(),
            RequestError::WrongRelay
        );
        let l = request_line(&a, r.key(), &Kind::Listen, NOW).unwrap();
        let listen = parse_object(&l[..l.len() - 1]).unwrap();
        assert!(verify_offer(
            &offer(json!("c1"), Value::Object(listen)),
            &b.key(),
            &r.key(),
            NOW
        )
        .is_err());
        assert!(verify_offer(&offer(json!("c1"), json!(null)), &b.key(), &r.key(), NOW).is_err());
        assert!(verify_offer(
            &offer(json!("c/1"), Value::Object(req(b.key(), r.key()))),
            &b.key(),
            &r.key(),
            NOW
        )
        .is_err());
    }

    #[tokio::test]
    async fn control_lines_are_capped_and_leave_what_follows_unread() {
        let mut input: &[u8] = b"{\"t\":\"x\"}\nRAW";
        assert_eq!(
            read_control_line(&mut input).await.unwrap().unwrap(),
            b"{\"t\":\"x\"}"
        );
        assert_eq!(input, b"RAW");
        let long = vec![b'a'; MAX_CONTROL_LINE + 1];
        let mut r: &[u8] = &long;
        assert_eq!(
            read_control_line(&mut r).await.unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        let mut r: &[u8] = b"";
        assert!(read_control_line(&mut r).await.unwrap().is_none());
        let mut r: &[u8] = b"partial";
        assert!(read_control_line(&mut r).await.is_err());
    }

    /// A script of chunks, each returned whole if the caller's buffer allows.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Chunks {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            out: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if let Some(mut c) = self.0.pop_front() {
                let n = c.len().min(out.remaining());
                out.put_slice(&c[..n]);
                if n < c.len() {
                    self.0.push_front(c.split_off(n));
                }
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn records_never_read_past_the_record_in_progress() {
        // Two records (bodies of 3 and 2 bytes) and raw bytes, all in one chunk.
        let mut bytes = vec![23, 3, 3, 0, 3, b'a', b'b', b'c', 23, 3, 3, 0, 2, b'd', b'e'];
        bytes.extend_from_slice(b"RAW");
        let mut r = Records::new(Chunks(vec![bytes].into()));
        let mut buf = [0u8; 64];
        let mut reads = Vec::new();
        for _ in 0..4 {
            let n = r.read(&mut buf).await.unwrap();
            reads.push(buf[..n].to_vec());
        }
        assert_eq!(
            reads,
            [
                vec![23, 3, 3, 0, 3],
                b"abc".to_vec(),
                vec![23, 3, 3, 0, 2],
                b"de".to_vec()
            ]
        );
        assert!(r.at_boundary());
        // A header split across reads still counts.
        let mut r = Records::new(Chunks(vec![vec![23, 3], vec![3, 0, 1, b'x', b'y']].into()));
        assert_eq!(r.read(&mut buf).await.unwrap(), 2);
        assert!(!r.at_boundary());
        assert_eq!(r.read(&mut buf).await.unwrap(), 3);
        assert_eq!(r.read(&mut buf).await.unwrap(), 1);
        assert!(r.at_boundary());
        // Relaxed: reads take what is there.
        let mut r = Records::new(Chunks(vec![vec![23, 3, 3, 0, 1, b'x', b'y']].into()));
        r.relax();
        assert_eq!(r.read(&mut buf).await.unwrap(), 7);
    }

    /// Where a relay routes a client offering `alpn`, the ClientHello arriving in
    /// pieces of `piece` bytes (0: at once).
    async fn routed(alpn: Vec<Vec<u8>>, piece: usize) -> Route {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let mut cc = (*tls(1).client_config(None).unwrap()).clone();
        cc.alpn_protocols = alpn;
        let mut conn =
            rustls::ClientConnection::new(Arc::new(cc), super::super::tls::server_name()).unwrap();
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).unwrap();
        let client = tokio::spawn(async move {
            let mut tcp = TcpStream::connect(at).await.unwrap();
            for part in hello.chunks(if piece == 0 { hello.len() } else { piece }) {
                tcp.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            tcp
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let routed = tokio::time::timeout(GUARD, route_by_hello(&tcp))
            .await
            .unwrap();
        // Nothing was consumed: the whole hello is still there to peek.
        let mut b = [0u8; 1];
        assert_eq!(tcp.peek(&mut b).await.unwrap(), 1);
        assert_eq!(b[0], 0x16, "a handshake record still starts the stream");
        drop(client.await.unwrap());
        routed
    }

    #[tokio::test]
    async fn a_relay_routes_by_the_alpn_offered_in_the_client_hello() {
        let awp = super::super::tls::ALPN.to_vec();
        assert_eq!(routed(vec![ALPN.to_vec()], 0).await, Route::Records);
        assert_eq!(routed(vec![awp.clone()], 0).await, Route::Awp);
        // Both offered: the server prefers awp/0.
        assert_eq!(
            routed(vec![ALPN.to_vec(), awp.clone()], 0).await,
            Route::Awp
        );
        // No ALPN: the handshake decides (and refuses) as before.
        assert_eq!(routed(vec![], 0).await, Route::Records);
        // A hello arriving in pieces is waited for.
        assert_eq!(routed(vec![awp], 100).await, Route::Awp);
    }

    #[tokio::test]
    async fn a_relay_routes_a_hello_that_is_not_tls_to_the_record_exact_handshake() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut tcp = TcpStream::connect(at).await.unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            tcp
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let _client = client.await.unwrap();
        let routed = tokio::time::timeout(GUARD, route_by_hello(&tcp))
            .await
            .unwrap();
        assert_eq!(routed, Route::Records);
    }

    /// A TLS pair over loopback TCP as a circuit connection: (client, relay side).
    async fn outer_pair() -> (OuterClient, OuterServer) {
        let (client, relay) = (tls(1), tls(2));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let mut sc = (*relay.server_config()).clone();
        sc.alpn_protocols = vec![ALPN.to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(sc));
        let accept = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            acceptor.accept(Records::new(tcp)).await.unwrap()
        });
        let mut cc = (*client.client_config(Some(relay.key())).unwrap()).clone();
        cc.alpn_protocols = vec![ALPN.to_vec()];
        let tcp = TcpStream::connect(at).await.unwrap();
        let c = tokio_rustls::TlsConnector::from(Arc::new(cc))
            .connect(super::super::tls::server_name(), Records::new(tcp))
            .await
            .unwrap();
        (c, accept.await.unwrap())
    }

    #[tokio::test]
    async fn leaving_tls_after_the_last_line_hands_over_the_raw_bytes() {
        let (mut c, mut s) = outer_pair().await;
        // The relay's last line, then at once raw bytes on the socket: the client's TLS
        // must not swallow them with the line's record.
        write_line(&mut s, &json!({"t":"circuit_ok"}))
            .await
            .unwrap();
        let mut raw = to_raw_server(s).unwrap();
        raw.write_all(b"RAW").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            read_control_line(&mut c).await.unwrap().unwrap(),
            br#"{"t":"circuit_ok"}"#
        );
        let mut raw_c = to_raw_client(c).unwrap();
        let mut got = [0u8; 3];
        raw_c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"RAW");
    }

    #[tokio::test]
    async fn leaving_tls_is_refused_with_plaintext_after_the_last_line() {
        let (mut c, mut s) = outer_pair().await;
        // The line and more bytes in one record: what follows the line is still inside TLS.
        s.write_all(b"{\"t\":\"circuit_ok\"}\nsmuggled")
            .await
            .unwrap();
        s.flush().await.unwrap();
        read_control_line(&mut c).await.unwrap().unwrap();
        assert_eq!(
            to_raw_client(c).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn the_bucket_holds_a_circuit_to_its_rate() {
        let t0 = Instant::now();
        let mut unlimited = Bucket::new(0, t0);
        assert_eq!(unlimited.take(usize::MAX / 2, t0), None);
        // 1 MiB/s: the 256 KiB burst passes at once, then each 16 KiB waits 1/64 s.
        let rate = 1024 * 1024;
        let mut b = Bucket::new(rate, t0);
        let mut waited = Duration::ZERO;
        let mut sent = 0u64;
        let chunk = 16 * 1024;
        while sent < 4 * rate {
            if let Some(w) = b.take(chunk, t0 + waited) {
                waited += w;
            }
            sent += chunk as u64;
        }
        // 4 MiB at 1 MiB/s with a 256 KiB head start: 3.75 s of waiting.
        let want = 3.75;
        assert!((waited.as_secs_f64() - want).abs() < 0.02, "{waited:?}");
    }

    #[test]
    fn policy_defaults_and_allowlist() {
        let p = Policy::default();
        assert_eq!(
            (
                p.max_circuits_per_key,
                p.max_circuits,
                p.circuit_rate,
                p.circuit_idle_secs,
                p.serve_circuits
            ),
            (16, 1024, 0, 300, false)
        );
        let k = tls(1).key();
        let p: Policy = toml::from_str(&format!("allow = [\"{k}\"]\nmax_circuits = 2")).unwrap();
        assert_eq!(p.allowed_keys().unwrap(), vec![k]);
        assert_eq!(p.max_circuits, 2);
        let bad: Policy = toml::from_str("allow = [\"nope\"]").unwrap();
        assert!(bad.allowed_keys().is_err());
        assert!(toml::from_str::<Policy>("max_circuitz = 1").is_err());
    }

    /// Two loopback TCP pairs: (dialer end, relay end) and (relay end, target end).
    async fn two_pairs() -> ((TcpStream, TcpStream), (TcpStream, TcpStream)) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = l.local_addr().unwrap();
        let mut pairs = Vec::new();
        for _ in 0..2 {
            let (c, s) = tokio::join!(TcpStream::connect(at), l.accept());
            pairs.push((c.unwrap(), s.unwrap().0));
        }
        let b = pairs.pop().unwrap();
        let a = pairs.pop().unwrap();
        (a, b)
    }

    fn live() -> Arc<LiveCircuit> {
        Arc::new(LiveCircuit {
            id: "c".into(),
            from: tls(1).key(),
            to: tls(2).key(),
            since: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        })
    }

    /// How long a test waits for what must happen soon (a hang guard, not a measurement).
    const GUARD: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_splice_carries_both_ways_counts_and_passes_the_end_on() {
        let ((mut dialer, a), (b, mut target)) = two_pairs().await;
        let live = live();
        let (l2, stop) = (live.clone(), CancellationToken::new());
        let relay = tokio::spawn(async move {
            splice(a, b, &l2, 0, Duration::from_secs(300), &stop).await;
        });
        // More than a pipe and a copy buffer hold, in odd pieces.
        let up: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
        let sent = up.clone();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(70_001) {
                dialer.write_all(piece).await.unwrap();
            }
            dialer
        });
        let mut got = vec![0u8; up.len()];
        tokio::time::timeout(GUARD, target.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(got == up, "the bytes arrive as sent");
        let mut dialer = writer.await.unwrap();
        target.write_all(b"and back").await.unwrap();
        let mut back = [0u8; 8];
        tokio::time::timeout(GUARD, dialer.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back, b"and back");
        // The dialer's end of stream reaches the target; then the target's ends the splice.
        dialer.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(GUARD, target.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty());
        target.shutdown().await.unwrap();
        tokio::time::timeout(GUARD, relay).await.unwrap().unwrap();
        assert_eq!(live.up.load(Ordering::Relaxed), up.len() as u64);
        assert_eq!(live.down.load(Ordering::Relaxed), 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rate_limited_splice_passes_no_more_than_its_rate() {
        let ((mut dialer, a), (b, mut target)) = two_pairs().await;
        let live = live();
        let rate = 128 * 1024;
        let (l2, stop) = (live.clone(), CancellationToken::new());
        let stop2 = stop.clone();
        let started = Instant::now();
        let relay = tokio::spawn(async move {
            splice(a, b, &l2, rate, Duration::from_secs(300), &stop2).await;
        });
        // The dialer sends far more than the rate allows in the time the test runs.
        tokio::spawn(async move {
            let chunk = vec![7u8; 64 * 1024];
            while dialer.write_all(&chunk).await.is_ok() {}
        });
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut n = 0u64;
            while let Ok(k) = target.read(&mut buf).await {
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
            n
        });
        // Something passes…
        tokio::time::timeout(GUARD, async {
            while live.up.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        // …but never more than the burst, one more chunk of at most a burst, and the
        // rate for the time that went by (a slower machine only passes less).
        let passed = live.up.load(Ordering::Relaxed);
        let elapsed = started.elapsed().as_secs_f64();
        let burst = Bucket::burst(rate);
        let bound = 2.0 * burst + rate as f64 * elapsed;
        assert!(
            (passed as f64) <= bound,
            "{passed} bytes in {elapsed:.2} s at {rate} B/s (bound {bound})"
        );
        stop.cancel();
        tokio::time::timeout(GUARD, relay).await.unwrap().unwrap();
        let received = tokio::time::timeout(GUARD, reader).await.unwrap().unwrap();
        assert!(received <= passed, "{received} > {passed}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_splice_closes_both_ends() {
        let ((mut dialer, a), (b, mut target)) = two_pairs().await;
        let live = live();
        let (l2, stop) = (live.clone(), CancellationToken::new());
        let relay = tokio::spawn(async move {
            splice(a, b, &l2, 0, Duration::from_secs(1), &stop).await;
        });
        // One exchange, then silence: the relay closes the circuit on its own.
        dialer.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        target.read_exact(&mut got).await.unwrap();
        tokio::time::timeout(GUARD, relay).await.unwrap().unwrap();
        // Both ends see the end of their stream.
        for end in [&mut target, &mut dialer] {
            let mut rest = Vec::new();
            let n = tokio::time::timeout(GUARD, end.read_to_end(&mut rest)).await;
            assert!(matches!(n, Ok(Ok(0))), "{n:?}");
        }
        assert_eq!(live.up.load(Ordering::Relaxed), 5);
    }
}
