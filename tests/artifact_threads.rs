//! Artifact threads between two nodes over TLS: the host runs commands under the guest's
//! grants, the guest's replica follows the host's events, and a host killed with SIGKILL
//! applies each command once and still delivers its result.

mod common;

use awp_node::control::{Request, Response};
use common::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::Path;

async fn art(home: &Path, action: &str, args: Value) -> Value {
    let r: Response = ctl(
        home,
        Request::Artifact {
            action: action.into(),
            args,
        },
    )
    .await;
    assert!(r.ok, "artifact {action} failed: {:?}", r.error);
    Value::Object(r.body)
}

/// Two nodes, the guest dialed the host; the host opens an artifact thread with a markdown
/// plan. Returns (host, guest, th, artifact id).
async fn pair_with_plan() -> (TestNode, TestNode, String, String) {
    let host = TestNode::start("host@test").await;
    let guest = TestNode::start("guest@test").await;
    guest.connect(&host).await;
    let (th, id) = new_plan(&host, &guest).await;
    (host, guest, th, id)
}

async fn new_plan(host: &TestNode, guest: &TestNode) -> (String, String) {
    let r = art(
        &host.path(),
        "new",
        json!({"peer": guest.key(), "kind": "markdown", "title": "Plan", "data": {"text": "# Plan\n- design\n"}}),
    )
    .await;
    assert_eq!(r["result"]["ok"], json!(true), "{r}");
    let th = r["th"].as_str().unwrap().to_string();
    let id = r["result"]["outcome"]["artifact_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The guest's replica appears from the host's events.
    let g = guest.path();
    let th2 = th.clone();
    eventually(10, || {
        let (g, th2) = (g.clone(), th2.clone());
        async move {
            let r = ctl(
                &g,
                Request::Artifact {
                    action: "list".into(),
                    args: json!({"th": th2}),
                },
            )
            .await;
            (r.ok && r.body["threads"].as_array().is_some_and(|a| !a.is_empty())).then_some(())
        }
    })
    .await;
    (th, id)
}

fn replace(old: &str, new: &str) -> Value {
    json!({"kind": "text_edits", "edits": [{"old": old, "new": new}]})
}

/// The artifact as each side sees it, once the guest caught up with the host's head.
async fn both_views(host: &TestNode, guest: &TestNode, th: &str, id: &str) -> (Value, Value) {
    let h = art(&host.path(), "show", json!({"th": th, "artifact": id})).await;
    let g = guest.path();
    let want = h["seq"].clone();
    let gv = eventually(10, || {
        let (g, want) = (g.clone(), want.clone());
        let (th, id) = (th.to_string(), id.to_string());
        async move {
            let r = ctl(
                &g,
                Request::Artifact {
                    action: "show".into(),
                    args: json!({"th": th, "artifact": id}),
                },
            )
            .await;
            (r.ok && r.body["seq"] == want).then(|| Value::Object(r.body))
        }
    })
    .await;
    (h, gv)
}

async fn grant(host: &TestNode, guest: &TestNode, cap: &str) -> String {
    let r = host
        .ctl(Request::Grant {
            peer: guest.key(),
            caps: vec![cap.into()],
            ttl_s: 3600,
            aud: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    r.body["hash"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_without_grants_proposes_and_host_accepts_with_changes() {
    let (host, guest, th, id) = pair_with_plan().await;
    // A direct edit without artifact:write becomes a proposal.
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th, "artifact": id, "patch": replace("- design\n", "- design\n- build\n")}),
    )
    .await;
    assert_eq!(r["role"], "replica");
    assert_eq!(r["result"]["ok"], json!(true), "{r}");
    assert_eq!(r["result"]["outcome"]["type"], "proposed", "{r}");
    let pid = r["result"]["outcome"]["proposal_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The host sees it pending and accepts it with its own change on top.
    let p = art(&host.path(), "proposals", json!({"th": th})).await;
    assert_eq!(p["proposals"][0]["proposal_id"], pid.as_str());
    assert_eq!(p["proposals"][0]["proposed_by"]["kind"], "external_agent");
    assert_eq!(
        p["proposals"][0]["proposed_by"]["client_id"],
        guest.key().as_str()
    );
    let r = art(&host.path(), "accept", json!({"th": th, "proposal": &pid[..8], "changes": replace("- build\n", "- build (after review)\n")})).await;
    assert_eq!(r["result"]["outcome"]["type"], "resolved", "{r}");
    assert_eq!(r["result"]["outcome"]["version"], 2);
    let (h, g) = both_views(&host, &guest, &th, &id).await;
    assert_eq!(
        h["data"]["text"],
        "# Plan\n- design\n- build (after review)\n"
    );
    assert_eq!(g["data"], h["data"]);
    assert_eq!(g["version"], 2);
    let gp = art(&guest.path(), "proposals", json!({"th": th, "all": true})).await;
    assert_eq!(gp["proposals"][0]["status"], "accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_with_write_edits_directly_and_a_stale_base_conflicts() {
    let (host, guest, th, id) = pair_with_plan().await;
    grant(&host, &guest, "artifact:write").await;
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th, "artifact": id, "patch": replace("- design\n", "- design\n- test\n")}),
    )
    .await;
    assert_eq!(r["result"]["outcome"]["type"], "applied", "{r}");
    assert_eq!(r["result"]["outcome"]["version"], 2);
    let (h, g) = both_views(&host, &guest, &th, &id).await;
    assert_eq!(h["data"]["text"], "# Plan\n- design\n- test\n");
    assert_eq!(g["data"], h["data"]);
    // Based on version 1 while the artifact is at 2.
    let r = art(&guest.path(), "edit", json!({"th": th, "artifact": id, "base_version": 1, "patch": replace("- test\n", "- ship\n")})).await;
    let rej = &r["result"]["rejection"];
    assert_eq!(r["result"]["ok"], json!(false), "{r}");
    assert_eq!(rej["type"], "version_conflict");
    assert_eq!(rej["base"], 1);
    assert_eq!(rej["head"], 2);
    assert_eq!(rej["artifact_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_scoped_to_one_thread_does_not_reach_another() {
    let (host, guest, th1, id1) = pair_with_plan().await;
    let (th2, id2) = new_plan(&host, &guest).await;
    grant(&host, &guest, &format!("artifact:write@{th1}")).await;
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th1, "artifact": id1, "patch": replace("- design\n", "- one\n")}),
    )
    .await;
    assert_eq!(r["result"]["outcome"]["type"], "applied", "{r}");
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th2, "artifact": id2, "patch": replace("- design\n", "- two\n")}),
    )
    .await;
    assert_eq!(r["result"]["outcome"]["type"], "proposed", "{r}");
    let h = art(&host.path(), "show", json!({"th": th2, "artifact": id2})).await;
    assert_eq!(h["version"], 1);
}

