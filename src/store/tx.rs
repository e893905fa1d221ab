//! A write set over all trees, applied atomically (see [`Tx::commit`]). Reads through the
//! set see its own pending writes first, so one operation can update a record several times.

use super::journal::{self, Journal, META_JOURNAL_LSN};
use super::tree::Tr;
use super::StoreError;
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
    /// The undo record of the last commit (one key, [`UNDO_KEY`]; see [`Tx::commit`]).
    Undo,
}

/// The one key of [`T::Undo`].
pub(crate) const UNDO_KEY: &[u8] = b"undo";

pub(crate) const NAMES: [&str; 21] = [
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
    "undo",
];

pub(crate) struct Trees {
    pub all: Vec<sled::Tree>,
    /// The commit lock: a commit holds its write side while it applies its writes, every
    /// read through [`Trees::t`] its read side for one step (`tree.rs`).
    pub visible: std::sync::RwLock<()>,
    /// Transactions committed through [`Tx::commit`] since open.
    pub commits: std::sync::atomic::AtomicU64,
    /// A commit stopped midway and could not be put back (its put-back failed, or it
    /// panicked): later commits are refused, since their undo records would take the
    /// half-applied state for the state before them. Reopening the store repairs it.
    pub cut: std::sync::atomic::AtomicBool,
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
            visible: Default::default(),
            commits: Default::default(),
            cut: Default::default(),
            journal: std::sync::Arc::new(Journal::off(1)),
        })
    }
    /// Tree `t`, read through the commit lock (`tree.rs`).
    pub(crate) fn t(&self, t: T) -> Tr<'_> {
        Tr::new(&self.all[t as usize], &self.visible)
    }

    /// Tree `t` itself, for the store's open (nothing commits yet) and for a commit, which
    /// holds the commit lock's write side.
    pub(crate) fn raw(&self, t: T) -> &sled::Tree {
        &self.all[t as usize]
    }
}

pub(crate) fn db_err(e: sled::Error) -> StoreError {
    StoreError::Db(e.to_string())
}

/// One tree's pending writes: key → (value, `None` for a removal; whether the key is new,
/// see [`Tx::put_new`]).
type Pending = BTreeMap<Vec<u8>, (Option<Vec<u8>>, bool)>;

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
        if let Some((v, _)) = self.w[t as usize].get(key) {
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
        self.write(t, key.into(), Some(val), false);
    }

    /// [`Tx::put`] of a key the caller knows is absent from the tree before this commit
    /// (a log seq just allocated, an id the dedup index found new): the commit's undo
    /// record then says "absent" without reading it. A wrong claim only matters to the
    /// rollback of a commit that a crash cut short, which would then remove the key.
    pub(crate) fn put_new(&mut self, t: T, key: impl Into<Vec<u8>>, val: Vec<u8>) {
        self.write(t, key.into(), Some(val), true);
    }

    pub(crate) fn del(&mut self, t: T, key: impl Into<Vec<u8>>) {
        self.write(t, key.into(), None, false);
    }

    /// A key that was new stays new (it was absent before the commit, whatever comes after).
    fn write(&mut self, t: T, key: Vec<u8>, val: Option<Vec<u8>>, new: bool) {
        let w = self.w[t as usize].entry(key).or_insert((None, false));
        w.0 = val;
        w.1 |= new;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.w.iter().all(|p| p.is_empty())
    }

    /// Apply every pending write atomically: all of them or none, to readers (the commit
    /// lock, `tree.rs`) and across a crash. The commit takes the journal's next LSN and,
    /// while the journal records, appends its writes for the next flush (`journal.rs`),
    /// all under the journal's lock so that LSNs follow the order in which commits apply.
    ///
    /// **Crash atomicity without a sled transaction.** A sled transaction (and a one-tree
    /// `apply_batch`) writes sled's log twice more per commit (it rolls the log buffer
    /// before and after its batch manifest), so the writes go to sled as plain inserts and
    /// removals instead, which sled's log may keep only a prefix of after a crash. So that
    /// no prefix outlives the crash unrepaired, they go in this order:
    /// 1. the undo record ([`T::Undo`], one key, so sled keeps it whole or not at all): the
    ///    LSN and every written key's value before this commit (absent: a removal),
    ///    encoded as a journal record;
    /// 2. the writes, key by key;
    /// 3. the LSN, in `meta` ([`META_JOURNAL_LSN`]).
    ///
    /// sled recovers a prefix of its log, so after a crash either the stored LSN is this
    /// commit's (all of it is there) or an earlier one, and then any of this commit that
    /// reached sled comes with its undo record, whose LSN is the stored one plus one: the
    /// open rolls it back before it replays the journal (`journal::open`), which redoes the
    /// commit whole if a flush synced it. Errors: sled's; a failure midway puts the
    /// before-images back. When that fails too (or the commit panicked midway), this and
    /// every later commit fail until the store is reopened, whose open rolls it back
    /// ([`Trees`]' `cut`).
    pub(crate) fn commit(self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        if self.is_empty() {
            return Ok(());
        }
        let trees = self.trees;
        if trees.cut.load(Ordering::Acquire) {
            return Err(StoreError::Db(
                "an earlier commit stopped midway and could not be undone; reopen the store (its open rolls that commit back)".into(),
            ));
        }
        let jr = std::sync::Arc::clone(&trees.journal);
        let mut j = jr.lock();
        let lsn = j.next_lsn;
        // Encoded aside and appended only once the writes applied: a failure (or a panic)
        // in between leaves no record behind.
        let mut rec = Vec::new();
        if jr.recording() {
            journal::encode(&mut rec, lsn, entries(&self.w));
        }
        let res = {
            let _visible = trees
                .visible
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Set unless `apply` returns with its writes whole or put back.
            let armed = Armed(&trees.cut);
            let r = apply(trees, &self.w, lsn);
            let undone = !matches!(r, Err((_, false)));
            if undone {
                std::mem::forget(armed);
            } else {
                drop(armed);
            }
            r.map_err(|(e, _)| e)
        };
        trees
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
        res.map_err(db_err)
    }
}

