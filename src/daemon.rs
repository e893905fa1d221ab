//! The node's place on this host: the home directory, the single-node lock, the control
//! socket path, and starting a node in the background for the CLI.
//!
//! Layout of `$AWP_HOME` (mode 0700):
//! - `node.lock`: exclusive lock held by the running node, containing its pid;
//! - `awp.sock`: the control socket (see [`socket_path`] for the fallback when the home
//!   path is too long for a unix socket, recorded in `sock.path`);
//! - `node.log`: stdout and stderr of a node started in the background.

use crate::control::{self, ClientError, Request};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// File name of the lock in the home.
pub const LOCK_FILE: &str = "node.lock";
/// File name of the control socket in the home.
pub const SOCKET_FILE: &str = "awp.sock";
/// File recording the control socket path when it lives outside the home.
pub const SOCKET_RECORD_FILE: &str = "sock.path";
/// Log of a node started in the background.
pub const LOG_FILE: &str = "node.log";
/// Longest control socket path used as is. `sun_path` holds 108 bytes on Linux and 104 on
/// the BSDs, including the terminating NUL; stay below both.
pub const MAX_SOCKET_PATH: usize = 100;

/// How long [`ensure_running`] waits for a freshly started node to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);
const START_POLL: Duration = Duration::from_millis(100);
/// Timeout of the liveness probe on the control socket.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The default home: `$HOME/.awp`, or `None` when `HOME` is not set.
pub fn default_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".awp"))
}

/// The home to use: `opt` (from `--home` / `AWP_HOME`) or [`default_home`], made absolute
/// and created with mode 0700 when missing.
pub fn resolve_home(opt: Option<PathBuf>) -> std::io::Result<PathBuf> {
    let home = match opt.filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p,
        None => default_home().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "HOME is not set and no --home or AWP_HOME was given",
            )
        })?,
    };
    let home = std::path::absolute(&home)?;
    if !home.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&home)?;
    }
    Ok(home)
}

/// The exclusive lock on `$AWP_HOME/node.lock` that makes a node the only one on its home.
///
/// Held until dropped or until the process dies (the operating system releases it, also
/// after SIGKILL).
#[derive(Debug)]
pub struct Lock {
    _file: File,
    path: PathBuf,
}

