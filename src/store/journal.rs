//! Redo journal: a flush syncs one file, once.
//!
//! sled's own flush is two device waits (it writes its log buffer and waits for
//! `sync_file_range`, and the data file then needs a `sync_data` for the file size and the
//! drive cache, see `group.rs`). Instead, every [`super::tx::Tx::commit`] also appends its
//! write set, numbered by a log sequence number (LSN), to an in-memory buffer, under the
//! same lock ([`Journal::lock`]) as its writes to sled, the last of which records the LSN
//! in `meta` ([`META_JOURNAL_LSN`]). A flush writes the buffer after the records in the
//! file `journal` in the database directory and syncs that file alone; sled writes its log
//! in the background (its flusher thread) and at checkpoints.
//!
//! **Checkpoints.** A full flush (sled's flush and the data file's `sync_data`) makes every
//! commit so far durable in sled itself; the journal is then emptied. It runs instead of
//! the journal's sync when the journal is over [`JOURNAL_MAX`] bytes, after a write made
//! outside [`super::tx::Tx`] ([`Journal::needs_full`]: grants, `meta_put`), and for the
//! rest of the process once a write or sync of the journal failed (the journal is then
//! broken and no longer written; sled's flushes carry durability as before).
//!
//! **Zero-filled tail.** Records are written in place over zeros that an earlier write put
//! there ([`GROW`] bytes at a time), not appended: a sync after an append must also commit
//! the file's new size (a second device write on ext4), a sync after an overwrite of
//! blocks already written need not. Measured on this project's 2-core VM (ext4), 300-byte
//! writes: append + `fdatasync` p50 ≈ 160 µs, overwrite + `fdatasync` ≈ 110 µs. So the
//! file is longer than its records: zeros from a record boundary to the end end them, and
//! a record that fails its CRC with only zeros after it is a torn last record (a kill
//! during a flush stops its write between pages), as a short one is. A power loss can
//! also leave a hole (a lost page before a kept one): that still reads as damage, as it
//! did when appending; either way only the unsynced last flush is involved. Flushes stop
//! a header's worth of bytes short of [`JOURNAL_MAX`], so zeros always follow the
//! records. A checkpoint still empties the file (length 0), so a store closed cleanly
//! leaves an empty journal as before.
//!
//! **Open.** Records with an LSN above the stored one are applied in order, each as a sled
//! transaction that also stores its LSN, up to the first record that is torn, fails its
//! CRC, does not decode or does not follow the one before (logged: a record that was never
//! synced is simply the tail of a crash, since nothing of it was acked). Then a full flush
//! and the journal emptied. This relies on sled recovering a prefix of its log with whole
//! transactions, as the store's crash safety always has.
//!
//! **Record** (little-endian): `len u32 ‖ crc32 u32 ‖ lsn u64 ‖ payload` (`len` bytes;
//! the CRC-32 (IEEE) covers the LSN's 8 bytes and the payload). Payload: entries
//! `tree u8 ‖ klen u32 ‖ key ‖ vlen u32 ‖ value`, `vlen` = `u32::MAX` for a removal (no
//! value bytes). `tree` indexes [`super::tx::NAMES`].

use super::tx::{db_err, Trees, NAMES, T};
use super::StoreError;
use sled::Transactional;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The journal's file name, inside the database directory.
pub(crate) const FILE: &str = "journal";

/// `meta` key of the LSN of the last committed transaction (u64 big-endian).
pub(crate) const META_JOURNAL_LSN: &[u8] = b"journal_lsn";

/// The journal file's size bound (bytes): a flush whose records would take the file past
/// it is a checkpoint instead, and an open reads no more than this: 16 MiB.
pub(crate) const JOURNAL_MAX: u64 = 16 * 1024 * 1024;

/// Bytes of a record's header: length, CRC, LSN.
const HEADER: usize = 16;

/// The zero-filled tail grows by this much (bytes) when the next records would not fit
/// with a header's worth of zeros after them: 1 MiB.
pub(crate) const GROW: u64 = 1024 * 1024;

/// The value length that marks a removal.
const REMOVED: u32 = u32::MAX;

/// One key's write in a record: `(tree index, key, Some(value) or None for a removal)`.
pub(crate) type Entry<'a> = (u8, &'a [u8], Option<&'a [u8]>);

/// A decoded record: its LSN and its entries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub lsn: u64,
    pub entries: Vec<Entry<'a>>,
}

/// Why reading the journal stopped before its end.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Fewer bytes than a header, or than the header's length: a torn last record.
    Torn { at: usize },
    /// The CRC does not match.
    Crc { at: usize },
    /// The payload does not decode into entries.
    Malformed { at: usize, why: &'static str },
}

/// Append one record to `buf`.
pub(crate) fn encode<'a>(buf: &mut Vec<u8>, lsn: u64, entries: impl Iterator<Item = Entry<'a>>) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; HEADER]);
    for (tree, key, val) in entries {
        buf.push(tree);
        buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
        buf.extend_from_slice(key);
        match val {
            Some(v) => {
                buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
                buf.extend_from_slice(v);
            }
            None => buf.extend_from_slice(&REMOVED.to_le_bytes()),
        }
    }
    let len = (buf.len() - start - HEADER) as u32;
    let mut h = crc32fast::Hasher::new();
    h.update(&lsn.to_le_bytes());
    h.update(&buf[start + HEADER..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&h.finalize().to_le_bytes());
    buf[start + 8..start + 16].copy_from_slice(&lsn.to_le_bytes());
}

