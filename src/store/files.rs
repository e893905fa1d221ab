//! sled's own files in the database directory, and the crash leftovers among them that
//! make sled refuse to open. Written for sled **0.34.7** (pinned with `=0.34.7` in
//! Cargo.toml: re-read `src/pagecache/snapshot.rs` and `src/config.rs` of a new version
//! before changing the pin).
//!
//! What sled 0.34.7 reads at open, and how it validates it:
//! - `snap.<LSN as 16 hex digits>`: the page table snapshot. sled writes it as
//!   `snap.<LSN>.generating` (payload, then the payload length as u64 little-endian, then
//!   the CRC-32 of the payload as u32 little-endian; fsync) and renames it when complete.
//!   At open it lists every file whose name starts with `snap.` except those ending in
//!   `.in___motion`, sorts the names and reads the LAST one. A file of 12 bytes or fewer is
//!   "empty/corrupt", a CRC that does not match is "corrupt"; both fail the open (sled
//!   falls back to replaying the log only when there is no snapshot file at all). Because
//!   `.generating` sorts after the finished name, a kill during a snapshot write leaves a
//!   database that never opens again.
//! - `conf`: `segment_size: N`, `use_compression: B`, `version: M.m` lines followed by the
//!   CRC-32 of those bytes (u32 LE). 8 bytes or fewer count as absent (sled writes a new
//!   one); a longer file that does not parse fails the open. sled writes it once, without
//!   fsync and without a temporary file, so a crash during the first open can truncate it.
//! - `blobs/<lsn>`: values too large for the log; sled itself deletes those past the
//!   recovered log position, and checks each one's CRC when it is read.
//!
//! [`inspect`] finds the files sled would misread; [`repair`] moves them to the home's
//! `quarantine/` directory (never deleting anything) before sled opens the database. A
//! snapshot is only an index over the log: without it sled rebuilds the page table from
//! the log, which holds every flushed write.

use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The sled version these rules were written for (and the version Cargo.toml pins).
pub const SLED_VERSION: &str = "0.34.7";

/// Directory, in the home, that receives files moved out of the way.
pub const QUARANTINE_DIR: &str = "quarantine";

/// Bytes the files under `dir` occupy on disk (allocated blocks, so sparse regions count
/// nothing; symlinks are not followed). 0 when missing. For measurements and `awp doctor`.
pub fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        total += m.blocks() * 512;
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Suffix of a snapshot sled has not finished writing.
const GENERATING: &str = ".generating";
/// Suffix sled's snapshot listing skips.
const IN_MOTION: &str = ".in___motion";
/// Trailer of a snapshot: u64 length + u32 CRC.
const SNAP_TRAILER: usize = 12;
/// sled reads a `conf` of this many bytes or fewer as absent.
const CONF_MIN: u64 = 8;

/// What is wrong with one of sled's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DbFileProblem {
    /// `snap.*.generating`: a snapshot whose write was interrupted. sled would read it
    /// when it sorts last.
    LeftoverSnapshot,
    /// A finished `snap.*` of 12 bytes or fewer (sled: "empty/corrupt snapshot file").
    EmptySnapshot,
    /// A finished `snap.*` whose CRC does not match its contents (truncated or damaged).
    CorruptSnapshot,
    /// A `conf` longer than 8 bytes whose CRC does not match (truncated during the first
    /// open). sled writes a fresh one with the same parameters.
    CorruptConf,
}

impl DbFileProblem {
    /// One line in plain words.
    pub fn describe(self) -> &'static str {
        match self {
            DbFileProblem::LeftoverSnapshot => {
                "an unfinished snapshot left by a crash (sled would read it and refuse to open)"
            }
            DbFileProblem::EmptySnapshot => "an empty snapshot (sled would refuse to open)",
            DbFileProblem::CorruptSnapshot => {
                "a truncated or damaged snapshot whose checksum does not match (sled would refuse to open)"
            }
            DbFileProblem::CorruptConf => {
                "a truncated database settings file (sled would refuse to open)"
            }
        }
    }
}

/// One file sled would misread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbFileIssue {
    /// The file, inside the database directory.
    pub path: PathBuf,
    pub problem: DbFileProblem,
    /// Its size in bytes.
    pub len: u64,
}

