//! Assembling inbound blobs (protocol-notes §Blobs, receiver). No sockets: the session
//! feeds chunks and msgs in arrival order, then calls [`BlobReceiver::after_flush`] once
//! the store is durable.
//!
//! Rules, per (peer, ref):
//! - Chunks count from 0. `n` below the next expected is a replay: ignored, as is any
//!   chunk of a blob that is complete or has everything to complete (its last chunk, its
//!   naming msg and the declared size). `n` above it, a chunk after the `last` one, bad
//!   base64, data over the limit, data over the declared
//!   size, or a `last` chunk that ends short of it: refused (`err blob_refused`, ref, re =
//!   the chunk id; the connection stays open). A refused blob's partial file is deleted and
//!   later chunks of the ref are ignored silently.
//! - A msg's blob part declares size, name and mime (the first declaration counts). A size
//!   over the limit, or one that disagrees with data already received, is refused (re = the
//!   msg id). Chunks may come before or after the naming msg.
//! - Each chunk is written at the recorded offset: the partial file is cut to it (once
//!   per batch) and the data written ([`BlobReceiver::take_chunk`]); at the end of the
//!   batch each file written is fsynced once, and only then the new offset recorded,
//!   together with `seen[th]` = the last chunk id, in one store transaction per blob
//!   ([`BlobReceiver::sync`]). A replay after a crash therefore starts at the recorded
//!   offset and never duplicates bytes.
//! - A driver may run those fsyncs off its own thread: [`BlobReceiver::begin_sync`] hands
//!   out the files ([`BlobSync`]), and [`BlobReceiver::finish_sync`] records the blobs
//!   once they ran. Chunks taken meanwhile (the next batch's, written while the fsync runs)
//!   see the state being synced and are recorded by the next sync, never by this one.
//! - Complete = the `last` chunk arrived, the naming msg arrived and the sizes agree. The
//!   SHA-256 is taken (from the hash kept while the chunks were written in order from
//!   offset 0, else by reading the partial file: `running`), a free final name chosen, and the record marked complete with
//!   that path in one transaction; the file is moved there once that transaction is
//!   durable ([`BlobReceiver::after_flush`]; [`BlobReceiver::recover`] finishes moves a
//!   crash interrupted).
//! - At most [`MAX_PENDING_PER_PEER`] pending blobs per peer holding at most
//!   [`PENDING_LIMITS_PER_PEER`] × the limit in partial data; refs over [`MAX_REF_LEN`]
//!   bytes are refused.
//! - A blob whose declared remaining size, or a chunk whose data, does not fit on the disk
//!   with the store's reserve left ([`crate::store::Store::check_space`]), or a chunk whose
//!   write fails with ENOSPC/EDQUOT, is refused like the above: the peer hears
//!   `blob_refused` and the partial file is deleted, never kept half-written.

use super::{
    numbered, partial_path, peer_dir, sanitize_name, MAX_PENDING_PER_PEER, MAX_REF_LEN,
    PENDING_LIMITS_PER_PEER,
};
use crate::store::{InBlobState, InStatus, Store, StoreError};
use crate::wire::{self, Chunk, Msg, Part, PeerKey};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The `err blob_refused` detail for a blob that does not fit on this node's disk.
const NO_ROOM: &str = "no room for this blob: the receiving node's disk is full";

/// What to do about one chunk or one blob part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Stored, or nothing to do (a known declaration, a chunk of a finished blob).
    Stored,
    /// A chunk below the next expected index, or of a blob that is complete (or has
    /// everything to complete): a replay, ignored.
    Replay,
    /// Answer `err blob_refused` {ref, re} with `detail`; the connection stays open.
    Refuse {
        /// The ref to echo (None when too long to echo).
        blob_ref: Option<String>,
        /// The chunk or msg id.
        re: String,
        detail: String,
    },
}

/// A blob that became complete and was moved to its final path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub peer: PeerKey,
    pub blob_ref: String,
    pub th: Option<String>,
    pub msg_id: Option<String>,
    pub name: Option<String>,
    pub mime: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
    /// Final path.
    pub path: PathBuf,
}

/// A local failure while storing blob data (the session answers `err internal` and
/// closes without acking).
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("blob file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The blocking task that ran a [`BlobSync`] panicked or was cancelled: what it
    /// fsynced is unknown, so the caller treats it as a failed sync.
    #[error("blob fsync task: {0}")]
    SyncTask(String),
}

