//! Artifact threads on AWP threads (the rules are in [`crate::artifact`]; the mapping in
//! `spec/artifact-threads.md`).
//!
//! - The node that opens an artifact thread hosts it: authoritative state and event log
//!   (seq from 1) in the store. The other party keeps a replica built only from the
//!   host's events (readable offline).
//! - A command is a msg with a data part of mime [`MIME_COMMAND`]. The host runs it as
//!   `external_agent` {client_id: peer key, name: hello name} with the capabilities the
//!   peer's honored grants give now, and answers with a msg (`re` = the command msg) with
//!   one [`MIME_RESULT`] part and one [`MIME_EVENT`] part per event. The new state, the
//!   events, the dedup result and that reply msg are written in the SAME store transaction
//!   as the command msg itself (an [`InboundHook`] inside `receive_batch`), so the msg is
//!   acked only once all of it is durable, and a crash leaves all or none of it.
//! - Events the host causes itself (its CLI, run events from the peer's AWP thread
//!   state) go to the peer as event parts too.
//! - The replica applies events strictly in seq order, holds back what arrives after a
//!   gap and asks the host to resend ([`MIME_RESEND`] `{after_seq}`).
//! - Every applied event and every result is also a node event (`artifact`,
//!   `artifact_result`) for `awp tail`, `awp listen` and `awp artifact log --follow`.

use super::Inner;
use crate::artifact::state::json_len;
use crate::artifact::{
    self, engine, runs, Actor, CapSet, EventEnvelope, IdSource, Workspace, WorkspaceState,
    MIME_COMMAND, MIME_ERROR, MIME_EVENT, MIME_RESEND, MIME_RESULT,
};
use crate::store::{ArtTx, InboundHook, StoreError, WsRecord, WsRole};
use crate::wire::{self, DataPart, Line, Part, PeerKey};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

mod cache;
mod control;
pub(crate) use control::handle as control;
pub(super) use control::scope_caps;
pub(super) mod http;

/// A snapshot of a workspace's state is written every this many events (the state is the
/// snapshot plus the events after it).
const SNAPSHOT_EVERY: u64 = 4096;
/// Most replicas one peer may open here (each is a thread it hosts and we follow): event
/// parts in yet another new thread from that peer are dropped, with a log line. Without a
/// bound, any peer could make this node keep state for as many threads as it names.
pub const MAX_REPLICAS_PER_PEER: usize = 256;
/// Bytes of event parts per msg. A line may be up to 1 MiB, but sled (0.34) writes a
/// record over about 128 KiB (its segment size / 4) to a new file of its own instead of
/// its log, and a msg is stored twice on each side (outbox or received, and the log):
/// msgs of at most 96 KiB of events stay in the log. A single event larger than this
/// still travels alone in its own msg.
const EVENT_BYTES_PER_MSG: usize = 96 * 1024;
/// Most command parts the host runs from one msg (spec §Wire): the rest get one error part
/// and are not run. A guest packs at most this many commands (and
/// [`EVENT_BYTES_PER_MSG`] bytes of them) into one msg.
pub const MAX_COMMANDS_PER_MSG: usize = 256;
/// Events resent per resend request (more follow on the next request).
const RESEND_MAX: usize = 20_000;
/// Bytes of events (as JSON) resent per resend request: the replica asks again after
/// applying them, so one request never loads or queues more than this.
const RESEND_BYTES: usize = 5 * 1024 * 1024;
/// Largest event, in bytes, that still fits in one msg line with its envelope (spec
/// §Size: a bigger one is refused before it is appended).
const MAX_EVENT_BYTES: usize = wire::MAX_LINE - 8 * 1024;

/// Random ids from the OS generator.
struct OsIds;
impl IdSource for OsIds {
    fn fill(&mut self, buf: &mut [u8]) {
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), buf);
    }
}

fn now_us() -> i64 {
    (wire::time::now_ms() as i64).saturating_mul(1000)
}

