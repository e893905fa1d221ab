//! Attacks on artifact threads: a guest in a thread (no grants), and any peer acting as
//! the "host" of a replica it opened by sending an event part. Each test is bounded (a
//! few dozen lines, at most a few MiB allocated) and checks the bound the attack breaks.

mod common;

use awp_node::artifact::frames::Patch;
use awp_node::artifact::kinds::MAX_DATA_BYTES;
use awp_node::artifact::{patch, EventEnvelope, WorkspaceState};
use awp_node::control::{Request, Response};
use common::*;
use serde_json::{json, Map, Value};

/// `doc` with `n` json_patch `copy` ops, each copying `/a` into a new key of itself: the
/// document doubles with every op while the patch grows by ~50 bytes.
fn doubling_patch(n: usize) -> Patch {
    let mut ops = vec![json!({"op": "add", "path": "/a", "value": {"s": "x".repeat(1024)}})];
    for i in 0..n {
        ops.push(json!({"op": "copy", "from": "/a", "path": format!("/a/k{i}")}));
    }
    serde_json::from_value(json!({"kind": "json_patch", "ops": ops})).unwrap()
}

fn markdown(text: &str) -> Map<String, Value> {
    json!({"text": text}).as_object().unwrap().clone()
}

/// A guest without any grant sends `edit_artifact` with a json_patch; the host dry-runs it
/// (proposal path, `compute_edit` → `patch::apply`) BEFORE the kind checks the size. The
/// replica does the same with a host's recorded `artifact_changed` patch
/// (`WorkspaceState::apply_event` → `patch::apply`). 12 copies of a 1 KiB object give 4
/// MiB here; 40 give 1 TiB (OOM abort) from a ~2 KiB command.
#[test]
fn json_patch_copy_doubling_is_refused_before_it_is_materialized() {
    let p = doubling_patch(12);
    let wire_bytes = serde_json::to_vec(&p).unwrap().len();
    assert!(wire_bytes < 2048, "{wire_bytes}");
    match patch::apply(&markdown("hi"), &p) {
        Err(_) => {}
        Ok(out) => {
            let len = serde_json::to_vec(&out).unwrap().len();
            panic!(
                "a {wire_bytes}-byte patch built a {len}-byte document (limit {MAX_DATA_BYTES})"
            );
        }
    }
}

const WS: &str = "thr_breaker";

fn envelope(seq: u64, event: Value) -> EventEnvelope {
    serde_json::from_value(
        json!({"seq": seq, "id": format!("00000000-0000-4000-8000-{seq:012}"),
        "ts": "2026-01-01T00:00:00Z", "workspace_id": WS, "thread_id": WS, "run_id": null,
        "actor": {"kind": "user", "id": "raw", "name": null}, "traceparent": null,
        "event": event, "type": "event"}),
    )
    .unwrap()
}

/// Any peer opens a replica on a victim by sending an event part in a fresh thread; then
/// every ~300-byte `artifact_changed` event made the replica keep one more FULL copy of
/// the artifact's data, in memory and in every snapshot (40 events here gave 2.7 MB of
/// state from 85 KB of events). Versions are now recorded patches between checkpoints.
#[test]
fn replica_state_does_not_grow_by_a_full_copy_per_tiny_event() {
    let big = "y".repeat(64 * 1024);
    let mut st = WorkspaceState::new(WS);
    let mut received = 0usize;
    let created = json!({"type": "artifact_created", "artifact_id": "art_1", "kind": "markdown",
        "version": 1, "data": {"text": format!("a{big}")}, "thread_id": WS, "proposal_id": null, "run_id": null});
    let env = envelope(1, created);
    received += serde_json::to_vec(&env).unwrap().len();
    st.apply_event(&env).unwrap();
    for i in 0..40u64 {
        let (old, new) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
        let ev = json!({"type": "artifact_changed", "artifact_id": "art_1", "kind": "markdown",
            "version": i + 2, "summary": "s", "thread_id": WS, "proposal_id": null, "run_id": null,
            "patch": {"kind": "text_edits", "field": "text", "edits": [{"old": old, "new": new}]}});
        let env = envelope(i + 2, ev);
        received += serde_json::to_vec(&env).unwrap().len();
        st.apply_event(&env).unwrap();
    }
    let held = serde_json::to_vec(&st).unwrap().len();
    assert!(
        held <= 4 * received,
        "{received} bytes of events became {held} bytes of replica state"
    );
}

