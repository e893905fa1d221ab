//! The [`Store`] itself.

use super::codec::{
    corrupt, dec, enc, hex, pack, payload_only, peer_from_hex, pkey, read_u64, repack, split_pkey,
    u64_be, unpack, utf8, AddrRec, LogRec, OutRec, Payload, PeerRec, ThreadRec,
};
use super::group::Group;
use super::threads::{add_threads, raise_seen, thread_count, tkey};
use super::tx::{db_err, Trees, Tx, T};
use super::{
    AddrSource, AddressRecord, Dir, Introduced, LineBuilder, LogEntry, OutboxEntry, Park,
    PeerRecord, Received, StoreError, RETENTION_MS,
};
use crate::wire::ids::IdGen;
use crate::wire::{self, Line, PeerKey};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// sled page cache for a small node (the default is 1 GiB).
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

const META_LAST_ID: &[u8] = b"last_id";
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
const META_INTRO_PREFIX: &[u8] = b"intro/";
/// Set once the `outbox_b` counters cover the whole outbox.
const META_OUTBOX_B: &[u8] = b"outbox_b";

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
    ids: IdGen,
    log_seq: u64,
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
fn acked_kind(kind: &str) -> bool {
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

    /// Allocate ids and queue `builders`' lines for `peer` in ONE transaction (outbox, out
    /// log, thread subject/my state, last id). Ids strictly increase in call order.
    ///
    /// Each builder gets (id, ts) with ts = now as `YYYY-MM-DDTHH:MM:SS.mmmZ` and must return
    /// a line carrying that id ([`StoreError::BadLine`] otherwise). A line whose encoding is
    /// over [`wire::MAX_LINE`] fails the whole call with [`StoreError::TooLarge`]; nothing is
    /// queued and no id is consumed. Also clears the peer's parked mark (new outbound
    /// traffic, protocol-notes §Liveness). Not durable until [`Store::flush`].
    /// [`StoreError::DiskFull`] (nothing queued) while free space is under the reserve
    /// ([`Store::check_space`]).
    pub fn enqueue(
        &self,
        peer: &PeerKey,
        builders: &[LineBuilder<'_>],
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        self.check_space(0)?;
        let mut w = self.writer();
        let mut ids = w.ids.clone();
        let mut seq = w.log_seq;
        let now = wire::time::now_ms();
        let mut tx = Tx::new(&self.trees);
        let out = self.enqueue_in(&mut tx, &mut ids, &mut seq, now, peer, builders)?;
        if out.is_empty() {
            return Ok(out);
        }
        tx.commit()?;
        w.ids = ids;
        w.log_seq = seq;
        Ok(out)
    }

    /// The body of [`Store::enqueue`] on a caller's write set: allocates ids from `ids`
    /// and log seqs from `seq` (the caller stores both back into the writer after its
    /// commit) and records `last_id` / `log_seq` in meta.
    pub(super) fn enqueue_in(
        &self,
        tx: &mut Tx<'_>,
        ids: &mut IdGen,
        seq: &mut u64,
        now: u64,
        peer: &PeerKey,
        builders: &[LineBuilder<'_>],
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let ts = wire::time::format_ms(now);
        let mut out = Vec::with_capacity(builders.len());
        let mut queued_bytes = 0u64;
        let peer_hex = hex(peer.as_bytes());
        for b in builders {
            let id = ids.next_at(now).to_string();
            let line = b(&id, &ts);
            if line.id() != Some(id.as_str()) {
                return Err(StoreError::BadLine(format!(
                    "builder returned id {:?}, expected {id}",
                    line.id()
                )));
            }
            let bytes = self.sign_if_on(line.kind(), line.encode())?;
            if bytes.len() > wire::MAX_LINE {
                return Err(StoreError::TooLarge {
                    len: bytes.len(),
                    max: wire::MAX_LINE,
                });
            }
            let th = line.th().map(str::to_owned);
            let kind = line.kind().to_owned();
            *seq += 1;
            // Chunk data is kept once: in the outbox (or the source file), not in the log.
            // Every other line is kept once too: in the log, which the outbox points at.
            let logged = super::blobs::log_form(&kind, &bytes);
            let once = kind != "chunk" && matches!(logged, std::borrow::Cow::Borrowed(_));
            let orec = OutRec {
                th: th.clone(),
                kind: kind.clone(),
                seq: *seq,
                log_len: once.then_some(bytes.len() as u64),
            };
            let packed = pack(&orec, if once { &[] } else { &bytes })?;
            queued_bytes += orec.queued_len(packed.len()) as u64;
            tx.put(T::Outbox, pkey(peer, id.as_bytes()), packed);
            let lrec = LogRec {
                dir: Dir::Out,
                peer: peer_hex.clone(),
                id: id.clone(),
                th: th.clone(),
                kind: kind.clone(),
                at: now,
                read: true,
                acked: false,
            };
            tx.put_new(T::Log, u64_be(*seq), pack(&lrec, &logged)?);
            if let Some(th) = &th {
                if tx.get(T::Threads, &tkey(th, peer))?.is_none() {
                    add_threads(tx, peer, 1)?;
                }
                let mut t = self.thread_for_update(tx, th, peer, now, true)?;
                t.updated = t.updated.max(now);
                match &line {
                    Line::Msg(m) if t.subject.is_none() => t.subject = m.subject.clone(),
                    Line::State(s) => {
                        t.mine = Some(s.state.clone());
                        t.my_note = s.note.clone();
                    }
                    _ => {}
                }
                tx.put(T::Threads, tkey(th, peer), enc(&t)?);
            }
            out.push(OutboxEntry {
                id,
                th,
                kind,
                line: bytes,
                seq: *seq,
            });
        }
        if out.is_empty() {
            return Ok(out);
        }
        self.adjust_count(tx, peer, out.len() as i64)?;
        self.adjust_bytes(tx, peer, queued_bytes as i64)?;
        let pk = peer.as_bytes().to_vec();
        if let Some(v) = tx.get(T::Peers, &pk)? {
            let mut p: PeerRec = dec("peers", &v)?;
            if p.parked {
                p.parked = false;
                p.parked_by_us = false;
                tx.put(T::Peers, pk, enc(&p)?);
            }
        }
        if let Some(last) = ids.last() {
            tx.put(T::Meta, META_LAST_ID, last.to_string().into_bytes());
        }
        tx.put(T::Meta, META_LOG_SEQ, u64_be(*seq).to_vec());
        Ok(out)
    }

    /// The thread record to update (existing, or a new one with `peer` at `now`, opened by
    /// us when `ours`).
    fn thread_for_update(
        &self,
        tx: &Tx<'_>,
        th: &str,
        peer: &PeerKey,
        now: u64,
        ours: bool,
    ) -> Result<ThreadRec, StoreError> {
        Ok(match tx.get(T::Threads, &tkey(th, peer))? {
            Some(v) => dec("threads", &v)?,
            None => ThreadRec {
                peer: hex(peer.as_bytes()),
                subject: None,
                mine: None,
                my_note: None,
                theirs: None,
                their_note: None,
                since: now,
                updated: now,
                unread: 0,
                ours,
            },
        })
    }

    pub(super) fn adjust_count(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        delta: i64,
    ) -> Result<(), StoreError> {
        let k = peer.as_bytes().to_vec();
        let cur = match tx.get(T::OutboxN, &k)? {
            Some(v) => read_u64("outbox_n", &v)?,
            None => 0,
        };
        let new = (cur as i64).saturating_add(delta).max(0) as u64;
        if new == 0 {
            tx.del(T::OutboxN, k);
        } else {
            tx.put(T::OutboxN, k, u64_be(new).to_vec());
        }
        Ok(())
    }

    /// Add `delta` to the bytes queued for `peer` (the `outbox_b` counter, floored at 0).
    pub(super) fn adjust_bytes(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        delta: i64,
    ) -> Result<(), StoreError> {
        if delta == 0 {
            return Ok(());
        }
        let k = peer.as_bytes().to_vec();
        let cur = match tx.get(T::OutboxB, &k)? {
            Some(v) => read_u64("outbox_b", &v)?,
            None => 0,
        };
        let new = (cur as i64).saturating_add(delta).max(0) as u64;
        if new == 0 {
            tx.del(T::OutboxB, k);
        } else {
            tx.put(T::OutboxB, k, u64_be(new).to_vec());
        }
        Ok(())
    }

    /// What is queued for `peer`: (lines, bytes of their stored records). O(1): both are
    /// counters kept in the transactions that queue and retire lines.
    pub fn outbox_usage(&self, peer: &PeerKey) -> Result<(u64, u64), StoreError> {
        let bytes = match self
            .trees
            .t(T::OutboxB)
            .get(peer.as_bytes())
            .map_err(db_err)?
        {
            Some(v) => read_u64("outbox_b", &v)?,
            None => 0,
        };
        Ok((self.outbox_len(peer)?, bytes))
    }

    /// Rebuild the `outbox_b` counters from the outbox once, for a database written before
    /// they existed (marked done in meta).
    fn count_outbox_bytes(&self) -> Result<(), StoreError> {
        let meta = self.trees.t(T::Meta);
        if meta.get(META_OUTBOX_B).map_err(db_err)?.is_some() {
            return Ok(());
        }
        let _w = self.writer();
        let mut per_peer: BTreeMap<PeerKey, i64> = BTreeMap::new();
        for kv in self.trees.t(T::Outbox).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (peer, _) = split_pkey("outbox", &k)?;
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            *per_peer.entry(peer).or_default() += rec.queued_len(v.len()) as i64;
        }
        let mut tx = Tx::new(&self.trees);
        for (peer, n) in per_peer {
            tx.del(T::OutboxB, peer.as_bytes().to_vec());
            self.adjust_bytes(&mut tx, &peer, n)?;
        }
        tx.put(T::Meta, META_OUTBOX_B, b"1".to_vec());
        tx.commit()
    }

    /// Up to `limit` outbox lines for `peer` with id > `after` (all when None), in id order
    /// (which is enqueue order). Fewer than `limit` only when no more are queued.
    ///
    /// Most lines are stored once, in their out log entry, so each record costs a second
    /// lookup; from [`PARALLEL_RESOLVE`] records up (a replay's batches) those lookups run
    /// on two threads, each over half of the records (a resume after a restart reads
    /// sled's pages from disk, and that was most of a replay's time; issue 10).
    pub fn outbox_after(
        &self,
        peer: &PeerKey,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        use std::ops::Bound;
        let prefix = pkey(peer, b"");
        let mut start = match after {
            Some(a) => Bound::Excluded(pkey(peer, a.as_bytes())),
            None => Bound::Included(prefix.clone()),
        };
        let mut out = Vec::new();
        // A record whose line left the log after the scan read it resolves to nothing (see
        // `outbox_entry`): the scan then goes on after it until `limit` lines are found.
        while out.len() < limit {
            let want = limit - out.len();
            let mut raw: Vec<(sled::IVec, sled::IVec)> = Vec::new();
            for kv in self
                .trees
                .t(T::Outbox)
                .range::<Vec<u8>, _>((start.clone(), Bound::Unbounded))
            {
                if raw.len() >= want {
                    break;
                }
                let (k, v) = kv.map_err(db_err)?;
                if !k.starts_with(&prefix) {
                    break;
                }
                raw.push((k, v));
            }
            let Some((last, _)) = raw.last() else {
                break;
            };
            start = Bound::Excluded(last.to_vec());
            let ended = raw.len() < want;
            out.extend(resolve_outbox(&self.trees, &raw)?);
            if ended {
                break;
            }
        }
        Ok(out)
    }

    /// Number of queued lines for `peer` (a counter kept with the outbox; O(1)).
    pub fn outbox_len(&self, peer: &PeerKey) -> Result<u64, StoreError> {
        match self
            .trees
            .t(T::OutboxN)
            .get(peer.as_bytes())
            .map_err(db_err)?
        {
            Some(v) => read_u64("outbox_n", &v),
            None => Ok(0),
        }
    }

    /// Peers with at least one queued line, in raw key order.
    pub fn outbox_peers(&self) -> Result<Vec<PeerKey>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::OutboxN).iter() {
            let (k, _) = kv.map_err(db_err)?;
            out.push(super::codec::peer_from_slice("outbox_n", &k)?);
        }
        Ok(out)
    }

    /// Remove outbox lines (known to be delivered) and mark their out log entries acked.
    /// `lines`: (outbox key, out-log seq, queued length: [`OutRec::queued_len`]).
    pub(super) fn retire(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        lines: &[(Vec<u8>, u64, usize)],
    ) -> Result<(), StoreError> {
        let bytes: usize = lines.iter().map(|l| l.2).sum();
        self.adjust_bytes(tx, peer, -(bytes as i64))?;
        for (key, seq, _) in lines {
            tx.del(T::Outbox, key.clone());
            // The mark, not a rewrite of the entry (which holds the whole line).
            tx.put(T::LogAcked, u64_be(*seq).to_vec(), Vec::new());
        }
        self.adjust_count(tx, peer, -(lines.len() as i64))
    }

    /// On the peer's resume: drop lines with id <= seen[th] for each listed thread (ids
    /// compared as byte strings) and mark their out log entries acked. Threads not listed are
    /// untouched. Returns how many were dropped. One transaction.
    pub fn drop_seen(
        &self,
        peer: &PeerKey,
        seen: &BTreeMap<String, String>,
    ) -> Result<usize, StoreError> {
        let Some(max) = seen.values().max() else {
            return Ok(0);
        };
        let _w = self.writer();
        let prefix = pkey(peer, b"");
        let end = pkey(peer, max.as_bytes());
        let mut drop = Vec::new();
        for kv in self.trees.t(T::Outbox).range(prefix.clone()..=end) {
            let (k, v) = kv.map_err(db_err)?;
            let id = &k[32..];
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            let Some(th) = &rec.th else { continue };
            if let Some(s) = seen.get(th) {
                if id <= s.as_bytes() {
                    drop.push((k.to_vec(), rec.seq, rec.queued_len(v.len())));
                }
            }
        }
        if drop.is_empty() {
            return Ok(0);
        }
        let mut tx = Tx::new(&self.trees);
        self.retire(&mut tx, peer, &drop)?;
        tx.commit()?;
        Ok(drop.len())
    }

    /// An ack from `peer` for `re`: remove it from the outbox, mark the out log entry acked,
    /// and (cumulative ack) when it is an individually acked kind (msg, state, mirror,
    /// private) also remove earlier lines of the same thread whose kind is never acked on its
    /// own (chunk, introduce). The thread is taken from the stored line; `th` is the ack's
    /// and only used when nothing is stored. Returns true when `re` was in the outbox (false
    /// for an unknown or already retired id, which changes nothing). One transaction; see
    /// [`Store::receive_batch_acks`] for many acks at once.
    pub fn ack(&self, peer: &PeerKey, th: &str, re: &str) -> Result<bool, StoreError> {
        let (_, found) = self.receive_batch_acks(peer, &[], &[(th, re)])?;
        Ok(found.first().copied().unwrap_or(false))
    }

    /// The acks `acks` (each `(th, re)` as in [`Store::ack`], in arrival order) applied in
    /// `tx`: every line they name and the earlier unacked-kind lines of their threads are
    /// retired once, however many acks of the batch cover them. One scan of the peer's
    /// outbox up to the largest acked key, not one per ack. Returns, per ack, whether `re`
    /// was in the outbox (a repeated `re` in the batch: false the second time).
    fn ack_in(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        acks: &[(&str, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut found = Vec::with_capacity(acks.len());
        let mut retire: Vec<(Vec<u8>, u64, usize)> = Vec::new();
        let mut retired: HashSet<Vec<u8>> = HashSet::new();
        // Per thread: the largest outbox key of an individually acked line acked here.
        let mut upto: HashMap<String, Vec<u8>> = HashMap::new();
        for (th, re) in acks {
            let key = pkey(peer, re.as_bytes());
            if retired.contains(&key) {
                found.push(false);
                continue;
            }
            let Some(v) = tx.get(T::Outbox, &key)? else {
                found.push(false);
                continue;
            };
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            if acked_kind(&rec.kind) {
                let th = rec.th.clone().unwrap_or_else(|| th.to_string());
                match upto.get_mut(&th) {
                    Some(m) if *m >= key => {}
                    Some(m) => *m = key.clone(),
                    None => {
                        upto.insert(th, key.clone());
                    }
                }
            }
            retire.push((key.clone(), rec.seq, rec.queued_len(v.len())));
            retired.insert(key);
            found.push(true);
        }
        if let Some(end) = upto.values().max().cloned() {
            let prefix = pkey(peer, b"");
            for kv in self.trees.t(T::Outbox).range(prefix..end) {
                let (k, v) = kv.map_err(db_err)?;
                if retired.contains(k.as_ref()) {
                    continue;
                }
                let (r, _): (OutRec, Payload) = unpack("outbox", &v)?;
                if acked_kind(&r.kind) {
                    continue;
                }
                let covered =
                    r.th.as_deref()
                        .and_then(|t| upto.get(t))
                        .is_some_and(|m| k.as_ref() < m.as_slice());
                if covered {
                    retire.push((k.to_vec(), r.seq, r.queued_len(v.len())));
                    retired.insert(k.to_vec());
                }
            }
        }
        if !retire.is_empty() {
            self.retire(tx, peer, &retire)?;
        }
        Ok(found)
    }

    /// Store an inbound content line (msg, state, mirror, private, threaded chunk/introduce)
    /// from `peer`: dedup by (peer, id) permanently; when new, log it, raise seen[peer][th]
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
    ///   naming msg is what a reader reads), seen[peer][th] = max(old, id) by byte order, and
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

    /// Record a peer seen in a handshake: upsert name, about and caps (replaced by these),
    /// last seen = `now_ms` (first seen kept), and clear parked.
    pub fn peer_seen(
        &self,
        key: &PeerKey,
        name: Option<&str>,
        about: Option<&str>,
        caps: &[String],
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = key.as_bytes().to_vec();
        let first = match tx.get(T::Peers, &k)? {
            Some(v) => dec::<PeerRec>("peers", &v)?.first,
            None => now_ms,
        };
        let rec = PeerRec {
            name: name.map(str::to_owned),
            about: about.map(str::to_owned),
            caps: caps.to_vec(),
            first,
            last: now_ms,
            parked: false,
            parked_by_us: false,
            introduced_by: None,
        };
        tx.put(T::Peers, k, enc(&rec)?);
        tx.commit()
    }

    /// One peer.
    pub fn peer(&self, key: &PeerKey) -> Result<Option<PeerRecord>, StoreError> {
        match self.trees.t(T::Peers).get(key.as_bytes()).map_err(db_err)? {
            Some(v) => Ok(Some(peer_record(*key, &v)?)),
            None => Ok(None),
        }
    }

    /// All known peers, in raw key order.
    pub fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::Peers).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let key = super::codec::peer_from_slice("peers", &k)?;
            out.push(peer_record(key, &v)?);
        }
        Ok(out)
    }

    /// Up to `limit` known peers with key > `after` (from the first when None), in raw key
    /// order: one page of the `peers` listing.
    pub fn peers_after(
        &self,
        after: Option<&PeerKey>,
        limit: usize,
    ) -> Result<Vec<PeerRecord>, StoreError> {
        page_after(
            self.trees.t(T::Peers),
            after.map(|a| a.as_bytes().as_slice()),
            limit,
            |k, v| peer_record(super::codec::peer_from_slice("peers", k)?, v),
        )
    }

    /// Change the parked mark (protocol-notes §bye) as `how` says: [`Park::PeerBye`] and
    /// [`Park::ByUs`] park (an unknown peer gets a record, seen now), [`Park::Clear`] clears
    /// (an unknown peer: nothing). A peer parked by us stays so on its `bye`.
    pub fn set_parked(&self, key: &PeerKey, how: Park) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = key.as_bytes().to_vec();
        let (parked, by_us) = match how {
            Park::Clear => (false, false),
            Park::PeerBye => (true, false),
            Park::ByUs => (true, true),
        };
        let rec = match tx.get(T::Peers, &k)? {
            Some(v) => {
                let mut p: PeerRec = dec("peers", &v)?;
                let by_us = by_us || (how == Park::PeerBye && p.parked && p.parked_by_us);
                if p.parked == parked && p.parked_by_us == by_us {
                    return Ok(());
                }
                p.parked = parked;
                p.parked_by_us = by_us;
                p
            }
            None if !parked => return Ok(()),
            None => {
                let now = wire::time::now_ms();
                PeerRec {
                    name: None,
                    about: None,
                    caps: Vec::new(),
                    first: now,
                    last: now,
                    parked,
                    parked_by_us: by_us,
                    introduced_by: None,
                }
            }
        };
        tx.put(T::Peers, k, enc(&rec)?);
        tx.commit()
    }

    /// Remember an address for `peer` now: [`Store::add_address_at`] at the current time.
    pub fn add_address(
        &self,
        peer: &PeerKey,
        address: &str,
        source: AddrSource,
    ) -> Result<(), StoreError> {
        self.add_address_at(peer, address, source, wire::time::now_ms())
    }

    /// Remember an address for `peer`, heard at `now_ms`. A new address keeps its source;
    /// a known one keeps its first source unless the new source is `Connect` (an address
    /// the user asked for beats hello/introduce). Never downgrades; dial history is kept.
    /// Sources `Hello` and `Connect` set its last-heard time (the peer itself, or the user,
    /// vouches for it now). At most [`super::MAX_PEER_ADDRESSES`] are kept per peer: the
    /// stalest others (last in [`Store::addresses`] order) are dropped.
    pub fn add_address_at(
        &self,
        peer: &PeerKey,
        address: &str,
        source: AddrSource,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = pkey(peer, address.as_bytes());
        let heard = (source != AddrSource::Introduce).then_some(now_ms);
        let rec = match tx.get(T::Addresses, &k)? {
            Some(v) => {
                let mut a: AddrRec = dec("addresses", &v)?;
                let upgrade = source == AddrSource::Connect && a.source != AddrSource::Connect;
                let fresher = heard.is_some() && heard > a.heard;
                if !upgrade && !fresher {
                    return Ok(());
                }
                if upgrade {
                    a.source = AddrSource::Connect;
                }
                a.heard = a.heard.max(heard);
                a
            }
            None => AddrRec {
                source,
                ok: None,
                err_at: None,
                err: None,
                by: None,
                heard,
            },
        };
        tx.put(T::Addresses, k, enc(&rec)?);
        tx.commit()?;
        self.trim_addresses(peer, Some(address))
    }

    /// Drop `peer`'s stalest addresses beyond [`super::MAX_PEER_ADDRESSES`], never `keep`.
    /// The caller holds the writer lock.
    fn trim_addresses(&self, peer: &PeerKey, keep: Option<&str>) -> Result<(), StoreError> {
        let all = self.addresses(peer)?;
        if all.len() <= super::MAX_PEER_ADDRESSES {
            return Ok(());
        }
        let mut tx = Tx::new(&self.trees);
        let mut left = all.len();
        for a in all.iter().rev() {
            if left <= super::MAX_PEER_ADDRESSES {
                break;
            }
            if Some(a.address.as_str()) == keep {
                continue;
            }
            tx.del(T::Addresses, pkey(peer, a.address.as_bytes()));
            left -= 1;
        }
        tx.commit()
    }

    /// Record a dial result for a known address: `Ok` sets last ok, `Err(detail)` sets last
    /// error time and text. An address never added with [`Store::add_address`] is ignored.
    pub fn address_result(
        &self,
        peer: &PeerKey,
        address: &str,
        result: Result<(), &str>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = pkey(peer, address.as_bytes());
        let Some(v) = tx.get(T::Addresses, &k)? else {
            return Ok(());
        };
        let mut a: AddrRec = dec("addresses", &v)?;
        match result {
            Ok(()) => a.ok = Some(now_ms),
            Err(e) => {
                a.err_at = Some(now_ms);
                a.err = Some(e.to_owned());
            }
        }
        tx.put(T::Addresses, k, enc(&a)?);
        tx.commit()
    }

    /// Known addresses of `peer`, freshest first (the order the dialer and `connect PEER`
    /// try them in): addresses last known good ([`AddressRecord::fresh_ms`]: a successful
    /// dial, or the peer announcing it in an authenticated hello) most recent first; then
    /// those whose last dial failed after that; then introduced hints that never worked.
    /// Ties: older last failure first, then address text. A peer that moved to a new port
    /// is dialed at the new address first, not at the one that worked last week.
    pub fn addresses(&self, peer: &PeerKey) -> Result<Vec<AddressRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::Addresses).scan_prefix(peer.as_bytes()) {
            let (k, v) = kv.map_err(db_err)?;
            let addr = super::codec::after_pkey("addresses", &k)?;
            let a: AddrRec = dec("addresses", &v)?;
            out.push(AddressRecord {
                peer: *peer,
                address: utf8("addresses", addr)?,
                source: a.source,
                last_ok_ms: a.ok,
                last_err_ms: a.err_at,
                last_err: a.err,
                introduced_by: a
                    .by
                    .as_deref()
                    .map(|h| peer_from_hex("addresses", h))
                    .transpose()?,
                last_heard_ms: a.heard,
            });
        }
        // 0: known good; 1: failed since; 2: never known good (an introduced hint, never
        // ahead of an address that worked).
        let rank = |a: &AddressRecord| match a.fresh_ms() {
            None => 2,
            Some(_) if a.failing() => 1,
            Some(_) => 0,
        };
        out.sort_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then(b.fresh_ms().cmp(&a.fresh_ms()))
                .then(a.last_err_ms.cmp(&b.last_err_ms))
                .then(a.address.cmp(&b.address))
        });
        Ok(out)
    }

    /// Record an introduction by `introducer` of `key` (protocol-notes §Grants, 10.4), in
    /// one transaction. Introductions are hints scoped to their introducer:
    /// - each introducer may introduce at most `max_keys` distinct keys (a repeat of a key
    ///   it introduced before counts once); over that, nothing is stored ([`Introduced::OverQuota`]);
    /// - an unknown `key` gets a peer record named `name`, marked introduced by
    ///   `introducer`; a known peer's record (name, about, caps) is never changed;
    /// - `address` (already checked by the caller) is added with source `introduce` and its
    ///   introducer, unless the peer already has it; it sorts after every address that
    ///   worked (see [`Store::addresses`]).
    pub fn introduce(
        &self,
        introducer: &PeerKey,
        key: &PeerKey,
        name: Option<&str>,
        address: Option<&str>,
        max_keys: usize,
        now_ms: u64,
    ) -> Result<Introduced, StoreError> {
        let _w = self.writer();
        let prefix = [META_INTRO_PREFIX, introducer.as_bytes()].concat();
        let idx = [prefix.as_slice(), key.as_bytes()].concat();
        let meta = self.trees.t(T::Meta);
        if meta.contains_key(&idx).map_err(db_err)? {
            return Ok(Introduced::Again);
        }
        // Counting stops at the quota: at most `max_keys` entries are read.
        if meta.scan_prefix(&prefix).keys().take(max_keys).count() >= max_keys {
            return Ok(Introduced::OverQuota);
        }
        let mut tx = Tx::new(&self.trees);
        tx.put(T::Meta, idx, Vec::new());
        let by = hex(introducer.as_bytes());
        let pk = key.as_bytes().to_vec();
        if tx.get(T::Peers, &pk)?.is_none() {
            let rec = PeerRec {
                name: name.map(str::to_owned),
                about: None,
                caps: Vec::new(),
                first: now_ms,
                last: now_ms,
                parked: false,
                parked_by_us: false,
                introduced_by: Some(by.clone()),
            };
            tx.put(T::Peers, pk, enc(&rec)?);
        }
        if let Some(address) = address {
            let ak = pkey(key, address.as_bytes());
            if tx.get(T::Addresses, &ak)?.is_none() {
                let rec = AddrRec {
                    source: AddrSource::Introduce,
                    ok: None,
                    err_at: None,
                    err: None,
                    by: Some(by),
                    heard: None,
                };
                tx.put(T::Addresses, ak, enc(&rec)?);
            }
        }
        tx.commit()?;
        self.trim_addresses(key, None)?;
        Ok(Introduced::Added)
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

/// Outbox records from which [`Store::outbox_after`] resolves their lines on two threads.
pub(super) const PARALLEL_RESOLVE: usize = 128;

/// The entries of outbox records `raw` (key, value; in order), skipping those whose line
/// left the log meanwhile ([`outbox_entry`]); split over two threads from
/// [`PARALLEL_RESOLVE`] records up when the process may use two cores ([`crate::par::halves`]).
fn resolve_outbox(
    trees: &Trees,
    raw: &[(sled::IVec, sled::IVec)],
) -> Result<Vec<OutboxEntry>, StoreError> {
    let one = |part: &[(sled::IVec, sled::IVec)]| -> Result<Vec<OutboxEntry>, StoreError> {
        let mut out = Vec::with_capacity(part.len());
        for (k, v) in part {
            if let Some(e) = outbox_entry(trees, k, v)? {
                out.push(e);
            }
        }
        Ok(out)
    };
    match crate::par::halves(raw, PARALLEL_RESOLVE, one) {
        crate::par::Split::Whole(r) => r,
        crate::par::Split::Halves { first, second, .. } => {
            let mut out = first?;
            out.extend(second?);
            Ok(out)
        }
    }
}

/// An outbox record as an entry, with its line: its own payload, or (a line stored once,
/// [`OutRec::log_len`]) the payload of its out log entry. The key's peer part is not
/// decoded: callers scan one peer's prefix, and decoding a key (an Ed25519 point
/// decompression) per line was most of the cost of a resume replay. None when the log entry is
/// missing because the record left the outbox after the caller read it (a prune or forget
/// removes both in one transaction while a scan runs without the writer lock); a missing
/// entry of a record still queued, or one of another length, is [`StoreError::Corrupt`].
fn outbox_entry(trees: &Trees, k: &[u8], v: &[u8]) -> Result<Option<OutboxEntry>, StoreError> {
    let id = k
        .get(32..)
        .ok_or_else(|| corrupt("outbox", "key shorter than a peer key"))?;
    let (rec, line): (OutRec, Payload) = unpack("outbox", v)?;
    let line = match rec.log_len {
        None => line.get("outbox")?.into_owned(),
        Some(len) => {
            let Some(lv) = trees.t(T::Log).get(u64_be(rec.seq)).map_err(db_err)? else {
                if !trees.t(T::Outbox).contains_key(k).map_err(db_err)? {
                    return Ok(None);
                }
                return Err(corrupt(
                    "outbox",
                    format!("line {} is not in the log", rec.seq),
                ));
            };
            // Only the line is needed: its record's header is not parsed.
            let line = payload_only("log", &lv)?.get("log")?.into_owned();
            if line.len() as u64 != len {
                return Err(corrupt(
                    "outbox",
                    format!("log entry {} is not the queued line", rec.seq),
                ));
            }
            line
        }
    };
    Ok(Some(OutboxEntry {
        id: utf8("outbox", id)?,
        th: rec.th,
        kind: rec.kind,
        line,
        seq: rec.seq,
    }))
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

fn peer_record(key: PeerKey, v: &[u8]) -> Result<PeerRecord, StoreError> {
    let p: PeerRec = dec("peers", v)?;
    Ok(PeerRecord {
        key,
        name: p.name,
        about: p.about,
        caps: p.caps,
        first_seen_ms: p.first,
        last_seen_ms: p.last,
        parked: p.parked,
        parked_by_us: p.parked && p.parked_by_us,
        introduced_by: p
            .introduced_by
            .as_deref()
            .map(|h| peer_from_hex("peers", h))
            .transpose()?,
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