/// Per-node artifact state: the in-memory workspaces (a bounded cache of snapshot + log,
/// [`cache::WsCache`]) and the node events waiting for their transaction to become durable.
pub(crate) struct Artifacts {
    node: OnceLock<Weak<Inner>>,
    cache: Mutex<cache::WsCache>,
    /// Node events to emit once the msg `(peer, id)` that caused them is durable.
    pending: Mutex<HashMap<(PeerKey, String), Vec<Value>>>,
}

impl Artifacts {
    pub(crate) fn new() -> Arc<Artifacts> {
        Arc::new(Artifacts {
            node: OnceLock::new(),
            cache: Mutex::new(cache::WsCache::new(
                cache::MAX_CACHED,
                cache::MAX_CACHED_BYTES,
            )),
            pending: Mutex::new(HashMap::new()),
        })
    }

    /// Connect to the node (after `Inner` exists) and install the store hook.
    pub(crate) fn install(self: &Arc<Self>, inner: &Arc<Inner>) {
        let _ = self.node.set(Arc::downgrade(inner));
        inner.store.set_inbound_hook(self.clone());
    }

    fn node(&self) -> Option<Arc<Inner>> {
        self.node.get().and_then(Weak::upgrade)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, cache::WsCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The workspace of `rec` as of its `head_seq` and its estimated bytes: the cached
    /// one, or snapshot + log.
    fn load(&self, tx: &ArtTx<'_, '_>, rec: &WsRecord) -> Result<(Workspace, usize), StoreError> {
        if let Some((ws, bytes)) = self.cache().take(&rec.th) {
            if ws.state.head_seq == rec.head_seq {
                return Ok((ws, bytes));
            }
        }
        rebuild(tx, rec)
    }

    /// Keep `ws` (estimated `bytes`) for the next command (the record written in the same
    /// transaction says which head it belongs to; a failed commit makes the cache stale,
    /// and it is reloaded).
    fn keep(&self, ws: Workspace, bytes: usize) {
        self.cache().put(ws, bytes);
    }

    fn defer(&self, peer: &PeerKey, msg_id: &str, evs: Vec<Value>) {
        if evs.is_empty() {
            return;
        }
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((*peer, msg_id.to_string()))
            .or_default()
            .extend(evs);
    }

    fn take_deferred(&self, peer: &PeerKey, msg_id: &str) -> Vec<Value> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(*peer, msg_id.to_string()))
            .unwrap_or_default()
    }
}

/// The workspace of `rec` as of its `head_seq`, from the store: snapshot + log; with its
/// estimated bytes (the snapshot's JSON size plus the events' since).
fn rebuild(tx: &ArtTx<'_, '_>, rec: &WsRecord) -> Result<(Workspace, usize), StoreError> {
    let mut bytes = 0;
    let mut state = match tx.snapshot_state::<WorkspaceState>(&rec.th)? {
        Some((_, st, n)) => {
            bytes += n;
            st
        }
        None => WorkspaceState::new(&rec.th),
    };
    while state.head_seq < rec.head_seq {
        let evs = tx.events_after_as::<EventEnvelope>(&rec.th, state.head_seq, 4096)?;
        if evs.is_empty() {
            break;
        }
        for (env, n) in evs {
            bytes += n;
            state.apply_event(&env).map_err(|e| StoreError::Corrupt {
                tree: "art_events",
                detail: e.to_string(),
            })?;
        }
    }
    Ok((
        Workspace {
            state,
            dedup: Default::default(),
        },
        bytes,
    ))
}

/// Append `envs` (already applied to `ws`) to the log of `rec`, with a snapshot when due.
/// `rec.head_seq` follows; the caller writes `rec` once it is done with the msg (not once
/// per event).
fn append<'v>(
    tx: &mut ArtTx<'_, '_>,
    rec: &mut WsRecord,
    ws: &Workspace,
    envs: impl IntoIterator<Item = &'v Value>,
) -> Result<(), StoreError> {
    for e in envs {
        let seq = e.get("seq").and_then(Value::as_u64).unwrap_or(0);
        tx.put_event(&rec.th, seq, e)?;
    }
    let before = rec.head_seq;
    rec.head_seq = ws.state.head_seq;
    if before / SNAPSHOT_EVERY != rec.head_seq / SNAPSHOT_EVERY {
        tx.put_snapshot_state(&rec.th, rec.head_seq, &ws.state)?;
    }
    Ok(())
}

