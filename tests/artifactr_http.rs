//! The local artifactr.v1 endpoint (`--artifactr`): an HTTP client and a WebSocket client
//! attach to a node's artifact threads; every body and frame is validated against the seed
//! schema with the UnknownEvent fix (spec/artifactr.v1.schema.json).

mod common;

use awp_node::control::Request as CtlRequest;
use awp_node::node::{NodeConfig, NodeHandle};
use common::*;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;
use tempfile::TempDir;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

// ---------------------------------------------------------------- schema

fn schema() -> Value {
    serde_json::from_str(include_str!("../spec/artifactr.v1.schema.json")).unwrap()
}

/// Validators rooted at `$defs/<name>`, plus `server` (any server frame).
struct Schema(HashMap<&'static str, jsonschema::Validator>);

impl Schema {
    fn new() -> Schema {
        let mut m = HashMap::new();
        for def in [
            "CommandResult",
            "EventFrame",
            "ErrorFrame",
            "Welcome",
            "ReplayComplete",
            "UserActor",
            "ExternalAgentActor",
        ] {
            let mut s = schema();
            s["$ref"] = json!(format!("#/$defs/{def}"));
            m.insert(def, jsonschema::validator_for(&s).unwrap());
        }
        let mut s = schema();
        s["$ref"] = json!("#/properties/server");
        m.insert("server", jsonschema::validator_for(&s).unwrap());
        let sc = Schema(m);
        // The validators are not vacuous.
        assert!(!sc.0["Welcome"].is_valid(&json!({"type": "welcome"})));
        assert!(!sc.0["server"].is_valid(&json!({"type": "nope"})));
        assert!(!sc.0["EventFrame"].is_valid(&json!({"type": "event", "seq": 1})));
        sc
    }

    fn check(&self, def: &str, v: &Value) {
        let errs: Vec<String> = self.0[def].iter_errors(v).map(|e| e.to_string()).collect();
        assert!(errs.is_empty(), "{def}: {v}\n{errs:?}");
        // Any server frame is a valid `server` frame too (one branch of the oneOf).
        if def != "UserActor" && def != "ExternalAgentActor" {
            let errs: Vec<String> = self.0["server"]
                .iter_errors(v)
                .map(|e| e.to_string())
                .collect();
            assert!(errs.is_empty(), "server: {v}\n{errs:?}");
        }
    }

    fn actor(&self, v: &Value) {
        let def = match v["kind"].as_str() {
            Some("user") => "UserActor",
            _ => "ExternalAgentActor",
        };
        self.check(def, v);
    }
}

// ---------------------------------------------------------------- nodes

struct Node {
    t: TestNode,
    http: String,
    token: String,
}

async fn node_with_endpoint(name: &str) -> Node {
    let home = TempDir::new().unwrap();
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        artifactr: Some("127.0.0.1:0".into()),
        ..Default::default()
    })
    .await
    .expect("node starts");
    let http = handle.listening_event()["artifactr"]
        .as_str()
        .expect("listening names the artifactr address")
        .to_string();
    let token = std::fs::read_to_string(home.path().join("artifactr.token"))
        .unwrap()
        .trim()
        .to_string();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(home.path().join("artifactr.token")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }
    Node {
        t: TestNode { home, handle },
        http,
        token,
    }
}

async fn art(home: &std::path::Path, action: &str, args: Value) -> Value {
    let r = ctl(
        home,
        CtlRequest::Artifact {
            action: action.into(),
            args,
        },
    )
    .await;
    assert!(r.ok, "artifact {action}: {:?}", r.error);
    Value::Object(r.body)
}

/// Host (with the endpoint) and guest (with the endpoint), connected; the host opened an
/// artifact thread with a markdown plan. (host, guest, th, artifact id).
async fn pair() -> (Node, Node, String, String) {
    let host = node_with_endpoint("host@test").await;
    let guest = node_with_endpoint("guest@test").await;
    guest.t.connect(&host.t).await;
    let r = art(
        &host.t.path(),
        "new",
        json!({"peer": guest.t.key(), "kind": "markdown", "title": "Plan", "data": {"text": "# Plan\n- design\n"}}),
    )
    .await;
    assert_eq!(r["result"]["ok"], json!(true), "{r}");
    let th = r["th"].as_str().unwrap().to_string();
    let id = r["result"]["outcome"]["artifact_id"]
        .as_str()
        .unwrap()
        .to_string();
    (host, guest, th, id)
}

