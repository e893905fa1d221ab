//! Local-side security: the control socket against other users of the host, and listings
//! that peers can blow up with many or large items (spec/security-local.part.md).

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tests that change the process umask or start nodes take this, so the umask of one test
/// never applies to files another test creates.
static PROCESS_WIDE: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    PROCESS_WIDE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process umask for the life of the guard.
struct Umask(rustix::fs::Mode);

impl Umask {
    fn set(mask: u32) -> Umask {
        Umask(rustix::process::umask(rustix::fs::Mode::from_raw_mode(
            mask,
        )))
    }
}

impl Drop for Umask {
    fn drop(&mut self) {
        rustix::process::umask(self.0);
    }
}

/// Whether a user other than the owner could connect to the socket at `bound`: write
/// permission on it for group or others, and search permission for the same class on
/// every directory from its parent up to `top`.
fn others_can_reach(bound: &Path, top: &Path) -> bool {
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode();
    let sock = mode(bound);
    let mut dirs = Vec::new();
    let mut d = bound.parent();
    while let Some(dir) = d {
        dirs.push(mode(dir));
        if dir == top {
            break;
        }
        d = dir.parent();
    }
    let class = |write: u32, search: u32| sock & write != 0 && dirs.iter().all(|m| m & search != 0);
    class(0o020, 0o010) || class(0o002, 0o001)
}

/// Regression: the socket was bound at its final path (mode 0777 under umask 000) and
/// chmod-ed afterwards; another local user could connect in between and mint grants.
/// At the moment the socket exists (before it is published under its name), nobody but
/// its owner can reach it.
#[test]
fn control_socket_is_unreachable_by_others_from_the_moment_it_is_bound() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A home that other users can enter, and the loosest umask.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("awp.sock");
    let _umask = Umask::set(0o000);
    let mut checked = false;
    let l = awp_node::daemon::bind_control_socket_with(&path, |bound| {
        assert!(
            !others_can_reach(bound, dir.path()),
            "{} was reachable by other users when bound",
            bound.display()
        );
        checked = true;
    })
    .expect("bind");
    assert!(checked);
    let m = std::fs::symlink_metadata(&path).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    // It is the listening socket, and nothing is left next to it.
    let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
    l.accept().unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["awp.sock"]);
}

/// The same on a real socket path, watched from another thread: while the socket is bound
/// again and again (bounded: 200 binds or 5 s) under umask 000, every time the watcher
/// sees the path it has mode 0600.
#[test]
fn control_socket_is_never_observed_open_to_others() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("awp.sock");
    let _umask = Umask::set(0o000);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let open = Arc::new(Mutex::new(None::<u32>));
    let watcher = {
        let (stop, seen, open, path) = (stop.clone(), seen.clone(), open.clone(), path.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(m) = std::fs::symlink_metadata(&path) {
                    seen.fetch_add(1, Ordering::Relaxed);
                    let mode = m.permissions().mode() & 0o777;
                    if mode & 0o077 != 0 {
                        *open.lock().unwrap() = Some(mode);
                        return;
                    }
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut binds = 0;
    while binds < 200 && Instant::now() < deadline && open.lock().unwrap().is_none() {
        let before = seen.load(Ordering::Relaxed);
        let l = awp_node::daemon::bind_control_socket(&path).expect("bind");
        // Keep the socket until the watcher has looked at it (bounded).
        let until = Instant::now() + Duration::from_millis(50);
        while seen.load(Ordering::Relaxed) == before && Instant::now() < until {
            std::hint::spin_loop();
        }
        drop(l);
        std::fs::remove_file(&path).unwrap();
        binds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let open = *open.lock().unwrap();
    assert_eq!(
        open,
        None,
        "the socket was seen with mode {:o} (bind {binds})",
        open.unwrap_or(0)
    );
    assert!(seen.load(Ordering::Relaxed) > 0, "the watcher never ran");
}

/// The directory of the socket may hold a stale socket from a crashed node: it is
/// replaced, and the new one answers.
#[test]
fn control_socket_replaces_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("awp.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let l = awp_node::daemon::bind_control_socket(&path).unwrap();
    let _c = std::os::unix::net::UnixStream::connect(&path).expect("the new socket answers");
    l.accept().unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Regression: a process of another user that reached the socket was served (it could
/// mint an `exec` grant). Now the node compares the connecting process's uid
/// (SO_PEERCRED) with its own and refuses. Needs root to run a client as another user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_socket_refuses_another_users_process() {
    if euid() != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let node = {
        let _serial = serial();
        common::TestNode::start("sock-owner").await
    };
    let home = node.path();
    let sock = awp_node::daemon::socket_path(&home);
    // As if the race had been lost (or the home were shared): everything open.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let stranger = awp_node::identity::Identity::from_seed(&[7; 32])
        .key()
        .to_string();
    let out = run_as_nobody(&home, &["--json", "grant", &stranger, "exec"]).await;
    assert!(
        !out.status.success(),
        "another user's `awp grant` succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid 65534"), "{err}");
    // Nothing was minted.
    let r = node.ctl(awp_node::control::Request::Grants).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.body["grants"], serde_json::json!([]));
    // The owner is still served.
    let r = node.ctl(awp_node::control::Request::Whoami).await;
    assert!(r.ok, "{:?}", r.error);
    node.stop().await;
}

/// `awp ARGS --home HOME` as uid/gid 65534 (nobody), bounded to 20 s.
async fn run_as_nobody(home: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"));
    cmd.arg("--home").arg(home).args(args);
    cmd.uid(65534).gid(65534).env("HOME", "/nonexistent");
    cmd.kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("the client finishes")
        .expect("the client runs")
}