fn to_values<T: serde::Serialize>(xs: &[T]) -> Vec<Value> {
    xs.iter()
        .filter_map(|x| serde_json::to_value(x).ok())
        .collect()
}

fn data_part(mime: &str, data: Value) -> Part {
    Part::Data(DataPart {
        data,
        mime: Some(mime.to_string()),
    })
}

/// Queue msgs for `peer` in `th` carrying `lead` parts (results, errors) then `events`
/// (each with its JSON size in bytes, measured once where it was made), in that order,
/// split so that no msg carries more than [`EVENT_BYTES_PER_MSG`] of parts (a bigger part
/// travels alone): every line stays well under the 1 MiB cap. `re` on every msg, `subject`
/// on the first.
fn queue_parts(
    tx: &mut ArtTx<'_, '_>,
    peer: &PeerKey,
    th: &str,
    re: Option<&str>,
    subject: Option<&str>,
    lead: Vec<Part>,
    events: Vec<(Value, usize)>,
) -> Result<(), StoreError> {
    let lead = lead.into_iter().map(|p| {
        let n = match &p {
            Part::Data(d) => json_len(&d.data),
            _ => 0,
        };
        (p, n)
    });
    let events = events
        .into_iter()
        .map(|(e, n)| (data_part(MIME_EVENT, e), n));
    let mut msgs: Vec<Vec<Part>> = vec![Vec::new()];
    let mut bytes = 0usize;
    for (part, size) in lead.chain(events) {
        let size = size + 64;
        let last = msgs.last_mut().expect("one msg");
        if !last.is_empty() && bytes + size > EVENT_BYTES_PER_MSG {
            msgs.push(Vec::new());
            bytes = 0;
        }
        msgs.last_mut().expect("one msg").push(part);
        bytes += size;
    }
    for (i, parts) in msgs.into_iter().enumerate() {
        if parts.is_empty() {
            continue;
        }
        let subject = if i == 0 {
            subject.map(str::to_string)
        } else {
            None
        };
        // The builder runs once per enqueue: it hands over the parts without a copy.
        let parts = Mutex::new(Some(parts));
        let build = move |id: &str, ts: &str| {
            Line::Msg(wire::Msg {
                id: id.into(),
                ts: ts.into(),
                th: th.to_string(),
                re: re.map(str::to_string),
                subject: subject.clone(),
                parts: parts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_default(),
            })
        };
        tx.enqueue(peer, &[&build])?;
    }
    Ok(())
}

/// Command frames packed into the parts of as few msgs as the bounds allow: at most
/// [`MAX_COMMANDS_PER_MSG`] commands and [`EVENT_BYTES_PER_MSG`] bytes of them per msg
/// (a bigger command alone in its msg), in order (spec §Wire).
pub(super) fn pack_commands(frames: Vec<Value>) -> Vec<Vec<Part>> {
    let mut msgs: Vec<Vec<Part>> = Vec::new();
    let mut bytes = 0usize;
    for f in frames {
        let size = json_len(&f) + 64;
        match msgs.last_mut() {
            Some(last)
                if last.len() < MAX_COMMANDS_PER_MSG && bytes + size <= EVENT_BYTES_PER_MSG =>
            {
                last.push(data_part(MIME_COMMAND, f));
                bytes += size;
            }
            _ => {
                msgs.push(vec![data_part(MIME_COMMAND, f)]);
                bytes = size;
            }
        }
    }
    msgs
}

/// The node events for applied envelopes (`awp tail`, `awp listen`).
fn node_events<'v>(rec: &WsRecord, envs: impl IntoIterator<Item = &'v Value>) -> Vec<Value> {
    let peer = rec.peer.to_string();
    envs.into_iter()
        .map(|e| {
            json!({
                "event": "artifact",
                "th": rec.th,
                "role": rec.role,
                "peer": peer,
                "seq": e.get("seq"),
                "type": e.pointer("/event/type"),
                "frame": e,
            })
        })
        .collect()
}