/// A file moved to the quarantine directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    pub issue: DbFileIssue,
    /// Where it is now.
    pub to: PathBuf,
}

/// Whether a finished snapshot file passes sled 0.34.7's checks (length over 12 bytes,
/// CRC-32 of everything before the 12-byte trailer equal to the trailer's last 4 bytes).
fn snapshot_problem(bytes: &[u8]) -> Option<DbFileProblem> {
    let len = bytes.len();
    if len <= SNAP_TRAILER {
        return Some(DbFileProblem::EmptySnapshot);
    }
    let (payload, trailer) = bytes.split_at(len - SNAP_TRAILER);
    let want = u32::from_le_bytes(trailer[8..12].try_into().expect("4 bytes"));
    (crc32fast::hash(payload) != want).then_some(DbFileProblem::CorruptSnapshot)
}

/// Whether `conf` would fail sled 0.34.7's open (see the module doc).
fn conf_problem(bytes: &[u8]) -> Option<DbFileProblem> {
    if bytes.len() as u64 <= CONF_MIN {
        return None;
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    (crc32fast::hash(body) != want).then_some(DbFileProblem::CorruptConf)
}

fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut buf)?;
    Ok(buf)
}

/// The files in the database directory `dir` that sled 0.34.7 would misread at open:
/// every `snap.*.generating`; finished `snap.*` files newer than the newest valid one that
/// are empty or fail the CRC (older ones are never read); a truncated `conf`. Read-only.
/// A missing directory has no issues.
///
/// Errors: the directory or a candidate file cannot be read.
pub fn inspect(dir: &Path) -> std::io::Result<Vec<DbFileIssue>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut snaps = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("snap.") && !name.ends_with(IN_MOTION) && e.file_type()?.is_file() {
            snaps.push(name);
        }
    }
    // sled sorts the full paths; same directory, so the names sort the same way.
    snaps.sort();
    let mut issues = Vec::new();
    let mut found_valid = false;
    for name in snaps.iter().rev() {
        let path = dir.join(name);
        let len = std::fs::metadata(&path)?.len();
        let problem = if name.ends_with(GENERATING) {
            Some(DbFileProblem::LeftoverSnapshot)
        } else if found_valid {
            None
        } else {
            let p = snapshot_problem(&read(&path)?);
            found_valid = p.is_none();
            p
        };
        if let Some(problem) = problem {
            issues.push(DbFileIssue { path, problem, len });
        }
    }
    let conf = dir.join("conf");
    match read(&conf) {
        Ok(bytes) => {
            if let Some(problem) = conf_problem(&bytes) {
                issues.push(DbFileIssue {
                    path: conf,
                    problem,
                    len: bytes.len() as u64,
                });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(issues)
}

/// Mode 0600 on a file moved aside (it may have been created by hand with a looser one).
pub(crate) fn private(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!("chmod 600 {}: {e}", p.display());
    }
}

/// Move `issues` into `quarantine` (created with mode 0700) as `<unix ms>-<file name>`
/// with mode 0600, then fsync both directories. Logs one warning per file.
pub fn quarantine(issues: &[DbFileIssue], quarantine: &Path) -> std::io::Result<Vec<Quarantined>> {
    if issues.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(quarantine)?;
    let stamp = crate::wire::time::now_ms();
    let mut moved = Vec::new();
    let mut dirs: Vec<PathBuf> = vec![quarantine.to_path_buf()];
    for issue in issues {
        let name = issue
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut to = quarantine.join(format!("{stamp}-{name}"));
        let mut n = 1;
        while to.exists() {
            to = quarantine.join(format!("{stamp}-{n}-{name}"));
            n += 1;
        }
        std::fs::rename(&issue.path, &to)?;
        private(&to);
        tracing::warn!(
            "store: moved {} ({} bytes) to {}: {} [sled {SLED_VERSION}]",
            issue.path.display(),
            issue.len,
            to.display(),
            issue.problem.describe()
        );
        if let Some(parent) = issue.path.parent() {
            if !dirs.iter().any(|d| d == parent) {
                dirs.push(parent.to_path_buf());
            }
        }
        moved.push(Quarantined {
            issue: issue.clone(),
            to,
        });
    }
    for d in dirs {
        std::fs::File::open(&d)?.sync_all()?;
    }
    Ok(moved)
}

/// Before sled opens `dir`: when no process holds the database (sled's exclusive lock on
/// `dir/db`, taken here for the duration), move the files [`inspect`] finds into
/// `quarantine_dir`. Returns what was moved, or `None` when the database is locked by
/// another handle (nothing is touched then).
pub fn repair(dir: &Path, quarantine_dir: &Path) -> std::io::Result<Option<Vec<Quarantined>>> {
    let lock = match std::fs::File::open(dir.join("db")) {
        Ok(f) => match f.try_lock() {
            Ok(()) => Some(f),
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        },
        // No data file: nothing can be running on it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let issues = inspect(dir)?;
    let moved = quarantine(&issues, quarantine_dir)?;
    drop(lock);
    Ok(Some(moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot_bytes(payload: &[u8]) -> Vec<u8> {
        let mut b = payload.to_vec();
        b.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        b.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        b
    }

    #[test]
    fn snapshot_validation_matches_sled() {
        let good = snapshot_bytes(b"page table");
        assert_eq!(snapshot_problem(&good), None);
        assert_eq!(snapshot_problem(&[]), Some(DbFileProblem::EmptySnapshot));
        assert_eq!(
            snapshot_problem(&good[..12]),
            Some(DbFileProblem::EmptySnapshot)
        );
        assert_eq!(
            snapshot_problem(&good[..good.len() - 1]),
            Some(DbFileProblem::CorruptSnapshot)
        );
        let mut flipped = good.clone();
        flipped[0] ^= 1;
        assert_eq!(
            snapshot_problem(&flipped),
            Some(DbFileProblem::CorruptSnapshot)
        );
    }

    #[test]
    fn conf_validation_matches_sled() {
        let body = b"segment_size: 524288\nuse_compression: false\nversion: 0.34\n";
        let mut good = body.to_vec();
        good.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        assert_eq!(conf_problem(&good), None);
        // sled treats 8 bytes or fewer as absent and writes a new one.
        assert_eq!(conf_problem(&good[..8]), None);
        assert_eq!(conf_problem(&good[..30]), Some(DbFileProblem::CorruptConf));
    }

    #[test]
    fn inspect_keeps_newest_valid_and_flags_newer_bad_ones() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let good = snapshot_bytes(b"good");
        std::fs::write(dir.join("snap.0000000000000010"), &good).unwrap();
        // Older and damaged: sled never reads it while a newer valid one exists.
        std::fs::write(dir.join("snap.0000000000000008"), b"x").unwrap();
        std::fs::write(dir.join("snap.0000000000000020"), &good[..3]).unwrap();
        std::fs::write(dir.join("snap.0000000000000030"), b"").unwrap();
        std::fs::write(dir.join("snap.0000000000000040.generating"), &good[..5]).unwrap();
        std::fs::write(dir.join("snap.0000000000000050.in___motion"), b"").unwrap();
        let mut got: Vec<(String, DbFileProblem)> = inspect(dir)
            .unwrap()
            .into_iter()
            .map(|i| {
                let n = i.path.file_name().unwrap().to_string_lossy().into_owned();
                (n, i.problem)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (
                    "snap.0000000000000020".to_string(),
                    DbFileProblem::EmptySnapshot
                ),
                (
                    "snap.0000000000000030".to_string(),
                    DbFileProblem::EmptySnapshot
                ),
                (
                    "snap.0000000000000040.generating".to_string(),
                    DbFileProblem::LeftoverSnapshot
                ),
            ]
        );
    }

    #[test]
    fn repair_moves_issues_to_private_quarantine() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("db");
        std::fs::create_dir(&db).unwrap();
        std::fs::write(db.join("snap.00000000FFFFFFFF.generating"), b"partial").unwrap();
        let q = d.path().join(QUARANTINE_DIR);
        let moved = repair(&db, &q).unwrap().unwrap();
        assert_eq!(moved.len(), 1);
        assert!(!db.join("snap.00000000FFFFFFFF.generating").exists());
        assert_eq!(std::fs::read(&moved[0].to).unwrap(), b"partial");
        assert!(moved[0].to.starts_with(&q));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&q).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(inspect(&db).unwrap().is_empty());
    }
}
