//! The [`Store`] itself: opening, the writer's state, receiving, the log, meta, pruning.
//! The outbox is in `outbox.rs`, peers and their addresses in `peers.rs`.

use super::codec::{
    corrupt, dec, enc, hex, pack, peer_from_hex, pkey, read_u64, repack, split_pkey, u64_be,
    unpack, utf8, LogRec, OutRec, Payload, ThreadRec,
};
use super::group::Group;
use super::threads::{add_threads, raise_seen, thread_count, tkey};
use super::tx::{db_err, Trees, Tx, T};
use super::{Dir, LogEntry, Received, StoreError, RETENTION_MS};
use crate::wire::ids::IdGen;
use crate::wire::{self, Line, PeerKey};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// sled page cache for a small node (the default is 1 GiB).
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

pub(super) const META_LAST_ID: &[u8] = b"last_id";
/// Meta key of the store's format number (u64 big-endian, [`STORE_FORMAT`]).
const META_FORMAT: &[u8] = b"format";
/// The format of the stores this build writes and the newest it reads: the trees and
/// record encodings of `store/` as they are (records raw, DEFLATE or LZ4 by the bits of
/// their length word, see `store/codec.rs`). A change an older build would misread bumps
/// it; an older build that knows this key refuses a newer store
/// ([`StoreError::NewerFormat`]) instead of misreading it. Stores created before the key
/// existed are of format 1 and get the key when next opened.
///
/// Format 2: commits are plain sled writes behind an undo record (tree `undo`, `tx.rs`)
/// that only a format-2 build rolls back after a crash; a format-1 build would keep the
/// part of a cut commit that reached sled. A format-1 store needs no conversion: the open
/// records format 2 before anything commits.
///
/// Format 3: the dedup index keeps most lines in run records (tree `received_runs`, see
/// `received.rs`), which a format-2 build does not read: it would take a replay of such a
/// line for a new one. A format-2 (or 1) store needs no conversion: its single entries in
/// `received` are one of the index's two forms, and the open records format 3 before
/// anything commits.
pub const STORE_FORMAT: u64 = 3;
pub(super) const META_LOG_SEQ: &[u8] = b"log_seq";
const META_USER_PREFIX: &[u8] = b"x/";
/// Meta keys `intro/` ‖ introducer (32 raw bytes) ‖ introduced key (32 raw bytes) → empty:
/// which keys each peer introduced (its quota, see [`Store::introduce`]).
pub(super) const META_INTRO_PREFIX: &[u8] = b"intro/";
/// Set once the `outbox_b` counters cover the whole outbox.
pub(super) const META_OUTBOX_B: &[u8] = b"outbox_b";

/// Refuse a store of a format newer than [`STORE_FORMAT`] ([`StoreError::NewerFormat`]);
/// record the format in one that has none (stores created before the key existed are of
/// format 1) or an older one (1 or 2 → 3 needs no conversion, see [`STORE_FORMAT`]). The write
/// precedes every commit in sled's log, so a crash image that holds any commit of this
/// build holds it too; it is durable with the next flush (a checkpoint). A format of 0 is
/// taken as is.
fn check_format(meta: &sled::Tree, dir: &Path) -> Result<(), StoreError> {
    match meta.get(META_FORMAT).map_err(db_err)? {
        Some(v) => {
            let found = read_u64("meta", &v)?;
            if found > STORE_FORMAT {
                return Err(StoreError::NewerFormat {
                    dir: dir.display().to_string(),
                    found,
                    supported: STORE_FORMAT,
                });
            }
            if (1..STORE_FORMAT).contains(&found) {
                meta.insert(META_FORMAT, &u64_be(STORE_FORMAT))
                    .map_err(db_err)?;
            }
        }
        None => {
            meta.insert(META_FORMAT, &u64_be(STORE_FORMAT))
                .map_err(db_err)?;
        }
    }
    Ok(())
}

/// Databases this process opened: `true` while a [`Store`] is open, `false` once dropped.
/// sled releases its file lock only when its background I/O threads let go, shortly after
/// the handle is dropped; a reopen in the same process waits for that instead of failing.
static OPENED: Mutex<Vec<(PathBuf, bool)>> = Mutex::new(Vec::new());

/// How long a reopen waits for this process's own closing handle to release the lock.
const REOPEN_WAIT: Duration = Duration::from_secs(5);

fn opened() -> MutexGuard<'static, Vec<(PathBuf, bool)>> {
    OPENED.lock().unwrap_or_else(PoisonError::into_inner)
}

