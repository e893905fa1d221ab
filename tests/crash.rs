//! Crash safety: the receiving node is SIGKILLed repeatedly while a stream of messages
//! arrives; afterwards every message the sender saw acked is on the receiver's disk, and
//! every message arrives exactly once.

mod common;

use awp_node::control::Request;
use common::*;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_receiver_loses_no_acked_message() {
    const N: usize = 300;
    let b_home = tempfile::TempDir::new().unwrap();
    let port = free_port();
    let mut b = start_daemon(b_home.path(), port);
    let status = wait_ready(b_home.path()).await;
    let b_key = status["key"].as_str().unwrap().to_string();
    let b_addr = format!("tls:127.0.0.1:{port}#{b_key}");

    let a = TestNode::start("alice@test").await;
    let r = a
        .ctl(Request::Connect {
            address: b_addr.clone(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);

    // Collect the ids Alice sees acked.
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut events = a.handle.subscribe();
    let acked2 = acked.clone();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            if ev.get("event").and_then(Value::as_str) == Some("ack") {
                if let Some(re) = ev.get("re").and_then(Value::as_str) {
                    acked2.lock().unwrap().insert(re.to_string());
                }
            }
        }
    });

    let first = a.send(Some(&b_key), None, "m0").await;
    let th = first["th"].as_str().unwrap().to_string();
    let mut sent = vec![first["id"].as_str().unwrap().to_string()];
    let mut kills = 0;
    let mut acked_at_kill: Vec<HashSet<String>> = vec![];
    for i in 1..N {
        let r = a.send(None, Some(&th), &format!("m{i}")).await;
        sent.push(r["id"].as_str().unwrap().to_string());
        if i % 75 == 0 {
            // Let some acks flow, then kill the receiver mid-stream.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let snapshot = acked.lock().unwrap().clone();
            b.kill().unwrap();
            b.wait().unwrap();
            kills += 1;
            acked_at_kill.push(snapshot);
            b = start_daemon(b_home.path(), port);
            wait_ready(b_home.path()).await;
        }
    }
    assert_eq!(kills, 3);
    // Everything eventually lands.
    eventually(60, || async {
        let s = a.ctl(Request::Status).await;
        (s.body["outbox"] == 0).then_some(())
    })
    .await;
    let r = ctl(
        b_home.path(),
        Request::Read {
            th: Some(th.clone()),
            mark: false,
        },
    )
    .await;
    assert!(r.ok, "{:?}", r.error);
    let got: Vec<String> = r.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["t"] == "msg")
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &got {
        *counts.entry(id).or_default() += 1;
    }
    assert!(
        counts.values().all(|&c| c == 1),
        "a message was stored twice"
    );
    let got_set: HashSet<&str> = got.iter().map(String::as_str).collect();
    for snapshot in &acked_at_kill {
        for id in snapshot {
            assert!(
                got_set.contains(id.as_str()),
                "acked {id} missing after SIGKILL"
            );
        }
    }
    let missing: Vec<&String> = sent
        .iter()
        .filter(|id| !got_set.contains(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "{} of {N} never arrived", missing.len());
    // In order, too.
    let order: Vec<&String> = got.iter().collect();
    let sent_order: Vec<&String> = sent.iter().collect();
    assert_eq!(order, sent_order);
    let _ = b.kill();
    let _ = b.wait();
}
