//! Blobs between two nodes over real TLS, and against a raw peer (protocol-notes §Blobs).

mod common;

use awp_node::control::Request;
use awp_node::node::{NodeConfig, NodeHandle};
use awp_node::wire::{self, b64, Line};
use common::*;
use rand::RngCore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;
use tempfile::TempDir;

async fn start_limited(name: &str, limit: u64) -> TestNode {
    let home = TempDir::new().unwrap();
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        blob_limit: Some(limit),
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}

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

async fn send_files(from: &TestNode, to: &str, files: &[String]) -> Value {
    let r = from
        .ctl(Request::Send {
            peer: Some(to.into()),
            th: None,
            subject: Some("files".into()),
            re: None,
            parts: vec![json!({"k":"text","text":"attached"})],
            files: files.to_vec(),
            wait_ack_ms: None,
        })
        .await;
    assert!(r.ok, "send failed: {:?}", r.error);
    Value::Object(r.body)
}

async fn blobs(node: &TestNode) -> Vec<Value> {
    let r = node
        .ctl(Request::Blobs {
            peer: None,
            blob_ref: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    r.body["blobs"].as_array().cloned().unwrap_or_default()
}

fn by_ref<'a>(list: &'a [Value], r: &str) -> Option<&'a Value> {
    list.iter().find(|b| b["ref"] == r)
}

/// The listing entry of blob `r` at `node` once it is complete (waits up to `secs`).
async fn completed(node: &TestNode, r: &str, secs: u64) -> Value {
    eventually(secs, || async {
        let l = blobs(node).await;
        by_ref(&l, r).filter(|x| x["status"] == "complete").cloned()
    })
    .await
}

#[tokio::test]
async fn files_arrive_identical_and_are_listed_on_both_sides() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let dir = TempDir::new().unwrap();
    let (big, big_sha) = random_file(dir.path(), "big.bin", 3 * 1024 * 1024 + 17);
    let (small, small_sha) = random_file(dir.path(), "small.txt", 100);
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let empty = empty.display().to_string();
    let reply = send_files(&a, "bob@test", &[big.clone(), small, empty]).await;
    let sent = reply["blobs"].as_array().unwrap().clone();
    assert_eq!(sent.len(), 3);
    let chunks = (3 * 1024 * 1024 + 17usize).div_ceil(awp_node::blob::CHUNK_SIZE);
    assert_eq!(sent[0]["chunks"], chunks);
    assert_eq!(sent[0]["sha256"], big_sha.as_str());

    for (i, want) in [&big_sha, &small_sha, &sha_hex(b"")].iter().enumerate() {
        let r = sent[i]["ref"].as_str().unwrap().to_string();
        let got = completed(&b, &r, 20).await;
        assert_eq!(got["dir"], "in");
        assert_eq!(got["sha256"], want.as_str());
        let path = got["path"].as_str().unwrap();
        assert!(path.starts_with(&b.path().join("blobs").display().to_string()));
        assert_eq!(&sha_hex(&std::fs::read(path).unwrap()), *want);
    }
    // The sender lists them as sent once the msg is acked; the outbox is empty.
    eventually(10, || async {
        let l = blobs(&a).await;
        l.iter()
            .all(|x| x["dir"] == "out" && x["status"] == "sent" && x["chunks_acked"] == x["chunks"])
            .then_some(())
    })
    .await;
    let big_out = by_ref(&blobs(&a).await, sent[0]["ref"].as_str().unwrap())
        .cloned()
        .unwrap();
    assert_eq!(big_out["path"], big.as_str());
    assert_eq!(big_out["size"], 3 * 1024 * 1024 + 17);
    assert_eq!(a.ctl(Request::Status).await.body["outbox"], 0);
    // The receiver's msg names the three blobs.
    let msgs = b.inbound().await;
    let parts = msgs[0]["line"]["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 4);
    assert_eq!(parts[1]["k"], "blob");
    assert_eq!(parts[1]["name"], "big.bin");
}

