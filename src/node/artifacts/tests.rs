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