/// Whether every byte of `b` is zero (true when empty).
fn zeros(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Decode the records of `data` in order; the second value says why reading stopped
/// before the end (`None`: every byte was read). Never panics, whatever the bytes.
pub(crate) fn decode(data: &[u8]) -> (Vec<Record<'_>>, Option<Stop>) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        if zeros(&data[at..]) {
            // The zero-filled tail (module doc): the records end here.
            return (out, None);
        }
        let Some(h) = data.get(at..at + HEADER) else {
            return (out, Some(Stop::Torn { at }));
        };
        let len = le_u32(&h[0..4]) as usize;
        let crc = le_u32(&h[4..8]);
        let lsn_bytes = &h[8..16];
        let Some(payload) = data.get(at + HEADER..).and_then(|rest| rest.get(..len)) else {
            return (out, Some(Stop::Torn { at }));
        };
        let mut hs = crc32fast::Hasher::new();
        hs.update(lsn_bytes);
        hs.update(payload);
        if hs.finalize() != crc {
            // Only zeros after it: the last record of a flush that a crash cut, some of
            // its pages not on disk (written over the zero-filled tail, so not short).
            let end = at + HEADER + len;
            let torn = data.len() > end && zeros(&data[end..]);
            return (
                out,
                Some(if torn {
                    Stop::Torn { at }
                } else {
                    Stop::Crc { at }
                }),
            );
        }
        let entries = match entries(payload) {
            Ok(e) => e,
            Err(why) => return (out, Some(Stop::Malformed { at, why })),
        };
        let mut lsn = [0u8; 8];
        lsn.copy_from_slice(lsn_bytes);
        out.push(Record {
            lsn: u64::from_le_bytes(lsn),
            entries,
        });
        at += HEADER + len;
    }
    (out, None)
}

/// The LSNs of the well-formed records at the start of a journal file's bytes `data`, and
/// why reading stopped before the end (`None`: every byte was read), as text. For the
/// fuzz target and diagnostics; the store itself reads with `decode`. Never panics.
pub fn journal_lsns(data: &[u8]) -> (Vec<u64>, Option<String>) {
    let (recs, stop) = decode(data);
    (
        recs.iter().map(|r| r.lsn).collect(),
        stop.map(|s| format!("{s:?}")),
    )
}

fn entries(mut p: &[u8]) -> Result<Vec<Entry<'_>>, &'static str> {
    let mut out = Vec::new();
    while !p.is_empty() {
        let tree = p[0];
        if tree as usize >= NAMES.len() {
            return Err("unknown tree");
        }
        let klen = p.get(1..5).map(le_u32).ok_or("short key length")? as usize;
        let key = p.get(5..5 + klen).ok_or("short key")?;
        let vat = 5 + klen;
        let vlen = p
            .get(vat..vat + 4)
            .map(le_u32)
            .ok_or("short value length")?;
        let (val, next) = if vlen == REMOVED {
            (None, vat + 4)
        } else {
            let v = p
                .get(vat + 4..vat + 4 + vlen as usize)
                .ok_or("short value")?;
            (Some(v), vat + 4 + vlen as usize)
        };
        out.push((tree, key, val));
        p = &p[next..];
    }
    Ok(out)
}

/// Commit-side state: the next LSN and the records not yet handed to a flush.
pub(crate) struct Pending {
    /// The LSN the next commit takes.
    pub next_lsn: u64,
    /// Encoded records waiting for the next flush.
    pub buf: Vec<u8>,
}

/// Flush-side state: the file (`None` when the journal is off), the length of its
/// records, and the file's length (records, then zeros: the module doc).
struct FileState {
    file: Option<File>,
    len: u64,
    zeroed: u64,
}

impl FileState {
    /// Write `buf` at the end of the records, first extending the zero-filled tail when
    /// `buf` and a header's worth of zeros after it would not fit (up to [`JOURNAL_MAX`]).
    /// The caller syncs. Errors: the write's.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(f) = self.file.as_ref() else {
            return Err(std::io::Error::other("the journal has no file"));
        };
        let end = self.len + buf.len() as u64;
        if end + HEADER as u64 > self.zeroed && self.zeroed < JOURNAL_MAX {
            let to = (end + HEADER as u64)
                .div_ceil(GROW)
                .saturating_mul(GROW)
                .min(JOURNAL_MAX);
            let fill = vec![0u8; (to - self.zeroed) as usize];
            f.write_all_at(&fill, self.zeroed)?;
            self.zeroed = to;
        }
        f.write_all_at(buf, self.len)?;
        self.len = end;
        Ok(())
    }

    /// Empty the file (length 0, no zero-filled tail). Errors: the truncation's.
    fn empty(&mut self) -> std::io::Result<()> {
        if let Some(f) = self.file.as_ref() {
            f.set_len(0)?;
        }
        self.len = 0;
        self.zeroed = 0;
        Ok(())
    }
}

/// The journal of one store (see the module doc).
pub(crate) struct Journal {
    pending: Mutex<Pending>,
    file: Mutex<FileState>,
    /// The next flush must be a checkpoint (a write outside `Tx`, or a failed one).
    needs_full: AtomicBool,
    /// A write or sync of the file failed: commits stop recording, flushes are full.
    broken: AtomicBool,
}

