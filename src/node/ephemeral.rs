//! The bounded queue of lines for one connection that are not in the outbox (presence
//! forwarding, grants): see [`Ephemeral`].

use tokio::sync::Notify;

/// Lines that are not queued in the outbox, waiting to be written to one connection.
const EPHEMERAL_QUEUE: usize = 256;

/// Lines to write to one connection that are not in the outbox (presence, grants): at
/// most [`EPHEMERAL_QUEUE`] lines, in order. The connection takes them only while its
/// write batch has room, so for a peer that does not read they stay here and later ones
/// are refused. It holds no storage while empty (and gives back what a burst grew), so
/// an idle connection keeps no preallocated slots (issue 10).
pub(crate) struct Ephemeral {
    /// The lines, and whether the connection has ended.
    lines: std::sync::Mutex<(std::collections::VecDeque<Vec<u8>>, bool)>,
    ready: Notify,
}

impl Ephemeral {
    pub(super) fn new() -> Ephemeral {
        Ephemeral {
            lines: std::sync::Mutex::new((std::collections::VecDeque::new(), false)),
            ready: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (std::collections::VecDeque<Vec<u8>>, bool)> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `line` after those waiting. False (the line is dropped) when
    /// [`EPHEMERAL_QUEUE`] lines wait already or the connection has ended.
    pub fn try_send(&self, line: Vec<u8>) -> bool {
        {
            let mut q = self.lock();
            if q.1 || q.0.len() >= EPHEMERAL_QUEUE {
                return false;
            }
            q.0.push_back(line);
        }
        self.ready.notify_one();
        true
    }

    /// The next line, once there is one. Cancel safe: a line is taken only when returned.
    pub(super) async fn recv(&self) -> Vec<u8> {
        loop {
            let notified = self.ready.notified();
            {
                let mut q = self.lock();
                if let Some(line) = q.0.pop_front() {
                    if q.0.is_empty() && q.0.capacity() > 0 {
                        q.0 = std::collections::VecDeque::new();
                    }
                    return line;
                }
            }
            notified.await;
        }
    }

    /// The connection has ended: what waits is dropped, later sends fail.
    pub(super) fn close(&self) {
        let mut q = self.lock();
        q.0 = std::collections::VecDeque::new();
        q.1 = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn the_ephemeral_queue_is_bounded_ordered_and_holds_nothing_when_empty() {
        let q = Ephemeral::new();
        assert_eq!(q.lock().0.capacity(), 0, "a new queue holds no storage");
        for i in 0..EPHEMERAL_QUEUE {
            assert!(q.try_send(vec![i as u8]));
        }
        // Full: the next line is dropped.
        assert!(!q.try_send(vec![0xff]));
        for i in 0..EPHEMERAL_QUEUE {
            assert_eq!(q.recv().await, vec![i as u8]);
        }
        // Drained after a burst: the storage it grew is given back.
        assert_eq!(q.lock().0.capacity(), 0);
        // A waiting receiver gets a line sent later.
        let q = Arc::new(q);
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.recv().await });
        tokio::task::yield_now().await;
        assert!(q.try_send(b"later".to_vec()));
        assert_eq!(waiter.await.unwrap(), b"later");
        // Once the connection has ended, sends fail and nothing is kept.
        assert!(q.try_send(b"dropped".to_vec()));
        q.close();
        assert!(!q.try_send(b"refused".to_vec()));
        assert!(q.lock().0.is_empty());
    }
}