impl BlobError {
    /// As a [`StoreError`] (what the session reports on a storage failure).
    pub fn into_store_error(self) -> StoreError {
        match self {
            BlobError::Store(e) => e,
            other => StoreError::Db(other.to_string()),
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BlobError + '_ {
    move |source| BlobError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A move of a complete blob to its final path, done after the store flush.
#[derive(Debug)]
struct Move {
    from: PathBuf,
    done: Completed,
}

/// Assembles inbound blobs for one node (see the module doc for the rules).
pub struct BlobReceiver {
    store: Arc<Store>,
    root: PathBuf,
    limit: u64,
    moves: Vec<Move>,
    /// Blobs written to by [`BlobReceiver::take_chunk`] since the last
    /// [`BlobReceiver::sync`] or [`BlobReceiver::begin_sync`]: data written, not yet
    /// fsynced nor recorded.
    dirty: Vec<Dirty>,
    /// Blobs handed to a [`BlobSync`] by [`BlobReceiver::begin_sync`]: recorded by
    /// [`BlobReceiver::finish_sync`] once their fsync ran (oldest first; a blob may appear
    /// twice when a sync was begun again before the last one finished).
    syncing: Vec<Dirty>,
    /// Decoded chunk data (reused).
    buf: Vec<u8>,
}

impl BlobReceiver {
    /// Blobs under `root` (`$AWP_HOME/blobs`), each at most `limit` bytes.
    pub fn new(store: Arc<Store>, root: PathBuf, limit: u64) -> BlobReceiver {
        BlobReceiver {
            store,
            root,
            limit,
            moves: Vec::new(),
            dirty: Vec::new(),
            syncing: Vec::new(),
            buf: Vec::new(),
        }
    }

    /// The largest blob accepted, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Take in one chunk from `peer` and make it durable ([`BlobReceiver::take_chunk`]
    /// then [`BlobReceiver::sync`]). Storage failures are errors; everything the peer got
    /// wrong is a [`Verdict`].
    pub fn on_chunk(&mut self, peer: &PeerKey, c: &Chunk) -> Result<Verdict, BlobError> {
        let v = self.take_chunk(peer, c)?;
        self.sync()?;
        Ok(v)
    }

    /// Take in one chunk from `peer`: checked, its data decoded straight into a reused
    /// buffer and written at the blob's offset of its partial file, but neither fsynced nor
    /// recorded: [`BlobReceiver::sync`] does both for every chunk of a batch, once per
    /// blob, before the batch's acks (the record never gets ahead of the data on disk).
    /// Storage failures are errors; everything the peer got wrong is a [`Verdict`].
    pub fn take_chunk(&mut self, peer: &PeerKey, c: &Chunk) -> Result<Verdict, BlobError> {
        let refuse = |detail: String| Verdict::Refuse {
            blob_ref: echo(&c.blob_ref),
            re: c.id.clone(),
            detail,
        };
        if c.blob_ref.is_empty() || c.blob_ref.len() > MAX_REF_LEN {
            return Ok(refuse(format!("blob ref must be 1 to {MAX_REF_LEN} bytes")));
        }
        let now = wire::time::now_ms();
        let seen = c.th.as_deref().map(|th| (th, c.id.as_str()));
        let mut st = match self.state(peer, &c.blob_ref)? {
            Some(st) => st,
            None => {
                let st = InBlobState::new(c.th.clone(), now);
                if self.pending(peer)?.0 >= MAX_PENDING_PER_PEER {
                    return self.refuse(
                        peer,
                        &c.blob_ref,
                        st,
                        seen,
                        refuse(format!(
                            "more than {MAX_PENDING_PER_PEER} blobs pending from this peer"
                        )),
                    );
                }
                st
            }
        };
        match st.status {
            // Later chunks of a refused blob were in flight when we refused: ignore them.
            InStatus::Refused => return Ok(Verdict::Stored),
            InStatus::Complete => return Ok(Verdict::Replay),
            // Every byte and the naming msg are here: complete once synced (whether that
            // sync ran already or runs now), so what follows is a replay as well.
            InStatus::Pending if completes(&st) => return Ok(Verdict::Replay),
            InStatus::Pending => {}
        }
        if c.n < st.next_n {
            return Ok(Verdict::Replay);
        }
        if st.last_seen {
            let v = refuse(format!("chunk n {} after the last chunk", c.n));
            return self.refuse(peer, &c.blob_ref, st, seen, v);
        }
        if c.n > st.next_n {
            let v = refuse(format!("chunk n {} where {} was next", c.n, st.next_n));
            return self.refuse(peer, &c.blob_ref, st, seen, v);
        }
        let mut data = std::mem::take(&mut self.buf);
        let v = self.take_data(peer, c, &mut st, &mut data, now);
        self.buf = data;
        match v? {
            Some(v) => self.refuse(peer, &c.blob_ref, st, seen, v),
            None => Ok(Verdict::Stored),
        }
    }

    /// The data part of [`BlobReceiver::take_chunk`]: decode into `data`, check, write.
    /// A refusal is returned for the caller to record.
    fn take_data(
        &mut self,
        peer: &PeerKey,
        c: &Chunk,
        st: &mut InBlobState,
        data: &mut Vec<u8>,
        now: u64,
    ) -> Result<Option<Verdict>, BlobError> {
        let refuse = |detail: String| Verdict::Refuse {
            blob_ref: echo(&c.blob_ref),
            re: c.id.clone(),
            detail,
        };
        if let Err(e) = wire::b64::decode_any_into(&c.data, data) {
            return Ok(Some(refuse(format!("chunk data is not base64: {e}"))));
        }
        let end = st.offset.saturating_add(data.len() as u64);
        if end > self.limit {
            return Ok(Some(refuse(format!(
                "blob over the {}-byte limit",
                self.limit
            ))));
        }
        if let Some(size) = st.size {
            if end > size {
                return Ok(Some(refuse(format!(
                    "data over the declared size of {size} bytes"
                ))));
            }
            if c.last && end != size {
                return Ok(Some(refuse(format!(
                    "last chunk ends at {end} bytes; the declared size is {size}"
                ))));
            }
        }
        // All partial data of this peer (this blob's included) stays within a budget.
        let budget = self.limit.saturating_mul(PENDING_LIMITS_PER_PEER);
        let held = self.pending(peer)?.1;
        if !data.is_empty() && held.saturating_add(data.len() as u64) > budget {
            return Ok(Some(refuse(format!(
                "more than {budget} bytes of unfinished blobs from this peer"
            ))));
        }
        // No room: refused (the partial dropped) rather than half-written and lost.
        if let Some(v) = self.no_room(data.len() as u64, refuse)? {
            return Ok(Some(v));
        }
        let i = self.dirty_entry(peer, &c.blob_ref, st)?;
        let d = &mut self.dirty[i];
        let write = || d.file.write_all_at(data, st.offset);
        let (root, file) = (&self.root, &d.file);
        match running::write_hashed(root, peer, &c.blob_ref, file, st.offset, data, write) {
            Err(e) if crate::store::is_disk_full(&e) => {
                tracing::warn!("blob {}: {e}", d.path.display());
                return Ok(Some(refuse(NO_ROOM.into())));
            }
            r => r.map_err(io_err(&d.path))?,
        }
        st.offset = end;
        st.next_n += 1;
        st.last_seen = c.last;
        if st.th.is_none() {
            st.th = c.th.clone();
        }
        st.updated_ms = now;
        d.st = st.clone();
        if let Some(th) = &c.th {
            match d.seen.iter_mut().find(|(t, _)| t == th) {
                Some(s) => s.1 = c.id.clone(),
                None => d.seen.push((th.clone(), c.id.clone())),
            }
        }
        Ok(None)
    }

    /// The state of `blob_ref` from `peer`: as written this batch, else as recorded.
    fn state(&self, peer: &PeerKey, blob_ref: &str) -> Result<Option<InBlobState>, BlobError> {
        if let Some(d) = self.unrecorded(peer, blob_ref) {
            return Ok(Some(d.st.clone()));
        }
        Ok(self.store.blob_in(peer, blob_ref)?)
    }

    /// Take in the blob parts of a msg from `peer` (idempotent: a replayed msg changes
    /// nothing). One verdict per blob part.
    pub fn on_msg(&mut self, peer: &PeerKey, m: &Msg) -> Result<Vec<Verdict>, BlobError> {
        let mut out = Vec::new();
        for p in &m.parts {
            let Part::Blob(b) = p else { continue };
            let refuse = |detail: String| Verdict::Refuse {
                blob_ref: echo(&b.blob_ref),
                re: m.id.clone(),
                detail,
            };
            if b.blob_ref.is_empty() || b.blob_ref.len() > MAX_REF_LEN {
                out.push(refuse(format!("blob ref must be 1 to {MAX_REF_LEN} bytes")));
                continue;
            }
            let now = wire::time::now_ms();
            let mut st = match self.state(peer, &b.blob_ref)? {
                Some(st) => st,
                None => {
                    let st = InBlobState::new(Some(m.th.clone()), now);
                    if self.pending(peer)?.0 >= MAX_PENDING_PER_PEER {
                        let v = refuse(format!(
                            "more than {MAX_PENDING_PER_PEER} blobs pending from this peer"
                        ));
                        out.push(self.refuse(peer, &b.blob_ref, st, None, v)?);
                        continue;
                    }
                    st
                }
            };
            if st.status != InStatus::Pending || st.msg_id.is_some() {
                out.push(Verdict::Stored);
                continue;
            }
            let problem = if b.size > self.limit {
                Some(format!(
                    "declared size {} is over the {}-byte limit",
                    b.size, self.limit
                ))
            } else if st.offset > b.size || (st.last_seen && st.offset != b.size) {
                Some(format!(
                    "declared size {} disagrees with the {} bytes received",
                    b.size, st.offset
                ))
            } else {
                None
            };
            if let Some(detail) = problem {
                out.push(self.refuse(peer, &b.blob_ref, st, None, refuse(detail))?);
                continue;
            }
            if let Some(v) = self.no_room(b.size - st.offset, refuse)? {
                out.push(self.refuse(peer, &b.blob_ref, st, None, v)?);
                continue;
            }
            st.size = Some(b.size);
            st.name = b.name.clone();
            st.mime = b.mime.clone();
            st.msg_id = Some(m.id.clone());
            st.updated_ms = now;
            if let Some(d) = self.unrecorded_mut(peer, &b.blob_ref) {
                // Data of this batch not yet durable: completed and recorded by `sync`.
                d.st = st;
            } else {
                self.maybe_complete(peer, &b.blob_ref, &mut st)?;
                self.store.put_blob_in(peer, &b.blob_ref, &st, None)?;
            }
            out.push(Verdict::Stored);
        }
        Ok(out)
    }

    /// A refusal when `need` more bytes of blob data do not fit on the disk with the
    /// store's reserve left ([`Store::check_space`]); `None` when they fit. The detail the
    /// peer sees names no local path.
    fn no_room(
        &self,
        need: u64,
        refuse: impl FnOnce(String) -> Verdict,
    ) -> Result<Option<Verdict>, BlobError> {
        match self.store.check_space(need) {
            Ok(()) => Ok(None),
            Err(StoreError::DiskFull { .. }) => Ok(Some(refuse(NO_ROOM.into()))),
            Err(e) => Err(e.into()),
        }
    }

    /// The store this receiver records in.
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// Record a refusal of `blob_ref` from `peer` (dropping its partial data) with the
    /// detail of `verdict` as the reason.
    pub(super) fn refuse_record(
        &mut self,
        peer: &PeerKey,
        blob_ref: &str,
        st: InBlobState,
        verdict: Verdict,
    ) -> Result<Verdict, BlobError> {
        self.refuse(peer, blob_ref, st, None, verdict)
    }

    /// Record a refusal (dropping the partial data) and return `verdict`.
    fn refuse(
        &mut self,
        peer: &PeerKey,
        blob_ref: &str,
        mut st: InBlobState,
        seen: Option<(&str, &str)>,
        verdict: Verdict,
    ) -> Result<Verdict, BlobError> {
        if let Verdict::Refuse { detail, .. } = &verdict {
            st.reason = Some(detail.clone());
        }
        st.status = InStatus::Refused;
        st.offset = 0;
        st.updated_ms = wire::time::now_ms();
        self.dirty
            .retain(|d| !(d.peer == *peer && d.blob_ref == blob_ref));
        // A sync running for it must not record it after the refusal.
        self.syncing
            .retain(|d| !(d.peer == *peer && d.blob_ref == blob_ref));
        running::forget(&self.root, peer, blob_ref);
        let partial = partial_path(&peer_dir(&self.root, peer), blob_ref);
        match std::fs::remove_file(&partial) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&partial)(e)),
        }
        self.store.put_blob_in(peer, blob_ref, &st, seen)?;
        Ok(verdict)
    }

