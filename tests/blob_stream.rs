//! Streamed blobs (issue 10 §3, issue 8 §4): the data of a sent file is on disk once (read
//! from the file when its chunks are written, never copied into the outbox or the out
//! log), a file that changed after `send` is not sent, and a receiver SIGKILLed in the
//! middle of a 50 MiB blob resumes it to a byte-identical file.

mod common;

use awp_node::control::Request;
use common::*;
use rand::RngCore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;

fn random_file(dir: &Path, name: &str, len: usize) -> (String, String) {
    let mut data = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut data);
    let p = dir.join(name);
    std::fs::write(&p, &data).unwrap();
    (p.display().to_string(), sha_hex(&data))
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

async fn send_file(from: &Path, to: &str, file: &str) -> Value {
    let r = ctl(
        from,
        Request::Send {
            peer: Some(to.into()),
            th: None,
            subject: Some("file".into()),
            re: None,
            parts: vec![json!({"k":"text","text":"attached"})],
            files: vec![file.to_string()],
            wait_ack_ms: None,
        },
    )
    .await;
    assert!(r.ok, "send failed: {:?}", r.error);
    Value::Object(r.body)
}

async fn blob_row(home: &Path, r: &str) -> Option<Value> {
    let l = ctl(
        home,
        Request::Blobs {
            peer: None,
            blob_ref: Some(r.to_string()),
        },
    )
    .await;
    if !l.ok {
        return None;
    }
    l.body["blobs"].as_array()?.first().cloned()
}

/// Bytes allocated on disk under `dir` (blocks, so sparse or preallocated files count as
/// what they really take).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                n += disk_bytes(&e.path());
            } else {
                n += m.blocks() * 512;
            }
        }
    }
    n
}

/// Issue 8 §4: a 20 MiB file sent node to node costs the two homes together less than
/// 1.3 × its size (the received file itself is 1 ×). Chunk lines used to be stored in
/// the sender's outbox and again in its out log (2 × more).
#[tokio::test]
async fn a_sent_file_is_stored_once() {
    const LEN: usize = 20 * 1024 * 1024;
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let dir = TempDir::new().unwrap();
    let (file, sha) = random_file(dir.path(), "twenty.bin", LEN);
    let reply = send_file(&a.path(), "bob@test", &file).await;
    let r = reply["blobs"][0]["ref"].as_str().unwrap().to_string();
    let got = eventually(60, || async {
        blob_row(&b.path(), &r)
            .await
            .filter(|x| x["status"] == "complete")
    })
    .await;
    assert_eq!(got["sha256"], sha.as_str());
    eventually(20, || async {
        blob_row(&a.path(), &r)
            .await
            .filter(|x| x["status"] == "sent")
    })
    .await;
    let (sa, sb) = (disk_bytes(&a.path()), disk_bytes(&b.path()));
    eprintln!("after a {LEN}-byte blob: sender home {sa} bytes, receiver home {sb} bytes");
    assert!(
        ((sa + sb) as f64) < 1.3 * LEN as f64,
        "homes hold {} bytes for a {LEN}-byte blob (sender {sa}, receiver {sb})",
        sa + sb
    );
}