/// Why [`Lock::acquire`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another open handle holds the lock; `pid` is the pid written by the holder, when
    /// it could be read.
    #[error("{} is held by {}", path.display(), pid.map(|p| format!("pid {p}")).unwrap_or_else(|| "another process".into()))]
    Held { path: PathBuf, pid: Option<u32> },
    /// The lock file could not be opened, locked or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Lock {
    /// Take the lock without waiting and write our pid into the file.
    pub fn acquire(home: &Path) -> Result<Lock, LockError> {
        let path = home.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        // No truncation on open: the file holds the current holder's pid until we own it.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let pid = read_holder_pid(&mut file);
                return Err(LockError::Held { path, pid });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(Lock { _file: file, path })
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid in a lock file held by someone else. The holder writes it right after locking,
/// so retry briefly when the file is still empty.
fn read_holder_pid(file: &mut File) -> Option<u32> {
    for _ in 0..5 {
        let mut text = String::new();
        if file.seek(SeekFrom::Start(0)).is_ok() && file.read_to_string(&mut text).is_ok() {
            if let Ok(pid) = text.trim().parse() {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The pid recorded in `$AWP_HOME/node.lock` (the current or the last holder), without
/// touching the lock.
pub fn recorded_pid(home: &Path) -> Option<u32> {
    std::fs::read_to_string(home.join(LOCK_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The control socket of the node on `home`: `$AWP_HOME/awp.sock`, or, when that path is
/// longer than [`MAX_SOCKET_PATH`] bytes, `/tmp/awp-<uid>-<hash of home>/awp.sock`.
///
/// Deterministic, so the node and every client compute the same path; the node calls
/// [`prepare_socket_path`] before binding.
pub fn socket_path(home: &Path) -> PathBuf {
    let direct = home.join(SOCKET_FILE);
    if direct.as_os_str().len() <= MAX_SOCKET_PATH {
        return direct;
    }
    fallback_socket_dir(home).join(SOCKET_FILE)
}

fn fallback_socket_dir(home: &Path) -> PathBuf {
    let uid = std::fs::metadata(home)
        .map(|m| m.uid().to_string())
        .unwrap_or_else(|_| "x".into());
    let digest = Sha256::digest(home.as_os_str().as_encoded_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    PathBuf::from(format!("/tmp/awp-{uid}-{hash}"))
}

/// For the node, before binding: compute [`socket_path`]; when it lies outside the home,
/// create its directory with mode 0700 (refusing one that is a symlink, not ours, or open
/// to others) and record the path in `$AWP_HOME/sock.path`. Returns the socket path.
pub fn prepare_socket_path(home: &Path) -> std::io::Result<PathBuf> {
    let path = socket_path(home);
    let record = home.join(SOCKET_RECORD_FILE);
    if path.parent() == Some(home) {
        let _ = std::fs::remove_file(&record);
        return Ok(path);
    }
    let dir = path.parent().expect("fallback socket path has a parent");
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let owner = std::fs::metadata(home)?.uid();
    if !meta.is_dir() || meta.uid() != owner || meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a private directory owned by the home's owner",
                dir.display()
            ),
        ));
    }
    let tmp = home.join(format!("{SOCKET_RECORD_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?
        .write_all(format!("{}\n", path.display()).as_bytes())?;
    std::fs::rename(&tmp, &record)?;
    Ok(path)
}

/// Bind the node's control socket at `path` (from [`prepare_socket_path`]) so that no
/// other user can ever reach it, whatever the umask and the mode of its directory: the
/// socket is bound inside a fresh private directory (mode 0700) next to `path`, set to
/// mode 0600, and only then renamed to `path` (atomically replacing a stale socket); the
/// private directory is removed. Binding at `path` and chmod-ing afterwards left a window
/// in which another local user could connect (security-local §Control socket).
///
/// The node also refuses connections from other uids ([`crate::control::check_peer_uid`]).
///
/// Errors: creating the directories, binding, or the rename.
pub fn bind_control_socket(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    bind_control_socket_with(path, |_| {})
}

/// [`bind_control_socket`], calling `before_publish` with the path the socket is bound at
/// just before it is renamed to `path` (tests check that nothing but its owner can reach
/// it there).
pub fn bind_control_socket_with(
    path: &Path,
    before_publish: impl FnOnce(&Path),
) -> std::io::Result<std::os::unix::net::UnixListener> {
    use rand::Rng;
    let dir = path.parent().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the control socket path has no directory",
        )
    })?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // A short name: the bound path is only two bytes longer than `path` (sun_path).
    let mut private = None;
    for _ in 0..16 {
        let tag: String = rand::thread_rng()
            .sample_iter(rand::distributions::Alphanumeric)
            .take(6)
            .map(char::from)
            .collect();
        let candidate = dir.join(format!(".s{tag}"));
        // `create` refuses an existing entry (also a planted symlink): never reuse one.
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => {
                private = Some(candidate);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    let private = private.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("no free private directory name in {}", dir.display()),
        )
    })?;
    let bound = private.join("s");
    let result = (|| {
        // The umask can only have removed bits; make sure the owner can use it.
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
        let l = std::os::unix::net::UnixListener::bind(&bound)?;
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o600))?;
        before_publish(&bound);
        std::fs::rename(&bound, path)?;
        Ok(l)
    })();
    let _ = std::fs::remove_file(&bound);
    let _ = std::fs::remove_dir(&private);
    result
}

/// Options for a node started in the background (the `awp daemon` arguments).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartArgs {
    /// `--listen` addresses, as typed.
    pub listen: Vec<String>,
    /// `--name`.
    pub name: Option<String>,
    /// `--about`.
    pub about: Option<String>,
    /// `--allow-plaintext`.
    pub allow_plaintext: bool,
    /// `--presence`.
    pub presence: bool,
    /// `--accept`.
    pub accept: Option<String>,
    /// `--serve`.
    pub serve: Vec<String>,
    /// `--root`.
    pub root: Option<PathBuf>,
    /// `--allow-hardlinks`.
    pub allow_hardlinks: bool,
    /// `--sandbox`.
    pub sandbox: bool,
    /// `--outbox-quota-bytes`.
    pub outbox_quota_bytes: Option<u64>,
    /// `--outbox-quota-lines`.
    pub outbox_quota_lines: Option<u64>,
    /// `--artifactr`.
    pub artifactr: Option<String>,
    /// `--artifactr-public`.
    pub artifactr_public: bool,
    /// `--via`, as typed.
    pub via: Vec<String>,
    /// `--no-sign`.
    pub no_sign: bool,
}

