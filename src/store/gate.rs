//! One process-wide gate between our sled transactions and sled's flushes.
//!
//! sled 0.34.7 guards its trees with one process-wide reader-writer lock
//! (`concurrency_control`): a transaction takes its writer side while it stages, reads and
//! the periodic log flusher take its reader side, and `Tree::flush` (also run when a
//! database's last handle is dropped) holds the reader side while it waits for the log to
//! be written up to its last reservation. A transaction that asks for the writer side
//! during such a flush waits for it, and the flush then waits for a log flusher that
//! queues behind the transaction: every sled call in the process stops. Clean-clone test
//! runs that hold several stores in one process hung so, with one store closing while
//! another committed.
//!
//! So every sled transaction we run holds [`transaction`] (shared: they still serialize
//! inside sled), and every sled flush we start or cause (a checkpoint, the drop of a
//! database's handles at close) holds [`flush`] (exclusive): no transaction asks for
//! sled's writer side while a flush holds its reader side. Neither is ever taken while
//! the other is held on the same thread, nor twice. The store's commits are not sled
//! transactions (plain writes, `tx.rs`): only grants and the open's journal replay and
//! rollback run sled transactions now.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::new(());

/// Held around one sled transaction (`Transactional::transaction`).
pub(super) fn transaction() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Held around one sled flush: `Db::flush`/`Tree::flush`, or dropping a database's last
/// handles (which flushes).
pub(super) fn flush() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(PoisonError::into_inner)
}