impl Journal {
    /// A journal that records nothing: every flush is sled's flush and `sync_data`.
    pub(crate) fn off(next_lsn: u64) -> Journal {
        Journal {
            pending: Mutex::new(Pending {
                next_lsn,
                buf: Vec::new(),
            }),
            file: Mutex::new(FileState {
                file: None,
                len: 0,
                zeroed: 0,
            }),
            needs_full: AtomicBool::new(false),
            broken: AtomicBool::new(true),
        }
    }

    /// The commit side, held across a commit's writes to sled so that LSNs follow the
    /// order in which commits apply.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether commits record their writes (the journal is on and not broken).
    pub(crate) fn recording(&self) -> bool {
        !self.broken.load(Ordering::Acquire)
    }

    /// Call after a write made outside [`super::tx::Tx`] returned: the next flush makes it
    /// durable through sled (a flush that already started may not have seen it).
    pub(crate) fn needs_full(&self) {
        self.needs_full.store(true, Ordering::Release);
    }

    /// Drop what waits for the journal (no-durability mode: nothing is synced). The next
    /// durable flush is then a checkpoint: the journal must not go on after missing LSNs.
    pub(crate) fn discard(&self) {
        self.lock().buf.clear();
        self.needs_full();
    }

    fn file(&self) -> MutexGuard<'_, FileState> {
        self.file.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn break_off(&self, what: &str, e: &std::io::Error) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "{what} of the store's journal failed ({e}); flushes go through sled from now on"
            );
        }
        self.lock().buf.clear();
    }

    /// Make every commit so far durable: the journal's records written and synced, or a
    /// checkpoint (see the module doc). Only the flush leader calls this, one at a time.
    /// Errors: the failed step, as text (the flush fails for every caller sharing it).
    pub(crate) fn flush(&self, db: &sled::Db, data_file: Option<&File>) -> Result<(), String> {
        let mut fs = self.file();
        let buf = std::mem::take(&mut self.lock().buf);
        // Past the size bound, the records are not written: the checkpoint covers them,
        // so the file never holds more than JOURNAL_MAX bytes.
        let mut full = self.needs_full.swap(false, Ordering::AcqRel)
            || !self.recording()
            // A header's worth of zeros must follow the records (the torn-record rule).
            || fs.len + buf.len() as u64 + HEADER as u64 > JOURNAL_MAX;
        if !full && !buf.is_empty() {
            // A recording journal always has its file; without one, a checkpoint.
            if fs.file.is_none() {
                full = true;
            } else if let Err(e) = fs.write(&buf) {
                self.break_off("a write", &e);
                full = true;
            }
        }
        if full {
            let res = checkpoint(db, data_file);
            if res.is_err() {
                self.needs_full();
                return res;
            }
            if fs.zeroed.max(fs.len) > 0 && self.recording() {
                if let Err(e) = fs.empty() {
                    self.break_off("emptying", &e);
                }
            }
            return Ok(());
        }
        if buf.is_empty() {
            // Every earlier record was synced by an earlier flush (one runs at a time).
            return Ok(());
        }
        let synced = match fs.file.as_ref() {
            Some(f) => f.sync_data(),
            None => Ok(()),
        };
        synced.map_err(|e| {
            self.break_off("a sync", &e);
            self.needs_full();
            format!("fsync of the journal: {e}")
        })
    }
}

/// sled's flush, then `sync_data` of its data file (see `group.rs`).
fn checkpoint(db: &sled::Db, data_file: Option<&File>) -> Result<(), String> {
    let gate = super::gate::flush();
    db.flush().map(|_| ()).map_err(|e| e.to_string())?;
    drop(gate);
    match data_file {
        Some(f) => f.sync_data().map_err(|e| format!("fsync: {e}")),
        None => Ok(()),
    }
}

/// Apply one record's entries as a sled transaction that also stores its LSN.
fn apply(trees: &Trees, rec: &Record<'_>) -> Result<(), StoreError> {
    let lsn = rec.lsn.to_be_bytes();
    let last = (T::Meta as u8, META_JOURNAL_LSN, Some(&lsn[..]));
    transact(trees, rec.entries.iter().copied().chain([last]))
        .map_err(|e| StoreError::Db(format!("journal replay: {e}")))
}

/// Apply `entries` as one sled transaction (later entries of a key win).
pub(super) fn transact<'a>(
    trees: &Trees,
    entries: impl Iterator<Item = Entry<'a>>,
) -> Result<(), StoreError> {
    let mut per: BTreeMap<u8, sled::Batch> = BTreeMap::new();
    for (t, k, v) in entries {
        let b = per.entry(t).or_default();
        match v {
            Some(v) => b.insert(k, v),
            None => b.remove(k),
        }
    }
    let trees_v: Vec<&sled::Tree> = per.keys().map(|t| &trees.all[*t as usize]).collect();
    let batches: Vec<&sled::Batch> = per.values().collect();
    let gate = super::gate::transaction();
    let res: sled::transaction::TransactionResult<(), ()> = trees_v.as_slice().transaction(|tts| {
        for (tt, b) in tts.iter().zip(&batches) {
            tt.apply_batch(b)?;
        }
        Ok(())
    });
    drop(gate);
    res.map_err(|e| match e {
        sled::transaction::TransactionError::Abort(()) => {
            StoreError::Db("transaction aborted".into())
        }
        sled::transaction::TransactionError::Storage(e) => db_err(e),
    })
}

