//! Served requests (exec, fs:read, fs:write) between two nodes over TLS: refused without a
//! grant (ack, then err forbidden), served with one, confined to the root.

mod common;

use awp_node::control::Request;
use awp_node::node::{NodeConfig, NodeHandle};
use common::*;
use serde_json::{json, Value};
use tempfile::TempDir;

async fn serving_node(root: &std::path::Path) -> TestNode {
    let home = TempDir::new().unwrap();
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("server@test".into()),
        serve: vec!["exec".into(), "fs:read".into(), "fs:write".into()],
        root: Some(root.to_path_buf()),
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}

async fn request(
    from: &TestNode,
    to: &str,
    th: Option<&str>,
    mime: &str,
    data: Value,
) -> (String, String) {
    let r = from
        .ctl(Request::Send {
            peer: th.is_none().then(|| to.to_string()),
            th: th.map(str::to_string),
            subject: Some("request".into()),
            re: None,
            parts: vec![json!({"k": "data", "mime": mime, "data": data})],
            wait_ack_ms: Some(10_000),
            files: vec![],
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    // Acked; a refusal right after the ack makes it `refused` (with the err's code).
    assert!(
        matches!(r.body["status"].as_str(), Some("delivered" | "refused")),
        "the request itself is acked: {:?}",
        r.body
    );
    (
        r.body["id"].as_str().unwrap().into(),
        r.body["th"].as_str().unwrap().into(),
    )
}

/// The result msg answering `re`, as its data part.
async fn result_for(n: &TestNode, re: &str) -> Value {
    eventually(10, || async {
        n.inbound()
            .await
            .into_iter()
            .find(|e| e["line"]["re"] == re)
            .map(|e| e["line"]["parts"][0].clone())
    })
    .await
}

#[tokio::test]
async fn requests_need_the_capability_and_stay_in_the_root() {
    let root = TempDir::new().unwrap();
    std::fs::write(root.path().join("hello.txt"), "hi there").unwrap();
    let server = serving_node(root.path()).await;
    let client = TestNode::start("client@test").await;
    let r = client
        .ctl(Request::Connect {
            address: server.address(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let mut events = client.handle.subscribe();

    // No grant: the msg is acked, then err forbidden with re = its id.
    let (id, th) = request(
        &client,
        &server.key(),
        None,
        "application/vnd.awp.exec+json",
        json!({"cmd": ["echo", "x"]}),
    )
    .await;
    let forbidden = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let ev = events.recv().await.unwrap();
            if ev.get("event").and_then(Value::as_str) == Some("peer_err") {
                return Value::Object(ev);
            }
        }
    })
    .await
    .expect("err forbidden arrives");
    assert_eq!(forbidden["code"], "forbidden");
    assert_eq!(forbidden["re"], id.as_str());

    // With a grant for exec and fs:read (not fs:write).
    let g = server
        .ctl(Request::Grant {
            peer: client.key(),
            caps: vec!["exec".into(), "fs:read".into()],
            ttl_s: 3600,
            aud: None,
        })
        .await;
    assert!(g.ok, "{:?}", g.error);
    let (id, _) = request(
        &client,
        "",
        Some(&th),
        "application/vnd.awp.exec+json",
        json!({"cmd": "echo served; pwd"}),
    )
    .await;
    let res = result_for(&client, &id).await;
    assert_eq!(res["mime"], "application/vnd.awp.exec-result+json");
    assert_eq!(res["data"]["exit"], 0);
    let canon = root.path().canonicalize().unwrap();
    assert_eq!(
        res["data"]["stdout"],
        format!("served\n{}\n", canon.display())
    );

    // Output over 64 KiB: the whole of it comes as a blob part of the result msg.
    let (id, _) = request(
        &client,
        "",
        Some(&th),
        "application/vnd.awp.exec+json",
        json!({"cmd": "head -c 100000 /dev/zero | tr '\\0' b"}),
    )
    .await;
    let res = result_for(&client, &id).await;
    assert_eq!(res["data"]["truncated"], true);
    let blob_ref = res["data"]["stdout_blob"]
        .as_str()
        .expect("stdout_blob")
        .to_string();
    let blob = eventually(10, || async {
        let r = client
            .ctl(Request::Blobs {
                peer: None,
                blob_ref: Some(blob_ref.clone()),
            })
            .await;
        r.body["blobs"]
            .as_array()
            .and_then(|a| a.first().cloned())
            .filter(|b| b["status"] == "complete")
    })
    .await;
    let data = std::fs::read(blob["path"].as_str().unwrap()).unwrap();
    assert_eq!(data, vec![b'b'; 100_000]);

    let (id, _) = request(
        &client,
        "",
        Some(&th),
        "application/vnd.awp.fs-read+json",
        json!({"path": "hello.txt"}),
    )
    .await;
    let res = result_for(&client, &id).await;
    assert_eq!(res["data"]["content"], "hi there");

    let (id, _) = request(
        &client,
        "",
        Some(&th),
        "application/vnd.awp.fs-read+json",
        json!({"path": "../../etc/passwd"}),
    )
    .await;
    let res = result_for(&client, &id).await;
    assert!(res["data"]["error"].is_string(), "{res}");
    assert!(res["data"].get("content").is_none());

    // fs:write was not granted.
    let (id, _) = request(
        &client,
        "",
        Some(&th),
        "application/vnd.awp.fs-write+json",
        json!({"path": "x.txt", "content": "no"}),
    )
    .await;
    let forbidden = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let ev = events.recv().await.unwrap();
            if ev.get("event").and_then(Value::as_str) == Some("peer_err")
                && ev.get("re").and_then(Value::as_str) == Some(id.as_str())
            {
                return Value::Object(ev);
            }
        }
    })
    .await
    .expect("err forbidden for fs:write");
    assert_eq!(forbidden["code"], "forbidden");
    assert!(!root.path().join("x.txt").exists());
    let log = std::fs::read_to_string(server.path().join("served.log")).unwrap();
    assert_eq!(log.lines().count(), 6, "every request is logged: {log}");
}
