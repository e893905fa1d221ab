//! The control socket: NDJSON requests from the CLI (see [`crate::control`]).

use super::conn::{self, Dial};
use super::Inner;
use crate::control::{check_peer_uid, Page, Request, Response, MAX_CONTROL_LINE};
use crate::net::{self, Address};
use crate::store::{AddrSource, Dir, LineBuilder, LogEntry};
use crate::wire::{self, Line, Part, PeerKey};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Bind the control socket at `path` (see [`crate::daemon::bind_control_socket`]) and
/// hand it to tokio.
pub(super) fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let l = crate::daemon::bind_control_socket(path)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

pub(super) async fn serve(inner: Arc<Inner>, listener: UnixListener, path: PathBuf) {
    loop {
        let s = tokio::select! {
            _ = inner.shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match s {
            Ok((stream, _)) => {
                let inner2 = inner.clone();
                inner.tasks.spawn(async move {
                    if let Err(e) = client(inner2, stream).await {
                        tracing::debug!("control client: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("control accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

async fn write_json(
    w: &mut (impl AsyncWriteExt + Unpin),
    v: &impl serde::Serialize,
) -> std::io::Result<()> {
    let mut b =
        crate::wire::escape_separators(serde_json::to_vec(v).map_err(std::io::Error::other)?);
    b.push(b'\n');
    w.write_all(&b).await?;
    w.flush().await
}

/// At most this many bytes are read (and dropped) from a refused control connection.
const REFUSED_DRAIN_BYTES: u64 = 64 * 1024;
/// For at most this long.
const REFUSED_DRAIN_TIME: Duration = Duration::from_secs(1);

async fn client(inner: Arc<Inner>, stream: UnixStream) -> std::io::Result<()> {
    let peer_uid = stream.peer_cred().ok().map(|c| c.uid());
    if let Err(why) = check_peer_uid(peer_uid, rustix::process::geteuid().as_raw()) {
        tracing::warn!("control socket: refused a connection: {why}");
        let (r, mut w) = stream.into_split();
        write_json(&mut w, &Response::err("forbidden", why)).await?;
        // Take (and ignore) what the client writes for a moment, so that its request does
        // not fail on a closed socket before it reads the refusal.
        let (mut r, mut sink) = (r.take(REFUSED_DRAIN_BYTES), tokio::io::sink());
        let _ = tokio::time::timeout(REFUSED_DRAIN_TIME, tokio::io::copy(&mut r, &mut sink)).await;
        return Ok(());
    }
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r.take(u64::MAX));
    loop {
        let mut line = Vec::new();
        let n = (&mut r)
            .take(MAX_CONTROL_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_CONTROL_LINE {
            write_json(&mut w, &Response::err("bad_request", "request too large")).await?;
            return Ok(());
        }
        let (req, page) = match decode(&line) {
            Ok(r) => r,
            Err(msg) => {
                write_json(&mut w, &Response::err("bad_request", msg)).await?;
                continue;
            }
        };
        if let Request::Subscribe { th, peer, from_seq } = req {
            return subscribe(&inner, &mut w, th, peer, from_seq).await;
        }
        let shutdown = matches!(req, Request::Shutdown);
        let resp = handle(&inner, req, &page).await;
        write_json(&mut w, &resp).await?;
        if shutdown {
            inner.shutdown.cancel();
            return Ok(());
        }
    }
}

/// Parse one control line (with or without its `\n`) as the control socket does: a
/// [`Request`], then for a listing the paging fields next to `op` (the first page for any
/// other request). Errors: the message of the `bad_request` response to write back.
fn decode(line: &[u8]) -> Result<(Request, Page), String> {
    let req: Request = serde_json::from_slice(line).map_err(|e| format!("bad request: {e}"))?;
    // Listings come in pages; the paging fields sit next to `op`.
    let page = if req.is_listing() {
        serde_json::from_slice::<Page>(line).map_err(|e| format!("bad paging fields: {e}"))?
    } else {
        Page::first()
    };
    Ok((req, page))
}

/// Answer one control line (without its `\n`) in-process, as a control socket connection
/// answers it as its first line; for the fuzzing harness
/// (`fuzz/fuzz_targets/control_lines.rs`), which then needs no socket round trip per line.
/// A line over [`MAX_CONTROL_LINE`] bytes with its `\n` gets `bad_request`. `subscribe`
/// and `shutdown` are not answered here (they would stream or stop the node): `None`.
pub(super) async fn answer_line(inner: &Arc<Inner>, line: &[u8]) -> Option<Response> {
    // The bytes the socket reads, `\n` included (parse errors give its positions).
    let mut line = line.to_vec();
    line.push(b'\n');
    if line.len() > MAX_CONTROL_LINE {
        return Some(Response::err("bad_request", "request too large"));
    }
    match decode(&line) {
        Ok((Request::Subscribe { .. } | Request::Shutdown, _)) => None,
        Ok((req, page)) => Some(handle(inner, req, &page).await),
        Err(msg) => Some(Response::err("bad_request", msg)),
    }
}

async fn handle(inner: &Arc<Inner>, req: Request, page: &Page) -> Response {
    match handle_inner(inner, req, page).await {
        Ok(v) => Response::ok(v),
        Err(f) => f.response(),
    }
}

pub(super) type Reply = Result<Value, Fail>;

/// The known peer name closest to `text` (a typo: at most one edit for a text of up to 4
/// characters, two beyond), compared with whole names and with their part before `@`;
/// `None` when none is that close, two are equally close, or `text` is over 64 characters.
/// Only names within the edit budget in length are compared (bounded work whatever the
/// peers named themselves). The name is cut for display.
fn close_name(peers: &[crate::store::PeerRecord], text: &str) -> Option<String> {
    let len = text.chars().count();
    if len > 64 {
        return None;
    }
    let max = if len <= 4 { 1 } else { 2 };
    let mut best: Option<(usize, String)> = None;
    let mut tie = false;
    // An edit distance is at least the difference in length: names (the peers' choice, of
    // any length) that cannot be close are not compared, so the work stays bounded.
    let near = |s: &str| s.chars().count().abs_diff(len) <= max;
    for name in peers.iter().filter_map(|p| p.name.as_deref()) {
        let local = name.split('@').next().unwrap_or(name);
        let d = [name, local]
            .into_iter()
            .filter(|s| near(s))
            .map(|s| strsim::damerau_levenshtein(text, s))
            .min()
            .unwrap_or(usize::MAX);
        if d == 0 || d > max {
            continue;
        }
        match &best {
            Some((b, n)) if d == *b && n != name => tie = true,
            Some((b, _)) if d >= *b => {}
            _ => {
                best = Some((d, name.to_string()));
                tie = false;
            }
        }
    }
    match (best, tie) {
        (Some((_, n)), false) => Some(crate::control::shown(&n)),
        _ => None,
    }
}

/// A failed control request: an error code of [`crate::control::ControlError`], a message
/// saying what went wrong (no advice in it), and at most one hint.
#[derive(Debug)]
pub(super) struct Fail(Box<(&'static str, String, Option<String>)>);

impl Fail {
    pub(super) fn new(code: &'static str, message: impl Into<String>) -> Fail {
        Fail(Box::new((code, message.into(), None)))
    }
    /// The same failure with `hint` as its one hint (replacing the client's usual one).
    pub(super) fn hint(mut self, hint: impl Into<String>) -> Fail {
        self.0 .2 = Some(hint.into());
        self
    }
    /// The error code.
    pub(super) fn code(&self) -> &'static str {
        self.0 .0
    }
    fn response(&self) -> Response {
        let mut r = Response::err(self.0 .0, self.0 .1.clone());
        if let Some(e) = r.error.as_mut() {
            e.hint = self.0 .2.clone();
        }
        r
    }
}

pub(super) fn internal(e: impl std::fmt::Display) -> Fail {
    Fail::new("internal", e.to_string())
}

async fn handle_inner(inner: &Arc<Inner>, req: Request, page: &Page) -> Reply {
    let store = &inner.store;
    match req {
        Request::Status => {
            let conns: Vec<Value> = {
                let c = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
                c.iter()
                    .map(|(k, e)| json!({"peer": k.to_string(), "up": e.up, "remote": e.remote, "dialed": e.dialed}))
                    .collect()
            };
            let mut outbox = 0u64;
            for p in store.outbox_peers().map_err(internal)? {
                outbox += store.outbox_len(&p).map_err(internal)?;
            }
            let key = inner.identity.key();
            Ok(json!({
                "key": key.to_string(),
                "name": inner.name,
                "fingerprint": key.fingerprint(),
                "pid": std::process::id(),
                "home": inner.home.display().to_string(),
                "uptime_s": inner.started.elapsed().as_secs(),
                "addresses": super::circuits::reported_addresses(inner).iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                "via": super::circuits::via_report(inner),
                "connections": conns,
                "outbox": outbox,
                "artifactr": inner.artifactr.get().map(|a| a.to_string()),
                "version": env!("CARGO_PKG_VERSION"),
                "notices": inner.notices.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            }))
        }
        Request::Artifact { action, args } => super::artifacts::control(inner, &action, args).await,
        Request::Whoami => {
            let key = inner.identity.key();
            Ok(
                json!({"key": key.to_string(), "name": inner.name, "fingerprint": key.fingerprint()}),
            )
        }
        Request::Address => {
            let addresses = super::circuits::reported_addresses(inner);
            Ok(json!({
                "address": addresses.first().map(|a| a.to_string()),
                "addresses": addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                "via": super::circuits::via_report(inner),
            }))
        }
        Request::Connect {
            address,
            timeout_ms,
        } => connect(inner, &address, timeout_ms).await,
        Request::Send {
            peer,
            th,
            subject,
            re,
            parts,
            files,
            wait_ack_ms,
        } => {
            refuse_in_relay_mode(inner)?;
            let request = super::refusals::is_request(&parts);
            let mut parts: Vec<Part> = parts
                .into_iter()
                .map(serde_json::from_value)
                .collect::<Result<_, _>>()
                .map_err(|e| Fail::new("bad_request", format!("bad part: {e}")))?;
            if parts.is_empty() && files.is_empty() {
                return Err(Fail::new("bad_request", "a msg needs at least one part"));
            }
            let (key, th, new_thread) = thread_and_peer(inner, peer.as_deref(), th.as_deref())?;
            let (blobs, hashing) = super::blobs::read_files(inner, &files).await?;
            parts.extend(blobs.iter().map(crate::blob::Outgoing::part));
            let subject = subject.filter(|s| !s.is_empty());
            // Chunks first, then the msg naming them: one transaction (protocol-notes
            // §Blobs).
            let chunk_builders = super::blobs::chunk_builders(&blobs, &th);
            let build = move |id: &str, ts: &str| {
                Line::Msg(wire::Msg {
                    id: id.into(),
                    ts: ts.into(),
                    th: th.clone(),
                    re: re.clone(),
                    subject: subject.clone(),
                    parts: parts.clone(),
                })
            };
            let mut builders: Vec<LineBuilder<'_>> = chunk_builders
                .iter()
                .map(|b| b.as_ref() as LineBuilder<'_>)
                .collect();
            builders.push(&build);
            let wait = wait_ack_ms.map(|ms| AckWait { ms, request });
            let hashing = blobs.iter().map(|b| b.blob_ref.clone()).zip(hashing);
            let blobs = Queued {
                blobs: &blobs,
                hashing: hashing.collect(),
            };
            queue(inner, key, &builders, blobs, wait, new_thread).await
        }
        Request::State {
            peer,
            th,
            state,
            note,
            wait_ack_ms,
        } => {
            refuse_in_relay_mode(inner)?;
            if state.is_empty() {
                return Err(Fail::new("bad_request", "state must not be empty"));
            }
            let (key, th, _) = thread_and_peer(inner, peer.as_deref(), Some(&th))?;
            let build = move |id: &str, ts: &str| {
                Line::State(wire::State {
                    id: id.into(),
                    ts: ts.into(),
                    th: th.clone(),
                    re: None,
                    state: state.clone(),
                    note: note.clone(),
                })
            };
            let wait = wait_ack_ms.map(|ms| AckWait { ms, request: false });
            queue(inner, key, &[&build], Queued::default(), wait, false).await
        }
        Request::Threads => super::lists::threads(inner, page),
        Request::Peers => super::lists::peers(inner, page),
        Request::Read { th, mark } => {
            // At most READ_PAGE_BYTES of lines per response (at least one line); only what
            // is returned is marked read. `more` tells the client to ask again, after the
            // `next` cursor (a log seq).
            let after = match page.cursor.as_deref() {
                None => 0,
                Some(c) => c
                    .parse::<u64>()
                    .map_err(|_| Fail::new("bad_request", format!("bad read cursor {c:?}")))?,
            };
            let limit = page.items().min(READ_PAGE_LINES);
            let entries = match th.as_deref() {
                None => store.log(after, None, true, limit + 1),
                // One thread: (peer, th); a thread that does not exist is refused, as by
                // `state` and `send -t` (a typo must not read as "no unread lines").
                Some(t) => match super::thread_ref::resolve(inner, None, t)? {
                    Some(n) => store.thread_log(after, &n.peer, &n.th, true, limit + 1),
                    None => return Err(Fail::new("no_such_thread", format!("no thread {t}"))),
                },
            }
            .map_err(internal)?;
            // More may follow when the scan stopped early or the store had more to give.
            let mut more = entries.len() > limit;
            let mut taken = Vec::new();
            let mut bytes = 0;
            let mut scanned = after;
            for e in entries.into_iter().filter(|e| e.dir == Dir::In) {
                if !taken.is_empty()
                    && (bytes + e.line.len() > READ_PAGE_BYTES || taken.len() >= limit)
                {
                    more = true;
                    break;
                }
                scanned = e.seq;
                bytes += e.line.len();
                taken.push(e);
            }
            if mark {
                let seqs: Vec<u64> = taken.iter().map(|e| e.seq).collect();
                store.mark_read(&seqs).map_err(internal)?;
                store.flush().await.map_err(internal)?;
            }
            let list: Vec<Value> = taken.iter().map(|e| entry_event(inner, e)).collect();
            let mut reply = json!({ "entries": list, "more": more });
            if more {
                reply["next"] = json!(scanned.to_string());
            }
            Ok(reply)
        }
        Request::MarkRead { seqs } => {
            if seqs.len() > crate::control::MAX_MARK_SEQS {
                return Err(Fail::new(
                    "bad_request",
                    format!("at most {} seqs", crate::control::MAX_MARK_SEQS),
                ));
            }
            let marked = store.mark_read(&seqs).map_err(internal)?;
            store.flush().await.map_err(internal)?;
            Ok(json!({ "marked": marked }))
        }
        Request::ThreadLines { th, after } => match super::thread_ref::resolve(inner, None, &th)? {
            Some(n) => {
                crate::transcript::stored_page(store, &n.peer, &n.th, after).map_err(internal)
            }
            None => Err(Fail::new("no_such_thread", format!("no thread {th}"))),
        },
        Request::Subscribe { .. } => {
            Err(Fail::new("bad_request", "subscribe is handled separately"))
        }
        Request::Presence { peer } => match super::presence::list(inner, peer.as_deref(), page) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(Fail::new(
                "no_such_peer",
                format!("no presence document from {:?}", peer.unwrap_or_default()),
            )
            .hint("`awp presence` lists known agents")),
            Err(m) => Err(Fail::new("ambiguous_peer", m)),
        },
        Request::PresenceStatus => Ok(super::presence::status(inner)),
        Request::Grant {
            peer,
            caps,
            ttl_s,
            aud,
        } => {
            let sub = resolve_peer(inner, &peer)?;
            let aud = aud.map(|a| resolve_peer(inner, &a)).transpose()?;
            let caps = super::artifacts::scope_caps(inner, &caps)?;
            mint_and_store(inner, &sub, &caps, ttl_s, aud.as_ref()).await
        }
        Request::Grants => super::lists::grants(inner, page),
        Request::Revoke { hash } => {
            let rec = resolve_grant(inner, &hash)?;
            let hash = rec.hash.clone();
            store
                .grant_revoke(&hash, wire::time::now_ms())
                .map_err(internal)?;
            store.flush().await.map_err(internal)?;
            inner.emit(json!({"event": "grant_revoked", "hash": hash, "role": rec.role}));
            Ok(json!({"hash": hash, "revoked": true, "role": rec.role}))
        }
        Request::Introduce {
            to,
            peer,
            caps,
            ttl_s,
            th,
        } => introduce(inner, &to, &peer, caps, ttl_s, th).await,
        Request::Blobs { peer, blob_ref } => {
            super::blobs::list(inner, peer.as_deref(), blob_ref.as_deref(), page)
        }
        Request::Shutdown => Ok(json!({"stopping": true})),
        Request::ForgetPeer { peer } => forget_peer(inner, &peer).await,
        Request::Disconnect { peer, reason } => {
            super::disconnect::disconnect(inner, &peer, reason.as_deref()).await
        }
    }
}

/// Shortest grant hash prefix accepted (as for key prefixes).
const MIN_GRANT_PREFIX: usize = 4;

/// Resolve a grant argument: its full hash, or a unique prefix of at least
/// [`MIN_GRANT_PREFIX`] hex characters (case-insensitive). `no_such_grant` when none
/// matches, `ambiguous_grant` (listing the matches) when several do.
pub(super) fn resolve_grant(inner: &Inner, text: &str) -> Result<crate::store::GrantRecord, Fail> {
    let want = text.trim().to_ascii_lowercase();
    if let Some(rec) = inner.store.grant(&want).map_err(internal)? {
        return Ok(rec);
    }
    if want.len() < MIN_GRANT_PREFIX {
        return Err(Fail::new(
            "no_such_grant",
            format!(
                "no grant {want:?} (a hash prefix needs at least {MIN_GRANT_PREFIX} characters)"
            ),
        ));
    }
    grant_by_prefix(
        inner.store.grants_with_prefix(&want).map_err(internal)?,
        &want,
    )
}

/// The one grant of `grants` whose hash starts with `want` (lower case), or why not.
fn grant_by_prefix(
    grants: Vec<crate::store::GrantRecord>,
    want: &str,
) -> Result<crate::store::GrantRecord, Fail> {
    let mut hits: Vec<crate::store::GrantRecord> = grants
        .into_iter()
        .filter(|g| g.hash.starts_with(want))
        .collect();
    match hits.len() {
        0 => Err(Fail::new(
            "no_such_grant",
            format!("no grant matches {want:?}"),
        )),
        1 => Ok(hits.remove(0)),
        _ => {
            let list: Vec<&str> = hits.iter().map(|g| g.hash.as_str()).collect();
            Err(Fail::new(
                "ambiguous_grant",
                format!(
                    "{want:?} matches {} grants: {}",
                    list.len(),
                    list.join(", ")
                ),
            ))
        }
    }
}

/// `awp peers forget`: refuse while the peer is connected (its session would record it
/// again), else remove what the store keeps about it.
async fn forget_peer(inner: &Arc<Inner>, peer: &str) -> Reply {
    let key = resolve_peer(inner, peer)?;
    let connected = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .is_some_and(|c| c.up);
    if connected {
        return Err(Fail::new("bad_request", format!("{key} is connected"))
            .hint(format!("say bye first: `awp disconnect {key}`")));
    }
    let removed = inner.store.forget_peer(&key).map_err(internal)?;
    if !removed.any() {
        return Err(Fail::new(
            "no_such_peer",
            format!("nothing is known about {key}"),
        ));
    }
    inner.store.flush().await.map_err(internal)?;
    Ok(json!({"key": key.to_string(), "removed": removed, "kept": kept_after_forget(inner, &key)?}))
}

/// What `forget` leaves about `key`, as counts (the CLI says why): blob records (their
/// files are the user's data, under `blobs/`), artifact threads (shared documents that
/// hold our own work too), grants issued to it (revoked explicitly with `awp revoke`).
fn kept_after_forget(inner: &Inner, key: &PeerKey) -> Result<Value, Fail> {
    let store = &inner.store;
    let blobs = store
        .blobs_in()
        .map_err(internal)?
        .iter()
        .filter(|b| b.peer == *key)
        .count()
        + store
            .blobs_out()
            .map_err(internal)?
            .iter()
            .filter(|b| b.peer == *key)
            .count();
    let artifact_threads = store
        .art_workspaces()
        .map_err(internal)?
        .iter()
        .filter(|w| w.peer == *key)
        .count();
    let grants = store.grants_by_sub(key).map_err(internal)?.len();
    Ok(json!({"blobs": blobs, "artifact_threads": artifact_threads, "grants": grants}))
}

/// A relay queues nothing for peers: msgs and states are refused.
fn refuse_in_relay_mode(inner: &Inner) -> Result<(), Fail> {
    if inner.relay {
        return Err(Fail::new(
            "bad_request",
            "this node runs as a relay and keeps no outbox",
        )
        .hint("send from a regular node (`awp up`)"));
    }
    Ok(())
}

/// Most bytes of lines in one `read` response.
const READ_PAGE_BYTES: usize = 1024 * 1024;
/// Most lines in one `read` response.
const READ_PAGE_LINES: usize = 1000;

/// Resolve a peer argument: a full key, or else every known peer whose key starts with
/// the text (at least 4 characters, with or without `ed25519:`), whose name equals it, or
/// whose name before `@` equals it. Exactly one distinct peer must match: names are chosen
/// by peers themselves, so a name that collides with another peer's key prefix or name is
/// reported as ambiguous instead of silently picking one. Peers known only from an
/// introduction count only when no peer that completed a handshake matches: an introducer
/// cannot shadow a known peer by introducing a key under its name.
pub(super) fn resolve_peer(inner: &Inner, text: &str) -> Result<PeerKey, Fail> {
    resolve_or_suggest(inner, text).map_err(|(f, _)| f)
}

/// [`resolve_peer`], with whether its failure suggests a close known name (a typo).
fn resolve_or_suggest(inner: &Inner, text: &str) -> Result<PeerKey, (Fail, bool)> {
    if let Ok(k) = PeerKey::parse(text) {
        return Ok(k);
    }
    let peers = inner.store.peers().map_err(|e| (internal(e), false))?;
    let prefix = text.strip_prefix("ed25519:").unwrap_or(text);
    let mut hits: Vec<&crate::store::PeerRecord> = peers
        .iter()
        .filter(|p| {
            let by_key =
                prefix.len() >= 4 && p.key.to_string()["ed25519:".len()..].starts_with(prefix);
            let name = p.name.as_deref();
            let by_name =
                name == Some(text) || name.and_then(|n| n.split('@').next()) == Some(text);
            by_key || by_name
        })
        .collect();
    hits.dedup_by_key(|p| p.key);
    if hits.iter().any(|p| p.introduced_by.is_none()) {
        hits.retain(|p| p.introduced_by.is_none());
    }
    if hits.len() == 1 {
        return Ok(hits[0].key);
    }
    // Only when nothing matched: the typo search is not run for an ambiguous text.
    if let Some(name) = hits.is_empty().then(|| close_name(&peers, text)).flatten() {
        return Err((
            Fail::new(
                "no_such_peer",
                format!("no peer named {text:?}; did you mean {name:?}?"),
            ),
            true,
        ));
    }
    let fail = match hits.len() {
        0 if prefix.len() < 4 => Fail::new(
            "no_such_peer",
            format!("no peer named {text:?} (a key prefix needs at least 4 characters)"),
        ),
        0 => Fail::new("no_such_peer", format!("no known peer matches {text:?}")),
        n => {
            // Names are the peers' choice: a few of them, each cut to size.
            let mut list: Vec<String> = hits
                .iter()
                .take(AMBIGUOUS_SHOWN)
                .map(|p| {
                    let name = p.name.as_deref().map_or("?".into(), crate::control::shown);
                    format!("{name} ({})", &p.key.to_string()[..16])
                })
                .collect();
            if n > AMBIGUOUS_SHOWN {
                list.push(format!("and {} more", n - AMBIGUOUS_SHOWN));
            }
            Fail::new(
                "ambiguous_peer",
                format!(
                    "{:?} matches {}",
                    crate::control::shown(text),
                    list.join(", ")
                ),
            )
        }
    };
    Err((fail, false))
}

/// Most matching peers an `ambiguous_peer` message names.
const AMBIGUOUS_SHOWN: usize = 8;

/// The peer and thread of a send/state: `th` is resolved by [`super::thread_ref::resolve`]
/// (`TH`, `PEER/TH`, or TH with `peer`); a new thread needs a peer (and gets `thr_<ULID>`
/// when no id was given).
fn thread_and_peer(
    inner: &Inner,
    peer: Option<&str>,
    th: Option<&str>,
) -> Result<(PeerKey, String, bool), Fail> {
    let peer = peer.map(|p| resolve_peer(inner, p)).transpose()?;
    if peer == Some(inner.identity.key()) {
        return Err(
            Fail::new("bad_request", "that is this node's own key").hint("name another peer")
        );
    }
    match th {
        // A thread is (peer, th): with a peer, its thread of that id (new when it has none).
        Some(th) => match super::thread_ref::resolve(inner, peer, th)? {
            Some(n) => Ok((n.peer, n.th, n.info.is_none())),
            None => Err(Fail::new("no_such_thread", format!("no thread {th}"))
                .hint("name a peer to start it, or list threads with `awp threads`")),
        },
        None => match peer {
            Some(p) => Ok((p, format!("thr_{}", ulid::Ulid::generate()), true)),
            None => Err(Fail::new("bad_request", "name a peer or a thread (-t)")),
        },
    }
}

/// `--wait-ack`: how long to wait for the ack (ms), and whether the line is a served
/// request (then a refusal that follows the ack is waited for too, up to
/// [`super::refusals::REFUSAL_GRACE_MS`]).
struct AckWait {
    ms: u64,
    request: bool,
}

/// Queue `builders`' lines for `key` in one transaction; the last one is the line the
/// reply (and `wait`) is about. `blobs`: the files whose chunks come first.
///
/// Reply `status`: `queued`, `delivered` (acked within the wait), or `refused` (the peer
/// answered the line with an `err`, given as `refusal: {code, detail}`).
/// The blobs of a send: their records, and the files still to hash (each blob's ref and
/// its [`crate::blob::Hashing`]; see [`crate::blob::pending`]).
#[derive(Default)]
struct Queued<'a> {
    blobs: &'a [crate::blob::Outgoing],
    hashing: Vec<(String, crate::blob::Hashing)>,
}

async fn queue(
    inner: &Arc<Inner>,
    key: PeerKey,
    builders: &[LineBuilder<'_>],
    queued: Queued<'_>,
    wait: Option<AckWait>,
    new_thread: bool,
) -> Reply {
    let Queued { blobs, hashing } = queued;
    // Subscribe before queueing so the ack cannot slip past.
    let mut events = inner.events.subscribe();
    // Registered before the chunks can be sent: the stream waits for these hashes.
    for (r, _) in &hashing {
        crate::blob::pending::begin(&key, r);
    }
    let entries = match super::blobs::enqueue(inner, &key, builders, blobs) {
        Ok(entries) => entries,
        Err(e) => {
            for (r, _) in &hashing {
                crate::blob::pending::finish(&key, r, Err("not queued".into()));
            }
            return Err(match e {
                crate::store::StoreError::TooLarge { .. } => {
                    Fail::new("bad_request", e.to_string())
                }
                crate::store::StoreError::DiskFull { .. } => Fail::new("disk_full", e.to_string())
                    .hint(
                        "free space on the file system of the node's home; sends are \
                         accepted again by themselves once it has room",
                    ),
                e => internal(e),
            });
        }
    };
    // Hashed while the chunks go out (no await between the queueing and this spawn).
    let hashed = (!hashing.is_empty()).then(|| super::blobs::start_hashing(inner, key, hashing));
    inner.store.flush().await.map_err(internal)?;
    let Some(entry) = entries.into_iter().last() else {
        return Err(internal("nothing queued"));
    };
    if let Ok(line) = wire::parse_line(&entry.line) {
        let name = inner.peer_name(&key);
        inner.emit(conn::line_event(
            entry.seq,
            "out",
            &key,
            name.as_deref(),
            &line,
        ));
    }
    inner.outbox_changed(&key);
    let mut sha256 = Vec::new();
    if let Some(hashed) = hashed {
        let outcomes = hashed
            .await
            .map_err(|e| internal(format!("hashing files: {e}")))?;
        for outcome in outcomes {
            // The blob was stopped (its queued lines left the outbox): the send fails as
            // it did when the file was hashed before queueing.
            sha256.push(outcome.map_err(|why| Fail::new("bad_request", why))?.sha256);
        }
    }
    let blob_info = (!blobs.is_empty()).then(|| super::blobs::describe(blobs, &sha256));
    let mut status = "queued";
    let mut refusal = None;
    if let Some(AckWait { ms, request }) = wait {
        let want = entry.id.clone();
        let mut acked = false;
        let mut until = tokio::time::Instant::now() + Duration::from_millis(ms);
        // After the ack of a request, only a short while more for its refusal.
        let grace = Duration::from_millis(super::refusals::REFUSAL_GRACE_MS);
        loop {
            let ev = match tokio::time::timeout_at(until, events.recv()).await {
                Err(_) => break,
                Ok(ev) => ev,
            };
            match ev {
                Ok(ev) => {
                    let is = |name: &str| ev.get("event").and_then(Value::as_str) == Some(name);
                    let about_it = ev.get("re").and_then(Value::as_str) == Some(want.as_str())
                        && ev.get("peer").and_then(Value::as_str) == Some(&key.to_string());
                    if is("peer_err") && about_it {
                        refusal = Some(json!({"code": ev.get("code"), "detail": ev.get("detail")}));
                        break;
                    }
                    if is("ack") && about_it && !acked {
                        acked = true;
                        if !request {
                            break;
                        }
                        until = until.min(tokio::time::Instant::now() + grace);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    // Fall back to the store: acked lines leave the outbox.
                    if !inner.store.outbox_has(&key, &want).unwrap_or(true) && !acked {
                        acked = true;
                        if !request {
                            break;
                        }
                        until = until.min(tokio::time::Instant::now() + grace);
                    }
                }
                Err(_) => break,
            }
        }
        if refusal.is_some() {
            status = "refused";
        } else if acked {
            status = "delivered";
        }
    }
    let mut reply = json!({
        "id": entry.id,
        "th": entry.th,
        "peer": key.to_string(),
        "peer_name": inner.peer_name(&key),
        "status": status,
        "new_thread": new_thread,
        "connected": inner.connected(&key),
    });
    if let Some(b) = blob_info {
        reply["blobs"] = b;
    }
    if let Some(r) = refusal {
        reply["refusal"] = r;
    }
    Ok(reply)
}

/// Caps a grant may carry: short names without spaces.
fn check_caps(caps: &[String]) -> Result<(), Fail> {
    if caps.len() > crate::grant::MAX_CAPS {
        return Err(Fail::new(
            "bad_request",
            format!("at most {} capabilities", crate::grant::MAX_CAPS),
        ));
    }
    for c in caps {
        if c.is_empty()
            || c.len() > crate::grant::MAX_CAP_LEN
            || c.chars().any(|ch| ch.is_whitespace() || ch.is_control())
        {
            return Err(Fail::new(
                "bad_request",
                format!("{c:?} is not a capability name (e.g. exec, fs:read)"),
            ));
        }
    }
    Ok(())
}

/// Mint a grant, store it as issued, and send it now when `sub` is connected (it also goes
/// after every resume while valid).
async fn mint_and_store(
    inner: &Arc<Inner>,
    sub: &PeerKey,
    caps: &[String],
    ttl_s: u64,
    aud: Option<&PeerKey>,
) -> Reply {
    if caps.is_empty() {
        return Err(Fail::new(
            "bad_request",
            "name at least one capability (e.g. exec)",
        ));
    }
    check_caps(caps)?;
    if *sub == inner.identity.key() {
        return Err(Fail::new(
            "bad_request",
            "a grant to this node's own key means nothing",
        ));
    }
    let now = wire::time::now_ms();
    let g = crate::grant::mint(&inner.identity, sub, caps, ttl_s.max(1), aud, now);
    let obj = crate::grant::object_of(&g);
    let hash = crate::grant::grant_hash(&obj);
    inner
        .store
        .grant_put(&crate::store::GrantRecord {
            hash: hash.clone(),
            role: crate::store::GrantRole::Issued,
            from: None,
            object: obj.clone(),
            stored_ms: now,
        })
        .map_err(internal)?;
    inner.store.flush().await.map_err(internal)?;
    let line = Line::Grant(wire::GrantMsg {
        id: inner.store.next_control_id(),
        ts: wire::time::format_ms(now),
        grant: g,
    });
    let sent = inner.send_ephemeral(sub, &line);
    Ok(json!({"hash": hash, "grant": Value::Object(obj), "sent": sent}))
}

/// Send `to` an introduction of `peer` (protocol-notes §Grants, 10.4), in a thread, followed
/// by a short msg in the same thread whose ack retires the introduce line (cumulative ack).
async fn introduce(
    inner: &Arc<Inner>,
    to: &str,
    peer: &str,
    caps: Vec<String>,
    ttl_s: u64,
    th: Option<String>,
) -> Reply {
    refuse_in_relay_mode(inner)?;
    let to_key = resolve_peer(inner, to)?;
    let peer_key = resolve_peer(inner, peer)?;
    if to_key == peer_key {
        return Err(Fail::new("bad_request", "introduce two different peers"));
    }
    check_caps(&caps)?;
    let now = wire::time::now_ms();
    let grant = (!caps.is_empty()).then(|| {
        crate::grant::mint(
            &inner.identity,
            &to_key,
            &caps,
            ttl_s.max(1),
            Some(&peer_key),
            now,
        )
    });
    let rec = inner.store.peer(&peer_key).map_err(internal)?;
    let name = rec.as_ref().and_then(|r| r.name.clone());
    let address = inner
        .store
        .addresses(&peer_key)
        .map_err(internal)?
        .into_iter()
        .find(|a| a.address.starts_with("tls:"))
        .map(|a| a.address);
    let th = match th {
        Some(t) => {
            let (k, t, _) = thread_and_peer(inner, Some(to), Some(&t))?;
            if k != to_key {
                return Err(Fail::new("bad_request", "that thread is with another peer"));
            }
            t
        }
        None => format!("thr_{}", ulid::Ulid::generate()),
    };
    let intro = wire::IntroPeer {
        key: peer_key.to_string(),
        name: name.clone(),
        address: address.clone(),
    };
    let (th1, th2) = (th.clone(), th.clone());
    let g2 = grant.clone();
    let build_intro = move |id: &str, ts: &str| {
        Line::Introduce(wire::Introduce {
            id: id.into(),
            ts: ts.into(),
            th: Some(th1.clone()),
            peer: intro.clone(),
            grant: g2.clone(),
        })
    };
    let text = format!(
        "Introducing {} ({peer_key})",
        name.as_deref().unwrap_or("a peer")
    );
    let build_msg = move |id: &str, ts: &str| {
        Line::Msg(wire::Msg {
            id: id.into(),
            ts: ts.into(),
            th: th2.clone(),
            re: None,
            subject: Some("introduction".into()),
            parts: vec![wire::Part::Text(wire::TextPart { text: text.clone() })],
        })
    };
    let entries = inner
        .store
        .enqueue(&to_key, &[&build_intro, &build_msg])
        .map_err(internal)?;
    if let Some(g) = &grant {
        let obj = crate::grant::object_of(g);
        inner
            .store
            .grant_put(&crate::store::GrantRecord {
                hash: crate::grant::grant_hash(&obj),
                role: crate::store::GrantRole::Issued,
                from: None,
                object: obj,
                stored_ms: now,
            })
            .map_err(internal)?;
    }
    inner.store.flush().await.map_err(internal)?;
    inner.outbox_changed(&to_key);
    Ok(json!({
        "th": th,
        "id": entries.first().map(|e| e.id.clone()),
        "to": to_key.to_string(),
        "peer": peer_key.to_string(),
        "address": address,
        "grant": grant.map(|g| Value::Object(crate::grant::object_of(&g))),
    }))
}

async fn connect(inner: &Arc<Inner>, address: &str, timeout_ms: Option<u64>) -> Reply {
    let timeout = Duration::from_millis(timeout_ms.unwrap_or(15_000));
    let deadline = tokio::time::Instant::now() + timeout.min(super::HANDSHAKE_TIMEOUT);
    // An address, or a known peer: its known addresses freshest first (usability #1: a
    // peer that moved is dialed where it said it is now, then where it was), each with a
    // fair share of the time left, until one comes up. A failure is recorded on the
    // address, so the next dial (ours or the dialer's) tries it later.
    let (known, addrs): (Option<PeerKey>, Vec<(String, Address)>) = match address.parse::<Address>()
    {
        Ok(a) => (None, vec![(a.to_string(), a)]),
        Err(parse_err) => {
            let key = match resolve_or_suggest(inner, address) {
                Ok(key) => key,
                // A name with a typo: the close name says more than the address forms.
                Err((f, true)) => return Err(f),
                // Neither a scheme nor a peer: most likely a name this node has not met.
                Err(_) if matches!(parse_err, crate::net::AddressError::Scheme(_)) => {
                    return Err(Fail::new(
                        "no_such_peer",
                        format!(
                            "{address:?} is neither a known peer (key, key prefix of 4+ characters, or name) nor an address: use {}",
                            crate::net::address::SCHEMES
                        ),
                    ))
                }
                Err(_) => return Err(Fail::new("bad_request", parse_err.to_string())),
            };
            let mut recs = inner.store.addresses(&key).map_err(internal)?;
            // Introduced hints that never worked are dialed only when nothing better is
            // known: an introducer never steers a connect away from the peer's own address
            // (spec/security.md: introductions are hints).
            if recs.iter().any(|a| a.fresh_ms().is_some()) {
                recs.retain(|a| a.fresh_ms().is_some());
            }
            // Circuits from the peer's presence document (spec/relay-circuits.md §Presence).
            super::circuits::add_presence_candidates(inner, &key, &mut recs);
            let known: Vec<(String, Address)> = recs
                .into_iter()
                .filter_map(|a| {
                    let parsed = a.address.parse::<Address>().ok()?.with_pin(key);
                    Some((a.address, parsed))
                })
                .collect();
            if known.is_empty() {
                return Err(
                    Fail::new("connect_failed", format!("no known address for {address}"))
                        .hint(format!("give one: awp connect tls:HOST:PORT#{key}")),
                );
            }
            (Some(key), known)
        }
    };
    let mut last = None;
    let total = addrs.len();
    for (i, (stored, addr)) in addrs.into_iter().enumerate() {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        let share = (deadline - now) / (total - i) as u32;
        let until = if i + 1 == total {
            deadline
        } else {
            (now + share.max(MIN_CONNECT_SHARE)).min(deadline)
        };
        match connect_at(inner, &addr, until).await {
            Ok(v) => return Ok(v),
            Err(f) => {
                if let Some(key) = known {
                    let _ = inner.store.address_result(
                        &key,
                        &stored,
                        Err(&f.0 .1),
                        wire::time::now_ms(),
                    );
                }
                last = Some(f);
            }
        }
    }
    Err(last.unwrap_or_else(|| Fail::new("connect_failed", format!("{address}: timed out"))))
}

/// The least time `connect PEER` gives one of several addresses.
const MIN_CONNECT_SHARE: Duration = Duration::from_secs(2);

/// Dial `addr` once and wait (until `deadline`) for the handshake.
async fn connect_at(inner: &Arc<Inner>, addr: &Address, deadline: tokio::time::Instant) -> Reply {
    let address = addr.to_string();
    let address = address.as_str();
    let c = match tokio::time::timeout_at(deadline, net::dial(addr, &inner.tls, &inner.dial_opts))
        .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let text = e.to_string();
            return Err(match (addr.pin(), presented_key(&text)) {
                (Some(want), Some(got)) if got != want => pin_mismatch(address, want, got),
                _ => Fail::new("connect_failed", format!("{address}: {text}")),
            });
        }
        Err(_) => return Err(Fail::new("connect_failed", format!("{address}: timed out"))),
    };
    // Subscribed before dialing: the peer may come up by its own connection meanwhile.
    let mut events = inner.events.subscribe();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let inner2 = inner.clone();
    let dial = Dial::Outbound {
        address: address.to_string(),
        expected: addr.pin(),
        source: AddrSource::Connect,
    };
    inner.tasks.spawn(async move {
        let outcome = conn::run_with(inner2.clone(), c, dial, deadline, Some(tx)).await;
        if let Some(peer) = outcome.peer {
            // Keep the connection wanted: redial when it drops with work pending.
            super::dialer::disconnected(&inner2, peer);
        }
    });
    let connected = |key: PeerKey| json!({"peer": key.to_string(), "peer_name": inner.peer_name(&key), "address": address});
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(Ok(key))) => {
            let _ = inner.store.flush().await;
            Ok(connected(key))
        }
        // Both sides dialed at once (or the peer's connection replaced ours): the peer
        // counts as connected when either side's connection is up (issue 8 §3).
        Ok(Ok(Err((_, Some(key)))))
            if wait_up_either_way(inner, &key, &mut events, deadline).await =>
        {
            let _ = inner.store.flush().await;
            Ok(connected(key))
        }
        Ok(Ok(Err((reason, _)))) => {
            Err(Fail::new("connect_failed", format!("{address}: {reason}")))
        }
        _ => Err(Fail::new(
            "connect_failed",
            format!("{address}: handshake timed out"),
        )),
    }
}

/// The key a refused certificate presented, from the dial error's text (`certificate key
/// KEY does not match the pinned …`, see [`crate::net::dial`]).
fn presented_key(text: &str) -> Option<PeerKey> {
    let rest = &text[text.find("certificate key ")? + "certificate key ".len()..];
    PeerKey::parse(rest.split_whitespace().next()?).ok()
}

/// Usability #7: the node at the address answered with another key than the pinned one.
/// Not "is the peer up" (it is): the key differs; say which one it has and how to check.
fn pin_mismatch(address: &str, want: PeerKey, got: PeerKey) -> Fail {
    Fail::new(
        "connect_failed",
        format!(
            "{address}: the node there has key {got} (fingerprint {}), not the pinned {want}",
            got.fingerprint()
        ),
    )
    .hint(format!(
        "the key after `#` differs from the peer's: compare with the key and fingerprint \
         `awp whoami` prints on the peer's host (pinned fingerprint {})",
        want.fingerprint()
    ))
}

/// Whether `key` has an up connection now, or gets one (by either side's dial) before
/// `deadline`: watched through `peer_up` events of a subscription made before the dial.
async fn wait_up_either_way(
    inner: &Inner,
    key: &PeerKey,
    events: &mut tokio::sync::broadcast::Receiver<crate::control::Event>,
    deadline: tokio::time::Instant,
) -> bool {
    let key_s = key.to_string();
    let is_up = || {
        inner
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|c| c.up)
    };
    loop {
        if is_up() {
            return true;
        }
        let ev = match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => return is_up(),
            Ok(Ok(ev)) => ev,
            // Missed events: look at the connection table again.
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => continue,
            Ok(Err(_)) => return is_up(),
        };
        if ev.get("event").and_then(Value::as_str) == Some("peer_up")
            && ev.get("peer").and_then(Value::as_str) == Some(key_s.as_str())
        {
            return true;
        }
    }
}

fn entry_event(inner: &Inner, e: &LogEntry) -> Value {
    let body: Value = serde_json::from_slice(&e.line).unwrap_or(Value::Null);
    json!({
        "event": "line",
        "seq": e.seq,
        "dir": match e.dir { Dir::In => "in", Dir::Out => "out" },
        "peer": e.peer.to_string(),
        "peer_name": inner.peer_name(&e.peer),
        "th": e.th,
        "id": e.id,
        "t": e.kind,
        "line": body,
        "at": wire::time::format_ms(e.at_ms),
        "read": e.read,
        "acked": e.acked,
    })
}

async fn subscribe(
    inner: &Arc<Inner>,
    w: &mut (impl AsyncWriteExt + Unpin),
    th: Option<String>,
    peer: Option<String>,
    from_seq: Option<u64>,
) -> std::io::Result<()> {
    let peer = match peer.map(|p| resolve_peer(inner, &p)).transpose() {
        Ok(p) => p,
        Err(f) => return write_json(w, &f.response()).await,
    };
    // A thread filter is (peer, th) once the thread resolves (`TH`, `PEER/TH`, or TH with
    // the peer filter); a thread that does not exist yet matches its id from any peer.
    let (peer, th) = match th
        .as_deref()
        .map(|t| super::thread_ref::resolve(inner, peer, t))
    {
        None => (peer, None),
        Some(Ok(Some(n))) => (Some(n.peer), Some(n.th)),
        Some(Ok(None)) => (peer, th),
        Some(Err(f)) => return write_json(w, &f.response()).await,
    };
    let mut rx = inner.events.subscribe();
    write_json(w, &Response::ok(json!({"subscribed": true}))).await?;
    let mut last_seq = 0u64;
    if let Some(from) = from_seq {
        let mut after = from;
        loop {
            let batch = match inner.store.log(after, th.as_deref(), false, 1000) {
                Ok(b) => b,
                Err(e) => return write_json(w, &Response::err("internal", e.to_string())).await,
            };
            if batch.is_empty() {
                break;
            }
            for e in &batch {
                after = e.seq;
                if peer.is_some_and(|p| p != e.peer) {
                    continue;
                }
                write_json(w, &entry_event(inner, e)).await?;
            }
        }
        last_seq = after;
        write_json(w, &json!({"event": "caught_up", "seq": last_seq})).await?;
    }
    let peer_s = peer.map(|p| p.to_string());
    loop {
        let ev = tokio::select! {
            _ = inner.shutdown.cancelled() => return Ok(()),
            ev = rx.recv() => ev,
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                let mut m = serde_json::Map::new();
                m.insert("event".into(), json!("lagged"));
                m.insert("missed".into(), json!(n));
                m
            }
            Err(_) => return Ok(()),
        };
        if ev.get("event").and_then(Value::as_str) == Some("line") {
            let seq = ev.get("seq").and_then(Value::as_u64).unwrap_or(0);
            if seq != 0 && seq <= last_seq {
                continue;
            }
            if let Some(th) = th.as_deref() {
                if ev.get("th").and_then(Value::as_str) != Some(th) {
                    continue;
                }
            }
        }
        if let Some(p) = &peer_s {
            if ev
                .get("peer")
                .and_then(Value::as_str)
                .is_some_and(|k| k != p)
            {
                continue;
            }
        }
        write_json(w, &ev).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{GrantRecord, GrantRole};

    fn rec(hash: &str) -> GrantRecord {
        GrantRecord {
            hash: hash.into(),
            role: GrantRole::Issued,
            from: None,
            object: Default::default(),
            stored_ms: 0,
        }
    }

    #[test]
    fn a_grant_is_found_by_a_unique_hash_prefix_and_an_ambiguous_one_says_so() {
        let grants = || {
            vec![
                rec("2545aa00000000000000000000000000"),
                rec("2545bb00000000000000000000000000"),
                rec("9f0000000000000000000000000000aa"),
            ]
        };
        assert_eq!(
            grant_by_prefix(grants(), "9f00").unwrap().hash,
            grants()[2].hash
        );
        assert_eq!(
            grant_by_prefix(grants(), "2545a").unwrap().hash,
            grants()[0].hash
        );
        let e = grant_by_prefix(grants(), "2545").unwrap_err();
        assert_eq!(e.0 .0, "ambiguous_grant");
        assert!(
            e.0 .1.contains("2545aa") && e.0 .1.contains("2545bb"),
            "{}",
            e.0 .1
        );
        assert_eq!(
            grant_by_prefix(grants(), "7777").unwrap_err().0 .0,
            "no_such_grant"
        );
    }
}
