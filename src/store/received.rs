//! The permanent dedup index (protocol-notes §Threads: dedup is by (peer, id), forever) and
//! looking up a received line by its sender and id (for telling a replay from a line that
//! reuses an id with other content).
//!
//! The index has two forms, and a line is in exactly one of them:
//! - **runs** (`received_runs`, store format 3): peer (32 raw bytes) ‖ first id → a run
//!   record, the ids and log seqs of lines of one batch that were each above the peer's
//!   bound when received ([`DedupIndex`]), in increasing id order, at most
//!   [`RUN_BYTES_MAX`] bytes per record. Senders allocate ids from one increasing
//!   generator, so nearly every new line goes here, and a batch of hundreds of lines costs
//!   a few sled inserts instead of one each. Since a run only holds ids above every id
//!   stored before it, runs never overlap: the only run that can hold an id is the one with
//!   the largest first id at or below it.
//! - **single entries** (`received`): peer ‖ id → log seq (u64 big-endian), for a new line
//!   at or below the peer's bound (an id the sender allocated out of order), and for every
//!   line stored by a build before format 3.
//!
//! Run record: entries `id length u16 BE ‖ id ‖ log seq u64 BE`, ids strictly increasing,
//! the first equal to the key's id; decoded strictly ([`StoreError::Corrupt`] otherwise).

use super::codec::{corrupt, pkey, read_u64, unpack, LogRec, Payload};
use super::tree::Tr;
use super::tx::{db_err, Trees, T};
use super::{Store, StoreError};
use crate::wire::PeerKey;

/// The name of the run tree in errors.
const RUNS: &str = "received_runs";

/// The largest run record, in bytes (one entry at least, whatever its length). sled 0.34
/// writes a leaf node (up to 16 entries) as one item of its log, and an item over a
/// quarter of a segment (128 KiB with the default 512 KiB) goes to a blob file with a
/// fsync of its own; 16 records of 4 KiB stay well under that. A run of 26-byte ULIDs
/// holds 113 lines.
pub(super) const RUN_BYTES_MAX: usize = 4096;

/// Bytes of a run entry besides its id (length word and seq).
const RUN_ENTRY_FIXED: usize = 2 + 8;

/// Run records for `entries` ((id, log seq), ids strictly increasing and 1 to
/// [`crate::wire::parse::MAX_ID_LEN`] bytes), split so that each is at most [`RUN_BYTES_MAX`]
/// bytes: `(first id, record)` each, in order.
pub(super) fn encode_runs<'a>(entries: &[(&'a [u8], u64)]) -> Vec<(&'a [u8], Vec<u8>)> {
    let mut out: Vec<(&'a [u8], Vec<u8>)> = Vec::new();
    for &(id, seq) in entries {
        let need = RUN_ENTRY_FIXED + id.len();
        match out.last_mut() {
            Some((_, rec)) if rec.len() + need <= RUN_BYTES_MAX => {}
            _ => out.push((
                id,
                Vec::with_capacity(RUN_BYTES_MAX.min(need * entries.len())),
            )),
        }
        let Some((_, rec)) = out.last_mut() else {
            continue;
        };
        // Ids are capped at MAX_ID_LEN (256) bytes by the parser; the length word holds it.
        rec.extend_from_slice(&(id.len() as u16).to_be_bytes());
        rec.extend_from_slice(id);
        rec.extend_from_slice(&seq.to_be_bytes());
    }
    out
}

/// The entries of a run record, checked as they are read: a record that is empty,
/// truncated, has an id of 0 or more than [`crate::wire::parse::MAX_ID_LEN`] bytes, or ids not
/// strictly increasing yields [`StoreError::Corrupt`] (and nothing after it).
struct RunEntries<'r> {
    rest: &'r [u8],
    prev: Option<&'r [u8]>,
    failed: bool,
}

fn run_entries(rec: &[u8]) -> RunEntries<'_> {
    RunEntries {
        rest: rec,
        prev: None,
        failed: false,
    }
}

