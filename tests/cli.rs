//! The `awp` binary without a running node: exit codes, one-line errors, commands that
//! work on the home alone.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn awp(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_awp"))
        .args(args)
        .env("AWP_HOME", home)
        .env_remove("RUST_LOG")
        .output()
        .expect("run awp")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exactly one line on stderr, in the `awp: what; what to do` form.
fn assert_one_error_line(o: &Output) {
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "stderr: {err:?}");
    assert!(lines[0].starts_with("awp: "), "{err:?}");
    assert!(lines[0].contains("; "), "{err:?}");
}

/// No node was started on the home: no log, no socket, no lock.
fn assert_no_node_started(home: &Path) {
    for f in ["node.log", "awp.sock", "node.lock"] {
        assert!(!home.join(f).exists(), "{f} exists: a node was started");
    }
}

#[test]
fn version_prints_the_crate_version() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["version"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(env!("CARGO_PKG_VERSION")));
    let o = awp(home.path(), &["version", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn help_lists_exit_codes() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("Exit codes:"), "{out}");
    assert!(out.contains("3  no node running"), "{out}");
}

#[test]
fn schema_is_valid_json() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["schema"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.ends_with("}\n"), "pretty JSON and a newline expected");
    let v: serde_json::Value = serde_json::from_str(&out).expect("schema is JSON");
    assert!(v.is_object());
    assert_no_node_started(home.path());
}

#[test]
fn status_without_node_exits_3() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["status"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_one_error_line(&o);
    assert!(stderr(&o).contains("no node running"));
    assert_no_node_started(home.path());
}

/// `awp export` needs the node (it serves the lines): without one, exit 3, and the home
/// gets no identity (the key comes from the node, not from identity.json).
#[test]
fn export_without_node_exits_3_and_creates_no_identity() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["export", "thr_1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(!home.path().join("identity.json").exists());
    assert_no_node_started(home.path());
}

#[test]
fn status_with_long_home_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h".repeat(150));
    let o = awp(&home, &["status"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(home.is_dir());
}

#[test]
fn down_without_node_is_ok() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["down"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "no node running\n");
    assert_no_node_started(home.path());
}

#[test]
fn whoami_creates_private_identity() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["whoami", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    let key = v["key"].as_str().expect("key");
    assert!(key.starts_with("ed25519:"), "{key}");
    assert!(v["fingerprint"]
        .as_str()
        .expect("fingerprint")
        .starts_with("SHA256:"));
    let id = home.path().join("identity.json");
    let mode = std::fs::metadata(&id).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The same identity the next time.
    let again = awp(home.path(), &["whoami", "--json"]);
    let v2: serde_json::Value = serde_json::from_str(stdout(&again).trim()).unwrap();
    assert_eq!(v2["key"], v["key"]);
    assert_no_node_started(home.path());
}

#[test]
fn send_with_bad_data_exits_2_without_starting_a_node() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["send", "alice", "hi", "--data", "{not json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_one_error_line(&o);
    assert!(stderr(&o).contains("--data"));
    assert_no_node_started(home.path());
}

#[test]
fn send_without_peer_or_thread_exits_2_without_starting_a_node() {
    let home = tempfile::tempdir().unwrap();
    let o = awp(home.path(), &["send", "hello"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_one_error_line(&o);
    assert_no_node_started(home.path());
}

#[test]
fn usage_errors_are_one_line_exit_2() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["frobnicate"][..],
        &["wait", "--timeout", "soon"],
        &["state", "thr_1"],
    ] {
        let o = awp(home.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert_one_error_line(&o);
    }
}

// ---------------------------------------------------------------------------------------
// Against a scripted stand-in for the node's control socket (the real node is tested
// end to end elsewhere): request shapes, output, exit codes.

mod fake {
    use serde_json::Value;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixListener;
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    /// Lines to answer a request with (each without the newline).
    pub type Script = dyn Fn(&Value) -> Vec<String> + Send + Sync;

    /// Serves the control socket of `home` in background threads; records every request.
    pub struct FakeNode {
        pub requests: Arc<Mutex<Vec<Value>>>,
    }

    impl FakeNode {
        pub fn start(home: &Path, script: Box<Script>) -> FakeNode {
            let path = awp_node::daemon::socket_path(home);
            let listener = UnixListener::bind(&path).unwrap();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let script: Arc<Script> = Arc::from(script);
            let recorded = requests.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { return };
                    let script = script.clone();
                    let recorded = recorded.clone();
                    std::thread::spawn(move || {
                        let mut reader = BufReader::new(conn.try_clone().unwrap());
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let req: Value = serde_json::from_str(&line).unwrap();
                        recorded.lock().unwrap().push(req.clone());
                        let streaming = req["op"] == "subscribe";
                        for l in script(&req) {
                            if conn.write_all(format!("{l}\n").as_bytes()).is_err() {
                                return;
                            }
                        }
                        if streaming {
                            // Hold the stream open until the client goes away.
                            let mut rest = Vec::new();
                            let _ = reader.read_to_end(&mut rest);
                        }
                    });
                }
            });
            FakeNode { requests }
        }

        /// Recorded requests other than the liveness probes (`status`).
        pub fn calls(&self) -> Vec<Value> {
            self.requests
                .lock()
                .unwrap()
                .iter()
                .filter(|r| r["op"] != "status")
                .cloned()
                .collect()
        }
    }

    /// `{"ok":true}` plus `body` fields.
    pub fn ok(body: Value) -> String {
        let mut m = body.as_object().cloned().unwrap_or_default();
        m.insert("ok".into(), true.into());
        Value::Object(m).to_string()
    }

    /// A refusal.
    pub fn refuse(code: &str, message: &str) -> String {
        serde_json::json!({"ok": false, "error": {"code": code, "message": message}}).to_string()
    }
}

