//! The per-connection AWP state machine, free of I/O (in the manner of a sans-I/O protocol
//! core): the driver feeds it received lines and the current time, and takes out lines to
//! write, store flush requests, events and the next timer deadline.
//!
//! Rules implemented (protocol-notes): §Handshake (hello checks in order, auth transcript,
//! second line must be auth, reflection and version refused, TLS binding), §Threads, acks,
//! resume (resume on open, drop by seen, ordered replay with original ids, 15 s resume
//! timeout, cumulative ack, permanent dedup, ack only after durable), §Liveness and close
//! (ping after 30 s idle, two missed pongs, bye), §Errors (which codes close).
//!
//! Durability contract: lines that need an ack are collected while the driver feeds a
//! batch; [`Session::commit`] stores them in one transaction (not yet durable); their acks
//! are held until the driver has run [`Store::flush`] and called [`Session::flushed`].
//! Events about received lines are released at the same time. So a burst of N lines costs
//! one transaction and one fsync, and nothing is acked before it is on disk.

use crate::identity::{auth_transcript, Identity};
use crate::store::{Received, Store, StoreError};
use crate::wire::{self, code, Line, PeerKey};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod commit;
mod preparse;
#[cfg(test)]
mod tests;

use preparse::SigCheck;
pub use preparse::{preparse, PreParsed, Signer};

/// Idle time before we ping (§Liveness).
pub const PING_IDLE: Duration = Duration::from_secs(30);
/// Pings outstanding without any inbound line before the connection is dead.
pub const MISSED_PONGS: u32 = 2;
/// Replay anyway when the peer's resume has not arrived by then (§Threads, acks, resume).
pub const RESUME_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to wait for the peer's bye after ours (§Liveness and close).
pub const BYE_LINGER: Duration = Duration::from_secs(5);
/// How long to wait for the peer's bye when the node shuts down: short enough that the
/// transport is closed properly (TLS close_notify) before the node stops waiting for its
/// connections (3 s, issue 8 §4b).
pub const SHUTDOWN_BYE_LINGER: Duration = Duration::from_secs(1);
/// Most outbox lines fetched from the store per batch during replay.
pub const REPLAY_BATCH: usize = 512;
/// Bytes of outbox lines a replay batch aims at: the next fetch asks for as many lines as
/// fit at the size of the last batch's lines (at most [`REPLAY_BATCH`], at least 1), so a
/// peer that stops reading holds at most about this much (plus one line of up to 1 MiB)
/// in the session whatever is queued (issue 8 §3).
pub const REPLAY_BYTES: usize = 2 * 1024 * 1024;
/// Lines in the first fetch of a replay, before line sizes are known.
pub const REPLAY_FIRST: usize = 8;
/// Above this many queued control lines the driver should stop reading until they drain.
pub const CONTROL_HIGH_WATER: usize = 16_384;
/// Most bytes of input held during [`Phase::Admission`] (the driver stops reading while
/// admission is pending, so it holds at most the rest of one read batch). Over this the
/// peer is refused with `err auth`.
pub const ADMISSION_HOLD_BYTES: usize = 8 * 1024 * 1024;
/// Most lines held during [`Phase::Admission`] (see [`ADMISSION_HOLD_BYTES`]).
pub const ADMISSION_HOLD_LINES: usize = 16_384;

/// Input received while admission was pending, replayed in order once admitted.
#[derive(Debug)]
enum HeldInput {
    Line(Vec<u8>),
    TooLarge,
    Eof,
    Cut(String),
}

/// What this side of the connection is.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// We dialed (true) or accepted (false).
    pub dialed: bool,
    /// Name for our hello.
    pub name: Option<String>,
    /// About text for our hello.
    pub about: Option<String>,
    /// Capability families for our hello (beyond chat and resume).
    pub caps: Vec<String>,
    /// Where we can be dialed back (hello `addr`).
    pub addr: Option<String>,
    /// The peer's TLS certificate key; hello.key must equal it (TLS binding).
    pub cert_key: Option<PeerKey>,
    /// The key we expect (dialing a pinned or known address); hello.key must equal it.
    pub expected_key: Option<PeerKey>,
    /// Grants issued to us, presented in our `auth.grants`: only those whose `aud` is the
    /// peer or that the peer issued (filtered once the peer's hello is in; at most 32).
    pub auth_grants: Vec<wire::Grant>,
}

