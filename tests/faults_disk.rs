//! Disk faults (issue 8 §2): failed flushes and writes of the store, and a full disk.
//!
//! Faults are injected at the store seam with `Store::set_faults` (a `StoreFaults` trait
//! object: only code linking the crate can install one, never a peer or a control client).
//! The full disk is a real one: a small tmpfs mounted for the test (root only; the test
//! says why and passes when it cannot mount).

mod common;

use awp_node::control::Request;
use awp_node::node::{DialTiming, NodeConfig, NodeHandle};
use awp_node::store::{StoreFaults, DISK_RESERVE};
use awp_node::wire::{self, Line};
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;

const TS: &str = "2026-01-01T00:00:00.000Z";

/// Fails the next `flushes` flushes, and every write while `writes` is set; counts the
/// flushes it failed.
#[derive(Default)]
struct Plan {
    flushes: AtomicU64,
    writes: AtomicBool,
    failed: AtomicU64,
}

impl StoreFaults for Plan {
    fn flush(&self) -> std::io::Result<()> {
        let take = self
            .flushes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        match take {
            Ok(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(std::io::Error::other("injected flush failure"))
            }
            Err(_) => Ok(()),
        }
    }
    fn write(&self) -> std::io::Result<()> {
        if self.writes.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("injected write failure"));
        }
        Ok(())
    }
}

fn msg_line(id: &str, th: &str, text: &str) -> Vec<u8> {
    serde_json::json!({"t":"msg","id":id,"ts":TS,"th":th,"parts":[{"k":"text","text":text}]})
        .to_string()
        .into_bytes()
}

/// Every line `raw` reads until the node closes (at most 50).
async fn until_closed(raw: &mut Raw) -> Vec<Line> {
    let mut out = Vec::new();
    for _ in 0..50 {
        match raw.read_line().await {
            Some(l) => out.push(l),
            None => break,
        }
    }
    out
}

fn acks_of(lines: &[Line], re: &str) -> usize {
    lines
        .iter()
        .filter(|l| matches!(l, Line::Ack(a) if a.re == re))
        .count()
}

fn internal_err(lines: &[Line]) -> bool {
    lines
        .iter()
        .any(|l| matches!(l, Line::Err(e) if e.code == wire::code::INTERNAL))
}

fn msg_ids(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e["t"] == "msg")
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// A failed flush: `err internal`, the connection closes, the line is not acked; what was
/// acked before is there after a restart, and the line sent again is taken.
#[tokio::test]
async fn failed_flush_answers_err_internal_acks_nothing_and_keeps_acked_lines() {
    let bob = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&bob.address(), 41).await;
    raw.handshake().await;
    let a = "01K00000000000000000000101";
    let b = "01K00000000000000000000102";
    raw.write(&msg_line(a, "thr_f1", "acked")).await;
    let l = raw.read_line().await.expect("ack of the first line");
    assert!(matches!(&l, Line::Ack(x) if x.re == a), "{l:?}");

    let plan = Arc::new(Plan::default());
    plan.flushes.store(u64::MAX, Ordering::Relaxed);
    bob.handle.store().set_faults(Some(plan.clone()));
    raw.write(&msg_line(b, "thr_f1", "not durable")).await;
    let lines = until_closed(&mut raw).await;
    assert!(internal_err(&lines), "err internal, got {lines:?}");
    assert_eq!(acks_of(&lines, b), 0, "nothing acked after a failed flush");

    plan.flushes.store(0, Ordering::Relaxed);
    bob.handle.store().set_faults(None);
    let home = bob.stop().await;
    let bob = TestNode::start_in(home, "bob@test").await;
    let ids = msg_ids(&bob.inbound().await);
    assert!(ids.contains(&a.to_string()), "acked line kept: {ids:?}");

    // The peer sends the unacked line again: acked now, once in the log.
    let mut raw = Raw::dial(&bob.address(), 41).await;
    raw.handshake().await;
    raw.write(&msg_line(b, "thr_f1", "not durable")).await;
    let l = raw.read_line().await.expect("ack of the resent line");
    assert!(matches!(&l, Line::Ack(x) if x.re == b), "{l:?}");
    let ids = msg_ids(&bob.inbound().await);
    assert_eq!(ids, vec![a.to_string(), b.to_string()]);
    bob.stop().await;
}

