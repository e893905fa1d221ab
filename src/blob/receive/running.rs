//! Running SHA-256 of inbound blobs (issue 10 §3): the data of each chunk is hashed as it
//! is written, so a blob that arrived in order from offset 0 is not read back from disk
//! when it completes (that read was a serial pass over the whole file at the end of every
//! transfer). A blob with any other history (resumed after a restart, written by two
//! connections at once, its file replaced, evicted from the table) is hashed from its file
//! as before.
//!
//! One table per process, keyed by the node's blob root, the peer and the ref, so the
//! connections of one node share an entry. An entry follows one file (device and inode)
//! from the moment it was cut to 0 bytes: it is created only by that cut
//! ([`cut`]), extended only by a write at exactly the offset it has reached, to the same
//! file ([`write_hashed`]), and dropped by anything else (a write elsewhere or to another
//! file, a cut to another length, a refusal). Every cut and write of a key, with or
//! without an entry, runs under one of [`STRIPES`] locks chosen by the key, so the table
//! and the file change together; [`finish`] also checks that the file at the partial
//! path is still that file, with exactly the blob's size.

use sha2::{Digest, Sha256};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::wire::PeerKey;

/// Most blobs with a running hash in one process; past it one entry is dropped for each
/// new one (that blob is then hashed from its file when it completes).
pub(super) const MAX_RUNNING: usize = 1024;

/// Locks that serialize the cuts and writes of each key (a key always maps to the same
/// one; keys that share one only wait for each other).
pub(super) const STRIPES: usize = 64;

type Key = (PathBuf, PeerKey, String);

/// The hash of one file's data from offset 0 up to `at`.
struct Running {
    hash: Sha256,
    at: u64,
    /// Device and inode of the file the hash follows.
    file_id: (u64, u64),
}

fn table() -> MutexGuard<'static, HashMap<Key, Running>> {
    static TABLE: OnceLock<Mutex<HashMap<Key, Running>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn stripe(k: &Key) -> MutexGuard<'static, ()> {
    static LOCKS: OnceLock<Vec<Mutex<()>>> = OnceLock::new();
    let locks = LOCKS.get_or_init(|| (0..STRIPES).map(|_| Mutex::new(())).collect());
    let mut h = DefaultHasher::new();
    k.hash(&mut h);
    locks[(h.finish() as usize) % STRIPES]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn key(root: &Path, peer: &PeerKey, blob_ref: &str) -> Key {
    (root.to_path_buf(), *peer, blob_ref.to_string())
}

fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

/// Run `cut` (which sets the length of `file`, the blob's partial file, to `len`) under
/// the key's lock. A cut to 0 starts a running hash of `file`; a cut to any other length
/// keeps the blob's running hash only when it follows `file` and has reached `len`.
pub(super) fn cut<E>(
    root: &Path,
    peer: &PeerKey,
    blob_ref: &str,
    file: &File,
    len: u64,
    cut: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    let k = key(root, peer, blob_ref);
    let _lock = stripe(&k);
    let res = cut();
    let id = file.metadata().map(|m| file_id(&m)).ok();
    let mut t = table();
    match (&res, id) {
        (Ok(()), Some(file_id)) if len == 0 => {
            if t.len() >= MAX_RUNNING && !t.contains_key(&k) {
                if let Some(evict) = t.keys().next().cloned() {
                    t.remove(&evict);
                }
            }
            t.insert(
                k,
                Running {
                    hash: Sha256::new(),
                    at: 0,
                    file_id,
                },
            );
        }
        (Ok(()), Some(id)) if t.get(&k).is_some_and(|r| r.at == len && r.file_id == id) => {}
        _ => {
            t.remove(&k);
        }
    }
    res
}

/// Run `write` (which writes `data` at `offset` of `file`, the blob's partial file) under
/// the key's lock, and extend the blob's running hash by `data` when the write succeeded
/// at the offset the hash has reached, to the file it follows; any other write drops the
/// running hash. Returns what `write` returned.
pub(super) fn write_hashed<E>(
    root: &Path,
    peer: &PeerKey,
    blob_ref: &str,
    file: &File,
    offset: u64,
    data: &[u8],
    write: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    let k = key(root, peer, blob_ref);
    let _lock = stripe(&k);
    // Taken out of the table while it is extended, so the table's lock is not held
    // across the hashing (the key's lock keeps every other writer of this key out).
    let entry = table().remove(&k);
    let res = write();
    let Some(mut r) = entry else {
        return res;
    };
    let same_file = file.metadata().is_ok_and(|m| file_id(&m) == r.file_id);
    if res.is_ok() && same_file && r.at == offset {
        r.hash.update(data);
        r.at = offset + data.len() as u64;
        table().insert(k, r);
    }
    res
}

/// The lowercase hex SHA-256 of the blob's `size` bytes when its running hash covers
/// exactly them and `partial` (its partial file) is still the file it followed, with that
/// size (None: hash the file). The entry is dropped either way.
pub(super) fn finish(
    root: &Path,
    peer: &PeerKey,
    blob_ref: &str,
    partial: &Path,
    size: u64,
) -> Option<String> {
    let k = key(root, peer, blob_ref);
    let _lock = stripe(&k);
    let r = table().remove(&k)?;
    let m = std::fs::metadata(partial).ok()?;
    if r.at != size || m.len() != size || file_id(&m) != r.file_id {
        return None;
    }
    Some(super::super::hex(&r.hash.finalize()))
}

