//! The sync stage of a blob receive: the blobs written by a batch's chunks
//! ([`Dirty`]), their fsyncs handed to a [`BlobSync`] that a driver runs off its own
//! task, and their records, stored once the fsync succeeded (or forgotten when it failed).

use super::*;

/// A blob with data written but not yet fsynced, and its state to record after the fsync.
pub(super) struct Dirty {
    pub(super) peer: PeerKey,
    pub(super) blob_ref: String,
    /// The state once the data written is durable.
    pub(super) st: InBlobState,
    /// A record of this blob exists in the store (else it is new in this batch).
    pub(super) recorded: bool,
    /// The offset the store's pending index holds for it.
    pub(super) recorded_offset: u64,
    /// seen entries to raise with the record: (th, chunk id).
    pub(super) seen: Vec<(String, String)>,
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
    /// The file was created in this batch (its directory is fsynced too).
    pub(super) created: bool,
}

/// The fsyncs that make a batch's blob data durable, taken from the receiver by
/// [`BlobReceiver::begin_sync`] so that a driver can run them off its own thread
/// ([`BlobSync::run`] blocks) while the next lines are read and their chunks written.
#[derive(Debug)]
pub struct BlobSync {
    /// Each partial file written, its path (for errors), and whether it was created (its
    /// directory is fsynced too).
    files: Vec<(Arc<File>, PathBuf, bool)>,
}

impl BlobSync {
    /// Partial files to fsync (none in the no-durability mode).
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there is nothing to fsync.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// fsync (`fdatasync`) each partial file, and the directory of each one created.
    /// Blocks. Errors: [`BlobError::Io`] naming the file or directory.
    pub fn run(self) -> Result<(), BlobError> {
        for (file, path, created) in &self.files {
            file.sync_data().map_err(io_err(path))?;
            if *created {
                sync_dir(path.parent().unwrap_or(Path::new(".")))?;
            }
        }
        Ok(())
    }
}

impl BlobReceiver {
    /// The newest state of `blob_ref` not yet recorded: written this batch, else being
    /// synced.
    pub(super) fn unrecorded(&self, peer: &PeerKey, blob_ref: &str) -> Option<&Dirty> {
        let is = |d: &&Dirty| d.peer == *peer && d.blob_ref == blob_ref;
        self.dirty
            .iter()
            .find(is)
            .or_else(|| self.syncing.iter().rev().find(is))
    }

    /// [`BlobReceiver::unrecorded`], to update the state to record.
    pub(super) fn unrecorded_mut(&mut self, peer: &PeerKey, blob_ref: &str) -> Option<&mut Dirty> {
        let is = |d: &&mut Dirty| d.peer == *peer && d.blob_ref == blob_ref;
        match self.dirty.iter_mut().find(is) {
            Some(d) => Some(d),
            None => self.syncing.iter_mut().rev().find(is),
        }
    }

    /// Pending blobs of `peer` and the bytes their partial files hold, counting what this
    /// batch wrote.
    pub(super) fn pending(&self, peer: &PeerKey) -> Result<(usize, u64), BlobError> {
        let (mut n, mut bytes) = self.store.pending_blobs_in(peer)?;
        let unrecorded = self.syncing.iter().chain(&self.dirty);
        for d in unrecorded.filter(|d| d.peer == *peer) {
            if !d.recorded {
                n += 1;
            }
            bytes = bytes.saturating_add(d.st.offset.saturating_sub(d.recorded_offset));
        }
        Ok((n, bytes))
    }