/// A failed write of inbound content: `err internal`, closed, nothing acked or stored.
#[tokio::test]
async fn failed_write_answers_err_internal_and_stores_nothing() {
    let bob = TestNode::start("bob@test").await;
    let plan = Arc::new(Plan::default());
    plan.writes.store(true, Ordering::Relaxed);
    bob.handle.store().set_faults(Some(plan.clone()));
    let mut raw = Raw::dial(&bob.address(), 42).await;
    raw.handshake().await;
    let a = "01K00000000000000000000201";
    raw.write(&msg_line(a, "thr_f2", "refused")).await;
    let lines = until_closed(&mut raw).await;
    assert!(internal_err(&lines), "err internal, got {lines:?}");
    assert_eq!(acks_of(&lines, a), 0);
    assert!(msg_ids(&bob.inbound().await).is_empty());
    // A local send fails the same way, with nothing queued.
    let r = bob
        .ctl(Request::Send {
            peer: Some(raw.identity.key().to_string()),
            th: None,
            subject: None,
            re: None,
            parts: vec![serde_json::json!({"k":"text","text":"x"})],
            files: vec![],
            wait_ack_ms: None,
        })
        .await;
    assert!(!r.ok);
    assert_eq!(bob.ctl(Request::Status).await.body["outbox"], 0);
    bob.stop().await;
}

