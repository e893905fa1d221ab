//! Crash points: every file in a home, left as a crash leaves it (truncated, empty, a
//! leftover temporary), and the node either starts holding every line it acked, or — where
//! the damage cannot be undone safely — refuses to start with a message naming the fix.
//!
//! | file | crash state | outcome | test |
//! |---|---|---|---|
//! | `db/snap.*.generating` | partial / empty leftover | quarantined, starts | `leftover_generating_snapshot_is_quarantined`, `empty_generating_snapshot_is_quarantined` |
//! | `db/snap.*` | truncated / empty | quarantined, log replayed | `truncated_snapshot_is_quarantined`, `empty_snapshot_is_quarantined` |
//! | `db/conf` | truncated / empty | quarantined or rewritten | `truncated_conf_is_quarantined`, `empty_conf_is_rewritten` |
//! | `db/blobs/<lsn>` | torn write past the log | sled drops it | `torn_sled_blob_past_the_log_is_dropped` |
//! | `db/db` | unflushed tail | covered by `tests/crash.rs` (kill -9 loop) and `store::tests::crash_keeps_every_flushed_line` |
//! | `.identity.json.tmp` | leftover temporary | ignored, same key | `leftover_identity_temp_is_ignored` |
//! | `identity.json` | truncated / missing | refuses, names the fix | `truncated_identity_refuses_with_the_fix`, `missing_identity_with_a_database_refuses` |
//! | `config.toml` | truncated (written by hand) | refuses, names `awp doctor` | `truncated_config_refuses_and_names_doctor` |
//! | `sock.path.tmp` | leftover temporary | ignored | `leftover_socket_record_temp_is_ignored` |
//! | `node.lock` | stale pid | taken over | `stale_lock_file_is_taken_over` |
//! | `blobs/*/.partial/*` | bytes past the recorded offset; interrupted move | `blob::receive::tests::crash_leftovers_past_the_recorded_offset_are_truncated`, `…::recover_finishes_an_interrupted_move` |
//!
//! The last id and log sequence live in the database (`meta`), not in files of their own.

mod common;

use awp_node::control::Request;
use awp_node::node::{NodeConfig, NodeHandle};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use tempfile::TempDir;

/// Lines Bob acked to Alice, and Bob's stopped home (started and stopped twice, so sled has
/// written its snapshot).
struct Acked {
    bob: TempDir,
    ids: Vec<String>,
}

async fn acked_home(n: usize) -> Acked {
    let alice = TestNode::start("alice@test").await;
    let bob = TestNode::start("bob@test").await;
    alice.connect(&bob).await;
    let bob_key = bob.key();
    let mut ids = Vec::new();
    for i in 0..n {
        let r = alice.send(Some(&bob_key), None, &format!("line {i}")).await;
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    eventually(20, || async {
        let s = alice.ctl(Request::Status).await;
        (s.body["outbox"] == 0).then_some(())
    })
    .await;
    let _ = alice.stop().await;
    let home = bob.stop().await;
    // sled writes its snapshot while recovering at open.
    let bob = TestNode::start_in(home, "bob@test").await;
    let home = bob.stop().await;
    Acked { bob: home, ids }
}

/// Start Bob on `home`; every acked id is in his log.
async fn starts_with_every_line(home: TempDir, ids: &[String]) -> TempDir {
    let bob = TestNode::start_in(home, "bob@test").await;
    let got: Vec<String> = bob
        .inbound()
        .await
        .iter()
        .filter(|e| e["t"] == "msg")
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, ids, "every acked line, once, in order");
    bob.stop().await
}

async fn start_error(home: &Path) -> String {
    match NodeHandle::start(NodeConfig {
        home: home.to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        ..Default::default()
    })
    .await
    {
        Ok(_) => panic!("the node started"),
        Err(e) => e.to_string(),
    }
}

fn db(home: &TempDir) -> PathBuf {
    home.path().join("db")
}

