//! The Roll front against a fake node: one test per `rollCode` the front produces, the
//! mapping of peer lines to events, and hostile peer data. Every frame out is validated
//! against the seed schema when `../shared` (or `$AWP_SHARED`) is there.

use super::front::{Front, TOOL_MIME};
use super::node::NodeApi;
use super::rpc::MAX_FRAME_BYTES;
use super::store::StateFile;
use super::{read_frame, Input};
use crate::control::{ClientError, ControlError, Event, Request, Response};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;

const PEER: &str = "ed25519:BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";

#[derive(Default)]
struct Fake {
    calls: RefCell<Vec<Request>>,
    answers: RefCell<VecDeque<Result<Response, ClientError>>>,
    lines: RefCell<Vec<Event>>,
    n: RefCell<u64>,
}

#[derive(Clone, Default)]
struct FakeNode(Rc<Fake>);

impl NodeApi for FakeNode {
    async fn call(&self, req: Request) -> Result<Response, ClientError> {
        self.0.calls.borrow_mut().push(req);
        if let Some(a) = self.0.answers.borrow_mut().pop_front() {
            return a;
        }
        let mut n = self.0.n.borrow_mut();
        *n += 1;
        Ok(Response::ok(
            json!({"id": format!("01MSG{n:021}"), "status": "queued"}),
        ))
    }
    async fn thread_lines(
        &self,
        _peer: &str,
        th: &str,
        visit: &mut dyn FnMut(&Event),
    ) -> Result<(), ClientError> {
        for l in self.0.lines.borrow().iter() {
            if l.get("th").and_then(Value::as_str) == Some(th) {
                visit(l);
            }
        }
        Ok(())
    }
}

