//! One `awp serve-agent` per node home (issue 11 §2): two would both answer every prompt.
//! The lock is an exclusive `flock` (std `File::try_lock`) on `serve-agent.lock` in the
//! home, held for the process's lifetime (the OS drops it when the process ends, also on a
//! crash); the file holds the holder's pid, for the message of the second one.

use crate::cli::Failure;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// The lock file's name in the node home.
pub const LOCK_FILE: &str = "serve-agent.lock";

/// Take the home's serve-agent lock; keep the returned file open while serving.
///
/// Errors (usage, exit 2): another process holds it (its pid named when known), or the
/// file cannot be opened or locked.
pub fn lock(home: &Path) -> Result<std::fs::File, Failure> {
    let path = home.join(LOCK_FILE);
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&path).map_err(|e| {
        Failure::usage(
            format!("cannot open {}: {e}", path.display()),
            "check the node home",
        )
    })?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut s = String::new();
            let _ = Read::take(&mut f, 32).read_to_string(&mut s);
            let who = match s.trim().parse::<u32>() {
                Ok(pid) => format!("(pid {pid}) "),
                Err(_) => String::new(),
            };
            return Err(Failure::usage(
                format!(
                    "another `awp serve-agent` {who}already serves an agent for this node home"
                ),
                "stop it first: one serve-agent per node",
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Failure::usage(
                format!("cannot lock {}: {e}", path.display()),
                "check the node home",
            ))
        }
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = write!(f, "{}", std::process::id());
    let _ = f.flush();
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_in_the_same_home_is_refused_with_the_pid() {
        let home = tempfile::tempdir().unwrap();
        let first = lock(home.path()).unwrap();
        let e = lock(home.path()).unwrap_err();
        let m = e.message().unwrap();
        assert!(m.contains(&format!("(pid {})", std::process::id())), "{m}");
        drop(first);
        lock(home.path()).unwrap();
    }
}