// ---------------------------------------------------------------- HTTP client

/// One HTTP/1.1 request; (status, JSON body).
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let bytes = match &body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Bytes::from(serde_json::to_vec(b).unwrap())
        }
        None => Bytes::new(),
    };
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        send.send_request(req.body(Full::new(bytes)).unwrap()),
    )
    .await
    .expect("answer in time")
    .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
    };
    (status, v)
}

impl Node {
    async fn get(&self, path: &str) -> (u16, Value) {
        http(&self.http, "GET", path, Some(&self.token), None).await
    }
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        http(&self.http, "POST", path, Some(&self.token), Some(body)).await
    }
}

fn cmd(id: &str, command: Value) -> Value {
    json!({"type": "command", "command_id": id, "command": command})
}

fn replace(old: &str, new: &str) -> Value {
    json!({"kind": "text_edits", "edits": [{"old": old, "new": new}]})
}

// ---------------------------------------------------------------- WebSocket client

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws(n: &Node, th: &str, auth: &str) -> Ws {
    let url = match auth {
        "query" => format!("ws://{}/workspaces/{th}/stream?token={}", n.http, n.token),
        _ => format!("ws://{}/workspaces/{th}/stream", n.http),
    };
    let mut req = url.into_client_request().unwrap();
    match auth {
        "header" => {
            req.headers_mut().insert(
                "authorization",
                format!("Bearer {}", n.token).parse().unwrap(),
            );
        }
        "wrong" => {
            req.headers_mut().insert(
                "authorization",
                "Bearer nope-nope-nope-nope".parse().unwrap(),
            );
        }
        _ => {}
    }
    let (s, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    s
}

/// The next text frame as JSON, or `Err(close code)`.
async fn next(s: &mut Ws) -> Result<Value, u16> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), s.next())
            .await
            .expect("a frame in time");
        match m {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(Some(c)))) => return Err(u16::from(c.code)),
            Some(Ok(Message::Close(None))) | None => return Err(0),
            Some(Ok(_)) => continue,
            Some(Err(_)) => return Err(0),
        }
    }
}

async fn send(s: &mut Ws, v: Value) {
    tokio::time::timeout(
        Duration::from_secs(20),
        s.send(Message::Text(v.to_string().into())),
    )
    .await
    .expect("the frame sent in time")
    .unwrap();
}

fn hello(resume: u64) -> Value {
    json!({"type": "hello", "protocol": "artifactr.v1", "resume_after_seq": resume})
}