fn schema() -> Option<jsonschema::Validator> {
    let shared = std::env::var_os("AWP_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let text =
        std::fs::read_to_string(shared.join("seeds/roll-runtime-protocol.schema.json")).ok()?;
    let mut v: Value = serde_json::from_str(&text).ok()?;
    // The seed refers to nested `$defs.__schema0` from the root (see tests/roll.rs).
    let any = json!({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"},
        {"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/__schema0"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/__schema0"}}]});
    v["$defs"]["__schema0"] = any;
    jsonschema::validator_for(&v).ok()
}

struct T {
    front: Front<FakeNode>,
    node: FakeNode,
    schema: Option<jsonschema::Validator>,
    _home: tempfile::TempDir,
    next: u64,
    seq: u64,
    last_sequence: u64,
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl T {
    fn new() -> T {
        let home = tempfile::tempdir().unwrap();
        let (file, saved) = StateFile::open(home.path(), PEER).unwrap();
        let node = FakeNode::default();
        let schema = schema();
        if schema.is_none() {
            eprintln!("schema checks skipped: ../shared is absent");
        }
        T {
            front: Front::new(node.clone(), file, saved, "bob"),
            node,
            schema,
            _home: home,
            next: 0,
            seq: 0,
            last_sequence: 0,
        }
    }

    fn check(&mut self, v: &Value) {
        if let Some(s) = &self.schema {
            let errors: Vec<String> = s.iter_errors(v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{v} does not validate: {errors:?}");
        }
        if v["method"] == "runtime.event" {
            let s = v["params"]["sequence"].as_u64().unwrap();
            assert!(s > self.last_sequence);
            self.last_sequence = s;
        }
    }

    /// A request; its response, and the notifications before it.
    async fn call(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.next += 1;
        let req = json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        self.front.handle_frame(req.to_string().as_bytes()).await;
        let mut out = self.front.take_output();
        for v in &out {
            self.check(v);
        }
        let resp = out.pop().expect("a response");
        assert_eq!(resp["id"], json!(self.next), "{resp}");
        (resp, out)
    }

    async fn ok(&mut self, method: &str, params: Value) -> Value {
        let (r, _) = self.call(method, params).await;
        assert!(r.get("result").is_some(), "{method}: {r}");
        r["result"].clone()
    }

    /// The roll code and retryable of a failed request.
    async fn err(&mut self, method: &str, params: Value) -> (String, bool) {
        let (r, _) = self.call(method, params).await;
        let d = &r["error"]["data"];
        assert!(d.is_object(), "{method} {r}");
        (
            d["rollCode"].as_str().unwrap().to_string(),
            d["retryable"].as_bool().unwrap(),
        )
    }

    async fn init(&mut self) {
        self.ok(
            "initialize",
            json!({"protocolVersions": ["1.0"], "client": {"name": "t", "version": "1"}}),
        )
        .await;
    }

    async fn thread(&mut self) -> String {
        let r = self.ok("thread.create", json!({"requestId": uuid()})).await;
        r["thread"]["id"].as_str().unwrap().to_string()
    }

    fn node_last_th(&self) -> String {
        match self.node.0.calls.borrow().last() {
            Some(Request::Send { th: Some(th), .. }) => th.clone(),
            other => panic!("no send: {other:?}"),
        }
    }

    /// Start a turn; returns (turn id, AWP th) and feeds back our msg's log line.
    async fn turn(&mut self, thread_id: &str) -> (String, String) {
        let turn = uuid();
        self.ok(
            "turn.start",
            json!({"requestId": uuid(), "threadId": thread_id, "turnId": turn,
                "input": {"text": "go"}}),
        )
        .await;
        let th = self.node_last_th();
        let id = format!("01MSG{:021}", *self.node.0.n.borrow());
        self.line(
            "out",
            &th,
            &id,
            "msg",
            json!({"parts": [{"k": "text", "text": "go"}]}),
        );
        (turn, th)
    }

    /// Feed a log line; the notifications it produced.
    fn line(&mut self, dir: &str, th: &str, id: &str, t: &str, body: Value) -> Vec<Value> {
        self.seq += 1;
        let mut line = body;
        line["t"] = json!(t);
        line["id"] = json!(id);
        line["th"] = json!(th);
        let ev: Event = serde_json::from_value(json!({"event": "line", "seq": self.seq,
            "dir": dir, "peer": PEER, "th": th, "id": id, "t": t, "line": line,
            "at": "2026-11-30T20:00:00.000Z"}))
        .unwrap();
        self.node.0.lines.borrow_mut().push(ev.clone());
        self.front.apply(&ev).unwrap();
        let out = self.front.take_output();
        for v in &out {
            self.check(v);
        }
        out
    }

    fn peer_state(&mut self, th: &str, id: &str, state: &str, note: Option<&str>) -> Vec<Value> {
        let mut b = json!({"state": state});
        if let Some(n) = note {
            b["note"] = json!(n);
        }
        self.line("in", th, id, "state", b)
    }
}

fn types(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| e["params"]["event"]["type"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn protocol_version_unsupported() {
    let mut t = T::new();
    let (code, retry) = t
        .err(
            "initialize",
            json!({"protocolVersions": ["0.9", "2.0"], "client": {"name": "t", "version": "1"}}),
        )
        .await;
    assert_eq!(
        (code.as_str(), retry),
        ("PROTOCOL_VERSION_UNSUPPORTED", false)
    );
    // Still not initialized.
    let (code, _) = t.err("thread.list", json!({"limit": 1})).await;
    assert_eq!(code, "INITIALIZE_REQUIRED");
}

#[tokio::test]
async fn initialize_required_for_every_other_method() {
    let mut t = T::new();
    for m in super::rpc::METHODS.iter().filter(|m| **m != "initialize") {
        let (code, retry) = t.err(m, json!({})).await;
        assert_eq!(
            (code.as_str(), retry),
            ("INITIALIZE_REQUIRED", false),
            "{m}"
        );
    }
    // An unknown method is not found, initialized or not.
    let (r, _) = t.call("thread.explode", json!({})).await;
    assert_eq!(r["error"]["code"], -32601);
    t.init().await;
    let r = t.ok("thread.list", json!({"limit": 5})).await;
    assert_eq!(r, json!({"items": [], "nextCursor": null}));
}

#[tokio::test]
async fn invalid_params_one_per_rejection() {
    let mut t = T::new();
    let (code, _) = t
        .err(
            "initialize",
            json!({"protocolVersions": [], "client": {"name": "t", "version": "1"}}),
        )
        .await;
    assert_eq!(code, "INVALID_PARAMS");
    t.init().await;
    let th = t.thread().await;
    let reused = uuid();
    t.ok(
        "thread.rename",
        json!({"requestId": reused, "threadId": th, "title": "x"}),
    )
    .await;
    let long = "é".repeat(201);
    let cases: Vec<(&str, Value)> = vec![
        ("thread.list", json!({"limit": 0})),
        ("thread.list", json!({"limit": 501})),
        ("thread.list", json!({"limit": 1, "cursor": "x"})),
        ("thread.list", json!({"limit": 1, "extra": true})),
        ("thread.create", json!({})),
        ("thread.create", json!({"requestId": "not-a-uuid"})),
        ("thread.create", json!({"requestId": uuid(), "title": ""})),
        ("thread.create", json!({"requestId": uuid(), "title": long})),
        ("thread.open", json!({"threadId": 7})),
        ("thread.open", json!({"threadId": "123"})),
        ("thread.snapshot", json!({"threadId": th, "limit": 0})),
        (
            "thread.rename",
            json!({"requestId": uuid(), "threadId": th, "title": long}),
        ),
        ("thread.delete", json!({"requestId": uuid()})),
        (
            "turn.start",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid(), "input": {"text": ""}}),
        ),
        (
            "turn.start",
            json!({"requestId": uuid(), "threadId": th, "turnId": "x", "input": {"text": "a"}}),
        ),
        (
            "turn.start",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid(), "input": {"text": "a", "images": []}}),
        ),
        (
            "turn.start",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid(),
            "input": {"text": "a".repeat(super::rpc::MAX_INPUT_BYTES + 1)}}),
        ),
        (
            "approval.respond",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid(),
            "approvalId": uuid(), "decision": "maybe"}),
        ),
        (
            "operation.get",
            json!({"threadId": th, "operationId": "op"}),
        ),
        // A requestId used before for another method.
        (
            "thread.delete",
            json!({"requestId": reused, "threadId": th}),
        ),
    ];
    for (m, p) in cases {
        let (code, retry) = t.err(m, p.clone()).await;
        assert_eq!((code.as_str(), retry), ("INVALID_PARAMS", false), "{m} {p}");
    }
    // Nothing was sent to the node.
    assert!(t.node.0.calls.borrow().is_empty());
}

