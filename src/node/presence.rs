//! Presence wiring: the I/O around [`crate::presence`].
//!
//! - Receiving (every node): a `presence` line goes through [`PresenceTable::accept`];
//!   an accepted document is forwarded unchanged, with one more hop, to every other
//!   connected peer whose hello caps list `presence`, except the sender and the origin.
//! - Anti-entropy: when a session comes up with a presence peer, it gets our own latest
//!   document and every fresh held document (with one more hop, within the hop bound).
//! - Publishing (opt-in, `--presence`): our document is rebuilt and signed about
//!   [`PresenceTiming::debounce`] after a change (a line, an ack, a peer up or down) and
//!   every [`PresenceTiming::heartbeat`] otherwise; `seq` is persisted and flushed before use.
//!
//! Forwarding never blocks: a peer whose ephemeral queue is full misses the document
//! (counted as `forward_dropped`); the next heartbeat makes up for it.

use super::Inner;
use crate::presence::doc::{self, DocInputs, PeerEntry, ThreadEntry};
use crate::presence::{PresenceTable, MAX_HOPS};
use crate::wire::{self, PeerKey, PresenceMsg};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

/// The capability family that makes a peer a presence peer.
pub const CAP: &str = "presence";
/// Store meta key of the largest seq ever used (u64 big-endian).
const SEQ_KEY: &str = "presence/seq";
/// Store meta key of the other origins' watermarks ([`crate::presence::encode_marks`]).
const MARKS_KEY: &str = "presence/marks";
/// Bytes of held documents sent to one new connection at most (anti-entropy); the rest
/// arrive with their origins' next heartbeats.
pub const ANTI_ENTROPY_BYTES: usize = 2 * 1024 * 1024;
/// How often held documents are checked for expiry.
const EXPIRE_EVERY: Duration = Duration::from_secs(30);

/// When our document is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceTiming {
    /// Delay after the first change before publishing (default 2 s). Later changes in the
    /// window ride along.
    pub debounce: Duration,
    /// Publish at least this often when nothing changes (default 60 s).
    pub heartbeat: Duration,
    /// Least time between two publications (default 1.5 s; never below 1.1 s, because
    /// receivers accept one document per origin per second).
    pub min_interval: Duration,
}

impl Default for PresenceTiming {
    fn default() -> Self {
        PresenceTiming {
            debounce: Duration::from_secs(2),
            heartbeat: Duration::from_secs(60),
            min_interval: Duration::from_millis(1500),
        }
    }
}

/// Presence state of a running node (shared by its tasks).
pub(crate) struct PresenceState {
    pub table: Mutex<PresenceTable>,
    /// Our latest signed document, when publishing.
    pub own: Mutex<Option<Map<String, Value>>>,
    pub publish: bool,
    pub timing: PresenceTiming,
    /// Presence lines written by forwarding accepted documents.
    pub forward_lines: AtomicU64,
    /// Presence lines written to new connections (anti-entropy).
    pub greeting_lines: AtomicU64,
    /// Lines not written because a peer's queue was full.
    pub forward_dropped: AtomicU64,
    /// Documents we signed.
    pub published: AtomicU64,
    /// Last line sent or received, Unix ms (0: none yet).
    pub last_activity_ms: AtomicU64,
}