fn canonical(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

fn set_opened(dir: PathBuf, open: bool) {
    let mut o = opened();
    match o.iter_mut().find(|(d, _)| *d == dir) {
        Some(e) => e.1 = open,
        None => o.push((dir, open)),
    }
}

/// Whether `dir` was opened and closed again by this process.
fn closed_here(dir: &Path) -> bool {
    opened().iter().any(|(d, open)| d == dir && !open)
}

fn open_db(dir: &Path, quarantine: &Path) -> Result<sled::Db, StoreError> {
    let deadline = Instant::now() + REOPEN_WAIT;
    loop {
        let repaired = super::files::repair(dir, quarantine).map_err(|e| {
            StoreError::Db(format!(
                "{}: cannot move damaged snapshot files aside: {e}",
                dir.display()
            ))
        })?;
        if repaired.is_none() && closed_here(&canonical(dir)) && Instant::now() < deadline {
            // Our own closing handle still holds the lock: wait, so the files are checked.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let res = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .open();
        match res {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
                if closed_here(&canonical(dir)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                return Err(StoreError::Locked {
                    dir: dir.display().to_string(),
                });
            }
            Err(e) => return Err(db_err(e)),
        }
    }
}

/// State owned by the single writer: the id generator and the log sequence counter. Both
/// are advanced only after their transaction committed.
pub(super) struct Writer {
    pub(super) ids: IdGen,
    pub(super) log_seq: u64,
    /// The in-memory side of the dedup index (`received.rs`).
    dedup: super::received::DedupIndex,
}

impl Writer {
    /// Forget the in-memory dedup bounds, as an eviction of every peer would.
    #[cfg(test)]
    pub(super) fn forget_dedup_bounds(&mut self) {
        self.dedup = Default::default();
    }
    pub(super) fn ids_clone(&self) -> IdGen {
        self.ids.clone()
    }
    pub(super) fn log_seq_value(&self) -> u64 {
        self.log_seq
    }
    /// After a transaction that used copies of both committed.
    pub(super) fn set_after_commit(&mut self, ids: IdGen, log_seq: u64) {
        self.ids = ids;
        self.log_seq = log_seq;
    }
}

/// The node's database: outbox, message log, dedup index, seen, threads, peers, addresses
/// and meta, in one sled database. Cheap to share behind an `Arc`; all methods take `&self`.
///
/// Writes become durable only after [`Store::flush`] (or [`Store::flush_blocking`]).
pub struct Store {
    pub(super) db: sled::Db,
    pub(super) trees: Trees,
    writer: Mutex<Writer>,
    group: Arc<Group>,
    /// The database directory (free space is measured on its file system).
    dir: PathBuf,
    /// Threads one peer may open with us (`threads.rs`).
    pub(super) max_threads: std::sync::atomic::AtomicU64,
    /// Work run inside [`Store::receive_batch`]'s transaction (see [`super::InboundHook`]).
    pub(super) hook: std::sync::OnceLock<Arc<dyn super::InboundHook>>,
    /// Signs our content lines as they are queued (see `store/signing.rs`).
    pub(super) signer: std::sync::OnceLock<Arc<crate::identity::Identity>>,
    /// Declared last: holds the last sled handles and closes them (see [`Closer`]).
    _close: Closer,
}

/// How long dropping a [`Store`] waits for sled to close the database before it leaves
/// the rest to a thread of its own.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// The last handles of a [`Store`]'s database; dropped last. Its drop marks the directory
/// closed by this process (a reopen here then waits for sled's lock, see [`open_db`]) and
/// drops the handles on a thread named `store-close`, waiting at most [`CLOSE_WAIT`] for it.
///
/// sled 0.34.7 flushes when its last tree handle is dropped, in a loop that returns only
/// when a flush finds nothing more to write; in rare test runs that loop never returned
/// (seen at a runtime's teardown, and with another store of the process committing: that
/// cycle is closed by `gate`, which the drop holds). Whatever the node acked was flushed before, so a close
/// that takes longer is logged and left to finish or to end with the process: it no
/// longer holds the thread that dropped the store (a runtime's worker, or the exit).
struct Closer {
    dir: Option<PathBuf>,
    handles: Option<(sled::Db, Vec<sled::Tree>, Arc<Group>)>,
}

impl Drop for Closer {
    fn drop(&mut self) {
        if let Some(p) = self.dir.take() {
            set_opened(p, false);
        }
        let Some(handles) = self.handles.take() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("store-close".into())
            .spawn(move || {
                handles.2.close_checkpoint();
                // The last handles' drop flushes (see `gate`).
                let gate = super::gate::flush();
                drop(handles);
                drop(gate);
                let _ = tx.send(());
            });
        match spawned {
            // The handles were dropped with the closure, on this thread.
            Err(e) => tracing::warn!("cannot start a thread to close the store: {e}"),
            Ok(_) => {
                if rx.recv_timeout(CLOSE_WAIT).is_err() {
                    tracing::error!(
                        "the database did not close within {} s; its close goes on in the background (every acked line was flushed before)",
                        CLOSE_WAIT.as_secs()
                    );
                }
            }
        }
    }
}

/// Kinds the receiver acks individually (protocol-notes §Threads: msg and state, plus the
/// reliable extensions).
pub(super) fn acked_kind(kind: &str) -> bool {
    matches!(kind, "msg" | "state" | "mirror" | "private")
}

/// Whether an inbound line is a content line that moves `seen` and is logged.
fn content_th(line: &Line) -> Option<&str> {
    match line {
        Line::Msg(_) | Line::State(_) | Line::Mirror(_) | Line::Private(_) => line.th(),
        Line::Chunk(c) => c.th.as_deref(),
        Line::Introduce(i) => i.th.as_deref(),
        _ => None,
    }
}

impl Store {
    /// Open (or create) the database in `dir`, with the quarantine directory next to it
    /// (`<parent of dir>/quarantine`; see [`Store::open_in`]).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let parent = dir.parent().unwrap_or(dir);
        Store::open_in(dir, &parent.join(super::files::QUARANTINE_DIR))
    }

    /// Open (or create) the database in `dir`. First, when no process holds it, the files a
    /// crash can leave that sled 0.34.7 would misread (an unfinished `snap.*.generating`,
    /// an empty or truncated snapshot, a truncated `conf`) are moved to `quarantine` with a
    /// warning in the log (see `store/files.rs`). Fails at once with [`StoreError::Locked`]
    /// if another process (or another open `Store` in this process) holds the database.
    /// Seeds the id generator from the stored last id.
    pub fn open_in(dir: &Path, quarantine: &Path) -> Result<Store, StoreError> {
        let db = open_db(dir, quarantine)?;
        let path = canonical(dir);
        set_opened(path.clone(), true);
        let mut close = Closer {
            dir: Some(path),
            handles: None,
        };
        // Before the other trees are opened (and created when missing): a newer store is
        // refused as it was found, apart from sled's own recovery at open.
        check_format(
            &db.open_tree(super::tx::NAMES[T::Meta as usize])
                .map_err(db_err)?,
            dir,
        )?;
        let mut trees = Trees::open(&db)?;
        // sled keeps its data in one file, `db`, inside the directory.
        let data_file = std::fs::File::open(dir.join("db")).ok();
        if data_file.is_none() {
            tracing::warn!(
                "{}: no sled data file to fsync; flushes rely on sync_file_range",
                dir.display()
            );
        }
        // What sled lacks of the journal's records is applied before anything is read.
        let journal = Arc::new(super::journal::open(
            dir,
            quarantine,
            &db,
            &trees,
            data_file.as_ref(),
        )?);
        // The first flush is a checkpoint: it covers the writes of the open itself made
        // outside transactions (the format key).
        journal.needs_full();
        trees.journal = Arc::clone(&journal);
        let meta = trees.t(T::Meta);
        let last = match meta.get(META_LAST_ID).map_err(db_err)? {
            Some(v) => {
                let s = utf8("meta", &v)?;
                Some(ulid::Ulid::from_string(&s).map_err(|e| corrupt("meta", e))?)
            }
            None => None,
        };
        let log_seq = match meta.get(META_LOG_SEQ).map_err(db_err)? {
            Some(v) => read_u64("meta", &v)?,
            None => 0,
        };
        restrict(dir);
        let group = Group::new(db.clone(), data_file, journal);
        close.handles = Some((db.clone(), trees.all.clone(), group.clone()));
        let store = Store {
            db,
            trees,
            writer: Mutex::new(Writer {
                ids: IdGen::new(last),
                log_seq,
                dedup: Default::default(),
            }),
            group,
            dir: dir.to_path_buf(),
            max_threads: std::sync::atomic::AtomicU64::new(super::threads::MAX_THREADS_PER_PEER),
            hook: std::sync::OnceLock::new(),
            signer: std::sync::OnceLock::new(),
            _close: close,
        };
        store.key_threads_by_peer()?;
        store.count_outbox_bytes()?;
        Ok(store)
    }

    /// A fresh id for a control line (hello, auth, resume, ack, ping, pong, bye, err) from
    /// the same monotonic generator as queued lines, so every id this node sends is larger
    /// than the previous one. Not persisted by itself (control ids are never resumed).
    pub fn next_control_id(&self) -> String {
        let mut w = self.writer();
        w.ids.next_at(crate::wire::time::now_ms()).to_string()
    }

    /// Callers of [`Store::flush`] waiting for a flush another caller leads (tests).
    #[cfg(test)]
    pub(super) fn flush_waiters(&self) -> usize {
        self.group.waiting()
    }

    pub(super) fn guard(&self) -> &super::faults::Guard {
        &self.group.guard
    }

    /// The database directory.
    pub(super) fn space_dir(&self) -> &Path {
        &self.dir
    }

    /// The node's home: the database directory's parent.
    pub(super) fn home_dir(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    pub(super) fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Make every write so far durable. Concurrent callers share one fsync (group commit):
    /// a caller returns only after a flush that started after its call completed. The flush
    /// runs on the blocking pool.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.group.flush(false).await
    }

    /// [`Store::flush`] for a small, latency-bound commit (a few lines that a peer waits
    /// on): a flush this caller leads runs on the caller's thread
    /// (`tokio::task::block_in_place` on a multi-thread runtime; elsewhere as
    /// [`Store::flush`]), without the blocking pool's two thread hand-offs. Same group
    /// commit, same errors.
    pub async fn flush_inline(&self) -> Result<(), StoreError> {
        self.group.flush(true).await
    }

    /// [`Store::flush`] for synchronous contexts (same group commit; blocks the thread).
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        self.group.flush_blocking()
    }

    /// Number of database flushes (fsyncs) run by [`Store::flush`] / [`Store::flush_blocking`]
    /// since open.
    pub fn flush_count(&self) -> u64 {
        self.group.count()
    }

    /// Store transactions (atomic multi-tree commits, see `tx.rs`) committed since this
    /// store was opened (each writes an undo record and a journal record: the receive path
    /// aims at one per received batch). For tests and benches that count them.
    pub fn transaction_count(&self) -> u64 {
        self.trees
            .commits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Store an inbound content line (msg, state, mirror, private, threaded chunk/introduce)
    /// from `peer`: dedup by (peer, id) permanently; when new, log it, raise `seen[peer][th]`
    /// and update the thread — one transaction. See [`Store::receive_batch`] for the rules.
    pub fn receive(&self, peer: &PeerKey, line: &Line, raw: &[u8]) -> Result<Received, StoreError> {
        let mut r = self.receive_batch(peer, &[(line, raw)])?;
        r.pop()
            .ok_or_else(|| StoreError::Db("receive produced no result".into()))
    }

    /// Store many inbound lines from `peer` in ONE transaction (then flush once and ack).
    /// Results are in input order.
    ///
    /// - Content lines (msg, state, mirror, private; chunk and introduce only with `th`):
    ///   a (peer, id) seen before — in an earlier call or earlier in this batch — is
    ///   [`Received::Duplicate`] and changes nothing. A new one gets a log entry (dir In;
    ///   unread, except chunks, which are stored read and not counted as unread since the
    ///   naming msg is what a reader reads), `seen[peer][th]` = max(old, id) by byte order, and
    ///   a thread upsert (peer and since when new; subject from the first msg that has one;
    ///   `theirs`/`their_note` from a state; updated; unread). Returns [`Received::New`]
    ///   with the log seq (always ≥ 1).
    /// - Any other line (ack, ping, grant, presence, unthreaded chunk/introduce, …) is
    ///   stored nowhere and not deduplicated: [`Received::New`]`(0)`.
    /// - A batch with new content fails with [`StoreError::DiskFull`] (nothing stored, so
    ///   nothing may be acked) while free space is under the reserve
    ///   ([`Store::check_space`]); replays are answered as above.
    pub fn receive_batch(
        &self,
        peer: &PeerKey,
        lines: &[(&Line, &[u8])],
    ) -> Result<Vec<Received>, StoreError> {
        Ok(self.receive_batch_acks(peer, lines, &[])?.0)
    }

    /// [`Store::receive_batch`] and the peer's acks `acks` (`(th, re)` each, as in
    /// [`Store::ack`]) in ONE transaction: the received lines, their dedup, seen and thread
    /// records, the inbound hook's records and the retired outbox lines commit together, or
    /// nothing does. Returns the lines' results (input order) and, per ack, whether `re` was
    /// in the outbox. Acks retire only our own lines, which the peer holds (it acked them):
    /// they need no flush of ours before they take effect; the received lines do, as ever.
    /// A batch with new content fails as a whole with [`StoreError::DiskFull`] under the
    /// reserve; acks alone never check space (they free it).
    pub fn receive_batch_acks(
        &self,
        peer: &PeerKey,
        lines: &[(&Line, &[u8])],
        acks: &[(&str, &str)],
    ) -> Result<(Vec<Received>, Vec<bool>), StoreError> {
        let mut w = self.writer();
        let mut seq = w.log_seq;
        let now = wire::time::now_ms();
        let peer_hex = hex(peer.as_bytes());
        let mut tx = Tx::new(&self.trees);
        let mut batch_ids: HashSet<&str> = HashSet::new();
        let mut new_lines: Vec<&Line> = Vec::new();
        let mut out = Vec::with_capacity(lines.len());
        // Derived records touched by the batch, decoded once and written once at the end:
        // thread records by th, and the largest id per th for `seen`.
        let mut threads: HashMap<&str, ThreadRec> = HashMap::new();
        let mut seen: HashMap<&str, &str> = HashMap::new();
        // The dedup index entries of the new lines above the peer's bound (strictly
        // increasing ids): written as run records at the end (`received.rs`).
        let mut run: Vec<(&[u8], u64)> = Vec::new();
        // Replays in id order look up the same run one after another.
        let mut run_cache = super::received::RunCache::default();
        for (line, raw) in lines {
            let (Some(th), Some(id)) = (content_th(line), line.id()) else {
                out.push(Received::New(0));
                continue;
            };
            // Dedup: an id above the peer's bound is new without a disk read (see
            // `DedupIndex`); one at or below it is looked up in the index on disk (this
            // batch's own lines are in `batch_ids`).
            let above = match w.dedup.bound(&self.trees, peer)? {
                Some(max) => id.as_bytes() > max,
                None => true,
            };
            if batch_ids.contains(id)
                || (!above
                    && super::received::received_seq_cached(
                        self.trees.t(T::Received),
                        self.trees.t(T::ReceivedRuns),
                        peer,
                        id.as_bytes(),
                        &mut run_cache,
                    )?
                    .is_some())
            {
                out.push(Received::Duplicate);
                continue;
            }
            if !threads.contains_key(th) {
                let rec = match tx.get(T::Threads, &tkey(th, peer))? {
                    Some(v) => dec("threads", &v)?,
                    None => {
                        // A new thread: within the peer's bound, or the line is not stored.
                        if thread_count(&tx, peer)? >= self.max_threads_per_peer() {
                            out.push(Received::TooManyThreads);
                            continue;
                        }
                        add_threads(&mut tx, peer, 1)?;
                        self.thread_for_update(&tx, th, peer, now, false)?
                    }
                };
                threads.insert(th, rec);
            }
            batch_ids.insert(id);
            w.dedup.raise(peer, id.as_bytes());
            seq += 1;
            let kind = line.kind().to_owned();
            let unread = kind != "chunk";
            let lrec = LogRec {
                dir: Dir::In,
                peer: peer_hex.clone(),
                id: id.to_owned(),
                th: Some(th.to_owned()),
                kind,
                at: now,
                read: !unread,
                acked: true,
            };
            tx.put_new(T::Log, u64_be(seq), pack(&lrec, raw)?);
            // A run entry holds an id of 1 to the wire's cap of bytes; any other id (only
            // from a caller inside the process: the parser refuses it) is a single entry.
            if above && !id.is_empty() && id.len() <= crate::wire::parse::MAX_ID_LEN {
                run.push((id.as_bytes(), seq));
            } else {
                tx.put_new(T::Received, pkey(peer, id.as_bytes()), u64_be(seq).to_vec());
            }
            match seen.get_mut(th) {
                Some(m) if id.as_bytes() <= m.as_bytes() => {}
                Some(m) => *m = id,
                None => {
                    seen.insert(th, id);
                }
            }
            // Threads are per peer: another peer's thread of the same id is not touched.
            if let Some(t) = threads.get_mut(th) {
                t.updated = t.updated.max(now);
                if unread {
                    t.unread += 1;
                }
                match line {
                    Line::Msg(m) if t.subject.is_none() => t.subject = m.subject.clone(),
                    Line::State(s) => {
                        t.theirs = Some(s.state.clone());
                        t.their_note = s.note.clone();
                    }
                    _ => {}
                }
            }
            if matches!(line, Line::Msg(_) | Line::State(_)) {
                new_lines.push(line);
            }
            out.push(Received::New(seq));
        }
        for (first, rec) in super::received::encode_runs(&run) {
            tx.put_new(T::ReceivedRuns, pkey(peer, first), rec);
        }
        for (th, id) in seen {
            raise_seen(&mut tx, peer, th, id, None)?;
        }
        for (th, t) in threads {
            tx.put(T::Threads, tkey(th, peer), enc(&t)?);
        }
        let mut ids = w.ids.clone();
        if let (Some(hook), false) = (self.hook.get(), new_lines.is_empty()) {
            // Work that must commit with the lines (artifact commands): same transaction.
            let mut atx = super::artifacts::ArtTx::new(self, &mut tx, &mut ids, &mut seq, now);
            hook.on_lines(&mut atx, peer, &new_lines)?;
        }
        let found = if acks.is_empty() {
            Vec::new()
        } else {
            self.ack_in(&mut tx, peer, acks)?
        };
        if seq != w.log_seq {
            // New content only: a batch of replays and control lines stores no line.
            self.check_space(0)?;
            tx.put(T::Meta, META_LOG_SEQ, u64_be(seq).to_vec());
        }
        if !tx.is_empty() {
            tx.commit()?;
            w.log_seq = seq;
            w.ids = ids;
        }
        Ok((out, found))
    }

    /// seen for `peer`: thread → largest content id received (our resume).
    pub fn seen(&self, peer: &PeerKey) -> Result<BTreeMap<String, String>, StoreError> {
        let mut out = BTreeMap::new();
        for kv in self.trees.t(T::Seen).scan_prefix(peer.as_bytes()) {
            let (k, v) = kv.map_err(db_err)?;
            let th = super::codec::after_pkey("seen", &k)?;
            out.insert(utf8("seen", th)?, utf8("seen", &v)?);
        }
        Ok(out)
    }

    /// Log entries with seq > `after`, optionally of one thread / only unread inbound, in
    /// seq order, at most `limit`. (Filters scan the log from `after`.)
    pub fn log(
        &self,
        after: u64,
        th: Option<&str>,
        unread_only: bool,
        limit: usize,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let mut out = Vec::new();
        let Some(start) = after.checked_add(1) else {
            return Ok(out);
        };
        for kv in self.trees.t(T::Log).range(u64_be(start)..) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv.map_err(db_err)?;
            let e = log_entry(&self.trees, &k, &v)?;
            if th.is_some() && e.th.as_deref() != th {
                continue;
            }
            if unread_only && (e.dir != Dir::In || e.read) {
                continue;
            }
            out.push(e);
        }
        Ok(out)
    }

    /// Mark inbound entries read by seq (and lower their threads' unread counts). Unknown
    /// seqs, outbound and already read entries are skipped. Returns how many changed.
    pub fn mark_read(&self, seqs: &[u64]) -> Result<usize, StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let mut changed = 0;
        for &seq in seqs {
            let Some(v) = tx.get(T::Log, &u64_be(seq))? else {
                continue;
            };
            let (mut l, line): (LogRec, Payload) = unpack("log", &v)?;
            if l.dir != Dir::In || l.read {
                continue;
            }
            l.read = true;
            tx.put(T::Log, u64_be(seq).to_vec(), repack(&l, line)?);
            if let Some(th) = &l.th {
                let tk = tkey(th, &peer_from_hex("log", &l.peer)?);
                if let Some(tv) = tx.get(T::Threads, &tk)? {
                    let mut t: ThreadRec = dec("threads", &tv)?;
                    t.unread = t.unread.saturating_sub(1);
                    tx.put(T::Threads, tk, enc(&t)?);
                }
            }
            changed += 1;
        }
        tx.commit()?;
        Ok(changed)
    }

    /// Drop outbox lines whose id (ULID) timestamp and log entries whose `at_ms` are older
    /// than [`RETENTION_MS`] at `now_ms` (protocol-notes: the outbox keeps lines 7 days).
    /// Returns outbox lines plus log entries removed.
    ///
    /// The dedup index (`received`, `received_runs`) and `seen` are kept forever: dedup is
    /// permanent per the protocol, and an entry is a few dozen bytes, so a replay of a very old line is still
    /// recognised as a duplicate. Threads and peers are kept too.
    pub fn prune(&self, now_ms: u64) -> Result<usize, StoreError> {
        let cutoff = now_ms.saturating_sub(RETENTION_MS);
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let mut removed = 0usize;
        let mut per_peer: BTreeMap<PeerKey, (i64, i64)> = BTreeMap::new();
        // Log entries holding the line of a queued outbox record stay while it does.
        let mut keep: HashSet<u64> = HashSet::new();
        for kv in self.trees.t(T::Outbox).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (peer, id) = split_pkey("outbox", &k)?;
            let id = utf8("outbox", &id)?;
            let ts = ulid::Ulid::from_string(&id)
                .map_err(|e| corrupt("outbox", e))?
                .timestamp_ms();
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            if ts < cutoff {
                tx.del(T::Outbox, k.to_vec());
                let e = per_peer.entry(peer).or_default();
                e.0 -= 1;
                e.1 -= rec.queued_len(v.len()) as i64;
                removed += 1;
            } else if rec.log_len.is_some() {
                keep.insert(rec.seq);
            }
        }
        for (peer, (lines, bytes)) in per_peer {
            self.adjust_count(&mut tx, &peer, lines)?;
            self.adjust_bytes(&mut tx, &peer, bytes)?;
        }
        for kv in self.trees.t(T::Log).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (l, _): (LogRec, Payload) = unpack("log", &v)?;
            if l.at < cutoff && !keep.contains(&read_u64("log", &k)?) {
                tx.del(T::Log, k.to_vec());
                tx.del(T::LogAcked, k.to_vec());
                removed += 1;
            }
        }
        tx.commit()?;
        Ok(removed)
    }

    /// What the store holds, in bytes (a full scan, for measurements): `.0` as stored (key
    /// and value bytes of every tree), `.1` with every compressed line counted at its
    /// full length (what the database would hold without compression).
    pub fn data_bytes(&self) -> Result<(u64, u64), StoreError> {
        let (mut stored, mut logical) = (0u64, 0u64);
        for name in self.db.tree_names() {
            let tree = self.db.open_tree(&name).map_err(db_err)?;
            let lines = match &*name {
                b"outbox" => Some("outbox"),
                b"log" => Some("log"),
                _ => None,
            };
            for kv in tree.iter() {
                let (k, v) = kv.map_err(db_err)?;
                let n = (k.len() + v.len()) as u64;
                stored += n;
                logical += match lines {
                    Some(t) => {
                        let (_, p): (serde_json::Value, Payload) = unpack(t, &v)?;
                        n + p.get(t)?.len() as u64 - p.stored_len() as u64
                    }
                    None => n,
                };
            }
        }
        Ok((stored, logical))
    }

    /// Largest id ever allocated by [`Store::enqueue`] (the id generator's seed).
    pub fn last_id(&self) -> Result<Option<String>, StoreError> {
        match self.trees.t(T::Meta).get(META_LAST_ID).map_err(db_err)? {
            Some(v) => Ok(Some(utf8("meta", &v)?)),
            None => Ok(None),
        }
    }

    /// A value stored with [`Store::meta_put`] (for other modules: grants, presence seq, …).
    /// Keys live in their own namespace, apart from the store's internal meta keys.
    pub fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let k = [META_USER_PREFIX, key.as_bytes()].concat();
        Ok(self
            .trees
            .t(T::Meta)
            .get(k)
            .map_err(db_err)?
            .map(|v| v.to_vec()))
    }

    /// Store `value` under `key` (see [`Store::meta_get`]). Not durable until a flush.
    pub fn meta_put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let _w = self.writer();
        let k = [META_USER_PREFIX, key.as_bytes()].concat();
        let r = self.trees.t(T::Meta).insert(k, value).map_err(db_err);
        self.trees.journal.needs_full();
        r.map(|_| ())
    }

    /// Remove `key` (see [`Store::meta_get`]). Returns whether it existed.
    pub fn meta_remove(&self, key: &str) -> Result<bool, StoreError> {
        let _w = self.writer();
        let k = [META_USER_PREFIX, key.as_bytes()].concat();
        let r = self.trees.t(T::Meta).remove(k).map_err(db_err);
        self.trees.journal.needs_full();
        Ok(r?.is_some())
    }

    /// Approximate size of the database on disk, in bytes.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk().map_err(db_err)
    }
}

