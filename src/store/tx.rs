//! A write set over all trees, committed as one sled transaction. Reads through the set see
//! its own pending writes first, so one operation can update a record several times.

use super::journal::{self, Journal, META_JOURNAL_LSN};
use super::StoreError;
use sled::Transactional;
use std::collections::BTreeMap;

/// Tree indices (order of [`Trees::all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum T {
    Outbox = 0,
    Log,
    Received,
    Seen,
    Threads,
    Peers,
    Addresses,
    Meta,
    OutboxN,
    BlobsIn,
    BlobsOut,
    OutboxB,
    BlobsInPending,
    BlobsInRefused,
    /// Artifact threads (see `artifacts.rs`).
    ArtWs,
    ArtEvents,
    ArtDedup,
    ArtHold,
    ArtSnap,
    /// Out log entries the peer acknowledged (key: the entry's seq, empty value), kept apart
    /// so that an ack writes a few bytes instead of rewriting the entry with its line.
    LogAcked,
}

pub(crate) const NAMES: [&str; 20] = [
    "outbox",
    "log",
    "received",
    "seen",
    "threads",
    "peers",
    "addresses",
    "meta",
    "outbox_n",
    "blobs_in",
    "blobs_out",
    "outbox_b",
    "blobs_in_pending",
    "blobs_in_refused",
    "art_ws",
    "art_events",
    "art_dedup",
    "art_hold",
    "art_snap",
    "log_acked",
];

pub(crate) struct Trees {
    pub all: Vec<sled::Tree>,
    /// Transactions committed through [`Tx::commit`] since open.
    pub commits: std::sync::atomic::AtomicU64,
    /// Where commits record their writes for the next flush (`journal.rs`); off until the
    /// store's open replaced it.
    pub journal: std::sync::Arc<Journal>,
}

impl Trees {
    pub(crate) fn open(db: &sled::Db) -> Result<Trees, StoreError> {
        let mut all = Vec::with_capacity(NAMES.len());
        for n in NAMES {
            all.push(db.open_tree(n).map_err(db_err)?);
        }
        Ok(Trees {
            all,
            commits: Default::default(),
            journal: std::sync::Arc::new(Journal::off(1)),
        })
    }
    pub(crate) fn t(&self, t: T) -> &sled::Tree {
        &self.all[t as usize]
    }
}

pub(crate) fn db_err(e: sled::Error) -> StoreError {
    StoreError::Db(e.to_string())
}

type Pending = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

pub(crate) struct Tx<'a> {
    trees: &'a Trees,
    w: Vec<Pending>,
}

impl<'a> Tx<'a> {
    pub(crate) fn new(trees: &'a Trees) -> Tx<'a> {
        Tx {
            trees,
            w: vec![Pending::new(); NAMES.len()],
        }
    }

    pub(crate) fn get(&self, t: T, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.w[t as usize].get(key) {
            return Ok(v.clone());
        }
        Ok(self
            .trees
            .t(t)
            .get(key)
            .map_err(db_err)?
            .map(|v| v.to_vec()))
    }

    pub(crate) fn put(&mut self, t: T, key: impl Into<Vec<u8>>, val: Vec<u8>) {
        self.w[t as usize].insert(key.into(), Some(val));
    }

    pub(crate) fn del(&mut self, t: T, key: impl Into<Vec<u8>>) {
        self.w[t as usize].insert(key.into(), None);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.w.iter().all(|p| p.is_empty())
    }

    /// Apply every pending write atomically across the touched trees. The commit takes the
    /// journal's next LSN (stored in `meta` by the same transaction) and, while the journal
    /// records, appends its writes for the next flush (`journal.rs`), all under the
    /// journal's lock so that LSNs follow the order in which transactions apply.
    pub(crate) fn commit(mut self) -> Result<(), StoreError> {
        if self.is_empty() {
            return Ok(());
        }
        let jr = std::sync::Arc::clone(&self.trees.journal);
        let mut j = jr.lock();
        let lsn = j.next_lsn;
        self.put(T::Meta, META_JOURNAL_LSN, lsn.to_be_bytes().to_vec());
        // Encoded aside and appended only once the transaction committed: a failure (or a
        // panic) in between leaves no record behind.
        let mut rec = Vec::new();
        if jr.recording() {
            journal::encode(
                &mut rec,
                lsn,
                self.w.iter().enumerate().flat_map(|(i, p)| {
                    p.iter()
                        .map(move |(k, v)| (i as u8, k.as_slice(), v.as_deref()))
                }),
            );
        }
        let mut trees: Vec<&sled::Tree> = Vec::new();
        let mut batches: Vec<sled::Batch> = Vec::new();
        for (i, p) in self.w.into_iter().enumerate() {
            if p.is_empty() {
                continue;
            }
            let mut b = sled::Batch::default();
            for (k, v) in p {
                match v {
                    Some(v) => b.insert(k, v),
                    None => b.remove(k),
                }
            }
            trees.push(&self.trees.all[i]);
            batches.push(b);
        }
        let gate = super::gate::transaction();
        let res: sled::transaction::TransactionResult<(), ()> =
            trees.as_slice().transaction(|tts| {
                for (tt, b) in tts.iter().zip(&batches) {
                    tt.apply_batch(b)?;
                }
                Ok(())
            });
        drop(gate);
        self.trees
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if res.is_ok() {
            j.next_lsn += 1;
            if j.buf.is_empty() {
                j.buf = rec;
            } else {
                j.buf.extend_from_slice(&rec);
            }
        }
        drop(j);
        res.map_err(|e| match e {
            sled::transaction::TransactionError::Abort(()) => {
                StoreError::Db("transaction aborted".into())
            }
            sled::transaction::TransactionError::Storage(e) => db_err(e),
        })
    }
}
