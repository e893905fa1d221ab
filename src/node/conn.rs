//! Drives one session over one transport connection.
//!
//! A reader task frames lines into a bounded channel (a relay's connections read in this
//! loop instead); this loop writes batches of lines (one at a time, polled beside
//! everything else), feeds the session, runs group-committed flushes before acks go out,
//! fires timers, and turns session events into node events. A flush runs while the loop
//! keeps reading and parsing the next lines (they are committed once it is done), so the
//! fsync of one batch overlaps the work on the next; the acks of a batch go out together.
//! One connection per peer is enforced at registration (protocol-notes §Threads, acks, resume: replacement and
//! simultaneous-open tie break).

mod io;
mod registry;

use super::ephemeral::Ephemeral;
use super::Inner;
use crate::blob::BlobError;
use crate::net;
use crate::session::{CloseReason, Phase, Session, SessionConfig, SessionEvent};
use crate::store::AddrSource;
use crate::wire::{self, Line, PeerKey};
use io::{
    fill_pending, finish_writes, in_write, push_line, start_write, ReadBatch, ReadEnd, ReadSide,
    Write, WRITE_BATCH,
};
use registry::{on_authenticated, register, set_up, unregister, MAX_NAME};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Received bytes the session may hold before a commit and flush.
const COMMIT_BYTES: usize = 4 * 1024 * 1024;
/// Lines fed to the session before one group-committed flush.
const READ_BATCH: usize = 4096;
/// After a write error, keep reading this long for the peer's closing err (§Errors).
const ERROR_LINGER: Duration = Duration::from_millis(500);

/// What other tasks use to reach a live connection: one allocation per connection
/// (issue 10: relay memory per connection), shared by the connection and the node's
/// table of connections.
#[derive(Clone)]
pub(crate) struct Handles(Arc<Shared>);

/// The state behind [`Handles`].
pub(crate) struct Shared {
    /// Wakes the connection when new lines were queued in the outbox for its peer.
    pub outbox: Notify,
    /// Lines to write that are not in the outbox (see [`super::Inner::send_ephemeral`]).
    pub ephemeral: Ephemeral,
    /// Id of the last outbox line written to this connection (blob progress).
    pub cursor: std::sync::Mutex<Option<String>>,
    /// Wakes the connection for [`Handles::stop`] or [`Handles::bye`].
    signal: Notify,
    /// [`Handles::stop`] was called.
    stop: AtomicBool,
    /// [`Handles::bye`] was called: Some(reason) until the connection takes it.
    bye: std::sync::Mutex<Option<String>>,
    /// The connection has ended; `ended` wakes those waiting for that.
    done: AtomicBool,
    ended: Notify,
}

impl std::ops::Deref for Handles {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Handles {
    fn new() -> Handles {
        Handles(Arc::new(Shared {
            outbox: Notify::new(),
            ephemeral: Ephemeral::new(),
            cursor: std::sync::Mutex::new(None),
            signal: Notify::new(),
            stop: AtomicBool::new(false),
            bye: std::sync::Mutex::new(None),
            done: AtomicBool::new(false),
            ended: Notify::new(),
        }))
    }

    /// Stop the connection without a `bye` (replaced by a newer one, tie break).
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::Release);
        self.0.signal.notify_one();
    }

    /// Close the connection with a `bye` carrying `reason` (`awp disconnect`).
    pub fn bye(&self, reason: String) {
        *self.0.bye.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.0.signal.notify_one();
    }

    /// Wait until the connection has ended (returns at once if it has).
    pub async fn closed(&self) {
        loop {
            let ended = self.0.ended.notified();
            tokio::pin!(ended);
            // Registered before the check: a wake-up between the two is not lost.
            ended.as_mut().enable();
            if self.0.done.load(Ordering::Acquire) {
                return;
            }
            ended.await;
        }
    }

    /// Mark the connection ended and wake those waiting in [`Handles::closed`].
    fn set_done(&self) {
        self.0.done.store(true, Ordering::Release);
        self.0.ended.notify_waiters();
    }
}