fn result_event(th: &str, peer: &PeerKey, result: &Value) -> Value {
    json!({
        "event": "artifact_result",
        "th": th,
        "peer": peer.to_string(),
        "command_id": result.get("command_id"),
        "ok": result.get("ok"),
        "result": result,
    })
}

/// What one command did: its result (a CommandResult, or an ErrorFrame when it does not
/// parse: `is_error`) and the events it appended.
struct Ran {
    result: Value,
    is_error: bool,
    /// The events, each with its JSON size in bytes.
    envs: Vec<(Value, usize)>,
}

/// Run one command frame (JSON as received) on the hosted workspace `ws` (estimated
/// `*ws_bytes`, grown by the events): dedup by (participant, command_id) in the store,
/// then the engine.
fn run_command(
    tx: &mut ArtTx<'_, '_>,
    rec: &mut WsRecord,
    ws: &mut Workspace,
    ws_bytes: &mut usize,
    actor: Actor,
    caps: CapSet,
    frame: &Value,
) -> Result<Ran, StoreError> {
    let parsed = match artifact::parse_command_frame(frame) {
        Ok(f) => f,
        Err(e) => {
            let v = serde_json::to_value(&e).unwrap_or(Value::Null);
            return Ok(Ran {
                result: v,
                is_error: true,
                envs: Vec::new(),
            });
        }
    };
    let participant = actor.participant();
    let cid = parsed.command_id.clone();
    if !cid.contains('\0') {
        if let Some(r) = tx.dedup(&rec.th, &participant, &cid)? {
            return Ok(Ran {
                result: r,
                is_error: false,
                envs: Vec::new(),
            });
        }
    }
    let mut ids = OsIds;
    let mut ctx = engine::Context {
        actor,
        caps,
        now_us: now_us(),
        ids: &mut ids,
    };
    let (result, envs) = engine::apply(ws, &mut ctx, &parsed);
    let mut result = serde_json::to_value(&result).map_err(|e| StoreError::Db(e.to_string()))?;
    let mut envs: Vec<(Value, usize)> = to_values(&envs)
        .into_iter()
        .map(|e| {
            let n = json_len(&e);
            (e, n)
        })
        .collect();
    if envs.iter().any(|(_, n)| *n == 0 || *n > MAX_EVENT_BYTES) {
        // An event that cannot travel in one line is never appended: undo and refuse.
        (*ws, *ws_bytes) = rebuild(tx, rec)?;
        envs.clear();
        result = json!({"type": "command_result", "command_id": cid, "ok": false, "outcome": null,
            "rejection": {"type": "validation_failed", "message": "the change is too large for the wire", "errors": []}});
    }
    if !cid.contains('\0') {
        tx.put_dedup(&rec.th, &participant, &cid, &result)?;
    }
    append(tx, rec, ws, envs.iter().map(|(e, _)| e))?;
    *ws_bytes += envs.iter().map(|(_, n)| n).sum::<usize>();
    Ok(Ran {
        result,
        is_error: false,
        envs,
    })
}

impl Artifacts {
    /// The actor and capabilities of a remote peer in `th`, from the caps of its honored
    /// grants and its name (both read once per received batch, [`Guest`]).
    fn remote_actor(&self, peer: &PeerKey, th: &str, guest: &Guest) -> (Actor, CapSet) {
        (
            Actor::ExternalAgent {
                client_id: peer.to_string(),
                name: guest.name.clone(),
            },
            CapSet::from_grant_caps(&guest.caps, th),
        )
    }