/// A file changed after `send` queued it is not sent: the sender's blob is refused with
/// the reason, the msg naming it leaves the outbox (nothing of it goes out), and the
/// thread holds an `err blob_refused` about the msg.
#[tokio::test]
async fn a_file_changed_after_send_is_refused_not_sent() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    // Meet bob, then stop him so the send stays queued.
    a.connect(&b).await;
    let b_home = b.stop().await;
    let dir = TempDir::new().unwrap();
    let (file, _) = random_file(dir.path(), "draft.bin", 3 * 1024 * 1024);
    let reply = send_file(&a.path(), "bob@test", &file).await;
    let r = reply["blobs"][0]["ref"].as_str().unwrap().to_string();
    let msg_th = reply["th"].as_str().unwrap().to_string();
    let msg_id = reply["id"].as_str().unwrap().to_string();
    // Same size, other bytes, a later modification time.
    std::thread::sleep(Duration::from_millis(20));
    random_file(dir.path(), "draft.bin", 3 * 1024 * 1024);
    let b = TestNode::start_in(b_home, "bob@test").await;
    a.connect(&b).await;
    let out = eventually(20, || async {
        blob_row(&a.path(), &r)
            .await
            .filter(|x| x["status"] == "refused")
    })
    .await;
    assert!(out["reason"].as_str().unwrap().contains("changed"), "{out}");
    eventually(10, || async {
        (a.ctl(Request::Status).await.body["outbox"] == 0).then_some(())
    })
    .await;
    // The refusal is in the thread, about the msg.
    let entries = ctl(
        &a.path(),
        Request::Read {
            th: Some(msg_th.clone()),
            mark: false,
        },
    )
    .await;
    assert!(entries.ok, "{:?}", entries.error);
    let errs: Vec<&Value> = entries.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["t"] == "err")
        .collect();
    assert_eq!(errs.len(), 1, "{:?}", entries.body);
    assert_eq!(errs[0]["line"]["code"], "blob_refused");
    assert_eq!(errs[0]["line"]["re"], msg_id.as_str());
    // Nothing of it reached bob: no msg, no complete blob.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b.inbound().await.iter().all(|e| e["t"] != "msg"));
    let inb = blob_row(&b.path(), &r).await;
    assert!(
        inb.as_ref().is_none_or(|x| x["status"] != "complete"),
        "{inb:?}"
    );
}

/// Issue 10 "Done when": the receiving daemon is SIGKILLed during a 50 MiB blob receive;
/// restarted, it resumes the blob to a byte-identical file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_receiver_resumes_a_50_mib_blob_byte_identical() {
    const LEN: usize = 50 * 1024 * 1024;
    let b_home = TempDir::new().unwrap();
    let port = free_port();
    let mut b = start_daemon(b_home.path(), port);
    let status = wait_ready(b_home.path()).await;
    let b_key = status["key"].as_str().unwrap().to_string();
    let b_addr = format!("tls:127.0.0.1:{port}#{b_key}");
    let a = TestNode::start("alice@test").await;
    let r = a
        .ctl(Request::Connect {
            address: b_addr,
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);

    let dir = TempDir::new().unwrap();
    let (file, sha) = random_file(dir.path(), "fifty.bin", LEN);
    let reply = send_file(&a.path(), &b_key, &file).await;
    let r = reply["blobs"][0]["ref"].as_str().unwrap().to_string();

    // Kill the receiver once part of the blob is in its partial file (bounded wait).
    let partial_dir = b_home.path().join("blobs");
    let partial_bytes = || -> u64 {
        let mut n = 0;
        if let Ok(peers) = std::fs::read_dir(&partial_dir) {
            for p in peers.flatten() {
                if let Ok(files) = std::fs::read_dir(p.path().join(".partial")) {
                    for f in files.flatten() {
                        n += f.metadata().map(|m| m.len()).unwrap_or(0);
                    }
                }
            }
        }
        n
    };
    let mut seen = 0;
    for _ in 0..6000 {
        seen = partial_bytes();
        if seen >= 4 * 1024 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        seen > 0 && seen < LEN as u64,
        "partial data at the kill: {seen} bytes"
    );
    b.kill().unwrap();
    b.wait().unwrap();
    eprintln!("killed the receiver with {seen} bytes of {LEN} in its partial file");
    b = start_daemon(b_home.path(), port);
    wait_ready(b_home.path()).await;

    let got = eventually(120, || async {
        blob_row(b_home.path(), &r)
            .await
            .filter(|x| x["status"] == "complete")
    })
    .await;
    assert_eq!(got["sha256"], sha.as_str());
    let path = got["path"].as_str().unwrap();
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len(), LEN);
    assert_eq!(sha_hex(&bytes), sha, "the resumed file differs");
    let _ = b.kill();
    let _ = b.wait();
}