/// How the connection came about.
#[derive(Debug, Clone)]
pub enum Dial {
    /// Accepted by a listener; holds a slot of the node's handshake limit until auth is
    /// verified (or the connection ends).
    Inbound(Option<Arc<super::handshakes::HandshakeSlot>>),
    /// We dialed `address`; `expected` is the key we dialed for, if known.
    Outbound {
        address: String,
        expected: Option<PeerKey>,
        source: AddrSource,
    },
    /// We dialed `expected` at an address punched for a direct upgrade of a circuit
    /// (spec/relay-circuits.md): the address is a NAT mapping of the peer's circuit socket,
    /// not a listener, so it is never recorded among the peer's addresses.
    Punched { expected: PeerKey },
}

/// Work of a session event that awaits, done once the event itself is dropped.
enum Deferred {
    /// An authenticated peer that passed admission: register the connection.
    Register {
        key: PeerKey,
        hello: Box<wire::Hello>,
        presented: Vec<wire::Grant>,
        presence: bool,
    },
    /// An err from a registered peer ([`super::refusals::on_peer_err`]).
    PeerErr(PeerKey, Box<wire::ErrLine>),
}

/// What happened to a connection, for the dialer and `awp connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The authenticated peer, if the handshake got that far.
    pub peer: Option<PeerKey>,
    /// The peer sent its first non-err line after auth.
    pub up: bool,
    /// Why it ended.
    pub reason: String,
}

/// Run a connection to completion. `handshake_deadline` bounds the time to auth verified.
/// `up_tx` (if given) learns the peer as soon as the connection counts as up (or the failure).
pub fn run(
    inner: Arc<Inner>,
    conn: net::Conn,
    dial: Dial,
    handshake_deadline: tokio::time::Instant,
) -> impl std::future::Future<Output = Outcome> + Send {
    run_with(inner, conn, dial, handshake_deadline, None)
}

/// What `awp connect` learns from [`run_with`]: the peer once the connection is up, or why
/// it failed with the key it was with (authenticated, or the one dialed for), if known.
pub type UpResult = Result<PeerKey, (String, Option<PeerKey>)>;

