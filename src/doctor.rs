//! `awp doctor`: checks a home without opening the database, says what is wrong in plain
//! words and the exact command that fixes it, and applies the safe fixes on request.
//!
//! Read-only unless fixing; works while the node is stopped, and while it runs (then it
//! checks what it can without sled's lock: an unfinished snapshot is expected then).
//!
//! Checks: the node (running or not), the store's files (what sled 0.34.7 would misread,
//! see [`crate::store::files`]), the identity (`identity.json` loads, its temporary file),
//! the settings (`config.toml` and `AWP_*`), file modes (dirs 0700, files 0600), leftovers
//! (`sock.path.tmp`), and what sits in `quarantine/`.
//!
//! Safe fixes ([`fix`]): quarantine the store files sled would misread (only while no node
//! runs, holding `node.lock` meanwhile), quarantine a leftover identity temporary file,
//! remove `sock.path.tmp`, and `chmod` to 0700 / 0600. Nothing is deleted that could hold
//! data: files are moved to `$AWP_HOME/quarantine/`.

use crate::store::files::{self, DbFileProblem, QUARANTINE_DIR};
use serde::Serialize;
use std::fs::File;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Checked and fine.
    Ok,
    /// Worth knowing; nothing to do.
    Note,
    /// Wrong: the node may not start, or the home is not private.
    Problem,
}

/// What a safe fix does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Move files sled would misread to quarantine.
    QuarantineDb,
    /// Move one file to quarantine.
    Quarantine(PathBuf),
    /// Delete a file that holds nothing of value.
    Remove(PathBuf),
    /// Set a mode.
    Chmod(PathBuf, u32),
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The area: `node`, `store`, `identity`, `config`, `modes`, `files`, `quarantine`.
    pub check: &'static str,
    pub level: Level,
    /// The file concerned, if one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// What was found, in plain words.
    pub what: String,
    /// The exact command that fixes it (shell syntax), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// Whether `awp doctor --fix` applies the fix.
    pub fixable: bool,
    #[serde(skip)]
    action: Option<Action>,
}

impl Finding {
    fn new(check: &'static str, level: Level, what: impl Into<String>) -> Finding {
        Finding {
            check,
            level,
            path: None,
            what: what.into(),
            fix: None,
            fixable: false,
            action: None,
        }
    }
    fn path(mut self, p: &Path) -> Finding {
        self.path = Some(p.to_path_buf());
        self
    }
    fn fix(mut self, cmd: impl Into<String>) -> Finding {
        self.fix = Some(cmd.into());
        self
    }
    fn action(mut self, a: Action) -> Finding {
        self.fixable = true;
        self.action = Some(a);
        self
    }
}

/// The result of [`check`].
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub home: PathBuf,
    /// A node holds the home's lock.
    pub running: bool,
    /// Its pid as recorded in `node.lock`, when running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// No finding is a [`Level::Problem`].
    pub ok: bool,
    pub findings: Vec<Finding>,
    /// What [`fix`] did (empty without `--fix`).
    pub fixed: Vec<String>,
}

impl Report {
    /// Number of problems.
    pub fn problems(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.level == Level::Problem)
            .count()
    }
}

