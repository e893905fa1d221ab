//! Free space and injected faults at the store seam.
//!
//! **Free space.** sled 0.34.7 turns a failed write of its log (ENOSPC included) into a
//! global error that fails every later operation until the process restarts, so the store
//! never lets the disk run that low: new content (queued outbound lines, stored inbound
//! lines, blob data) is refused with [`StoreError::DiskFull`] while the file system of the
//! database has less than [`DISK_RESERVE`] bytes (plus what the write itself needs) free
//! for unprivileged users (`statvfs` `f_bavail × f_frsize`). Every gated write checks
//! again, so the node accepts writes by itself as soon as space is freed; reads, acks of
//! our own lines and the small bookkeeping writes are never refused. The reserve is the
//! room those writes, sled's segment rewrites and its snapshots use.
//!
//! **Injected faults (test-only).** [`StoreFaults`] lets a test fail flushes and writes, or
//! report less free space, through [`Store::set_faults`]. It is a Rust trait object set by
//! code linking this crate: nothing a peer or a control client sends can install or change
//! one, and the node never installs one itself (no feature flag, no environment variable).
//! The same goes for the fuzzing harnesses' no-durability mode ([`StoreFaults::durable`]).

use super::{Store, StoreError};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// Free bytes below which the store refuses new content: 64 MiB (room for sled's own
/// writes, see the module doc).
pub const DISK_RESERVE: u64 = 64 * 1024 * 1024;

/// Faults injected into a [`Store`] by tests ([`Store::set_faults`]). Every method has a
/// default that injects nothing.
pub trait StoreFaults: Send + Sync {
    /// Called before each database flush (fsync); an error fails that flush and every
    /// caller sharing it (group commit), as a failed fsync would.
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    /// Called before each write of new content (enqueue, stored inbound lines, blob data);
    /// an error fails that write and nothing of it is stored.
    fn write(&self) -> std::io::Result<()> {
        Ok(())
    }
    /// The free bytes to act on, given the file system's figure `real`.
    fn free_bytes(&self, real: u64) -> u64 {
        real
    }
    /// Whether the store's flushes and blob writes reach the disk. `false` is the fuzzing
    /// harnesses' no-durability mode (`fuzz/`, where an fsync per input would dominate):
    /// [`Store::flush`] skips sled's flush and the data file's `sync_data` (still calling
    /// [`StoreFaults::flush`] and counting the flush), and blob writes skip their
    /// `sync_data` and directory fsyncs. Everything written stays readable by this process;
    /// a crash or power loss may lose it. The node never installs faults, so it always
    /// syncs. Default: `true`.
    fn durable(&self) -> bool {
        true
    }
}

/// The installed faults and the free-space state of one store.
#[derive(Default)]
pub(crate) struct Guard {
    faults: RwLock<Option<Arc<dyn StoreFaults>>>,
    /// The last gated write found the disk full (logged once per episode).
    full: AtomicBool,
}

impl Guard {
    pub(crate) fn faults(&self) -> Option<Arc<dyn StoreFaults>> {
        self.faults
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, f: Option<Arc<dyn StoreFaults>>) {
        *self.faults.write().unwrap_or_else(PoisonError::into_inner) = f;
    }

    /// Whether flushes and blob writes fsync ([`StoreFaults::durable`]; `true` without
    /// faults).
    pub(crate) fn durable(&self) -> bool {
        self.faults().is_none_or(|f| f.durable())
    }

    /// The injected flush fault, if any.
    pub(crate) fn before_flush(&self) -> Result<(), String> {
        match self.faults() {
            Some(f) => f.flush().map_err(|e| format!("flush: {e}")),
            None => Ok(()),
        }
    }
}

