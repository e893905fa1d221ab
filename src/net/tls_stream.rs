//! TLS 1.3 over a TCP socket with rustls' unbuffered API, holding no buffer while idle
//! (issue 10 §4: per-connection buffers sized to the traffic).
//!
//! rustls' buffered connection (what `tokio-rustls` drives) re-sizes its receive buffer
//! to 4 KiB before every read and keeps it for the life of the connection: 4 KiB per idle
//! connection, the largest single allocation of an idle relay connection. Here the
//! connection keeps three buffers of its own and gives each back as soon as it is empty:
//!
//! - `incoming`: ciphertext read from the socket and not yet decrypted (a partial
//!   record; at most [`MAX_INCOMING`] bytes, enough for a 64 KiB handshake message);
//! - `plain`: plaintext decrypted and not yet read by the caller;
//! - `out`: records encrypted (or handshake records encoded) and not yet written.
//!
//! A read goes into `incoming`'s spare room; when the socket has nothing more, `incoming`
//! is given back, or trimmed to the partial record it holds. Decrypted data goes straight
//! into the reader's buffer while it has room; only the rest waits in `plain`. An idle
//! connection holds rustls' state (its keys) and the socket. [`Engine`] is that state
//! and the buffers without the socket (tests and the `tls_records` fuzz target drive it
//! directly).
//!
//! Semantics follow `tokio-rustls`: EOF after the peer's close_notify is a clean end
//! (`Ok(0)`); EOF without it is [`std::io::ErrorKind::UnexpectedEof`]; rustls errors are
//! [`std::io::ErrorKind::InvalidData`] wrapping the [`rustls::Error`] (a fatal alert is sent
//! to the peer first, if the socket takes it at once); shutdown sends close_notify, then
//! shuts the socket's write side.

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use std::io;
use std::ops::DerefMut;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes asked of the socket per read: one full record (16 KiB of plaintext plus header,
/// content type and tag) and then some, so a burst of small records costs few syscalls.
const READ_CHUNK: usize = 32 * 1024;

/// Ciphertext kept while waiting for the rest of a record or handshake message: a 64 KiB
/// handshake message (rustls' own limit) spread over records, plus one record. More
/// without progress is refused ([`std::io::ErrorKind::InvalidData`]).
pub const MAX_INCOMING: usize = 0xffff + 2 * (16 * 1024 + 256 + 5);

/// Encrypted bytes not yet written above which `poll_write` first waits for the socket
/// (a writer that outruns its peer is held back here, not in memory).
const OUT_HIGH_WATER: usize = 256 * 1024;

/// Per-record overhead when sizing `out` for a write (header 5, content type 1, AEAD tag
/// 16); rustls says the exact size if this guess is short.
const RECORD_OVERHEAD: usize = 22;
/// Plaintext per record (RFC 8446 §5.1).
const MAX_FRAGMENT: usize = 16 * 1024;

/// The two unbuffered connection kinds, as one interface.
pub trait Side:
    DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> + Send + Unpin + 'static
{
    /// rustls' per-side connection data.
    type Data;
    /// [`UnbufferedConnectionCommon::process_tls_records`] of this side.
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

/// What rustls wants next, after everything it could do with the bytes at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// More ciphertext from the peer (the handshake is not done, or nothing is left).
    Input,
    /// Application data may be sent (and the requested send or close_notify was queued).
    Writable,
    /// Both sides sent close_notify: nothing more either way.
    Closed,
}

/// What to do once rustls allows sending.
enum Want<'a> {
    Nothing,
    Send(&'a [u8]),
    CloseNotify,
}

/// rustls' unbuffered connection with the three buffers, and no socket: what the stream
/// does with bytes, apart from moving them. Public for the fuzz target
/// (`fuzz/fuzz_targets/tls_records.rs`), which feeds it hostile bytes directly.
pub struct Engine<C: Side> {
    conn: C,
    incoming: Vec<u8>,
    plain: Vec<u8>,
    /// Read position in `plain`.
    plain_at: usize,
    out: Vec<u8>,
    /// Write position in `out`.
    out_at: usize,
    /// The peer sent close_notify (reads end cleanly once `plain` is drained).
    peer_closed: bool,
    /// close_notify is queued (or rustls said the connection is closed).
    close_sent: bool,
    /// A fatal error: every later call fails with it.
    failed: Option<(io::ErrorKind, String)>,
}

/// A TLS connection over a TCP socket. See the module documentation.
pub struct TlsStream<C: Side> {
    engine: Engine<C>,
    tcp: TcpStream,
    /// The socket reached EOF.
    eof: bool,
    /// The reader waiting for socket readiness, woken when a write's processing left
    /// plaintext for it (only possible in odd interleavings, but a lost wake-up hangs).
    read_waker: Option<Waker>,
}

/// A server-side TLS connection.
pub type ServerTls = TlsStream<UnbufferedServerConnection>;
/// A client-side TLS connection.
pub type ClientTls = TlsStream<UnbufferedClientConnection>;

impl<C: Side> TlsStream<C> {
    /// Run the handshake over `tcp` with `conn` (fresh from `Unbuffered*Connection::new`).
    /// Returns once rustls says the handshake is complete (for a server: the client's
    /// certificate and Finished checked). Errors as in the module documentation; EOF during
    /// the handshake is `UnexpectedEof`. The caller bounds the time.
    pub async fn handshake(conn: C, tcp: TcpStream) -> io::Result<Self> {
        let mut s = TlsStream {
            engine: Engine::new(conn),
            tcp,
            eof: false,
            read_waker: None,
        };
        loop {
            let next = s.step(Want::Nothing, None);
            let next = next?;
            std::future::poll_fn(|cx| s.poll_flush_out(cx)).await?;
            if !s.engine.conn.is_handshaking() {
                s.engine.out = Vec::new();
                return Ok(s);
            }
            if next == Next::Closed || s.engine.peer_closed || s.eof {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection during the TLS handshake (a node at its \
                     connection or handshake limit closes new sockets like this; or what \
                     listens there is not an AWP node)",
                ));
            }
            let n = std::future::poll_fn(|cx| s.poll_fill(cx)).await?;
            if n == 0 {
                s.eof = true;
            }
        }
    }

    /// rustls' view of the connection (negotiated ALPN, the peer's certificates, …).
    pub fn common(&self) -> &rustls::CommonState {
        &self.engine.conn
    }

    /// [`Engine`]'s step; after a failure, the alert it queued goes out if the socket
    /// takes it at once.
    fn step(&mut self, want: Want<'_>, dest: Option<&mut ReadBuf<'_>>) -> io::Result<Next> {
        let res = self.engine.step(want, dest);
        if res.is_err() {
            self.flush_now();
        }
        res
    }

    /// Buffers held now (ciphertext in, plaintext unread, ciphertext out), in bytes of
    /// capacity: zero for an idle connection.
    pub fn buffered_capacity(&self) -> usize {
        self.engine.buffered_capacity()
    }

    /// Write what `out` holds without waiting (used on the read side, which must not take
    /// over the writer's wake-up, and for a last alert).
    fn flush_now(&mut self) {
        while self.engine.out_at < self.engine.out.len() {
            match self.tcp.try_write(&self.engine.out[self.engine.out_at..]) {
                Ok(0) | Err(_) => return,
                Ok(n) => self.engine.out_at += n,
            }
        }
        self.engine.out = Vec::new();
        self.engine.out_at = 0;
    }

    /// Write all of `out` to the socket. The buffer is kept for the next records of the
    /// same write (a large write is encrypted a few records per `poll_write`, and a fresh
    /// buffer for each costed the sender a third of its CPU in a blob transfer: the copy
    /// of the plaintext into untouched memory); `poll_flush` and `poll_shutdown` give it
    /// back, so an idle connection holds none.
    fn poll_flush_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.engine.out_at < self.engine.out.len() {
            let n = ready!(
                Pin::new(&mut self.tcp).poll_write(cx, &self.engine.out[self.engine.out_at..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.engine.out_at += n;
        }
        self.engine.out.clear();
        self.engine.out_at = 0;
        Poll::Ready(Ok(()))
    }

    /// Read what the socket has into `incoming`, trimmed when nothing more is there.
    /// `Ok(0)` at EOF.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let room = MAX_INCOMING.saturating_sub(self.engine.incoming.len());
        if room == 0 {
            return Poll::Ready(Err(self.engine.over_cap()));
        }
        // Straight into `incoming`'s spare room; when the socket has nothing more, the
        // buffer is trimmed to what it holds (a peer that sends a few bytes and goes quiet
        // pins only those bytes).
        let want = READ_CHUNK.min(room);
        loop {
            if self.tcp.poll_read_ready(cx)?.is_pending() {
                let incoming = &mut self.engine.incoming;
                if incoming.is_empty() {
                    *incoming = Vec::new();
                } else if incoming.capacity() > incoming.len() + 4096 {
                    incoming.shrink_to_fit();
                }
                return Poll::Pending;
            }
            self.engine.incoming.reserve(want);
            let mut room = bytes::BufMut::limit(&mut self.engine.incoming, want);
            match self.tcp.try_read_buf(&mut room) {
                Ok(n) => return Poll::Ready(Ok(n)),
                // Readiness was stale: poll again (and register the wake-up).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// A server engine for `tls`'s certificate (mTLS, ALPN `awp/0`; see `spec/tls-binding.md`).
pub fn server_engine(
    tls: &super::TlsConfig,
) -> Result<Engine<UnbufferedServerConnection>, rustls::Error> {
    Ok(Engine::new(UnbufferedServerConnection::new(
        tls.server_config(),
    )?))
}

/// A client engine for `tls`'s certificate, trusting any server key (no pin).
pub fn client_engine(
    tls: &super::TlsConfig,
) -> Result<Engine<UnbufferedClientConnection>, rustls::Error> {
    let config = tls
        .client_config(None)
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    Ok(Engine::new(UnbufferedClientConnection::new(
        config,
        super::tls::server_name(),
    )?))
}

impl<C: Side> Engine<C> {
    /// A fresh connection (from `Unbuffered*Connection::new`), holding no buffer.
    pub fn new(conn: C) -> Self {
        Engine {
            conn,
            incoming: Vec::new(),
            plain: Vec::new(),
            plain_at: 0,
            out: Vec::new(),
            out_at: 0,
            peer_closed: false,
            close_sent: false,
            failed: None,
        }
    }

    /// Append ciphertext from the peer, as a read from the socket would. Errors
    /// (`InvalidData`, sticky) past [`MAX_INCOMING`] bytes waiting.
    pub fn feed(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.incoming.len() + bytes.len() > MAX_INCOMING {
            return Err(self.over_cap());
        }
        self.incoming.extend_from_slice(bytes);
        Ok(())
    }

    /// Process what was fed: decrypted bytes become readable ([`Engine::take_plain`]),
    /// records for the peer wait in [`Engine::take_out`]. `Ok(true)` once the handshake
    /// is complete. Errors as in the module documentation (sticky).
    pub fn process(&mut self) -> io::Result<bool> {
        self.step(Want::Nothing, None)?;
        Ok(!self.conn.is_handshaking())
    }

    /// Encrypt `data` for the peer (into [`Engine::take_out`]). Errors: `BrokenPipe` after
    /// close_notify, `NotConnected` before rustls allows application data, or the
    /// connection's failure (sticky).
    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if self.close_sent {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS close_notify already sent",
            ));
        }
        self.step(Want::Send(data), None).map(|_| ())
    }

    /// Refuse more waiting ciphertext than [`MAX_INCOMING`] (`InvalidData`, sticky).
    fn over_cap(&mut self) -> io::Error {
        let e = io::Error::new(
            io::ErrorKind::InvalidData,
            format!("TLS record or handshake message over {MAX_INCOMING} bytes"),
        );
        self.fail(&e);
        e
    }

    /// Take the decrypted bytes not yet read.
    pub fn take_plain(&mut self) -> Vec<u8> {
        let mut p = std::mem::take(&mut self.plain);
        p.drain(..self.plain_at);
        self.plain_at = 0;
        p
    }

    /// Take the records waiting to be sent to the peer.
    pub fn take_out(&mut self) -> Vec<u8> {
        let mut o = std::mem::take(&mut self.out);
        o.drain(..self.out_at);
        self.out_at = 0;
        o
    }

    /// Whether the peer's close_notify arrived.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Bytes of capacity held by the three buffers.
    pub fn buffered_capacity(&self) -> usize {
        self.incoming.capacity() + self.plain.capacity() + self.out.capacity()
    }

    /// Let rustls process what `incoming` holds: decrypted data goes to `plain`, handshake
    /// records and alerts to `out`. With `want`, queue a send or close_notify once rustls
    /// allows application data. Never touches the socket.
    fn step(&mut self, mut want: Want<'_>, mut dest: Option<&mut ReadBuf<'_>>) -> io::Result<Next> {
        if let Some((kind, msg)) = &self.failed {
            return Err(io::Error::new(*kind, msg.clone()));
        }
        // Each pass handles one state: a handshake takes a handful, and every record read
        // is one more (a 32 KiB read can hold 1,400 records of one byte). The bound only
        // guards against a state machine that stops making progress, so it counts the
        // passes in a row that consumed nothing and produced nothing.
        let mut idle = 0;
        while idle < 64 {
            let UnbufferedStatus { mut discard, state } = self.conn.process(&mut self.incoming);
            let progress = discard > 0
                || matches!(
                    &state,
                    Ok(ConnectionState::ReadTraffic(_)
                        | ConnectionState::EncodeTlsData(_)
                        | ConnectionState::TransmitTlsData(_))
                );
            idle = if progress { 0 } else { idle + 1 };
            let outcome: Result<Option<Next>, io::Error> = match state {
                Err(e) => Err(tls_error(e)),
                Ok(ConnectionState::ReadTraffic(mut traffic)) => {
                    let mut res = Ok(None);
                    while let Some(record) = traffic.next_record() {
                        match record {
                            Ok(r) => {
                                discard += r.discard;
                                let mut payload = r.payload;
                                if self.plain_at == self.plain.len() {
                                    self.plain.clear();
                                    self.plain_at = 0;
                                    // Straight into the reader's buffer while it has room
                                    // and nothing is waiting before it.
                                    if let Some(d) = &mut dest {
                                        let n = payload.len().min(d.remaining());
                                        d.put_slice(&payload[..n]);
                                        payload = &payload[n..];
                                    }
                                }
                                self.plain.extend_from_slice(payload);
                            }
                            Err(e) => {
                                res = Err(tls_error(e));
                                break;
                            }
                        }
                    }
                    res
                }
                Ok(ConnectionState::EncodeTlsData(mut encode)) => {
                    let at = self.out.len();
                    let mut room = 1024;
                    loop {
                        self.out.resize(at + room, 0);
                        match encode.encode(&mut self.out[at..]) {
                            Ok(n) => {
                                self.out.truncate(at + n);
                                break Ok(None);
                            }
                            Err(EncodeError::InsufficientSize(InsufficientSizeError {
                                required_size,
                            })) if required_size > room => room = required_size,
                            Err(e) => {
                                self.out.truncate(at);
                                break Err(io::Error::other(e.to_string()));
                            }
                        }
                    }
                }
                // The encoded records wait in `out`, in order, ahead of anything
                // encrypted later: they count as sent.
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    transmit.done();
                    Ok(None)
                }
                Ok(ConnectionState::PeerClosed) => {
                    self.peer_closed = true;
                    Ok(None)
                }
                Ok(ConnectionState::Closed) => {
                    self.peer_closed = true;
                    self.close_sent = true;
                    Ok(Some(Next::Closed))
                }
                Ok(ConnectionState::BlockedHandshake) => Ok(Some(Next::Input)),
                Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                    let res = match std::mem::replace(&mut want, Want::Nothing) {
                        Want::Nothing => Ok(()),
                        Want::Send(data) => encrypt_into(&mut self.out, data.len(), |buf| {
                            traffic.encrypt(data, buf)
                        }),
                        Want::CloseNotify => {
                            self.close_sent = true;
                            encrypt_into(&mut self.out, 0, |buf| traffic.queue_close_notify(buf))
                        }
                    };
                    res.map(|()| Some(Next::Writable))
                }
                Ok(ConnectionState::ReadEarlyData(_)) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "TLS early data is not accepted",
                )),
                Ok(other) => Err(io::Error::other(format!(
                    "unexpected TLS connection state {other:?}"
                ))),
            };
            self.incoming.drain(..discard.min(self.incoming.len()));
            if self.incoming.is_empty() {
                self.incoming = Vec::new();
            }
            match outcome {
                Ok(None) => continue,
                Ok(Some(next)) => {
                    if next == Next::Writable && self.conn.is_handshaking() {
                        // A server may send after its own Finished; the handshake still
                        // waits for the client's certificate and Finished.
                        return Ok(Next::Input);
                    }
                    if matches!(want, Want::Send(_)) {
                        return Err(match next {
                            Next::Closed => io::Error::new(
                                io::ErrorKind::BrokenPipe,
                                "TLS connection is closed for sending",
                            ),
                            _ => io::Error::new(
                                io::ErrorKind::NotConnected,
                                "TLS handshake not complete",
                            ),
                        });
                    }
                    return Ok(next);
                }
                Err(e) => {
                    self.fail(&e);
                    self.queue_alert();
                    return Err(e);
                }
            }
        }
        let e = io::Error::other("TLS state machine made no progress");
        self.fail(&e);
        Err(e)
    }

    /// Remember a fatal error (later calls fail with it).
    fn fail(&mut self, e: &io::Error) {
        self.failed = Some((e.kind(), e.to_string()));
    }

    /// After a rustls error, the records it queued (a fatal alert) go to `out`.
    ///
    /// Only queued records are taken: once rustls has failed, `process_tls_records` must
    /// not deframe again (rustls 0.23 panics on its stale handshake state), and it would
    /// deframe as soon as nothing is queued.
    fn queue_alert(&mut self) {
        while self.conn.wants_write() {
            let UnbufferedStatus { state, .. } = self.conn.process(&mut []);
            let Ok(ConnectionState::EncodeTlsData(mut encode)) = state else {
                return;
            };
            let at = self.out.len();
            self.out.resize(at + 1024, 0);
            match encode.encode(&mut self.out[at..]) {
                Ok(n) => self.out.truncate(at + n),
                Err(_) => {
                    self.out.truncate(at);
                    return;
                }
            }
        }
    }
}