/// [`run`], reporting the moment the connection is up (or fails) on `up_tx`.
pub fn run_with(
    inner: Arc<Inner>,
    conn: net::Conn,
    dial: Dial,
    handshake_deadline: tokio::time::Instant,
    mut up_tx: Option<tokio::sync::oneshot::Sender<UpResult>>,
) -> impl std::future::Future<Output = Outcome> + Send {
    let net::Conn {
        reader,
        writer,
        peer_cert_key,
        transport: _,
        remote,
    } = conn;
    let (dialed, expected, dial_addr, mut handshake_slot) = match dial {
        Dial::Inbound(slot) => (false, None, None, slot),
        Dial::Outbound {
            address,
            expected,
            source,
        } => (true, expected, Some((address, source)), None),
        Dial::Punched { expected } => (true, Some(expected), None, None),
    };
    let cfg = SessionConfig {
        dialed,
        name: Some(inner.name.clone()),
        about: inner.about.clone(),
        // A relay keeps no files: it does not announce blobs.
        caps: super::CAPS
            .iter()
            .filter(|c| !(inner.relay && **c == super::BLOB_CAP))
            .chain(inner.store.signs_lines().then_some(&crate::wire::sig::CAP))
            .map(|s| s.to_string())
            .collect(),
        addr: inner.addresses().first().map(|a| a.to_string()),
        cert_key: peer_cert_key,
        expected_key: expected,
        auth_grants: super::grants::held_for_auth(&inner),
    };
    let mut session = Session::new(
        cfg,
        inner.identity.clone(),
        inner.store.clone(),
        Instant::now(),
    );
    session.set_ping_idle(inner.ping_idle, Instant::now());
    if !inner.relay {
        session.set_blob_receiver(crate::blob::BlobReceiver::new(
            inner.store.clone(),
            inner.home.join(super::BLOBS_DIR),
            inner.blob_limit,
        ));
    }

    // The read side: lines framed and handed over in batches (one await per batch),
    // parsed, and for a signing peer with their signatures checked in one batch.
    let signer: crate::session::Signer = Default::default();
    let mut read_side = ReadSide::new(reader, &signer, !inner.relay);
    // Writes run one batch at a time ([`start_write`]), inside this task (a large batch in
    // a task of its own while it lasts): no writer task, channel or error watch per
    // connection (issue 10: relay memory per connection). The batch being written is
    // polled beside reading, so a peer that does not read never stops this side from
    // reading.
    let mut writer: Option<net::BoxWriter> = Some(writer);
    let mut writing: Option<Write> = None;

    let handles = Handles::new();
    let conn_id = inner.conn_id();
    let mut registered: Option<PeerKey> = None;
    let mut peer_name: Option<String> = None;
    let mut auth_grants: Vec<wire::Grant> = Vec::new();
    let mut up = false;
    let mut pending: Vec<u8> = Vec::new();
    let mut write_failed = false;
    // Errs of this peer that named none of our lines (see refusals::MAX_ERR_MISSES).
    let mut err_misses = 0u32;
    // The flush of the last committed batch, while it runs (at most one at a time: a
    // batch is committed only after the previous flush completed, so each flush holds
    // every line whose ack it releases).
    let mut flight: Option<Flight> = None;
    // The loop ends once the running flush (if any) has completed.
    let mut ending = false;

    // Everything above ran when the connection was handed over; the future holds only
    // what the loop uses, not also the arguments it was made from (issue 10: an idle
    // connection's memory).
    async move {
        loop {
            // Handle events first: they may refuse the peer before anything queued goes out.
            loop {
                // What needs an await is done after the event's own storage ends: a
                // `SessionEvent` is 392 bytes, and one held across an await would sit in
                // the connection's future for its whole life (issue 10).
                let mut deferred: Option<Deferred> = None;
                {
                    let Some(ev) = session.poll_event() else {
                        break;
                    };
                    match ev {
                        SessionEvent::Authenticated { key, hello } => {
                            // The handshake is over: free its slot for the next inbound one.
                            drop(handshake_slot.take());
                            if session.phase() != Phase::Admission {
                                // Closed meanwhile (e.g. too much input before admission).
                                continue;
                            }
                            let presented = std::mem::take(&mut auth_grants);
                            if let Err(detail) =
                                super::grants::admit(&inner, &key, dialed, &presented)
                            {
                                tracing::warn!(peer = %key, %remote, "admission refused: {detail}");
                                // Drops everything the peer sent after its auth, unread.
                                session.refuse(&detail);
                                continue;
                            }
                            let presence = hello.caps.iter().any(|c| c == super::presence::CAP);
                            deferred = Some(Deferred::Register {
                                key,
                                hello: Box::new(hello),
                                presented,
                                presence,
                            });
                        }
                        SessionEvent::Up => {
                            up = true;
                            if let Some(key) = registered {
                                if let Some((addr, _)) = &dial_addr {
                                    let _ = inner.store.address_result(
                                        &key,
                                        addr,
                                        Ok(()),
                                        wire::time::now_ms(),
                                    );
                                }
                                set_up(&inner, &key);
                                for line in super::presence::greeting(&inner, &key) {
                                    session.send_ephemeral(line);
                                }
                                // Grants are not acked: ours go again after every resume.
                                for line in super::grants::issued_lines(&inner, &key) {
                                    session.send_ephemeral(line);
                                }
                                inner.emit(json!({
                                    "event": "peer_up",
                                    "peer": key.to_string(),
                                    "peer_name": inner.peer_name(&key),
                                    "remote": remote,
                                    "dialed": dialed,
                                }));
                                if let Some(tx) = up_tx.take() {
                                    let _ = tx.send(Ok(key));
                                }
                            }
                        }
                        SessionEvent::Received { seq, line } => {
                            if let Some(key) = registered {
                                // A served request (durable and acked by now), if it is one.
                                super::serve::on_msg(&inner, key, &line);
                                // The node answers a request itself (result or err): it is not
                                // left unread for a later `read` or `wait` on this node.
                                super::refusals::mark_answered(&inner, seq, &line);
                                // An artifact command's reply was queued with it: send it now.
                                super::artifacts::on_received(&inner, key, &line);
                                // Built only when someone reads it (tail, wait, listen; see
                                // conn_events.rs).
                                inner.emit_lazy(super::conn_events::QUIET_LINE, || {
                                    line_event(seq, "in", &key, peer_name.as_deref(), &line)
                                });
                            }
                        }
                        SessionEvent::Acked { th, re } => {
                            if let Some(key) = registered {
                                inner.emit_lazy(
                                super::conn_events::QUIET_ACK,
                                || json!({"event":"ack","peer":key.to_string(),"th":th,"re":re}),
                            );
                            }
                        }
                        SessionEvent::Grants(g) => match registered {
                            // A grant line from an admitted peer.
                            Some(peer) => super::grants::on_received(&inner, &peer, g),
                            // auth.grants: judged with admission, stored only after it.
                            None => auth_grants = g,
                        },
                        SessionEvent::PeerError(e) => {
                            tracing::info!(peer = ?registered, code = %e.code, detail = ?e.detail, re = ?e.re, "peer sent err");
                            inner.emit(json!({"event":"peer_err","peer":registered.map(|k| k.to_string()),"code":e.code,"detail":e.detail,"re":e.re}));
                            if let Some(key) = registered {
                                deferred = Some(Deferred::PeerErr(key, Box::new(e)));
                            }
                        }
                        SessionEvent::BlobReceived(b) => {
                            tracing::info!(peer = %b.peer, path = %b.path.display(), size = b.size, "blob received");
                            inner.emit(json!({
                                "event": "blob",
                                "dir": "in",
                                "peer": b.peer.to_string(),
                                "peer_name": peer_name,
                                "ref": b.blob_ref,
                                "th": b.th,
                                "msg": b.msg_id,
                                "name": b.name,
                                "mime": b.mime,
                                "size": b.size,
                                "sha256": b.sha256,
                                "path": b.path.display().to_string(),
                            }));
                        }
                        SessionEvent::Other(Line::Presence(p)) => {
                            if let Some(key) = registered {
                                super::presence::received(&inner, key, p);
                            }
                        }
                        SessionEvent::Other(Line::Introduce(i)) => {
                            if let Some(key) = registered {
                                super::grants::on_introduce(&inner, &key, i);
                            }
                        }
                        SessionEvent::Other(line) => {
                            tracing::debug!(t = line.kind(), "line not acted on by this version");
                        }
                        SessionEvent::Closed(reason) => {
                            log_close(&remote, registered.as_ref(), &reason);
                        }
                    }
                }
                match deferred {
                    None => {}
                    Some(Deferred::Register {
                        key,
                        hello,
                        presented,
                        presence,
                    }) => {
                        // Boxed, as the other rare await below: the connection's future
                        // holds the state of its common awaits only (issue 10).
                        let registering = Box::pin(register(
                            &inner, key, conn_id, dialed, &remote, &handles, presence,
                        ));
                        match registering.await {
                            true => {
                                registered = Some(key);
                                // Admitted: now the grants of its auth line are worth storing.
                                super::grants::on_received(&inner, &key, presented);
                                peer_name = hello
                                    .name
                                    .as_deref()
                                    .map(|n| crate::blob::cut(n, MAX_NAME).to_string());
                                on_authenticated(&inner, key, &hello, dial_addr.as_ref());
                                // Only now does the session act on what the peer sent after auth.
                                session.admit(Instant::now());
                            }
                            false => {
                                session.close_local("simultaneous open", false, Instant::now())
                            }
                        }
                    }
                    Some(Deferred::PeerErr(key, e)) => {
                        let name = peer_name.as_deref();
                        Box::pin(super::refusals::on_peer_err(
                            &inner,
                            &key,
                            name,
                            &e,
                            &mut err_misses,
                        ))
                        .await;
                    }
                }
            }
            // A connection told to stop (replaced by a newer one) or a node shutting down
            // starts no new commit: the select below then sees the stop with no flush
            // running (what it reads meanwhile is not acked; the peer sends it again). A
            // peer that kept sending would otherwise give every flush a successor, and
            // the stop would wait for a pause that never comes.
            let stopping = handles.stop.load(Ordering::Acquire) || inner.shutdown.is_cancelled();
            if session.wants_flush() && flight.is_none() && !ending && !stopping {
                // Lines received so far (also those held during admission, processed by
                // `admit`): stored now, acked when their flush completes.
                flight = Some(commit_and_flush(&inner, &mut session));
            }
            if session.is_closed() || ending {
                // What a running flush makes durable is still acted on (events) before the end.
                if flight.is_none() {
                    break;
                }
                let res = in_flight(&mut flight).await;
                flight = landed(&inner, &mut session, res);
                continue;
            }
            // Fill the pending write batch; once its write runs, the next one (prepared
            // while a large write runs in its own task: `start_write`).
            fill_pending(&mut session, &mut pending);
            if writing.is_none() && !pending.is_empty() {
                if let Some(w) = writer.take() {
                    writing = Some(start_write(w, std::mem::take(&mut pending)));
                    fill_pending(&mut session, &mut pending);
                }
            }
            if signer.get().is_none() {
                if let Some(key) = session.signer() {
                    // Open with a signing peer: from now on the reader checks signatures.
                    let _ = signer.set(key);
                }
            }
            if let Some(c) = session.cursor() {
                let mut shared = handles.cursor.lock().unwrap_or_else(|p| p.into_inner());
                if shared.as_deref() != Some(c) {
                    *shared = Some(c.to_string());
                }
            }
            if !up
                && session.phase() != Phase::Open
                && tokio::time::Instant::now() >= handshake_deadline
            {
                session.close_local("handshake timeout", false, Instant::now());
                continue;
            }
            let timeout = session.poll_timeout().map(tokio::time::Instant::from_std);
            let hs_deadline = (session.phase() != Phase::Open && !up).then_some(handshake_deadline);
            let wake = match (timeout, hs_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                // A running flush completes first (its acks go out before any bye), as when
                // the flush was awaited in line.
                // Stop or bye, asked for by another task.
                _ = handles.signal.notified(), if flight.is_none() => {
                    if handles.stop.load(Ordering::Acquire) {
                        session.close_local("replaced by a newer connection", false, Instant::now());
                    } else if session.phase() != Phase::Closing {
                        let reason = handles.bye.lock().unwrap_or_else(|p| p.into_inner()).take();
                        if let Some(reason) = reason {
                            session.close_local(&reason, true, Instant::now());
                        }
                    }
                }
                _ = inner.shutdown.cancelled(), if session.phase() != Phase::Closing && flight.is_none() => {
                    // A short linger: the transport must be closed (TLS close_notify) before
                    // the node stops waiting for its connections.
                    session.close_local_within(
                        "shutdown",
                        true,
                        crate::session::SHUTDOWN_BYE_LINGER,
                        Instant::now(),
                    );
                }
                (w, res) = in_write(&mut writing) => {
                    writing = None;
                    match (w, res) {
                        (Some(w), Ok(())) => writer = Some(w),
                        _ => {
                            write_failed = true;
                            if flight.is_none() {
                                break;
                            }
                            ending = true;
                        }
                    }
                }
                res = in_flight(&mut flight) => {
                    flight = landed(&inner, &mut session, res);
                }
                // While a flush runs, the next lines are read and parsed up to the commit size.
                batch = read_side.recv(&signer), if !(session.backlogged()
                    || (flight.is_some() && session.pending_bytes() >= COMMIT_BYTES)) => {
                    let now = Instant::now();
                    let mut next = Some(batch.map_or(ReadBatch { lines: Vec::new(), end: Some(ReadEnd::Eof) }, |b| *b));
                    let mut n = 0;
                    while let Some(batch) = next.take() {
                        n += batch.lines.len() + usize::from(batch.end.is_some());
                        for line in batch.lines {
                            session.handle_preparsed(line, now);
                        }
                        match batch.end {
                            Some(ReadEnd::TooLarge) => session.handle_read_error(true),
                            Some(ReadEnd::Eof) => session.handle_eof(),
                            Some(ReadEnd::Cut(d)) => session.handle_cut(d),
                            None => {}
                        }
                        if session.is_closed()
                            || n >= READ_BATCH
                            || session.backlogged()
                            || session.pending_bytes() >= COMMIT_BYTES
                        {
                            break;
                        }
                        next = read_side.try_recv().map(|b| *b);
                    }
                    let stopping =
                        handles.stop.load(Ordering::Acquire) || inner.shutdown.is_cancelled();
                    if session.wants_flush() && flight.is_none() && !stopping {
                        flight = Some(commit_and_flush(&inner, &mut session));
                    } else if flight.is_some() && !stopping {
                        // Write the chunks read so far while the commit's fsyncs run (not
                        // on a connection told to stop: a newer one may be writing the same
                        // partial files).
                        session.prewrite_blobs();
                    }
                }
                _ = handles.outbox.notified(), if registered.is_some() => session.outbox_changed(),
                // Taken only while the write batch has room: a peer that does not read
                // leaves its lines in the bounded queue (later ones are dropped) instead of
                // the session's control queue, which has no bound.
                line = handles.ephemeral.recv(), if pending.len() < WRITE_BATCH => session.send_ephemeral(line),
                _ = sleep_until(wake) => session.handle_timeout(Instant::now()),
            }
        }

        // Acks read but not applied yet (their batch's lines were never committed).
        session.apply_acks();
        // Final writes (closing err, bye), then close.
        while let Some(l) = session.poll_transmit() {
            push_line(&mut pending, l);
        }
        if write_failed {
            // Give a closing err from the peer a chance to be read and logged.
            let _ = tokio::time::timeout(ERROR_LINGER, async {
            while let Some(batch) = read_side.recv(&signer).await {
                for l in batch.lines {
                    if let Ok(Line::Err(e)) = wire::parse_line(l.raw()) {
                        tracing::info!(code = %e.code, detail = ?e.detail, "peer's err before close");
                    }
                }
            }
        })
        .await;
        }
        if !write_failed {
            // The batch being written, what is left, then TLS close_notify.
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                finish_writes(writing, writer, pending),
            )
            .await;
        }
        read_side.stop();

        let reason = session
            .close_reason()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "closed".into());
        if let Some(key) = registered {
            unregister(&inner, key, conn_id, &reason);
        }
        handles.ephemeral.close();
        handles.set_done();
        if let Some(tx) = up_tx.take() {
            let _ = tx.send(Err((reason.clone(), session.peer().or(expected))));
        }
        Outcome {
            peer: session.peer(),
            up,
            reason,
        }
    }
}