#[tokio::test]
async fn thread_not_found() {
    let mut t = T::new();
    t.init().await;
    let gone = t.thread().await;
    t.ok(
        "thread.delete",
        json!({"requestId": uuid(), "threadId": gone}),
    )
    .await;
    for (m, p) in [
        ("thread.open", json!({"threadId": gone})),
        ("thread.snapshot", json!({"threadId": uuid(), "limit": 5})),
        ("thread.capabilities", json!({"threadId": gone})),
        (
            "turn.start",
            json!({"requestId": uuid(), "threadId": gone, "turnId": uuid(), "input": {"text": "a"}}),
        ),
    ] {
        let (code, retry) = t.err(m, p).await;
        assert_eq!((code.as_str(), retry), ("THREAD_NOT_FOUND", false), "{m}");
    }
}

#[tokio::test]
async fn thread_busy_while_a_turn_runs() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (turn, awp) = t.turn(&th).await;
    let (code, retry) = t
        .err(
            "thread.delete",
            json!({"requestId": uuid(), "threadId": th}),
        )
        .await;
    assert_eq!((code.as_str(), retry), ("THREAD_BUSY", true));
    t.peer_state(&awp, "01S1", "done", None);
    let _ = turn;
    t.ok(
        "thread.delete",
        json!({"requestId": uuid(), "threadId": th}),
    )
    .await;
}

#[tokio::test]
async fn turn_not_found() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (code, retry) = t
        .err(
            "turn.cancel",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid()}),
        )
        .await;
    assert_eq!((code.as_str(), retry), ("TURN_NOT_FOUND", false));
    // A finished turn takes no approval answer.
    let (turn, awp) = t.turn(&th).await;
    t.peer_state(&awp, "01S1", "done", None);
    let (code, _) = t
        .err(
            "approval.respond",
            json!({"requestId": uuid(), "threadId": th, "turnId": turn,
                "approvalId": uuid(), "decision": "approve"}),
        )
        .await;
    assert_eq!(code, "TURN_NOT_FOUND");
    // Cancelling it is a no-op.
    let r = t
        .ok(
            "turn.cancel",
            json!({"requestId": uuid(), "threadId": th, "turnId": turn}),
        )
        .await;
    assert_eq!(r, json!({"cancelling": false}));
}