    /// When all data and the naming msg are there: hash, choose the final path, mark the
    /// record complete (the caller stores it) and plan the move for after the flush.
    fn maybe_complete(
        &mut self,
        peer: &PeerKey,
        blob_ref: &str,
        st: &mut InBlobState,
    ) -> Result<(), BlobError> {
        if st.status != InStatus::Pending || !completes(st) {
            return Ok(());
        }
        let dir = peer_dir(&self.root, peer);
        let partial = partial_path(&dir, blob_ref);
        let sha = match running::finish(&self.root, peer, blob_ref, &partial, st.offset) {
            Some(sha) => sha,
            None => sha256_file(&partial)?,
        };
        let base = sanitize_name(st.name.as_deref().unwrap_or("blob"));
        let path = self.free_path(&dir, &base);
        st.status = InStatus::Complete;
        st.sha256 = Some(sha.clone());
        st.path = Some(path.display().to_string());
        self.moves.push(Move {
            from: partial,
            done: Completed {
                peer: *peer,
                blob_ref: blob_ref.to_string(),
                th: st.th.clone(),
                msg_id: st.msg_id.clone(),
                name: st.name.clone(),
                mime: st.mime.clone(),
                size: st.offset,
                sha256: sha,
                path,
            },
        });
        Ok(())
    }