impl StartArgs {
    /// The command line arguments after `awp daemon --home H`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        for l in &self.listen {
            args.push("--listen".into());
            args.push(l.into());
        }
        if let Some(n) = &self.name {
            args.push("--name".into());
            args.push(n.into());
        }
        if let Some(a) = &self.about {
            args.push("--about".into());
            args.push(a.into());
        }
        if let Some(a) = &self.accept {
            args.push("--accept".into());
            args.push(a.into());
        }
        if !self.serve.is_empty() {
            args.push("--serve".into());
            args.push(self.serve.join(",").into());
        }
        if let Some(r) = &self.root {
            args.push("--root".into());
            args.push(r.into());
        }
        if self.allow_plaintext {
            args.push("--allow-plaintext".into());
        }
        if self.presence {
            args.push("--presence".into());
        }
        if self.allow_hardlinks {
            args.push("--allow-hardlinks".into());
        }
        if self.sandbox {
            args.push("--sandbox".into());
        }
        if let Some(b) = self.outbox_quota_bytes {
            args.push("--outbox-quota-bytes".into());
            args.push(b.to_string().into());
        }
        if let Some(l) = self.outbox_quota_lines {
            args.push("--outbox-quota-lines".into());
            args.push(l.to_string().into());
        }
        if let Some(a) = &self.artifactr {
            args.push("--artifactr".into());
            args.push(a.into());
        }
        if self.artifactr_public {
            args.push("--artifactr-public".into());
        }
        for v in &self.via {
            args.push("--via".into());
            args.push(v.into());
        }
        if self.no_sign {
            args.push("--no-sign".into());
        }
        args
    }
}

/// What [`ensure_running`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Running {
    /// A node was already answering.
    Already,
    /// We started one (its pid).
    Started { pid: u32 },
}

/// Why a background node could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    /// The executable could not be found or spawned, or the log could not be opened.
    #[error("could not start the node: {0}")]
    Spawn(std::io::Error),
    /// The started node exited before answering.
    #[error("the node exited during start ({status}){}", tail_suffix(log_tail))]
    Exited { status: String, log_tail: String },
    /// The node did not answer within [`START_TIMEOUT`].
    #[error("the node did not answer within {}s{}", START_TIMEOUT.as_secs(), tail_suffix(log_tail))]
    Timeout { log_tail: String },
}

fn tail_suffix(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {tail}")
    }
}

/// Whether a node answers `Status` on the control socket of `home`.
pub async fn is_running(home: &Path) -> bool {
    probe(home).await.is_ok()
}

async fn probe(home: &Path) -> Result<(), ClientError> {
    control::request_with_timeout(&socket_path(home), &Request::Status, PROBE_TIMEOUT)
        .await
        .map(|_| ())
}

/// Make sure a node runs on `home`: done when the control socket answers; otherwise start
/// `awp daemon --home H [args]` detached (own process group, stdin null, output appended
/// to `node.log`) and wait until it answers, at most [`START_TIMEOUT`].
pub async fn ensure_running(home: &Path, args: &StartArgs) -> Result<Running, StartFailure> {
    if is_running(home).await {
        return Ok(Running::Already);
    }
    let log_path = home.join(LOG_FILE);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(StartFailure::Spawn)?;
    let log_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(StartFailure::Spawn)?;
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new(exe)
            .arg("daemon")
            .arg("--home")
            .arg(home)
            .args(args.to_args())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(StartFailure::Spawn)?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(StartFailure::Spawn)?
    };
    let pid = child.id();
    let deadline = Instant::now() + START_TIMEOUT;
    let mut exited: Option<String> = None;
    loop {
        if probe(home).await.is_ok() {
            return Ok(if exited.is_some() {
                Running::Already
            } else {
                Running::Started { pid }
            });
        }
        if exited.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                // Another start may have won the lock and still be coming up: keep polling
                // while the lock's recorded holder is alive; give up otherwise.
                let other = recorded_pid(home).filter(|p| *p != pid && pid_alive(*p));
                if other.is_none() {
                    return Err(StartFailure::Exited {
                        status: status.to_string(),
                        log_tail: log_tail(&log_path, log_offset),
                    });
                }
                exited = Some(status.to_string());
            }
        }
        if Instant::now() >= deadline {
            return Err(StartFailure::Timeout {
                log_tail: log_tail(&log_path, log_offset),
            });
        }
        tokio::time::sleep(START_POLL).await;
    }
}