#[tokio::test]
async fn turn_already_active_and_request_ids_are_idempotent() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (turn, _) = t.turn(&th).await;
    let (code, retry) = t
        .err(
            "turn.start",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid(), "input": {"text": "b"}}),
        )
        .await;
    assert_eq!((code.as_str(), retry), ("TURN_ALREADY_ACTIVE", true));
    // The same cancel twice: one state line, the same answer.
    let rid = uuid();
    let p = json!({"requestId": rid, "threadId": th, "turnId": turn});
    let (a, evs) = t.call("turn.cancel", p.clone()).await;
    assert_eq!(types(&evs), ["turn.cancelled"]);
    let (b, evs) = t.call("turn.cancel", p).await;
    assert!(evs.is_empty());
    assert_eq!(a["result"], b["result"]);
    let states = t
        .node
        .0
        .calls
        .borrow()
        .iter()
        .filter(|c| matches!(c, Request::State { state, .. } if state == "closed"))
        .count();
    assert_eq!(states, 1);
}

#[tokio::test]
async fn approval_not_found() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (turn, awp) = t.turn(&th).await;
    let evs = t.peer_state(&awp, "01S1", "waiting", Some("rm -rf target?"));
    assert_eq!(types(&evs), ["turn.started", "approval.required"]);
    let approval = evs[1]["params"]["event"]["approval"]["id"].clone();
    let (code, retry) = t
        .err(
            "approval.respond",
            json!({"requestId": uuid(), "threadId": th, "turnId": turn,
                "approvalId": uuid(), "decision": "reject"}),
        )
        .await;
    assert_eq!((code.as_str(), retry), ("APPROVAL_NOT_FOUND", false));
    t.ok(
        "approval.respond",
        json!({"requestId": uuid(), "threadId": th, "turnId": turn,
            "approvalId": approval, "decision": "reject", "reason": "no"}),
    )
    .await;
    // Answered once: a second answer finds nothing pending.
    let (code, _) = t
        .err(
            "approval.respond",
            json!({"requestId": uuid(), "threadId": th, "turnId": turn,
                "approvalId": approval, "decision": "approve"}),
        )
        .await;
    assert_eq!(code, "APPROVAL_NOT_FOUND");
    let calls = t.node.0.calls.borrow();
    match calls.last() {
        Some(Request::Send { re, parts, .. }) => {
            assert_eq!(re.as_deref(), Some("01S1"));
            assert_eq!(parts[0]["text"], "rejected: no");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn runtime_closing() {
    let mut t = T::new();
    t.init().await;
    t.front.begin_closing();
    let (code, retry) = t.err("thread.list", json!({"limit": 1})).await;
    assert_eq!((code.as_str(), retry), ("RUNTIME_CLOSING", true));
}

#[tokio::test]
async fn outcome_unknown_when_the_node_does_not_answer() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let timeout = ClientError::Timeout(std::time::Duration::from_secs(30));
    t.node.0.answers.borrow_mut().push_back(Err(timeout));
    let (code, retry) = t
        .err(
            "turn.start",
            json!({"requestId": uuid(), "threadId": th, "turnId": uuid(), "input": {"text": "a"}}),
        )
        .await;
    assert_eq!((code.as_str(), retry), ("OUTCOME_UNKNOWN", false));
}

#[tokio::test]
async fn internal_error_when_the_node_refuses_or_is_down() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let refusal = |code: &str| {
        Ok(Response {
            ok: false,
            error: Some(ControlError {
                code: code.into(),
                message: "no".into(),
                hint: None,
            }),
            body: Default::default(),
        })
    };
    let down = ClientError::NotRunning {
        path: "/x".into(),
        source: std::io::Error::other("refused"),
    };
    for (answer, retryable) in [
        (refusal("disk_full"), true),
        (refusal("bad_request"), false),
        (Err(down), true),
    ] {
        t.node.0.answers.borrow_mut().push_back(answer);
        let (code, retry) = t
            .err(
                "turn.start",
                json!({"requestId": uuid(), "threadId": th, "turnId": uuid(), "input": {"text": "a"}}),
            )
            .await;
        assert_eq!((code.as_str(), retry), ("INTERNAL_ERROR", retryable));
    }
    // No turn was recorded: the next start is not refused as active.
    t.turn(&th).await;
}