impl<'r> RunEntries<'r> {
    fn entry(&mut self) -> Result<(&'r [u8], u64), StoreError> {
        let rest = self.rest;
        let len = rest
            .get(..2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
            .ok_or_else(|| corrupt(RUNS, "truncated length word"))?;
        if len == 0 || len > crate::wire::parse::MAX_ID_LEN {
            return Err(corrupt(RUNS, format!("id of {len} bytes")));
        }
        let id = rest
            .get(2..2 + len)
            .ok_or_else(|| corrupt(RUNS, "truncated id"))?;
        let seq = rest
            .get(2 + len..RUN_ENTRY_FIXED + len)
            .ok_or_else(|| corrupt(RUNS, "truncated seq"))?;
        if self.prev.is_some_and(|p| p >= id) {
            return Err(corrupt(RUNS, "ids not increasing"));
        }
        self.rest = &rest[RUN_ENTRY_FIXED + len..];
        self.prev = Some(id);
        Ok((id, read_u64(RUNS, seq)?))
    }
}

impl<'r> Iterator for RunEntries<'r> {
    type Item = Result<(&'r [u8], u64), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || (self.rest.is_empty() && self.prev.is_some()) {
            return None;
        }
        if self.rest.is_empty() {
            self.failed = true;
            return Some(Err(corrupt(RUNS, "empty run record")));
        }
        let r = self.entry();
        self.failed = r.is_err();
        Some(r)
    }
}

/// The log seq of `id` in the run record `rec` (None: not in it), reading up to it.
fn run_find(rec: &[u8], id: &[u8]) -> Result<Option<u64>, StoreError> {
    for e in run_entries(rec) {
        let (have, seq) = e?;
        match have.cmp(id) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal => return Ok(Some(seq)),
            std::cmp::Ordering::Greater => return Ok(None),
        }
    }
    Ok(None)
}

/// The log seq of `id` in the run record `rec` (None: not in it) and the record's largest
/// id (its last entry), in one pass over the whole record.
fn run_scan<'r>(rec: &'r [u8], id: &[u8]) -> Result<(Option<u64>, &'r [u8]), StoreError> {
    let (mut found, mut last) = (None, None);
    for e in run_entries(rec) {
        let (have, seq) = e?;
        if have == id {
            found = Some(seq);
        }
        last = Some(have);
    }
    let last = last.ok_or_else(|| corrupt(RUNS, "empty run record"))?;
    Ok((found, last))
}

/// The largest id of the run record `rec` (its last entry).
fn run_last(rec: &[u8]) -> Result<&[u8], StoreError> {
    Ok(run_scan(rec, &[])?.1)
}

/// The log seq of the content line `id` from `peer` in the dedup index, in either form
/// (see the module doc), or None when it was never received. Two point reads at most:
/// the single entry, and the run with the largest first id at or below `id`.
pub(super) fn received_seq(
    single: Tr<'_>,
    runs: Tr<'_>,
    peer: &PeerKey,
    id: &[u8],
) -> Result<Option<u64>, StoreError> {
    received_seq_cached(single, runs, peer, id, &mut RunCache::default())
}

/// The last run record a lookup read, for the lookups after it in the same operation: a
/// resume replays lines in id order, so most of its lookups land in the run the one
/// before read. Valid only while no commit lands (runs are added by commits, never
/// changed, and removed only by a rollback); the receive path keeps one per batch, under
/// the writer lock.
#[derive(Default)]
pub(super) struct RunCache {
    /// The run's peer, first and last id, and record; None before the first seek.
    run: Option<(PeerKey, Vec<u8>, Vec<u8>, sled::IVec)>,
}

impl RunCache {
    /// The cached record when it spans `id` (from `peer`): then no other run can hold it.
    fn spanning(&self, peer: &PeerKey, id: &[u8]) -> Option<&[u8]> {
        match &self.run {
            Some((p, first, last, rec)) if p == peer && first[..] <= *id && id <= &last[..] => {
                Some(rec)
            }
            _ => None,
        }
    }
}

/// [`received_seq`] with a [`RunCache`]: an id inside the cached run's span is looked up
/// in it without a seek (and, when not there, only as a single entry).
pub(super) fn received_seq_cached(
    single: Tr<'_>,
    runs: Tr<'_>,
    peer: &PeerKey,
    id: &[u8],
    cache: &mut RunCache,
) -> Result<Option<u64>, StoreError> {
    let spanned = match cache.spanning(peer, id) {
        Some(rec) => match run_find(rec, id)? {
            Some(seq) => return Ok(Some(seq)),
            None => true,
        },
        None => false,
    };
    let k = pkey(peer, id);
    if let Some(v) = single.get(&k).map_err(db_err)? {
        return Ok(Some(read_u64("received", &v)?));
    }
    if spanned {
        // The only run that could hold it does not.
        return Ok(None);
    }
    let Some(kv) = runs.range(..=k).next_back() else {
        return Ok(None);
    };
    let (rk, rec) = kv.map_err(db_err)?;
    if rk.len() <= 32 || rk[..32] != peer.as_bytes()[..] {
        // The nearest run below is another peer's: none of this peer's starts at or below.
        return Ok(None);
    }
    let (found, last) = run_scan(&rec, id)?;
    let last = last.to_vec();
    cache.run = Some((*peer, rk[32..].to_vec(), last, rec));
    Ok(found)
}