use fake::{ok, refuse, FakeNode};
use serde_json::{json, Value};

fn line_event(seq: u64, dir: &str, t: &str, line: Value) -> String {
    json!({"event": "line", "seq": seq, "dir": dir, "peer": "ed25519:AbCdEfGhIjKl",
        "peer_name": "alice", "th": "thr_1", "id": format!("01ID{seq}"), "t": t, "line": line,
        "at": "2026-01-01T00:00:00.000Z"})
    .to_string()
}

#[test]
fn send_to_hyphen_peer_prints_delivery() {
    let home = tempfile::tempdir().unwrap();
    let node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            Some("send") => vec![ok(
                json!({"id": "01X", "th": "thr_1", "status": "delivered"}),
            )],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(
        home.path(),
        &["send", "-AbC", "hi", "-t", "thr_1", "--wait-ack", "2s"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "delivered 01X in thr_1\n");
    assert_eq!(
        node.calls(),
        vec![json!({"op": "send", "peer": "-AbC", "th": "thr_1",
            "parts": [{"k": "text", "text": "hi"}], "wait_ack_ms": 2000})]
    );
    // --json prints the response body.
    let o = awp(home.path(), &["send", "bob", "x", "--json"]);
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["status"], "delivered");
    assert_no_node_log(home.path());
}

