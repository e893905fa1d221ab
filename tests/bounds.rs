//! One peer cannot take what others need, and a thread is (peer, th) (issue 8 §4, §4b).
//! Nodes in temp homes on 127.0.0.1; raw peers speak lines by hand.

mod common;

use awp_node::control::{self, Request};
use common::{Raw, TestNode};
use serde_json::{json, Value};
use std::time::Duration;

const RESUME: &[u8] =
    br#"{"t":"resume","id":"01K000000000000000000000FF","ts":"2026-01-01T00:00:00.000Z","seen":{}}"#;

/// A raw peer of `node` with hello name `name`, handshake and resume done.
async fn raw_peer(node: &TestNode, seed: u8, name: &str) -> Raw {
    let mut raw = Raw::dial(&node.address(), seed).await;
    let h = raw.hello_full(0, name, None);
    raw.handshake_with(h).await;
    raw.write(RESUME).await;
    raw
}

/// A msg line in `th` from a raw peer.
fn msg_line(id: &str, th: &str, subject: &str, text: &str) -> Vec<u8> {
    json!({"t": "msg", "id": id, "ts": "2026-01-01T00:00:00.000Z", "th": th,
        "subject": subject, "parts": [{"k": "text", "text": text}]})
    .to_string()
    .into_bytes()
}

/// Lines from `raw` until an ack of `re` (at most 20 lines).
async fn acked(raw: &mut Raw, re: &str) {
    for _ in 0..20 {
        let l = raw.read().await.expect("a line before the ack");
        let v: Value = serde_json::from_slice(&l).unwrap();
        if v["t"] == "ack" && v["re"] == re {
            return;
        }
    }
    panic!("no ack of {re}");
}

/// Lines from `raw` until a msg (at most 20 lines); that msg.
async fn next_msg(raw: &mut Raw) -> Value {
    for _ in 0..20 {
        let l = raw.read().await.expect("a msg");
        let v: Value = serde_json::from_slice(&l).unwrap();
        if v["t"] == "msg" {
            return v;
        }
    }
    panic!("no msg");
}

/// `tail --once` by hand: the history events of a subscription until `caught_up`.
async fn tail_once(node: &TestNode, th: &str, peer: Option<&str>) -> Result<Vec<Value>, String> {
    let sock = awp_node::daemon::socket_path(node.home.path());
    let req = Request::Subscribe {
        th: Some(th.into()),
        peer: peer.map(str::to_string),
        from_seq: Some(0),
    };
    let mut sub = match control::subscribe(&sock, &req).await {
        Ok(s) => s,
        Err(control::ClientError::Refused(e)) => return Err(e.code),
        Err(e) => panic!("subscribe: {e}"),
    };
    let mut out = Vec::new();
    for _ in 0..100 {
        let ev = tokio::time::timeout(Duration::from_secs(10), sub.next_event())
            .await
            .expect("events in time")
            .unwrap()
            .expect("stream open");
        match ev.get("event").and_then(Value::as_str) {
            Some("caught_up") => return Ok(out),
            Some("line") => out.push(Value::Object(ev)),
            _ => {}
        }
    }
    panic!("no caught_up");
}

async fn read(node: &TestNode, th: &str) -> Result<Vec<Value>, String> {
    let r = node
        .ctl(Request::Read {
            th: Some(th.into()),
            mark: false,
        })
        .await;
    match r.ok {
        true => Ok(r.body["entries"].as_array().cloned().unwrap_or_default()),
        false => Err(r.error.unwrap().code),
    }
}

async fn send(node: &TestNode, peer: Option<&str>, th: &str) -> Result<Value, String> {
    let r = node
        .ctl(Request::Send {
            peer: peer.map(str::to_string),
            th: Some(th.into()),
            subject: None,
            re: None,
            parts: vec![json!({"k": "text", "text": "answer"})],
            files: vec![],
            wait_ack_ms: None,
        })
        .await;
    match r.ok {
        true => Ok(Value::Object(r.body)),
        false => Err(r.error.unwrap().code),
    }
}

