//! SHA-256s being computed for blobs already queued (issue 10 §3, blob bandwidth).
//!
//! `awp send -f` queues a file's chunk stubs and the msg naming it before the file is
//! hashed, so its first chunk goes out while the hash runs; the blob's record
//! (`blobs_out`) holds an empty `sha256` until the node records the result. The stream
//! needs the hash only when it checks what it read ([`super::stream`]: at the last chunk,
//! or when it opens the file at a later chunk). It then asks here: [`wait`] blocks until
//! the hash is done. A blob with an empty `sha256` and no entry here was queued by a
//! process that stopped before it recorded the hash, and is stopped as changed.
//!
//! Order that makes this sound (`node::server`): [`begin`] before the chunks are queued,
//! the result written to the record before [`finish`], and a reader that finds no entry
//! reads the record again.

use crate::wire::PeerKey;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// A hash's outcome: the file's digests, or why it could not be hashed (it changed or
/// could not be read).
pub type Outcome = Result<super::Digests, String>;

/// One hash in progress.
#[derive(Debug, Default)]
struct Pending {
    done: Mutex<Option<Outcome>>,
    cv: Condvar,
}

type Key = (PeerKey, String);

fn table() -> MutexGuard<'static, HashMap<Key, Arc<Pending>>> {
    static TABLE: OnceLock<Mutex<HashMap<Key, Arc<Pending>>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Register the hash of blob `blob_ref` to `peer` as in progress. Every [`begin`] must be
/// followed by one [`finish`] (also when queueing fails), or [`wait`] blocks for ever.
pub fn begin(peer: &PeerKey, blob_ref: &str) {
    table().insert((*peer, blob_ref.to_string()), Arc::default());
}

/// Publish the outcome of a hash registered with [`begin`], wake its waiters and forget
/// it. Write the outcome where readers look next (the blob's record) first.
pub fn finish(peer: &PeerKey, blob_ref: &str, outcome: Outcome) {
    let Some(p) = table().remove(&(*peer, blob_ref.to_string())) else {
        return;
    };
    *p.done.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    p.cv.notify_all();
}

/// The outcome of the hash of blob `blob_ref` to `peer`, waiting (blocking the thread)
/// until it is done; None when no hash of it is in progress (finished already, or never
/// begun in this process).
pub fn wait(peer: &PeerKey, blob_ref: &str) -> Option<Outcome> {
    let p = table().get(&(*peer, blob_ref.to_string())).cloned()?;
    let mut done = p.done.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if let Some(o) = done.as_ref() {
            return Some(o.clone());
        }
        done = p.cv.wait(done).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Whether a hash of blob `blob_ref` to `peer` is in progress.
pub fn in_progress(peer: &PeerKey, blob_ref: &str) -> bool {
    table().contains_key(&(*peer, blob_ref.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
    }

    fn digests(s: &str) -> super::super::Digests {
        super::super::Digests {
            sha256: s.into(),
            blake3: format!("b3{s}"),
        }
    }

    #[test]
    fn a_waiter_gets_the_outcome_published_after_it_started_waiting() {
        let peer = key(1);
        begin(&peer, "r1");
        assert!(in_progress(&peer, "r1"));
        let waiter = std::thread::spawn(move || wait(&peer, "r1"));
        // Whether the waiter is already blocked or not, it sees the one outcome.
        std::thread::sleep(std::time::Duration::from_millis(5));
        finish(&peer, "r1", Ok(digests("ab")));
        assert_eq!(waiter.join().unwrap(), Some(Ok(digests("ab"))));
        assert!(!in_progress(&peer, "r1"));
    }

    #[test]
    fn nothing_in_progress_is_none_and_finish_without_begin_is_harmless() {
        let peer = key(2);
        assert_eq!(wait(&peer, "nope"), None);
        finish(&peer, "nope", Err("x".into()));
        assert_eq!(wait(&peer, "nope"), None);
        // Keys are per peer.
        begin(&peer, "r2");
        assert_eq!(wait(&key(3), "r2"), None);
        finish(&peer, "r2", Err("changed".into()));
        assert_eq!(wait(&peer, "r2"), None);
    }
}