#[tokio::test]
async fn peer_lines_become_events_in_order_with_increasing_sequence() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (turn, awp) = t.turn(&th).await;
    assert_eq!(
        types(&t.peer_state(&awp, "01S1", "working", None)),
        ["turn.started"]
    );
    // Working again announces nothing new.
    assert!(t.peer_state(&awp, "01S2", "working", None).is_empty());
    let long = "x".repeat(super::front::DELTA_CHARS + 1);
    let evs = t.line("in", &awp, "01M1", "msg", json!({"parts": [
        {"k": "text", "text": long},
        {"k": "data", "mime": TOOL_MIME, "data": {"phase": "output", "toolCallId": "c", "toolName": "sh", "stream": "stderr", "delta": "warn"}},
        {"k": "data", "mime": "application/vnd.awp.reasoning+json", "data": {"delta": "thinking"}},
    ]}));
    assert_eq!(
        types(&evs),
        [
            "message.started",
            "message.delta",
            "message.delta",
            "message.completed",
            "tool.output",
            "reasoning.summary.delta"
        ]
    );
    assert!(evs.iter().all(|e| e["params"]["turnId"] == json!(turn)));
    assert_eq!(evs[3]["params"]["event"]["text"], json!(long));
    let evs = t.peer_state(&awp, "01S3", "failed", None);
    assert_eq!(types(&evs), ["turn.failed"]);
    // After the turn: peer msgs still show, without a turn.
    let evs = t.line(
        "in",
        &awp,
        "01M2",
        "msg",
        json!({"parts": [{"k": "text", "text": "late"}]}),
    );
    assert_eq!(types(&evs).len(), 3);
    assert!(evs[0]["params"].get("turnId").is_none());
    // A state with no running turn is nothing.
    assert!(t.peer_state(&awp, "01S4", "done", None).is_empty());
}

#[tokio::test]
async fn hostile_peer_data_is_ignored_not_fatal() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (_turn, awp) = t.turn(&th).await;
    let name = "n".repeat(super::front::MAX_NAME_BYTES + 1);
    let bad = [
        json!({"phase": "started", "toolCallId": "", "toolName": "sh"}),
        json!({"phase": "started", "toolCallId": "c", "toolName": name}),
        json!({"phase": "exploded", "toolCallId": "c", "toolName": "sh"}),
        json!({"phase": "output", "toolCallId": "c", "toolName": "sh", "stream": "stdin", "delta": "x"}),
        json!({"phase": "output", "toolCallId": "c", "toolName": "sh"}),
        json!({"phase": "completed", "toolCallId": "c", "toolName": "sh", "outcome": {"kind": "great"}}),
        json!({"toolCallId": "c", "toolName": "sh"}),
        json!("not an object"),
        json!({"phase": "started", "toolCallId": 5, "toolName": "sh"}),
    ];
    for (n, data) in bad.iter().enumerate() {
        let evs = t.line(
            "in",
            &awp,
            &format!("01B{n}"),
            "msg",
            json!({"parts": [
            {"k": "data", "mime": TOOL_MIME, "data": data}]}),
        );
        // Only the turn's announcement, never a malformed tool event.
        assert!(
            types(&evs).iter().all(|e| e == "turn.started"),
            "{data}: {evs:?}"
        );
    }
    // Odd lines: no parts, parts not a list, unknown kinds.
    for body in [
        json!({}),
        json!({"parts": 7}),
        json!({"parts": [{"k": "blob"}, 3]}),
    ] {
        assert!(t.line("in", &awp, "01X", "msg", body).is_empty());
    }
    assert!(
        t.peer_state(&awp, "01S9", "waiting", None).is_empty(),
        "no note, no approval"
    );
}

#[tokio::test]
async fn stale_peer_lines_before_our_msg_do_not_end_the_new_turn() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let turn = uuid();
    t.ok(
        "turn.start",
        json!({"requestId": uuid(), "threadId": th, "turnId": turn, "input": {"text": "a"}}),
    )
    .await;
    let awp = t.node_last_th();
    // The peer's "done" of an earlier exchange lands in the log before our msg.
    assert!(t.peer_state(&awp, "01OLD", "done", None).is_empty());
    let id = format!("01MSG{:021}", *t.node.0.n.borrow());
    t.line(
        "out",
        &awp,
        &id,
        "msg",
        json!({"parts": [{"k": "text", "text": "a"}]}),
    );
    let snap = t.ok("thread.open", json!({"threadId": th})).await;
    assert_eq!(snap["activeTurn"]["id"], json!(turn));
    assert_eq!(
        types(&t.peer_state(&awp, "01NEW", "done", None)),
        ["turn.started", "turn.completed"]
    );
}

