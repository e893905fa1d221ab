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
    /// The dedup index's runs (store format 3, see `received.rs`).
    ReceivedRuns,
}

/// The one key of [`T::Undo`].
pub(crate) const UNDO_KEY: &[u8] = b"undo";

pub(crate) const NAMES: [&str; 22] = [
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
    "received_runs",
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
    /// 2. the writes, key by key (those of a commit of [`PARALLEL_MIN`] writes or more on
    ///    two threads, whole trees each, as sled takes writes to distinct trees at once);
    /// 3. the LSN, in `meta` ([`META_JOURNAL_LSN`]).
    ///
    /// sled recovers a prefix of its log, so after a crash either the stored LSN is this
    /// commit's (all of it is there) or an earlier one, and then any of this commit that
    /// reached sled comes with its undo record, whose LSN is the stored one plus one: the
    /// open rolls it back before it replays the journal (`journal::open`), which redoes the
    /// commit whole if a flush synced it. Errors: sled's; a failure midway puts the
    /// before-images back. When that fails too (or the commit panicked midway), this and
    /// every later commit fail until the store is reopened, whose open rolls it back
    /// ([`Trees`]' `cut`); until then readers see the part that was applied.
    pub(crate) fn commit(self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        if self.is_empty() {
            return Ok(());
        }
        let trees = self.trees;
        let jr = std::sync::Arc::clone(&trees.journal);
        let mut j = jr.lock();
        // Checked under the journal's lock: a commit that waited on it behind one that
        // stopped midway must not take that one's half-applied state for the state before
        // it (it would reuse its LSN and replace its undo record).
        if trees.cut.load(Ordering::Acquire) {
            return Err(StoreError::Db(
                "an earlier commit stopped midway and could not be undone; reopen the store (its open rolls that commit back)".into(),
            ));
        }
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
    // The write set in order (by tree, then key), and each write's before-image at the
    // same index (`None`: the key is absent; a `put_new` key is not read).
    let all: Vec<journal::Entry<'_>> = entries(w).collect();
    let mut before: Vec<Option<sled::IVec>> = Vec::with_capacity(all.len());
    for (i, p) in w.iter().enumerate() {
        for (k, (_, new)) in p {
            before.push(if *new {
                None
            } else {
                trees.all[i].get(k).map_err(|e| (e, true))?
            });
        }
    }
    let mut undo = Vec::new();
    journal::encode(
        &mut undo,
        lsn,
        all.iter()
            .zip(&before)
            .map(|(&(i, k, _), b)| (i, k, b.as_deref())),
    );
    trees
        .raw(T::Undo)
        .insert(UNDO_KEY, undo)
        .map_err(|e| (e, true))?;
    let (mine, theirs) = split(w);
    // A large commit's trees are written in two parts at once (sled takes writes to
    // distinct trees at once): one on a second thread, the other by the caller.
    let ((done, res), (done2, res2)) = if theirs.is_empty() {
        (write_all(trees, &all, &mine, true), (0, Ok(())))
    } else {
        let here = || write_all(trees, &all, &mine, true);
        crate::par::join("awp-commit", here, || {
            write_all(trees, &all, &theirs, false)
        })
        .unwrap_or_else(|| {
            // No thread to be had: the caller writes both parts.
            let a = here();
            let b = if a.1.is_ok() {
                write_all(trees, &all, &theirs, false)
            } else {
                (0, Ok(()))
            };
            (a, b)
        })
    };
    let mut res = match (res, res2) {
        (Err(Stop::Cut), _) | (_, Err(Stop::Cut)) => {
            // The test seam's crash: the writes made stay, as a crash would leave them.
            return Err((
                sled::Error::Unsupported("cut short by a test".into()),
                false,
            ));
        }
        (Err(Stop::Db(e)), _) | (_, Err(Stop::Db(e))) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    };
    if res.is_ok() {
        res = trees
            .raw(T::Meta)
            .insert(META_JOURNAL_LSN, &lsn.to_be_bytes())
            .map(|_| ());
    }
    if let Err(e) = res {
        // Put back what was written, so that readers keep no part of the commit.
        for &at in mine[..done].iter().chain(&theirs[..done2]) {
            let (i, k, _) = all[at];
            if let Err(e2) = set(&trees.all[i as usize], k, before[at].as_deref()) {
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

/// Write set size from which a commit may write on two threads.
const PARALLEL_MIN: usize = 256;

/// Fewest writes each part of a two-thread commit gets (below it, a thread's start would
/// cost about as much as the writes it takes over).
const PART_MIN: usize = 64;

/// The writes of a commit in two parts for [`apply`], as indexes into the write set (in
/// its order: by tree, then key), each tree whole in one of them. The
/// second part (for a second thread) takes trees largest first, each while the part stays
/// within five eighths of the writes. It is empty (everything in the first) under
/// [`PARALLEL_MIN`] writes, on one core, or when either part would hold fewer than
/// [`PART_MIN`].
fn split(w: &[Pending]) -> (Vec<usize>, Vec<usize>) {
    let total: usize = w.iter().map(BTreeMap::len).sum();
    let mut theirs_trees = vec![false; w.len()];
    if total >= PARALLEL_MIN && crate::par::cores() >= 2 {
        let mut order: Vec<usize> = (0..w.len()).filter(|&i| !w[i].is_empty()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(w[i].len()));
        let mut n = 0;
        for &i in &order {
            if n + w[i].len() <= total / 2 + total / 8 {
                n += w[i].len();
                theirs_trees[i] = true;
            }
        }
        if n < PART_MIN || total - n < PART_MIN {
            theirs_trees.fill(false);
        }
    }
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    let mut at = 0;
    for (i, p) in w.iter().enumerate() {
        let to = if theirs_trees[i] {
            &mut theirs
        } else {
            &mut mine
        };
        to.extend(at..at + p.len());
        at += p.len();
    }
    (mine, theirs)
}

/// Why [`write_all`] stopped.
enum Stop {
    Db(sled::Error),
    /// The test seam stopped it (a crash in the middle of the commit).
    #[cfg_attr(not(test), allow(dead_code))]
    Cut,
}

/// Write the writes of `all` that `part` names, in order; returns how many were made and
/// why it stopped short. `hooked`: the test seam counts these writes (the caller's part).
fn write_all(
    trees: &Trees,
    all: &[journal::Entry<'_>],
    part: &[usize],
    hooked: bool,
) -> (usize, Result<(), Stop>) {
    for (n, &at) in part.iter().enumerate() {
        let (i, k, v) = all[at];
        #[cfg(test)]
        if hooked && hooks::fails(n + 1) {
            return (
                n,
                Err(Stop::Db(sled::Error::Unsupported(
                    "a test's sled error".into(),
                ))),
            );
        }
        if let Err(e) = set(&trees.all[i as usize], k, v) {
            return (n, Err(Stop::Db(e)));
        }
        #[cfg(test)]
        if hooked && !hooks::after_write(n + 1) {
            return (n + 1, Err(Stop::Cut));
        }
    }
    let _ = hooked;
    (part.len(), Ok(()))
}

#[cfg(test)]
pub(crate) mod hooks {
    use std::cell::RefCell;

    type Hook = Box<dyn FnMut(usize) -> bool>;

    thread_local! {
        static AFTER_WRITE: RefCell<Option<Hook>> = RefCell::new(None);
        static FAIL_AT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }

    /// Run `f` after each write that a commit made on this thread applies (the caller's
    /// part of a commit written on two threads), with the number of those writes so far
    /// (the commit lock still held); `f` returning false ends the commit there as a crash
    /// would: nothing put back, the LSN not stored. `None` removes the hook.
    pub(crate) fn set_after_write(f: Option<Hook>) {
        AFTER_WRITE.with(|h| *h.borrow_mut() = f);
    }

    pub(super) fn after_write(n: usize) -> bool {
        AFTER_WRITE.with(|h| h.borrow_mut().as_mut().is_none_or(|f| f(n)))
    }

    /// Make write number `n` (from 1) of a commit made on this thread (its caller's part)
    /// fail as a sled error would, before it is made; the commit then puts back what both
    /// parts wrote. `None` removes it.
    pub(crate) fn set_fail_at(n: Option<usize>) {
        FAIL_AT.with(|f| f.set(n));
    }

    pub(super) fn fails(n: usize) -> bool {
        FAIL_AT.with(|f| f.get() == Some(n))
    }
}

#[cfg(test)]
pub(super) mod tests {
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

    #[test]
    fn a_large_commit_splits_into_whole_trees_and_a_small_one_does_not() {
        let d = tempfile::TempDir::new().unwrap();
        let s = crate::store::Store::open(d.path()).unwrap();
        let mut tx = Tx::new(&s.trees);
        let put_both = |tx: &mut Tx<'_>, keys: std::ops::Range<u32>| {
            for i in keys {
                tx.put(T::Log, i.to_be_bytes().to_vec(), b"v".to_vec());
                tx.put(T::Received, i.to_be_bytes().to_vec(), b"v".to_vec());
            }
        };
        put_both(&mut tx, 0..10);
        let (mine, theirs) = split(&tx.w);
        assert_eq!((mine.len(), theirs.len()), (20, 0));
        put_both(&mut tx, 10..200);
        tx.put(T::Meta, b"seq".to_vec(), b"v".to_vec());
        let (mine, theirs) = split(&tx.w);
        let all: Vec<journal::Entry<'_>> = entries(&tx.w).collect();
        let trees = |p: &[usize]| {
            let mut t: Vec<u8> = p.iter().map(|&at| all[at].0).collect();
            t.dedup();
            t
        };
        if crate::par::cores() < 2 {
            assert!(theirs.is_empty());
            return;
        }
        // One of the two large trees each side, every tree whole on one side, every write
        // in exactly one part.
        let mut every: Vec<usize> = mine.iter().chain(&theirs).copied().collect();
        every.sort_unstable();
        assert_eq!(every, (0..401).collect::<Vec<_>>());
        assert!(mine.len() >= 200 && theirs.len() >= 200);
        let (a, b) = (trees(&mine), trees(&theirs));
        assert!(a.iter().all(|t| !b.contains(t)));
        assert!(a.contains(&(T::Log as u8)) != b.contains(&(T::Log as u8)));
        assert!(a.contains(&(T::Received as u8)) != b.contains(&(T::Received as u8)));
        // Each part keeps the write set's order.
        for p in [&mine, &theirs] {
            assert!(p.windows(2).all(|w| w[0] < w[1]));
        }
        tx.commit().unwrap();
        for i in 0..200u32 {
            for t in [T::Log, T::Received] {
                assert!(s.trees.t(t).get(i.to_be_bytes()).unwrap().is_some());
            }
        }
    }

    /// A part too small for a thread's start of its own: nothing is split.
    #[test]
    fn a_commit_with_one_large_tree_is_not_split() {
        let d = tempfile::TempDir::new().unwrap();
        let s = crate::store::Store::open(d.path()).unwrap();
        let mut tx = Tx::new(&s.trees);
        for i in 0..300u32 {
            tx.del(T::Log, i.to_be_bytes().to_vec());
        }
        for i in 0..(PART_MIN as u32 - 1) {
            tx.put(T::Meta, i.to_be_bytes().to_vec(), b"v".to_vec());
        }
        let (mine, theirs) = split(&tx.w);
        assert_eq!((mine.len(), theirs.len()), (300 + PART_MIN - 1, 0));
        tx.put(T::Meta, b"one more".to_vec(), b"v".to_vec());
        let (mine, theirs) = split(&tx.w);
        if crate::par::cores() >= 2 {
            assert_eq!((mine.len(), theirs.len()), (300, PART_MIN));
        }
    }

    /// A commit that waits on the journal's lock behind one that panics midway is refused
    /// once it gets the lock: committing on the half-applied state would reuse that
    /// commit's LSN and replace its undo record, and the open could no longer roll it back.
    #[test]
    fn a_commit_waiting_behind_one_that_stops_midway_is_refused() {
        let d = tempfile::TempDir::new().unwrap();
        let s = crate::store::Store::open(d.path()).unwrap();
        put(&s.trees, b"a").unwrap();
        let trees = &s.trees;
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let waiting = std::thread::scope(|sc| {
            let other = sc.spawn(move || {
                go_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                put(trees, b"c")
            });
            hooks::set_after_write(Some(Box::new(move |_| {
                go_tx.send(()).unwrap();
                // The other commit reaches the journal's lock meanwhile (if it comes
                // later, it is refused all the same).
                std::thread::sleep(Duration::from_millis(100));
                panic!("a panic midway");
            })));
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| put(trees, b"b")));
            hooks::set_after_write(None);
            assert!(res.is_err());
            other.join().unwrap()
        });
        assert!(waiting.is_err(), "{waiting:?}");
        drop(s);
        let s = crate::store::Store::open(d.path()).unwrap();
        for t in [T::Meta, T::Log] {
            assert_eq!(s.trees.t(t).get(b"b").unwrap(), None);
            assert_eq!(s.trees.t(t).get(b"c").unwrap(), None);
            assert!(s.trees.t(t).get(b"a").unwrap().is_some());
        }
    }

    /// A sled error on the caller's side of a commit written on two threads, after its
    /// first write, while the other thread wrote its whole part: the before-images of both
    /// parts are put back (overwritten values and new keys alike), the store takes the
    /// next commit, and a reopen finds the state before the failed commit.
    #[test]
    fn a_failed_write_on_one_side_puts_back_both_sides() {
        let d = tempfile::TempDir::new().unwrap();
        let s = crate::store::Store::open(d.path()).unwrap();
        let tx = two_tree_commit(&s.trees);
        let two = !split(&tx.w).1.is_empty();
        assert_eq!(two, crate::par::cores() >= 2);
        hooks::set_fail_at(Some(2));
        let res = tx.commit();
        hooks::set_fail_at(None);
        let err = res.unwrap_err().to_string();
        assert!(err.contains("a test's sled error"), "{err}");
        let check = |s: &crate::store::Store| {
            for i in 0..300 {
                let log = s.trees.t(T::Log).get(key(i)).unwrap();
                assert_eq!(log.as_deref(), Some(&b"1"[..]), "log {i}");
                assert_eq!(
                    s.trees.t(T::Outbox).get(key(i)).unwrap(),
                    None,
                    "outbox {i}"
                );
            }
        };
        check(&s);
        // Nothing is left half applied: the store goes on.
        put(&s.trees, b"after").unwrap();
        s.flush_blocking().unwrap();
        drop(s);
        let s = crate::store::Store::open(d.path()).unwrap();
        check(&s);
        assert!(s.trees.t(T::Log).get(b"after").unwrap().is_some());
    }

    /// Key `i` of [`two_tree_commit`]'s trees.
    pub(in crate::store) fn key(i: u32) -> Vec<u8> {
        format!("k{i:04}").into_bytes()
    }

    /// Commit 300 `log` keys ([`key`]) of value "1", and return a commit, not made, large
    /// enough to be written on two threads, one tree each: those keys set to "2" and 300
    /// new `outbox` keys of value "2".
    pub(in crate::store) fn two_tree_commit(trees: &Trees) -> Tx<'_> {
        let mut tx = Tx::new(trees);
        for i in 0..300 {
            tx.put(T::Log, key(i), b"1".to_vec());
        }
        tx.commit().unwrap();
        let mut tx = Tx::new(trees);
        for i in 0..300 {
            tx.put(T::Log, key(i), b"2".to_vec());
            tx.put_new(T::Outbox, key(i), b"2".to_vec());
        }
        tx
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