/// Free bytes for unprivileged users on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Whether `e` says the file system (or the user's quota) is full.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl Store {
    /// Install (or with `None`, remove) injected faults. Test-only: see [`StoreFaults`].
    pub fn set_faults(&self, faults: Option<Arc<dyn StoreFaults>>) {
        self.guard().set(faults);
    }

    /// Whether this store's flushes and blob writes fsync: `true` unless faults saying
    /// otherwise are installed ([`StoreFaults::durable`], fuzzing harnesses only).
    pub(crate) fn durable(&self) -> bool {
        self.guard().durable()
    }

    /// Free bytes on the file system of the database (after any injected
    /// [`StoreFaults::free_bytes`]). Errors: `statvfs` failing, as [`StoreError::Db`].
    pub fn free_bytes(&self) -> Result<u64, StoreError> {
        let real =
            free_bytes(self.space_dir()).map_err(|e| StoreError::Db(format!("statvfs: {e}")))?;
        Ok(match self.guard().faults() {
            Some(f) => f.free_bytes(real),
            None => real,
        })
    }

    /// Check before writing `need` bytes of new content: the injected write fault, then
    /// free space. [`StoreError::DiskFull`] when fewer than `need` + [`DISK_RESERVE`]
    /// bytes are free; checked again on every call, so writes resume by themselves once
    /// space is freed.
    pub fn check_space(&self, need: u64) -> Result<(), StoreError> {
        if let Some(f) = self.guard().faults() {
            f.write()
                .map_err(|e| StoreError::Db(format!("write: {e}")))?;
        }
        let free = self.free_bytes()?;
        let full = free < need.saturating_add(DISK_RESERVE);
        let was = self.guard().full.swap(full, Ordering::Relaxed);
        let home = self.home_dir().display().to_string();
        if full && !was {
            tracing::warn!(
                free,
                reserve = DISK_RESERVE,
                "disk full: {free} bytes free in {home}; refusing new content until space is freed"
            );
        } else if !full && was {
            tracing::info!(
                free,
                "disk space recovered in {home}; accepting new content"
            );
        }
        if full {
            return Err(StoreError::DiskFull { free, home });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{self, Line, PeerKey};
    use std::sync::atomic::AtomicU64;

    /// Fails the next `flushes` flushes and `writes` writes; reports `free` bytes free.
    #[derive(Default)]
    struct Plan {
        flushes: AtomicU64,
        writes: AtomicU64,
        free: AtomicU64,
    }

    fn take(n: &AtomicU64) -> bool {
        n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1))
            .is_ok()
    }

    impl StoreFaults for Plan {
        fn flush(&self) -> std::io::Result<()> {
            if take(&self.flushes) {
                return Err(std::io::Error::other("injected flush failure"));
            }
            Ok(())
        }
        fn write(&self) -> std::io::Result<()> {
            if take(&self.writes) {
                return Err(std::io::Error::other("injected write failure"));
            }
            Ok(())
        }
        fn free_bytes(&self, real: u64) -> u64 {
            match self.free.load(Ordering::Relaxed) {
                0 => real,
                n => n,
            }
        }
    }

    fn peer() -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
    }

    fn msg(id: &str, ts: &str) -> Line {
        Line::Msg(wire::Msg {
            id: id.into(),
            ts: ts.into(),
            th: "thr_1".into(),
            re: None,
            subject: None,
            parts: vec![wire::Part::Text(wire::TextPart { text: "hi".into() })],
        })
    }

    /// An inbound msg with a fresh id.
    fn inbound() -> (Line, Vec<u8>) {
        let id = wire::ids::IdGen::new(None).next_at(1).to_string();
        let line = msg(&id, "2026-01-01T00:00:00.000Z");
        let raw = line.encode();
        (line, raw)
    }

    fn queue(s: &Store) -> Result<Vec<super::super::OutboxEntry>, StoreError> {
        s.enqueue(&peer(), &[&|id: &str, ts: &str| msg(id, ts)])
    }

    #[test]
    fn injected_flush_failure_fails_every_caller_then_clears() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let plan = Arc::new(Plan::default());
        s.set_faults(Some(plan.clone()));
        queue(&s).unwrap();
        plan.flushes.store(1, Ordering::Relaxed);
        let e = s.flush_blocking().unwrap_err();
        assert!(e.to_string().contains("injected flush failure"), "{e}");
        // The next flush is a new one and succeeds.
        s.flush_blocking().unwrap();
        s.set_faults(None);
        plan.flushes.store(5, Ordering::Relaxed);
        s.flush_blocking().unwrap();
    }

    #[tokio::test]
    async fn injected_flush_failure_reaches_async_flush() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let plan = Arc::new(Plan::default());
        plan.flushes.store(1, Ordering::Relaxed);
        s.set_faults(Some(plan));
        assert!(s.flush().await.is_err());
        s.flush().await.unwrap();
    }

    #[test]
    fn injected_write_failure_stores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let plan = Arc::new(Plan::default());
        plan.writes.store(2, Ordering::Relaxed);
        s.set_faults(Some(plan));
        assert!(queue(&s).is_err());
        assert_eq!(s.outbox_len(&peer()).unwrap(), 0);
        let (line, raw) = inbound();
        assert!(s.receive(&peer(), &line, &raw).is_err());
        assert!(s.thread("thr_1").unwrap().is_none());
        // Faults used up: both go through.
        queue(&s).unwrap();
        assert_eq!(
            s.receive(&peer(), &line, &raw).unwrap(),
            super::super::Received::New(2)
        );
    }

    #[test]
    fn low_space_refuses_new_content_keeps_reads_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let plan = Arc::new(Plan::default());
        s.set_faults(Some(plan.clone()));
        let first = queue(&s).unwrap();
        s.flush_blocking().unwrap();

        plan.free.store(DISK_RESERVE - 1, Ordering::Relaxed);
        let e = queue(&s).unwrap_err();
        assert!(matches!(e, StoreError::DiskFull { free, .. } if free == DISK_RESERVE - 1));
        assert!(
            e.to_string()
                .starts_with(&format!("disk full: {} bytes free in ", DISK_RESERVE - 1)),
            "{e}"
        );
        let (line, raw) = inbound();
        assert!(matches!(
            s.receive(&peer(), &line, &raw),
            Err(StoreError::DiskFull { .. })
        ));
        // Reads and acks of our own lines still work.
        assert_eq!(s.outbox_len(&peer()).unwrap(), 1);
        assert!(s.ack(&peer(), "thr_1", &first[0].id).unwrap());
        s.flush_blocking().unwrap();

        // Space freed: accepted again without anything else happening.
        plan.free.store(DISK_RESERVE, Ordering::Relaxed);
        queue(&s).unwrap();
        assert!(matches!(
            s.receive(&peer(), &line, &raw),
            Ok(super::super::Received::New(_))
        ));
    }

    #[test]
    fn duplicates_are_not_refused_when_full() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let plan = Arc::new(Plan::default());
        s.set_faults(Some(plan.clone()));
        let (line, raw) = inbound();
        s.receive(&peer(), &line, &raw).unwrap();
        s.flush_blocking().unwrap();
        plan.free.store(1, Ordering::Relaxed);
        // A replay of a stored line writes nothing and may be acked again.
        assert_eq!(
            s.receive(&peer(), &line, &raw).unwrap(),
            super::super::Received::Duplicate
        );
    }

    /// The fuzzing harnesses' no-durability mode.
    struct NoSync;
    impl StoreFaults for NoSync {
        fn durable(&self) -> bool {
            false
        }
        fn flush(&self) -> std::io::Result<()> {
            Err(std::io::Error::other("injected flush failure"))
        }
    }

    #[test]
    fn durable_unless_installed_faults_say_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert!(s.durable(), "a store syncs by default");
        s.set_faults(Some(Arc::new(Plan::default())));
        assert!(s.durable(), "faults sync unless they say otherwise");
        s.set_faults(Some(Arc::new(NoSync)));
        assert!(!s.durable());
        // Without durability, a flush still runs the injected flush fault and is counted.
        let before = s.flush_count();
        assert!(s.flush_blocking().is_err());
        assert_eq!(s.flush_count(), before + 1);
        s.set_faults(None);
        assert!(s.durable());
    }

    #[test]
    fn disk_full_errors_are_recognized() {
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(
            libc::ENOSPC
        )));
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(
            libc::EDQUOT
        )));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(libc::EIO)));
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
    }
}
