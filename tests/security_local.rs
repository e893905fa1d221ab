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
static PROCESS_WIDE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// For the synchronous tests.
fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    PROCESS_WIDE.blocking_lock()
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
        let _serial = PROCESS_WIDE.lock().await;
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

/// `awp ARGS --home HOME` as this user, bounded to 60 s.
async fn run_awp(home: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"));
    cmd.arg("--home").arg(home).args(args).kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("awp finishes")
        .expect("awp runs")
}

fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "awp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

const MANY_THREADS: usize = 50_000;
const BIG_SUBJECTS: usize = 10;
const MANY_ADDRESSES: usize = 1_000;

fn msg_builder(th: String, subject: String) -> impl Fn(&str, &str) -> awp_node::wire::Line + Sync {
    use awp_node::wire::{Line, Msg, Part, TextPart};
    move |id: &str, ts: &str| {
        Line::Msg(Msg {
            id: id.into(),
            ts: ts.into(),
            th: th.clone(),
            re: None,
            subject: Some(subject.clone()),
            parts: vec![Part::Text(TextPart { text: "hi".into() })],
        })
    }
}

/// A store with 50,000 threads with one peer and 10 more whose subjects are 1 MB each.
fn fill_threads(home: &Path) -> awp_node::wire::PeerKey {
    // The node refuses a database without the identity it was made with.
    awp_node::identity::Identity::load_or_create(home).unwrap();
    let store = awp_node::store::Store::open(&home.join("db")).unwrap();
    let bob = awp_node::identity::Identity::from_seed(&[1; 32]).key();
    for batch in 0..MANY_THREADS / 1000 {
        let builders: Vec<_> = (0..1000)
            .map(|i| msg_builder(format!("thr_{:06}", batch * 1000 + i), "a subject".into()))
            .collect();
        let refs: Vec<awp_node::store::LineBuilder<'_>> = builders
            .iter()
            .map(|b| b as awp_node::store::LineBuilder<'_>)
            .collect();
        store.enqueue(&bob, &refs).unwrap();
    }
    for i in 0..BIG_SUBJECTS {
        let b = msg_builder(format!("thr_big_{i}"), "S".repeat(1_000_000));
        store.enqueue(&bob, &[&b]).unwrap();
    }
    store.flush_blocking().unwrap();
    bob
}

/// A store with ten peers whose names and abouts are 1 MB each, and one peer with 1,000
/// introduced addresses of 10 kB.
fn fill_peers(home: &Path) -> awp_node::wire::PeerKey {
    awp_node::identity::Identity::load_or_create(home).unwrap();
    let store = awp_node::store::Store::open(&home.join("db")).unwrap();
    let now = awp_node::wire::time::now_ms();
    for i in 0..10u8 {
        let k = awp_node::identity::Identity::from_seed(&[100 + i; 32]).key();
        let name = format!("n{i}{}", "N".repeat(1_000_000));
        store
            .peer_seen(&k, Some(&name), Some(&"A".repeat(1_000_000)), &[], now)
            .unwrap();
    }
    let carol = awp_node::identity::Identity::from_seed(&[2; 32]).key();
    store
        .peer_seen(&carol, Some("carol"), None, &[], now)
        .unwrap();
    for i in 0..MANY_ADDRESSES {
        let addr = format!("tls:10.0.0.1:{}#{}", i, "x".repeat(10_000));
        store
            .add_address(&carol, &addr, awp_node::store::AddrSource::Introduce)
            .unwrap();
    }
    store.flush_blocking().unwrap();
    carol
}

/// Regression: `awp threads` failed with "control line longer than 8388608 bytes" after
/// 50,000 threads or a few 1 MB subjects. The node now answers listings a page at a time
/// with peer-chosen text cut to size, and the CLI reads every page: the user sees all
/// threads, most recently updated first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_list_at_scale() {
    let home = tempfile::tempdir().unwrap();
    let path = home.path().to_path_buf();
    let bob = tokio::task::spawn_blocking(move || fill_threads(&path))
        .await
        .unwrap();
    let node = {
        let _serial = PROCESS_WIDE.lock().await;
        common::TestNode::start_in(home, "lister").await
    };
    let home = node.path();
    let threads = json_lines(&run_awp(&home, &["--json", "threads"]).await);
    assert_eq!(threads.len(), MANY_THREADS + BIG_SUBJECTS);
    let ths: std::collections::HashSet<&str> =
        threads.iter().map(|t| t["th"].as_str().unwrap()).collect();
    assert_eq!(ths.len(), threads.len(), "no thread twice");
    assert!(ths.contains("thr_000000") && ths.contains("thr_049999"));
    for t in &threads {
        assert_eq!(t["peer"], bob.to_string());
        let subject = t["subject"].as_str().unwrap();
        assert!(subject.chars().count() <= awp_node::control::MAX_SHOWN_CHARS);
        if t["th"].as_str().unwrap().starts_with("thr_big_") {
            assert!(
                subject.starts_with("SSS") && subject.ends_with('…'),
                "{subject}"
            );
        }
    }
    // Most recently updated first, as before paging.
    let updated: Vec<u64> = threads
        .iter()
        .map(|t| t["updated_ms"].as_u64().unwrap())
        .collect();
    assert!(updated.windows(2).all(|w| w[0] >= w[1]));
    node.stop().await;
}

