//! One connection to the peer under test: bounded reads and writes, `--trace`, schema
//! validation of every received line, and the AWP handshake from our side.

use super::report::{clip, Check};
use super::schema::LineSchema;
use crate::identity::{auth_transcript, Identity};
use crate::net::{BoxWriter, Conn, LineReader, ReadError, Transport};
use crate::wire::{self, b64, ids::IdGen, time, Line, PeerKey};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// Longest line shown by `--trace`, in bytes.
const TRACE_MAX: usize = 400;
/// Most lines one wait keeps: a peer that floods us ends the wait instead of growing it.
const MAX_LINES_PER_WAIT: usize = 10_000;
/// Most violations kept per scenario; later ones are counted in one last entry.
const MAX_VIOLATIONS: usize = 50;
/// The `name` of the runner's hello: a node's owner can tell the runner's test peers from
/// real ones in `awp peers` (and remove them with `awp peers forget KEY`).
pub const RUNNER_NAME: &str = "awp-conform";
/// Most transcript lines kept per scenario (the report's `lines`); later ones are counted
/// in one last entry.
const MAX_TRANSCRIPT: usize = 200;

/// Record one line (`> ` sent, `< ` received, clipped to [`TRACE_MAX`] bytes) in
/// `transcript`, and print it to stderr when tracing.
fn record(transcript: &mut Vec<String>, trace: bool, dir: char, bytes: &[u8]) {
    let text = clip(&String::from_utf8_lossy(bytes), TRACE_MAX);
    if trace {
        eprintln!("{dir} {text}");
    }
    match transcript.len() {
        n if n < MAX_TRANSCRIPT => transcript.push(format!("{dir} {text}")),
        n if n == MAX_TRANSCRIPT => transcript.push("… more lines (not kept)".into()),
        _ => {}
    }
}

/// What every connection of a run shares.
pub(crate) struct Shared {
    /// Per-read (and per-write) timeout.
    pub timeout: Duration,
    /// Print every line to stderr.
    pub trace: bool,
    /// Compiled schema for received lines.
    pub schema: LineSchema,
}

/// How a read loop ended without the wanted line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// The peer closed the connection (EOF or reset).
    Closed,
    /// The deadline passed.
    Timeout,
    /// The peer sent a line over 1 MiB.
    TooLarge,
    /// The transport failed otherwise.
    Failed(String),
}

impl End {
    pub fn describe(&self, timeout: Duration) -> String {
        match self {
            End::Closed => "the peer closed the connection".into(),
            End::Timeout => format!(
                "nothing more within {}",
                humantime::format_duration(timeout)
            ),
            End::TooLarge => "the peer sent a line over 1 MiB".into(),
            End::Failed(e) => format!("connection failed: {e}"),
        }
    }
}

/// Lines read by [`Peer::collect`] and how the loop stopped.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    /// Every received line that parsed (strictly), in order; pings from the peer included.
    pub lines: Vec<Line>,
    /// Set when the loop stopped without `done` being satisfied.
    pub end: Option<End>,
}