/// On a runtime with worker threads (as the daemon runs), large commits run in
/// `block_in_place` and large write batches in a task of their own (issue 10): several
/// blobs of many chunks each still arrive byte-identical, and the outbox empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_arrive_identical_on_a_multi_thread_runtime() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let dir = TempDir::new().unwrap();
    let len = 6 * awp_node::blob::CHUNK_SIZE + 5;
    let files: Vec<(String, String)> = (0..3)
        .map(|i| random_file(dir.path(), &format!("f{i}.bin"), len))
        .collect();
    let paths: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    let reply = send_files(&a, "bob@test", &paths).await;
    let sent = reply["blobs"].as_array().unwrap().clone();
    assert_eq!(sent.len(), 3);
    for (i, (_, want)) in files.iter().enumerate() {
        let r = sent[i]["ref"].as_str().unwrap().to_string();
        let got = completed(&b, &r, 30).await;
        assert_eq!(got["sha256"], want.as_str());
        let data = std::fs::read(got["path"].as_str().unwrap()).unwrap();
        assert_eq!(data.len(), len);
        assert_eq!(&sha_hex(&data), want);
    }
    eventually(10, || async {
        (a.ctl(Request::Status).await.body["outbox"] == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn over_limit_is_refused_and_the_sender_drops_the_chunks() {
    let a = TestNode::start("alice@test").await;
    let b = start_limited("bob@test", 1024 * 1024).await;
    a.connect(&b).await;
    let dir = TempDir::new().unwrap();
    let (big, _) = random_file(dir.path(), "big.bin", 4 * 1024 * 1024);
    let reply = send_files(&a, "bob@test", &[big]).await;
    let r = reply["blobs"][0]["ref"].as_str().unwrap().to_string();
    let out = eventually(20, || async {
        let l = blobs(&a).await;
        by_ref(&l, &r).filter(|x| x["status"] == "refused").cloned()
    })
    .await;
    assert_eq!(out["dir"], "out");
    let inb = eventually(10, || async {
        let l = blobs(&b).await;
        by_ref(&l, &r).filter(|x| x["status"] == "refused").cloned()
    })
    .await;
    assert!(inb["reason"].as_str().unwrap().contains("limit"), "{inb}");
    // Nothing of it stays on the receiver's disk, and the sender's outbox empties (the
    // msg is still delivered and acked; the rest of the chunks were dropped).
    eventually(10, || async {
        (a.ctl(Request::Status).await.body["outbox"] == 0).then_some(())
    })
    .await;
    let partial = b.path().join("blobs");
    let leftovers: Vec<_> = walk(&partial).into_iter().filter(|p| p.is_file()).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(b.inbound().await.len(), 1, "the msg itself arrives");
    // A file over the sender's own limit is refused at once with bad_request.
    let small = start_limited("carol@test", 10).await;
    let (f, _) = random_file(dir.path(), "eleven", 11);
    small.connect(&b).await;
    let r = small
        .ctl(Request::Send {
            peer: Some("bob@test".into()),
            th: None,
            subject: None,
            re: None,
            parts: vec![],
            files: vec![f],
            wait_ack_ms: None,
        })
        .await;
    assert!(!r.ok);
    assert_eq!(r.error.unwrap().code, "bad_request");
}

fn walk(p: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                out.extend(walk(&path));
            }
            out.push(path);
        }
    }
    out
}

/// The handshake of [`Raw`], returning the node's resume.
async fn handshake(raw: &mut Raw) -> wire::Resume {
    let mine = raw.hello(0);
    raw.write(&mine).await;
    let theirs = raw.read().await.expect("node hello");
    let sig = raw
        .identity
        .sign(&awp_node::identity::auth_transcript(&mine, &theirs));
    let auth = Line::Auth(wire::Auth {
        id: "01K00000000000000000000001".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        sig: b64::encode_url(&sig),
        grants: vec![],
    });
    raw.write(&auth.encode()).await;
    assert_eq!(raw.read_line().await.unwrap().kind(), "auth");
    match raw.read_line().await {
        Some(Line::Resume(r)) => r,
        other => panic!("expected resume, got {other:?}"),
    }
}

