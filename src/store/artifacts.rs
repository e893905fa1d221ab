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
//! - `art_dedup`: th ‖ participant ‖ 0x00 ‖ command_id → CommandResult (JSON).
//! - `art_hold`: th ‖ seq → EventFrame received after a gap (replica).
//! - `art_snap`: th → `{seq, state}`: the engine's state after event `seq`, written every
//!   few hundred events; the state is that snapshot plus the events after it.

use super::imp::Store;
use super::tx::{db_err, Tx, T};
use super::{LineBuilder, OutboxEntry, StoreError};
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

    /// Record event `seq` of `th`.
    pub fn put_event(&mut self, th: &str, seq: u64, ev: &Value) -> Result<(), StoreError> {
        self.tx.put(T::ArtEvents, seq_key(th, seq), json_enc(ev)?);
        Ok(())
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

    /// Remember a command's result.
    pub fn put_dedup(
        &mut self,
        th: &str,
        participant: &str,
        command_id: &str,
        result: &Value,
    ) -> Result<(), StoreError> {
        self.tx.put(
            T::ArtDedup,
            dedup_key(th, participant, command_id),
            json_enc(result)?,
        );
        Ok(())
    }

    /// Hold back event `seq` (it arrived after a gap).
    pub fn hold(&mut self, th: &str, seq: u64, ev: &Value) -> Result<(), StoreError> {
        self.tx.put(T::ArtHold, seq_key(th, seq), json_enc(ev)?);
        Ok(())
    }

    /// Take the held-back event `seq`, if any.
    pub fn take_held(&mut self, th: &str, seq: u64) -> Result<Option<Value>, StoreError> {
        let k = seq_key(th, seq);
        match self.tx.get(T::ArtHold, &k)? {
            Some(v) => {
                self.tx.del(T::ArtHold, k);
                Ok(Some(json_dec("art_hold", &v)?))
            }
            None => Ok(None),
        }
    }

    /// Replace the snapshot of `th` (`{seq, state}`).
    pub fn put_snapshot(&mut self, th: &str, snap: &Value) -> Result<(), StoreError> {
        self.tx.put(T::ArtSnap, thk(th), json_enc(snap)?);
        Ok(())
    }

    /// The snapshot of `th`.
    pub fn snapshot(&self, th: &str) -> Result<Option<Value>, StoreError> {
        match self.tx.get(T::ArtSnap, &thk(th))? {
            Some(v) => Ok(Some(json_dec("art_snap", &v)?)),
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

    /// The snapshot of `th` (`{seq, state}`).
    pub fn art_snapshot(&self, th: &str) -> Result<Option<Value>, StoreError> {
        match self.trees.t(T::ArtSnap).get(thk(th)).map_err(db_err)? {
            Some(v) => Ok(Some(json_dec("art_snap", &v)?)),
            None => Ok(None),
        }
    }

    /// Number of held-back events of `th` (replica).
    pub fn art_held(&self, th: &str) -> Result<usize, StoreError> {
        Ok(self.trees.t(T::ArtHold).scan_prefix(thk(th)).count())
    }
}
