//! `awp roll`: a scripted Roll Runtime Protocol v1 client drives an agent on a second node
//! whose side is driven by the `awp` CLI. Every request, response and notification is
//! validated against the seed schema (`../shared/seeds/roll-runtime-protocol.schema.json`);
//! the tests skip with one line when ../shared (or `$AWP_SHARED`) is absent.

mod common;

use common::{eventually, TestNode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

fn schema() -> Option<jsonschema::Validator> {
    // ../shared, or the directory named by AWP_SHARED.
    let shared = std::env::var_os("AWP_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let p = shared.join("seeds/roll-runtime-protocol.schema.json");
    let Ok(text) = std::fs::read_to_string(&p) else {
        eprintln!("skipped: {} is absent", p.display());
        return None;
    };
    let mut v: Value = serde_json::from_str(&text).expect("schema is JSON");
    // The seed's generator nests `$defs.__schema0` (any JSON value) inside several
    // definitions but refers to it as `#/$defs/__schema0`, from the document root, where
    // it is missing. Every nested copy is the same: hoist one to the root.
    let mut copies = Vec::new();
    collect_nested(&v["$defs"], &mut copies);
    assert!(!copies.is_empty() && copies.iter().all(|c| *c == copies[0]));
    v["$defs"]["__schema0"] = copies[0].clone();
    let validator = jsonschema::validator_for(&v).expect("schema compiles");
    // Not vacuous.
    assert!(!validator.is_valid(&json!({"jsonrpc": "2.0", "id": 1, "method": "turn.start"})));
    Some(validator)
}

fn collect_nested(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            if let Some(s) = m.get("$defs").and_then(|d| d.get("__schema0")) {
                out.push(s.clone());
            }
            m.values().for_each(|x| collect_nested(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_nested(x, out)),
        _ => {}
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A Roll client speaking to `awp roll` over its stdio.
struct Roll {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    schema: jsonschema::Validator,
    next_id: u64,
    /// Notifications read and not yet taken.
    events: Vec<Value>,
    last_sequence: u64,
}

impl Roll {
    async fn start(home: &Path, peer: &str, schema: jsonschema::Validator) -> Roll {
        let mut child = Command::new(env!("CARGO_BIN_EXE_awp"))
            .arg("--home")
            .arg(home)
            .args(["roll", "--peer", peer])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("awp roll starts");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Roll {
            child,
            stdin,
            lines,
            schema,
            next_id: 0,
            events: Vec::new(),
            last_sequence: 0,
        }
    }

    fn check(&self, v: &Value, what: &str) {
        let errors: Vec<String> = self.schema.iter_errors(v).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "{what} {v} does not validate: {errors:?}"
        );
    }

    async fn send_raw(&mut self, v: &Value) {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The next line from the runtime, validated; notifications are checked for a strictly
    /// increasing sequence and kept.
    async fn read(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("a line from awp roll within 20 s")
            .unwrap()
            .expect("awp roll is still running");
        let v: Value = serde_json::from_str(&line).expect("awp roll writes JSON lines");
        self.check(&v, "runtime frame");
        if v["method"] == "runtime.event" {
            let seq = v["params"]["sequence"].as_u64().unwrap();
            assert!(
                seq > self.last_sequence,
                "sequence {seq} after {}",
                self.last_sequence
            );
            self.last_sequence = seq;
            self.events.push(v.clone());
        }
        v
    }

    /// A request (validated) and its response.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.check(&req, "request");
        self.send_raw(&req).await;
        loop {
            let v = self.read().await;
            if v.get("id") == Some(&json!(id)) {
                return v;
            }
        }
    }

    async fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params).await;
        assert!(r.get("result").is_some(), "{method} failed: {r}");
        r["result"].clone()
    }

    /// Wait for the event of `kind`; returns it and drops the events before it.
    async fn event(&mut self, kind: &str) -> Value {
        for _ in 0..200 {
            if let Some(i) = self
                .events
                .iter()
                .position(|e| e["params"]["event"]["type"] == kind)
            {
                let e = self.events[i].clone();
                self.events.drain(..=i);
                return e;
            }
            self.read().await;
        }
        panic!("no {kind} event");
    }

    async fn initialize(&mut self) -> Value {
        self.ok(
            "initialize",
            json!({"protocolVersions": ["0.9", "1.0"], "client": {"name": "test", "version": "1"}}),
        )
        .await
    }

    async fn stop(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
}

/// `awp --home HOME ARGS…` (the second node's side); its stdout as JSON.
async fn cli(home: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(home)
        .arg("--json")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "awp {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The inbound msg lines `node` holds from the Roll side, newest last.
async fn inbound_msgs(node: &TestNode) -> Vec<Value> {
    node.inbound()
        .await
        .into_iter()
        .filter(|e| e["t"] == "msg")
        .collect()
}

/// Wait until `node` has `n` inbound msgs; the last one.
async fn nth_msg(node: &TestNode, n: usize) -> Value {
    eventually(20, || async {
        let m = inbound_msgs(node).await;
        (m.len() >= n).then(|| m[n - 1].clone())
    })
    .await
}

fn home(n: &TestNode) -> PathBuf {
    n.path()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_client_drives_a_remote_agent_through_an_approval() {
    let Some(schema) = schema() else { return };
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let mut roll = Roll::start(&home(&a), &b.key(), schema).await;

    let init = roll.initialize().await;
    assert_eq!(init["protocolVersion"], "1.0");
    assert_eq!(init["limits"]["eventReplay"], false);
    let instance = init["runtimeInstanceId"].clone();

    let created = roll
        .ok(
            "thread.create",
            json!({"requestId": uuid(), "title": "Fix the build"}),
        )
        .await;
    let thread_id = created["thread"]["id"].as_str().unwrap().to_string();
    let turn_id = uuid();
    let start_req = uuid();
    let started = roll
        .ok(
            "turn.start",
            json!({"requestId": start_req, "threadId": thread_id, "turnId": turn_id,
                "input": {"text": "Please fix the failing test."}}),
        )
        .await;
    assert_eq!(started, json!({"accepted": true, "turnId": turn_id}));
    // The same requestId answers the first result again; another turn is refused.
    let again = roll
        .ok(
            "turn.start",
            json!({"requestId": start_req, "threadId": thread_id, "turnId": turn_id,
                "input": {"text": "Please fix the failing test."}}),
        )
        .await;
    assert_eq!(again, started);
    let busy = roll
        .call(
            "turn.start",
            json!({"requestId": uuid(), "threadId": thread_id, "turnId": uuid(),
                "input": {"text": "and another"}}),
        )
        .await;
    assert_eq!(busy["error"]["data"]["rollCode"], "TURN_ALREADY_ACTIVE");
    assert_eq!(busy["error"]["data"]["retryable"], true);

    // Bob's side, by the CLI: the msg arrived once, in a thread titled by the Roll thread.
    let msg = nth_msg(&b, 1).await;
    assert_eq!(
        msg["line"]["parts"][0]["text"],
        "Please fix the failing test."
    );
    assert_eq!(msg["line"]["subject"], "Fix the build");
    let th = msg["th"].as_str().unwrap().to_string();
    let bh = home(&b);
    let bh = bh.as_path();

    cli(bh, &["state", &th, "working"]).await;
    let ev = roll.event("turn.started").await;
    assert_eq!(ev["params"]["turnId"], json!(turn_id));
    assert_eq!(ev["params"]["threadId"], json!(thread_id));
    assert_eq!(ev["params"]["runtimeInstanceId"], instance);

    let tool = json!({"phase": "started", "toolCallId": "call-1", "toolName": "cargo",
        "input": {"args": ["test"]}});
    cli(
        bh,
        &[
            "send",
            "-t",
            &th,
            "Running the tests.",
            "--data",
            &tool.to_string(),
            "--mime",
            "application/vnd.awp.tool+json",
        ],
    )
    .await;
    let ms = roll.event("message.started").await;
    let stream = ms["params"]["event"]["streamId"].clone();
    let delta = roll.event("message.delta").await;
    assert_eq!(delta["params"]["event"]["streamId"], stream);
    let done = roll.event("message.completed").await;
    assert_eq!(done["params"]["event"]["text"], "Running the tests.");
    let ts = roll.event("tool.started").await;
    assert_eq!(ts["params"]["event"]["toolName"], "cargo");
    assert_eq!(ts["params"]["event"]["input"], json!({"args": ["test"]}));
    let fin = json!({"phase": "completed", "toolCallId": "call-1", "toolName": "cargo",
        "outcome": {"kind": "success"}, "display": "1 passed"});
    cli(
        bh,
        &[
            "send",
            "-t",
            &th,
            "Tests pass.",
            "--data",
            &fin.to_string(),
            "--mime",
            "application/vnd.awp.tool+json",
        ],
    )
    .await;
    let tc = roll.event("tool.completed").await;
    let op_id = tc["params"]["event"]["operationId"].clone();
    let op = roll
        .ok(
            "operation.get",
            json!({"threadId": thread_id, "operationId": op_id}),
        )
        .await;
    assert_eq!(op["operation"]["display"], "1 passed");

    cli(
        bh,
        &[
            "state",
            &th,
            "waiting",
            "--note",
            "Delete target/ and rebuild?",
        ],
    )
    .await;
    let ar = roll.event("approval.required").await;
    let approval = ar["params"]["event"]["approval"].clone();
    assert_eq!(approval["turnId"], json!(turn_id));
    assert_eq!(approval["preview"], "Delete target/ and rebuild?");
    let open = roll.ok("thread.open", json!({"threadId": thread_id})).await;
    assert_eq!(open["pendingApprovals"][0]["id"], approval["id"]);
    assert_eq!(open["activeTurn"]["id"], json!(turn_id));

    let resolved = roll
        .ok(
            "approval.respond",
            json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn_id,
                "approvalId": approval["id"], "decision": "approve", "reason": "go ahead"}),
        )
        .await;
    assert_eq!(resolved, json!({"resolved": true}));
    // Bob gets the answer as a reply msg to his waiting state.
    let answer = nth_msg(&b, 2).await;
    assert_eq!(answer["th"], json!(th));
    assert_eq!(answer["line"]["parts"][0]["text"], "approved: go ahead");
    assert_eq!(answer["line"]["parts"][1]["data"]["decision"], "approve");
    let states: Vec<Value> = a
        .inbound()
        .await
        .into_iter()
        .filter(|e| e["t"] == "state" && e["line"]["state"] == "waiting")
        .collect();
    assert_eq!(answer["line"]["re"], states[0]["id"]);

    cli(bh, &["send", "-t", &th, "Fixed: the test passes."]).await;
    cli(bh, &["state", &th, "done"]).await;
    let tc = roll.event("turn.completed").await;
    assert_eq!(tc["params"]["turnId"], json!(turn_id));

    let snap = roll
        .ok(
            "thread.snapshot",
            json!({"threadId": thread_id, "limit": 100}),
        )
        .await;
    let texts: Vec<(&str, &str)> = snap["messages"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["parts"][0]["text"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        texts,
        [
            ("user", "Please fix the failing test."),
            ("assistant", "Running the tests."),
            ("assistant", "Tests pass."),
            ("user", "approved: go ahead"),
            ("assistant", "Fixed: the test passes."),
        ]
    );
    assert!(snap.get("activeTurn").is_none(), "{snap}");
    assert_eq!(snap["operations"]["items"][0]["id"], op_id);
    assert_eq!(snap["thread"]["messageCount"], 5);
    assert_eq!(snap["messages"]["nextBeforeSequence"], Value::Null);
    // Paging: one page of one message before the third.
    let third = snap["messages"]["items"][2]["sequence"].clone();
    let older = roll
        .ok(
            "thread.snapshot",
            json!({"threadId": thread_id, "limit": 1, "messageBeforeSequence": third}),
        )
        .await;
    assert_eq!(older["messages"]["items"][0]["role"], "assistant");
    assert_eq!(
        older["messages"]["nextBeforeSequence"],
        older["messages"]["items"][0]["sequence"]
    );

    // The next turn may start now.
    roll.ok(
        "turn.start",
        json!({"requestId": uuid(), "threadId": thread_id, "turnId": uuid(),
            "input": {"text": "Thanks; now the docs."}}),
    )
    .await;
    roll.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_restarted_mid_turn_the_client_reconnects_and_the_turn_completes() {
    let Some(schema) = schema() else { return };
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let b_key = b.key();
    let mut roll = Roll::start(&home(&a), &b_key, schema.clone()).await;
    roll.initialize().await;
    let created = roll
        .ok(
            "thread.create",
            json!({"requestId": uuid(), "title": "Long job"}),
        )
        .await;
    let thread_id = created["thread"]["id"].as_str().unwrap().to_string();
    let turn_id = uuid();
    roll.ok(
        "turn.start",
        json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn_id,
            "input": {"text": "Build the release."}}),
    )
    .await;
    let th = nth_msg(&b, 1).await["th"].as_str().unwrap().to_string();
    let bh = home(&b);
    cli(&bh, &["state", &th, "working"]).await;
    roll.event("turn.started").await;

    // Both the front and the node go away mid-turn.
    roll.stop().await;
    let a_home = a.stop().await;
    let a = TestNode::start_in(a_home, "alice").await;

    // The client reconnects: a new runtime instance, the thread and its turn are there.
    let mut roll = Roll::start(&home(&a), &b_key, schema).await;
    roll.initialize().await;
    let list = roll.ok("thread.list", json!({"limit": 10})).await;
    assert_eq!(list["items"][0]["id"], json!(thread_id));
    assert_eq!(list["items"][0]["title"], "Long job");
    let open = roll.ok("thread.open", json!({"threadId": thread_id})).await;
    assert_eq!(open["activeTurn"]["id"], json!(turn_id));
    assert_eq!(open["activeTurn"]["status"], "running");
    let snap = roll
        .ok(
            "thread.snapshot",
            json!({"threadId": thread_id, "limit": 10}),
        )
        .await;
    assert_eq!(
        snap["messages"]["items"][0]["parts"][0]["text"],
        "Build the release."
    );
    assert_eq!(snap["activeTurn"]["id"], json!(turn_id));

    // The peer answers once the nodes are connected again.
    a.connect(&b).await;
    cli(&bh, &["send", "-t", &th, "Release built."]).await;
    cli(&bh, &["state", &th, "done"]).await;
    let m = roll.event("message.completed").await;
    assert_eq!(m["params"]["event"]["text"], "Release built.");
    assert_eq!(m["params"]["turnId"], json!(turn_id));
    let done = roll.event("turn.completed").await;
    assert_eq!(done["params"]["turnId"], json!(turn_id));
    let open = roll.ok("thread.open", json!({"threadId": thread_id})).await;
    assert!(open.get("activeTurn").is_none(), "{open}");
    roll.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_closes_the_awp_thread_and_a_peer_failure_fails_the_turn() {
    let Some(schema) = schema() else { return };
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let mut roll = Roll::start(&home(&a), &b.key(), schema).await;
    roll.initialize().await;
    let t = roll.ok("thread.create", json!({"requestId": uuid()})).await;
    let thread_id = t["thread"]["id"].as_str().unwrap().to_string();
    let turn_id = uuid();
    roll.ok(
        "turn.start",
        json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn_id,
            "input": {"text": "Start something long."}}),
    )
    .await;
    let r = roll
        .ok(
            "turn.cancel",
            json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn_id}),
        )
        .await;
    assert_eq!(r, json!({"cancelling": true}));
    let ev = roll.event("turn.cancelled").await;
    assert_eq!(ev["params"]["turnId"], json!(turn_id));
    // Bob sees our state closed.
    let closed = eventually(20, || async {
        b.inbound()
            .await
            .into_iter()
            .find(|e| e["t"] == "state" && e["line"]["state"] == "closed")
    })
    .await;
    let th = closed["th"].as_str().unwrap().to_string();

    let turn2 = uuid();
    roll.ok(
        "turn.start",
        json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn2,
            "input": {"text": "Try again."}}),
    )
    .await;
    nth_msg(&b, 2).await;
    cli(
        &b.path(),
        &["state", &th, "failed", "--note", "out of disk"],
    )
    .await;
    let f = roll.event("turn.failed").await;
    assert_eq!(f["params"]["turnId"], json!(turn2));
    assert_eq!(f["params"]["event"]["message"], "out of disk");
    assert_eq!(f["params"]["event"]["stage"], "execute");
    // A local delete leaves the AWP thread at both nodes.
    roll.ok(
        "thread.delete",
        json!({"requestId": uuid(), "threadId": thread_id}),
    )
    .await;
    let list = roll.ok("thread.list", json!({"limit": 10})).await;
    assert_eq!(list["items"], json!([]));
    let threads = cli(&b.path(), &["threads"]).await;
    assert!(threads.to_string().contains(&th), "{threads}");
    roll.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_front_follows_the_node_across_its_restart() {
    let Some(schema) = schema() else { return };
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let mut roll = Roll::start(&home(&a), &b.key(), schema).await;
    roll.initialize().await;
    let t = roll.ok("thread.create", json!({"requestId": uuid()})).await;
    let thread_id = t["thread"]["id"].as_str().unwrap().to_string();
    let turn_id = uuid();
    roll.ok(
        "turn.start",
        json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn_id,
            "input": {"text": "Keep going."}}),
    )
    .await;
    let th = nth_msg(&b, 1).await["th"].as_str().unwrap().to_string();

    let a_home = a.stop().await;
    // While the node is down, what needs it fails, retryably; local reads still answer.
    let r = roll
        .call("thread.open", json!({"threadId": thread_id}))
        .await;
    assert_eq!(r["error"]["data"]["rollCode"], "INTERNAL_ERROR");
    assert_eq!(r["error"]["data"]["retryable"], true);
    roll.ok("thread.list", json!({"limit": 1})).await;
    // The peer answers while our node is down; its lines wait in bob's outbox.
    cli(&b.path(), &["state", &th, "working"]).await;
    cli(&b.path(), &["state", &th, "done"]).await;

    let a = TestNode::start_in(a_home, "alice").await;
    a.connect(&b).await;
    let started = roll.event("turn.started").await;
    assert_eq!(started["params"]["turnId"], json!(turn_id));
    let done = roll.event("turn.completed").await;
    assert_eq!(done["params"]["turnId"], json!(turn_id));
    roll.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roll_refuses_an_unknown_peer_and_a_missing_node_on_one_line() {
    let run = |home: PathBuf, peer: &'static str| async move {
        let out = Command::new(env!("CARGO_BIN_EXE_awp"))
            .arg("--home")
            .arg(&home)
            .args(["roll", "--peer", peer])
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let empty = tempfile::tempdir().unwrap();
    let (code, err) = run(empty.path().to_path_buf(), "bob").await;
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let a = TestNode::start("alice").await;
    let (code, err) = run(a.path(), "nobody").await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no known peer matches \"nobody\""), "{err}");
}