impl Store {
    /// The bytes (as received, without `\n`) of the content line `id` from `peer` that is
    /// on record, or None when no such line was received or its log entry was pruned.
    pub fn received_line(&self, peer: &PeerKey, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(seq) = received_seq(
            self.trees.t(T::Received),
            self.trees.t(T::ReceivedRuns),
            peer,
            id.as_bytes(),
        )?
        else {
            return Ok(None);
        };
        let Some(v) = self
            .trees
            .t(T::Log)
            .get(super::codec::u64_be(seq))
            .map_err(db_err)?
        else {
            return Ok(None);
        };
        let (_, line): (LogRec, Payload) = unpack("log", &v)?;
        Ok(Some(line.get("log")?.to_vec()))
    }
}

/// The largest id from `peer` in the dedup index (either form), None when there is none:
/// one reverse seek in each tree.
fn stored_max(trees: &Trees, peer: &PeerKey) -> Result<Option<Vec<u8>>, StoreError> {
    let single = trees
        .t(T::Received)
        .scan_prefix(peer.as_bytes())
        .keys()
        .next_back()
        .transpose()
        .map_err(db_err)?
        .map(|k| k[32..].to_vec());
    let run = match trees
        .t(T::ReceivedRuns)
        .scan_prefix(peer.as_bytes())
        .next_back()
    {
        Some(kv) => Some(run_last(&kv.map_err(db_err)?.1)?.to_vec()),
        None => None,
    };
    Ok(single.max(run))
}

/// Peers whose largest received id the dedup index keeps in memory. Past this many, one
/// entry is dropped for each new one (it is reloaded from disk when that peer sends again).
pub(super) const DEDUP_PEERS: usize = 4096;

/// The in-memory side of the permanent dedup index (protocol-notes §Threads): per peer,
/// an upper bound of the ids received from it (byte order), so that a line whose id is
/// above it is known new without a disk read, and goes into a run (module doc). Senders
/// allocate ids from one increasing generator, so every new line takes this path; a
/// replay (id at or below the bound) is looked up on disk ([`received_seq`]).
///
/// Invariant: an entry is never below the largest id of that peer in the index on disk
/// (it is raised before the lines are committed, so a failed commit leaves it too high,
/// which only costs a disk read and a single entry). Runs rely on it: a run's ids are
/// above every id stored before it, so runs never overlap. Entries are loaded on first use
/// with one reverse seek of the peer's key range in each form (so opening a store reads
/// nothing) and at most [`DEDUP_PEERS`] are kept.
#[derive(Default)]
pub(super) struct DedupIndex {
    max: std::collections::HashMap<PeerKey, Vec<u8>>,
}

impl DedupIndex {
    /// The bound for `peer` (None: nothing received from it), loaded from the index on
    /// disk (both forms) when not in memory.
    pub(super) fn bound(
        &mut self,
        trees: &Trees,
        peer: &PeerKey,
    ) -> Result<Option<&[u8]>, StoreError> {
        if !self.max.contains_key(peer) {
            let Some(max) = stored_max(trees, peer)? else {
                return Ok(None);
            };
            self.insert(*peer, max);
        }
        Ok(self.max.get(peer).map(Vec::as_slice))
    }

    /// Raise `peer`'s bound to `id` (call before committing a line with that id).
    pub(super) fn raise(&mut self, peer: &PeerKey, id: &[u8]) {
        match self.max.get_mut(peer) {
            Some(m) if m.as_slice() >= id => {}
            Some(m) => {
                m.clear();
                m.extend_from_slice(id);
            }
            None => self.insert(*peer, id.to_vec()),
        }
    }

    /// Add an entry for `peer` (not in the index), dropping one first when
    /// [`DEDUP_PEERS`] are kept.
    fn insert(&mut self, peer: PeerKey, max: Vec<u8>) {
        if self.max.len() >= DEDUP_PEERS {
            if let Some(evict) = self.max.keys().next().copied() {
                self.max.remove(&evict);
            }
        }
        self.max.insert(peer, max);
    }
}

#[cfg(test)]
#[path = "received_tests.rs"]
mod tests;
