//! The Roll front's durable state: which Roll thread (a UUID) is which AWP thread with the
//! peer, its title and timestamps, its recent turns and pending approvals, and the last
//! node log `seq` applied. One JSON file per peer, `$AWP_HOME/roll/<peer-hash>.json`
//! (directory 0700, file 0600), replaced atomically (write a temporary file, fsync,
//! rename, fsync the directory) and held under an exclusive lock while a front runs, so
//! that two fronts of one peer cannot overwrite each other.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Most Roll threads kept per peer; `thread.create` beyond it is refused.
pub const MAX_THREADS: usize = 10_000;
/// Most turns remembered per thread (older finished turns are forgotten first).
pub const MAX_TURNS: usize = 64;
/// Most pending approvals kept per thread (the oldest is dropped first).
pub const MAX_PENDING: usize = 64;
/// Largest state file read back, in bytes.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    /// The peer's full key (`ed25519:…`).
    pub peer: String,
    /// The last node log `seq` applied to this state.
    pub cursor: u64,
    /// The Roll threads, oldest first.
    pub threads: Vec<ThreadRec>,
}

/// One Roll thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRec {
    /// Roll thread id (UUID v4).
    pub id: String,
    /// The AWP thread id with the peer (`thr_<ULID>`, chosen at `thread.create`; the AWP
    /// thread itself starts with the first turn's msg).
    pub th: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// RFC 3339 UTC.
    pub updated_at: String,
    /// AWP msgs of the thread seen so far (ours and the peer's).
    pub message_count: u64,
    /// Recent turns, oldest first (at most [`MAX_TURNS`]).
    #[serde(default)]
    pub turns: Vec<TurnRec>,
    /// Approvals asked for and not answered yet.
    #[serde(default)]
    pub pending: Vec<ApprovalRec>,
}

/// One turn: a Roll `turn.start` and the AWP msg it sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRec {
    /// The client's turn id (UUID).
    pub id: String,
    /// The AWP id of our msg.
    pub msg_id: String,
    /// The node log seq of our msg, once seen in the log: the peer's lines count for this
    /// turn only after it.
    #[serde(default)]
    pub msg_seq: Option<u64>,
    /// RFC 3339 UTC.
    pub started_at: String,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// Whether `turn.started` was emitted (the peer said `working`, or answered).
    #[serde(default)]
    pub announced: bool,
}

/// An approval: the peer's `state waiting` with a note, during a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRec {
    /// Approval id (derived from the state line's id, see `front::derived_uuid`).
    pub id: String,
    pub turn_id: String,
    /// The AWP id of the peer's `state waiting` line (our answer's `re`).
    pub state_id: String,
    /// The state's note (the approval's preview and reason).
    pub note: String,
}

impl TurnRec {
    /// Whether the turn is still running.
    pub fn active(&self) -> bool {
        self.status == "running"
    }
}

impl ThreadRec {
    /// The running turn, if any.
    pub fn active_turn(&self) -> Option<&TurnRec> {
        self.turns.iter().rev().find(|t| t.active())
    }
    /// The running turn, mutable.
    pub fn active_turn_mut(&mut self) -> Option<&mut TurnRec> {
        self.turns.iter_mut().rev().find(|t| t.active())
    }
    /// Add a turn, forgetting the oldest finished ones beyond [`MAX_TURNS`].
    pub fn push_turn(&mut self, t: TurnRec) {
        self.turns.push(t);
        while self.turns.len() > MAX_TURNS {
            match self.turns.iter().position(|t| !t.active()) {
                Some(i) => {
                    self.turns.remove(i);
                }
                None => break,
            }
        }
    }
}

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another `awp roll` for this peer holds the lock.
    #[error("another `awp roll` for this peer runs on this home ({0})")]
    Locked(PathBuf),
    /// Reading, writing or locking failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not this format, or too large.
    #[error("{}: not a Roll state file: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
}

/// The open state file and its lock.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    // Held for the front's life: the exclusive lock.
    _lock: File,
}