impl PresenceState {
    pub fn new(me: PeerKey, publish: bool, timing: PresenceTiming) -> PresenceState {
        let floor = Duration::from_millis(crate::presence::RATE_INTERVAL_MS + 100);
        PresenceState {
            table: Mutex::new(PresenceTable::new(me)),
            own: Mutex::new(None),
            publish,
            timing: PresenceTiming {
                min_interval: timing.min_interval.max(floor),
                ..timing
            },
            forward_lines: AtomicU64::new(0),
            greeting_lines: AtomicU64::new(0),
            forward_dropped: AtomicU64::new(0),
            published: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, PresenceTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A presence line carrying `raw` (a document's exact JSON text) with `hops`; `None` when
/// `raw` is not JSON (never for texts the table kept).
fn presence_line(inner: &Inner, raw: &str, hops: u64) -> Option<Vec<u8>> {
    crate::presence::encode_line(
        &inner.store.next_control_id(),
        &wire::time::format_ms(wire::time::now_ms()),
        raw,
        hops,
    )
}

/// Write `line` to every up presence peer not in `except`. Returns lines queued.
fn broadcast(inner: &Inner, line: &[u8], except: &[PeerKey]) -> u64 {
    let targets: Vec<_> = {
        let conns = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .iter()
            .filter(|(k, c)| c.up && c.presence && !except.contains(k))
            .map(|(_, c)| c.handles.clone())
            .collect()
    };
    let mut sent = 0;
    for h in targets {
        if h.ephemeral.try_send(line.to_vec()) {
            sent += 1;
        } else {
            inner
                .presence
                .forward_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    sent
}

/// A `presence` line arrived from `from`: apply the rules, forward when they say so. The
/// document is forwarded as the exact bytes received (`doc_raw`).
pub(crate) fn received(inner: &Inner, from: PeerKey, msg: PresenceMsg) {
    let now = wire::time::now_ms();
    // For the log of a refusal: who the document claims to be from, cut to size.
    let claimed = msg
        .doc
        .get("origin")
        .and_then(Value::as_str)
        .map(crate::control::shown)
        .unwrap_or_default();
    let raw = msg
        .doc_raw
        .unwrap_or_else(|| serde_json::to_string(&msg.doc).unwrap_or_default());
    // An origin not held before is an agent newly present: announced as an event.
    let origin = msg
        .doc
        .get("origin")
        .and_then(serde_json::Value::as_str)
        .and_then(|o| PeerKey::parse(o).ok());
    let name = msg
        .doc
        .get("name")
        .and_then(serde_json::Value::as_str)
        .map(crate::control::shown);
    let new_origin = origin.is_some_and(|o| inner.presence.table().get(&o, now).is_none());
    let outcome =
        inner
            .presence
            .table()
            .accept_raw(msg.doc, Some(raw.clone()), msg.hops, from, now);
    match outcome {
        Ok(a) => {
            tracing::debug!(origin = %a.origin, seq = a.seq, hops = msg.hops, via = %from, "presence accepted");
            if new_origin {
                inner.emit(serde_json::json!({
                    "event": "presence",
                    "origin": a.origin.to_string(),
                    "name": name,
                    "via": from.to_string(),
                    "hops": msg.hops,
                }));
            }
            if let Some(hops) = a.forward_to_hops {
                if let Some(line) = presence_line(inner, &raw, hops) {
                    let n = broadcast(inner, &line, &[from, a.origin]);
                    inner.presence.forward_lines.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
        // Every drop is logged with its reason (`relay status` counts them by name).
        Err(r) => {
            tracing::debug!(via = %from, origin = %claimed, reason = r.name(), "presence refused: {r}")
        }
    }
}

/// Lines for a session that just came up with `peer` (anti-entropy): our own document
/// and every fresh held document except the peer's own, newest first, within
/// [`ANTI_ENTROPY_BYTES`] and the hop bound. Empty when the peer is not a presence peer.
pub(crate) fn greeting(inner: &Inner, peer: &PeerKey) -> Vec<Vec<u8>> {
    let is_presence_peer = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(peer)
        .is_some_and(|c| c.presence);
    if !is_presence_peer {
        return Vec::new();
    }
    let mut docs: Vec<(std::sync::Arc<str>, u64)> = Vec::new();
    if let Some(own) = inner
        .presence
        .own
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
    {
        docs.push((serde_json::to_string(own).unwrap_or_default().into(), 0));
    }
    {
        let table = inner.presence.table();
        for h in table.fresh(wire::time::now_ms()) {
            let hops = h.hops.saturating_add(1);
            if h.origin != *peer && hops < MAX_HOPS {
                docs.push((h.raw.clone(), hops));
            }
        }
    }
    let mut lines = Vec::new();
    let mut bytes = 0;
    for (raw, hops) in docs {
        let Some(line) = presence_line(inner, &raw, hops) else {
            continue;
        };
        bytes += line.len();
        if bytes > ANTI_ENTROPY_BYTES {
            break;
        }
        lines.push(line);
    }
    inner
        .presence
        .greeting_lines
        .fetch_add(lines.len() as u64, Ordering::Relaxed);
    lines
}

/// Background work: expiry of held documents, and publishing when enabled.
pub(crate) async fn run(inner: Arc<Inner>) {
    let mut events = inner.subscribe_quiet();
    let timing = inner.presence.timing;
    let publish = inner.presence.publish;
    let start = Instant::now();
    // Publish once at start (after the debounce), then on changes and heartbeats.
    let mut changed_at: Option<Instant> = Some(start);
    let mut last_publish: Option<Instant> = None;
    let mut expire = tokio::time::interval(EXPIRE_EVERY);
    load_marks(&inner);
    loop {
        let next = if !publish {
            None
        } else {
            let earliest = last_publish.map(|t| t + timing.min_interval);
            Some(match changed_at {
                Some(c) => earliest.map_or(c + timing.debounce, |e| e.max(c + timing.debounce)),
                None => last_publish.unwrap_or(start) + timing.heartbeat,
            })
        };
        tokio::select! {
            _ = inner.shutdown.cancelled() => {
                save_marks(&inner);
                return;
            }
            _ = expire.tick() => {
                inner.presence.table().expire(wire::time::now_ms());
                save_marks(&inner);
            }
            ev = events.recv() => match ev {
                Ok(ev) => {
                    let kind = ev.get("event").and_then(Value::as_str).unwrap_or("");
                    let kind = match kind {
                        super::conn_events::QUIET_LINE => "line",
                        super::conn_events::QUIET_ACK => "ack",
                        k => k,
                    };
                    if kind == "line" {
                        inner.presence.last_activity_ms.store(wire::time::now_ms(), Ordering::Relaxed);
                    }
                    if matches!(kind, "line" | "ack" | "peer_up" | "peer_down" | "via_up" | "via_down") && changed_at.is_none() {
                        changed_at = Some(Instant::now());
                    }
                }
                Err(RecvError::Lagged(_)) => {
                    changed_at.get_or_insert_with(Instant::now);
                }
                Err(RecvError::Closed) => return,
            },
            _ = sleep_until(next) => {
                changed_at = None;
                last_publish = Some(Instant::now());
                if let Err(e) = publish_now(&inner).await {
                    tracing::warn!("presence not published: {e}");
                }
            }
        }
    }
}

/// A publication is outbound traffic for the presence peers we chose to connect to
/// (`awp connect`): one that said bye (a relay restarting says `bye shutdown`) is unparked
/// and its dialer woken, as a queued line would (protocol-notes §bye: a peer that said bye
/// is not redialed until new outbound traffic is queued for it). A peer parked by
/// `awp disconnect` stays parked.
fn redial_parked_relays(inner: &Arc<Inner>) {
    let peers = match inner.store.peers() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("presence: peers not read: {e}");
            return;
        }
    };
    for p in peers {
        if !p.parked || p.parked_by_us || !p.caps.iter().any(|c| c == CAP) {
            continue;
        }
        let dialed = inner
            .store
            .addresses(&p.key)
            .unwrap_or_default()
            .iter()
            .any(|a| a.source == crate::store::AddrSource::Connect);
        if !dialed {
            continue;
        }
        if let Err(e) = inner.store.set_parked(&p.key, crate::store::Park::Clear) {
            tracing::warn!("presence: could not unpark {}: {e}", p.key);
            continue;
        }
        tracing::info!(
            "presence: redialing {} (it said bye; our presence is traffic for it)",
            p.key
        );
        super::dialer::ensure(inner, p.key);
    }
}

/// Take back the watermarks saved by [`save_marks`] (those still fresh).
fn load_marks(inner: &Inner) {
    match inner.store.meta_get(MARKS_KEY) {
        Ok(Some(bytes)) => {
            let marks = crate::presence::decode_marks(&bytes);
            inner
                .presence
                .table()
                .restore_marks(marks, wire::time::now_ms());
        }
        Ok(None) => {}
        Err(e) => tracing::warn!("presence watermarks not loaded: {e}"),
    }
}

/// Save the watermarks when one changed (durable with the store's next flush).
fn save_marks(inner: &Inner) {
    let bytes = {
        let mut t = inner.presence.table();
        if !t.take_marks_changed() {
            return;
        }
        crate::presence::encode_marks(&t.marks())
    };
    if let Err(e) = inner.store.meta_put(MARKS_KEY, &bytes) {
        tracing::warn!("presence watermarks not saved: {e}");
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Build, sign and send our document. The seq is stored and flushed before it is used.
/// Relays we joined that said bye are redialed first ([`redial_parked_relays`]); the
/// `published` count goes up after that.
async fn publish_now(inner: &Arc<Inner>) -> Result<(), crate::store::StoreError> {
    let store = &inner.store;
    let inputs = gather(inner)?;
    let last = store
        .meta_get(SEQ_KEY)?
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map(u64::from_be_bytes);
    let now = wire::time::now_ms();
    let seq = doc::next_seq(last, now);
    store.meta_put(SEQ_KEY, &seq.to_be_bytes())?;
    store.flush().await?;
    let d = doc::build_signed(&inner.identity, &inputs, seq, now);
    *inner.presence.own.lock().unwrap_or_else(|p| p.into_inner()) = Some(d.clone());
    redial_parked_relays(inner);
    inner.presence.published.fetch_add(1, Ordering::Relaxed);
    let raw = serde_json::to_string(&d).unwrap_or_default();
    let n = match presence_line(inner, &raw, 0) {
        Some(line) => broadcast(inner, &line, &[]),
        None => 0,
    };
    tracing::debug!(seq, peers = n, "presence published");
    Ok(())
}

fn gather(inner: &Inner) -> Result<DocInputs, crate::store::StoreError> {
    let store = &inner.store;
    let up: std::collections::HashSet<PeerKey> = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, c)| c.up)
        .map(|(k, _)| *k)
        .collect();
    let mut peers = store.peers()?;
    // Connected peers first, then the most recently seen.
    peers.sort_by_key(|p| (!up.contains(&p.key), std::cmp::Reverse(p.last_seen_ms)));
    let peers = peers
        .into_iter()
        .take(doc::MAX_PEERS)
        .map(|p| PeerEntry {
            key: p.key,
            name: p.name,
            up: up.contains(&p.key),
            rtt_ms: None,
        })
        .collect();
    let threads: Vec<ThreadEntry> = store
        .threads()?
        .into_iter()
        .map(|t| ThreadEntry {
            th: t.th,
            peer: t.peer,
            subject: t.subject,
            mine: t.mine,
            theirs: t.theirs,
            updated_ms: t.updated_ms,
            unread: t.unread,
        })
        .collect();
    let unread = threads.iter().map(|t| t.unread).sum();
    let mut outbox = 0;
    for p in store.outbox_peers()? {
        outbox += store.outbox_len(&p)?;
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let active = inner.presence.last_activity_ms.load(Ordering::Relaxed);
    Ok(DocInputs {
        name: Some(inner.name.clone()),
        about: inner.about.clone(),
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        harness: env("AWP_HARNESS"),
        model: env("AWP_MODEL"),
        host: hostname(),
        active_ms: (active > 0).then_some(active),
        peers,
        threads,
        outbox,
        unread,
        circuits: super::circuits::live_addresses(inner)
            .iter()
            .map(|a| a.to_string())
            .collect(),
    })
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
}

/// One document for `awp presence`: a summary (list) or everything (`full`).
fn describe(
    inner: &Inner,
    doc: &Map<String, Value>,
    hops: Option<u64>,
    via: Option<PeerKey>,
    full: bool,
) -> Value {
    let s = |k: &str| doc.get(k).and_then(Value::as_str);
    let peers = doc.get("peers").and_then(Value::as_array);
    let peers_up = peers.map_or(0, |p| {
        p.iter()
            .filter(|p| p.get("up").and_then(Value::as_bool) == Some(true))
            .count()
    });
    let mut v = json!({
        "origin": s("origin"),
        "name": s("name"),
        "host": s("host"),
        "harness": s("harness"),
        "model": s("model"),
        "version": s("version"),
        "active": s("active"),
        "waiting": doc.get("waiting").and_then(Value::as_bool),
        "peers_up": peers_up,
        "peers": peers.map_or(0, Vec::len),
        "threads": doc.get("threads").and_then(Value::as_array).map_or(0, Vec::len),
        "outbox": doc.get("outbox"),
        "unread": doc.get("unread"),
        "seq": doc.get("seq"),
        "ts": s("ts"),
        "hops": hops,
        "via": via.map(|k| k.to_string()),
        "via_name": via.and_then(|k| inner.peer_name(&k)),
        "own": via.is_none(),
    });
    if full {
        let verified = s("origin")
            .and_then(|o| PeerKey::parse(o).ok())
            .is_some_and(|k| crate::canonical::verify_object(&k, doc));
        v["verified"] = json!(verified);
        v["doc"] = Value::Object(doc.clone());
    }
    v
}

/// Known agents for `awp presence`: `{"agents":[…]}`, ours first. With `who`, the one
/// document whose origin is that key, key prefix (≥ 4 characters) or name, in full with
/// `verified`; `None` when nothing matches, `Err` with a message when several do.
pub(crate) fn list(
    inner: &Inner,
    who: Option<&str>,
    page: &crate::control::Page,
) -> Result<Option<Value>, String> {
    let now = wire::time::now_ms();
    let own = inner
        .presence
        .own
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let table = inner.presence.table();
    // (document, hops, via); ours has neither.
    type Entry<'a> = (&'a Map<String, Value>, Option<u64>, Option<PeerKey>);
    let mut all: Vec<Entry> = Vec::new();
    if let Some(o) = &own {
        all.push((o, None, None));
    }
    for h in table.fresh(now) {
        all.push((&h.doc, Some(h.hops), Some(h.via)));
    }
    let origin_of =
        |d: &Map<String, Value>| d.get("origin").and_then(Value::as_str).map(str::to_string);
    let Some(who) = who else {
        // A page: ours first, then the others in origin order, after the cursor (an
        // origin; ours sorts before every other).
        let own_origin = own.as_ref().and_then(origin_of);
        let mut others: Vec<&Entry> = all.iter().filter(|(_, h, _)| h.is_some()).collect();
        others.sort_by_key(|(d, _, _)| origin_of(d));
        let cursor = page.cursor.as_deref();
        let past_own = cursor.is_some();
        let ordered = all
            .iter()
            .filter(|(_, h, _)| h.is_none() && !past_own)
            .chain(others.into_iter().filter(|(d, _, _)| {
                let o = origin_of(d);
                cursor.is_none_or(|c| Some(c) == own_origin.as_deref() || o.as_deref() > Some(c))
            }));
        let mut out = super::lists::Pager::new(page);
        for (d, h, v) in ordered {
            let cursor = origin_of(d).unwrap_or_default();
            if !out.push(cursor, describe(inner, d, *h, *v, false)) {
                break;
            }
        }
        return Ok(Some(out.finish("agents")));
    };
    let prefix = who.strip_prefix("ed25519:").unwrap_or(who);
    let hits: Vec<_> = all
        .iter()
        .filter(|(d, _, _)| {
            let o = origin_of(d).unwrap_or_default();
            let name = d.get("name").and_then(Value::as_str);
            o == who
                || name == Some(who)
                || name.and_then(|n| n.split('@').next()) == Some(who)
                || (prefix.len() >= 4
                    && o.strip_prefix("ed25519:")
                        .is_some_and(|k| k.starts_with(prefix)))
        })
        .collect();
    match hits.as_slice() {
        [] => Ok(None),
        [(d, h, v)] => Ok(Some(describe(inner, d, *h, *v, true))),
        more => Err(format!("{} agents match {who:?}", more.len())),
    }
}

/// Counters for `awp relay status` / the presence status request.
pub(crate) fn status(inner: &Inner) -> Value {
    let (connections, presence_peers) = {
        let c = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
        (
            c.values().filter(|c| c.up).count(),
            c.values().filter(|c| c.up && c.presence).count(),
        )
    };
    let table = inner.presence.table();
    let counters = table.counters().clone();
    let own_seq = inner
        .presence
        .own
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|d| d.get("seq").cloned());
    let p = &inner.presence;
    json!({
        "relay": inner.relay,
        "publishing": p.publish,
        "connections": connections,
        "presence_peers": presence_peers,
        "max_connections": inner.max_connections,
        "refused_connections": inner.refused_conns.load(Ordering::Relaxed),
        "documents": table.len(),
        "accepted": counters.accepted,
        "forwarded": counters.forwarded,
        "forward_lines": p.forward_lines.load(Ordering::Relaxed),
        "greeting_lines": p.greeting_lines.load(Ordering::Relaxed),
        "forward_dropped": p.forward_dropped.load(Ordering::Relaxed),
        "dropped": counters.dropped(),
        "refused": counters.refused,
        "expired": counters.expired,
        "published": p.published.load(Ordering::Relaxed),
        "own_seq": own_seq,
        "circuits": inner.circuits.status()["circuits"],
        "via": inner.circuits.status()["via"],
    })
}