#[tokio::test]
async fn detached_threads_get_no_events_until_opened() {
    let mut t = T::new();
    t.init().await;
    let th = t.thread().await;
    let (_turn, awp) = t.turn(&th).await;
    let r = t
        .ok(
            "thread.detach",
            json!({"requestId": uuid(), "threadId": th}),
        )
        .await;
    assert_eq!(r, json!({"detached": true}));
    assert!(t.peer_state(&awp, "01S1", "working", None).is_empty());
    t.ok("thread.open", json!({"threadId": th})).await;
    let evs = t.line(
        "in",
        &awp,
        "01M1",
        "msg",
        json!({"parts": [{"k": "text", "text": "hi"}]}),
    );
    assert_eq!(
        types(&evs),
        ["message.started", "message.delta", "message.completed"]
    );
}

#[tokio::test]
async fn events_before_initialize_are_not_sent_and_lines_applied_twice_count_once() {
    let mut t = T::new();
    // A thread and turn from an earlier run of the front.
    t.init().await;
    let th = t.thread().await;
    let (_turn, awp) = t.turn(&th).await;
    let cursor = t.front.cursor();
    // The saved state in a second front (its own file, as the first one holds the lock).
    let saved = serde_json::from_slice(
        &std::fs::read(super::store::path_for(t._home.path(), PEER)).unwrap(),
    )
    .unwrap();
    let home2 = tempfile::tempdir().unwrap();
    let (f2, _) = StateFile::open(home2.path(), PEER).unwrap();
    let mut fresh = Front::new(t.node.clone(), f2, saved, "bob");
    assert_eq!(fresh.cursor(), cursor);
    let ev: Event = serde_json::from_value(json!({"event": "line", "seq": cursor + 1,
        "dir": "in", "peer": PEER, "th": awp, "id": "01S1", "t": "state",
        "line": {"state": "working"}}))
    .unwrap();
    fresh.apply(&ev).unwrap();
    fresh.apply(&ev).unwrap();
    assert!(fresh.take_output().is_empty(), "no client yet");
    assert_eq!(fresh.cursor(), cursor + 1);
}

#[tokio::test]
async fn frames_over_the_cap_are_skipped_and_answered() {
    let mut input = vec![b'x'; MAX_FRAME_BYTES + 10];
    input.push(b'\n');
    input.extend_from_slice(b"{\"a\":1}\r\n");
    input.extend_from_slice(&vec![b'y'; MAX_FRAME_BYTES]);
    let mut r = tokio::io::BufReader::new(&input[..]);
    assert_eq!(read_frame(&mut r).await.unwrap(), Some(Input::TooLarge));
    assert_eq!(
        read_frame(&mut r).await.unwrap(),
        Some(Input::Line(b"{\"a\":1}\r".to_vec()))
    );
    // Exactly the cap, without a newline at the end: accepted.
    match read_frame(&mut r).await.unwrap() {
        Some(Input::Line(l)) => assert_eq!(l.len(), MAX_FRAME_BYTES),
        other => panic!("{other:?}"),
    }
    assert_eq!(read_frame(&mut r).await.unwrap(), None);
    let mut t = T::new();
    t.front.frame_too_large();
    let out = t.front.take_output();
    assert_eq!(out[0]["error"]["data"]["rollCode"], "INVALID_PARAMS");
    assert_eq!(out[0]["id"], Value::Null);
    t.check(&out[0].clone());
}

#[tokio::test]
async fn a_client_that_stops_reading_ends_the_front_not_the_node() {
    let mut t = T::new();
    let (tx, _rx) = tokio::sync::mpsc::channel(2);
    // Three answers for a queue of two: the front gives up on the client at once,
    // without waiting for it.
    for _ in 0..3 {
        t.front.handle_frame(b"{").await;
    }
    match super::flush(&mut t.front, &tx) {
        Err(super::RollExit::Client(why)) => assert!(why.contains("unread"), "{why}"),
        other => panic!("{other:?}"),
    }
    // A client that is gone.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    drop(rx);
    t.front.handle_frame(b"{").await;
    assert!(matches!(
        super::flush(&mut t.front, &tx),
        Err(super::RollExit::Client(_))
    ));
}