/// Whether a process with this pid exists (Linux: `/proc`; elsewhere assumed alive).
pub fn pid_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// What the log says since `offset`, as one line joined by ` | `: a panic and its message
/// when there is one (the backtrace after it is noise), else the last few lines.
fn log_tail(path: &Path, offset: u64) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let start = (offset as usize).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let picked = match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => &lines[i..(i + 2).min(lines.len())],
        None => {
            // The node's own last word (`awp: why; hint`, what `main` prints before it
            // exits) says why it stopped: the warnings logged before it do not.
            if let Some(own) = lines.iter().rev().find_map(|l| l.strip_prefix("awp: ")) {
                return own.to_string();
            }
            &lines[lines.len().saturating_sub(5)..]
        }
    };
    picked.join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_home_uses_socket_in_home() {
        let dir = tempfile::tempdir().unwrap();
        let p = socket_path(dir.path());
        assert_eq!(p, dir.path().join("awp.sock"));
        assert_eq!(prepare_socket_path(dir.path()).unwrap(), p);
        assert!(!dir.path().join(SOCKET_RECORD_FILE).exists());
    }

    #[test]
    fn long_home_falls_back_to_private_runtime_dir() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("x".repeat(120));
        let home = resolve_home(Some(home)).unwrap();
        let p = socket_path(&home);
        assert!(p.as_os_str().len() <= MAX_SOCKET_PATH, "{}", p.display());
        assert!(p.starts_with("/tmp"));
        // Deterministic: the node and clients agree.
        assert_eq!(p, socket_path(&home));
        // Another home gets another directory.
        let other = resolve_home(Some(dir.path().join("y".repeat(120)))).unwrap();
        assert_ne!(p, socket_path(&other));

        let prepared = prepare_socket_path(&home).unwrap();
        assert_eq!(prepared, p);
        let parent = p.parent().unwrap();
        let mode = std::fs::metadata(parent).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let recorded = std::fs::read_to_string(home.join(SOCKET_RECORD_FILE)).unwrap();
        assert_eq!(recorded.trim(), p.to_str().unwrap());
        std::fs::remove_dir(parent).unwrap();
    }

    #[test]
    fn resolve_home_creates_private_absolute_dir() {
        let dir = tempfile::tempdir().unwrap();
        let home = resolve_home(Some(dir.path().join("a/b"))).unwrap();
        assert!(home.is_absolute());
        let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn second_lock_reports_holder_pid_and_is_free_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let lock = Lock::acquire(dir.path()).unwrap();
        assert_eq!(recorded_pid(dir.path()), Some(std::process::id()));
        match Lock::acquire(dir.path()) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Held, got {other:?}"),
        }
        // The failed attempt did not wipe the holder's pid.
        assert_eq!(recorded_pid(dir.path()), Some(std::process::id()));
        drop(lock);
        let again = Lock::acquire(dir.path()).unwrap();
        assert_eq!(again.path(), dir.path().join(LOCK_FILE));
    }

    #[test]
    fn start_args_round_trip_to_flags() {
        let a = StartArgs {
            listen: vec!["tls:0.0.0.0:7700".into(), "unix:/tmp/x".into()],
            name: Some("bob".into()),
            about: None,
            allow_plaintext: true,
            presence: true,
            accept: Some("allowlist".into()),
            serve: vec!["exec".into(), "fs:read".into()],
            root: Some("/srv/work".into()),
            allow_hardlinks: true,
            sandbox: true,
            outbox_quota_bytes: Some(1000),
            outbox_quota_lines: Some(9),
            artifactr: Some("127.0.0.1:8765".into()),
            artifactr_public: true,
            via: vec![],
            no_sign: true,
        };
        let args: Vec<String> = a
            .to_args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--listen",
                "tls:0.0.0.0:7700",
                "--listen",
                "unix:/tmp/x",
                "--name",
                "bob",
                "--accept",
                "allowlist",
                "--serve",
                "exec,fs:read",
                "--root",
                "/srv/work",
                "--allow-plaintext",
                "--presence",
                "--allow-hardlinks",
                "--sandbox",
                "--outbox-quota-bytes",
                "1000",
                "--outbox-quota-lines",
                "9",
                "--artifactr",
                "127.0.0.1:8765",
                "--artifactr-public",
                "--no-sign"
            ]
        );
    }

    #[test]
    fn log_tail_keeps_last_lines_since_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node.log");
        std::fs::write(&p, "old\n").unwrap();
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        writeln!(f, "a\nb\n\nc\nd\ne\nf").unwrap();
        assert_eq!(log_tail(&p, 4), "b | c | d | e | f");
        writeln!(
            f,
            "thread 'main' panicked at src/x.rs:1:1:\nboom\nstack backtrace:\n 0: x"
        )
        .unwrap();
        assert_eq!(
            log_tail(&p, 4),
            "thread 'main' panicked at src/x.rs:1:1: | boom"
        );
    }

    /// A node that refused to start said why on its last line (`awp: …`): that line alone,
    /// without the warnings logged before it.
    #[test]
    fn log_tail_is_the_nodes_own_error_line_when_it_wrote_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node.log");
        std::fs::write(
            &p,
            "2026 WARN home has mode 755\n2026 WARN identity has mode 644\n\
             awp: the node could not start: listen on tls:127.0.0.1:1: Address already in use; \
             run `awp doctor` to check the home /h (and check --listen)\n",
        )
        .unwrap();
        assert_eq!(
            log_tail(&p, 0),
            "the node could not start: listen on tls:127.0.0.1:1: Address already in use; \
             run `awp doctor` to check the home /h (and check --listen)"
        );
    }
}