/// `--wait-ack DUR` that ends without an ack is a timed-out wait (exit 2, code `timeout`),
/// like `awp wait --timeout`; the queued line is still printed, so its id is known, and the
/// message says it stays queued. Without `--wait-ack`, `queued` is success.
#[test]
fn send_and_state_wait_ack_without_an_ack_is_a_timeout() {
    let home = tempfile::tempdir().unwrap();
    let _node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            Some("send") | Some("state") => vec![ok(
                json!({"id": "01X", "th": "thr_1", "status": "queued", "connected": false}),
            )],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(home.path(), &["send", "bob", "hi", "--wait-ack", "1s"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stdout(&o), "queued 01X in thr_1 (peer offline)\n");
    assert_one_error_line(&o);
    assert!(
        stderr(&o).contains("no ack for 01X in thr_1 within 1s")
            && stderr(&o).contains("do not send it again")
            && stderr(&o).contains("`awp tail -t thr_1 --once`"),
        "{}",
        stderr(&o)
    );
    let o = awp(
        home.path(),
        &["--json", "send", "bob", "hi", "--wait-ack", "1s"],
    );
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["error"]["code"], "timeout");
    let o = awp(
        home.path(),
        &["state", "bob/thr_1", "done", "--wait-ack", "1s"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no ack for 01X"));
    // Without --wait-ack nothing was waited for: queued is the expected answer.
    let o = awp(home.path(), &["send", "bob", "hi"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "queued 01X in thr_1 (peer offline)\n");
}

fn assert_no_node_log(home: &Path) {
    assert!(
        !home.join("node.log").exists(),
        "a node was started although one answered"
    );
}

#[test]
fn send_reads_text_from_stdin() {
    use std::io::Write;
    let home = tempfile::tempdir().unwrap();
    let node = FakeNode::start(
        home.path(),
        Box::new(|_| {
            vec![ok(
                json!({"id": "01Y", "th": "thr_9", "status": "queued", "connected": false}),
            )]
        }),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_awp"))
        .args(["send", "alice", "-", "-s", "topic"])
        .env("AWP_HOME", home.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"line one\nline two\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "queued 01Y in thr_9 (peer offline)\n");
    let calls = node.calls();
    assert_eq!(
        calls[0]["parts"],
        json!([{"k": "text", "text": "line one\nline two"}])
    );
    assert_eq!(calls[0]["subject"], "topic");
}

#[test]
fn node_refusals_map_to_exit_codes() {
    let home = tempfile::tempdir().unwrap();
    let _node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            Some("connect") => vec![refuse("connect_failed", "tls:h:1: connection refused")],
            Some("send") => vec![refuse("no_such_peer", "no peer named carol")],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(home.path(), &["connect", "tls:h:1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_one_error_line(&o);
    assert!(stderr(&o).contains("connection refused"));
    let o = awp(home.path(), &["send", "carol", "hi"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_one_error_line(&o);
    assert!(stderr(&o).contains("awp peers"));
}

#[test]
fn tail_once_prints_history_and_stops_at_caught_up() {
    let home = tempfile::tempdir().unwrap();
    let node = FakeNode::start(
        home.path(),
        Box::new(|req| {
            match req["op"].as_str() {
            Some("subscribe") => vec![
                ok(json!({})),
                line_event(1, "out", "msg", json!({"t": "msg", "parts": [{"k": "text", "text": "ping"}]})),
                json!({"event": "ack", "peer": "ed25519:AbCdEfGhIjKl", "th": "thr_1", "re": "01ID1"}).to_string(),
                line_event(2, "in", "msg", json!({"t": "msg", "parts": [{"k": "text", "text": "pong"}]})),
                json!({"event": "caught_up"}).to_string(),
            ],
            _ => vec![ok(json!({}))],
        }
        }),
    );
    let o = awp(home.path(), &["tail", "--once", "-t", "thr_1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].ends_with("→ alice (AbCdEfGh)  thr_1  ping"),
        "{out}"
    );
    assert!(
        lines[1].ends_with("← alice (AbCdEfGh)  thr_1  pong"),
        "{out}"
    );
    assert_eq!(
        node.calls(),
        vec![json!({"op": "subscribe", "th": "thr_1", "from_seq": 0})]
    );
    // --json: the line events as they came.
    let o = awp(home.path(), &["tail", "--once", "--json"]);
    let seqs: Vec<u64> = stdout(&o)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 2]);
}

#[test]
fn wait_times_out_with_exit_2() {
    let home = tempfile::tempdir().unwrap();
    let node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            // A matching state already read, an outbound line and a non-matching state do
            // not end the wait.
            Some("subscribe") => vec![
                ok(json!({})),
                with_read(
                    line_event(4, "in", "state", json!({"t": "state", "state": "done"})),
                    true,
                ),
                json!({"event": "caught_up", "seq": 4}).to_string(),
                line_event(5, "out", "msg", json!({"t": "msg", "parts": []})),
                line_event(6, "in", "state", json!({"t": "state", "state": "working"})),
            ],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(
        home.path(),
        &["wait", "--state", "done,failed", "--timeout", "300ms"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_one_error_line(&o);
    assert!(stderr(&o).contains("timed out"));
    assert_eq!(
        node.calls(),
        vec![json!({"op": "subscribe", "from_seq": 0})]
    );
    let o = awp(
        home.path(),
        &["--json", "wait", "--state", "done", "--timeout", "100ms"],
    );
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["error"]["code"], "timeout");
}

#[test]
fn wait_returns_on_matching_state() {
    let home = tempfile::tempdir().unwrap();
    let _node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            Some("subscribe") => vec![
                ok(json!({})),
                json!({"event": "caught_up", "seq": 5}).to_string(),
                line_event(6, "in", "state", json!({"t": "state", "state": "working"})),
                line_event(7, "in", "state", json!({"t": "state", "state": "done"})),
            ],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(
        home.path(),
        &[
            "wait",
            "-t",
            "thr_1",
            "--state",
            "done",
            "--timeout",
            "10s",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["seq"], 7);
}

#[test]
fn wait_returns_at_once_for_an_unread_line_already_here() {
    let home = tempfile::tempdir().unwrap();
    let _node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            Some("subscribe") => vec![
                ok(json!({})),
                with_read(
                    line_event(3, "in", "msg", json!({"t": "msg", "parts": []})),
                    true,
                ),
                with_read(
                    line_event(4, "in", "msg", json!({"t": "msg", "parts": []})),
                    false,
                ),
                json!({"event": "caught_up", "seq": 4}).to_string(),
            ],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(home.path(), &["wait", "--timeout", "10s", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["seq"], 4, "the unread line, not the read one");
}

fn with_read(event: String, read: bool) -> String {
    let mut v: Value = serde_json::from_str(&event).unwrap();
    v["read"] = json!(read);
    v.to_string()
}

#[test]
fn threads_and_peers_tables() {
    let home = tempfile::tempdir().unwrap();
    let _node = FakeNode::start(
        home.path(),
        Box::new(|req| match req["op"].as_str() {
            Some("threads") => vec![ok(json!({"threads": [
                {"th": "thr_1", "peer": "ed25519:AbCdEfGhIjKl", "peer_name": "alice",
                 "subject": "review", "mine": "working", "theirs": "done", "unread": 1},
            ]}))],
            Some("peers") => vec![ok(json!({"peers": []}))],
            _ => vec![ok(json!({}))],
        }),
    );
    let o = awp(home.path(), &["threads"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("THREAD"), "{out}");
    let row = out.lines().nth(1).unwrap();
    for want in ["thr_1", "alice (AbCdEfGh)", "review", "working/done"] {
        assert!(row.contains(want), "{want} missing: {out}");
    }
    let o = awp(home.path(), &["threads", "--json"]);
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["th"], "thr_1");
    let o = awp(home.path(), &["peers"]);
    assert_eq!(stdout(&o), "no peers yet\n");
}