    /// Index of the dirty entry of `blob_ref` (state `st`), opening its partial file for
    /// this batch when needed: created (0600, directory 0700) when missing, cut to the
    /// recorded offset (dropping whatever a crash left past it). For a blob being synced,
    /// the offset being synced counts as recorded.
    pub(super) fn dirty_entry(
        &mut self,
        peer: &PeerKey,
        blob_ref: &str,
        st: &InBlobState,
    ) -> Result<usize, BlobError> {
        if let Some(i) = self
            .dirty
            .iter()
            .position(|d| d.peer == *peer && d.blob_ref == blob_ref)
        {
            return Ok(i);
        }
        let path = partial_path(&peer_dir(&self.root, peer), blob_ref);
        let dir = path.parent().unwrap_or(Path::new("."));
        let created = !path.exists();
        if created {
            make_dirs(dir)?;
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .mode(0o600)
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        running::cut(&self.root, peer, blob_ref, &file, st.offset, || {
            file.set_len(st.offset)
        })
        .map_err(io_err(&path))?;
        let syncing = self
            .syncing
            .iter()
            .rev()
            .find(|d| d.peer == *peer && d.blob_ref == blob_ref);
        let (recorded, recorded_offset) = match syncing {
            Some(d) => (true, d.st.offset),
            None => {
                let r = self.store.blob_in(peer, blob_ref)?;
                let offset = r.as_ref().filter(|r| r.status == InStatus::Pending);
                (r.is_some(), offset.map_or(0, |r| r.offset))
            }
        };
        self.dirty.push(Dirty {
            peer: *peer,
            blob_ref: blob_ref.to_string(),
            st: st.clone(),
            recorded,
            recorded_offset,
            seen: Vec::new(),
            file: Arc::new(file),
            path,
            created,
        });
        Ok(self.dirty.len() - 1)
    }

    /// Make the chunks taken since the last call durable: fsync each partial file written
    /// (and the directory of a new one), then record each blob's new offset with its seen
    /// entries (and, when it is now complete, its final path: the move follows the store
    /// flush, [`BlobReceiver::after_flush`]). Call before the store flush whose acks cover
    /// these chunks. On an error nothing more is recorded (the session fails without acks).
    /// The same as [`BlobReceiver::begin_sync`], [`BlobSync::run`] and
    /// [`BlobReceiver::finish_sync`] in line.
    pub fn sync(&mut self) -> Result<(), BlobError> {
        let job = self.begin_sync();
        if let Err(e) = job.run() {
            self.abort_sync();
            return Err(e);
        }
        self.finish_sync()
    }

    /// Whether chunks were taken since the last sync began (their data is written, not
    /// yet fsynced nor recorded).
    pub fn has_unsynced(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Hand the blobs written since the last sync to a [`BlobSync`] (the fsyncs, to run on
    /// any thread) and keep them, still visible to the next chunks' checks, until
    /// [`BlobReceiver::finish_sync`] (after the job succeeded) records them or
    /// [`BlobReceiver::abort_sync`] (it failed) forgets them. Chunks taken in between are
    /// written at the offsets after the synced data and recorded by a later sync.
    pub fn begin_sync(&mut self) -> BlobSync {
        self.syncing.append(&mut self.dirty);
        // Skipped only in the fuzzing harnesses' no-durability mode
        // ([`crate::store::StoreFaults::durable`]); the node always syncs.
        let durable = self.store.durable();
        let files = self
            .syncing
            .iter()
            .filter(|_| durable)
            .map(|d| (Arc::clone(&d.file), d.path.clone(), d.created))
            .collect();
        BlobSync { files }
    }

    /// After the [`BlobSync`] of [`BlobReceiver::begin_sync`] succeeded: record each
    /// synced blob's new offset with its seen entries (and, when it is now complete, its
    /// final path: the move follows the store flush, [`BlobReceiver::after_flush`]). Call
    /// before the store flush whose acks cover these chunks. On an error nothing more is
    /// recorded (the session fails without acks).
    pub fn finish_sync(&mut self) -> Result<(), BlobError> {
        for mut d in std::mem::take(&mut self.syncing) {
            // Another connection of the peer (its own receiver) may have refused or
            // finished the blob while this sync ran, or cut its partial file back to the
            // recorded offset: that stands (recording this state would undo a refusal, or
            // claim bytes the file no longer holds).
            let refused_or_done = self
                .store
                .blob_in(&d.peer, &d.blob_ref)?
                .is_some_and(|now| now.status != InStatus::Pending);
            if refused_or_done || !holds(&d) {
                tracing::info!(peer = %d.peer, blob_ref = %d.blob_ref, "blob changed by another connection meanwhile; not recording this one's state");
                continue;
            }
            self.maybe_complete(&d.peer, &d.blob_ref, &mut d.st)?;
            let mut seen = d.seen.iter().map(|(t, i)| (t.as_str(), i.as_str()));
            self.store
                .put_blob_in(&d.peer, &d.blob_ref, &d.st, seen.next())?;
            for s in seen {
                self.store
                    .put_blob_in(&d.peer, &d.blob_ref, &d.st, Some(s))?;
            }
        }
        Ok(())
    }

    /// After the [`BlobSync`] of [`BlobReceiver::begin_sync`] failed: forget the blobs it
    /// held, and the chunks written since, without recording anything (their data past
    /// the recorded offsets is cut off when they are written to next). The later chunks go
    /// too: after a failed fsync a later one may succeed without the earlier data, so no
    /// offset past the failure may ever be recorded from this state.
    pub fn abort_sync(&mut self) {
        self.syncing.clear();
        self.dirty.clear();
    }
}

/// Whether the partial file of `d` is still the file it wrote to, holding at least the
/// offset it is about to record.
pub(super) fn holds(d: &Dirty) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(now), Ok(ours)) = (std::fs::metadata(&d.path), d.file.metadata()) else {
        return false;
    };
    now.dev() == ours.dev() && now.ino() == ours.ino() && now.len() >= d.st.offset
}
