//! Artifact threads (artifactr.v1 workspaces carried over AWP threads): the workspace
//! record, the event log, command dedup results, held-back replica events and artifact
//! versions. Every write goes through an [`ArtTx`], a view of one store transaction that
//! can also queue outbound lines, so a command's new state, its events, its dedup result
//! and the msg carrying its result commit together (or not at all).
//!
//! Keys start with `u32 BE length ‖ th` (thread ids are peer text: the length prefix keeps
//! one thread's keys from running into another's):
//! - `art_ws`: th → [`WsRecord`] (JSON).
//! - `art_events`: th ‖ seq (u64 BE) → EventFrame (JSON). Host: the authoritative log from
//!   seq 1. Replica: the host's events applied so far.
//! - `art_dedup`: th ‖ participant ‖ 0x00 ‖ command_id → CommandResult (JSON); at most
//!   [`DEDUP_CAPACITY`] per thread, the oldest forgotten first, in the order kept by
//!   th ‖ 0xFE ‖ n (u64 BE) → that entry's key and th ‖ 0xFF → `{first, next}` (a
//!   participant key is UTF-8, so never starts with 0xFE or 0xFF). Entries stored before
//!   this order existed are never forgotten.
//! - `art_hold`: th ‖ seq → EventFrame received after a gap (replica); th alone →
//!   `{count, bytes}` of them, at most [`MAX_HELD`] events and [`MAX_HELD_BYTES`] bytes:
//!   past that an event is not held (it comes back with the resend of the gap).
//! - `art_snap`: th → `{seq, state, format}`: the engine's state after event `seq`,
//!   written every few thousand events; the state is that snapshot plus the events after
//!   it. `format` is [`SNAPSHOT_FORMAT`]; a snapshot without it (every artifact version
//!   held its full data) is not read: the state is rebuilt from the log, which is
//!   complete from seq 1, and the next snapshot has the compact form.

use super::imp::Store;
use super::tx::{db_err, Tx, T};
use super::{LineBuilder, OutboxEntry, StoreError};
pub use crate::artifact::replica::{MAX_HELD, MAX_HELD_BYTES};
pub use crate::artifact::state::DEDUP_CAPACITY;
use crate::wire::ids::IdGen;
use crate::wire::{self, PeerKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether this node hosts a workspace or keeps a replica of the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WsRole {
    /// We opened the thread: authoritative state and log.
    Host,
    /// The peer hosts it: state built only from its events.
    Replica,
}

/// One artifact thread (= one artifactr workspace, `workspace_id` = the AWP `th`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WsRecord {
    pub th: String,
    pub role: WsRole,
    /// The other party (the guest when we host, the host otherwise).
    pub peer: PeerKey,
    /// Last event seq applied (0 = none).
    pub head_seq: u64,
    /// Created here, Unix ms.
    pub created_ms: u64,
    /// Replica: the seq we last asked the host to resend after (0 = never asked).
    #[serde(default)]
    pub resend_asked: u64,
    /// Replica: the highest seq held back after a gap (a gap is open while it is above
    /// `head_seq`).
    #[serde(default)]
    pub held_max: u64,
}

/// Work that runs inside the transaction of [`Store::receive_batch`], after the batch's
/// new lines were recorded and before it commits: an error aborts the whole batch (no line
/// is stored or acked). Installed once with [`Store::set_inbound_hook`].
pub trait InboundHook: Send + Sync {
    /// `lines`: the batch's msgs and states from `peer` that were new (not duplicates),
    /// in arrival order.
    fn on_lines(
        &self,
        tx: &mut ArtTx<'_, '_>,
        peer: &PeerKey,
        lines: &[&wire::Line],
    ) -> Result<(), StoreError>;
}

/// A view of one open store transaction for artifact records and outbound lines.
pub struct ArtTx<'a, 't> {
    store: &'a Store,
    tx: &'a mut Tx<'t>,
    ids: &'a mut IdGen,
    seq: &'a mut u64,
    now: u64,
    queued: Vec<PeerKey>,
}

fn thk(th: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + th.len() + 16);
    k.extend_from_slice(&(th.len() as u32).to_be_bytes());
    k.extend_from_slice(th.as_bytes());
    k
}