/// Drop the blob's running hash (its partial data is being dropped).
pub(super) fn forget(root: &Path, peer: &PeerKey, blob_ref: &str) {
    let k = key(root, peer, blob_ref);
    let _lock = stripe(&k);
    table().remove(&k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn peer() -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
    }

    fn sha(data: &[u8]) -> String {
        crate::blob::hex(&Sha256::digest(data))
    }

    /// A blob's partial file under a temp root, with the receiver's operations on it.
    struct Blob {
        _dir: tempfile::TempDir,
        root: PathBuf,
        path: PathBuf,
        peer: PeerKey,
    }

    impl Blob {
        fn new() -> Blob {
            let dir = tempfile::TempDir::new().unwrap();
            let root = dir.path().join("blobs");
            std::fs::create_dir_all(&root).unwrap();
            let path = root.join("partial");
            Blob {
                _dir: dir,
                root,
                path,
                peer: peer(),
            }
        }

        /// Open (creating) and cut, as `dirty_entry` does.
        fn open_cut(&self, len: u64) -> File {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&self.path)
                .unwrap();
            cut(&self.root, &self.peer, "r", &f, len, || f.set_len(len)).unwrap();
            f
        }

        fn write(&self, f: &File, at: u64, data: &[u8]) {
            write_hashed(&self.root, &self.peer, "r", f, at, data, || {
                f.write_all_at(data, at)
            })
            .unwrap();
        }

        fn finish(&self, size: u64) -> Option<String> {
            finish(&self.root, &self.peer, "r", &self.path, size)
        }

        fn file_sha(&self) -> String {
            sha(&std::fs::read(&self.path).unwrap())
        }
    }

    #[test]
    fn in_order_writes_from_a_cut_to_zero_give_the_hash_of_the_file() {
        let b = Blob::new();
        let f = b.open_cut(0);
        b.write(&f, 0, b"hello ");
        // A later batch reopens and cuts to the offset reached: the hash is kept.
        let f = b.open_cut(6);
        b.write(&f, 6, b"world");
        assert_eq!(b.finish(11), Some(sha(b"hello world")));
        assert_eq!(b.file_sha(), sha(b"hello world"));
        assert_eq!(b.finish(11), None, "finish drops the entry");
    }

    #[test]
    fn a_blob_not_cut_to_zero_has_no_running_hash() {
        let b = Blob::new();
        std::fs::write(&b.path, b"resum").unwrap();
        let f = b.open_cut(5);
        b.write(&f, 5, b"ed");
        assert_eq!(b.finish(7), None);
    }

    #[test]
    fn a_size_short_of_the_hash_or_of_the_file_is_not_trusted() {
        let b = Blob::new();
        let f = b.open_cut(0);
        b.write(&f, 0, b"abcdef");
        assert_eq!(b.finish(4), None);
        let f = b.open_cut(0);
        b.write(&f, 0, b"abcdef");
        // Something appended past the hashed data: the file's size disagrees.
        f.write_all_at(b"zz", 6).unwrap();
        assert_eq!(b.finish(6), None);
    }

    /// The review's first scenario: an empty chunk 0 opens the blob on connection A, B
    /// writes a long chunk 0, then A writes its next chunk at offset 0 without a cut. The
    /// file holds A's bytes then the tail of B's; no hash of A's bytes alone may stand.
    #[test]
    fn a_second_writer_at_offset_zero_without_a_cut_drops_the_hash() {
        let b = Blob::new();
        let fa = b.open_cut(0);
        b.write(&fa, 0, b"");
        let fb = b.open_cut(0);
        b.write(&fb, 0, &[b'y'; 200]);
        b.write(&fa, 0, &[b'x'; 100]);
        assert_eq!(b.finish(100), None);
        assert_eq!(b.finish(200), None);
    }

    /// The review's second scenario: the partial file is removed (a refusal on another
    /// connection) while A still holds it open; A's writes go to the removed file and a
    /// new file is cut to A's offset. Neither keeps a hash.
    #[test]
    fn a_replaced_file_drops_the_hash() {
        let b = Blob::new();
        let fa = b.open_cut(0);
        b.write(&fa, 0, b"abc");
        forget(&b.root, &b.peer, "r");
        std::fs::remove_file(&b.path).unwrap();
        b.write(&fa, 3, b"def");
        let f2 = b.open_cut(6);
        b.write(&f2, 6, b"ghi");
        assert_eq!(b.finish(9), None);
        // And an entry restarted on the new file ignores writes to the removed one.
        let f3 = b.open_cut(0);
        b.write(&fa, 0, b"old");
        b.write(&f3, 0, b"new");
        assert_eq!(b.finish(3), None);
    }

    #[test]
    fn a_failed_write_drops_the_hash_and_its_error_is_returned() {
        let b = Blob::new();
        let f = b.open_cut(0);
        b.write(&f, 0, b"aaaa");
        let r = write_hashed(&b.root, &b.peer, "r", &f, 4, b"bb", || Err("disk"));
        assert_eq!(r, Err("disk"));
        b.write(&f, 4, b"bb");
        assert_eq!(b.finish(6), None);
    }

    #[test]
    fn roots_do_not_share_entries() {
        let (a, c) = (Blob::new(), Blob::new());
        let fa = a.open_cut(0);
        a.write(&fa, 0, b"one");
        let fc = c.open_cut(0);
        c.write(&fc, 0, b"two");
        forget(&a.root, &a.peer, "r");
        assert_eq!(a.finish(3), None);
        assert_eq!(c.finish(3), Some(sha(b"two")));
    }
}