/// A rustls error as an I/O error (`InvalidData` wrapping it, as `tokio-rustls` does).
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Append to `out` what `f` writes into a slice sized for `len` bytes of plaintext,
/// growing to rustls' stated size if the guess is short.
fn encrypt_into(
    out: &mut Vec<u8>,
    len: usize,
    mut f: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> io::Result<()> {
    let at = out.len();
    let mut room = len + (len / MAX_FRAGMENT + 1) * RECORD_OVERHEAD;
    loop {
        out.resize(at + room, 0);
        match f(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return Ok(());
            }
            Err(EncryptError::InsufficientSize(InsufficientSizeError { required_size }))
                if required_size > room =>
            {
                room = required_size
            }
            Err(e) => {
                out.truncate(at);
                return Err(io::Error::other(e.to_string()));
            }
        }
    }
}

impl<C: Side> AsyncRead for TlsStream<C> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.engine.plain_at < this.engine.plain.len() {
                let n = (this.engine.plain.len() - this.engine.plain_at).min(buf.remaining());
                buf.put_slice(&this.engine.plain[this.engine.plain_at..this.engine.plain_at + n]);
                this.engine.plain_at += n;
                if this.engine.plain_at == this.engine.plain.len() {
                    this.engine.plain = Vec::new();
                    this.engine.plain_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.engine.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            this.step(Want::Nothing, Some(buf))?;
            // Records rustls produced while reading (a key update's answer) go out now if
            // the socket takes them; else with the next write or flush.
            if this.engine.out_at < this.engine.out.len() {
                this.flush_now();
            }
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            if this.engine.plain_at < this.engine.plain.len() || this.engine.peer_closed {
                continue;
            }
            if this.eof {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed connection without sending TLS close_notify",
                )));
            }
            match this.poll_fill(cx) {
                Poll::Ready(Ok(0)) => this.eof = true,
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    match &mut this.read_waker {
                        Some(w) => w.clone_from(cx.waker()),
                        None => this.read_waker = Some(cx.waker().clone()),
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl<C: Side> TlsStream<C> {
    /// After a write processed input, wake a reader parked on the socket if it now has
    /// something to return.
    fn wake_reader(&mut self) {
        if self.engine.plain_at < self.engine.plain.len() || self.engine.peer_closed {
            if let Some(w) = self.read_waker.take() {
                w.wake();
            }
        }
    }
}

impl<C: Side> AsyncWrite for TlsStream<C> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.engine.out.len() - this.engine.out_at >= OUT_HIGH_WATER {
            ready!(this.poll_flush_out(cx))?;
        }
        // At most a few records per call: `out` stays near the high-water mark however
        // large the caller's buffer.
        let data = &data[..data.len().min(4 * MAX_FRAGMENT)];
        let res = this.engine.send(data);
        this.wake_reader();
        if res.is_err() {
            this.flush_now();
        }
        res?;
        // Start sending; what the socket does not take now goes with the next flush.
        if let Poll::Ready(Err(e)) = this.poll_flush_out(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_flush_out(cx))?;
        this.engine.out = Vec::new();
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.engine.close_sent && this.engine.failed.is_none() {
            let res = this.step(Want::CloseNotify, None);
            this.wake_reader();
            res?;
            this.engine.close_sent = true;
        }
        ready!(this.poll_flush_out(cx))?;
        this.engine.out = Vec::new();
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "tls_stream_tests.rs"]
mod tests;
