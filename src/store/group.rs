//! Group commit: concurrent callers of flush share one database flush.
//!
//! Flushes are numbered (generations). A caller needs a flush that *starts* after its call:
//! target = (generations started so far) + 1. If none is running it starts that one itself
//! (the leader); otherwise it waits for the running one to finish and then either finds its
//! target done (another caller led it) or leads it. At most one flush runs at a time, so
//! callers arriving during a flush are all served by the next single flush. What a flush
//! does is the journal's (`journal.rs`): write the commits' records and sync that file,
//! or a checkpoint through sled.

use super::faults::Guard;
use super::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

struct GState {
    started: u64,
    running: bool,
    completed: u64,
    last: Result<(), String>,
}

pub(crate) struct Group {
    db: sled::Db,
    /// sled's data file. `Db::flush` writes with `sync_file_range`, which survives a killed
    /// process but not a power loss or kernel crash (it neither flushes the drive cache nor
    /// the file size); a `sync_data` on this file after every flush makes acks durable.
    data_file: Option<std::fs::File>,
    /// The commits' journal: a flush syncs it alone, or checkpoints (`journal.rs`).
    journal: Arc<super::journal::Journal>,
    /// Injected faults ([`super::StoreFaults::flush`]) and the free-space state.
    pub(crate) guard: Guard,
    st: Mutex<GState>,
    cv: Condvar,
    done: tokio::sync::watch::Sender<u64>,
    count: AtomicU64,
}

enum Step {
    Done(Result<(), StoreError>),
    Lead(u64),
    Wait(u64),
}

impl Group {
    pub(crate) fn new(
        db: sled::Db,
        data_file: Option<std::fs::File>,
        journal: Arc<super::journal::Journal>,
    ) -> Arc<Group> {
        Arc::new(Group {
            db,
            data_file,
            journal,
            guard: Guard::default(),
            st: Mutex::new(GState {
                started: 0,
                running: false,
                completed: 0,
                last: Ok(()),
            }),
            cv: Condvar::new(),
            done: tokio::sync::watch::Sender::new(0),
            count: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, GState> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Callers waiting for a flush that another caller leads (tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.done.receiver_count()
    }

    /// Number of database flushes run so far.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn target(&self) -> u64 {
        self.lock().started + 1
    }

    fn step(&self, target: u64) -> Step {
        let mut s = self.lock();
        if s.completed >= target {
            return Step::Done(s.last.clone().map_err(StoreError::Db));
        }
        if s.running {
            Step::Wait(s.completed)
        } else {
            s.running = true;
            s.started += 1;
            Step::Lead(s.started)
        }
    }

    fn complete(&self, gen: u64, res: Result<(), String>) {
        {
            let mut s = self.lock();
            s.running = false;
            s.completed = gen;
            s.last = res;
        }
        self.cv.notify_all();
        self.done.send_replace(gen);
    }

    /// Run flush `gen` as its leader.
    fn run(&self, gen: u64) {
        let lead = Lead {
            group: self,
            gen,
            done: false,
        };
        lead.run();
    }

    /// `inline`: a flush this caller leads runs on its own thread
    /// ([`tokio::task::block_in_place`], on a multi-thread runtime only) instead of the
    /// blocking pool, saving the two thread hand-offs around it (about 35 µs of a 0.4 ms
    /// round trip here) at the cost of moving this worker's other tasks to another thread
    /// for the fsync's duration: for small, latency-bound commits.
    pub(crate) async fn flush(self: &Arc<Self>, inline: bool) -> Result<(), StoreError> {
        let target = self.target();
        loop {
            match self.step(target) {
                Step::Done(r) => return r,
                Step::Lead(gen) => {
                    // The generation is completed inside the blocking task (or by the
                    // guard's drop if the task never runs), so neither a cancelled caller
                    // nor a shutting-down runtime leaves the group stuck.
                    let lead = Lead {
                        group: Arc::clone(self),
                        gen,
                        done: false,
                    };
                    if inline && crate::par::on_multi_thread_runtime() {
                        tokio::task::block_in_place(move || lead.run());
                    } else {
                        let _ = tokio::task::spawn_blocking(move || lead.run()).await;
                    }
                }
                Step::Wait(seen) => {
                    let mut rx = self.done.subscribe();
                    let _ = rx.wait_for(|c| *c > seen).await;
                }
            }
        }
    }

    /// At close: a checkpoint through sled that also empties the journal, so a store
    /// closed cleanly leaves no records behind (and one that an older build opens next
    /// loses nothing it would not see). Not in the no-durability mode. Errors are logged:
    /// the records stay in the journal for the next open then.
    pub(crate) fn close_checkpoint(&self) {
        if !self.guard.durable() {
            return;
        }
        self.journal.needs_full();
        if let Err(e) = self.journal.flush(&self.db, self.data_file.as_ref()) {
            tracing::warn!("the store's checkpoint at close failed ({e}); its journal is kept for the next open");
        }
    }

    pub(crate) fn flush_blocking(&self) -> Result<(), StoreError> {
        let target = self.target();
        loop {
            match self.step(target) {
                Step::Done(r) => return r,
                Step::Lead(gen) => self.run(gen),
                Step::Wait(seen) => {
                    let mut s = self.lock();
                    while s.completed <= seen {
                        s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
                    }
                }
            }
        }
    }
}

/// The leader of one flush generation. Completes the generation when dropped without having
/// run (panic, or a blocking task that never started), so waiters never hang.
struct Lead<G: std::ops::Deref<Target = Group>> {
    group: G,
    gen: u64,
    done: bool,
}

impl<G: std::ops::Deref<Target = Group>> Lead<G> {
    fn run(mut self) {
        let durable = self.group.guard.durable();
        let g = &*self.group;
        let res = g.guard.before_flush().and_then(|()| match durable {
            true => g.journal.flush(&g.db, g.data_file.as_ref()),
            false => {
                g.journal.discard();
                Ok(())
            }
        });
        self.group.count.fetch_add(1, Ordering::Relaxed);
        self.done = true;
        self.group.complete(self.gen, res);
    }
}

impl<G: std::ops::Deref<Target = Group>> Drop for Lead<G> {
    fn drop(&mut self) {
        if !self.done {
            self.group
                .complete(self.gen, Err("flush interrupted".into()));
        }
    }
}