    /// `dir/base`, or `dir/base (i)` for the first i that is free (on disk and among the
    /// moves not yet done).
    fn free_path(&self, dir: &Path, base: &str) -> PathBuf {
        let taken = |p: &Path| p.exists() || self.moves.iter().any(|m| m.done.path == p);
        let first = dir.join(base);
        if !taken(&first) {
            return first;
        }
        for i in 1..10_000 {
            let p = dir.join(numbered(base, i));
            if !taken(&p) {
                return p;
            }
        }
        dir.join(numbered(base, rand::random::<u32>()))
    }

    /// The store flush after [`BlobReceiver::on_chunk`] / [`BlobReceiver::on_msg`]
    /// succeeded: move completed blobs to their final paths (without replacing a file
    /// that appeared there meanwhile) and return them. A move that fails is logged and
    /// retried by [`BlobReceiver::recover`] at the next start.
    pub fn after_flush(&mut self) -> Vec<Completed> {
        let mut out = Vec::new();
        for m in std::mem::take(&mut self.moves) {
            match place(&m.from, &m.done.path, self.store.durable()) {
                Ok(()) => out.push(m.done),
                Err(e) => tracing::warn!(
                    "could not move blob {} to {}: {e}",
                    m.from.display(),
                    m.done.path.display()
                ),
            }
        }
        out
    }