fn chunk(id: u32, r: &str, n: u64, last: bool, data: &[u8]) -> Vec<u8> {
    Line::Chunk(wire::Chunk {
        id: format!("01K000000000000000000{id:05}"),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: Some("thr_raw".into()),
        blob_ref: r.into(),
        n,
        last,
        data: b64::encode_std(data),
    })
    .encode()
}

#[tokio::test]
async fn dropped_connection_resumes_from_seen_without_duplicate_bytes() {
    let b = TestNode::start("bob@test").await;
    let mut data = vec![0u8; 5 * 1000];
    rand::thread_rng().fill_bytes(&mut data);
    let pieces: Vec<&[u8]> = data.chunks(1000).collect();

    // First connection: chunks 0..3, then the connection drops.
    let mut raw = Raw::dial(&b.address(), 9).await;
    handshake(&mut raw).await;
    for (n, p) in pieces.iter().enumerate().take(3) {
        raw.write(&chunk(100 + n as u32, "r1", n as u64, false, p))
            .await;
    }
    eventually(10, || async {
        let l = blobs(&b).await;
        by_ref(&l, "r1").filter(|x| x["bytes"] == 3000).map(|_| ())
    })
    .await;
    drop(raw);

    // Second connection: the node's seen covers chunk 2, so a sender resumes at 3.
    let mut raw = Raw::dial(&b.address(), 9).await;
    let resume = handshake(&mut raw).await;
    assert_eq!(resume.seen["thr_raw"], "01K00000000000000000000102");
    // A replay of chunk 1 (a sender that ignored seen) is ignored, not appended.
    raw.write(&chunk(101, "r1", 1, false, pieces[1])).await;
    raw.write(&chunk(103, "r1", 3, false, pieces[3])).await;
    raw.write(&chunk(104, "r1", 4, true, pieces[4])).await;
    let msg = Line::Msg(wire::Msg {
        id: "01K00000000000000000000200".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: "thr_raw".into(),
        re: None,
        subject: None,
        parts: vec![wire::Part::Blob(wire::BlobPart {
            blob_ref: "r1".into(),
            size: data.len() as u64,
            name: Some("../../etc/passwd".into()),
            mime: None,
        })],
    });
    raw.write(&msg.encode()).await;
    loop {
        match raw.read_line().await.expect("an ack") {
            Line::Ack(a) if a.re == "01K00000000000000000000200" => break,
            Line::Err(e) => panic!("unexpected err {e:?}"),
            _ => {}
        }
    }
    let got = completed(&b, "r1", 10).await;
    let path = got["path"].as_str().unwrap();
    assert!(path.ends_with("/passwd"), "{path}");
    assert!(path.starts_with(&b.path().display().to_string()));
    assert_eq!(std::fs::read(path).unwrap(), data);
}

#[tokio::test]
async fn refused_chunk_gets_blob_refused_and_the_connection_stays_open() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 9).await;
    handshake(&mut raw).await;
    // A gap (n = 1 first), then bad base64 on another ref, then a ping.
    raw.write(&chunk(100, "gap", 1, false, b"x")).await;
    let bad = br#"{"t":"chunk","id":"01K00000000000000000000101","ts":"2026-01-01T00:00:00.000Z","th":"thr_raw","ref":"bad","n":0,"last":true,"data":"%%%"}"#;
    raw.write(bad).await;
    raw.write(br#"{"t":"ping","id":"p1","ts":"2026-01-01T00:00:00Z"}"#)
        .await;
    let mut refused = vec![];
    let mut pong = false;
    while refused.len() < 2 || !pong {
        match raw.read_line().await.expect("answers") {
            Line::Err(e) => {
                assert_eq!(e.code, "blob_refused");
                refused.push((e.blob_ref.unwrap(), e.re.unwrap()));
            }
            Line::Pong(_) => pong = true,
            _ => {}
        }
    }
    refused.sort();
    assert_eq!(
        refused,
        [
            ("bad".to_string(), "01K00000000000000000000101".to_string()),
            ("gap".to_string(), "01K00000000000000000000100".to_string())
        ]
    );
}