/// The writes of a write set as journal entries, tree by tree, in key order.
fn entries(w: &[Pending]) -> impl Iterator<Item = journal::Entry<'_>> {
    w.iter().enumerate().flat_map(|(i, p)| {
        p.iter()
            .map(move |(k, (v, _))| (i as u8, k.as_slice(), v.as_deref()))
    })
}

/// Write `val` at `key` in `t`, or remove `key` for `None`.
fn set(t: &sled::Tree, key: &[u8], val: Option<&[u8]>) -> sled::Result<()> {
    match val {
        Some(v) => t.insert(key, v).map(|_| ()),
        None => t.remove(key).map(|_| ()),
    }
}

/// Sets the flag it holds when dropped (see [`Tx::commit`]: a panic in `apply` drops it).
struct Armed<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Steps 1 to 3 of [`Tx::commit`]; the caller holds the journal's lock and the commit
/// lock's write side. Errors: sled's, with whether nothing of the commit is left applied
/// (`false`: writes remain that could not be put back).
fn apply(trees: &Trees, w: &[Pending], lsn: u64) -> Result<(), (sled::Error, bool)> {
    let mut before: Vec<(u8, &[u8], Option<sled::IVec>)> = Vec::new();
    for (i, p) in w.iter().enumerate() {
        for (k, (_, new)) in p {
            let b = if *new {
                None
            } else {
                trees.all[i].get(k).map_err(|e| (e, true))?
            };
            before.push((i as u8, k, b));
        }
    }
    let mut undo = Vec::new();
    journal::encode(
        &mut undo,
        lsn,
        before.iter().map(|(i, k, v)| (*i, *k, v.as_deref())),
    );
    trees
        .raw(T::Undo)
        .insert(UNDO_KEY, undo)
        .map_err(|e| (e, true))?;
    let mut done = 0usize;
    let mut res = Ok(());
    for (i, k, v) in entries(w) {
        if let Err(e) = set(&trees.all[i as usize], k, v) {
            res = Err(e);
            break;
        }
        done += 1;
        #[cfg(test)]
        if !hooks::after_write(done) {
            return Err((
                sled::Error::Unsupported("cut short by a test".into()),
                false,
            ));
        }
    }
    if res.is_ok() {
        res = trees
            .raw(T::Meta)
            .insert(META_JOURNAL_LSN, &lsn.to_be_bytes())
            .map(|_| ());
    }
    if let Err(e) = res {
        // Put back what was written, so that readers keep no part of the commit.
        for (i, k, v) in before.iter().take(done) {
            if let Err(e2) = set(&trees.all[*i as usize], k, v.as_deref()) {
                tracing::error!(
                    "a store commit failed ({e}) and putting back its first writes failed too ({e2}); commits are refused until the store is reopened, whose open rolls them back"
                );
                return Err((e, false));
            }
        }
        return Err((e, true));
    }
    Ok(())
}