/// Make the database directory and its files private to this user (0700 / 0600): they
/// hold every message. Best effort; failures are logged.
fn restrict(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path, mode: u32| {
        if let Err(e) = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)) {
            tracing::warn!("chmod {:o} {}: {e}", mode, p.display());
        }
    };
    set(dir, 0o700);
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            set(&p, if p.is_dir() { 0o700 } else { 0o600 });
        }
    }
}

/// A log entry; `acked` from its record or the separate mark ([`T::LogAcked`]).
fn log_entry(trees: &Trees, k: &[u8], v: &[u8]) -> Result<LogEntry, StoreError> {
    let seq = read_u64("log", k)?;
    let (l, line): (LogRec, Payload) = unpack("log", v)?;
    let line = line.get("log")?;
    let acked =
        l.acked || (l.dir == Dir::Out && trees.t(T::LogAcked).contains_key(k).map_err(db_err)?);
    Ok(LogEntry {
        seq,
        dir: l.dir,
        peer: peer_from_hex("log", &l.peer)?,
        id: l.id,
        th: l.th,
        kind: l.kind,
        line: line.to_vec(),
        at_ms: l.at,
        read: l.read,
        acked,
    })
}

/// Up to `limit` records of `tree` with key > `after` (from the first when None), in key
/// order, each turned into an item by `item(key, value)`: one page of a listing, read
/// without loading the rest of the tree.
pub(super) fn page_after<R>(
    tree: super::tree::Tr<'_>,
    after: Option<&[u8]>,
    limit: usize,
    mut item: impl FnMut(&[u8], &[u8]) -> Result<R, StoreError>,
) -> Result<Vec<R>, StoreError> {
    use std::ops::Bound;
    let start = match after {
        Some(a) => Bound::Excluded(a.to_vec()),
        None => Bound::Unbounded,
    };
    let mut out = Vec::new();
    for kv in tree
        .range::<Vec<u8>, _>((start, Bound::Unbounded))
        .take(limit)
    {
        let (k, v) = kv.map_err(db_err)?;
        out.push(item(&k, &v)?);
    }
    Ok(out)
}