/// Where the handshake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Our hello is out; waiting for the peer's hello (its first line).
    AwaitHello,
    /// Our auth is out; the peer's second line must be auth.
    AwaitAuth,
    /// Auth verified; the node's admission decision is pending ([`Session::admit`] or
    /// [`Session::refuse`]). Lines received meanwhile are held unread: nothing the peer
    /// sent after its auth is stored, acted on or acked before the peer is admitted, and
    /// held lines are dropped when it is refused.
    Admission,
    /// Authenticated: resume, content, acks.
    Open,
    /// We sent bye (or answered one): nothing else goes out; waiting for the close.
    Closing,
    /// Done: the driver writes what is queued and closes.
    Closed,
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// We sent a closing err with this code.
    SentErr { code: String, detail: String },
    /// The peer sent a closing err.
    PeerErr {
        code: String,
        detail: Option<String>,
    },
    /// Bye exchanged (either side first).
    Bye { reason: Option<String> },
    /// The peer closed the transport cleanly (EOF; on TLS after its close_notify).
    Eof,
    /// The transport ended without a clean close: a TLS stream cut without close_notify
    /// (truncation), a reset, or another read error (the detail says which).
    Truncated(String),
    /// No pong after two pings.
    Dead,
    /// Storage failed; `err internal` sent.
    Storage(String),
    /// Closed locally (replaced, shutdown, tie break).
    Local(String),
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::SentErr { code, detail } => {
                write!(f, "refused the peer: {code}: {detail}")
            }
            CloseReason::PeerErr {
                code,
                detail: Some(d),
            } => write!(f, "the peer refused: {code}: {d}"),
            CloseReason::PeerErr { code, detail: None } => write!(f, "the peer refused: {code}"),
            CloseReason::Bye { reason: Some(r) } => write!(f, "bye ({r})"),
            CloseReason::Bye { reason: None } => write!(f, "bye"),
            CloseReason::Eof => write!(f, "the peer closed the connection"),
            CloseReason::Truncated(d) => write!(f, "the connection was cut: {d}"),
            CloseReason::Dead => write!(f, "no answer to two pings"),
            CloseReason::Storage(e) => write!(f, "storage failure: {e}"),
            CloseReason::Local(r) => write!(f, "{r}"),
        }
    }
}

/// Something the node should know about.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// Auth verified: the peer is `key`. The session is now in [`Phase::Admission`]:
    /// the driver runs its admission policy and registers the connection (one per peer),
    /// then calls [`Session::admit`] or [`Session::refuse`]. Until then nothing the peer
    /// sends is acted on.
    Authenticated { key: PeerKey, hello: wire::Hello },
    /// The peer sent its first non-err line after auth: a dial counts as up now.
    Up,
    /// A content line was stored durably (seq in the log) — only after [`Session::flushed`].
    Received { seq: u64, line: Line },
    /// Our line `re` in `th` was acked.
    Acked { th: String, re: String },
    /// The peer presented grants (auth.grants or a grant line); unverified here.
    Grants(Vec<wire::Grant>),
    /// A non-closing err from the peer.
    PeerError(wire::ErrLine),
    /// An inbound blob is complete and at its final path (after a durable flush; only
    /// with a blob receiver, see [`Session::set_blob_receiver`]).
    BlobReceived(crate::blob::Completed),
    /// A line this version does not act on (grant, introduce, presence, mirror; chunk
    /// without a blob receiver …).
    Other(Line),
    /// The session ended.
    Closed(CloseReason),
}

/// The state machine of one connection.
pub struct Session {
    cfg: SessionConfig,
    identity: Arc<Identity>,
    store: Arc<Store>,
    phase: Phase,
    my_hello: Vec<u8>,
    peer_hello: Option<Vec<u8>>,
    peer: Option<PeerKey>,
    pending_hello: Option<wire::Hello>,
    /// Control lines (hello, auth, resume, ack, pong, ping, err, bye): before outbox lines.
    control: VecDeque<Vec<u8>>,
    /// Acked-kind lines received but not yet handed to the store (stored in one
    /// transaction by [`Session::commit`]).
    pending_rx: Vec<(Line, Vec<u8>)>,
    /// Signature checks of lines in `pending_rx`, made in one batch by
    /// [`Session::commit`] (issue 13: `verify_batch`, singles to find a bad line).
    pending_sigs: Vec<wire::sig::Prepared>,
    /// For each entry of `pending_sigs`, the index of its line in `pending_rx`.
    pending_sig_at: Vec<usize>,
    /// Acks received and not yet applied to the store: applied in one transaction, with
    /// the received lines by [`Session::commit`] or alone by [`Session::poll_event`].
    pending_acks: Vec<wire::Ack>,
    pending_bytes: usize,
    /// Acks waiting for the next durable flush.
    held_acks: Vec<Vec<u8>>,
    /// Events waiting for the next durable flush.
    held_events: Vec<SessionEvent>,
    events: VecDeque<SessionEvent>,
    needs_flush: bool,
    up_reported: bool,
    /// Replay: started (resume arrived or timed out), cursor = last outbox id written.
    replaying: bool,
    cursor: Option<String>,
    batch: VecDeque<crate::store::OutboxEntry>,
    outbox_maybe_more: bool,
    resume_deadline: Option<Instant>,
    last_rx: Instant,
    ping_deadline: Instant,
    pings_out: u32,
    bye_deadline: Option<Instant>,
    close: Option<CloseReason>,
    lines_in: u64,
    /// Assembles inbound blobs; without it chunks are handed out as [`SessionEvent::Other`].
    blobs: Option<crate::blob::BlobReceiver>,
    /// The lines of a commit whose blob data is being fsynced ([`Session::commit_start`]):
    /// stored by [`Session::commit_synced`], after the blob records.
    after_sync: Option<Vec<(Line, Vec<u8>)>>,
    /// The length of `held_acks` when that commit's blob fsync began: what is held after
    /// it (pongs to pings read meanwhile) goes out after the commit's acks.
    sync_mark: usize,
    /// `err blob_refused` lines for chunks taken by [`Session::prewrite_blobs`]: held with
    /// the acks of the next commit.
    prewrite_errs: Vec<Vec<u8>>,
    /// A storage failure closed the session: nothing more is stored
    /// ([`Session::fail_storage`]).
    storage_failed: bool,
    /// Input received during [`Phase::Admission`], with its byte count.
    held_input: Vec<HeldInput>,
    held_input_bytes: usize,
    /// Idle time before a ping ([`PING_IDLE`] unless set).
    ping_idle: Duration,
    /// Lines to fetch in the next replay batch (see [`REPLAY_BYTES`]).
    replay_fetch: usize,
    /// We announce `signed-lines` (our caps list it): grant lines we send get a `sig`.
    signs: bool,
    /// The peer's hello caps list `signed-lines`: its content lines must carry a valid
    /// `sig` (`spec/signed-lines.md`).
    peer_signs: bool,
}