// ------------------------------------------------------------------ node-level attacks

const EV: &str = "application/vnd.artifactr.v1.event+json";
const RESEND: &str = "application/vnd.artifactr.v1.resend+json";

struct RawGuest {
    raw: Raw,
    th: String,
    n: u32,
}

impl RawGuest {
    async fn new(node: &TestNode, seed: u8) -> RawGuest {
        let mut raw = Raw::dial(&node.address(), seed).await;
        raw.handshake().await;
        raw.write(br#"{"t":"resume","id":"01K000000000000000000000FF","ts":"2026-01-01T00:00:00.000Z","seen":{}}"#).await;
        RawGuest {
            raw,
            th: String::new(),
            n: 0x100,
        }
    }

    async fn send(&mut self, parts: &[(&str, Value)]) {
        self.n += 1;
        let id = format!("01K000000000000000000{:05X}", self.n);
        let line = data_msg_line(&id, &self.th, parts);
        self.raw.write(line.as_bytes()).await;
    }

    /// Lines until a msg in our thread with a part of `mime` (bounded).
    async fn expect_part(&mut self, mime: &str) -> Value {
        read_data_part(&mut self.raw, mime).await
    }
}

async fn outbox_of(node: &TestNode, key: &str) -> u64 {
    let r: Response = node.ctl(Request::Peers).await;
    assert!(r.ok, "{:?}", r.error);
    r.body["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["key"] == key)
        .and_then(|p| p["outbox"].as_u64())
        .unwrap_or(0)
}

/// A guest with no grant sends ONE msg of 200 `resend {after_seq: 0}` parts: the host
/// queues 200 copies of the whole log (up to 20 000 events each, read into memory in one
/// transaction), ignoring the per-peer outbox quota that served requests respect. Each
/// further msg adds as many again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_msg_of_resend_parts_does_not_multiply_the_log_into_the_outbox() {
    let node = TestNode::start("host@test").await;
    let mut guest = RawGuest::new(&node, 43).await;
    let key = guest.raw.identity.key().to_string();
    let r: Response = node
        .ctl(Request::Artifact {
            action: "new".into(),
            args: json!({"peer": key, "kind": "markdown", "data": {"text": "x"}}),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    guest.th = r.body["th"].as_str().unwrap().to_string();
    guest.expect_part(EV).await;
    let before = outbox_of(&node, &key).await;
    let parts: Vec<(&str, Value)> = (0..200)
        .map(|_| (RESEND, json!({"after_seq": 0})))
        .collect();
    guest.send(&parts).await;
    // The msg is durable and processed once the guest sees the first resent event.
    guest.expect_part(EV).await;
    let after = eventually(10, || async {
        let n = outbox_of(&node, &key).await;
        (n > before).then_some(n)
    })
    .await;
    assert!(
        after - before <= 2,
        "one guest msg queued {} msgs for it",
        after - before
    );
}

/// Nesting grown by `move` ops that never grow the size: each round (add, move, move)
/// wraps the document one level deeper with ~120 bytes of patch. `depth` levels.
fn nesting_patch(depth: usize) -> Patch {
    let mut ops = vec![json!({"op": "add", "path": "/a", "value": {}})];
    for _ in 0..depth {
        ops.push(json!({"op": "add", "path": "/t", "value": {}}));
        ops.push(json!({"op": "move", "from": "/a", "path": "/t/a"}));
        ops.push(json!({"op": "move", "from": "/t", "path": "/a"}));
    }
    serde_json::from_value(json!({"kind": "json_patch", "ops": ops})).unwrap()
}

/// A guest (no grant) or a replica's host can nest data far past MAX_DEPTH inside one
/// patch; the nested value is then walked and dropped recursively.
#[test]
fn json_patch_nesting_is_bounded_while_applying() {
    let p = nesting_patch(3000);
    let wire_bytes = serde_json::to_vec(&p).unwrap().len();
    assert!(wire_bytes < 1 << 20, "{wire_bytes}");
    let r = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || patch::apply(&markdown("hi"), &p).is_err())
        .unwrap()
        .join()
        .unwrap();
    assert!(
        r,
        "a {wire_bytes}-byte patch nested the data 3000 levels deep"
    );
}

const CMD: &str = "application/vnd.artifactr.v1.command+json";
const ERR: &str = "application/vnd.artifactr.v1.error+json";

/// A guest sends one command msg with 12 000 extra (tiny) command parts: one error part per
/// extra part made the reply line exceed 1 MiB, the store refused to queue it, the whole
/// batch failed as a "storage failure" and the session closed; the guest's msg was never
/// acked and came back at every resume. Now the first 256 parts run (an error part each
/// for those that are not frames) and one error part answers the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_msg_with_many_parts_gets_one_bounded_reply() {
    let node = TestNode::start("host@test").await;
    let mut guest = RawGuest::new(&node, 44).await;
    let key = guest.raw.identity.key().to_string();
    let r: Response = node
        .ctl(Request::Artifact {
            action: "new".into(),
            args: json!({"peer": key, "kind": "markdown", "data": {"text": "x"}}),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    guest.th = r.body["th"].as_str().unwrap().to_string();
    guest.expect_part(EV).await;
    let th = guest.th.clone();
    let mut parts: Vec<(&str, Value)> = vec![(
        CMD,
        json!({"type": "command", "command_id": "c1", "command": {"type": "post_message", "thread_id": th, "content": "hi"}}),
    )];
    parts.extend((0..12_000).map(|_| (CMD, json!({}))));
    guest.send(&parts).await;
    let mut errors = 0;
    let mut last = Value::Null;
    for _ in 0..50 {
        let Some(l) = guest.raw.read().await else {
            break;
        };
        let v: Value = serde_json::from_slice(&l).unwrap();
        if v["t"] != "msg" {
            continue;
        }
        assert!(l.len() < 128 * 1024, "a reply line of {} bytes", l.len());
        for p in v["parts"].as_array().unwrap() {
            if p["mime"] == ERR {
                errors += 1;
                last = p["data"].clone();
            }
        }
        if last["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("at most"))
        {
            break;
        }
    }
    assert_eq!(
        last["message"],
        "at most 256 commands per msg: the rest were not run"
    );
    assert_eq!(
        errors, 256,
        "255 parts that are not frames, one for the rest"
    );
}

/// The same from the other side: a replica's host sends 12 000 command parts; the replica
/// answered each with a not-host error part, overflowing its reply line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_answers_many_command_parts_with_one_error_part() {
    let node = TestNode::start("guest@test").await;
    let mut host = RawGuest::new(&node, 45).await;
    host.th = "thr_manycmds".into();
    let created = json!({"seq": 1, "id": "00000000-0000-4000-8000-000000000001", "ts": "2026-01-01T00:00:00Z",
        "workspace_id": host.th, "thread_id": host.th, "run_id": null,
        "actor": {"kind": "user", "id": "raw", "name": null}, "traceparent": null, "type": "event",
        "event": {"type": "thread_created", "thread_id": "t", "title": ""}});
    let mut parts: Vec<(&str, Value)> = vec![(EV, created)];
    parts.extend((0..12_000).map(|_| (CMD, json!({}))));
    host.send(&parts).await;
    let e = host.expect_part(ERR).await;
    assert_eq!(e["message"], "this node does not host thr_manycmds");
}

/// A guest without grants sends `edit_artifact` with thousands of anchored edits; the host
/// dry-runs them (proposal path) inside the store transaction, i.e. holding the store's
/// writer lock: each edit scans the whole text twice (count, replace). 2 000 edits on 256
/// KiB scan ~1 GB here; a 1 MiB line holds ~30 000 edits (~15 GB on a 512 KiB artifact),
/// during which no other peer's lines are stored.
#[test]
fn text_edits_work_is_bounded() {
    let text = format!("a{}", "y".repeat(256 * 1024));
    let edits: Vec<Value> = (0..2000)
        .map(|i| {
            let (old, new) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
            json!({"old": old, "new": new})
        })
        .collect();
    let p: Patch =
        serde_json::from_value(json!({"kind": "text_edits", "field": "text", "edits": edits}))
            .unwrap();
    assert!(
        patch::apply(&markdown(&text), &p).is_err(),
        "2000 edits of a 256 KiB text were all applied"
    );
}

/// A peer "hosts" a new artifact thread with every event part it sends in a fresh thread:
/// without a bound, it could make this node keep replica state for any number of threads.
/// At most 256 replicas per peer (`node::artifacts::MAX_REPLICAS_PER_PEER`); the rest are
/// dropped, and the lines themselves are still stored and acked like any msg.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_opens_a_bounded_number_of_replicas() {
    const SENT: usize = 270;
    let node = TestNode::start("guest@test").await;
    let mut host = RawGuest::new(&node, 46).await;
    for i in 0..SENT {
        host.th = format!("thr_many{i:04}");
        let created = json!({"seq": 1, "id": "00000000-0000-4000-8000-000000000001",
            "ts": "2026-01-01T00:00:00Z", "workspace_id": host.th, "thread_id": host.th,
            "run_id": null, "actor": {"kind": "user", "id": "raw", "name": null},
            "traceparent": null, "type": "event",
            "event": {"type": "thread_created", "thread_id": host.th, "title": ""}});
        host.send(&[(EV, created)]).await;
    }
    // Every line is stored (its thread listed) once the hook has run for it.
    let key = host.raw.identity.key().to_string();
    eventually(20, || async {
        let r = node.ctl(Request::Threads).await;
        let n = r.body["threads"].as_array().map_or(0, |a| {
            a.iter().filter(|t| t["peer"] == key.as_str()).count()
        });
        (n >= SENT).then_some(())
    })
    .await;
    let r = node
        .ctl(Request::Artifact {
            action: "list".into(),
            args: json!({}),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let replicas = r.body["threads"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|w| w["role"] == "replica").count());
    assert_eq!(replicas, 256);
}

fn raw_event(th: &str, seq: u64, event: Value) -> Value {
    json!({"seq": seq, "id": format!("00000000-0000-4000-8000-{seq:012}"),
        "ts": "2026-01-01T00:00:00Z", "workspace_id": th, "thread_id": th, "run_id": null,
        "actor": {"kind": "user", "id": "raw", "name": null}, "traceparent": null,
        "type": "event", "event": event})
}

fn raw_created(th: &str, seq: u64, text: &str) -> Value {
    raw_event(
        th,
        seq,
        json!({"type": "artifact_created", "artifact_id": "art_1", "kind": "markdown",
        "version": 1, "data": {"text": text}, "thread_id": th, "proposal_id": null, "run_id": null}),
    )
}

/// The host's store was restored: its log is behind the replica. The replica's resend
/// after its head is answered `resend after 3: head is 1`; the replica then forgets its
/// state and log, asks again from 0, and rebuilds from the host's (new) seq 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_resets_when_its_host_log_is_behind_it() {
    let node = TestNode::start("guest@test").await;
    let mut host = RawGuest::new(&node, 47).await;
    host.th = "thr_restored".into();
    let th = host.th.clone();
    let thread = |seq| {
        raw_event(
            &th,
            seq,
            json!({"type": "thread_created", "thread_id": th, "title": ""}),
        )
    };
    let edit = json!({"type": "artifact_changed", "artifact_id": "art_1", "kind": "markdown",
        "version": 2, "summary": "s", "thread_id": th, "proposal_id": null, "run_id": null,
        "patch": {"kind": "text_edits", "field": "text", "edits": [{"old": "old", "new": "older"}]}});
    // Seq 1..3, then 5: a gap at 4, so the replica asks for a resend after 3.
    host.send(&[
        (EV, thread(1)),
        (EV, raw_created(&th, 2, "old")),
        (EV, raw_event(&th, 3, edit)),
        (EV, raw_event(&th, 5, json!({"type": "x_later"}))),
    ])
    .await;
    assert_eq!(host.expect_part(RESEND).await["after_seq"], 3);
    host.send(&[(
        ERR,
        json!({"type": "error", "message": "resend after 3: head is 1"}),
    )])
    .await;
    assert_eq!(host.expect_part(RESEND).await["after_seq"], 0);
    host.send(&[(EV, thread(1)), (EV, raw_created(&th, 2, "new"))])
        .await;
    let show = eventually(10, || async {
        let r = node
            .ctl(Request::Artifact {
                action: "show".into(),
                args: json!({"th": th, "artifact": "art_1"}),
            })
            .await;
        (r.ok && r.body["data"]["text"] == "new").then_some(r.body)
    })
    .await;
    assert_eq!(show["version"], 1);
    assert_eq!(show["head"], 1);
}