/// A running group-committed flush ([`crate::store::Store::flush`]).
type Flush = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), crate::store::StoreError>> + Send>,
>;

/// A commit on its way to disk: the fsync of its blob data (on the blocking pool), then
/// the store flush.
enum Flight {
    Sync(std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BlobError>> + Send>>),
    Flush(Flush),
}

/// What a [`Flight`] stage ended with.
enum Landed {
    Synced(Result<(), BlobError>),
    Flushed(Result<(), crate::store::StoreError>),
}

/// One transaction for the lines fed since the last commit, and the flush (one fsync,
/// shared with other connections) that makes them durable. Their acks go out when the
/// flush completes ([`flushed`]). The flush picks its generation when first polled, after
/// this commit, so it holds every line committed here. When the commit wrote blob data,
/// the partial files are fsynced first on the blocking pool ([`crate::blob::BlobSync`]),
/// while this task goes on reading and writing the next chunks
/// ([`Session::prewrite_blobs`]); the blob records and the commit's other lines are stored
/// after that fsync ([`landed`]), then flushed.
fn commit_and_flush(inner: &Inner, session: &mut Session) -> Flight {
    // A commit of a few lines is what a peer waiting on each ack sends: its flush runs
    // on this thread ([`crate::store::Store::flush_inline`]); larger batches leave the
    // worker to read the next lines meanwhile.
    let inline = session.pending_lines() <= INLINE_FLUSH_LINES;
    match session.commit_start() {
        Some(job) => Flight::Sync(Box::pin(async move {
            match tokio::task::spawn_blocking(move || job.run()).await {
                Ok(r) => r,
                Err(e) => Err(BlobError::SyncTask(e.to_string())),
            }
        })),
        None => Flight::Flush(store_flush(inner, inline)),
    }
}

