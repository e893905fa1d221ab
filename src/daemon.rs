//! Temporary: replaced by the CLI's daemon module.
use std::path::{Path, PathBuf};

/// The home lock.
pub struct Lock(std::fs::File);
/// Lock failure.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("held by pid {pid}")]
    Held { pid: u32 },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
impl Lock {
    /// Acquire.
    pub fn acquire(home: &Path) -> Result<Lock, LockError> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(home.join("node.lock"))?;
        match f.try_lock() {
            Ok(()) => Ok(Lock(f)),
            Err(_) => Err(LockError::Held { pid: 0 }),
        }
    }
}
/// Socket path.
pub fn socket_path(home: &Path) -> PathBuf {
    home.join("awp.sock")
}