/// Handshake and replay: (welcome, replayed events); every frame validated.
async fn handshake(s: &mut Ws, sc: &Schema, h: Value) -> (Value, Vec<Value>) {
    send(s, h).await;
    let welcome = next(s).await.unwrap();
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    sc.check("Welcome", &welcome);
    let mut evs = Vec::new();
    loop {
        let f = next(s).await.unwrap();
        if f["type"] == "replay_complete" {
            sc.check("ReplayComplete", &f);
            assert_eq!(f["up_to_seq"], welcome["head_seq"]);
            return (welcome, evs);
        }
        sc.check("EventFrame", &f);
        evs.push(f);
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reads_commands_and_rejection_codes() {
    let sc = Schema::new();
    let (host, _guest, th, id) = pair().await;
    let w = format!("/workspaces/{th}");

    // Token: missing or wrong → 401.
    let (st, _) = http(&host.http, "GET", "/workspaces", None, None).await;
    assert_eq!(st, 401);
    let (st, _) = http(
        &host.http,
        "GET",
        "/workspaces",
        Some("wrong-token-wrong"),
        None,
    )
    .await;
    assert_eq!(st, 401);
    let (st, _) = http(
        &host.http,
        "POST",
        &format!("{w}/commands"),
        None,
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 401);

    let (st, b) = host.get("/workspaces").await;
    assert_eq!(st, 200);
    let list = b["workspaces"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["workspace_id"], json!(th));
    assert_eq!(list[0]["role"], "host");

    // A direct edit by the node's user: 200 and a valid CommandResult.
    let (st, r) = host
        .post(
            &format!("{w}/commands"),
            cmd("c1", json!({"type": "edit_artifact", "artifact_id": id, "base_version": 1, "patch": replace("- design\n", "- design\n- build\n")})),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    sc.check("CommandResult", &r);
    assert_eq!(r["outcome"]["type"], "applied");
    assert_eq!(r["outcome"]["version"], 2);
    // The same command id again: the remembered result, nothing runs.
    let (st, again) = host
        .post(
            &format!("{w}/commands"),
            cmd("c1", json!({"type": "edit_artifact", "artifact_id": id, "base_version": 1, "patch": replace("x", "y")})),
        )
        .await;
    assert_eq!((st, &again), (200, &r));

    // Rejections → the notes' §6 table, body a valid CommandResult.
    let rejections = [
        (
            cmd(
                "r1",
                json!({"type": "edit_artifact", "artifact_id": id, "base_version": 1, "patch": replace("- build", "- ship")}),
            ),
            "version_conflict",
            409,
        ),
        (
            cmd(
                "r2",
                json!({"type": "edit_artifact", "artifact_id": "art_missing", "base_version": 1, "patch": replace("a", "b")}),
            ),
            "not_found",
            404,
        ),
        (
            cmd(
                "r3",
                json!({"type": "create_thread", "thread_id": th, "title": "again"}),
            ),
            "invalid_state",
            409,
        ),
        (
            cmd(
                "r4",
                json!({"type": "edit_artifact", "artifact_id": id, "base_version": 2, "patch": replace("no such anchor", "b")}),
            ),
            "patch_failed",
            422,
        ),
        (
            cmd(
                "r5",
                json!({"type": "create_artifact", "kind": "markdown", "data": {"text": {"not": "text"}}}),
            ),
            "validation_failed",
            422,
        ),
    ];
    for (frame, ty, code) in rejections {
        let (st, r) = host.post(&format!("{w}/commands"), frame.clone()).await;
        sc.check("CommandResult", &r);
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["rejection"]["type"], ty, "{frame} → {r}");
        assert_eq!(st, code, "{ty}");
    }
    // forbidden: the author of a proposal cannot resolve it.
    let (st, p) = host
        .post(
            &format!("{w}/commands"),
            cmd("p1", json!({"type": "propose_change", "change": {"type": "edit_artifact", "artifact_id": id, "base_version": 2, "patch": replace("- build\n", "- build\n- test\n")}, "rationale": "tests"})),
        )
        .await;
    assert_eq!(st, 200, "{p}");
    let pid = p["outcome"]["proposal_id"].as_str().unwrap().to_string();
    let (st, r) = host
        .post(
            &format!("{w}/commands"),
            cmd(
                "p2",
                json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": "accept"}),
            ),
        )
        .await;
    sc.check("CommandResult", &r);
    assert_eq!(
        (st, r["rejection"]["type"].as_str()),
        (403, Some("forbidden")),
        "{r}"
    );
    // A body that is not a command frame: 422 and an ErrorFrame; an unknown workspace: 404.
    for bad in [
        json!({"type": "command"}),
        json!([1]),
        json!({"command_id": "x", "command": {"type": "fly"}}),
    ] {
        let (st, e) = host.post(&format!("{w}/commands"), bad).await;
        assert_eq!(st, 422, "{e}");
        sc.check("ErrorFrame", &e);
    }
    let (st, e) = host
        .post(
            "/workspaces/thr_nope/commands",
            cmd("n", json!({"type": "create_thread"})),
        )
        .await;
    assert_eq!(st, 404);
    sc.check("ErrorFrame", &e);

    // Reads.
    let (st, b) = host.get(&format!("{w}/artifacts")).await;
    assert_eq!(st, 200);
    let arts = b["artifacts"].as_array().unwrap();
    assert_eq!(arts.len(), 1);
    assert_eq!(arts[0]["version"], 2);
    sc.actor(&arts[0]["actor"]);
    let (st, a) = host.get(&format!("{w}/artifacts/{id}")).await;
    assert_eq!(st, 200);
    assert_eq!(a["data"]["text"], "# Plan\n- design\n- build\n");
    let (st, revs) = host.get(&format!("{w}/artifacts/{id}/revisions")).await;
    assert_eq!(st, 200);
    let revs = revs["revisions"].as_array().unwrap();
    assert_eq!(
        revs.iter()
            .map(|r| r["version"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(revs[0]["data"]["text"], "# Plan\n- design\n");
    for r in revs {
        sc.actor(&r["actor"]);
    }
    let (st, e) = host.get(&format!("{w}/artifacts/art_nope")).await;
    assert_eq!(st, 404);
    sc.check("ErrorFrame", &e);
    assert_eq!(e["message"], "artifact art_nope does not exist");

    let (st, b) = host.get(&format!("{w}/events")).await;
    assert_eq!(st, 200);
    let evs = b["events"].as_array().unwrap();
    let head = b["head_seq"].as_u64().unwrap();
    assert_eq!(evs.len() as u64, head);
    for (i, e) in evs.iter().enumerate() {
        sc.check("EventFrame", e);
        assert_eq!(e["seq"], i as u64 + 1);
    }
    let (_, b) = host
        .get(&format!("{w}/events?after_seq=1&before_seq={head}&limit=1"))
        .await;
    let got: Vec<u64> = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(got, [2]);
    assert_eq!(b["has_more"], true);
    let (_, b) = host.get(&format!("{w}/events?last=2")).await;
    let got: Vec<u64> = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(got, [head - 1, head]);
    let (_, b) = host.get(&format!("{w}/events?thread_id=nope")).await;
    assert_eq!(b["events"], json!([]));
    for q in [
        "limit=0",
        "limit=501",
        "after_seq=-1",
        "last=x",
        "limit=2&last=2",
    ] {
        let (st, e) = host.get(&format!("{w}/events?{q}")).await;
        assert_eq!(st, 422, "{q}");
        sc.check("ErrorFrame", &e);
    }

    let (st, b) = host.get(&format!("{w}/threads")).await;
    assert_eq!(st, 200);
    assert_eq!(b["threads"][0]["thread_id"], json!(th));
    assert_eq!(b["threads"][0]["title"], "Plan");
    let (st, t) = host.get(&format!("{w}/threads/{th}")).await;
    assert_eq!((st, t["thread_id"].as_str()), (200, Some(th.as_str())));
    let (st, _) = host.get(&format!("{w}/threads/nope")).await;
    assert_eq!(st, 404);
    let (st, b) = host.get(&format!("{w}/proposals?status=pending")).await;
    assert_eq!(st, 200);
    assert_eq!(b["proposals"].as_array().unwrap().len(), 1);
    assert_eq!(b["proposals"][0]["proposal_id"], json!(pid));
    let (_, b) = host.get(&format!("{w}/proposals?status=accepted")).await;
    assert_eq!(b["proposals"], json!([]));
    let (st, _) = host.get(&format!("{w}/proposals?status=maybe")).await;
    assert_eq!(st, 422);
    let (st, e) = host.get(&format!("{w}/runs/run_nope")).await;
    assert_eq!(st, 404);
    assert_eq!(e["message"], "run run_nope does not exist");
    let (st, _) = host.get("/workspaces/thr_nope/artifacts").await;
    assert_eq!(st, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_hello_replay_pages_commands_live_and_reset() {
    let sc = Schema::new();
    let (host, _guest, th, id) = pair().await;
    // Over one replay page: 500 messages in the workspace's own thread (+ its first events).
    let mut s = ws(&host, &th, "header").await;
    let (welcome, evs) = handshake(&mut s, &sc, hello(0)).await;
    assert_eq!(welcome["reset"], false);
    assert_eq!(welcome["workspace_id"], json!(th));
    let head0 = welcome["head_seq"].as_u64().unwrap();
    assert_eq!(evs.len() as u64, head0);
    // Commands in windows of 50 (the server runs the frames already waiting together):
    // every command's event, then its command_result, in order.
    let mut live = Vec::new();
    let mut results = Vec::new();
    for w in 0..10 {
        for i in w * 50..(w + 1) * 50 {
            send(&mut s, cmd(&format!("m{i}"), json!({"type": "post_message", "thread_id": th, "content": format!("note {i}")}))).await;
        }
        while results.len() < (w + 1) * 50 {
            let f = next(&mut s).await.unwrap();
            match f["type"].as_str() {
                Some("command_result") => {
                    sc.check("CommandResult", &f);
                    assert_eq!(f["ok"], true, "{f}");
                    let seq = f["outcome"]["seq"].as_u64().unwrap();
                    assert!(
                        live.contains(&seq),
                        "the event {seq} comes before its result"
                    );
                    results.push(f["command_id"].as_str().unwrap().to_string());
                }
                Some("event") => {
                    sc.check("EventFrame", &f);
                    live.push(f["seq"].as_u64().unwrap());
                }
                _ => panic!("{f}"),
            }
        }
    }
    assert_eq!(
        results,
        (0..500).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    assert_eq!(live, ((head0 + 1)..=(head0 + 500)).collect::<Vec<_>>());
    // A command that does not parse: an error frame, the connection stays.
    send(
        &mut s,
        json!({"type": "command", "command_id": "bad", "command": {"type": "fly"}}),
    )
    .await;
    let e = next(&mut s).await.unwrap();
    sc.check("ErrorFrame", &e);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("not a command frame"),
        "{e}"
    );
    // A rejection over the stream.
    send(&mut s, cmd("v", json!({"type": "edit_artifact", "artifact_id": id, "base_version": 9, "patch": replace("a", "b")}))).await;
    let r = next(&mut s).await.unwrap();
    sc.check("CommandResult", &r);
    assert_eq!(r["rejection"]["type"], "version_conflict");
    drop(s);

    // A new client from 0 gets every event in pages, then replay_complete.
    let head = head0 + 500;
    assert!(head > 500);
    let mut s = ws(&host, &th, "query").await;
    let (welcome, evs) = handshake(&mut s, &sc, hello(0)).await;
    assert_eq!(welcome["head_seq"], head);
    assert_eq!(
        evs.iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        (1..=head).collect::<Vec<_>>()
    );
    drop(s);
    // Resuming: only the events after.
    let mut s = ws(&host, &th, "header").await;
    let (w, evs) = handshake(&mut s, &sc, hello(head - 3)).await;
    assert_eq!(w["reset"], false);
    assert_eq!(
        evs.iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [head - 2, head - 1, head]
    );
    drop(s);
    // Beyond the head: reset, replay from the start.
    let mut s = ws(&host, &th, "header").await;
    let (w, evs) = handshake(&mut s, &sc, hello(head + 100)).await;
    assert_eq!(w["reset"], true);
    assert_eq!(evs.len() as u64, head);
    drop(s);
    // from_head: no replay.
    let mut s = ws(&host, &th, "header").await;
    let (w, evs) = handshake(
        &mut s,
        &sc,
        json!({"type": "hello", "protocol": "artifactr.v1", "from_head": true}),
    )
    .await;
    assert_eq!((w["head_seq"].as_u64(), evs.len()), (Some(head), 0));
    // Live: an edit made elsewhere (the CLI) reaches the client.
    art(
        &host.t.path(),
        "edit",
        json!({"th": th, "artifact": id, "patch": replace("- design\n", "- design\n- live\n")}),
    )
    .await;
    let f = next(&mut s).await.unwrap();
    sc.check("EventFrame", &f);
    assert_eq!(
        (f["seq"].as_u64(), f["event"]["type"].as_str()),
        (Some(head + 1), Some("artifact_changed"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_close_codes() {
    let (host, _guest, th, _) = pair().await;
    // Missing or wrong token → 4403.
    for auth in ["none", "wrong"] {
        let mut s = ws(&host, &th, auth).await;
        assert_eq!(next(&mut s).await, Err(4403), "{auth}");
    }
    // Bad first frames → 4400.
    for bad in [
        json!({"type": "hello", "protocol": "artifactr.v0"}),
        json!({"type": "hello", "protocol": "artifactr.v1", "from_head": true, "resume_after_seq": 1}),
        json!({"type": "command", "command_id": "c", "command": {"type": "create_thread"}}),
        json!({"type": "hello", "protocol": "artifactr.v1", "resume_after_seq": -1}),
    ] {
        let mut s = ws(&host, &th, "header").await;
        send(&mut s, bad.clone()).await;
        assert_eq!(next(&mut s).await, Err(4400), "{bad}");
    }
    let mut s = ws(&host, &th, "header").await;
    s.send(Message::Binary(vec![1u8, 2].into())).await.unwrap();
    assert_eq!(next(&mut s).await, Err(4400));
}

/// A wrong token is 401 / 4403 like a missing one, but the message says which it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_reported_as_wrong_and_a_missing_one_as_missing() {
    let n = node_with_endpoint("host@test").await;
    let (st, b) = http(&n.http, "GET", "/workspaces", None, None).await;
    assert_eq!(st, 401);
    let missing = b["message"].as_str().unwrap().to_string();
    assert!(missing.starts_with("a bearer token is required"), "{b}");
    let (st, b) = http(&n.http, "GET", "/workspaces", Some("not-the-token"), None).await;
    assert_eq!(st, 401);
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .starts_with("wrong bearer token"),
        "{b}"
    );
    // The stream: the close reason says the same.
    for (auth, want) in [
        ("none", "a bearer token is required"),
        ("wrong", "wrong bearer token"),
    ] {
        let mut s = ws(&n, "thr_any", auth).await;
        let reason = loop {
            let m = tokio::time::timeout(Duration::from_secs(20), s.next())
                .await
                .expect("a frame in time");
            match m {
                Some(Ok(Message::Close(Some(c)))) => {
                    assert_eq!(u16::from(c.code), 4403);
                    break c.reason.to_string();
                }
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => {
                    panic!("{auth}: no close reason")
                }
                Some(Ok(_)) => continue,
            }
        };
        assert!(reason.starts_with(want), "{auth}: {reason}");
    }
}

/// The 10 s hello timeout, on paused time (the node runs in this runtime). A client that
/// says hello in time is not closed (covered by the other stream tests).
#[tokio::test(start_paused = true)]
async fn stream_hello_timeout_is_4408() {
    // The timer starts at the upgrade, before the workspace is looked up.
    let n = node_with_endpoint("solo@test").await;
    let th = "thr_any";
    let mut s = ws(&n, th, "header").await;
    let t0 = tokio::time::Instant::now();
    assert_eq!(next(&mut s).await, Err(4408));
    assert!(
        t0.elapsed() >= Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_endpoint_reads_the_replica_and_commands_reach_the_host() {
    let sc = Schema::new();
    let (host, guest, th, id) = pair().await;
    let w = format!("/workspaces/{th}");
    // The replica appears from the host's events.
    let a = eventually(10, || {
        let (g, w, id) = (&guest, w.clone(), id.clone());
        async move {
            let (st, a) = g.get(&format!("{w}/artifacts/{id}")).await;
            (st == 200).then_some(a)
        }
    })
    .await;
    assert_eq!(a["version"], 1);
    let (_, b) = guest.get("/workspaces").await;
    assert_eq!(b["workspaces"][0]["role"], "replica");
    // A command goes to the host; without artifact:write the guest's edit becomes a proposal.
    let (st, r) = guest
        .post(
            &format!("{w}/commands"),
            cmd("g1", json!({"type": "edit_artifact", "artifact_id": id, "base_version": 1, "patch": replace("- design\n", "- design\n- guest\n")})),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    sc.check("CommandResult", &r);
    assert_eq!(r["outcome"]["type"], "proposed", "{r}");
    // Over the stream too, with the proposal_created event.
    let mut s = ws(&guest, &th, "header").await;
    let (w0, _) = handshake(&mut s, &sc, hello(0)).await;
    let head = w0["head_seq"].as_u64().unwrap();
    send(
        &mut s,
        cmd(
            "g2",
            json!({"type": "post_message", "thread_id": th, "content": "from the guest"}),
        ),
    )
    .await;
    let mut got_result = false;
    let mut got_event = false;
    while !(got_result && got_event) {
        let f = next(&mut s).await.unwrap();
        match f["type"].as_str() {
            Some("command_result") => {
                sc.check("CommandResult", &f);
                assert_eq!(
                    (f["command_id"].as_str(), f["ok"].as_bool()),
                    (Some("g2"), Some(true)),
                    "{f}"
                );
                got_result = true;
            }
            Some("event") => {
                sc.check("EventFrame", &f);
                assert!(f["seq"].as_u64().unwrap() > head);
                got_event = true;
            }
            _ => panic!("{f}"),
        }
    }
    drop(s);
    // Host offline: the command waits in the outbox; HTTP answers 202 queued after wait_ms.
    host.t.handle.shutdown();
    host.t.handle.stopped().await;
    let (st, q) = guest
        .post(
            &format!("{w}/commands?wait_ms=300"),
            cmd(
                "g3",
                json!({"type": "post_message", "thread_id": th, "content": "later"}),
            ),
        )
        .await;
    assert_eq!(st, 202, "{q}");
    assert_eq!(
        (q["type"].as_str(), q["command_id"].as_str()),
        (Some("queued"), Some("g3"))
    );
    // Reads still come from the replica.
    let (st, _) = guest.get(&format!("{w}/artifacts/{id}")).await;
    assert_eq!(st, 200);
}

/// A client that stops reading is closed with 4429 once more than 1000 live frames wait
/// for it (after the socket buffers are full).
///
/// Its own runtime, shut down with a timeout: this test's stores hold 200 KB values, and
/// in about one run in ten sled's flush on drop of a store (run when the runtime's
/// teardown drops the node's last tasks) waited forever after every assertion had
/// passed. The node's own exit does not wait for it either (`cli::run`); what the node
/// acked was flushed before.
#[test]
fn slow_client_is_closed_with_4429() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(slow_client_case());
    rt.shutdown_timeout(Duration::from_secs(5));
}

async fn slow_client_case() {
    let sc = Schema::new();
    let (host, _guest, th, _) = pair().await;
    let mut slow = ws(&host, &th, "header").await;
    handshake(&mut slow, &sc, hello(0)).await;
    // Another client fills the slow one's socket buffers with large events, then sends
    // more than 1000 small ones; it reads its own frames as it goes.
    let mut fast = ws(&host, &th, "header").await;
    handshake(
        &mut fast,
        &sc,
        json!({"type": "hello", "protocol": "artifactr.v1", "from_head": true}),
    )
    .await;
    let big = "x".repeat(200_000);
    for b in 0..10 {
        post_batch(&mut fast, &th, b * 8, 8, &big).await;
    }
    for b in 0..20 {
        post_batch(&mut fast, &th, 100 + b * 64, 64, "small").await;
    }
    // The slow client reads what was written to it, then the close.
    let mut frames = 0;
    let code = loop {
        match next(&mut slow).await {
            Ok(_) => frames += 1,
            Err(code) => break code,
        }
        assert!(frames < 5000, "no close after {frames} frames");
    };
    assert_eq!(code, 4429, "after {frames} frames");
    assert!(frames < 80 + 1280, "{frames}");
}

/// Send `k` post_message commands (ids from `start`), then read until their `k` results.
async fn post_batch(fast: &mut Ws, th: &str, start: usize, k: usize, content: &str) {
    for i in start..start + k {
        let f = cmd(
            &format!("f{i}"),
            json!({"type": "post_message", "thread_id": th, "content": content}),
        );
        send(fast, f).await;
    }
    let mut results = 0;
    while results < k {
        let f = next(fast).await.unwrap();
        if f["type"] == "command_result" {
            assert_eq!(f["ok"], true, "{f}");
            results += 1;
        }
    }
}

/// An outside client: `tests/fixtures/artifactr/client.py` with the Python `websockets`
/// package (skipped with one line when python3 or websockets is missing; `.ci/run` installs
/// it). `AWP_TEST_PYTHON` names another interpreter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_websockets_client_attaches() {
    let py = std::env::var("AWP_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = std::process::Command::new(&py)
        .args(["-c", "import websockets"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        eprintln!("skipped: {py} with the websockets package is not available");
        return;
    }
    let sc = Schema::new();
    let (host, _guest, th, _) = pair().await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/artifactr/client.py");
    let out = tokio::process::Command::new(&py)
        .arg(script)
        .args([&host.http, &host.token, &th, &th])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frames: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(frames.len() >= 4, "{stdout}");
    for f in &frames {
        sc.check("server", f);
    }
    assert_eq!(frames.last().unwrap()["type"], "command_result");
}