impl Session {
    /// A new session; our hello is queued at once (§7: both sides write hello without
    /// waiting).
    pub fn new(
        cfg: SessionConfig,
        identity: Arc<Identity>,
        store: Arc<Store>,
        now: Instant,
    ) -> Session {
        let mut nonce = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
        let hello = wire::Hello {
            id: store.next_control_id(),
            ts: wire::time::format_ms(wire::time::now_ms()),
            v: 0,
            key: identity.key().to_string(),
            name: cfg.name.clone(),
            nonce: wire::b64::encode_url(&nonce),
            caps: cfg.caps.clone(),
            about: cfg.about.clone(),
            addr: cfg.addr.clone(),
            shares: None,
        };
        let signs = cfg.caps.iter().any(|c| c == wire::sig::CAP);
        let my_hello = Line::Hello(hello).encode();
        let mut control = VecDeque::new();
        control.push_back(my_hello.clone());
        Session {
            cfg,
            identity,
            store,
            phase: Phase::AwaitHello,
            my_hello,
            peer_hello: None,
            peer: None,
            pending_hello: None,
            control,
            pending_rx: Vec::new(),
            pending_sigs: Vec::new(),
            pending_sig_at: Vec::new(),
            pending_acks: Vec::new(),
            pending_bytes: 0,
            held_acks: Vec::new(),
            held_events: Vec::new(),
            events: VecDeque::new(),
            needs_flush: false,
            up_reported: false,
            replaying: false,
            cursor: None,
            batch: VecDeque::new(),
            outbox_maybe_more: true,
            resume_deadline: None,
            last_rx: now,
            ping_deadline: now + PING_IDLE,
            pings_out: 0,
            bye_deadline: None,
            close: None,
            lines_in: 0,
            blobs: None,
            after_sync: None,
            sync_mark: 0,
            prewrite_errs: Vec::new(),
            storage_failed: false,
            held_input: Vec::new(),
            held_input_bytes: 0,
            ping_idle: PING_IDLE,
            replay_fetch: REPLAY_FIRST,
            signs,
            peer_signs: false,
        }
    }

    /// Ping after `idle` without input instead of [`PING_IDLE`] (at least 1 ms); the
    /// connection is dead after [`MISSED_PONGS`] such periods more. For tests and small
    /// deployments that want a silent peer found sooner.
    pub fn set_ping_idle(&mut self, idle: Duration, now: Instant) {
        self.ping_idle = idle.max(Duration::from_millis(1));
        self.ping_deadline = now + self.ping_idle;
    }

    /// Take in blobs (protocol-notes §Blobs): chunk lines are then stored with the batch
    /// they arrive in (data fsynced and offset recorded by [`Session::commit`], before the
    /// acks of that batch go out), never acked themselves; refusals are answered with
    /// `err blob_refused` once the batch is durable.
    pub fn set_blob_receiver(&mut self, receiver: crate::blob::BlobReceiver) {
        self.blobs = Some(receiver);
    }

    /// Id of the last outbox line handed out by [`Session::poll_transmit`] on this
    /// connection (None before the replay started).
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// The handshake/connection phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The authenticated peer key (after auth).
    pub fn peer(&self) -> Option<PeerKey> {
        self.peer
    }

    /// Our hello line as sent (without `\n`).
    pub fn my_hello(&self) -> &[u8] {
        &self.my_hello
    }