#[cfg(test)]
mod format_tests {
    use super::*;

    /// The format number in the meta tree of the store open in `dir`.
    fn stored_format(s: &Store) -> Option<u64> {
        s.trees
            .t(T::Meta)
            .get(META_FORMAT)
            .unwrap()
            .map(|v| read_u64("meta", &v).unwrap())
    }

    #[test]
    fn a_store_records_its_format_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(stored_format(&s), Some(STORE_FORMAT));
        // What a later build with a changed format would leave behind.
        s.trees
            .t(T::Meta)
            .insert(META_FORMAT, &u64_be(STORE_FORMAT + 1))
            .unwrap();
        s.flush_blocking().unwrap();
        drop(s);
        match Store::open(dir.path()) {
            Err(StoreError::NewerFormat {
                found, supported, ..
            }) => {
                assert_eq!((found, supported), (STORE_FORMAT + 1, STORE_FORMAT));
            }
            Err(e) => panic!("expected NewerFormat, got {e}"),
            Ok(_) => panic!("a store of a newer format was opened"),
        }
        let msg = Store::open(dir.path()).err().unwrap().to_string();
        assert!(msg.contains("newer than this build reads"), "{msg}");
    }

    #[test]
    fn a_store_without_the_format_key_gets_it_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        // A store created before the key existed.
        s.trees.t(T::Meta).remove(META_FORMAT).unwrap();
        s.flush_blocking().unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(stored_format(&s), Some(STORE_FORMAT));
    }

    /// A store of format 1 (commits as sled transactions) or 2 (no dedup runs) is recorded
    /// as format 3 when opened, so the builds before the undo record or the runs refuse it
    /// from then on.
    #[test]
    fn an_older_store_becomes_format_3_when_opened() {
        for old in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            let s = Store::open(dir.path()).unwrap();
            s.trees
                .t(T::Meta)
                .insert(META_FORMAT, &u64_be(old))
                .unwrap();
            s.flush_blocking().unwrap();
            drop(s);
            let s = Store::open(dir.path()).unwrap();
            assert_eq!(stored_format(&s), Some(3), "from {old}");
            drop(s);
            let s = Store::open(dir.path()).unwrap();
            assert_eq!(stored_format(&s), Some(3), "from {old}");
        }
    }

    #[test]
    fn a_malformed_format_value_is_reported_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.trees.t(T::Meta).insert(META_FORMAT, b"1").unwrap();
        s.flush_blocking().unwrap();
        drop(s);
        match Store::open(dir.path()) {
            Err(StoreError::Corrupt { tree: "meta", .. }) => {}
            Err(e) => panic!("expected Corrupt, got {e}"),
            Ok(_) => panic!("a malformed format value was accepted"),
        }
    }
}