    /// Host: the command parts of `m` from the guest.
    fn host_msg(
        &self,
        tx: &mut ArtTx<'_, '_>,
        inner: &Inner,
        rec: &mut WsRecord,
        guest: &Guest,
        peer: &PeerKey,
        m: &wire::Msg,
    ) -> Result<(), StoreError> {
        let (mut ws, mut ws_bytes) = self.load(tx, rec)?;
        let mut lead = Vec::new();
        let mut all_events = Vec::new();
        let mut notes = Vec::new();
        let mut n = 0;
        let mut resends = 0;
        for p in &m.parts {
            let Part::Data(DataPart {
                data,
                mime: Some(mime),
            }) = p
            else {
                continue;
            };
            match mime.as_str() {
                MIME_COMMAND => {
                    n += 1;
                    if n > MAX_COMMANDS_PER_MSG {
                        // At most MAX_COMMANDS_PER_MSG per msg (spec §Wire): the extras
                        // are not run, and one error part answers them all.
                        if n == MAX_COMMANDS_PER_MSG + 1 {
                            lead.push(data_part(
                                MIME_ERROR,
                                json!({"type": "error", "message": format!("at most {MAX_COMMANDS_PER_MSG} commands per msg: the rest were not run")}),
                            ));
                        }
                        continue;
                    }
                    let (actor, cs) = self.remote_actor(peer, &rec.th, guest);
                    let Ran {
                        result,
                        is_error,
                        envs,
                    } = run_command(tx, rec, &mut ws, &mut ws_bytes, actor, cs, data)?;
                    if is_error {
                        lead.push(data_part(MIME_ERROR, result));
                    } else {
                        notes.push(result_event(&rec.th, peer, &result));
                        lead.push(data_part(MIME_RESULT, result));
                    }
                    notes.extend(node_events(rec, envs.iter().map(|(e, _)| e)));
                    all_events.extend(envs);
                }
                MIME_RESEND => {
                    // One resend per msg, and none while the guest's outbox is over the
                    // served-results quota: each one queues part of the log again.
                    resends += 1;
                    if resends > 1 {
                        continue;
                    }
                    let after = data.get("after_seq").and_then(Value::as_u64).unwrap_or(0);
                    let full = super::serve::over_quota(inner, peer, (1, 0));
                    if after > rec.head_seq || full.is_some() {
                        let msg = full.unwrap_or_else(|| {
                            format!("resend after {after}: head is {}", rec.head_seq)
                        });
                        let part = data_part(MIME_ERROR, json!({"type": "error", "message": msg}));
                        queue_parts(tx, peer, &rec.th, Some(&m.id), None, vec![part], Vec::new())?;
                        continue;
                    }
                    let mut evs = Vec::new();
                    let mut bytes = 0usize;
                    let mut at = after;
                    while evs.len() < RESEND_MAX && bytes < RESEND_BYTES {
                        let chunk = tx.events_after(&rec.th, at, 64)?;
                        if chunk.is_empty() {
                            break;
                        }
                        for e in chunk {
                            let n = json_len(&e);
                            bytes += n;
                            at += 1;
                            evs.push((e, n));
                            if bytes >= RESEND_BYTES || evs.len() >= RESEND_MAX {
                                break;
                            }
                        }
                    }
                    queue_parts(tx, peer, &rec.th, Some(&m.id), None, Vec::new(), evs)?;
                }
                _ => {}
            }
        }
        tx.put_ws(rec)?;
        self.keep(ws, ws_bytes);
        if !lead.is_empty() {
            queue_parts(tx, peer, &rec.th, Some(&m.id), None, lead, all_events)?;
        }
        self.defer(peer, &m.id, notes);
        Ok(())
    }

    /// Host: the guest's AWP thread state drives run events.
    fn host_state(
        &self,
        tx: &mut ArtTx<'_, '_>,
        guest: &Guest,
        rec: &mut WsRecord,
        peer: &PeerKey,
        s: &wire::State,
    ) -> Result<(), StoreError> {
        let (mut ws, ws_bytes) = self.load(tx, rec)?;
        let (party, _) = self.remote_actor(peer, &rec.th, guest);
        let mut ids = OsIds;
        let evs = runs::on_peer_state(
            &ws.state,
            &party,
            &rec.th,
            &s.state,
            s.note.as_deref(),
            &mut ids,
        );
        if evs.is_empty() {
            self.keep(ws, ws_bytes);
            return Ok(());
        }
        let envs = match engine::commit(&mut ws, &party, now_us(), &mut ids, evs) {
            Ok(e) => to_values(&e),
            Err(e) => {
                tracing::warn!(th = %rec.th, "run events not recorded: {e}");
                self.keep(ws, ws_bytes);
                return Ok(());
            }
        };
        append(tx, rec, &ws, &envs)?;
        tx.put_ws(rec)?;
        let notes = node_events(rec, &envs);
        let sized: Vec<(Value, usize)> = envs
            .into_iter()
            .map(|e| {
                let n = json_len(&e);
                (e, n)
            })
            .collect();
        self.keep(ws, ws_bytes + sized.iter().map(|(_, n)| n).sum::<usize>());
        queue_parts(tx, peer, &rec.th, None, None, Vec::new(), sized)?;
        self.defer(peer, &s.id, notes);
        Ok(())
    }