/// A node whose dialer redials within tens of milliseconds.
async fn start_fast(home: &Path, name: &str) -> NodeHandle {
    NodeHandle::start(NodeConfig {
        home: home.to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        dial_timing: DialTiming {
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(100),
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("node starts")
}

/// Flushes failing now and then under traffic between two nodes: every line the sender saw
/// acked is in the receiver's log after a restart, once, in order.
#[tokio::test]
async fn intermittent_flush_failures_lose_no_acked_line() {
    let alice_home = TempDir::new().unwrap();
    let alice = TestNode {
        handle: start_fast(alice_home.path(), "alice@test").await,
        home: alice_home,
    };
    let bob = TestNode::start("bob@test").await;
    alice.connect(&bob).await;
    let plan = Arc::new(Plan::default());
    bob.handle.store().set_faults(Some(plan.clone()));
    let bob_key = bob.key();
    let mut ids = Vec::new();
    for i in 0..12 {
        if i % 4 == 1 {
            // The next flush at Bob fails (closing that connection; Alice redials).
            plan.flushes.fetch_add(1, Ordering::Relaxed);
        }
        let r = alice.send(Some(&bob_key), None, &format!("line {i}")).await;
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    eventually(30, || async {
        let s = alice.ctl(Request::Status).await;
        (s.body["outbox"] == 0).then_some(())
    })
    .await;
    assert_eq!(
        plan.failed.load(Ordering::Relaxed),
        3,
        "three flushes failed"
    );
    let _ = alice.stop().await;
    bob.handle.store().set_faults(None);
    let home = bob.stop().await;
    let bob = TestNode::start_in(home, "bob@test").await;
    assert_eq!(
        msg_ids(&bob.inbound().await),
        ids,
        "every acked line, once, in order"
    );
    bob.stop().await;
}

// ---------------------------------------------------------------------------------------
// A full disk (a real one: tmpfs).

/// A tmpfs mounted on a temp directory, unmounted on drop.
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    /// `None` (after saying why) where this process cannot mount.
    fn mount(size_mib: u64) -> Option<Tmpfs> {
        let dir = TempDir::new().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m,mode=0700")])
            .arg("tmpfs")
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                eprintln!(
                    "skipped: cannot mount a tmpfs ({}); run as root to test a full disk",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount ({e}); run as root to test a full disk");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fill the file system of `dir` with `filler` until `left` bytes are free (within 1 MiB).
fn fill_to(dir: &Path, filler: &Path, left: u64) {
    use std::io::Write;
    let free = awp_node::store::free_bytes(dir).unwrap();
    assert!(free > left, "{free} bytes free, wanted to leave {left}");
    let mut f = std::fs::File::create(filler).unwrap();
    let block = vec![0x5au8; 1 << 20];
    let mut todo = free - left;
    while todo > 0 {
        let n = todo.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).unwrap();
        todo -= n as u64;
    }
    f.sync_all().unwrap();
}

/// With less than the reserve free in its home, a node refuses `send` with "disk full: N
/// bytes free in HOME", refuses inbound content (err internal, no ack) and blob data
/// (blob_refused), keeps serving reads, and takes everything again by itself once space
/// is freed; after a restart every acked line is there.
#[tokio::test]
async fn full_disk_refuses_new_content_keeps_reads_and_recovers() {
    let Some(fs) = Tmpfs::mount(DISK_RESERVE / (1 << 20) + 32) else {
        return;
    };
    let alice_home: PathBuf = fs.path().join("alice");
    let alice = start_fast(&alice_home, "alice@test").await;
    let bob_home = TempDir::new().unwrap();
    let bob = TestNode {
        handle: start_fast(bob_home.path(), "bob@test").await,
        home: bob_home,
    };
    let alice_addr = alice.listening_event()["address"]
        .as_str()
        .unwrap()
        .to_string();
    let r = bob
        .ctl(Request::Connect {
            address: alice_addr.clone(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let alice_key = alice.key().to_string();
    let bob_key = bob.key();

    // Before: lines both ways, acked.
    let mut from_alice = Vec::new();
    for i in 0..3 {
        let r = send_req_home(&alice_home, &bob_key, &format!("before {i}")).await;
        assert!(r.ok, "{:?}", r.error);
        from_alice.push(r.body["id"].as_str().unwrap().to_string());
    }
    let mut from_bob = Vec::new();
    for i in 0..2 {
        let r = bob
            .send(Some(&alice_key), None, &format!("to alice {i}"))
            .await;
        from_bob.push(r["id"].as_str().unwrap().to_string());
    }
    let outbox_empty = |home: PathBuf| async move {
        eventually(20, || async {
            let s = ctl(&home, Request::Status).await;
            (s.body["outbox"] == 0).then_some(())
        })
        .await
    };
    outbox_empty(alice_home.clone()).await;
    outbox_empty(bob.path()).await;

    // Fill the disk to half the reserve.
    let filler = fs.path().join("filler");
    fill_to(fs.path(), &filler, DISK_RESERVE / 2);

    let r = send_req_home(&alice_home, &bob_key, "while full").await;
    assert!(!r.ok, "a send while the disk is full is refused");
    let e = r.error.unwrap();
    assert_eq!(e.code, "disk_full");
    assert!(
        e.message.starts_with("disk full: ")
            && e.message.contains(" bytes free in ")
            && e.message.ends_with(&alice_home.display().to_string()),
        "{}",
        e.message
    );
    // Reads still served.
    let inbound = ctl(
        &alice_home,
        Request::Read {
            th: None,
            mark: false,
        },
    )
    .await;
    assert!(inbound.ok, "{:?}", inbound.error);
    let got = msg_ids(inbound.body["entries"].as_array().unwrap());
    assert_eq!(got, from_bob);
    assert!(ctl(&alice_home, Request::Threads).await.ok);

    // Inbound content is refused, not acked: Bob keeps his line queued.
    let r = bob
        .send(Some(&alice_key), None, "while alice is full")
        .await;
    let late = r["id"].as_str().unwrap().to_string();
    // Blob data from a peer is refused with blob_refused.
    let mut raw = Raw::dial(&alice_addr, 43).await;
    raw.handshake().await;
    let chunk = serde_json::json!({"t":"chunk","id":"01K00000000000000000000301","ts":TS,
        "th":"thr_blob","ref":"b1","n":0,"last":true,"data":"aGVsbG8="});
    raw.write(chunk.to_string().as_bytes()).await;
    let l = raw.read_line().await.expect("an answer to the chunk");
    assert!(
        matches!(&l, Line::Err(e) if e.code == wire::code::BLOB_REFUSED && e.blob_ref.as_deref() == Some("b1")),
        "{l:?}"
    );
    drop(raw);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = bob.ctl(Request::Status).await;
    assert_eq!(s.body["outbox"], 1, "not acked while alice's disk is full");

    // Space freed: everything resumes without a restart.
    std::fs::remove_file(&filler).unwrap();
    let r = send_req_home(&alice_home, &bob_key, "after").await;
    assert!(r.ok, "{:?}", r.error);
    from_alice.push(r.body["id"].as_str().unwrap().to_string());
    from_bob.push(late);
    outbox_empty(bob.path()).await;
    outbox_empty(alice_home.clone()).await;

    // After a restart, every acked line is there, once.
    alice.shutdown();
    alice.stopped().await;
    drop(alice);
    let alice = start_fast(&alice_home, "alice@test").await;
    let inbound = ctl(
        &alice_home,
        Request::Read {
            th: None,
            mark: false,
        },
    )
    .await;
    assert_eq!(
        msg_ids(inbound.body["entries"].as_array().unwrap()),
        from_bob
    );
    let bob_in = msg_ids(&bob.inbound().await);
    assert_eq!(bob_in, from_alice);
    alice.shutdown();
    alice.stopped().await;
    drop(alice);
    bob.stop().await;
    drop(fs);
}

async fn send_req_home(home: &Path, peer: &str, text: &str) -> awp_node::control::Response {
    ctl(
        home,
        Request::Send {
            peer: Some(peer.to_string()),
            th: None,
            subject: None,
            re: None,
            parts: vec![serde_json::json!({"k":"text","text":text})],
            files: vec![],
            wait_ack_ms: None,
        },
    )
    .await
}