#[tokio::test]
async fn receiver_restarted_mid_transfer_completes_without_duplicate_bytes() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let dir = TempDir::new().unwrap();
    let (big, sha) = random_file(dir.path(), "big.bin", 12 * 1024 * 1024);
    // Stop the receiver while chunks are in flight: the sender's outbox replays from the
    // receiver's seen, and the receiver writes at its recorded offset.
    let reply = send_files(&a, "bob@test", &[big]).await;
    let r = reply["blobs"][0]["ref"].as_str().unwrap().to_string();
    eventually(20, || async {
        let l = blobs(&b).await;
        by_ref(&l, &r)
            .filter(|x| x["bytes"].as_u64().unwrap_or(0) > 0)
            .map(|_| ())
    })
    .await;
    let home = b.stop().await;
    let b = TestNode::start_in(home, "bob@test").await;
    a.connect(&b).await;
    let got = completed(&b, &r, 30).await;
    assert_eq!(got["sha256"], sha.as_str());
    let bytes = std::fs::read(got["path"].as_str().unwrap()).unwrap();
    assert_eq!(bytes.len(), 12 * 1024 * 1024);
    assert_eq!(sha_hex(&bytes), sha);
}

#[tokio::test]
async fn sender_drops_queued_chunks_on_blob_refused() {
    let a = TestNode::start("alice@test").await;
    let mut raw = Raw::dial(&a.address(), 9).await;
    handshake(&mut raw).await;
    // Our resume starts the node's replay of its outbox to us.
    raw.write(br#"{"t":"resume","id":"01K00000000000000000000002","ts":"2026-01-01T00:00:00.000Z","seen":{}}"#)
        .await;
    let dir = TempDir::new().unwrap();
    let (big, _) = random_file(dir.path(), "big.bin", 16 * 1024 * 1024);
    let reply = send_files(&a, &raw.identity.key().to_string(), &[big]).await;
    let r = reply["blobs"][0]["ref"].as_str().unwrap().to_string();
    let total = reply["blobs"][0]["chunks"].as_u64().unwrap();
    assert_eq!(
        total as usize,
        (16usize * 1024 * 1024).div_ceil(awp_node::blob::CHUNK_SIZE)
    );
    // Refuse at the first chunk, then count what still comes.
    let first = loop {
        match raw.read_line().await.expect("a chunk") {
            Line::Chunk(c) => break c,
            _ => continue,
        }
    };
    assert_eq!((first.blob_ref.as_str(), first.n), (r.as_str(), 0));
    let refuse = Line::Err(wire::ErrLine {
        id: "01K00000000000000000000300".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: first.th.clone(),
        re: Some(first.id.clone()),
        code: "blob_refused".into(),
        detail: Some("no thanks".into()),
        blob_ref: Some(r.clone()),
    });
    raw.write(&refuse.encode()).await;
    let mut more = 0;
    let msg = loop {
        match raw.read_line().await.expect("the msg") {
            Line::Chunk(_) => more += 1,
            Line::Msg(m) => break m,
            _ => {}
        }
    };
    assert!(
        more + 1 < total,
        "chunks kept coming after blob_refused: {more} of {total}"
    );
    let out = by_ref(&blobs(&a).await, &r).cloned().unwrap();
    assert_eq!(out["status"], "refused");
    // The msg is still delivered; its ack empties the outbox.
    let ack = Line::Ack(wire::Ack {
        id: "01K00000000000000000000301".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: msg.th.clone(),
        re: msg.id.clone(),
    });
    raw.write(&ack.encode()).await;
    eventually(10, || async {
        (a.ctl(Request::Status).await.body["outbox"] == 0).then_some(())
    })
    .await;
}