/// The finished snapshot files, oldest first.
fn snapshots(home: &TempDir) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(db(home))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("snap.") && !n.contains(".generating")
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "sled wrote no snapshot");
    v
}

fn quarantined(home: &TempDir) -> Vec<String> {
    std::fs::read_dir(home.path().join("quarantine"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn awp(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("AWP_HOME")
        .output()
        .expect("run awp")
}

/// Regression: a kill -9 while sled wrote `snap.<N>.generating` left a node that never
/// started ("corrupt snapshot file found, crc does not match expected").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_generating_snapshot_is_quarantined() {
    let Acked { bob, ids } = acked_home(5).await;
    let good = std::fs::read(snapshots(&bob).last().unwrap()).unwrap();
    let cut = good.len().min(2000) * 2 / 3;
    std::fs::write(
        db(&bob).join("snap.00000000FFFFFFFF.generating"),
        &good[..cut],
    )
    .unwrap();
    let bob = starts_with_every_line(bob, &ids).await;
    assert!(!db(&bob).join("snap.00000000FFFFFFFF.generating").exists());
    let q = quarantined(&bob);
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(q[0].ends_with("-snap.00000000FFFFFFFF.generating"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_generating_snapshot_is_quarantined() {
    let Acked { bob, ids } = acked_home(3).await;
    std::fs::write(db(&bob).join("snap.FFFFFFFFFFFFFFFF.generating"), b"").unwrap();
    let bob = starts_with_every_line(bob, &ids).await;
    assert_eq!(quarantined(&bob).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_snapshot_is_quarantined() {
    let Acked { bob, ids } = acked_home(3).await;
    let snap = snapshots(&bob).pop().unwrap();
    let bytes = std::fs::read(&snap).unwrap();
    std::fs::write(&snap, &bytes[..bytes.len() - 5]).unwrap();
    let bob = starts_with_every_line(bob, &ids).await;
    assert_eq!(quarantined(&bob).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_snapshot_is_quarantined() {
    let Acked { bob, ids } = acked_home(3).await;
    let snap = snapshots(&bob).pop().unwrap();
    std::fs::write(&snap, b"").unwrap();
    let bob = starts_with_every_line(bob, &ids).await;
    assert_eq!(quarantined(&bob).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_conf_is_quarantined() {
    let Acked { bob, ids } = acked_home(3).await;
    let conf = db(&bob).join("conf");
    let bytes = std::fs::read(&conf).unwrap();
    std::fs::write(&conf, &bytes[..30]).unwrap();
    let bob = starts_with_every_line(bob, &ids).await;
    assert_eq!(std::fs::read(&conf).unwrap(), bytes, "sled wrote it again");
    assert_eq!(quarantined(&bob).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_conf_is_rewritten() {
    let Acked { bob, ids } = acked_home(3).await;
    let conf = db(&bob).join("conf");
    let bytes = std::fs::read(&conf).unwrap();
    std::fs::write(&conf, b"").unwrap();
    let _bob = starts_with_every_line(bob, &ids).await;
    assert_eq!(std::fs::read(&conf).unwrap(), bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_sled_blob_past_the_log_is_dropped() {
    let Acked { bob, ids } = acked_home(3).await;
    // A large value's file written just before the kill; its log entry never made it.
    let blob = db(&bob).join("blobs").join(format!("{}", i64::MAX / 2));
    std::fs::write(&blob, b"\x01\x02").unwrap();
    let _bob = starts_with_every_line(bob, &ids).await;
    assert!(!blob.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_identity_temp_is_ignored() {
    let Acked { bob, ids } = acked_home(2).await;
    let before = std::fs::read(bob.path().join("identity.json")).unwrap();
    std::fs::write(bob.path().join(".identity.json.tmp"), b"{\"key\":\"ed25").unwrap();
    let bob = starts_with_every_line(bob, &ids).await;
    assert_eq!(
        std::fs::read(bob.path().join("identity.json")).unwrap(),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_identity_refuses_with_the_fix() {
    let Acked { bob, ids } = acked_home(2).await;
    let path = bob.path().join("identity.json");
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() / 2]).unwrap();
    let e = start_error(bob.path()).await;
    assert!(e.contains("identity"), "{e}");
    assert!(e.contains("restore identity.json from a backup"), "{e}");
    assert!(e.contains(&format!("mv {}", path.display())), "{e}");
    // No new identity was made behind our back.
    assert_eq!(std::fs::read(&path).unwrap(), &full[..full.len() / 2]);
    // The CLI says the same and points to `awp doctor`, which names the fix too.
    let o = awp(bob.path(), &["daemon", "--listen", "tls:127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("run `awp doctor`"), "{err}");
    let o = awp(bob.path(), &["doctor"]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("PROBLEM  identity"), "{text}");
    // Restored from the backup: every line is still there.
    std::fs::write(&path, &full).unwrap();
    starts_with_every_line(bob, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_identity_with_a_database_refuses() {
    let Acked { bob, .. } = acked_home(1).await;
    std::fs::remove_file(bob.path().join("identity.json")).unwrap();
    let e = start_error(bob.path()).await;
    assert!(e.contains("missing"), "{e}");
    assert!(e.contains("mv "), "{e}");
    assert!(!bob.path().join("identity.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_config_refuses_and_names_doctor() {
    let Acked { bob, ids } = acked_home(1).await;
    let path = bob.path().join("config.toml");
    std::fs::write(&path, "accept = \"allowlist\"\nallow = [\"ed25519:A6EH").unwrap();
    let e = start_error(bob.path()).await;
    assert!(e.contains("config.toml"), "{e}");
    let o = awp(bob.path(), &["daemon", "--listen", "tls:127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("awp doctor"));
    let o = awp(bob.path(), &["doctor", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "config")
        .unwrap();
    assert_eq!(f["level"], "problem");
    std::fs::remove_file(&path).unwrap();
    starts_with_every_line(bob, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_socket_record_temp_is_ignored() {
    let Acked { bob, ids } = acked_home(1).await;
    std::fs::write(bob.path().join("sock.path.tmp"), b"/tmp/aw").unwrap();
    starts_with_every_line(bob, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_lock_file_is_taken_over() {
    let Acked { bob, ids } = acked_home(1).await;
    std::fs::write(bob.path().join("node.lock"), b"999999\n").unwrap();
    starts_with_every_line(bob, &ids).await;
}

/// `awp doctor` finds the snapshot leftover, `--fix` moves it, and the node starts; with
/// a node running it says so and leaves the database alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_and_fixes_a_leftover_snapshot() {
    let Acked { bob, ids } = acked_home(2).await;
    let leftover = db(&bob).join("snap.00000000FFFFFFFF.generating");
    std::fs::write(&leftover, b"partial snapshot").unwrap();
    let o = awp(bob.path(), &["doctor", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["running"], false);
    let store: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "store")
        .collect();
    assert_eq!(store.len(), 1, "{v:#}");
    assert_eq!(store[0]["level"], "problem");
    assert_eq!(store[0]["fixable"], true);
    assert_eq!(store[0]["path"], leftover.display().to_string());
    assert!(leftover.exists(), "doctor without --fix changes nothing");

    let o = awp(bob.path(), &["doctor", "--fix"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(!leftover.exists());
    assert_eq!(quarantined(&bob).len(), 1);

    // While a node runs: reported as running, exit 0, nothing moved.
    let running = TestNode::start_in(bob, "bob@test").await;
    let leftover2 = running.path().join("db/snap.00000000FFFFFFFE.generating");
    std::fs::write(&leftover2, b"being written").unwrap();
    let o = awp(&running.path(), &["doctor", "--json", "--fix"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    assert_eq!(v["running"], true);
    assert!(leftover2.exists(), "left alone while the node runs");
    let bob = running.stop().await;
    std::fs::remove_file(&leftover2).unwrap();
    starts_with_every_line(bob, &ids).await;
}