/// Quote a path for a shell command line.
pub fn sh(p: &Path) -> String {
    let s = p.display().to_string();
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,=".contains(&b))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Whether a node holds `home/node.lock` (probed with a shared read-only open; the lock,
/// when free, is released at once).
fn node_running(home: &Path) -> bool {
    match File::open(home.join(crate::daemon::LOCK_FILE)) {
        Ok(f) => matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// Check `home` (read-only). See the module doc for what is checked.
pub fn check(home: &Path) -> Report {
    let running = node_running(home);
    let pid = running.then(|| crate::daemon::recorded_pid(home)).flatten();
    let mut findings = Vec::new();
    findings.push(if running {
        Finding::new(
            "node",
            Level::Note,
            format!(
                "a node runs on this home{}: the database is checked without its lock, and \
                 store fixes wait until it is stopped (`awp down`)",
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            ),
        )
    } else {
        Finding::new("node", Level::Ok, "no node runs on this home")
    });
    check_store(home, running, &mut findings);
    check_identity(home, &mut findings);
    check_config(home, &mut findings);
    check_modes(home, &mut findings);
    check_leftovers(home, &mut findings);
    let ok = !findings.iter().any(|f| f.level == Level::Problem);
    Report {
        home: home.to_path_buf(),
        running,
        pid,
        ok,
        findings,
        fixed: Vec::new(),
    }
}

fn check_store(home: &Path, running: bool, out: &mut Vec<Finding>) {
    let db = home.join("db");
    if !db.is_dir() {
        out.push(Finding::new(
            "store",
            Level::Note,
            "no database yet (the node creates it at its first start)",
        ));
        return;
    }
    let issues = match files::inspect(&db) {
        Ok(i) => i,
        Err(e) => {
            out.push(
                Finding::new(
                    "store",
                    Level::Problem,
                    format!("cannot read the database directory: {e}"),
                )
                .path(&db)
                .fix(format!("ls -la {}", sh(&db))),
            );
            return;
        }
    };
    let quarantine = home.join(QUARANTINE_DIR);
    let mut any = false;
    for i in issues {
        if running && i.problem == DbFileProblem::LeftoverSnapshot {
            // The running node may be writing it right now.
            out.push(
                Finding::new(
                    "store",
                    Level::Note,
                    format!(
                        "a snapshot is being written ({} bytes so far, or left by an earlier \
                         crash: checked again once the node is stopped)",
                        i.len
                    ),
                )
                .path(&i.path),
            );
            continue;
        }
        any = true;
        let what = format!("{} bytes: {}", i.len, i.problem.describe());
        let f = Finding::new("store", Level::Problem, what).path(&i.path);
        out.push(if running {
            f.fix(format!(
                "awp down && awp doctor --fix   # or: mv {} {}/",
                sh(&i.path),
                sh(&quarantine)
            ))
        } else {
            f.fix(format!(
                "awp doctor --fix   # or: mkdir -p -m 700 {q} && mv {} {q}/",
                sh(&i.path),
                q = sh(&quarantine)
            ))
            .action(Action::QuarantineDb)
        });
    }
    if !any {
        out.push(Finding::new(
            "store",
            Level::Ok,
            format!(
                "database files are consistent (snapshot and settings files as sled {} reads \
                 them)",
                files::SLED_VERSION
            ),
        ));
    }
}

fn check_identity(home: &Path, out: &mut Vec<Finding>) {
    use crate::identity::{Identity, IDENTITY_FILE};
    let path = home.join(IDENTITY_FILE);
    let tmp = home.join(format!(".{IDENTITY_FILE}.tmp"));
    let db = home.join("db");
    let exists = path.exists();
    if !exists && db.exists() {
        out.push(
            Finding::new(
                "identity",
                Level::Problem,
                "identity.json is missing but the home has a database made with it; the node \
                 refuses to start rather than make a new key",
            )
            .path(&path)
            .fix(format!(
                "restore identity.json from a backup to {}, or start afresh with a new key: \
                 mv {} {}.old",
                sh(&path),
                sh(&db),
                sh(&db)
            )),
        );
    } else if !exists {
        out.push(Finding::new(
            "identity",
            Level::Note,
            "no identity yet (the node creates one at its first start)",
        ));
    } else {
        match Identity::load(&path) {
            Ok(id) => out.push(
                Finding::new(
                    "identity",
                    Level::Ok,
                    format!("identity.json holds the key {}", id.key()),
                )
                .path(&path),
            ),
            Err(e) => out.push(
                Finding::new(
                    "identity",
                    Level::Problem,
                    format!(
                        "{e}; the key cannot be rebuilt from a damaged file and the node \
                         refuses to start"
                    ),
                )
                .path(&path)
                .fix(format!(
                    "restore identity.json from a backup, or start with a new key (peers will \
                     not know it): mv {} {}.damaged",
                    sh(&path),
                    sh(&path)
                )),
            ),
        }
    }
    if tmp.exists() {
        out.push(
            Finding::new(
                "identity",
                Level::Note,
                "a temporary identity file left by an interrupted first start (the node never \
                 reads it)",
            )
            .path(&tmp)
            .fix(format!(
                "awp doctor --fix   # moves it to {}/",
                sh(&home.join(QUARANTINE_DIR))
            ))
            .action(Action::Quarantine(tmp.clone())),
        );
    }
}

fn check_config(home: &Path, out: &mut Vec<Finding>) {
    let path = home.join(crate::config::CONFIG_FILE);
    match crate::config::Settings::load(home, crate::config::Layer::default()) {
        Ok(_) => out.push(Finding::new(
            "config",
            Level::Ok,
            if path.exists() {
                "config.toml and AWP_* variables are valid"
            } else {
                "no config.toml (defaults); AWP_* variables are valid"
            },
        )),
        Err(e) => out.push(
            Finding::new(
                "config",
                Level::Problem,
                format!("{e}; the node refuses to start"),
            )
            .path(&path)
            .fix(format!(
                "correct it with an editor (see README, Configuration), or set it aside to use \
                 the defaults: mv {} {}.bad",
                sh(&path),
                sh(&path)
            )),
        ),
    }
}

/// Walk the home (not following symlinks; at most `LIMIT` entries) for group/other access.
fn check_modes(home: &Path, out: &mut Vec<Finding>) {
    const LIMIT: usize = 100_000;
    let mut open = Vec::new();
    let mut stack = vec![home.to_path_buf()];
    let mut seen = 0;
    while let Some(p) = stack.pop() {
        seen += 1;
        if seen > LIMIT {
            break;
        }
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let ft = meta.file_type();
        if ft.is_symlink() || ft.is_socket() {
            continue;
        }
        let want = if ft.is_dir() { 0o700 } else { 0o600 };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            open.push((p.clone(), mode, want));
        }
        if ft.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    if open.is_empty() {
        out.push(Finding::new(
            "modes",
            Level::Ok,
            "the home is private (directories 0700, files 0600)",
        ));
        return;
    }
    for (p, mode, want) in open {
        out.push(
            Finding::new(
                "modes",
                Level::Problem,
                format!("mode {mode:o}: other users can read it (want {want:o})"),
            )
            .path(&p)
            .fix(format!("chmod {want:o} {}", sh(&p)))
            .action(Action::Chmod(p, want)),
        );
    }
}

fn check_leftovers(home: &Path, out: &mut Vec<Finding>) {
    let tmp = home.join(format!("{}.tmp", crate::daemon::SOCKET_RECORD_FILE));
    if tmp.exists() {
        out.push(
            Finding::new(
                "files",
                Level::Note,
                "a temporary socket record left by an interrupted start (never read)",
            )
            .path(&tmp)
            .fix(format!("rm {}", sh(&tmp)))
            .action(Action::Remove(tmp.clone())),
        );
    }
    let q = home.join(QUARANTINE_DIR);
    if let Ok(rd) = std::fs::read_dir(&q) {
        let n = rd.count();
        if n > 0 {
            out.push(
                Finding::new(
                    "quarantine",
                    Level::Note,
                    format!(
                        "{n} file(s) moved aside from damaged state; keep them for a bug report, \
                         or delete them once the node runs well"
                    ),
                )
                .path(&q)
                .fix(format!("rm -r {}", sh(&q))),
            );
        }
    }
}

/// Why [`fix`] could not run.
#[derive(Debug, thiserror::Error)]
pub enum FixError {
    /// A node started on the home between the check and the fix.
    #[error(
        "a node started on {0} meanwhile; stop it with `awp down` and run `awp doctor --fix` again"
    )]
    Running(String),
    #[error("{0}")]
    Io(String),
}

/// Apply the safe fixes of `report` (see the module doc), then check again. Store fixes
/// run only while no node runs; `node.lock` is held while they do, so none starts
/// meanwhile. Returns the new report with [`Report::fixed`] listing what was done.
pub fn fix(home: &Path, report: &Report) -> Result<Report, FixError> {
    let io = |what: String| move |e: std::io::Error| FixError::Io(format!("{what}: {e}"));
    let actions: Vec<&Action> = report
        .findings
        .iter()
        .filter_map(|f| f.action.as_ref())
        .collect();
    let mut fixed = Vec::new();
    let quarantine = home.join(QUARANTINE_DIR);
    let needs_lock = actions
        .iter()
        .any(|a| matches!(a, Action::QuarantineDb | Action::Quarantine(_)));
    // Held to the end of the fixes.
    let _lock = if needs_lock {
        let path = home.join(crate::daemon::LOCK_FILE);
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(path.display().to_string()))?;
        match f.try_lock() {
            Ok(()) => Some(f),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(FixError::Running(home.display().to_string()))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(path.display().to_string())(e)),
        }
    } else {
        None
    };
    for a in actions {
        match a {
            Action::QuarantineDb => {
                if fixed.iter().any(|f: &String| f.starts_with("store:")) {
                    continue;
                }
                let db = home.join("db");
                match files::repair(&db, &quarantine).map_err(io(db.display().to_string()))? {
                    Some(moved) => {
                        for m in moved {
                            fixed.push(format!(
                                "store: moved {} to {}",
                                m.issue.path.display(),
                                m.to.display()
                            ));
                        }
                    }
                    None => return Err(FixError::Running(home.display().to_string())),
                }
            }
            Action::Quarantine(p) => {
                let moved = move_aside(p, &quarantine).map_err(io(p.display().to_string()))?;
                fixed.push(format!("moved {} to {}", p.display(), moved.display()));
            }
            Action::Remove(p) => {
                std::fs::remove_file(p).map_err(io(p.display().to_string()))?;
                fixed.push(format!("removed {}", p.display()));
            }
            Action::Chmod(p, mode) => {
                match std::fs::set_permissions(p, std::fs::Permissions::from_mode(*mode)) {
                    Ok(()) => fixed.push(format!("chmod {mode:o} {}", p.display())),
                    // Moved to quarantine by an earlier fix (the quarantine is private).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io(p.display().to_string())(e)),
                }
            }
        }
    }
    drop(_lock);
    let mut again = check(home);
    again.fixed = fixed;
    Ok(again)
}