/// The state file of `peer_key` in `home`.
pub fn path_for(home: &Path, peer_key: &str) -> PathBuf {
    let h = Sha256::digest(peer_key.as_bytes());
    let hex: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
    home.join("roll").join(format!("{hex}.json"))
}

impl StateFile {
    /// Open (creating the directory 0700) and lock the state of `peer_key`, and read it
    /// (empty when absent).
    pub fn open(home: &Path, peer_key: &str) -> Result<(StateFile, Saved), StoreError> {
        let path = path_for(home, peer_key);
        let dir = path
            .parent()
            .expect("state path has a directory")
            .to_path_buf();
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| StoreError::Io { path: p, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        let lock_path = path.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| StoreError::Locked(lock_path.clone()))?;
        let saved = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Saved {
                peer: peer_key.to_string(),
                ..Saved::default()
            },
            Err(e) => return Err(io(&path)(e)),
            Ok(m) if m.len() > MAX_FILE_BYTES => {
                return Err(StoreError::Corrupt {
                    path,
                    why: format!("larger than {MAX_FILE_BYTES} bytes"),
                })
            }
            Ok(_) => {
                let bytes = std::fs::read(&path).map_err(io(&path))?;
                let saved: Saved =
                    serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                        path: path.clone(),
                        why: e.to_string(),
                    })?;
                if saved.peer != peer_key {
                    return Err(StoreError::Corrupt {
                        path,
                        why: format!("it belongs to peer {}", saved.peer),
                    });
                }
                saved
            }
        };
        Ok((StateFile { path, _lock: lock }, saved))
    }

    /// Replace the file with `saved`, durably (file and directory fsynced).
    pub fn save(&self, saved: &Saved) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(saved).map_err(|e| io(std::io::Error::other(e)))?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn thread(id: &str) -> ThreadRec {
        ThreadRec {
            id: id.into(),
            th: "thr_1".into(),
            title: Some("t".into()),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            updated_at: "2026-01-01T00:00:00.000Z".into(),
            message_count: 0,
            turns: vec![],
            pending: vec![],
        }
    }

    #[test]
    fn saved_state_survives_reopen_with_private_modes_and_one_holder() {
        let home = tempfile::tempdir().unwrap();
        let (f, mut s) = StateFile::open(home.path(), "ed25519:A").unwrap();
        assert!(s.threads.is_empty());
        s.threads.push(thread("x"));
        s.cursor = 7;
        f.save(&s).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(f.path()), 0o600);
        assert_eq!(mode(f.path().parent().unwrap()), 0o700);
        // A second front of the same peer is refused while the first holds the lock.
        assert!(matches!(
            StateFile::open(home.path(), "ed25519:A"),
            Err(StoreError::Locked(_))
        ));
        drop(f);
        let (_f, again) = StateFile::open(home.path(), "ed25519:A").unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn a_foreign_or_broken_file_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let p = path_for(home.path(), "ed25519:B");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"{not json").unwrap();
        assert!(matches!(
            StateFile::open(home.path(), "ed25519:B"),
            Err(StoreError::Corrupt { .. })
        ));
        let other = Saved {
            peer: "ed25519:C".into(),
            ..Saved::default()
        };
        std::fs::write(&p, serde_json::to_vec(&other).unwrap()).unwrap();
        assert!(matches!(
            StateFile::open(home.path(), "ed25519:B"),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn old_finished_turns_are_forgotten_first() {
        let mut t = thread("x");
        for i in 0..MAX_TURNS + 5 {
            t.push_turn(TurnRec {
                id: format!("{i}"),
                msg_id: String::new(),
                msg_seq: None,
                started_at: String::new(),
                status: if i == 0 { "running" } else { "completed" }.into(),
                announced: false,
            });
        }
        assert_eq!(t.turns.len(), MAX_TURNS);
        assert_eq!(t.active_turn().unwrap().id, "0");
        assert_eq!(t.turns.last().unwrap().id, format!("{}", MAX_TURNS + 4));
    }
}