/// Regression (issue 8 §4b): a second peer's thread with an id another peer already used
/// was stored but missing from `threads`, `read TH`, `tail -t TH`, and could not be
/// answered ("thread … is with <other key>").
#[tokio::test]
async fn two_raw_peers_using_the_same_th_both_have_a_thread_listed_read_tailed_and_answered() {
    let node = TestNode::start("n").await;
    let mut alice = raw_peer(&node, 31, "alice@test").await;
    let mut bob = raw_peer(&node, 32, "bob@test").await;
    let (akey, bkey) = (
        alice.identity.key().to_string(),
        bob.identity.key().to_string(),
    );

    alice
        .write(&msg_line(
            "01K10000000000000000000001",
            "shared",
            "from alice",
            "a1",
        ))
        .await;
    acked(&mut alice, "01K10000000000000000000001").await;
    bob.write(&msg_line(
        "01K10000000000000000000002",
        "shared",
        "from bob",
        "b1",
    ))
    .await;
    acked(&mut bob, "01K10000000000000000000002").await;

    // Listed: one thread per peer, each with its own subject and unread count.
    let r = node.ctl(Request::Threads).await;
    assert!(r.ok, "{:?}", r.error);
    let threads = r.body["threads"].as_array().unwrap().clone();
    let of = |key: &str| {
        threads
            .iter()
            .find(|t| t["th"] == "shared" && t["peer"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("no thread of {key}: {threads:?}"))
    };
    assert_eq!(of(&akey)["subject"], "from alice");
    assert_eq!(of(&bkey)["subject"], "from bob");
    assert_eq!(of(&bkey)["unread"], 1);

    // Read: the bare id names two threads; PEER/TH (name or key) names one.
    assert_eq!(read(&node, "shared").await.unwrap_err(), "ambiguous_thread");
    let a = read(&node, "alice/shared").await.unwrap();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["peer"], akey.as_str());
    let b = read(&node, &format!("{bkey}/shared")).await.unwrap();
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0]["line"]["subject"], "from bob");

    // Tail: by PEER/TH, or TH with the peer filter.
    let t = tail_once(&node, "bob/shared", None).await.unwrap();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0]["peer"], bkey.as_str());
    let t = tail_once(&node, "shared", Some("alice")).await.unwrap();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0]["peer"], akey.as_str());
    assert_eq!(
        tail_once(&node, "shared", None).await.unwrap_err(),
        "ambiguous_thread"
    );

    // Answerable: with the peer argument, and as PEER/TH; each answer reaches its peer.
    let sent = send(&node, Some("bob"), "shared").await.unwrap();
    assert_eq!(sent["th"], "shared");
    let m = next_msg(&mut bob).await;
    assert_eq!(m["th"], "shared");
    assert_eq!(m["parts"][0]["text"], "answer");
    send(&node, None, "alice/shared").await.unwrap();
    let m = next_msg(&mut alice).await;
    assert_eq!(m["th"], "shared");
    assert_eq!(
        send(&node, None, "shared").await.unwrap_err(),
        "ambiguous_thread"
    );

    // Each thread keeps its own states: bob's state does not touch alice's thread.
    bob.write(
        &json!({"t": "state", "id": "01K10000000000000000000003", "ts": "2026-01-01T00:00:00.000Z",
            "th": "shared", "state": "done"})
        .to_string()
        .into_bytes(),
    )
    .await;
    acked(&mut bob, "01K10000000000000000000003").await;
    let r = node.ctl(Request::Threads).await;
    let threads = r.body["threads"].as_array().unwrap().clone();
    for t in &threads {
        let want = if t["peer"] == bkey.as_str() {
            json!("done")
        } else {
            Value::Null
        };
        assert_eq!(t["theirs"], want, "{t:?}");
    }
    node.stop().await;
}

/// Lines from `raw` until an ack of or an err about `re` (at most 20 lines): `Ok(())` for
/// the ack, `Err(code)` for the err.
async fn answer(raw: &mut Raw, re: &str) -> Result<(), String> {
    for _ in 0..20 {
        let l = raw.read().await.expect("an answer");
        let v: Value = serde_json::from_slice(&l).unwrap();
        if v["re"] == re {
            match v["t"].as_str() {
                Some("ack") => return Ok(()),
                Some("err") => return Err(v["code"].as_str().unwrap_or("").to_string()),
                _ => {}
            }
        }
    }
    panic!("no answer about {re}");
}

/// Issue 8 §4: threads are a per-peer table with a bound. A peer at its bound cannot open
/// another (`err busy`, not stored, not acked) but keeps talking in its threads; another
/// peer is not affected.
#[tokio::test]
async fn a_peer_at_its_thread_bound_gets_err_busy_for_a_new_thread_and_nothing_is_stored() {
    let home = tempfile::TempDir::new().unwrap();
    let handle = awp_node::node::NodeHandle::start(awp_node::node::NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("n".into()),
        max_threads_per_peer: Some(3),
        ..Default::default()
    })
    .await
    .unwrap();
    let node = TestNode { home, handle };
    let mut greedy = raw_peer(&node, 41, "greedy@test").await;
    for i in 0..3 {
        let id = format!("01K2000000000000000000000{i}");
        greedy
            .write(&msg_line(&id, &format!("t{i}"), "s", "x"))
            .await;
        assert_eq!(answer(&mut greedy, &id).await, Ok(()));
    }
    let over = "01K20000000000000000000009";
    greedy.write(&msg_line(over, "t9", "s", "x")).await;
    assert_eq!(answer(&mut greedy, over).await, Err("busy".into()));
    // Still heard in its own threads.
    let more = "01K2000000000000000000000A";
    greedy.write(&msg_line(more, "t1", "s", "y")).await;
    assert_eq!(answer(&mut greedy, more).await, Ok(()));
    // The refused line was not stored: no thread, no log entry; a replay is refused again.
    let r = node.ctl(Request::Threads).await;
    let ths: Vec<&str> = r.body["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["th"].as_str())
        .collect();
    assert_eq!(ths.len(), 3, "{ths:?}");
    assert!(!ths.contains(&"t9"));
    assert!(node
        .inbound()
        .await
        .iter()
        .all(|e| e["id"].as_str() != Some(over)));
    greedy.write(&msg_line(over, "t9", "s", "x")).await;
    assert_eq!(answer(&mut greedy, over).await, Err("busy".into()));
    // Another peer opens threads as before.
    let mut other = raw_peer(&node, 42, "other@test").await;
    let id = "01K20000000000000000000010";
    other.write(&msg_line(id, "t9", "s", "x")).await;
    assert_eq!(answer(&mut other, id).await, Ok(()));
    node.stop().await;
}