/// Test seams inside [`Tx::commit`] (this thread's commits only).
#[cfg(test)]
pub(crate) mod hooks {
    use std::cell::RefCell;

    type Hook = Box<dyn FnMut(usize) -> bool>;

    thread_local! {
        static AFTER_WRITE: RefCell<Option<Hook>> = RefCell::new(None);
    }

    /// Run `f` after each write a commit applies, with the number applied so far (the
    /// commit lock still held); `f` returning false ends the commit there as a crash
    /// would: nothing put back, the LSN not stored. `None` removes the hook.
    pub(crate) fn set_after_write(f: Option<Hook>) {
        AFTER_WRITE.with(|h| *h.borrow_mut() = f);
    }

    pub(super) fn after_write(n: usize) -> bool {
        AFTER_WRITE.with(|h| h.borrow_mut().as_mut().is_none_or(|f| f(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A reader that finds the first write of a commit finds all of it: while a commit
    /// applies its writes, reads wait (the commit lock). The commit pauses after its
    /// first write until the reader answers or 300 ms pass; without the lock the reader
    /// would answer at once, having seen the `outbox` key without the `log` key.
    #[test]
    fn readers_see_all_of_a_commit_or_none() {
        let d = tempfile::TempDir::new().unwrap();
        let s = crate::store::Store::open(d.path()).unwrap();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (seen_tx, seen_rx) = mpsc::channel::<(bool, bool)>();
        let seen_rx = std::rc::Rc::new(seen_rx);
        let trees = &s.trees;
        std::thread::scope(|sc| {
            sc.spawn(move || {
                go_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                let a = trees.t(T::Outbox).get(b"k").unwrap().is_some();
                let b = trees.t(T::Log).get(b"k").unwrap().is_some();
                seen_tx.send((a, b)).unwrap();
            });
            let rx = std::rc::Rc::clone(&seen_rx);
            hooks::set_after_write(Some(Box::new(move |n| {
                if n == 1 {
                    go_tx.send(()).unwrap();
                    let early = rx.recv_timeout(Duration::from_millis(300));
                    assert!(early.is_err(), "the reader saw {early:?} mid-commit");
                }
                true
            })));
            let mut tx = Tx::new(trees);
            tx.put(T::Outbox, b"k".to_vec(), b"1".to_vec());
            tx.put(T::Log, b"k".to_vec(), b"1".to_vec());
            let res = tx.commit();
            hooks::set_after_write(None);
            res.unwrap();
            let after = seen_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(after, (true, true));
        });
    }

    fn put(trees: &Trees, k: &[u8]) -> Result<(), StoreError> {
        let mut tx = Tx::new(trees);
        tx.put(T::Meta, k.to_vec(), b"1".to_vec());
        tx.put(T::Log, k.to_vec(), b"1".to_vec());
        tx.commit()
    }

    /// A commit left half applied (stopped after its first write with nothing put back,
    /// or panicking there) makes every later commit fail: their undo records would take
    /// the half-applied state for the state before them. A reopen repairs the store.
    #[test]
    fn a_commit_left_half_applied_refuses_later_commits() {
        for panics in [false, true] {
            let d = tempfile::TempDir::new().unwrap();
            let s = crate::store::Store::open(d.path()).unwrap();
            put(&s.trees, b"a").unwrap();
            hooks::set_after_write(Some(Box::new(move |_| {
                assert!(!panics, "a panic midway");
                false
            })));
            let res =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| put(&s.trees, b"b")));
            hooks::set_after_write(None);
            assert_eq!(res.is_err(), panics);
            let err = put(&s.trees, b"c").unwrap_err().to_string();
            assert!(err.contains("reopen the store"), "{err}");
            assert_eq!(s.trees.t(T::Log).get(b"c").unwrap(), None);
            drop(s);
            let s = crate::store::Store::open(d.path()).unwrap();
            assert_eq!(s.trees.t(T::Log).get(b"b").unwrap(), None, "rolled back");
            assert!(s.trees.t(T::Log).get(b"a").unwrap().is_some());
            put(&s.trees, b"c").unwrap();
        }
    }
}