    /// Replica: the event and result parts of `m` from the host.
    fn replica_msg(
        &self,
        tx: &mut ArtTx<'_, '_>,
        rec: &mut WsRecord,
        peer: &PeerKey,
        m: &wire::Msg,
    ) -> Result<(), StoreError> {
        let (mut ws, mut ws_bytes) = self.load(tx, rec)?;
        let mut notes = Vec::new();
        let mut not_host = Vec::new();
        // The events applied from this msg, and the head before them (for the snapshot).
        let mut applied: Vec<std::borrow::Cow<'_, Value>> = Vec::new();
        let mut head_before = rec.head_seq;
        for p in &m.parts {
            let Part::Data(DataPart {
                data,
                mime: Some(mime),
            }) = p
            else {
                continue;
            };
            match mime.as_str() {
                MIME_EVENT => {
                    let Some(seq) = data.get("seq").and_then(Value::as_u64).filter(|s| *s > 0)
                    else {
                        continue;
                    };
                    if seq <= rec.head_seq {
                        continue;
                    }
                    if seq
                        > rec
                            .head_seq
                            .saturating_add(artifact::replica::MAX_HELD as u64)
                    {
                        // Far beyond the head: not held (bounded storage); resent later.
                        tracing::warn!(th = %rec.th, seq, head = rec.head_seq, "host event too far ahead");
                        rec.held_max = rec.held_max.max(seq);
                        continue;
                    }
                    if seq > rec.head_seq + 1 {
                        tx.hold(&rec.th, seq, data)?;
                        rec.held_max = rec.held_max.max(seq);
                        continue;
                    }
                    let mut next = Some(std::borrow::Cow::Borrowed(data));
                    while let Some(ev) = next.take() {
                        let env = match EventEnvelope::deserialize(ev.as_ref()) {
                            Ok(e) => e,
                            Err(e) => {
                                tracing::warn!(th = %rec.th, "host event refused: {e}");
                                break;
                            }
                        };
                        if let Err(e) = ws.state.apply_event(&env) {
                            tracing::warn!(th = %rec.th, "host event does not fit the replica: {e}");
                            break;
                        }
                        // Logged here; the snapshot (when due) and the record once per msg.
                        ws_bytes += tx.put_event(&rec.th, env.seq, &ev)?;
                        rec.head_seq = env.seq;
                        if rec.held_max > rec.head_seq {
                            next = tx
                                .take_held(&rec.th, rec.head_seq + 1)?
                                .map(std::borrow::Cow::Owned);
                        }
                        applied.push(ev);
                    }
                }
                MIME_RESULT | MIME_ERROR => {
                    if let Some(h) = artifact::replica::resend_beyond_head(data, rec.head_seq) {
                        tracing::warn!(th = %rec.th, host_head = h, "host log behind ours: replica reset");
                        notes.extend(node_events(rec, applied.iter().map(|e| e.as_ref())));
                        applied.clear();
                        tx.reset_replica(rec, h)?;
                        ws = Workspace::new(&rec.th);
                        ws_bytes = 0;
                        head_before = 0;
                    }
                    notes.push(result_event(&rec.th, peer, data));
                }
                MIME_COMMAND if not_host.is_empty() => not_host.push(not_host_part(&rec.th)),
                _ => {}
            }
        }
        if head_before / SNAPSHOT_EVERY != rec.head_seq / SNAPSHOT_EVERY {
            tx.put_snapshot_state(&rec.th, rec.head_seq, &ws.state)?;
        }
        notes.extend(node_events(rec, applied.iter().map(|e| e.as_ref())));
        drop(applied);
        if !not_host.is_empty() {
            queue_parts(tx, peer, &rec.th, Some(&m.id), None, not_host, Vec::new())?;
        }
        // A gap that this msg did not fill: ask the host once per head.
        if rec.held_max > rec.head_seq && rec.resend_asked != rec.head_seq + 1 {
            rec.resend_asked = rec.head_seq + 1;
            let part = data_part(MIME_RESEND, json!({"after_seq": rec.head_seq}));
            queue_parts(tx, peer, &rec.th, None, None, vec![part], Vec::new())?;
        }
        tx.put_ws(rec)?;
        self.keep(ws, ws_bytes);
        self.defer(peer, &m.id, notes);
        Ok(())
    }
}