/// Move `p` into `quarantine` (mode 0700) as `<unix ms>-<name>`; fsync the directories.
fn move_aside(p: &Path, quarantine: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(quarantine)?;
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let to = quarantine.join(format!("{}-{name}", crate::wire::time::now_ms()));
    std::fs::rename(p, &to)?;
    files::private(&to);
    File::open(quarantine)?.sync_all()?;
    if let Some(parent) = p.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sh_quotes_only_when_needed() {
        assert_eq!(sh(Path::new("/a/b.c")), "/a/b.c");
        assert_eq!(sh(Path::new("/a b/it's")), r"'/a b/it'\''s'");
    }

    #[test]
    fn fresh_home_is_ok_with_notes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let r = check(d.path());
        assert!(r.ok, "{r:#?}");
        assert!(!r.running);
    }

    #[test]
    fn open_modes_are_problems_that_fix_repairs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = d.path().join("node.log");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let r = check(d.path());
        assert_eq!(r.problems(), 2, "{r:#?}");
        assert!(r
            .findings
            .iter()
            .any(|x| x.fix.as_deref() == Some(&format!("chmod 600 {}", sh(&f)))));
        let after = fix(d.path(), &r).unwrap();
        assert!(after.ok, "{after:#?}");
        assert_eq!(after.fixed.len(), 2);
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn damaged_identity_is_a_problem_without_an_automatic_fix() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let id = crate::identity::Identity::from_seed(&[3; 32]);
        id.write_file(d.path()).unwrap();
        let path = d.path().join(crate::identity::IDENTITY_FILE);
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() / 2]).unwrap();
        let r = check(d.path());
        let f = r.findings.iter().find(|f| f.check == "identity").unwrap();
        assert_eq!(f.level, Level::Problem);
        assert!(!f.fixable);
        assert!(f.fix.as_deref().unwrap().contains("mv "), "{f:?}");
        // --fix leaves the identity alone.
        let after = fix(d.path(), &r).unwrap();
        assert!(!after.ok);
        assert_eq!(std::fs::read(&path).unwrap(), &full[..full.len() / 2]);
    }
}
