//! Forgetting a peer: every record this node keeps about it, in one transaction.

use super::codec::{dec, hex, unpack, LogRec, Payload, ThreadRec};
use super::tx::{db_err, Tx, T};
use super::{Store, StoreError};
use crate::wire::PeerKey;
use serde::Serialize;

/// What [`Store::forget_peer`] removed, as counts of records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Forgotten {
    /// Whether a peer record existed (and was removed).
    pub peer: bool,
    /// Addresses removed.
    pub addresses: usize,
    /// Threads with the peer removed.
    pub threads: usize,
    /// Log entries (in and out) removed.
    pub log: usize,
    /// Queued outbound lines removed.
    pub outbox: usize,
    /// `seen` entries (per thread) removed.
    pub seen: usize,
}

impl Forgotten {
    /// Whether anything at all was removed.
    pub fn any(&self) -> bool {
        self.peer || self.addresses + self.threads + self.log + self.outbox + self.seen > 0
    }
}

impl Store {
    /// Forget `peer`: remove its peer record, its addresses, its threads, every log entry
    /// to or from it (which covers its threads' entries), its queued outbound lines (and
    /// their count) and its `seen` entries, in ONE transaction. Not durable until
    /// [`Store::flush`].
    ///
    /// Kept: the dedup index (`received` and `received_runs`), so that lines it sent before are still
    /// recognised as duplicates when it replays them (dedup is permanent, protocol-notes
    /// §Threads); blob records and files; grants (revoke them with `awp revoke`).
    pub fn forget_peer(&self, peer: &PeerKey) -> Result<Forgotten, StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let mut out = Forgotten::default();
        let raw = peer.as_bytes();
        let peer_hex = hex(raw);
        if tx.get(T::Peers, raw)?.is_some() {
            tx.del(T::Peers, raw.to_vec());
            out.peer = true;
        }
        for (tree, count) in [
            (T::Addresses, &mut out.addresses),
            (T::Outbox, &mut out.outbox),
            (T::Seen, &mut out.seen),
        ] {
            for kv in self.trees.t(tree).scan_prefix(raw) {
                let (k, _) = kv.map_err(db_err)?;
                tx.del(tree, k.to_vec());
                *count += 1;
            }
        }
        tx.del(T::OutboxN, raw.to_vec());
        super::threads::clear_seen_count(&mut tx, peer);
        let n = super::threads::thread_count(&tx, peer)? as i64;
        super::threads::add_threads(&mut tx, peer, -n)?;
        tx.del(T::OutboxB, raw.to_vec());
        for kv in self.trees.t(T::Threads).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let t: ThreadRec = dec("threads", &v)?;
            if t.peer == peer_hex {
                tx.del(T::Threads, k.to_vec());
                out.threads += 1;
            }
        }
        // Threads are per peer (`threads.rs`): every entry of the peer's threads is to or
        // from the peer; another peer's thread of the same id is not touched.
        for kv in self.trees.t(T::Log).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (l, _): (LogRec, Payload) = unpack("log", &v)?;
            if l.peer == peer_hex {
                tx.del(T::Log, k.to_vec());
                tx.del(T::LogAcked, k.to_vec());
                out.log += 1;
            }
        }
        tx.commit()?;
        Ok(out)
    }
}