/// Write `data` (a damaged journal's or undo record's bytes) into `quarantine` (mode
/// 0700) as `<unix ms>-<name>`, mode 0600, synced with its directory. Returns its path.
pub(super) fn keep(
    data: &[u8],
    quarantine: &Path,
    name: &str,
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(quarantine)?;
    let to = quarantine.join(format!("{}-{name}", crate::wire::time::now_ms()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&to)?;
    f.write_all(data)?;
    f.sync_all()?;
    File::open(quarantine)?.sync_all()?;
    Ok(to)
}

/// The stored LSN of the last committed transaction (0 for a store without one).
pub(crate) fn stored_lsn(trees: &Trees) -> Result<u64, StoreError> {
    match trees
        .t(super::tx::T::Meta)
        .get(META_JOURNAL_LSN)
        .map_err(db_err)?
    {
        None => Ok(0),
        Some(v) => {
            let b: [u8; 8] = v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                tree: "meta",
                detail: "journal_lsn is not 8 bytes".into(),
            })?;
            Ok(u64::from_be_bytes(b))
        }
    }
}

/// Open the journal of the database in `dir`: replay what sled lacks (see the module
/// doc), checkpoint, empty the file, and return the journal ready for commits. Errors:
/// the file cannot be opened, read or emptied, or sled fails to apply or flush.
pub(crate) fn open(
    dir: &Path,
    quarantine: &Path,
    db: &sled::Db,
    trees: &Trees,
    data_file: Option<&File>,
) -> Result<Journal, StoreError> {
    let io = |what: &str, e: std::io::Error| {
        StoreError::Db(format!("{}: {what} the journal: {e}", dir.display()))
    };
    let path = dir.join(FILE);
    let existed = path.exists();
    let mut opts = std::fs::OpenOptions::new();
    // Not append: records are written over the zero-filled tail (module doc).
    opts.read(true).write(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut file = opts.open(&path).map_err(|e| io("cannot open", e))?;
    if !existed {
        // The new name itself must survive a crash before any record relies on it.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("cannot sync the directory of", e))?;
    }
    // A FIFO or a device there would never end a read.
    let meta = file.metadata().map_err(|e| io("cannot stat", e))?;
    if !meta.is_file() {
        return Err(StoreError::Db(format!(
            "{}: the journal is not a regular file",
            path.display()
        )));
    }
    let mut data = Vec::new();
    (&mut file)
        .take(JOURNAL_MAX)
        .read_to_end(&mut data)
        .map_err(|e| io("cannot read", e))?;
    if meta.len() > JOURNAL_MAX {
        tracing::error!(
            "{}: the journal is {} bytes, over its {JOURNAL_MAX}-byte bound; only the first {JOURNAL_MAX} are read",
            path.display(),
            meta.len()
        );
    }
    let stored = stored_lsn(trees)?;
    let rolled_back = super::undo::roll_back(trees, stored, quarantine)?;
    if let Some(lsn) = rolled_back {
        tracing::warn!(
            "{}: rolled back the part of commit LSN {lsn} that reached the database before a crash (it was not flushed, so nothing of it was acked)",
            dir.display()
        );
    }
    let mut last = stored;
    let (records, stop) = decode(&data);
    let mut replayed = 0u64;
    let mut gap = None;
    for rec in &records {
        if rec.lsn <= last {
            continue;
        }
        if rec.lsn != last + 1 {
            gap = Some(rec.lsn);
            break;
        }
        apply(trees, rec)?;
        last = rec.lsn;
        replayed += 1;
    }
    // Damage (not a torn last record, which is what a crash during a flush leaves, none
    // of it acked): the file is kept in the quarantine before it is emptied.
    let damage = match (&stop, gap) {
        (_, Some(lsn)) => Some(format!("it skips from LSN {last} to {lsn}")),
        (Some(Stop::Crc { at }), None) => Some(format!("the record at byte {at} fails its CRC")),
        (Some(Stop::Malformed { at, why }), None) => {
            Some(format!("the record at byte {at} does not decode ({why})"))
        }
        _ => None,
    };
    if let Some(what) = damage {
        let kept = keep(&data, quarantine, FILE)
            .map(|p| format!("the file was copied to {}", p.display()))
            .unwrap_or_else(|e| format!("copying it to the quarantine failed: {e}"));
        tracing::error!(
            "{}: the journal is damaged: {what}; the records from there on are not applied ({} records applied, through LSN {last}); {kept}",
            dir.display(),
            replayed
        );
    } else if let Some(Stop::Torn { at }) = stop {
        tracing::warn!(
            "{}: the journal ends in a record that was not completely written (byte {at}): a crash during a flush, nothing of it was acked",
            dir.display()
        );
    }
    if replayed > 0 {
        tracing::info!(
            "{}: applied {replayed} journal records (LSN {} to {last})",
            dir.display(),
            stored + 1
        );
    }
    if !data.is_empty() || rolled_back.is_some() {
        checkpoint(db, data_file).map_err(StoreError::Db)?;
        file.set_len(0).map_err(|e| io("cannot empty", e))?;
        file.sync_data().map_err(|e| io("cannot sync", e))?;
    }
    Ok(Journal {
        pending: Mutex::new(Pending {
            next_lsn: last + 1,
            buf: Vec::new(),
        }),
        file: Mutex::new(FileState {
            file: Some(file),
            len: 0,
            zeroed: 0,
        }),
        needs_full: AtomicBool::new(false),
        broken: AtomicBool::new(false),
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn rec(lsn: u64) -> Vec<u8> {
        let mut b = Vec::new();
        encode(
            &mut b,
            lsn,
            [
                (0u8, &b"k1"[..], Some(&b"v1"[..])),
                (7u8, &b"k2"[..], None),
                (19u8, &b""[..], Some(&b""[..])),
            ]
            .into_iter(),
        );
        b
    }

    #[test]
    fn records_round_trip_in_order() {
        let mut data = rec(5);
        data.extend(rec(6));
        let (recs, stop) = decode(&data);
        assert_eq!(stop, None);
        assert_eq!(recs.len(), 2);
        assert_eq!((recs[0].lsn, recs[1].lsn), (5, 6));
        assert_eq!(
            recs[0].entries,
            vec![
                (0u8, &b"k1"[..], Some(&b"v1"[..])),
                (7u8, &b"k2"[..], None),
                (19u8, &b""[..], Some(&b""[..]))
            ]
        );
    }

    #[test]
    fn a_torn_tail_keeps_the_records_before_it() {
        let one = rec(1);
        let mut data = one.clone();
        data.extend(rec(2));
        for cut in one.len() + 1..data.len() {
            let (recs, stop) = decode(&data[..cut]);
            assert_eq!(recs.len(), 1, "cut at {cut}");
            assert_eq!(stop, Some(Stop::Torn { at: one.len() }), "cut at {cut}");
        }
    }

    /// The zero-filled tail after the records ends them cleanly, whatever its length.
    #[test]
    fn zeros_after_the_records_end_them() {
        let mut data = rec(1);
        data.extend(rec(2));
        for tail in [1, HEADER - 1, HEADER, 4096] {
            let mut d = data.clone();
            d.resize(data.len() + tail, 0);
            let (recs, stop) = decode(&d);
            assert_eq!((recs.len(), stop), (2, None), "tail of {tail}");
        }
        assert_eq!(decode(&[0u8; 64]), (vec![], None));
    }

    /// A record written over the zero-filled tail whose last pages did not reach the disk
    /// (zeros inside it, zeros after it): torn, like a short one, not damaged.
    #[test]
    fn a_record_cut_inside_the_zero_tail_is_torn() {
        let one = rec(1);
        let two = rec(2);
        // (Cuts that leave out only zero bytes of the record leave it whole.)
        for keep in (HEADER..two.len()).filter(|&k| !zeros(&two[k..])) {
            let mut data = one.clone();
            data.extend_from_slice(&two[..keep]);
            data.resize(one.len() + two.len() + 100, 0);
            let (recs, stop) = decode(&data);
            assert_eq!(recs.len(), 1, "kept {keep}");
            assert_eq!(stop, Some(Stop::Torn { at: one.len() }), "kept {keep}");
        }
    }

    /// Zeros inside the records with more written after them are damage, not the tail:
    /// a zeroed header, or a record that fails its CRC with a record after it.
    #[test]
    fn zeros_with_records_after_them_are_damage() {
        let one = rec(1);
        let mut data = one.clone();
        data.extend_from_slice(&[0u8; HEADER]);
        data.extend(rec(2));
        let (recs, stop) = decode(&data);
        assert_eq!(recs.len(), 1);
        assert_eq!(stop, Some(Stop::Crc { at: one.len() }));
        let mut data = one.clone();
        let mut two = rec(2);
        let n = two.len();
        two[n - 1] = 0;
        two[n - 2] ^= 0xff;
        data.extend(two);
        data.extend(rec(3));
        data.resize(data.len() + 64, 0);
        let (recs, stop) = decode(&data);
        assert_eq!(recs.len(), 1);
        assert_eq!(stop, Some(Stop::Crc { at: one.len() }));
    }

    #[test]
    fn a_changed_byte_fails_the_crc() {
        let one = rec(1);
        let mut data = one.clone();
        data.extend(rec(2));
        // Any byte of the second record's CRC, LSN or payload.
        for i in one.len() + 4..data.len() {
            let mut d = data.clone();
            d[i] ^= 0x40;
            let (recs, stop) = decode(&d);
            assert_eq!(recs.len(), 1, "byte {i}");
            assert_eq!(stop, Some(Stop::Crc { at: one.len() }), "byte {i}");
        }
    }

    #[test]
    fn payloads_that_do_not_decode_are_refused() {
        let frame = |payload: &[u8]| {
            let mut b = vec![0u8; HEADER];
            b[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            let mut h = crc32fast::Hasher::new();
            h.update(&9u64.to_le_bytes());
            h.update(payload);
            b[4..8].copy_from_slice(&h.finalize().to_le_bytes());
            b[8..16].copy_from_slice(&9u64.to_le_bytes());
            b.extend_from_slice(payload);
            b
        };
        for (payload, why) in [
            (
                &[NAMES.len() as u8, 0, 0, 0, 0, 0, 0, 0, 0][..],
                "unknown tree",
            ),
            (&[0u8, 1, 0][..], "short key length"),
            (&[0u8, 9, 0, 0, 0, b'k'][..], "short key"),
            (&[0u8, 1, 0, 0, 0, b'k', 1][..], "short value length"),
            (
                &[0u8, 1, 0, 0, 0, b'k', 5, 0, 0, 0, b'v'][..],
                "short value",
            ),
        ] {
            let data = frame(payload);
            let (recs, stop) = decode(&data);
            assert!(recs.is_empty());
            assert_eq!(stop, Some(Stop::Malformed { at: 0, why }));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for n in 0..2000usize {
            let mut d = Vec::with_capacity(n % 97);
            for _ in 0..n % 97 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                d.push(x as u8);
            }
            let _ = decode(&d);
        }
    }

    /// A store reopened with journal records sled lacks: the ones after its LSN are applied
    /// in order (an older one is skipped, a torn tail ignored), the file is emptied and
    /// later commits go on from the last LSN.
    #[test]
    fn open_applies_the_records_after_the_stored_lsn() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let lsn = {
            let s = crate::store::Store::open(&dir).unwrap();
            s.meta_put("a", b"old").unwrap();
            s.flush_blocking().unwrap();
            stored_lsn(&s.trees).unwrap()
        };
        let meta = super::super::tx::T::Meta as u8;
        let mut data = Vec::new();
        // Already in sled: skipped (it would set "z").
        meta_rec(&mut data, lsn, b"x/z", Some(b"1"));
        encode(
            &mut data,
            lsn + 1,
            [
                (meta, &b"x/a"[..], Some(&b"new"[..])),
                (meta, &b"x/b"[..], Some(&b"b"[..])),
            ]
            .into_iter(),
        );
        meta_rec(&mut data, lsn + 2, b"x/b", None);
        let mut torn = Vec::new();
        meta_rec(&mut torn, lsn + 3, b"x/c", Some(b"c"));
        data.extend_from_slice(&torn[..torn.len() - 1]);
        std::fs::write(dir.join(FILE), &data).unwrap();

        let s = crate::store::Store::open(&dir).unwrap();
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"new"[..]));
        assert_eq!(s.meta_get("b").unwrap(), None);
        assert_eq!(s.meta_get("c").unwrap(), None);
        assert_eq!(s.meta_get("z").unwrap(), None);
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn + 2);
        assert_eq!(std::fs::metadata(dir.join(FILE)).unwrap().len(), 0);
        // The next commit takes the following LSN and is recorded for the next flush.
        let put = |v: &[u8]| {
            let mut tx = super::super::tx::Tx::new(&s.trees);
            tx.put(super::super::tx::T::Meta, b"x/p".to_vec(), v.to_vec());
            tx.commit().unwrap();
        };
        put(b"1");
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn + 3);
        s.flush_blocking().unwrap(); // a checkpoint: the first flush after open
        assert_eq!(decode_file(&dir), (vec![], None));
        put(b"2");
        s.flush_blocking().unwrap();
        let (recs, stop) = decode_file(&dir);
        assert_eq!(stop, None);
        assert_eq!(recs, vec![lsn + 4]);
    }

    /// A record that does not follow the stored LSN is not applied, nor any after it.
    #[test]
    fn a_gap_stops_the_replay() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let lsn = {
            let s = crate::store::Store::open(&dir).unwrap();
            s.flush_blocking().unwrap();
            stored_lsn(&s.trees).unwrap()
        };
        let mut data = Vec::new();
        meta_rec(&mut data, lsn + 2, b"x/a", Some(b"1"));
        meta_rec(&mut data, lsn + 3, b"x/b", Some(b"1"));
        std::fs::write(dir.join(FILE), &data).unwrap();
        let s = crate::store::Store::open(&dir).unwrap();
        assert_eq!(s.meta_get("a").unwrap(), None);
        assert_eq!(s.meta_get("b").unwrap(), None);
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn);
    }

    fn decode_file(dir: &Path) -> (Vec<u64>, Option<Stop>) {
        let data = std::fs::read(dir.join(FILE)).unwrap();
        let (recs, stop) = decode(&data);
        (recs.iter().map(|r| r.lsn).collect(), stop)
    }

    /// Append a record of one `meta` write (`None`: a removal) to `data`.
    fn meta_rec(data: &mut Vec<u8>, lsn: u64, key: &[u8], val: Option<&[u8]>) {
        let meta = super::super::tx::T::Meta as u8;
        encode(data, lsn, [(meta, key, val)].into_iter());
    }

    pub(in crate::store) fn put(s: &crate::store::Store, key: &[u8], v: &[u8]) {
        let mut tx = super::super::tx::Tx::new(&s.trees);
        tx.put(super::super::tx::T::Meta, key.to_vec(), v.to_vec());
        tx.commit().unwrap();
    }

    /// A store whose first (checkpoint) flush is done: later flushes go to the journal.
    pub(in crate::store) fn opened(dir: &Path) -> crate::store::Store {
        let s = crate::store::Store::open(dir).unwrap();
        s.flush_blocking().unwrap();
        s
    }

    /// A damaged record with records after it: nothing from it on is applied, and the file
    /// is kept, byte for byte, in the quarantine before the journal is emptied.
    #[test]
    fn a_damaged_record_is_kept_in_the_quarantine() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let lsn = stored_lsn(&opened(&dir).trees).unwrap();
        let mut data = Vec::new();
        meta_rec(&mut data, lsn + 1, b"x/a", Some(b"1"));
        let second = data.len();
        meta_rec(&mut data, lsn + 2, b"x/b", Some(b"1"));
        meta_rec(&mut data, lsn + 3, b"x/c", Some(b"1"));
        data[second + HEADER + 2] ^= 1;
        std::fs::write(dir.join(FILE), &data).unwrap();
        let s = crate::store::Store::open(&dir).unwrap();
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(s.meta_get("b").unwrap(), None);
        assert_eq!(s.meta_get("c").unwrap(), None);
        assert_eq!(std::fs::metadata(dir.join(FILE)).unwrap().len(), 0);
        let kept: Vec<_> = std::fs::read_dir(d.path().join(super::super::files::QUARANTINE_DIR))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(kept[0].to_string_lossy().ends_with("-journal"));
        assert_eq!(std::fs::read(&kept[0]).unwrap(), data);
    }

    /// A journal that is not a regular file (a FIFO would never end a read) is refused.
    #[test]
    fn a_journal_that_is_not_a_file_is_refused() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        drop(opened(&dir));
        std::fs::remove_file(dir.join(FILE)).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join(FILE))
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped the FIFO case: mkfifo is not available");
            std::fs::create_dir(dir.join(FILE)).unwrap();
        }
        let e = crate::store::Store::open(&dir).err().expect("refused");
        let e = e.to_string();
        assert!(e.contains("journal"), "{e}");
    }

    /// Records dropped in the no-durability mode leave no hole: the next durable flush is
    /// a checkpoint, and what it acked survives the journal's replay.
    #[test]
    fn the_first_durable_flush_after_no_durability_is_a_checkpoint() {
        struct NoSync;
        impl crate::store::StoreFaults for NoSync {
            fn durable(&self) -> bool {
                false
            }
        }
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let s = opened(&dir);
        s.set_faults(Some(std::sync::Arc::new(NoSync)));
        put(&s, b"x/a", b"1");
        s.flush_blocking().unwrap();
        s.set_faults(None);
        put(&s, b"x/b", b"1");
        s.flush_blocking().unwrap();
        assert_eq!(
            decode_file(&dir),
            (vec![], None),
            "a checkpoint, not a record"
        );
        put(&s, b"x/c", b"1");
        s.flush_blocking().unwrap();
        let (lsns, stop) = decode_file(&dir);
        assert_eq!((lsns.len(), stop), (1, None));
    }

    /// Records that would take the file past its bound are covered by a checkpoint
    /// instead: the file never holds more than JOURNAL_MAX bytes.
    #[test]
    fn the_journal_stays_within_its_bound() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let s = opened(&dir);
        let big = vec![7u8; (JOURNAL_MAX / 2) as usize];
        put(&s, b"x/a", &big);
        s.flush_blocking().unwrap();
        let len = std::fs::metadata(dir.join(FILE)).unwrap().len();
        assert!(len > JOURNAL_MAX / 2 && len <= JOURNAL_MAX, "{len}");
        put(&s, b"x/b", &big);
        s.flush_blocking().unwrap();
        assert_eq!(std::fs::metadata(dir.join(FILE)).unwrap().len(), 0);
        drop(s);
        let s = crate::store::Store::open(&dir).unwrap();
        assert_eq!(s.meta_get("b").unwrap().map(|v| v.len()), Some(big.len()));
    }

    /// Where the records of `data` end: each header's length walked from the start until
    /// a zero header or the end of the data.
    fn records_end(data: &[u8]) -> usize {
        let mut at = 0;
        while let Some(h) = data.get(at..at + HEADER).filter(|h| !zeros(h)) {
            at += HEADER + le_u32(h) as usize;
        }
        at
    }

    /// A flush whose records would end less than a header's worth of bytes before
    /// JOURNAL_MAX is a checkpoint (a kill's torn record there would have no zeros after
    /// it and would read as damage); one that leaves exactly a header's worth is written.
    #[test]
    fn a_header_of_zeros_always_follows_the_records() {
        for (gap, written) in [(HEADER, true), (HEADER - 1, false), (1, false), (0, false)] {
            let d = tempfile::TempDir::new().unwrap();
            let dir = d.path().join("db");
            let s = opened(&dir);
            put(&s, b"x/a", &vec![7u8; (JOURNAL_MAX / 2) as usize]);
            s.flush_blocking().unwrap();
            let first = records_end(&std::fs::read(dir.join(FILE)).unwrap());
            assert!(first > (JOURNAL_MAX / 2) as usize, "{first}");
            // A one-entry record: header, tree byte, key and value lengths, key, value.
            let key = b"x/b";
            let val = JOURNAL_MAX as usize - gap - first - (HEADER + 9 + key.len());
            put(&s, key, &vec![7u8; val]);
            s.flush_blocking().unwrap();
            let data = std::fs::read(dir.join(FILE)).unwrap();
            if written {
                let end = records_end(&data);
                assert_eq!(end as u64, JOURNAL_MAX - gap as u64, "the record's size");
                assert_eq!(data.len() as u64, JOURNAL_MAX);
                assert!(zeros(&data[end..]));
                let (recs, stop) = decode(&data);
                assert_eq!((recs.len(), stop), (2, None));
            } else {
                assert!(data.is_empty(), "gap {gap}: a checkpoint, not a record");
            }
            drop(s);
            let s = crate::store::Store::open(&dir).unwrap();
            assert_eq!(s.meta_get("b").unwrap().map(|v| v.len()), Some(val));
        }
    }

    pub(in crate::store) fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                copy_dir(&p, &to.join(e.file_name()));
            } else {
                std::fs::copy(&p, to.join(e.file_name())).unwrap();
            }
        }
    }

    /// A power loss in the model where sled's file keeps only what its last checkpoint
    /// synced (a copy of the directory taken right after it) and the journal what its own
    /// syncs did: every line acked after the checkpoint is back after the open.
    #[test]
    fn a_power_loss_keeps_what_the_journal_synced() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let lost = d.path().join("after-power-loss").join("db");
        let s = opened(&dir);
        put(&s, b"x/before", b"1");
        s.flush_blocking().unwrap();
        // The checkpoint that sled's file is left with.
        s.meta_put("checkpoint", b"1").unwrap();
        s.flush_blocking().unwrap();
        copy_dir(&dir, &lost);
        let bare = d.path().join("without-journal").join("db");
        copy_dir(&dir, &bare);
        let mut acked = Vec::new();
        for i in 0..20 {
            put(&s, format!("x/k{i}").as_bytes(), b"v");
            s.flush_blocking().unwrap();
            acked.push(format!("k{i}"));
        }
        std::fs::copy(dir.join(FILE), lost.join(FILE)).unwrap();
        drop(s);
        let s = crate::store::Store::open(&lost).unwrap();
        assert_eq!(
            s.meta_get("checkpoint").unwrap().as_deref(),
            Some(&b"1"[..])
        );
        for k in &acked {
            assert_eq!(s.meta_get(k).unwrap().as_deref(), Some(&b"v"[..]), "{k}");
        }
        // The model holds: without the journal, the same copy has none of them.
        let s = crate::store::Store::open(&bare).unwrap();
        assert!(acked.iter().all(|k| s.meta_get(k).unwrap().is_none()));
    }

    /// Flushes write their records over the zero-filled tail: the file's length moves in
    /// steps of GROW, not with every flush; a checkpoint empties it. A torn last record (a
    /// crash during a flush) is not taken for damage: nothing is quarantined, and the
    /// records before it are applied (the power-loss model of the test above).
    #[test]
    fn flushes_write_over_the_zero_filled_tail() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let lost = d.path().join("after-power-loss").join("db");
        let s = opened(&dir);
        let file_len = |dir: &Path| std::fs::metadata(dir.join(FILE)).unwrap().len();
        assert_eq!(file_len(&dir), 0);
        for i in 0..20 {
            put(&s, format!("x/k{i}").as_bytes(), b"v");
            s.flush_blocking().unwrap();
            assert_eq!(file_len(&dir), GROW, "flush {i}");
        }
        let (lsns, stop) = decode_file(&dir);
        assert_eq!((lsns.len(), stop), (20, None));
        s.meta_put("checkpoint", b"1").unwrap();
        s.flush_blocking().unwrap();
        assert_eq!(file_len(&dir), 0, "a checkpoint empties the file");
        copy_dir(&dir, &lost);
        for i in 0..3 {
            put(&s, format!("x/after{i}").as_bytes(), b"v");
            s.flush_blocking().unwrap();
        }
        let small = decode_file(&dir).0.len();
        assert_eq!(small, 3);
        // Past the first step: the tail grows by another.
        put(&s, b"x/big", &vec![1u8; GROW as usize]);
        s.flush_blocking().unwrap();
        assert_eq!(file_len(&dir), 2 * GROW);
        let mut data = std::fs::read(dir.join(FILE)).unwrap();
        let (recs, stop) = decode(&data);
        assert_eq!((recs.len(), stop), (4, None));
        // The crash image: the big record's second half never reached the disk.
        let big_at: usize = recs[..3]
            .iter()
            .map(|r| {
                HEADER
                    + r.entries
                        .iter()
                        .map(|(_, k, v)| 9 + k.len() + v.map_or(0, <[u8]>::len))
                        .sum::<usize>()
            })
            .sum();
        assert_eq!(decode(&data[big_at..]).0[0].lsn, recs[3].lsn);
        data[big_at + HEADER + (GROW as usize) / 2..].fill(0);
        assert_eq!(decode(&data).1, Some(Stop::Torn { at: big_at }));
        std::fs::write(lost.join(FILE), &data).unwrap();
        let s = crate::store::Store::open(&lost).unwrap();
        for i in 0..3 {
            let v = s.meta_get(&format!("after{i}")).unwrap();
            assert_eq!(v.as_deref(), Some(&b"v"[..]), "after{i}");
        }
        assert!(s.meta_get("big").unwrap().is_none(), "the torn record");
        let quarantine = lost
            .parent()
            .unwrap()
            .join(super::super::files::QUARANTINE_DIR);
        assert!(!quarantine.exists(), "a torn record is not damage");
        assert_eq!(file_len(&lost), 0);
    }

    /// A store closed cleanly checkpoints and leaves an empty journal; what it held is in
    /// sled's file.
    #[test]
    fn a_clean_close_empties_the_journal() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let s = opened(&dir);
        put(&s, b"x/a", b"1");
        s.flush_blocking().unwrap();
        assert_eq!(decode_file(&dir).0.len(), 1);
        drop(s);
        assert_eq!(std::fs::metadata(dir.join(FILE)).unwrap().len(), 0);
        let s = crate::store::Store::open(&dir).unwrap();
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"1"[..]));
    }
}