    /// True once the session is over; the driver writes what [`Session::poll_transmit`]
    /// still gives, then closes the transport.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Why it closed, once closed.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.close.as_ref()
    }

    /// Whether received lines wait for [`Session::commit`] and a durable flush before
    /// their acks go out.
    pub fn wants_flush(&self) -> bool {
        self.needs_flush
    }

    /// Bytes of received lines waiting for [`Session::commit`] (the driver commits before
    /// this grows large).
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Number of received lines waiting for [`Session::commit`].
    pub fn pending_lines(&self) -> usize {
        self.pending_rx.len()
    }

    /// Whether the driver should stop reading for now: the control queue and the lines
    /// held for the running flush are over [`CONTROL_HIGH_WATER`], or admission is
    /// pending ([`Phase::Admission`]).
    pub fn backlogged(&self) -> bool {
        // Held lines count too: pongs to pings read while a flush runs wait there.
        self.phase == Phase::Admission
            || self.control.len() + self.held_acks.len() > CONTROL_HIGH_WATER
    }

    /// Lines received so far.
    pub fn lines_in(&self) -> u64 {
        self.lines_in
    }

    /// Write `line` (encoded, without `\n`) after the control lines already waiting, if the
    /// session is open; dropped otherwise. For lines that are not acked and not kept in the
    /// outbox (presence, grant). When we sign (`signed-lines` in our caps), a `grant` line
    /// (as made by [`wire::Line::encode`], `t` first) is signed here.
    pub fn send_ephemeral(&mut self, line: Vec<u8>) {
        if self.phase != Phase::Open {
            return;
        }
        let line = if self.signs && line.starts_with(br#"{"t":"grant""#) {
            match wire::sig::sign_encoded(&self.identity, &line) {
                Ok(signed) => signed,
                Err(e) => {
                    tracing::warn!("grant line not sent: {e}");
                    return;
                }
            }
        } else {
            line
        };
        self.control.push_back(line);
    }

    /// New lines were queued for this peer: fetch the outbox again.
    pub fn outbox_changed(&mut self) {
        self.outbox_maybe_more = true;
    }

    /// The transport reported a framing error (`too_large`) or I/O error / EOF.
    pub fn handle_read_error(&mut self, too_large: bool) {
        if self.phase == Phase::Admission {
            self.held_input.push(if too_large {
                HeldInput::TooLarge
            } else {
                HeldInput::Eof
            });
            return;
        }
        if too_large {
            self.close_with(code::TOO_LARGE, None, "line over 1 MiB");
        } else {
            self.finish(CloseReason::Eof);
        }
    }

    /// The transport ended without a clean close (`detail` says how: truncated TLS,
    /// reset, …). Like [`Session::handle_eof`], but the close reason is
    /// [`CloseReason::Truncated`] so that logs tell the two apart.
    pub fn handle_cut(&mut self, detail: String) {
        if self.phase == Phase::Admission {
            self.held_input.push(HeldInput::Cut(detail));
            return;
        }
        if self.phase != Phase::Closed {
            self.finish(CloseReason::Truncated(detail));
        }
    }

    /// The transport reached EOF.
    pub fn handle_eof(&mut self) {
        if self.phase == Phase::Admission {
            self.held_input.push(HeldInput::Eof);
            return;
        }
        if self.phase != Phase::Closed {
            self.finish(match self.phase {
                Phase::Closing => CloseReason::Bye { reason: None },
                _ => CloseReason::Eof,
            });
        }
    }

    /// Refuse the authenticated peer (admission policy, protocol-notes §Handshake): every
    /// line it sent after its auth is dropped unread, nothing queued goes out, then `err
    /// auth` with `detail`, and close.
    pub fn refuse(&mut self, detail: &str) {
        self.held_input.clear();
        self.held_input_bytes = 0;
        self.control.clear();
        self.close_with(code::AUTH, None, detail);
    }

    /// Admit the authenticated peer (the driver's admission policy accepted it and the
    /// connection is registered): the session opens, our `resume` goes out, and the lines
    /// the peer sent since its auth are processed in order, as if they arrived now. Does
    /// nothing outside [`Phase::Admission`].
    pub fn admit(&mut self, now: Instant) {
        if self.phase != Phase::Admission {
            return;
        }
        let Some(peer) = self.peer else { return };
        let seen = match self.store.seen(&peer) {
            Ok(s) => s,
            Err(e) => {
                self.held_input.clear();
                self.fail_storage(None, &e);
                return;
            }
        };
        self.phase = Phase::Open;
        let resume = Line::Resume(wire::Resume {
            id: self.store.next_control_id(),
            ts: now_ts(),
            seen,
        });
        self.control.push_back(resume.encode());
        self.resume_deadline = Some(now + RESUME_TIMEOUT);
        self.held_input_bytes = 0;
        for input in std::mem::take(&mut self.held_input) {
            match input {
                HeldInput::Line(l) => self.handle_line_owned(l, now),
                HeldInput::TooLarge => self.handle_read_error(true),
                HeldInput::Eof => self.handle_eof(),
                HeldInput::Cut(d) => self.handle_cut(d),
            }
        }
    }

    /// Close locally: with bye (graceful, `reason`) when open, otherwise at once. The
    /// peer's bye is awaited [`BYE_LINGER`].
    pub fn close_local(&mut self, reason: &str, send_bye: bool, now: Instant) {
        self.close_local_within(reason, send_bye, BYE_LINGER, now);
    }

    /// [`Session::close_local`], waiting at most `linger` for the peer's bye (e.g.
    /// [`SHUTDOWN_BYE_LINGER`]).
    pub fn close_local_within(
        &mut self,
        reason: &str,
        send_bye: bool,
        linger: Duration,
        now: Instant,
    ) {
        match self.phase {
            Phase::Open if send_bye => {
                let bye = Line::Bye(wire::Bye {
                    id: self.store.next_control_id(),
                    ts: now_ts(),
                    re: None,
                    reason: Some(reason.to_string()),
                });
                self.control.push_back(bye.encode());
                self.phase = Phase::Closing;
                self.bye_deadline = Some(now + linger);
                self.close = Some(CloseReason::Local(reason.to_string()));
            }
            Phase::Closed => {}
            _ => self.finish(CloseReason::Local(reason.to_string())),
        }
    }

    /// Feed one received line (without `\n`).
    pub fn handle_line(&mut self, raw: &[u8], now: Instant) {
        self.handle(std::borrow::Cow::Borrowed(raw), None, now)
    }

    /// [`Session::handle_line`] for a line the driver owns: a line that is stored keeps
    /// this buffer (no copy per received line).
    pub fn handle_line_owned(&mut self, raw: Vec<u8>, now: Instant) {
        self.handle(std::borrow::Cow::Owned(raw), None, now)
    }

    /// [`Session::handle_line_owned`] for a line parsed off the session's thread
    /// ([`preparse()`]). Its parse is used when it was made in the mode this session would
    /// use now (signature checks under this peer's key exactly when the session is open
    /// with a peer that announced `signed-lines`); otherwise the bytes are parsed again.
    pub fn handle_preparsed(&mut self, line: PreParsed, now: Instant) {
        let PreParsed {
            raw,
            signer,
            parsed,
        } = line;
        let parsed = (signer == self.signer()).then_some(parsed);
        self.handle(std::borrow::Cow::Owned(raw), parsed, now)
    }

    /// The peer's key once the session is open with a peer that signs its lines (what
    /// the driver puts in the reader's [`Signer`] slot); `None` before, or for a peer
    /// that does not sign.
    pub fn signer(&self) -> Option<PeerKey> {
        (self.peer_signs && self.phase == Phase::Open)
            .then_some(self.peer)
            .flatten()
    }

    #[allow(clippy::type_complexity)]
    fn handle(
        &mut self,
        raw: std::borrow::Cow<'_, [u8]>,
        parsed: Option<Result<(Line, Option<SigCheck>), wire::FrameError>>,
        now: Instant,
    ) {
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        if self.phase == Phase::Admission {
            // Not parsed, stored or answered before the admission decision.
            self.held_input_bytes += raw.len();
            self.held_input.push(HeldInput::Line(raw.into_owned()));
            if self.held_input_bytes > ADMISSION_HOLD_BYTES
                || self.held_input.len() > ADMISSION_HOLD_LINES
            {
                self.refuse("too much input before admission");
            }
            return;
        }
        self.lines_in += 1;
        self.last_rx = now;
        self.pings_out = 0;
        self.ping_deadline = now + self.ping_idle;
        // Chunk lines as senders emit them skip the JSON value (crate::blob::fast).
        // A signing peer's lines are parsed once for both the line and its signature check.
        let parsed = parsed.unwrap_or_else(|| match crate::blob::fast::parse_chunk(&raw) {
            Some(line) => Ok((line, None)),
            None if self.peer_signs && self.phase == Phase::Open => {
                wire::parse::parse_line_prepared(&raw).map(|(l, p)| (l, p.map(SigCheck::Ready)))
            }
            None => wire::parse_line(&raw).map(|l| (l, None)),
        });
        let (line, prepared) = match parsed {
            Ok(parsed) => parsed,
            Err(e) => {
                let (re, detail) = match &e {
                    wire::FrameError::BadFrame { id, detail } => (id.clone(), detail.clone()),
                    wire::FrameError::TooLarge { .. } => (None, e.to_string()),
                };
                self.close_with(e.code(), re, &detail);
                return;
            }
        };
        match self.phase {
            Phase::AwaitHello => self.on_hello(&raw, line, now),
            Phase::AwaitAuth => self.on_auth(line),
            Phase::Open => self.on_open_line(raw, line, prepared),
            Phase::Closing => self.on_closing_line(line),
            Phase::Admission | Phase::Closed => {}
        }
    }

    fn on_hello(&mut self, raw: &[u8], line: Line, _now: Instant) {
        let hello = match line {
            Line::Hello(h) => h,
            Line::Err(e) => {
                self.peer_err(e);
                return;
            }
            other => {
                let id = other.id().map(str::to_string);
                self.close_with(code::AUTH, id, "first line must be hello");
                return;
            }
        };
        if hello.v != 0 {
            self.close_with(
                code::VERSION,
                Some(hello.id.clone()),
                &format!("version {} not supported; this node speaks 0", hello.v),
            );
            return;
        }
        let key = match PeerKey::parse(&hello.key) {
            Ok(k) => k,
            Err(e) => {
                self.close_with(
                    code::AUTH,
                    Some(hello.id.clone()),
                    &format!("hello key: {e}"),
                );
                return;
            }
        };
        if key == self.identity.key() {
            self.close_with(
                code::AUTH,
                Some(hello.id.clone()),
                "hello carries our own key",
            );
            return;
        }
        if let Err(detail) = check_nonce(&hello.nonce) {
            self.close_with(code::AUTH, Some(hello.id.clone()), &detail);
            return;
        }
        if let Some(cert) = self.cfg.cert_key {
            if cert != key {
                self.close_with(
                    code::AUTH,
                    Some(hello.id.clone()),
                    "hello key does not match the TLS certificate key",
                );
                return;
            }
        }
        if let Some(expected) = self.cfg.expected_key {
            if expected != key {
                self.close_with(
                    code::AUTH,
                    Some(hello.id.clone()),
                    "hello key is not the key this address was dialed for",
                );
                return;
            }
        }
        self.peer = Some(key);
        self.peer_signs = hello.caps.iter().any(|c| c == wire::sig::CAP);
        self.peer_hello = Some(raw.to_vec());
        let sig = self.identity.sign(&auth_transcript(&self.my_hello, raw));
        let peer_s = key.to_string();
        let grants = self
            .cfg
            .auth_grants
            .iter()
            .filter(|g| g.aud.as_deref() == Some(peer_s.as_str()) || g.iss == peer_s)
            .take(crate::node::grants::MAX_GRANTS_PER_LINE)
            .cloned()
            .collect();
        let auth = Line::Auth(wire::Auth {
            id: self.store.next_control_id(),
            ts: now_ts(),
            sig: wire::b64::encode_url(&sig),
            grants,
        });
        self.control.push_back(auth.encode());
        self.phase = Phase::AwaitAuth;
        self.pending_hello = Some(hello);
    }

    fn on_auth(&mut self, line: Line) {
        let auth = match line {
            Line::Auth(a) => a,
            Line::Err(e) => {
                self.peer_err(e);
                return;
            }
            other => {
                let id = other.id().map(str::to_string);
                self.close_with(code::AUTH, id, "second line must be auth");
                return;
            }
        };
        let (Some(peer), Some(peer_hello)) = (self.peer, self.peer_hello.as_ref()) else {
            self.close_with(code::AUTH, Some(auth.id), "auth before hello");
            return;
        };
        let ok = match wire::b64::decode_any(&auth.sig) {
            Ok(sig) if sig.len() == 64 => {
                peer.verify(&auth_transcript(peer_hello, &self.my_hello), &sig)
            }
            _ => false,
        };
        if !ok {
            self.close_with(code::AUTH, Some(auth.id), "bad auth signature");
            return;
        }
        let Some(hello) = self.pending_hello.take() else {
            self.close_with(code::AUTH, Some(auth.id), "auth before hello");
            return;
        };
        // The handshake is not over until the node decided admission: no resume yet, and
        // whatever follows is held (see Phase::Admission).
        self.phase = Phase::Admission;
        // Grants first: admission (on Authenticated) may depend on them.
        if !auth.grants.is_empty() {
            self.events.push_back(SessionEvent::Grants(auth.grants));
        }
        self.events
            .push_back(SessionEvent::Authenticated { key: peer, hello });
    }

    /// `check`: the line's signature check from its parse, when made there (made ready,
    /// or already verified under this peer's key).
    fn on_open_line(
        &mut self,
        raw: std::borrow::Cow<'_, [u8]>,
        line: Line,
        check: Option<SigCheck>,
    ) {
        let Some(peer) = self.peer else { return };
        if !self.up_reported && !matches!(line, Line::Err(_)) {
            self.up_reported = true;
            self.events.push_back(SessionEvent::Up);
        }
        if self.peer_signs && wire::sig::is_signed_kind(line.kind()) {
            // spec/signed-lines.md: refused like a bad auth, never stored nor acked. Lines
            // that wait for the commit (msg, state) have their Ed25519 check made there, in
            // one batch (`Session::commit`); the rest of the checks are made now.
            let deferred = matches!(line, Line::Msg(_) | Line::State(_))
                && line.id().is_some()
                && line.th().is_some();
            let checked = match check {
                Some(SigCheck::Done(verified)) => verified,
                check => {
                    let prepared = match check {
                        Some(SigCheck::Ready(p)) => p,
                        _ => wire::sig::prepare_line(&raw),
                    };
                    match prepared {
                        Ok(p) if deferred => {
                            self.pending_sig_at.push(self.pending_rx.len());
                            self.pending_sigs.push(p);
                            Ok(())
                        }
                        Ok(p) => p.verify(&peer),
                        Err(e) => Err(e),
                    }
                }
            };
            if let Err(e) = checked {
                let id = line.id().map(str::to_string);
                self.close_with(code::AUTH, id, &format!("{} line: {e}", line.kind()));
                return;
            }
        }
        match line {
            Line::Resume(r) => {
                if let Err(e) = self.store.drop_seen(&peer, &r.seen) {
                    self.fail_storage(Some(r.id), &e);
                    return;
                }
                self.start_replay();
            }
            Line::Msg(_) | Line::State(_) | Line::Mirror(_) | Line::Private(_) => {
                self.receive_acked(line, raw);
            }
            // Applied with the batch (one transaction; see `pending_acks`).
            Line::Ack(a) => self.pending_acks.push(a),
            Line::Ping(p) => {
                let pong = Line::Pong(wire::Pong {
                    id: self.store.next_control_id(),
                    ts: now_ts(),
                    re: p.id,
                });
                // A ping read while the driver flushes a committed batch (or fsyncs its blob
                // data) is answered after that batch's acks, as when the flush held up
                // reading.
                if self.held_acks.is_empty() && self.after_sync.is_none() {
                    self.control.push_back(pong.encode());
                } else {
                    self.held_acks.push(pong.encode());
                }
            }
            Line::Pong(_) => {}
            Line::Bye(b) => {
                let bye = Line::Bye(wire::Bye {
                    id: self.store.next_control_id(),
                    ts: now_ts(),
                    re: Some(b.id),
                    reason: None,
                });
                self.control.push_back(bye.encode());
                if let Err(e) = self.store.set_parked(&peer, crate::store::Park::PeerBye) {
                    tracing::warn!("could not park peer {peer}: {e}");
                }
                self.finish(CloseReason::Bye { reason: b.reason });
            }
            Line::Err(e) => self.peer_err(e),
            Line::Grant(g) => self.events.push_back(SessionEvent::Grants(vec![g.grant])),
            Line::Hello(_) | Line::Auth(_) => {
                tracing::debug!("ignoring a repeated handshake line from {peer}");
            }
            Line::Unknown { .. } => {}
            Line::Chunk(_) if self.blobs.is_some() => {
                self.pending_bytes += raw.len();
                // Chunks go to the blob receiver, never to the log: no copy of the raw line.
                self.pending_rx.push((line, Vec::new()));
                self.needs_flush = true;
            }
            other @ (Line::Chunk(_) | Line::Introduce(_) | Line::Presence(_)) => {
                self.events.push_back(SessionEvent::Other(other));
            }
        }
    }

    fn on_closing_line(&mut self, line: Line) {
        // After our bye we send nothing else; the peer's bye (or EOF) ends it.
        match line {
            Line::Bye(b) => {
                let reason = match self.close.take() {
                    Some(CloseReason::Local(r)) => Some(r),
                    _ => b.reason,
                };
                self.finish(CloseReason::Bye { reason });
            }
            Line::Err(e) if code::closes(&e.code) => self.peer_err(e),
            _ => {}
        }
    }

    fn receive_acked(&mut self, line: Line, raw: std::borrow::Cow<'_, [u8]>) {
        if line.id().is_none() || line.th().is_none() {
            return;
        }
        self.pending_bytes += raw.len();
        self.pending_rx.push((line, raw.into_owned()));
        self.needs_flush = true;
    }

    fn start_replay(&mut self) {
        self.replaying = true;
        self.resume_deadline = None;
        self.cursor = None;
        self.batch.clear();
        self.outbox_maybe_more = true;
    }

    fn peer_err(&mut self, e: wire::ErrLine) {
        if e.code == code::BLOB_REFUSED {
            self.blob_refused(e.blob_ref.as_deref());
        }
        if code::closes(&e.code) {
            self.finish(CloseReason::PeerErr {
                code: e.code,
                detail: e.detail,
            });
        } else {
            self.events.push_back(SessionEvent::PeerError(e));
        }
    }

    /// The peer refused one of our blobs: drop its chunks still queued (in the store and
    /// in the batch fetched for writing) so none of them go out again.
    fn blob_refused(&mut self, blob_ref: Option<&str>) {
        let (Some(peer), Some(r)) = (self.peer, blob_ref) else {
            return;
        };
        match self.store.drop_blob_chunks(&peer, r) {
            Ok(dropped) => {
                if !dropped.is_empty() {
                    tracing::info!(%peer, blob_ref = r, chunks = dropped.len(), "peer refused a blob: dropped its queued chunks");
                    let gone: std::collections::HashSet<&str> =
                        dropped.iter().map(String::as_str).collect();
                    self.batch.retain(|e| !gone.contains(e.id.as_str()));
                }
            }
            Err(e) => tracing::warn!(%peer, "could not drop the chunks of a refused blob: {e}"),
        }
    }

    fn fail_storage(&mut self, re: Option<String>, err: &StoreError) {
        tracing::error!("storage failure: {err}");
        self.held_acks.clear();
        self.held_events.clear();
        // Nothing more is stored from this session: lines read after the failed one
        // would raise seen past it (the peer would drop it from its outbox unacked), and
        // chunk data written since is not known to be on disk.
        self.storage_failed = true;
        self.pending_rx.clear();
        self.pending_sigs.clear();
        self.pending_sig_at.clear();
        self.pending_bytes = 0;
        self.prewrite_errs.clear();
        self.after_sync = None;
        if let Some(b) = self.blobs.as_mut() {
            b.abort_sync();
        }
        let line = Line::Err(wire::ErrLine {
            id: self.store.next_control_id(),
            ts: now_ts(),
            th: None,
            re,
            code: code::INTERNAL.into(),
            detail: Some("storage failure".into()),
            blob_ref: None,
        });
        self.control.push_back(line.encode());
        self.finish(CloseReason::Storage(err.to_string()));
    }

    /// Queue a closing err and end the session.
    fn close_with(&mut self, code_: &str, re: Option<String>, detail: &str) {
        let line = Line::Err(wire::ErrLine {
            id: self.store.next_control_id(),
            ts: now_ts(),
            th: None,
            re,
            code: code_.into(),
            detail: Some(detail.into()),
            blob_ref: None,
        });
        // Nothing held may go out after a closing err.
        self.held_acks.clear();
        self.control.push_back(line.encode());
        self.finish(CloseReason::SentErr {
            code: code_.into(),
            detail: detail.into(),
        });
    }

    fn finish(&mut self, reason: CloseReason) {
        if self.phase == Phase::Closed {
            return;
        }
        self.phase = Phase::Closed;
        self.replaying = false;
        self.batch.clear();
        // Input held for an admission that will not happen is never read.
        self.held_input.clear();
        self.held_input_bytes = 0;
        // Nothing goes out after a closing line: acks not yet sent are dropped (the peer
        // replays, we dedup). Held events still come out at the next flush.
        self.held_acks.clear();
        self.close = Some(reason.clone());
        self.events.push_back(SessionEvent::Closed(reason));
    }

    /// Timers: resume timeout, ping, dead connection, bye linger.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Open => {
                if let Some(d) = self.resume_deadline {
                    if now >= d {
                        tracing::debug!("no resume within 15 s: replaying anyway");
                        self.start_replay();
                    }
                }
                if now >= self.ping_deadline {
                    if self.pings_out >= MISSED_PONGS {
                        self.finish(CloseReason::Dead);
                        return;
                    }
                    self.pings_out += 1;
                    let ping = Line::Ping(wire::Ping {
                        id: self.store.next_control_id(),
                        ts: now_ts(),
                    });
                    self.control.push_back(ping.encode());
                    self.ping_deadline = now + self.ping_idle;
                }
            }
            Phase::Closing if self.bye_deadline.is_some_and(|d| now >= d) => {
                let reason = match self.close.take() {
                    Some(CloseReason::Local(r)) => Some(r),
                    _ => None,
                };
                self.finish(CloseReason::Bye { reason });
            }
            _ => {}
        }
    }

    /// The next instant [`Session::handle_timeout`] wants to run (None when closed).
    /// The handshake timeout (30 s) is the driver's: it covers the transport handshake too.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Open => Some(match self.resume_deadline {
                Some(d) => d.min(self.ping_deadline),
                None => self.ping_deadline,
            }),
            Phase::Closing => self.bye_deadline,
            _ => None,
        }
    }

    /// Next event for the node.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        if self.pending_rx.is_empty() {
            // No lines to commit them with: the acks of the batch read go in alone.
            self.apply_acks();
        }
        let ev = self.events.pop_front();
        if ev.is_none() && self.events.capacity() > 0 {
            // Events are large (an `Authenticated` holds the whole hello): an idle
            // connection keeps no queue grown by its handshake or its last batch (a busy
            // one allocates it again per batch; issue 10, relay memory per connection).
            self.events = VecDeque::new();
        }
        ev
    }

    /// Next line to write (without `\n`): control lines first, then outbox replay and new
    /// outbox lines, in id order. Returns None when there is nothing to write now.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        if let Some(line) = self.control.pop_front() {
            return Some(line);
        }
        if self.phase != Phase::Open || !self.replaying {
            return None;
        }
        if self.batch.is_empty() && self.outbox_maybe_more {
            let peer = self.peer?;
            let want = self.replay_fetch.clamp(1, REPLAY_BATCH);
            match self.store.outbox_after(&peer, self.cursor.as_deref(), want) {
                Ok(batch) => {
                    self.outbox_maybe_more = batch.len() == want;
                    let bytes: usize = batch.iter().map(|e| e.line.len()).sum();
                    if !batch.is_empty() {
                        let avg = (bytes / batch.len()).max(1);
                        self.replay_fetch = (REPLAY_BYTES / avg).clamp(1, REPLAY_BATCH);
                    }
                    self.batch = batch.into();
                }
                Err(e) => {
                    self.fail_storage(None, &e);
                    return self.control.pop_front();
                }
            }
        }
        let entry = self.batch.pop_front()?;
        self.cursor = Some(entry.id.clone());
        let chunk = entry.kind == "chunk";
        // Chunks of a streamed blob get their data from the source file now.
        let line = match crate::blob::stream::fill(&self.store, &self.peer?, entry) {
            crate::blob::stream::Fill::Line(l) => l,
            crate::blob::stream::Fill::Stopped { dropped, entry } => {
                self.blob_stopped(dropped, entry);
                return self.poll_transmit();
            }
            crate::blob::stream::Fill::Failed(e) => {
                self.fail_storage(None, &e);
                return self.control.pop_front();
            }
        };
        // Lines queued before signing was on get their `sig` now (spec/signed-lines.md);
        // chunks are never signed (and a 1 MiB chunk is not parsed to find that out).
        if self.signs && !chunk {
            return Some(self.store.sign_unsigned(line));
        }
        Some(line)
    }

    /// A streamed blob was stopped (its source changed): the lines it dropped from the
    /// outbox leave the fetched batch too, and the refusal stored in the thread is news.
    fn blob_stopped(&mut self, dropped: Vec<String>, entry: Option<crate::store::LogEntry>) {
        let gone: std::collections::HashSet<&str> = dropped.iter().map(String::as_str).collect();
        self.batch.retain(|e| !gone.contains(e.id.as_str()));
        if let Some(e) = entry {
            if let Ok(line) = wire::parse_line(&e.line) {
                self.events
                    .push_back(SessionEvent::Received { seq: e.seq, line });
            }
        }
    }
}