impl Collected {
    /// The err lines received.
    pub fn errs(&self) -> Vec<&wire::ErrLine> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                Line::Err(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// A `no err` check: fails listing the codes of the errs received.
    pub fn no_err_check(&self) -> Check {
        let errs = self.errs();
        Check::new(
            "no err from the peer",
            errs.is_empty(),
            format!("received {}", describe_errs(&errs)),
        )
    }
}

/// `err <code> (<detail>)`, comma separated.
pub(crate) fn describe_errs(errs: &[&wire::ErrLine]) -> String {
    errs.iter()
        .map(|e| match &e.detail {
            Some(d) => format!("err {} ({})", e.code, clip(d, 120)),
            None => format!("err {}", e.code),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The peer as seen by the handshake.
#[derive(Debug, Clone)]
pub(crate) struct PeerHello {
    /// Its hello line, exactly as received.
    pub raw: Vec<u8>,
    /// Parsed.
    pub hello: wire::Hello,
    /// Its key, when it parsed.
    pub key: Option<PeerKey>,
}

/// A connection to the peer.
pub(crate) struct Peer<'s> {
    reader: LineReader,
    writer: BoxWriter,
    shared: &'s Shared,
    identity: Identity,
    ids: IdGen,
    /// Schema violations and malformed lines since the last [`Peer::take_violations`].
    violations: Vec<String>,
    /// Lines sent and received since the last [`Peer::take_lines`].
    transcript: Vec<String>,
    /// The TLS certificate key, for `tls:`.
    pub cert_key: Option<PeerKey>,
    /// The binding.
    pub transport: Transport,
    /// The peer's hello, once received.
    pub hello: Option<PeerHello>,
    /// The connection ended (EOF, reset, or a framing failure).
    pub closed: bool,
}

impl<'s> Peer<'s> {
    /// Wrap a transport connection; `identity` is the key we speak as on it (it must be
    /// the key of the TLS certificate we presented).
    pub fn new(conn: Conn, shared: &'s Shared, identity: Identity) -> Peer<'s> {
        Peer {
            reader: conn.reader,
            writer: conn.writer,
            shared,
            identity,
            ids: IdGen::new(None),
            violations: Vec::new(),
            transcript: Vec::new(),
            cert_key: conn.peer_cert_key,
            transport: conn.transport,
            hello: None,
            closed: false,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// A fresh id (ULID, increasing).
    pub fn new_id(&mut self) -> String {
        self.ids.next_at(time::now_ms()).to_string()
    }

    /// Now, in the wire form of `ts`.
    pub fn now_ts(&self) -> String {
        time::format_ms(time::now_ms())
    }

    /// The peer's hello caps (empty before the handshake).
    pub fn caps(&self) -> &[String] {
        self.hello.as_ref().map_or(&[], |h| &h.hello.caps)
    }

    /// Failed checks for every schema violation and malformed line received since the
    /// last call.
    pub fn take_violations(&mut self) -> Vec<Check> {
        std::mem::take(&mut self.violations)
            .into_iter()
            .map(|v| Check::fail("received lines follow the schema", v))
            .collect()
    }

    /// Record a violation, keeping at most [`MAX_VIOLATIONS`] per scenario.
    fn violation(&mut self, v: String) {
        match self.violations.len() {
            n if n < MAX_VIOLATIONS => self.violations.push(v),
            n if n == MAX_VIOLATIONS => self.violations.push("more violations (not shown)".into()),
            _ => {}
        }
    }

    fn trace(&mut self, dir: char, bytes: &[u8]) {
        record(&mut self.transcript, self.shared.trace, dir, bytes);
    }

    /// The lines sent (`> …`) and received (`< …`) since the last call, each clipped to
    /// 400 bytes, at most 200 (then one `… more lines` entry).
    pub fn take_lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.transcript)
    }

    /// Write `line` and `\n`, flushed, within the timeout.
    pub async fn send(&mut self, line: &[u8]) -> Result<(), String> {
        self.trace('>', line);
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        let r = write_bounded(&mut self.writer, &buf, self.shared.timeout).await;
        if r.is_err() {
            self.closed = true;
        }
        r
    }

    /// Send a typed line.
    pub async fn send_line(&mut self, line: &Line) -> Result<(), String> {
        self.send(&line.encode()).await
    }

    /// Send a JSON value as one line.
    pub async fn send_json(&mut self, v: &serde_json::Value) -> Result<(), String> {
        let bytes = serde_json::to_vec(v).map_err(|e| e.to_string())?;
        self.send(&bytes).await
    }

    /// Next raw line before `deadline`; records violations of the schema and of strict
    /// parsing. `Ok((raw, parsed))`; `parsed` is `None` for a malformed line.
    async fn recv(&mut self, deadline: Instant) -> Result<(Vec<u8>, Option<Line>), End> {
        if self.closed {
            return Err(End::Closed);
        }
        let got = match tokio::time::timeout_at(deadline, self.reader.read_line()).await {
            Err(_) => return Err(End::Timeout),
            Ok(r) => r,
        };
        let raw = match got {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                self.closed = true;
                return Err(End::Closed);
            }
            Err(ReadError::TooLarge) => {
                self.closed = true;
                self.violation("the peer sent a line over 1,048,576 bytes".into());
                return Err(End::TooLarge);
            }
            Err(ReadError::Io(e)) => {
                self.closed = true;
                return Err(match e.kind() {
                    std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof => End::Closed,
                    _ => End::Failed(e.to_string()),
                });
            }
        };
        self.trace('<', &raw);
        let parsed = match wire::parse_line(&raw) {
            Ok(l) => Some(l),
            Err(e) => {
                self.violation(format!(
                    "malformed line ({e}): {}",
                    clip(&String::from_utf8_lossy(&raw), 160)
                ));
                None
            }
        };
        if let Ok(v) = wire::parse::strict_from_str(&String::from_utf8_lossy(&raw)) {
            let t = v
                .get("t")
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_string();
            for m in self.shared.schema.violations(&v) {
                self.violation(format!("{t} line: {m}"));
            }
        }
        Ok((raw, parsed))
    }

    /// Read lines until `done(lines so far)` holds, the connection ends, or `wait` passes.
    /// The peer's pings are answered with a pong (and kept in `lines`).
    pub async fn collect(
        &mut self,
        wait: Duration,
        mut done: impl FnMut(&[Line]) -> bool,
    ) -> Collected {
        let deadline = Instant::now() + wait;
        let mut out = Collected::default();
        loop {
            match self.recv(deadline).await {
                Ok((_, Some(line))) => {
                    if let Line::Ping(p) = &line {
                        let pong = Line::Pong(wire::Pong {
                            id: self.new_id(),
                            ts: self.now_ts(),
                            re: p.id.clone(),
                        });
                        let _ = self.send_line(&pong).await;
                    }
                    out.lines.push(line);
                    if done(&out.lines) {
                        return out;
                    }
                    if out.lines.len() >= MAX_LINES_PER_WAIT {
                        out.end = Some(End::Failed(format!(
                            "{MAX_LINES_PER_WAIT} lines without the one awaited"
                        )));
                        return out;
                    }
                }
                Ok((_, None)) => {}
                Err(end) => {
                    out.end = Some(end);
                    return out;
                }
            }
        }
    }

    /// Read lines until the connection closes (or `wait` passes).
    pub async fn collect_until_close(&mut self, wait: Duration) -> Collected {
        self.collect(wait, |_| false).await
    }

    /// Our hello line (v as given), encoded.
    pub fn our_hello(&mut self, v: u64) -> Vec<u8> {
        Line::Hello(wire::Hello {
            id: self.new_id(),
            ts: self.now_ts(),
            v,
            key: self.identity.key().to_string(),
            name: Some(RUNNER_NAME.into()),
            nonce: b64::encode_url(&rand::random::<[u8; 32]>()),
            caps: vec![],
            about: Some("awp conform: AWP v0 conformance runner".into()),
            addr: None,
            shares: None,
        })
        .encode()
    }

    /// Our hello, then the peer's first line, which must be its hello. Returns the checks
    /// made on that hello (valid, v 0, key, nonce, TLS binding) and our hello bytes.
    pub async fn exchange_hellos(&mut self, v: u64) -> (Vec<u8>, Vec<Check>) {
        let mine = self.our_hello(v);
        let mut checks = Vec::new();
        if let Err(e) = self.send(&mine).await {
            checks.push(Check::fail("send our hello", e));
            return (mine, checks);
        }
        let deadline = Instant::now() + self.shared.timeout;
        let first = self.recv(deadline).await;
        let (raw, hello) = match first {
            Ok((raw, Some(Line::Hello(h)))) => (raw, h),
            Ok((raw, other)) => {
                let what = match other {
                    Some(l) => format!("first line is {} ", l.kind()),
                    None => "first line is malformed ".into(),
                };
                checks.push(Check::fail(
                    "the peer's first line is a valid hello",
                    format!("{what}{}", clip(&String::from_utf8_lossy(&raw), 160)),
                ));
                return (mine, checks);
            }
            Err(end) => {
                checks.push(Check::fail(
                    "the peer's first line is a valid hello",
                    end.describe(self.shared.timeout),
                ));
                return (mine, checks);
            }
        };
        checks.push(Check::pass("the peer's first line is a valid hello"));
        checks.push(Check::new(
            "hello v is 0",
            hello.v == 0,
            format!("v is {}", hello.v),
        ));
        let key = PeerKey::parse(&hello.key);
        checks.push(Check::new(
            "hello key is an ed25519 key (43 base64url chars, not weak)",
            key.is_ok()
                && hello.key.len() == "ed25519:".len() + 43
                && !hello.key.contains(['+', '/', '=']),
            format!(
                "{:?}: {}",
                clip(&hello.key, 80),
                key.as_ref()
                    .err()
                    .map_or("not in the canonical form".to_string(), |e| e.to_string())
            ),
        ));
        // A peer that answers with our own key is reflecting (or echoing) our hello
        // (protocol-notes §Handshake).
        checks.push(Check::new(
            "hello key is not our own (no reflection)",
            key.as_ref().ok() != Some(&self.identity.key()),
            "the peer's hello carries the runner's own key",
        ));
        let nonce = b64::decode_any(&hello.nonce);
        checks.push(Check::new(
            "hello nonce is 32 bytes",
            matches!(&nonce, Ok(n) if n.len() == 32),
            match &nonce {
                Ok(n) => format!("{} bytes", n.len()),
                Err(e) => format!("not base64: {e}"),
            },
        ));
        let key = key.ok();
        if self.transport == Transport::Tls {
            let ok = key.is_some() && self.cert_key == key;
            checks.push(Check::new(
                "TLS certificate key equals hello key",
                ok,
                format!(
                    "certificate key {}, hello key {}",
                    self.cert_key.map_or("none".into(), |k| k.to_string()),
                    clip(&hello.key, 80)
                ),
            ));
        }
        self.hello = Some(PeerHello { raw, hello, key });
        (mine, checks)
    }

    /// Our auth for `mine` (our hello) and the peer's hello; with `flip`, one bit of the
    /// signature is flipped.
    pub fn our_auth(&mut self, mine: &[u8], flip: bool) -> Vec<u8> {
        let theirs = self.hello.as_ref().map_or(&[][..], |h| &h.raw[..]);
        let mut sig = self.identity.sign(&auth_transcript(mine, theirs));
        if flip {
            sig[10] ^= 0x01;
        }
        Line::Auth(wire::Auth {
            id: self.new_id(),
            ts: self.now_ts(),
            sig: b64::encode_url(&sig),
            grants: vec![],
        })
        .encode()
    }

    /// The whole handshake: hellos, our auth, the peer's auth (verified), its resume (we
    /// send ours). Returns the checks and whether the session is open (auth verified).
    pub async fn handshake(&mut self) -> (Vec<Check>, bool) {
        let (mine, mut checks) = self.exchange_hellos(0).await;
        if self.hello.is_none() || checks.iter().any(Check::failed) {
            return (checks, false);
        }
        let auth = self.our_auth(&mine, false);
        if let Err(e) = self.send(&auth).await {
            checks.push(Check::fail("send our auth", e));
            return (checks, false);
        }
        let deadline = Instant::now() + self.shared.timeout;
        let second = self.recv(deadline).await;
        let Some(ph) = self.hello.clone() else {
            return (checks, false);
        };
        let what = "the peer's second line is auth and its signature verifies over the transcript";
        let authed = match second {
            Ok((_, Some(Line::Auth(a)))) => {
                let transcript = auth_transcript(&ph.raw, &mine);
                let ok = ph.key.is_some_and(|k| k.verify_b64(&transcript, &a.sig));
                checks.push(Check::new(what, ok, "the signature does not verify"));
                ok
            }
            Ok((raw, Some(Line::Err(e)))) => {
                checks.push(Check::fail(
                    what,
                    format!(
                        "got {}: {}",
                        describe_errs(&[&e]),
                        clip(&String::from_utf8_lossy(&raw), 160)
                    ),
                ));
                false
            }
            Ok((raw, _)) => {
                checks.push(Check::fail(
                    what,
                    format!("got {}", clip(&String::from_utf8_lossy(&raw), 160)),
                ));
                false
            }
            Err(end) => {
                checks.push(Check::fail(what, end.describe(self.shared.timeout)));
                false
            }
        };
        if !authed {
            return (checks, false);
        }
        let resume = Line::Resume(wire::Resume {
            id: self.new_id(),
            ts: self.now_ts(),
            seen: Default::default(),
        });
        if let Err(e) = self.send_line(&resume).await {
            checks.push(Check::fail("send our resume", e));
            return (checks, false);
        }
        let got = self
            .collect(self.shared.timeout, |ls| {
                ls.iter().any(|l| matches!(l, Line::Resume(_)))
            })
            .await;
        let resumed = got.lines.iter().any(|l| matches!(l, Line::Resume(_)));
        checks.push(Check::new(
            "resume arrives after auth",
            resumed,
            got.end
                .as_ref()
                .map_or(String::new(), |e| e.describe(self.shared.timeout)),
        ));
        checks.push(got.no_err_check());
        (checks, !self.closed)
    }

    /// Write `bytes` (no newline added) while reading lines until the peer closes or
    /// `wait` passes; the write's outcome is ignored (a peer may close mid-line).
    pub async fn send_raw_and_collect(&mut self, bytes: &[u8], wait: Duration) -> Collected {
        self.trace('>', bytes);
        let timeout = self.shared.timeout;
        let shared = self.shared;
        let reader = &mut self.reader;
        let violations = &mut self.violations;
        let transcript = &mut self.transcript;
        let writer = &mut self.writer;
        let write = async move {
            let _ = write_bounded(writer, bytes, timeout).await;
        };
        let read = async {
            let deadline = Instant::now() + wait;
            let mut out = Collected::default();
            loop {
                let got = tokio::time::timeout_at(deadline, reader.read_line()).await;
                match got {
                    Err(_) => {
                        out.end = Some(End::Timeout);
                        break;
                    }
                    Ok(Ok(Some(raw))) => {
                        record(transcript, shared.trace, '<', &raw);
                        if out.lines.len() >= MAX_LINES_PER_WAIT {
                            out.end = Some(End::Failed(format!(
                                "{MAX_LINES_PER_WAIT} lines without a close"
                            )));
                            break;
                        }
                        match wire::parse_line(&raw) {
                            Ok(l) => out.lines.push(l),
                            Err(e) if violations.len() < MAX_VIOLATIONS => {
                                violations.push(format!("malformed line ({e})"))
                            }
                            Err(_) => {}
                        }
                        if let Ok(v) = wire::parse::strict_from_str(&String::from_utf8_lossy(&raw))
                        {
                            for m in shared.schema.violations(&v) {
                                if violations.len() < MAX_VIOLATIONS {
                                    violations.push(m);
                                }
                            }
                        }
                    }
                    Ok(Ok(None)) | Ok(Err(ReadError::Io(_))) => {
                        out.end = Some(End::Closed);
                        break;
                    }
                    Ok(Err(ReadError::TooLarge)) => {
                        out.end = Some(End::TooLarge);
                        break;
                    }
                }
            }
            out
        };
        let ((), out) = tokio::join!(write, read);
        self.closed = matches!(out.end, Some(End::Closed | End::TooLarge));
        out
    }
}

/// Write all of `buf` and flush within `timeout`.
async fn write_bounded(w: &mut BoxWriter, buf: &[u8], timeout: Duration) -> Result<(), String> {
    let io = async {
        w.write_all(buf).await?;
        w.flush().await
    };
    match tokio::time::timeout(timeout, io).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "write did not finish within {}",
            humantime::format_duration(timeout)
        )),
    }
}