/// A remote peer as one received batch sees it.
struct Guest {
    /// The caps of its honored grants.
    caps: Vec<String>,
    /// Its hello name.
    name: Option<String>,
}

impl Guest {
    fn of(inner: &Arc<Inner>, peer: &PeerKey) -> Guest {
        Guest {
            caps: super::grants::honored_caps(inner, peer),
            name: inner.peer_name(peer),
        }
    }
}

/// The error part for a command sent to a node that does not host the thread.
fn not_host_part(th: &str) -> Part {
    data_part(
        MIME_ERROR,
        json!({"type": "error", "message": format!("this node does not host {th}")}),
    )
}

fn has_part(m: &wire::Msg, mime: &str) -> bool {
    m.parts
        .iter()
        .any(|p| matches!(p, Part::Data(DataPart { mime: Some(x), .. }) if x == mime))
}

/// Whether `m` carries an artifactr part.
fn is_artifact_msg(m: &wire::Msg) -> bool {
    m.parts.iter().any(|p| {
        matches!(p, Part::Data(DataPart { mime: Some(mime), .. }) if mime.starts_with("application/vnd.artifactr.v1."))
    })
}

impl InboundHook for Artifacts {
    fn on_lines(
        &self,
        tx: &mut ArtTx<'_, '_>,
        peer: &PeerKey,
        lines: &[&Line],
    ) -> Result<(), StoreError> {
        let Some(inner) = self.node() else {
            return Ok(());
        };
        // Grants are judged once per batch (a revoked or expired grant stops applying at
        // the next batch, i.e. at the next command).
        let mut guest: Option<Guest> = None;
        // Replicas this batch opened (not yet in the committed tree counted below).
        let mut opened_now = 0usize;
        for line in lines {
            let (th, is_msg) = match line {
                Line::Msg(m) if is_artifact_msg(m) => (&m.th, true),
                Line::State(s) => (&s.th, false),
                _ => continue,
            };
            let mut rec = match tx.ws(th)? {
                Some(r) if r.peer == *peer => r,
                Some(_) => continue,
                None => {
                    // A host's first events open a replica here.
                    let Line::Msg(m) = line else { continue };
                    if !has_part(m, MIME_EVENT) {
                        if has_part(m, MIME_COMMAND) {
                            let part = not_host_part(th);
                            queue_parts(tx, peer, th, Some(&m.id), None, vec![part], Vec::new())?;
                        }
                        continue;
                    }
                    let opened = inner
                        .store
                        .art_workspaces()?
                        .iter()
                        .filter(|w| w.role == WsRole::Replica && w.peer == *peer)
                        .count()
                        + opened_now;
                    if opened >= MAX_REPLICAS_PER_PEER {
                        tracing::warn!(
                            "artifact events from {peer} in new thread {th} dropped: it already hosts {opened} threads followed here (at most {MAX_REPLICAS_PER_PEER})"
                        );
                        continue;
                    }
                    opened_now += 1;
                    WsRecord {
                        th: th.clone(),
                        role: WsRole::Replica,
                        peer: *peer,
                        head_seq: 0,
                        created_ms: tx.now_ms(),
                        resend_asked: 0,
                        held_max: 0,
                    }
                }
            };
            match (rec.role, line, is_msg) {
                (WsRole::Host, Line::Msg(m), _) => {
                    let g = guest.get_or_insert_with(|| Guest::of(&inner, peer));
                    self.host_msg(tx, &inner, &mut rec, g, peer, m)?
                }
                (WsRole::Host, Line::State(s), _) => {
                    let g = guest.get_or_insert_with(|| Guest::of(&inner, peer));
                    self.host_state(tx, g, &mut rec, peer, s)?
                }
                (WsRole::Replica, Line::Msg(m), _) => self.replica_msg(tx, &mut rec, peer, m)?,
                _ => {}
            }
        }
        Ok(())
    }
}

