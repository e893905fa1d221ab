//! Where served work runs: a small, bounded set of threads of its own, and (with
//! `--sandbox`) a Landlock domain that confines each of them.
//!
//! Served file I/O never runs on tokio's blocking pool, which the store's flushes need: a
//! request that hangs (a slow file system) holds one of [`WORKERS`] threads and nothing
//! else. The threads are detached, so stopping the node never waits for them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Served jobs running at once, node-wide; more wait for a slot.
pub const WORKERS: usize = 8;

/// A bounded set of served-work threads.
#[derive(Debug)]
pub struct Workers {
    slots: Arc<Semaphore>,
}

impl Default for Workers {
    fn default() -> Self {
        Workers::new(WORKERS)
    }
}

impl Workers {
    /// At most `n` jobs at once.
    pub fn new(n: usize) -> Workers {
        Workers {
            slots: Arc::new(Semaphore::new(n.max(1))),
        }
    }

    /// Run `f` on a thread of its own once a slot is free, inside `sandbox` when given.
    /// Errors: the sandbox could not be entered, or the thread could not be started (the
    /// job did not run). A job that panics is reported as an error too. Dropping the
    /// returned future does not stop a running job; its slot stays taken until it ends.
    pub async fn run<T, F>(&self, sandbox: Option<&Sandbox>, f: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let sandbox = sandbox.cloned();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("awp-served".into())
            .spawn(move || {
                let r = match sandbox.map(|s| s.enter()).transpose() {
                    Ok(_) => Ok(f()),
                    Err(e) => Err(e),
                };
                drop(permit);
                let _ = tx.send(r);
            })
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        rx.await
            .map_err(|_| "the worker stopped without a result".to_string())?
    }

    /// Free slots now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

/// Directories a sandboxed job may read (and run programs from), when they exist.
pub const SYSTEM_READ_ONLY: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt",
];
/// Device files a sandboxed job may read and write.
pub const SYSTEM_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// A Landlock domain (`--sandbox`): full access beneath the served root, read and execute
/// in [`SYSTEM_READ_ONLY`], read and write on [`SYSTEM_DEVICES`], nothing else (so not
/// `$AWP_HOME` and its private key). Applies to the thread that enters it and to every
/// process it starts.
#[derive(Debug, Clone)]
pub struct Sandbox {
    root: PathBuf,
}

impl Sandbox {
    /// A sandbox for `root` once the kernel is known to enforce it ([`Sandbox::probe`]).
    pub fn new(root: &Path) -> Sandbox {
        Sandbox {
            root: root.to_path_buf(),
        }
    }

    /// Whether this kernel enforces Landlock fully: enters the sandbox on a throwaway
    /// thread. Err says why not.
    pub fn probe(&self) -> Result<(), String> {
        let s = self.clone();
        std::thread::spawn(move || s.enter())
            .join()
            .map_err(|_| "the probe thread panicked".to_string())?
    }

    /// Confine the calling thread (irreversible). Fails unless every rule is enforced.
    pub fn enter(&self) -> Result<(), String> {
        use landlock::{
            path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr,
            RulesetStatus, ABI,
        };
        let abi = ABI::V5;
        let e = |e: landlock::RulesetError| format!("landlock: {e}");
        let status = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .map_err(e)?
            .create()
            .map_err(e)?
            .add_rules(path_beneath_rules(
                SYSTEM_READ_ONLY,
                AccessFs::from_read(abi),
            ))
            .map_err(e)?
            .add_rules(path_beneath_rules(
                SYSTEM_DEVICES,
                AccessFs::ReadFile | AccessFs::WriteFile,
            ))
            .map_err(e)?
            .add_rules(path_beneath_rules([&self.root], AccessFs::from_all(abi)))
            .map_err(e)?
            .restrict_self()
            .map_err(e)?;
        match status.ruleset {
            RulesetStatus::FullyEnforced => Ok(()),
            other => Err(format!(
                "landlock is not fully enforced by this kernel ({other:?})"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_are_bounded_and_never_use_the_blocking_pool() {
        let w = Arc::new(Workers::new(2));
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hold = Arc::new(std::sync::Mutex::new(hold));
        // Two jobs that block until released take both slots.
        let mut running = Vec::new();
        for _ in 0..2 {
            let (w, hold) = (w.clone(), hold.clone());
            running.push(tokio::spawn(async move {
                w.run(None, move || {
                    let _ = hold.lock().unwrap().recv();
                })
                .await
            }));
        }
        for _ in 0..200 {
            if w.available() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(w.available(), 0);
        // A third waits for a slot …
        let third = {
            let w = w.clone();
            tokio::spawn(async move { w.run(None, || 3).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!third.is_finished());
        // … while tokio's blocking pool is free for the store.
        assert_eq!(tokio::task::spawn_blocking(|| 7).await.unwrap(), 7);
        release.send(()).unwrap();
        release.send(()).unwrap();
        assert_eq!(third.await.unwrap(), Ok(3));
        for r in running {
            assert_eq!(r.await.unwrap(), Ok(()));
        }
        assert_eq!(w.available(), 2);
    }

    /// A served job that never ends does not hold up the runtime's shutdown (a job on
    /// tokio's blocking pool would: dropping a runtime waits for those).
    #[test]
    fn a_stuck_job_does_not_hold_up_shutdown() {
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let w = Arc::new(Workers::new(1));
            rt.block_on(async {
                let w2 = w.clone();
                tokio::spawn(async move {
                    w2.run(None, move || {
                        let _ = hold.recv();
                    })
                    .await
                });
                while w.available() > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            });
            drop(rt);
            let _ = done_tx.send(());
        });
        let stopped = done.recv_timeout(std::time::Duration::from_secs(10));
        let _ = release.send(());
        assert!(
            stopped.is_ok(),
            "the runtime stopped with a job still running"
        );
    }
}