/// Commits of at most this many lines flush inline (see [`commit_and_flush`]).
const INLINE_FLUSH_LINES: usize = 4;

fn store_flush(inner: &Inner, inline: bool) -> Flush {
    let store = inner.store.clone();
    Box::pin(async move {
        match inline {
            true => store.flush_inline().await,
            false => store.flush().await,
        }
    })
}

/// Act on a finished flight stage: after the blob fsync, record and store the commit
/// ([`Session::commit_synced`]) and start its flush (the next stage, returned); after the
/// flush, release the acks ([`flushed`]).
fn landed(inner: &Inner, session: &mut Session, res: Landed) -> Option<Flight> {
    match res {
        Landed::Synced(r) => {
            session.commit_synced(r);
            Some(Flight::Flush(store_flush(inner, false)))
        }
        Landed::Flushed(r) => {
            flushed(session, r);
            None
        }
    }
}

/// The running flight stage's result; never ready when none runs.
async fn in_flight(flight: &mut Option<Flight>) -> Landed {
    match flight {
        Some(Flight::Sync(f)) => Landed::Synced(f.await),
        Some(Flight::Flush(f)) => Landed::Flushed(f.await),
        None => std::future::pending().await,
    }
}

/// Release the acks and events of the flushed batch, or fail the session.
fn flushed(session: &mut Session, res: Result<(), crate::store::StoreError>) {
    match res {
        Ok(()) => session.flushed(),
        Err(e) => session.flush_failed(&e),
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn log_close(remote: &str, peer: Option<&PeerKey>, reason: &CloseReason) {
    match reason {
        CloseReason::SentErr { code, detail } => {
            tracing::info!(%remote, ?peer, %code, %detail, "closed: sent err")
        }
        CloseReason::PeerErr { code, detail } => {
            tracing::info!(%remote, ?peer, %code, ?detail, "closed: peer sent err")
        }
        other => tracing::info!(%remote, ?peer, reason = ?other, "closed"),
    }
}

/// The `line` event for a stored content line (see [`crate::control::Event`]).
pub fn line_event(
    seq: u64,
    dir: &str,
    peer: &PeerKey,
    peer_name: Option<&str>,
    line: &Line,
) -> Value {
    json!({
        "event": "line",
        "seq": seq,
        "dir": dir,
        "peer": peer.to_string(),
        "peer_name": peer_name,
        "th": line.th(),
        "id": line.id(),
        "t": line.kind(),
        "line": line.to_value(),
        "at": wire::time::format_ms(wire::time::now_ms()),
    })
}