    /// At start: finish moves that a crash interrupted (a complete record whose partial
    /// file is still there and whose final path is free). Returns how many were moved.
    pub fn recover(&self) -> Result<usize, BlobError> {
        let mut n = 0;
        for b in self.store.blobs_in()? {
            if b.state.status != InStatus::Complete {
                continue;
            }
            let Some(path) = b.state.path.as_deref().map(PathBuf::from) else {
                continue;
            };
            let partial = partial_path(&peer_dir(&self.root, &b.peer), &b.blob_ref);
            if partial.exists() && !path.exists() {
                place(&partial, &path, self.store.durable())?;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Whether a pending blob has everything it needs to complete: its last chunk, its naming
/// msg, and as many bytes as that msg declared.
fn completes(st: &InBlobState) -> bool {
    st.last_seen && st.msg_id.is_some() && st.size == Some(st.offset)
}

/// The ref as it may be echoed in an err line (omitted when absurdly long).
fn echo(r: &str) -> Option<String> {
    (r.len() <= 4 * MAX_REF_LEN).then(|| r.to_string())
}

/// Create `dir` and its parents with mode 0700 (blobs are private like the rest of the
/// home).
fn make_dirs(dir: &Path) -> Result<(), BlobError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

fn sync_dir(dir: &Path) -> Result<(), BlobError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

fn sha256_file(path: &Path) -> Result<String, BlobError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(super::hex(&h.finalize()))
}

/// Move `from` to `to` without replacing an existing file (hard link, then unlink), and
/// fsync the directories (skipped when not `durable`).
fn place(from: &Path, to: &Path, durable: bool) -> Result<(), BlobError> {
    let dir = to.parent().unwrap_or(Path::new("."));
    make_dirs(dir)?;
    std::fs::hard_link(from, to).map_err(io_err(to))?;
    std::fs::remove_file(from).map_err(io_err(from))?;
    if !durable {
        return Ok(());
    }
    sync_dir(dir)?;
    if let Some(pd) = from.parent() {
        sync_dir(pd)?;
    }
    Ok(())
}

mod running;
mod sync;

pub use sync::BlobSync;
use sync::Dirty;
#[cfg(test)]
mod tests;