/// Regression: `awp peers` failed the same way with peers' 1 MB names and abouts and
/// many introduced addresses. Names and abouts are cut, at most 32 addresses are shown
/// (with the total), and every peer is listed, also as a table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_list_with_huge_names_and_many_addresses() {
    let home = tempfile::tempdir().unwrap();
    let path = home.path().to_path_buf();
    let carol = tokio::task::spawn_blocking(move || fill_peers(&path))
        .await
        .unwrap();
    let node = {
        let _serial = PROCESS_WIDE.lock().await;
        common::TestNode::start_in(home, "lister").await
    };
    let home = node.path();
    let peers = json_lines(&run_awp(&home, &["--json", "peers"]).await);
    assert_eq!(peers.len(), 11, "ten big peers and carol");
    let keys: std::collections::HashSet<&str> =
        peers.iter().map(|p| p["key"].as_str().unwrap()).collect();
    assert_eq!(keys.len(), 11);
    for p in &peers {
        for f in ["name", "about"] {
            if let Some(s) = p[f].as_str() {
                assert!(
                    s.chars().count() <= awp_node::control::MAX_SHOWN_CHARS,
                    "{f}"
                );
            }
        }
    }
    let c = peers
        .iter()
        .find(|p| p["key"] == carol.to_string())
        .unwrap();
    // The store keeps a bounded list per peer (usability #1): the stalest went.
    assert_eq!(c["addresses_total"], awp_node::store::MAX_PEER_ADDRESSES);
    assert_eq!(
        c["addresses"].as_array().unwrap().len(),
        awp_node::control::MAX_SHOWN_ITEMS.min(awp_node::store::MAX_PEER_ADDRESSES)
    );
    let big = peers
        .iter()
        .find(|p| p["name"].as_str().is_some_and(|n| n.starts_with("n3")))
        .unwrap();
    assert!(big["name"].as_str().unwrap().ends_with('…'));
    let table = run_awp(&home, &["peers"]).await;
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    assert_eq!(table.stdout.iter().filter(|b| **b == b'\n').count(), 1 + 11);
    node.stop().await;
}

/// `awp read --no-mark` used to stop after the first page ("… more unread lines"): with
/// nothing marked read, asking again gave the same page. It now pages with the `next`
/// cursor and shows every unread line (three of ~600 kB here: two pages of 1 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_no_mark_pages_through_every_unread_line() {
    use awp_node::wire::{Line, Msg, Part, TextPart};
    let home = tempfile::tempdir().unwrap();
    {
        awp_node::identity::Identity::load_or_create(home.path()).unwrap();
        let store = awp_node::store::Store::open(&home.path().join("db")).unwrap();
        let dave = awp_node::identity::Identity::from_seed(&[3; 32]).key();
        for i in 0..3 {
            let line = Line::Msg(Msg {
                id: format!("01JD0000000000000000000{i:03}"),
                ts: "2026-11-30T12:00:00.000Z".into(),
                th: "thr_big_read".into(),
                re: None,
                subject: None,
                parts: vec![Part::Text(TextPart {
                    text: format!("{i}{}", "t".repeat(600_000)),
                })],
            });
            store.receive(&dave, &line, &line.encode()).unwrap();
        }
        store.flush_blocking().unwrap();
    }
    let node = {
        let _serial = PROCESS_WIDE.lock().await;
        common::TestNode::start_in(home, "reader").await
    };
    let home = node.path();
    let lines = json_lines(&run_awp(&home, &["--json", "read", "--no-mark"]).await);
    assert_eq!(lines.len(), 3);
    let firsts: Vec<char> = lines
        .iter()
        .map(|l| {
            let text = l["line"]["parts"][0]["text"].as_str().unwrap();
            text.chars().next().unwrap()
        })
        .collect();
    assert_eq!(firsts, ['0', '1', '2']);
    // Nothing was marked: the same again.
    assert_eq!(
        json_lines(&run_awp(&home, &["--json", "read", "--no-mark"]).await).len(),
        3
    );
    node.stop().await;
}

/// Grants list in pages of `limit`: every grant once, then no `next`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_list_in_pages() {
    use awp_node::control::{request_page, Page, Request};
    let node = {
        let _serial = PROCESS_WIDE.lock().await;
        common::TestNode::start("granter").await
    };
    for i in 0..5u8 {
        let sub = awp_node::identity::Identity::from_seed(&[40 + i; 32]).key();
        let r = node
            .ctl(Request::Grant {
                peer: sub.to_string(),
                caps: vec!["exec".into()],
                ttl_s: 600,
                aud: None,
            })
            .await;
        assert!(r.ok, "{:?}", r.error);
    }
    let sock = awp_node::daemon::socket_path(&node.path());
    let mut page = Page {
        cursor: None,
        limit: Some(2),
    };
    let mut hashes = Vec::new();
    let mut pages = 0;
    loop {
        let r = request_page(&sock, &Request::Grants, &page).await.unwrap();
        assert!(r.ok, "{:?}", r.error);
        pages += 1;
        let items = r.body["grants"].as_array().unwrap();
        assert!(items.len() <= 2);
        hashes.extend(
            items
                .iter()
                .map(|g| g["hash"].as_str().unwrap().to_string()),
        );
        match r.body.get("next").and_then(|n| n.as_str()) {
            Some(n) => page.cursor = Some(n.to_string()),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(pages, 3);
    let mut sorted = hashes.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, hashes, "hash order, each once");
    assert_eq!(hashes.len(), 5);
    // A bad cursor is a bad request, not a silent restart.
    let r = request_page(&sock, &Request::Peers, &Page::after("nonsense"))
        .await
        .unwrap();
    assert_eq!(r.error.unwrap().code, "bad_request");
    node.stop().await;
}