fn seq_key(th: &str, seq: u64) -> Vec<u8> {
    let mut k = thk(th);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn dedup_key(th: &str, participant: &str, command_id: &str) -> Vec<u8> {
    let mut k = thk(th);
    k.extend_from_slice(participant.as_bytes());
    k.push(0);
    k.extend_from_slice(command_id.as_bytes());
    k
}

/// Format of the snapshots written now (artifact versions as patches between checkpoints).
pub const SNAPSHOT_FORMAT: u64 = 2;

/// Order index of the dedup entries of `th`.
fn dedup_order_key(th: &str, n: u64) -> Vec<u8> {
    let mut k = thk(th);
    k.push(0xFE);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// `{first, next}` of the dedup order of `th`.
fn dedup_meta_key(th: &str) -> Vec<u8> {
    let mut k = thk(th);
    k.push(0xFF);
    k
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct DedupMeta {
    first: u64,
    next: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct HeldMeta {
    count: u64,
    bytes: u64,
}

fn json_dec<V: for<'de> Deserialize<'de>>(tree: &'static str, b: &[u8]) -> Result<V, StoreError> {
    serde_json::from_slice(b).map_err(|e| super::codec::corrupt(tree, e))
}

fn json_enc(v: &impl Serialize) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| StoreError::Db(format!("encode: {e}")))
}

impl<'a, 't> ArtTx<'a, 't> {
    pub(super) fn new(
        store: &'a Store,
        tx: &'a mut Tx<'t>,
        ids: &'a mut IdGen,
        seq: &'a mut u64,
        now: u64,
    ) -> ArtTx<'a, 't> {
        ArtTx {
            store,
            tx,
            ids,
            seq,
            now,
            queued: Vec::new(),
        }
    }

    /// The workspace of thread `th`, if it is an artifact thread here.
    pub fn ws(&self, th: &str) -> Result<Option<WsRecord>, StoreError> {
        match self.tx.get(T::ArtWs, &thk(th))? {
            Some(v) => Ok(Some(json_dec("art_ws", &v)?)),
            None => Ok(None),
        }
    }

    /// Create or replace a workspace record.
    pub fn put_ws(&mut self, ws: &WsRecord) -> Result<(), StoreError> {
        self.tx.put(T::ArtWs, thk(&ws.th), json_enc(ws)?);
        Ok(())
    }

    /// Event `seq` of `th`.
    pub fn event(&self, th: &str, seq: u64) -> Result<Option<Value>, StoreError> {
        match self.tx.get(T::ArtEvents, &seq_key(th, seq))? {
            Some(v) => Ok(Some(json_dec("art_events", &v)?)),
            None => Ok(None),
        }
    }

    /// Record event `seq` of `th`. Returns its size in bytes as stored (compact JSON), so
    /// that the caller need not serialise it again to measure it.
    pub fn put_event(&mut self, th: &str, seq: u64, ev: &Value) -> Result<usize, StoreError> {
        let b = json_enc(ev)?;
        let n = b.len();
        self.tx.put(T::ArtEvents, seq_key(th, seq), b);
        Ok(n)
    }

    /// The remembered result of (participant, command_id) in `th`.
    pub fn dedup(
        &self,
        th: &str,
        participant: &str,
        command_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        match self
            .tx
            .get(T::ArtDedup, &dedup_key(th, participant, command_id))?
        {
            Some(v) => Ok(Some(json_dec("art_dedup", &v)?)),
            None => Ok(None),
        }
    }

    /// Remember a command's result (the first one wins), forgetting the oldest remembered
    /// result of `th` past [`DEDUP_CAPACITY`] (notes §7: 10,000 most recent).
    pub fn put_dedup(
        &mut self,
        th: &str,
        participant: &str,
        command_id: &str,
        result: &Value,
    ) -> Result<(), StoreError> {
        let key = dedup_key(th, participant, command_id);
        if self.tx.get(T::ArtDedup, &key)?.is_some() {
            return Ok(());
        }
        let meta_key = dedup_meta_key(th);
        let mut meta: DedupMeta = match self.tx.get(T::ArtDedup, &meta_key)? {
            Some(v) => json_dec("art_dedup", &v)?,
            None => DedupMeta::default(),
        };
        self.tx.put(T::ArtDedup, key.clone(), json_enc(result)?);
        self.tx
            .put(T::ArtDedup, dedup_order_key(th, meta.next), key);
        meta.next += 1;
        while meta.next - meta.first > DEDUP_CAPACITY as u64 {
            let ok = dedup_order_key(th, meta.first);
            if let Some(old) = self.tx.get(T::ArtDedup, &ok)? {
                self.tx.del(T::ArtDedup, old);
            }
            self.tx.del(T::ArtDedup, ok);
            meta.first += 1;
        }
        self.tx.put(T::ArtDedup, meta_key, json_enc(&meta)?);
        Ok(())
    }

    /// Hold back event `seq` (it arrived after a gap). False when it was not held: the
    /// thread already holds [`MAX_HELD`] events or this one would pass
    /// [`MAX_HELD_BYTES`] (the newest is dropped; the resend of the gap brings it back).
    /// An event already held stays as it was (true).
    pub fn hold(&mut self, th: &str, seq: u64, ev: &Value) -> Result<bool, StoreError> {
        let k = seq_key(th, seq);
        if self.tx.get(T::ArtHold, &k)?.is_some() {
            return Ok(true);
        }
        let bytes = json_enc(ev)?;
        let mut meta = self.held_meta(th)?;
        if meta.count >= MAX_HELD as u64 || meta.bytes + bytes.len() as u64 > MAX_HELD_BYTES as u64
        {
            return Ok(false);
        }
        meta.count += 1;
        meta.bytes += bytes.len() as u64;
        self.tx.put(T::ArtHold, k, bytes);
        self.tx.put(T::ArtHold, thk(th), json_enc(&meta)?);
        Ok(true)
    }

    fn held_meta(&self, th: &str) -> Result<HeldMeta, StoreError> {
        match self.tx.get(T::ArtHold, &thk(th))? {
            Some(v) => json_dec("art_hold", &v),
            None => Ok(HeldMeta::default()),
        }
    }

    /// Take the held-back event `seq`, if any.
    pub fn take_held(&mut self, th: &str, seq: u64) -> Result<Option<Value>, StoreError> {
        let k = seq_key(th, seq);
        match self.tx.get(T::ArtHold, &k)? {
            Some(v) => {
                self.tx.del(T::ArtHold, k);
                let mut meta = self.held_meta(th)?;
                meta.count = meta.count.saturating_sub(1);
                meta.bytes = meta.bytes.saturating_sub(v.len() as u64);
                self.tx.put(T::ArtHold, thk(th), json_enc(&meta)?);
                Ok(Some(json_dec("art_hold", &v)?))
            }
            None => Ok(None),
        }
    }

    /// Replica whose host's log is behind it (the host answered a resend with its head
    /// below ours, [`crate::artifact::replica::resend_beyond_head`]): forget its log,
    /// snapshot and held events, and set `rec` to head 0 with `held_max = host_head`, so
    /// that the caller asks for a resend from seq 0 and rebuilds from seq 1. The caller
    /// also replaces its in-memory state with an empty one and writes `rec`.
    pub fn reset_replica(&mut self, rec: &mut WsRecord, host_head: u64) -> Result<(), StoreError> {
        let prefix = thk(&rec.th);
        for s in 1..=rec.head_seq {
            self.tx.del(T::ArtEvents, seq_key(&rec.th, s));
        }
        let window = rec.head_seq.saturating_add(MAX_HELD as u64);
        for s in rec.head_seq.saturating_add(1)..=rec.held_max.min(window) {
            self.tx.del(T::ArtHold, seq_key(&rec.th, s));
        }
        for kv in self.store.trees.t(T::ArtHold).scan_prefix(&prefix) {
            let (k, _) = kv.map_err(db_err)?;
            self.tx.del(T::ArtHold, k.to_vec());
        }
        self.tx.del(T::ArtHold, prefix.clone());
        self.tx.del(T::ArtSnap, prefix);
        rec.head_seq = 0;
        rec.resend_asked = 0;
        rec.held_max = host_head;
        Ok(())
    }

    /// Replace the snapshot of `th` (`{seq, state}`; stored with `format` =
    /// `SNAPSHOT_FORMAT`).
    pub fn put_snapshot(&mut self, th: &str, snap: &Value) -> Result<(), StoreError> {
        let mut snap = snap.clone();
        if let Some(o) = snap.as_object_mut() {
            o.insert("format".into(), SNAPSHOT_FORMAT.into());
        }
        self.tx.put(T::ArtSnap, thk(th), json_enc(&snap)?);
        Ok(())
    }

    /// Replace the snapshot of `th` with `state` after event `seq`: the same
    /// `{seq, state, format}` record as [`ArtTx::put_snapshot`], serialised straight from
    /// `state` (no intermediate JSON value, no copy: a workspace of 10,000 versions is
    /// megabytes of JSON). Returns the record's size in bytes.
    pub fn put_snapshot_state<S: Serialize>(
        &mut self,
        th: &str,
        seq: u64,
        state: &S,
    ) -> Result<usize, StoreError> {
        #[derive(Serialize)]
        struct Snap<'s, S> {
            seq: u64,
            state: &'s S,
            format: u64,
        }
        let bytes = json_enc(&Snap {
            seq,
            state,
            format: SNAPSHOT_FORMAT,
        })?;
        let n = bytes.len();
        self.tx.put(T::ArtSnap, thk(th), bytes);
        Ok(n)
    }

    /// The snapshot of `th` decoded straight into `S` (as [`ArtTx::snapshot`], without the
    /// intermediate JSON value): `(seq, state, bytes)`; None when there is none or it
    /// predates `SNAPSHOT_FORMAT`. A current snapshot whose state does not decode is
    /// corrupt (`art_snap`).
    pub fn snapshot_state<S: for<'de> Deserialize<'de>>(
        &self,
        th: &str,
    ) -> Result<Option<(u64, S, usize)>, StoreError> {
        let Some(v) = self.tx.get(T::ArtSnap, &thk(th))? else {
            return Ok(None);
        };
        /// Only the format, the rest skipped (an older snapshot's state need not decode).
        #[derive(Deserialize)]
        struct Probe {
            #[serde(default)]
            format: Option<u64>,
        }
        let probe: Probe = json_dec("art_snap", &v)?;
        if probe.format != Some(SNAPSHOT_FORMAT) {
            return Ok(None);
        }
        #[derive(Deserialize)]
        struct Snap<S> {
            seq: u64,
            state: S,
        }
        let snap: Snap<S> = json_dec("art_snap", &v)?;
        Ok(Some((snap.seq, snap.state, v.len())))
    }

    /// The snapshot of `th`; None when there is none or it predates `SNAPSHOT_FORMAT`
    /// (then the state is rebuilt from the log).
    pub fn snapshot(&self, th: &str) -> Result<Option<Value>, StoreError> {
        match self.tx.get(T::ArtSnap, &thk(th))? {
            Some(v) => Ok(current_snapshot(json_dec("art_snap", &v)?)),
            None => Ok(None),
        }
    }

    /// Up to `limit` events of `th` with seq > `after` (this transaction's writes included).
    pub fn events_after(
        &self,
        th: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Value>, StoreError> {
        let mut out = self.store.art_events(th, after, limit)?;
        // Events written by this transaction are not in the tree yet.
        let mut next = after + out.len() as u64 + 1;
        while out.len() < limit {
            match self.event(th, next)? {
                Some(e) => out.push(e),
                None => break,
            }
            next += 1;
        }
        Ok(out)
    }

    /// Up to `limit` events of `th` with seq > `after`, each decoded straight from its
    /// stored JSON into `E` (no intermediate JSON value) with its stored size in bytes
    /// (this transaction's writes included). An event that does not decode as `E` is
    /// corrupt (`art_events`).
    pub fn events_after_as<E: for<'de> Deserialize<'de>>(
        &self,
        th: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(E, usize)>, StoreError> {
        let start = seq_key(th, after.saturating_add(1));
        let end = seq_key(th, u64::MAX);
        let mut out = Vec::new();
        for kv in self.store.trees.t(T::ArtEvents).range(start..=end) {
            if out.len() >= limit {
                break;
            }
            let (_, v) = kv.map_err(db_err)?;
            out.push((json_dec("art_events", &v)?, v.len()));
        }
        // Events written by this transaction are not in the tree yet.
        let mut next = after + out.len() as u64 + 1;
        while out.len() < limit {
            match self.tx.get(T::ArtEvents, &seq_key(th, next))? {
                Some(v) => out.push((json_dec("art_events", &v)?, v.len())),
                None => break,
            }
            next += 1;
        }
        Ok(out)
    }

    /// Queue lines for `peer` in this transaction (see [`Store::enqueue`]).
    pub fn enqueue(
        &mut self,
        peer: &PeerKey,
        builders: &[LineBuilder<'_>],
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let out = self
            .store
            .enqueue_in(self.tx, self.ids, self.seq, self.now, peer, builders)?;
        if !out.is_empty() && !self.queued.contains(peer) {
            self.queued.push(*peer);
        }
        Ok(out)
    }

    /// Peers that got lines queued through this transaction.
    pub fn queued(&self) -> &[PeerKey] {
        &self.queued
    }

    /// Wall clock of this transaction, Unix ms.
    pub fn now_ms(&self) -> u64 {
        self.now
    }
}

impl Store {
    /// Install the hook run inside [`Store::receive_batch`] (once; later calls are
    /// ignored and return false).
    pub fn set_inbound_hook(&self, hook: std::sync::Arc<dyn InboundHook>) -> bool {
        self.hook.set(hook).is_ok()
    }

    /// Run `f` on a fresh transaction under the writer lock and commit what it wrote
    /// (workspace records and queued lines together). Not durable until [`Store::flush`].
    /// Returns `f`'s value and the peers that got lines queued.
    pub fn art_tx<R>(
        &self,
        f: impl FnOnce(&mut ArtTx<'_, '_>) -> Result<R, StoreError>,
    ) -> Result<(R, Vec<PeerKey>), StoreError> {
        let mut w = self.writer();
        let mut ids = w.ids_clone();
        let mut seq = w.log_seq_value();
        let now = wire::time::now_ms();
        let mut tx = Tx::new(&self.trees);
        let (r, queued) = {
            let mut atx = ArtTx::new(self, &mut tx, &mut ids, &mut seq, now);
            let r = f(&mut atx)?;
            (r, atx.queued)
        };
        tx.commit()?;
        w.set_after_commit(ids, seq);
        Ok((r, queued))
    }

    /// Every artifact thread, by thread id.
    pub fn art_workspaces(&self) -> Result<Vec<WsRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::ArtWs).iter() {
            let (_, v) = kv.map_err(db_err)?;
            out.push(json_dec("art_ws", &v)?);
        }
        Ok(out)
    }

    /// The artifact thread `th`.
    pub fn art_workspace(&self, th: &str) -> Result<Option<WsRecord>, StoreError> {
        match self.trees.t(T::ArtWs).get(thk(th)).map_err(db_err)? {
            Some(v) => Ok(Some(json_dec("art_ws", &v)?)),
            None => Ok(None),
        }
    }

    /// Up to `limit` events of `th` with seq > `after`, in seq order.
    pub fn art_events(&self, th: &str, after: u64, limit: usize) -> Result<Vec<Value>, StoreError> {
        let start = seq_key(th, after.saturating_add(1));
        let end = seq_key(th, u64::MAX);
        let mut out = Vec::new();
        for kv in self.trees.t(T::ArtEvents).range(start..=end) {
            if out.len() >= limit {
                break;
            }
            let (_, v) = kv.map_err(db_err)?;
            out.push(json_dec("art_events", &v)?);
        }
        Ok(out)
    }

    /// The snapshot of `th` (`{seq, state}`); None as in [`ArtTx::snapshot`].
    pub fn art_snapshot(&self, th: &str) -> Result<Option<Value>, StoreError> {
        match self.trees.t(T::ArtSnap).get(thk(th)).map_err(db_err)? {
            Some(v) => Ok(current_snapshot(json_dec("art_snap", &v)?)),
            None => Ok(None),
        }
    }

    /// Number of held-back events of `th` (replica).
    pub fn art_held(&self, th: &str) -> Result<usize, StoreError> {
        let p = thk(th);
        Ok(self
            .trees
            .t(T::ArtHold)
            .scan_prefix(&p)
            .filter(|kv| kv.as_ref().map_or(true, |(k, _)| k.len() > p.len()))
            .count())
    }

    /// Number of remembered command results of `th` (host), those stored before the
    /// dedup order existed included.
    pub fn art_dedup_len(&self, th: &str) -> Result<usize, StoreError> {
        let p = thk(th);
        Ok(self
            .trees
            .t(T::ArtDedup)
            .scan_prefix(&p)
            .filter(|kv| {
                kv.as_ref()
                    .map_or(true, |(k, _)| k.get(p.len()).is_some_and(|b| *b < 0xFE))
            })
            .count())
    }
}

/// A snapshot of the current format, or None (older ones are rebuilt from the log).
fn current_snapshot(v: Value) -> Option<Value> {
    (v.get("format").and_then(Value::as_u64) == Some(SNAPSHOT_FORMAT)).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path()).expect("open");
        (dir, s)
    }

    fn peer() -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).expect("valid test key")
    }

    fn rec(th: &str) -> WsRecord {
        WsRecord {
            th: th.into(),
            role: WsRole::Replica,
            peer: peer(),
            head_seq: 0,
            created_ms: 0,
            resend_asked: 0,
            held_max: 0,
        }
    }

    /// 10,000 results are kept per thread; the next one forgets the oldest (across
    /// participants, in the order remembered), one transaction or many alike.
    #[test]
    fn dedup_results_are_bounded_per_thread() {
        let (_d, s) = open();
        let r = json!({"ok": true});
        s.art_tx(|tx| {
            for i in 0..DEDUP_CAPACITY - 1 {
                tx.put_dedup("thr_a", &format!("user:{}", i % 2), &format!("c{i}"), &r)?;
            }
            // The first result wins: a repeat neither replaces nor counts.
            tx.put_dedup("thr_a", "user:0", "c0", &json!({"ok": false}))?;
            Ok(())
        })
        .unwrap();
        assert_eq!(s.art_dedup_len("thr_a").unwrap(), DEDUP_CAPACITY - 1);
        s.art_tx(|tx| {
            tx.put_dedup("thr_b", "user:0", "c0", &r)?;
            tx.put_dedup("thr_a", "user:1", "last", &r)
        })
        .unwrap();
        assert_eq!(s.art_dedup_len("thr_a").unwrap(), DEDUP_CAPACITY);
        s.art_tx(|tx| {
            assert_eq!(tx.dedup("thr_a", "user:0", "c0")?, Some(r.clone()));
            tx.put_dedup("thr_a", "user:0", "more", &r)?;
            tx.put_dedup("thr_a", "user:0", "more2", &r)
        })
        .unwrap();
        assert_eq!(s.art_dedup_len("thr_a").unwrap(), DEDUP_CAPACITY);
        assert_eq!(s.art_dedup_len("thr_b").unwrap(), 1);
        s.art_tx(|tx| {
            assert_eq!(tx.dedup("thr_a", "user:0", "c0")?, None);
            assert_eq!(tx.dedup("thr_a", "user:1", "c1")?, None);
            assert_eq!(tx.dedup("thr_a", "user:0", "c2")?, Some(r.clone()));
            assert_eq!(tx.dedup("thr_a", "user:0", "more2")?, Some(r.clone()));
            assert_eq!(tx.dedup("thr_b", "user:0", "c0")?, Some(r.clone()));
            Ok(())
        })
        .unwrap();
    }

    /// Held-back events are bounded per thread in bytes (and count): the newest past the
    /// bound is not held; taking one frees its bytes.
    #[test]
    fn held_events_are_bounded_in_count_and_bytes() {
        let (_d, s) = open();
        let ev = json!({"blob": "z".repeat(512 * 1024)});
        let per = serde_json::to_vec(&ev).unwrap().len();
        let fit = (MAX_HELD_BYTES / per) as u64;
        let (refused, _) = s
            .art_tx(|tx| {
                for seq in 2..2 + fit {
                    assert!(tx.hold("thr_h", seq, &ev)?, "seq {seq}");
                }
                // Already held: kept as it was, not counted twice.
                assert!(tx.hold("thr_h", 2, &json!({"other": 1}))?);
                tx.hold("thr_h", 2 + fit, &ev)
            })
            .unwrap();
        assert!(!refused, "an event past {MAX_HELD_BYTES} bytes was held");
        assert_eq!(s.art_held("thr_h").unwrap() as u64, fit);
        s.art_tx(|tx| {
            assert_eq!(tx.take_held("thr_h", 2)?, Some(ev.clone()));
            assert!(tx.hold("thr_h", 2 + fit, &ev)?);
            assert!(!tx.hold("thr_h", 3 + fit, &ev)?);
            // Another thread has its own bound; small events are bounded in count.
            for seq in 2..2 + MAX_HELD as u64 {
                assert!(tx.hold("thr_n", seq, &json!(1))?);
            }
            assert!(!tx.hold("thr_n", 2 + MAX_HELD as u64, &json!(1))?);
            Ok(())
        })
        .unwrap();
        assert_eq!(s.art_held("thr_h").unwrap() as u64, fit);
        assert_eq!(s.art_held("thr_n").unwrap(), MAX_HELD);
    }

    /// A replica reset forgets its log, snapshot and held events and asks from seq 0.
    #[test]
    fn replica_reset_forgets_log_snapshot_and_held() {
        let (_d, s) = open();
        let mut r = rec("thr_r");
        s.art_tx(|tx| {
            for seq in 1..=3 {
                tx.put_event("thr_r", seq, &json!({"seq": seq}))?;
            }
            tx.put_snapshot("thr_r", &json!({"seq": 3, "state": {}}))?;
            tx.hold("thr_r", 5, &json!({"seq": 5}))?;
            r.head_seq = 3;
            r.held_max = 5;
            r.resend_asked = 4;
            tx.put_ws(&r)
        })
        .unwrap();
        assert!(s.art_snapshot("thr_r").unwrap().is_some());
        s.art_tx(|tx| {
            // Held in this same transaction, before the reset.
            tx.hold("thr_r", 4, &json!({"seq": 4}))?;
            r.held_max = 5;
            tx.reset_replica(&mut r, 2)?;
            tx.put_ws(&r)
        })
        .unwrap();
        assert_eq!((r.head_seq, r.resend_asked, r.held_max), (0, 0, 2));
        assert!(s.art_events("thr_r", 0, 10).unwrap().is_empty());
        assert!(s.art_snapshot("thr_r").unwrap().is_none());
        assert_eq!(s.art_held("thr_r").unwrap(), 0);
        s.art_tx(|tx| {
            // The held meta is gone too: the full bound is available again.
            assert!(tx.hold(
                "thr_r",
                2,
                &json!({"blob": "z".repeat(MAX_HELD_BYTES - 64)})
            )?);
            Ok(())
        })
        .unwrap();
    }

    /// A state written with `put_snapshot_state` is the record `put_snapshot` writes
    /// (`{seq, state, format}`) and reads back as it was; a snapshot before the format is
    /// None (rebuilt from the log) whatever its state, and a current one whose state does
    /// not decode is corrupt.
    #[test]
    fn snapshot_states_round_trip_and_old_or_broken_ones_are_told_apart() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct St {
            head_seq: u64,
            names: Vec<String>,
        }
        let (_d, s) = open();
        let st = St {
            head_seq: 7,
            names: vec!["a".into(), "b".into()],
        };
        s.art_tx(|tx| {
            let n = tx.put_snapshot_state("thr_s", 7, &st)?;
            assert_eq!(
                tx.snapshot("thr_s")?,
                Some(json!({"seq": 7, "state": {"head_seq": 7, "names": ["a", "b"]}, "format": SNAPSHOT_FORMAT}))
            );
            let (seq, back, bytes) = tx.snapshot_state::<St>("thr_s")?.expect("a snapshot");
            assert_eq!((seq, &back, bytes), (7, &st, n));
            assert!(tx.snapshot_state::<St>("thr_none")?.is_none());
            // Before the format: None, even though its state does not decode as St.
            tx.tx.put(
                T::ArtSnap,
                thk("thr_old"),
                json_enc(&json!({"seq": 9, "state": {"other": true}}))?,
            );
            assert!(tx.snapshot_state::<St>("thr_old")?.is_none());
            tx.put_snapshot("thr_bad", &json!({"seq": 9, "state": {"other": true}}))?;
            assert!(matches!(
                tx.snapshot_state::<St>("thr_bad"),
                Err(StoreError::Corrupt { tree: "art_snap", .. })
            ));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            s.art_snapshot("thr_s").unwrap().unwrap()["state"]["names"],
            json!(["a", "b"])
        );
    }

    /// Snapshots written before SNAPSHOT_FORMAT (full data per version) are not read:
    /// the state is rebuilt from the log; new ones carry the format.
    #[test]
    fn snapshots_without_the_format_are_rebuilt_from_the_log() {
        let (_d, s) = open();
        s.art_tx(|tx| {
            tx.tx.put(
                T::ArtSnap,
                thk("thr_old"),
                json_enc(&json!({"seq": 9, "state": {}}))?,
            );
            tx.put_snapshot("thr_new", &json!({"seq": 9, "state": {}}))
        })
        .unwrap();
        assert_eq!(s.art_snapshot("thr_old").unwrap(), None);
        let new = s.art_snapshot("thr_new").unwrap().unwrap();
        assert_eq!(new["format"], SNAPSHOT_FORMAT);
        s.art_tx(|tx| {
            assert_eq!(tx.snapshot("thr_old")?, None);
            assert!(tx.snapshot("thr_new")?.is_some());
            Ok(())
        })
        .unwrap();
    }
}