/// At most one "same id, other content" warning per peer in this period.
pub const CHANGED_DUPLICATE_WARN_EVERY: Duration = Duration::from_secs(60);

/// Whether a "same id, other content" warning about `peer` may be logged at `now` (and if
/// so, note it). Process-wide, so that reconnecting does not reset it; entries older than
/// the period are dropped, so the table holds only peers warned about in the last minute.
fn changed_duplicate_warn_due(peer: &PeerKey, now: Instant) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static WARNED: OnceLock<Mutex<HashMap<PeerKey, Instant>>> = OnceLock::new();
    let mut warned = WARNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    warned.retain(|_, at| now.saturating_duration_since(*at) < CHANGED_DUPLICATE_WARN_EVERY);
    if warned.contains_key(peer) {
        return false;
    }
    warned.insert(*peer, now);
    true
}

/// Bytes in a hello nonce (protocol-notes §Handshake).
pub const HELLO_NONCE_LEN: usize = 32;

/// A hello `nonce` is exactly [`HELLO_NONCE_LEN`] bytes in canonical base64url (no
/// padding, url alphabet, zero trailing bits: the form encoders emit, issue 8 §4b);
/// anything else is refused with a detail for `err auth`.
pub fn check_nonce(nonce: &str) -> Result<(), String> {
    match wire::b64::decode_canonical_url(nonce) {
        Ok(n) if n.len() == HELLO_NONCE_LEN => Ok(()),
        Ok(n) => Err(format!(
            "hello nonce is {} bytes, not {HELLO_NONCE_LEN}",
            n.len()
        )),
        Err(_) => Err("hello nonce is not canonical unpadded base64url".into()),
    }
}

fn now_ts() -> String {
    wire::time::format_ms(wire::time::now_ms())
}
