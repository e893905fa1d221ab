//! Node-level tests of the artifact wiring that need the node's internals.

use super::cache::MAX_CACHED;
use super::*;
use crate::identity::Identity;
use crate::node::{NodeConfig, NodeHandle};

async fn node(home: &std::path::Path) -> NodeHandle {
    NodeHandle::start(NodeConfig {
        home: home.to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("artifacts@test".into()),
        ..Default::default()
    })
    .await
    .expect("node starts")
}

fn cmd(id: &str, command: Value) -> Value {
    json!({"type": "command", "command_id": id, "command": command})
}

/// A node hosting more workspaces than the cache holds keeps at most `MAX_CACHED` in
/// memory, and an evicted (cold) workspace is rebuilt from the store with its state.
#[tokio::test]
async fn many_workspaces_keep_the_cache_bounded_and_cold_ones_reload() {
    let dir = tempfile::TempDir::new().unwrap();
    let h = node(dir.path()).await;
    let inner = h.inner.clone();
    let peer = Identity::from_seed(&[7; 32]).key();
    let n = MAX_CACHED + 8;
    for i in 0..n {
        let th = format!("thr_cache_{i}");
        let create = cmd(
            "c1",
            json!({"type": "create_artifact", "artifact_id": "art_1", "kind": "markdown",
                "data": {"text": format!("doc {i}")}}),
        );
        let (results, _) = run_local(&inner, &th, vec![create], Some(peer), None)
            .await
            .unwrap();
        assert_eq!(results[0]["ok"], json!(true), "{}", results[0]);
        assert!(inner.artifacts.cache().len() <= MAX_CACHED);
    }
    assert_eq!(inner.artifacts.cache().len(), MAX_CACHED);
    assert!(
        !inner.artifacts.cache().contains("thr_cache_0"),
        "the least recently used workspace was evicted"
    );
    // The cold workspace reloads from the store: version 1 is there, an edit on it applies.
    let edit = cmd(
        "e1",
        json!({"type": "edit_artifact", "artifact_id": "art_1", "base_version": 1,
            "patch": {"kind": "text_edits", "edits": [{"old": "doc 0", "new": "doc zero"}]}}),
    );
    let (results, _) = run_local(&inner, "thr_cache_0", vec![edit], None, None)
        .await
        .unwrap();
    assert_eq!(results[0]["ok"], json!(true), "{}", results[0]);
    assert_eq!(results[0]["outcome"]["version"], json!(2));
    assert!(inner.artifacts.cache().contains("thr_cache_0"));
    assert_eq!(inner.artifacts.cache().len(), MAX_CACHED);
    h.shutdown();
    h.stopped().await;
}

/// Events the host queues for the guest travel in msgs of at most `EVENT_BYTES_PER_MSG`
/// of event parts (under sled's inline-record size, so each msg stays in its log), in seq
/// order, every event once; one event never waits for room.
#[tokio::test]
async fn queued_event_msgs_stay_under_the_msg_bound() {
    let dir = tempfile::TempDir::new().unwrap();
    let h = node(dir.path()).await;
    let inner = h.inner.clone();
    let peer = Identity::from_seed(&[9; 32]).key();
    let th = "thr_msg_bound";
    let text = "x".repeat(2000);
    let create = cmd(
        "c1",
        json!({"type": "create_artifact", "artifact_id": "art_1", "kind": "markdown",
            "data": {"text": format!("[0]{text}")}}),
    );
    run_local(&inner, th, vec![create], Some(peer), None)
        .await
        .unwrap();
    // 200 edits whose events carry ~2 KB each: ~400 KB of events in one transaction.
    let edits: Vec<Value> = (0..200u64)
        .map(|i| {
            cmd(
                &format!("e{i}"),
                json!({"type": "edit_artifact", "artifact_id": "art_1", "base_version": i + 1,
                    "patch": {"kind": "text_edits", "edits": [
                        {"old": format!("[{i}]{text}"), "new": format!("[{}]{text}", i + 1)}]}}),
            )
        })
        .collect();
    let (results, _) = run_local(&inner, th, edits, None, None).await.unwrap();
    assert!(results.iter().all(|r| r["ok"] == json!(true)));
    let lines = inner.store.outbox_after(&peer, None, 10_000).unwrap();
    let mut seqs = Vec::new();
    for e in &lines {
        // sled 0.34 keeps a record of up to about 128 KiB in its log.
        assert!(
            e.line.len() <= 120 * 1024,
            "a msg of {} bytes",
            e.line.len()
        );
        let Ok(Line::Msg(m)) = wire::parse_line(&e.line) else {
            panic!("not a msg")
        };
        for p in &m.parts {
            if let Part::Data(DataPart {
                data,
                mime: Some(mime),
            }) = p
            {
                if mime == MIME_EVENT {
                    seqs.push(data["seq"].as_u64().unwrap());
                }
            }
        }
    }
    let head = inner.store.art_workspace(th).unwrap().unwrap().head_seq;
    assert_eq!(seqs, (1..=head).collect::<Vec<_>>());
    assert!(
        lines.len() >= 4,
        "{} msgs for ~400 KB of events",
        lines.len()
    );
    h.shutdown();
    h.stopped().await;
}

/// Commands queued together are packed in order into msgs of at most
/// `MAX_COMMANDS_PER_MSG` commands and `EVENT_BYTES_PER_MSG` bytes of them; a bigger one
/// travels alone, and nothing is lost or reordered.
#[test]
fn commands_pack_into_bounded_msgs_in_order() {
    let post = |i: usize, len: usize| {
        cmd(
            &format!("c{i}"),
            json!({"type": "post_message", "thread_id": "t", "content": "x".repeat(len)}),
        )
    };
    let ids = |msgs: &[Vec<Part>]| -> Vec<String> {
        msgs.iter()
            .flatten()
            .map(|p| match p {
                Part::Data(DataPart { data, mime }) => {
                    assert_eq!(mime.as_deref(), Some(MIME_COMMAND));
                    data["command_id"].as_str().unwrap().to_string()
                }
                _ => panic!("not a data part"),
            })
            .collect()
    };
    // Small ones: bounded by count.
    let frames: Vec<Value> = (0..600).map(|i| post(i, 10)).collect();
    let msgs = pack_commands(frames);
    assert_eq!(
        msgs.iter().map(Vec::len).collect::<Vec<_>>(),
        [
            MAX_COMMANDS_PER_MSG,
            MAX_COMMANDS_PER_MSG,
            600 - 2 * MAX_COMMANDS_PER_MSG
        ]
    );
    assert_eq!(
        ids(&msgs),
        (0..600).map(|i| format!("c{i}")).collect::<Vec<_>>()
    );
    // Large ones: bounded by bytes; one over the bound alone.
    let mut frames: Vec<Value> = (0..40).map(|i| post(i, 10_000)).collect();
    frames.insert(7, post(99, EVENT_BYTES_PER_MSG));
    let msgs = pack_commands(frames.clone());
    for m in &msgs {
        let bytes: usize = m
            .iter()
            .map(|p| match p {
                Part::Data(d) => json_len(&d.data),
                _ => 0,
            })
            .sum();
        assert!(
            m.len() == 1 || bytes <= EVENT_BYTES_PER_MSG,
            "{bytes} bytes in {} parts",
            m.len()
        );
    }
    assert!(msgs
        .iter()
        .any(|m| m.len() == 1 && ids(std::slice::from_ref(m)) == ["c99"]));
    let want: Vec<String> = frames
        .iter()
        .map(|f| f["command_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids(&msgs), want);
    assert!(pack_commands(Vec::new()).is_empty());
}
