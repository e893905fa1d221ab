//! Running SHA-256 of inbound blobs (issue 10 §3): the data of each chunk is hashed as it
//! is written, so a blob that arrived in order from offset 0 is not read back from disk
//! when it completes (that read was a serial pass over the whole file at the end of every
//! transfer). A blob with any other history (resumed after a restart, written by two
//! connections at once, evicted from the table) is hashed from its file as before.
//!
//! One table per process, keyed by the node's blob root, the peer and the ref, so the
//! connections of one node share an entry. Each entry has its own lock, held across the
//! write of a chunk and the hash update: the hash then always describes what this
//! process wrote to the partial file, in order. A write at an offset other than the one
//! the entry has reached invalidates it (another connection got ahead, or the file was
//! cut back); a write at offset 0 starts it afresh (the partial file was cut to 0 first).

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::wire::PeerKey;

/// Most blobs with a running hash in one process; past it one entry is dropped for each
/// new one (that blob is then hashed from its file when it completes).
pub(super) const MAX_RUNNING: usize = 1024;

type Key = (PathBuf, PeerKey, String);

/// The hash of one blob's data from offset 0 up to `at`, while `valid`.
struct Running {
    hash: Sha256,
    at: u64,
    valid: bool,
}

fn table() -> MutexGuard<'static, HashMap<Key, Arc<Mutex<Running>>>> {
    static TABLE: OnceLock<Mutex<HashMap<Key, Arc<Mutex<Running>>>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn key(root: &Path, peer: &PeerKey, blob_ref: &str) -> Key {
    (root.to_path_buf(), *peer, blob_ref.to_string())
}

/// Run `write` (which writes `data` at `offset` of the blob's partial file) under the
/// blob's entry lock and extend the running hash by `data` when the write succeeds at the
/// offset the hash has reached. Returns what `write` returned; a failed write, or one at
/// another offset, leaves the blob to be hashed from its file.
pub(super) fn write_hashed<E>(
    root: &Path,
    peer: &PeerKey,
    blob_ref: &str,
    offset: u64,
    data: &[u8],
    write: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    let k = key(root, peer, blob_ref);
    let entry = {
        let mut t = table();
        match t.get(&k) {
            Some(e) => Some(e.clone()),
            None if offset == 0 => {
                if t.len() >= MAX_RUNNING {
                    if let Some(evict) = t.keys().next().cloned() {
                        t.remove(&evict);
                    }
                }
                let e = Arc::new(Mutex::new(Running {
                    hash: Sha256::new(),
                    at: 0,
                    valid: true,
                }));
                t.insert(k, e.clone());
                Some(e)
            }
            None => None,
        }
    };
    let Some(entry) = entry else {
        return write();
    };
    let mut r = entry.lock().unwrap_or_else(|p| p.into_inner());
    if offset == 0 {
        *r = Running {
            hash: Sha256::new(),
            at: 0,
            valid: true,
        };
    }
    let extend = r.valid && r.at == offset;
    r.valid = false;
    write()?;
    if extend {
        r.hash.update(data);
        r.at = offset + data.len() as u64;
        r.valid = true;
    }
    Ok(())
}

/// The lowercase hex SHA-256 of the blob's `size` bytes when its running hash covers
/// exactly them (None: hash the file). The entry is dropped either way.
pub(super) fn finish(root: &Path, peer: &PeerKey, blob_ref: &str, size: u64) -> Option<String> {
    let entry = table().remove(&key(root, peer, blob_ref))?;
    let mut r = entry.lock().unwrap_or_else(|p| p.into_inner());
    if !r.valid || r.at != size {
        return None;
    }
    r.valid = false;
    let hash = std::mem::take(&mut r.hash);
    Some(super::super::hex(&hash.finalize()))
}

/// Drop the blob's running hash (its partial data was dropped).
pub(super) fn forget(root: &Path, peer: &PeerKey, blob_ref: &str) {
    table().remove(&key(root, peer, blob_ref));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
    }

    fn sha(data: &[u8]) -> String {
        crate::blob::hex(&Sha256::digest(data))
    }

    fn ok() -> Result<(), ()> {
        Ok(())
    }

    #[test]
    fn in_order_writes_give_the_hash_of_the_data() {
        let root = Path::new("/running-test/in-order");
        let p = peer();
        write_hashed(root, &p, "r", 0, b"hello ", ok).unwrap();
        write_hashed(root, &p, "r", 6, b"world", ok).unwrap();
        assert_eq!(finish(root, &p, "r", 10), None, "size not reached");
        // finish dropped the entry: a later finish knows nothing.
        write_hashed(root, &p, "r", 0, b"hello ", ok).unwrap();
        write_hashed(root, &p, "r", 6, b"world", ok).unwrap();
        assert_eq!(finish(root, &p, "r", 11), Some(sha(b"hello world")));
        assert_eq!(finish(root, &p, "r", 11), None);
    }

    #[test]
    fn a_blob_not_started_at_zero_has_no_running_hash() {
        let root = Path::new("/running-test/resumed");
        let p = peer();
        let mut wrote = false;
        write_hashed(root, &p, "r", 5, b"xyz", || {
            wrote = true;
            ok()
        })
        .unwrap();
        assert!(wrote, "the write runs without an entry");
        assert_eq!(finish(root, &p, "r", 8), None);
    }

    #[test]
    fn a_write_at_another_offset_invalidates_until_the_blob_restarts() {
        let root = Path::new("/running-test/race");
        let p = peer();
        write_hashed(root, &p, "r", 0, b"aaaa", ok).unwrap();
        // A second writer at the same offset (another connection, same chunk).
        write_hashed(root, &p, "r", 0, b"bbbb", ok).unwrap();
        write_hashed(root, &p, "r", 2, b"cc", ok).unwrap();
        write_hashed(root, &p, "r", 4, b"dd", ok).unwrap();
        assert_eq!(finish(root, &p, "r", 6), None, "offset 2 was a step back");
        // Cut back and restarted at 0: valid again.
        write_hashed(root, &p, "r", 0, b"aaaa", ok).unwrap();
        write_hashed(root, &p, "r", 4, b"dd", ok).unwrap();
        assert_eq!(finish(root, &p, "r", 6), Some(sha(b"aaaadd")));
    }

    #[test]
    fn a_failed_write_invalidates_and_is_returned() {
        let root = Path::new("/running-test/failed");
        let p = peer();
        write_hashed(root, &p, "r", 0, b"aaaa", ok).unwrap();
        assert_eq!(
            write_hashed(root, &p, "r", 4, b"bb", || Err("disk")),
            Err("disk")
        );
        write_hashed(root, &p, "r", 4, b"bb", ok).unwrap();
        assert_eq!(finish(root, &p, "r", 6), None);
    }

    #[test]
    fn forget_drops_the_entry_and_roots_do_not_share() {
        let (a, b) = (Path::new("/running-test/a"), Path::new("/running-test/b"));
        let p = peer();
        write_hashed(a, &p, "r", 0, b"one", ok).unwrap();
        write_hashed(b, &p, "r", 0, b"two", ok).unwrap();
        forget(a, &p, "r");
        assert_eq!(finish(a, &p, "r", 3), None);
        assert_eq!(finish(b, &p, "r", 3), Some(sha(b"two")));
    }
}