/// After a received line is durable (and acked): wake the connection for the reply and
/// emit the node events it caused.
pub(super) fn on_received(inner: &Arc<Inner>, from: PeerKey, line: &Line) {
    let id = match line {
        Line::Msg(m) if is_artifact_msg(m) => &m.id,
        Line::State(s) => &s.id,
        _ => return,
    };
    let evs = inner.artifacts.take_deferred(&from, id);
    if evs.is_empty() && !matches!(line, Line::Msg(_)) {
        return;
    }
    inner.outbox_changed(&from);
    for e in evs {
        inner.emit(e);
    }
}

/// Run commands of this node's own user on the hosted workspace `th` (one transaction:
/// state, log, dedup, and the msgs carrying the events to the guest), flush, emit.
/// `create`: host a new workspace with that peer when `th` is none yet. `subject` titles
/// the AWP thread when this is its first msg. Returns the results (in order) and the node
/// events.
pub(super) async fn run_local(
    inner: &Arc<Inner>,
    th: &str,
    frames: Vec<Value>,
    create: Option<PeerKey>,
    subject: Option<String>,
) -> Result<(Vec<Value>, Vec<Value>), StoreError> {
    let me = inner.identity.key();
    let actor = Actor::User {
        id: me.to_string(),
        name: Some(inner.name.clone()),
    };
    let arts = inner.artifacts.clone();
    let th2 = th.to_string();
    let store = inner.store.clone();
    let ((results, notes, peer), _) = tokio::task::spawn_blocking(move || {
        store.art_tx(|tx| {
            let mut rec = match (tx.ws(&th2)?, create) {
                (Some(r), _) if r.role == WsRole::Host => r,
                (Some(_), _) => return Err(StoreError::BadLine(format!("{th2} is hosted by the peer"))),
                (None, Some(peer)) => WsRecord {
                    th: th2.clone(),
                    role: WsRole::Host,
                    peer,
                    head_seq: 0,
                    created_ms: tx.now_ms(),
                    resend_asked: 0,
                    held_max: 0,
                },
                (None, None) => return Err(StoreError::BadLine(format!("{th2} is not an artifact thread"))),
            };
            let (mut ws, mut ws_bytes) = arts.load(tx, &rec)?;
            let mut envs_all = Vec::new();
            if rec.head_seq == 0 {
                // The workspace's own artifactr thread (= th), created first.
                let ct = json!({"type":"command","command_id": format!("open-{th2}"),
                    "command":{"type":"create_thread","thread_id": th2, "title": subject.clone().unwrap_or_default()}});
                let ran = run_command(tx, &mut rec, &mut ws, &mut ws_bytes, actor.clone(), CapSet::all(), &ct)?;
                envs_all.extend(ran.envs);
            }
            let mut results = Vec::with_capacity(frames.len());
            for frame in &frames {
                let ran = run_command(tx, &mut rec, &mut ws, &mut ws_bytes, actor.clone(), CapSet::all(), frame)?;
                results.push(ran.result);
                envs_all.extend(ran.envs);
            }
            arts.keep(ws, ws_bytes);
            tx.put_ws(&rec)?;
            let notes = node_events(&rec, envs_all.iter().map(|(e, _)| e));
            queue_parts(tx, &rec.peer, &th2, None, subject.as_deref(), Vec::new(), envs_all)?;
            Ok((results, notes, rec.peer))
        })
    })
    .await
    .map_err(|e| StoreError::Db(e.to_string()))??;
    inner.store.flush().await?;
    inner.outbox_changed(&peer);
    for e in &notes {
        inner.emit(e.clone());
    }
    Ok((results, notes))
}

#[cfg(test)]
mod tests;