/// A thread scope may be a unique prefix of a hosted thread (written out in full in the
/// signed grant, so it applies); a scope that names no hosted thread is refused rather
/// than signed and sent to do nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_scope_prefix_is_written_out_and_an_unknown_scope_is_refused() {
    let (host, guest, th, id) = pair_with_plan().await;
    let short = &th[..th.len() - 6];
    let r = host
        .ctl(Request::Grant {
            peer: guest.key(),
            caps: vec![format!("artifact:write@{short}")],
            ttl_s: 3600,
            aud: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        r.body["grant"]["caps"],
        json!([format!("artifact:write@{th}")]),
        "{:?}",
        r.body
    );
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th, "artifact": id, "patch": replace("- design\n", "- one\n")}),
    )
    .await;
    assert_eq!(r["result"]["outcome"]["type"], "applied", "{r}");
    let r = host
        .ctl(Request::Grant {
            peer: guest.key(),
            caps: vec!["artifact:write@thr_nosuchthread".into()],
            ttl_s: 3600,
            aud: None,
        })
        .await;
    assert!(!r.ok);
    assert_eq!(r.error.unwrap().code, "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_stops_applying_at_the_next_command() {
    let (host, guest, th, id) = pair_with_plan().await;
    let hash = grant(&host, &guest, "artifact:write").await;
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th, "artifact": id, "patch": replace("- design\n", "- a\n")}),
    )
    .await;
    assert_eq!(r["result"]["outcome"]["type"], "applied", "{r}");
    let rv = host.ctl(Request::Revoke { hash }).await;
    assert!(rv.ok, "{:?}", rv.error);
    let r = art(
        &guest.path(),
        "edit",
        json!({"th": th, "artifact": id, "patch": replace("- a\n", "- b\n")}),
    )
    .await;
    assert_eq!(r["result"]["outcome"]["type"], "proposed", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replicas_log_equals_the_hosts_after_host_edits() {
    let (host, guest, th, id) = pair_with_plan().await;
    for (a, b) in [("- design\n", "- x\n"), ("- x\n", "- y\n")] {
        let r = art(
            &host.path(),
            "edit",
            json!({"th": th, "artifact": id, "patch": replace(a, b)}),
        )
        .await;
        assert_eq!(r["result"]["outcome"]["type"], "applied", "{r}");
    }
    let (h, g) = both_views(&host, &guest, &th, &id).await;
    assert_eq!(g["data"], h["data"]);
    let hl = art(&host.path(), "log", json!({"th": th})).await;
    let gl = art(&guest.path(), "log", json!({"th": th})).await;
    assert_eq!(
        hl["events"], gl["events"],
        "the replica's log is the host's log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_host_applies_each_command_once_and_the_replica_matches() {
    sigkilled_host(false).await;
}

/// As above with the commands queued in batches (several command parts per msg), one of
/// them refused in each batch: after the restart every result arrives, each command was
/// applied once and the refused ones changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_host_applies_each_command_of_batched_msgs_once() {
    sigkilled_host(true).await;
}

/// SIGKILL the host while results come back; `batched`: the guest queues the commands
/// 50 per control request (one msg each, with one refused command) instead of one each.
async fn sigkilled_host(batched: bool) {
    const N: usize = 150;
    let h_home = tempfile::TempDir::new().unwrap();
    let port = free_port();
    let mut host = start_daemon(h_home.path(), port);
    let status = wait_ready(h_home.path()).await;
    let h_key = status["key"].as_str().unwrap().to_string();
    let h_addr = format!("tls:127.0.0.1:{port}#{h_key}");
    let guest = TestNode::start("guest@test").await;
    let r = guest
        .ctl(Request::Connect {
            address: h_addr,
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let r = art(
        h_home.path(),
        "new",
        json!({"peer": guest.key(), "kind": "markdown", "title": "Log", "data": {"text": ""}}),
    )
    .await;
    let th = r["th"].as_str().unwrap().to_string();
    let g = guest.path();
    eventually(10, || {
        let (g, th) = (g.clone(), th.clone());
        async move {
            let r = ctl(
                &g,
                Request::Artifact {
                    action: "list".into(),
                    args: json!({"th": th}),
                },
            )
            .await;
            (r.ok && r.body["threads"].as_array().is_some_and(|a| !a.is_empty())).then_some(())
        }
    })
    .await;

    // Results as the guest receives them.
    let mut events = guest.handle.subscribe();
    let results: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let r2 = results.clone();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            if ev.get("event").and_then(Value::as_str) == Some("artifact_result") {
                if let Some(c) = ev.get("command_id").and_then(Value::as_str) {
                    r2.lock().unwrap().push(c.to_string());
                }
            }
        }
    });
    // N commands queued at once (no waiting for results).
    let mut refused = 0;
    if batched {
        for chunk in 0..N / 50 {
            let mut cmds: Vec<Value> = (chunk * 50..chunk * 50 + 50)
                .map(|i| json!({"type": "command", "command_id": format!("c{i}"),
                    "command": {"type": "post_message", "thread_id": th, "content": format!("m{i}")}}))
                .collect();
            // Without artifact:admin: forbidden, in the middle of the batch.
            cmds.insert(
                25,
                json!({"type": "command", "command_id": format!("x{chunk}"),
                "command": {"type": "set_thread_mode", "thread_id": th, "mode": "suggest"}}),
            );
            refused += 1;
            art(&g, "commands", json!({"th": th, "commands": cmds})).await;
        }
    } else {
        for i in 0..N {
            art(
                &g,
                "command",
                json!({"th": th, "wait_ms": 0, "command_id": format!("c{i}"),
                       "command": {"type": "post_message", "thread_id": th, "content": format!("m{i}")}}),
            )
            .await;
        }
    }
    // Kill the host while results are still coming back.
    eventually(20, || {
        let n = results.lock().unwrap().len();
        async move { (n >= 5).then_some(()) }
    })
    .await;
    host.kill().unwrap();
    host.wait().unwrap();
    let mut host = start_daemon(h_home.path(), port);
    wait_ready(h_home.path()).await;
    // Every command's result reaches the guest.
    eventually(60, || {
        let got: HashSet<String> = results.lock().unwrap().iter().cloned().collect();
        async move { (got.len() == N + refused).then_some(()) }
    })
    .await;
    // Applied once: one message_posted per command on the host.
    let log = art(h_home.path(), "log", json!({"th": th, "limit": 10_000})).await;
    let posted: Vec<String> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["type"] == "message_posted")
        .map(|e| e["event"]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(posted.len(), N, "each command applied exactly once");
    assert_eq!(posted.iter().collect::<HashSet<_>>().len(), N);
    assert!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["event"]["type"] != "thread_mode_changed"),
        "a refused command changed nothing"
    );
    // The replica equals the host's log.
    let head = log["head_seq"].clone();
    let gl = eventually(20, || {
        let (g, th, head) = (g.clone(), th.clone(), head.clone());
        async move {
            let r = ctl(
                &g,
                Request::Artifact {
                    action: "log".into(),
                    args: json!({"th": th, "limit": 10_000}),
                },
            )
            .await;
            (r.ok && r.body["head_seq"] == head).then(|| Value::Object(r.body))
        }
    })
    .await;
    assert_eq!(gl["events"], log["events"]);
    host.kill().unwrap();
    host.wait().unwrap();
}

/// A raw peer acting as a host: event msgs sent by hand to the node's replica.
struct RawHost {
    raw: Raw,
    th: String,
    n: u32,
}

impl RawHost {
    async fn new(node: &TestNode, th: &str) -> RawHost {
        let mut raw = Raw::dial(&node.address(), 41).await;
        raw.handshake().await;
        raw.write(br#"{"t":"resume","id":"01K000000000000000000000FF","ts":"2026-01-01T00:00:00.000Z","seen":{}}"#).await;
        RawHost {
            raw,
            th: th.into(),
            n: 0x100,
        }
    }

    fn envelope(&self, seq: u64, event: Value) -> Value {
        json!({"seq": seq, "id": format!("00000000-0000-4000-8000-{seq:012}"), "ts": "2026-01-01T00:00:00Z",
               "workspace_id": self.th, "thread_id": self.th, "run_id": null,
               "actor": {"kind": "user", "id": "raw", "name": null}, "traceparent": null,
               "event": event, "type": "event"})
    }

    fn created(&self, seq: u64, text: &str) -> Value {
        self.envelope(seq, json!({"type": "artifact_created", "artifact_id": "art_1", "kind": "markdown",
            "version": 1, "data": {"text": text}, "thread_id": self.th, "proposal_id": null, "run_id": null}))
    }

    /// Send one msg with these data parts (mime, data); returns its id.
    async fn send(&mut self, parts: &[(&str, Value)]) -> String {
        self.n += 1;
        let id = format!("01K000000000000000000{:05X}", self.n);
        let line = data_msg_line(&id, &self.th, parts);
        self.raw.write(line.as_bytes()).await;
        id
    }

    /// Lines from the node until a msg in our thread with a part of `mime` (10 s at most).
    async fn expect_part(&mut self, mime: &str) -> Value {
        read_data_part(&mut self.raw, mime).await
    }
}

async fn replica_head(node: &TestNode, th: &str) -> Option<u64> {
    let r = ctl(
        &node.path(),
        Request::Artifact {
            action: "log".into(),
            args: json!({"th": th}),
        },
    )
    .await;
    r.ok.then(|| r.body["head_seq"].as_u64().unwrap())
}

const EV: &str = "application/vnd.artifactr.v1.event+json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_holds_back_events_after_a_gap_and_asks_the_host_to_resend() {
    let node = TestNode::start("guest@test").await;
    let mut host = RawHost::new(&node, "thr_rawhost").await;
    let created = host.created(1, "v1");
    let thread = host.envelope(
        2,
        json!({"type": "thread_created", "thread_id": "thr_other", "title": ""}),
    );
    let mode = host.envelope(
        3,
        json!({"type": "thread_mode_changed", "thread_id": "thr_other", "mode": "suggest"}),
    );
    // Seq 1 opens the replica.
    host.send(&[(EV, created)]).await;
    eventually(10, || async {
        (replica_head(&node, "thr_rawhost").await == Some(1)).then_some(())
    })
    .await;
    // Seq 3 before seq 2: held back, and the node asks to resend after 1.
    host.send(&[(EV, mode.clone())]).await;
    let ask = host
        .expect_part("application/vnd.artifactr.v1.resend+json")
        .await;
    assert_eq!(ask, json!({"after_seq": 1}));
    assert_eq!(
        replica_head(&node, "thr_rawhost").await,
        Some(1),
        "seq 3 must wait for seq 2"
    );
    // Seq 2 fills the gap: 2 and the held 3 apply, in order.
    host.send(&[(EV, thread)]).await;
    eventually(10, || async {
        (replica_head(&node, "thr_rawhost").await == Some(3)).then_some(())
    })
    .await;
    let log = art(&node.path(), "log", json!({"th": "thr_rawhost"})).await;
    assert_eq!(log["held"], 0);
    let seqs: Vec<u64> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    // A duplicate of an applied seq changes nothing.
    host.send(&[(EV, mode)]).await;
    host.send(&[(
        EV,
        host.envelope(
            4,
            json!({"type": "thread_mode_changed", "thread_id": "thr_other", "mode": "edit"}),
        ),
    )])
    .await;
    eventually(10, || async {
        (replica_head(&node, "thr_rawhost").await == Some(4)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_host_events_that_do_not_parse_or_fit() {
    let node = TestNode::start("guest@test").await;
    let mut host = RawHost::new(&node, "thr_rawbad").await;
    host.send(&[(EV, host.created(1, "v1"))]).await;
    eventually(10, || async {
        (replica_head(&node, "thr_rawbad").await == Some(1)).then_some(())
    })
    .await;
    let bad = [
        json!({"seq": 2}),                // not an envelope
        json!({"seq": "2", "event": {}}), // seq not a number: ignored
        json!({"seq": 0}),                // seq 0
        host.created(2, "again"),         // artifact_created of an existing artifact
        {
            let mut e = host.envelope(
                2,
                json!({"type": "thread_created", "thread_id": "t", "title": ""}),
            );
            e["workspace_id"] = json!("thr_elsewhere"); // another workspace
            e
        },
    ];
    for b in bad {
        host.send(&[(EV, b)]).await;
    }
    // A good seq 2 after the bad ones still applies: nothing bad was taken as seq 2.
    host.send(&[(
        EV,
        host.envelope(
            2,
            json!({"type": "thread_created", "thread_id": "t", "title": "ok"}),
        ),
    )])
    .await;
    eventually(10, || async {
        (replica_head(&node, "thr_rawbad").await == Some(2)).then_some(())
    })
    .await;
    let log = art(&node.path(), "log", json!({"th": "thr_rawbad"})).await;
    assert_eq!(log["events"][1]["event"]["title"], "ok");
    assert_eq!(log["held"], 0, "nothing refused was held back");
}

const CMD: &str = "application/vnd.artifactr.v1.command+json";
const ERR: &str = "application/vnd.artifactr.v1.error+json";

fn post(th: &str, cid: &str) -> Value {
    json!({"type": "command", "command_id": cid, "command": {"type": "post_message", "thread_id": th, "content": "hi"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_to_a_node_that_does_not_host_the_thread_gets_an_error_part() {
    let node = TestNode::start("guest@test").await;
    let mut peer = RawHost::new(&node, "thr_nothosted").await;
    peer.send(&[(CMD, post("thr_nothosted", "c1"))]).await;
    let e = peer.expect_part(ERR).await;
    assert_eq!(e["message"], "this node does not host thr_nothosted");
}

const RES: &str = "application/vnd.artifactr.v1.result+json";

/// The data parts (mime, data) of every msg from `raw` answering msg `re`, in order, until
/// `n` parts came (at most 200 lines read).
async fn reply_parts(raw: &mut Raw, re: &str, n: usize) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for _ in 0..200 {
        if out.len() >= n {
            break;
        }
        let Some(l) = raw.read().await else {
            break;
        };
        let v: Value = serde_json::from_slice(&l).unwrap();
        if v["t"] == "msg" && v["re"] == re {
            for p in v["parts"].as_array().unwrap() {
                out.push((p["mime"].as_str().unwrap().to_string(), p["data"].clone()));
            }
        }
    }
    out
}

/// Several command parts in one msg: each runs once, in order, as if alone (one of them
/// refused, one not a frame, one a repeat of an earlier id in the same msg), and one reply
/// msg (`re` = that msg) carries a result or error part per command part in their order,
/// then the events. The same commands again in a new msg (a replay) return the first
/// results and append nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_runs_every_command_of_a_msg_once_and_answers_them_in_one_reply() {
    let node = TestNode::start("host@test").await;
    let mut guest = RawHost::new(&node, "").await;
    let key = guest.raw.identity.key().to_string();
    let r = art(
        &node.path(),
        "new",
        json!({"peer": key, "kind": "markdown", "data": {"text": "x"}}),
    )
    .await;
    guest.th = r["th"].as_str().unwrap().to_string();
    guest.expect_part(EV).await;
    let th = guest.th.clone();
    let head0 = art(&node.path(), "log", json!({"th": th})).await["head_seq"]
        .as_u64()
        .unwrap();
    // No artifact:admin: refused (forbidden), and nothing of it is remembered or applied.
    let mode = json!({"type": "command", "command_id": "m1", "command": {"type": "set_thread_mode", "thread_id": th, "mode": "suggest"}});
    let batch = [
        (CMD, post(&th, "c1")),
        (CMD, mode.clone()),
        (CMD, json!({"type": "command", "command_id": "bad"})),
        (CMD, post(&th, "c1")),
        (CMD, post(&th, "c3")),
    ];
    let id = guest.send(&batch).await;
    let parts = reply_parts(&mut guest.raw, &id, 7).await;
    let mimes: Vec<&str> = parts.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(mimes, [RES, RES, ERR, RES, RES, EV, EV], "{parts:?}");
    let results: Vec<&Value> = parts.iter().map(|(_, d)| d).collect();
    assert_eq!(results[0]["command_id"], "c1");
    assert_eq!(results[0]["ok"], true);
    assert_eq!(results[1]["command_id"], "m1");
    assert_eq!(
        results[1]["rejection"]["type"], "forbidden",
        "{}",
        results[1]
    );
    assert!(results[2]["message"]
        .as_str()
        .unwrap()
        .starts_with("not a command frame"));
    assert_eq!(
        results[3], results[0],
        "a repeat in the same msg: the first result"
    );
    assert_eq!(results[4]["command_id"], "c3");
    assert_eq!(results[4]["ok"], true);
    assert_eq!(results[5]["seq"], head0 + 1);
    assert_eq!(results[6]["seq"], head0 + 2);
    let log = art(&node.path(), "log", json!({"th": th})).await;
    assert_eq!(
        log["head_seq"],
        head0 + 2,
        "two commands appended, once each"
    );

    // The same commands in a new msg: the first results, nothing appended.
    let id2 = guest.send(&batch).await;
    let again = reply_parts(&mut guest.raw, &id2, 5).await;
    let again: Vec<&Value> = again.iter().map(|(_, d)| d).collect();
    assert_eq!(again[0], results[0]);
    assert_eq!(again[1]["rejection"]["type"], "forbidden");
    assert_eq!(again[3], results[0]);
    assert_eq!(again[4], results[4]);
    let log = art(&node.path(), "log", json!({"th": th})).await;
    assert_eq!(log["head_seq"], head0 + 2, "a replay appends nothing");
    assert_eq!(
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"]["type"] == "message_posted")
            .count(),
        2
    );
}

/// More than MAX_COMMANDS_PER_MSG command parts: the first 256 run, one error part answers
/// the rest; a resend beyond the host's head is refused with the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_runs_at_most_256_commands_per_msg_and_refuses_resends_beyond_its_head() {
    let node = TestNode::start("host@test").await;
    let mut guest = RawHost::new(&node, "").await;
    let key = guest.raw.identity.key().to_string();
    let r = art(
        &node.path(),
        "new",
        json!({"peer": key, "kind": "markdown", "data": {"text": "x"}}),
    )
    .await;
    guest.th = r["th"].as_str().unwrap().to_string();
    guest.expect_part(EV).await;
    let th = guest.th.clone();
    let parts: Vec<(&str, Value)> = (0..258)
        .map(|i| (CMD, post(&th, &format!("c{i}"))))
        .collect();
    guest.send(&parts).await;
    let e = guest.expect_part(ERR).await;
    assert_eq!(
        e["message"],
        "at most 256 commands per msg: the rest were not run"
    );
    let log = art(&node.path(), "log", json!({"th": th, "limit": 10_000})).await;
    let posted = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["type"] == "message_posted")
        .count();
    assert_eq!(posted, 256, "the first 256 commands ran");
    guest
        .send(&[(
            "application/vnd.artifactr.v1.resend+json",
            json!({"after_seq": 999}),
        )])
        .await;
    let e = guest.expect_part(ERR).await;
    assert_eq!(
        e["message"],
        format!("resend after 999: head is {}", log["head_seq"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_change_is_refused_and_nothing_is_appended() {
    let host = TestNode::start("host@test").await;
    let guest = TestNode::start("guest@test").await;
    guest.connect(&host).await;
    let big = "a".repeat(1_100_000);
    let r = art(
        &host.path(),
        "new",
        json!({"peer": guest.key(), "kind": "markdown", "data": {"text": big}}),
    )
    .await;
    assert_eq!(r["result"]["ok"], json!(false), "{}", r["result"]);
    assert_eq!(r["result"]["rejection"]["type"], "validation_failed");
    // The engine caps artifact data at 512 KiB; the wiring's own line-size guard (a change
    // whose event would not fit in one line) sits behind that cap.
    let log = art(&host.path(), "log", json!({"th": r["th"]})).await;
    let types: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        vec!["thread_created"],
        "nothing of the refused change was appended"
    );
    // The thread still works after the refusal.
    let r = art(
        &host.path(),
        "new",
        json!({"th": log["th"], "kind": "markdown", "data": {"text": "small"}}),
    )
    .await;
    assert_eq!(r["result"]["ok"], json!(true), "{}", r["result"]);
}
