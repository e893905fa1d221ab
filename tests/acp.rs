//! `awp serve-agent --acp` end to end over two nodes with the scripted agent
//! `examples/fake_acp_agent.rs`: prompt → reply → done, permission asked and answered (and
//! approved by a grant), cancel, fs requests gated by grants and confined to the root, and
//! an agent crash → failed with a note, then a restarted agent answering.

mod common;

use agent_client_protocol as acp;
use awp_node::acp::bridge::{PERMISSION_MIME, PLAN_MIME};
use awp_node::control::Request;
use common::{eventually, TestNode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tempfile::TempDir;

/// The fake agent next to the test build's `awp` (built by `cargo test` with the
/// examples, or `cargo build --example fake_acp_agent`).
fn fake_agent() -> PathBuf {
    let awp = PathBuf::from(env!("CARGO_BIN_EXE_awp"));
    let p = awp.parent().unwrap().join("examples/fake_acp_agent");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --example fake_acp_agent` (a full `cargo test` builds it)",
        p.display()
    );
    p
}

struct Setup {
    a: TestNode,
    b: TestNode,
    root: TempDir,
    log: PathBuf,
    /// `serve-agent`'s stderr so far.
    stderr: Arc<Mutex<String>>,
    _serve: tokio::process::Child,
}

/// Node A dials node B; B runs `awp serve-agent --acp -- fake_acp_agent`.
async fn setup() -> Setup {
    setup_with(vec![fake_agent().into_os_string()]).await
}

/// Node A dials node B; B runs `awp serve-agent --acp -- AGENT…`; ready once the agent
/// noted its start in `FAKE_ACP_LOG`.
async fn setup_with(agent: Vec<std::ffi::OsString>) -> Setup {
    setup_opts(agent, true).await
}

/// Node A dials node B; B runs `awp serve-agent --acp -- AGENT…`; ready once the agent
/// noted its start (`logs`), else once `serve-agent` logged a first restart.
async fn setup_opts(agent: Vec<std::ffi::OsString>, logs: bool) -> Setup {
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let root = TempDir::new().unwrap();
    let log = root.path().join("agent.log");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"));
    cmd.arg("--home")
        .arg(b.path())
        .args(["serve-agent", "--acp", "--root"])
        .arg(root.path())
        .arg("--")
        .args(&agent)
        .env("FAKE_ACP_LOG", &log)
        .env_remove("AWP_HOME")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // A process group of its own, as a shell gives a command it runs: a test can signal
    // the group as a terminal's Ctrl-C does, without signalling the test itself.
    #[cfg(unix)]
    cmd.process_group(0);
    let serve = cmd.spawn().expect("awp serve-agent starts");
    let mut serve = serve;
    let stderr = Arc::new(Mutex::new(String::new()));
    let (mut pipe, sink) = (serve.stderr.take().unwrap(), stderr.clone());
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    // The agent is started (and logs it) once serve-agent has subscribed to B's events.
    let (l, e) = (log.clone(), stderr.clone());
    eventually(20, || {
        let (l, e) = (l.clone(), e.clone());
        async move {
            let ready = if logs {
                starts(&l) >= 1
            } else {
                e.lock().unwrap().contains("restarting it in")
            };
            ready.then_some(())
        }
    })
    .await;
    Setup {
        a,
        b,
        root,
        log,
        stderr,
        _serve: serve,
    }
}

/// The delays (ms) of the restarts `serve-agent` logged so far.
fn restart_delays(stderr: &Mutex<String>) -> Vec<u64> {
    stderr
        .lock()
        .unwrap()
        .lines()
        .filter_map(|l| l.split("restarting it in ").nth(1))
        .filter_map(|t| t.split(' ').next()?.parse().ok())
        .collect()
}

fn starts(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// A's inbound lines in thread `th`.
async fn inbound(a: &TestNode, th: &str) -> Vec<Value> {
    a.inbound()
        .await
        .into_iter()
        .filter(|e| e["th"] == th)
        .map(|e| e["line"].clone())
        .collect()
}

/// Wait (30 s at most) until B's `state` lines in `th` number more than `after` and the
/// last is `state`; that line.
async fn wait_state(a: &TestNode, th: &str, after: usize, state: &str) -> Value {
    eventually(30, || async {
        let states: Vec<Value> = inbound(a, th)
            .await
            .into_iter()
            .filter(|l| l["t"] == "state")
            .collect();
        (states.len() > after && states.last().unwrap()["state"] == state)
            .then(|| states.last().unwrap().clone())
    })
    .await
}

fn states(lines: &[Value]) -> usize {
    lines.iter().filter(|l| l["t"] == "state").count()
}

/// The text parts of B's msgs in `th`, joined.
async fn text(a: &TestNode, th: &str) -> String {
    inbound(a, th)
        .await
        .iter()
        .filter(|l| l["t"] == "msg")
        .flat_map(|l| l["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect::<Vec<_>>()
        .join("|")
}

async fn say(a: &TestNode, b: &TestNode, th: Option<&str>, t: &str) -> String {
    let peer = b.key();
    let r = a.send(Some(&peer), th, t).await;
    r["th"].as_str().unwrap().to_string()
}

async fn grant(b: &TestNode, a: &TestNode, caps: &[&str]) {
    let r = b
        .ctl(Request::Grant {
            peer: a.key(),
            caps: caps.iter().map(|c| c.to_string()).collect(),
            ttl_s: 3600,
            aud: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_gets_progress_reply_and_done() {
    let s = setup().await;
    let file = s.root.path().join("notes.txt");
    std::fs::write(&file, b"abc").unwrap();
    let r =
        s.a.ctl(Request::Send {
            peer: Some(s.b.key()),
            th: None,
            subject: Some("ask".into()),
            re: None,
            parts: vec![json!({"k": "text", "text": "hello there"})],
            files: vec![file.display().to_string()],
            wait_ack_ms: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let th = r.body["th"].as_str().unwrap().to_string();
    let done = wait_state(&s.a, &th, 0, "done").await;
    assert_eq!(done["note"], "end_turn");
    let lines = inbound(&s.a, &th).await;
    // working, then done.
    assert_eq!(states(&lines), 2, "{lines:#?}");
    let all = text(&s.a, &th).await;
    assert!(all.contains("tool [think] Think"), "{all}");
    assert!(all.contains("tool t1: completed"), "{all}");
    // The three chunks of the reply are coalesced: fewer msgs than chunks.
    let echo_msgs = lines
        .iter()
        .filter(|l| {
            l["t"] == "msg"
                && l["parts"][0]["text"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("tool"))
        })
        .count();
    assert!(echo_msgs < 3, "{lines:#?}");
    let reply: String = all.split('|').filter(|t| !t.starts_with("tool")).collect();
    assert!(reply.starts_with("echo: hello there"), "{reply}");
    // The blob reached the agent as a link to the received file.
    assert!(
        reply.contains("link: file:///") && reply.contains("notes.txt"),
        "{reply}"
    );
    let plan = lines
        .iter()
        .flat_map(|l| l["parts"].as_array().cloned().unwrap_or_default())
        .find(|p| p["mime"] == PLAN_MIME)
        .expect("a plan part");
    assert_eq!(plan["data"]["entries"][0]["content"], "answer");
    // A second prompt in the thread goes to the same session and ends done again.
    say(&s.a, &s.b, Some(&th), "refuse").await;
    let failed = wait_state(&s.a, &th, 2, "failed").await;
    assert_eq!(failed["note"], "the agent stopped: refusal");
    assert_eq!(starts(&s.log), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_is_asked_and_answered_or_granted() {
    let s = setup().await;
    // No grant: B asks, A answers `allow`.
    let th = say(&s.a, &s.b, None, "perm").await;
    let waiting = wait_state(&s.a, &th, 0, "waiting").await;
    assert_eq!(waiting["note"], "permission asked");
    let lines = inbound(&s.a, &th).await;
    let q = lines
        .iter()
        .flat_map(|l| l["parts"].as_array().cloned().unwrap_or_default())
        .find(|p| p["mime"] == PERMISSION_MIME)
        .expect("a permission question");
    assert_eq!(q["data"]["options"][0]["optionId"], "ok");
    assert_eq!(q["data"]["toolCall"]["kind"], "edit");
    // A word that is no answer is asked again; the thread keeps waiting.
    say(&s.a, &s.b, Some(&th), "perhaps").await;
    eventually(10, || async {
        text(&s.a, &th)
            .await
            .contains("not understood")
            .then_some(())
    })
    .await;
    say(&s.a, &s.b, Some(&th), "allow").await;
    wait_state(&s.a, &th, 2, "done").await;
    assert!(text(&s.a, &th).await.contains("permission: ok"));

    // `deny` picks the reject option.
    let th2 = say(&s.a, &s.b, None, "perm").await;
    wait_state(&s.a, &th2, 0, "waiting").await;
    say(&s.a, &s.b, Some(&th2), "deny").await;
    wait_state(&s.a, &th2, 1, "done").await;
    assert!(text(&s.a, &th2).await.contains("permission: no"));

    // fs:write approves edits without asking, but not execute.
    grant(&s.b, &s.a, &["fs:write"]).await;
    let th3 = say(&s.a, &s.b, None, "perm").await;
    wait_state(&s.a, &th3, 0, "done").await;
    let t3 = text(&s.a, &th3).await;
    assert!(t3.contains("approved (you hold the grant)"), "{t3}");
    assert!(t3.contains("permission: ok"), "{t3}");
    assert!(!inbound(&s.a, &th3)
        .await
        .iter()
        .any(|l| l["state"] == "waiting"));
    let th4 = say(&s.a, &s.b, None, "perm-exec").await;
    wait_state(&s.a, &th4, 0, "waiting").await;
    say(&s.a, &s.b, Some(&th4), "no").await;
    wait_state(&s.a, &th4, 1, "done").await;
    assert!(text(&s.a, &th4).await.contains("permission: no"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_failed_state_cancels_the_prompt() {
    let s = setup().await;
    let th = say(&s.a, &s.b, None, "wait").await;
    wait_state(&s.a, &th, 0, "working").await;
    eventually(10, || async {
        text(&s.a, &th)
            .await
            .contains("waiting for cancel")
            .then_some(())
    })
    .await;
    let r =
        s.a.ctl(Request::State {
            peer: Some(s.b.key()),
            th: th.clone(),
            state: "failed".into(),
            note: Some("cancelled".into()),
            wait_ack_ms: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let failed = wait_state(&s.a, &th, 1, "failed").await;
    assert_eq!(failed["note"], "the agent stopped: cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_fails_the_prompt_and_the_agent_restarts() {
    let s = setup().await;
    let th = say(&s.a, &s.b, None, "crash").await;
    let failed = wait_state(&s.a, &th, 0, "failed").await;
    let note = failed["note"].as_str().unwrap();
    assert_eq!(
        note, "the agent exited (exit status: 3); restarted with backoff",
        "one line with the exit status"
    );
    // The next prompt in the same thread gets a new session of the restarted agent.
    say(&s.a, &s.b, Some(&th), "again").await;
    wait_state(&s.a, &th, 1, "done").await;
    let reply: String = text(&s.a, &th).await.split('|').collect();
    assert!(reply.contains("echo: again"), "{reply}");
    assert_eq!(starts(&s.log), 2);
}

/// An agent that floods its output with lines that are no JSON (as `yes` would) is cut off
/// after 64 in a row: the prompt fails with a note and the agent is restarted (before, the
/// ACP crate queued every such line without bound, and the prompt hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_flooding_non_json_lines_is_restarted() {
    let s = setup().await;
    let th = say(&s.a, &s.b, None, "flood").await;
    let failed = wait_state(&s.a, &th, 0, "failed").await;
    let note = failed["note"].as_str().unwrap();
    assert!(note.contains("no JSON-RPC messages"), "{note}");
    assert!(note.contains("restarted"), "{note}");
    say(&s.a, &s.b, Some(&th), "again").await;
    wait_state(&s.a, &th, 1, "done").await;
    assert_eq!(starts(&s.log), 2);
}

/// An agent command that cannot start fails the peer's thread at once with a note naming
/// the cause (before: a 30 s wait, then a note without it); the restarts back off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_start_fails_the_thread_with_a_note() {
    let s = setup_opts(vec!["/nonexistent/acp-agent".into()], false).await;
    let asked = std::time::Instant::now();
    let th = say(&s.a, &s.b, None, "hello").await;
    let failed = wait_state(&s.a, &th, 0, "failed").await;
    let note = failed["note"].as_str().unwrap();
    assert!(note.contains("the agent could not be started"), "{note}");
    assert!(note.contains("No such file"), "{note}");
    assert!(
        !note.contains("/nonexistent"),
        "no local path to the peer: {note}"
    );
    assert!(note.contains("restarted with backoff"), "{note}");
    eprintln!("failed {} ms after the msg", asked.elapsed().as_millis());
    // The restarts back off: 0.5 s, 1 s, 2 s, … (bounded by BACKOFF_MAX).
    let delays = eventually(20, || async {
        let d = restart_delays(&s.stderr);
        (d.len() >= 3).then_some(d)
    })
    .await;
    assert_eq!(delays[..3], [500, 1000, 2000], "{delays:?}");
}

/// An agent that exits at once (before answering `initialize`) fails the peer's thread
/// with a note naming the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_exits_at_once_fails_the_thread_with_a_note() {
    let s = setup_with(vec![
        "sh".into(),
        "-c".into(),
        "echo start >> \"$FAKE_ACP_LOG\"; exit 0".into(),
    ])
    .await;
    let th = say(&s.a, &s.b, None, "hello").await;
    let failed = wait_state(&s.a, &th, 0, "failed").await;
    let note = failed["note"].as_str().unwrap();
    assert!(
        note.contains("exited")
            || note.contains("closed its output")
            || note.contains("connection failed"),
        "{note}"
    );
    assert!(note.contains("restarted with backoff"), "{note}");
    assert!(starts(&s.log) >= 2, "it was restarted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_requests_need_grants_and_stay_in_the_root() {
    let s = setup().await;
    std::fs::write(s.root.path().join("notes.txt"), "inside").unwrap();
    let th = say(&s.a, &s.b, None, "read notes.txt").await;
    wait_state(&s.a, &th, 0, "done").await;
    let t = text(&s.a, &th).await;
    assert!(t.contains("fs error") && t.contains("fs:read"), "{t}");
    let th = say(&s.a, &s.b, None, "write new.txt hi").await;
    wait_state(&s.a, &th, 0, "done").await;
    assert!(text(&s.a, &th).await.contains("fs:write"));
    assert!(!s.root.path().join("new.txt").exists());

    grant(&s.b, &s.a, &["fs:read", "fs:write"]).await;
    let th = say(&s.a, &s.b, None, "read notes.txt").await;
    wait_state(&s.a, &th, 0, "done").await;
    assert!(text(&s.a, &th).await.contains("read: inside"));
    let th = say(&s.a, &s.b, None, "read /etc/hostname").await;
    wait_state(&s.a, &th, 0, "done").await;
    let t = text(&s.a, &th).await;
    assert!(t.contains("fs error") && t.contains("outside"), "{t}");
    let th = say(&s.a, &s.b, None, "read ../agent.log").await;
    wait_state(&s.a, &th, 0, "done").await;
    assert!(text(&s.a, &th).await.contains("fs error"));
    let th = say(&s.a, &s.b, None, "write new.txt hi").await;
    wait_state(&s.a, &th, 0, "done").await;
    assert!(text(&s.a, &th).await.contains("wrote"));
    assert_eq!(
        std::fs::read_to_string(s.root.path().join("new.txt")).unwrap(),
        "hi"
    );
}

/// Whether Python has the official ACP SDK (`pip install --user agent-client-protocol`);
/// says so in one line when not.
fn python_acp() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import acp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("python3 with the ACP SDK (agent-client-protocol) not found: this outside-SDK check is skipped");
    }
    ok
}

fn script(name: &str) -> std::ffi::OsString {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/acp")
        .join(name)
        .into_os_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_agent_answers_a_remote_prompt() {
    if !python_acp() {
        return;
    }
    // The shell notes the start in FAKE_ACP_LOG, as the fake agent does.
    let s = setup_with(vec![
        "sh".into(),
        "-c".into(),
        "echo start >> \"$FAKE_ACP_LOG\"; exec python3 \"$0\"".into(),
        script("py_agent.py"),
    ])
    .await;
    let th = say(&s.a, &s.b, None, "hi from alice").await;
    wait_state(&s.a, &th, 0, "done").await;
    let reply: String = text(&s.a, &th).await.split('|').collect();
    assert_eq!(reply, "py-echo: hi from alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_drives_awp_acp() {
    if !python_acp() {
        return;
    }
    let s = setup().await;
    let out = tokio::process::Command::new("python3")
        .arg(script("py_client.py"))
        .arg("hello editor")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(s.a.path())
        .args(["acp", "--peer", &s.b.key()])
        .env_remove("AWP_HOME")
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), out)
        .await
        .expect("the client finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("stop_reason=end_turn"), "{stdout}");
    assert!(stdout.contains("echo: hello editor"), "{stdout}");
}

/// An editor (the crate's ACP client) drives `awp acp --peer B` on node A: a prompt whose
/// permission question crosses to the editor and back, then a prompt cancelled by the
/// editor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editor_drives_awp_acp_permission_and_cancel() {
    use acp::v1::schema as s;
    use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

    let st = setup().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(st.a.path())
        .args(["acp", "--peer", &st.b.key()])
        .env_remove("AWP_HOME")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = acp::ByteStreams::new(
        child.stdin.take().unwrap().compat_write(),
        child.stdout.take().unwrap().compat(),
    );
    let text = Arc::new(Mutex::new(String::new()));
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let (t1, a1) = (text.clone(), asked.clone());
    let run = acp::Client
        .v1()
        .on_receive_notification(
            async move |n: s::SessionNotification, _cx| {
                let v = serde_json::to_value(&n.update).unwrap();
                if let Some(t) = v["content"]["text"].as_str() {
                    t1.lock().unwrap().push_str(t);
                }
                Ok(())
            },
            acp::on_receive_notification!(),
        )
        .on_receive_request(
            async move |r: s::RequestPermissionRequest, responder, _cx| {
                let ids: Vec<String> = r
                    .options
                    .iter()
                    .map(|o| o.option_id.0.to_string())
                    .collect();
                a1.lock().unwrap().extend(ids);
                responder.respond(s::RequestPermissionResponse::new(
                    s::RequestPermissionOutcome::Selected(s::SelectedPermissionOutcome::new("ok")),
                ))
            },
            acp::on_receive_request!(),
        )
        .connect_with(transport, async |cx: acp::v1::ConnectionTo<acp::Agent>| {
            let init: s::InitializeRequest =
                serde_json::from_value(json!({"protocolVersion": 1})).unwrap();
            cx.send_request(init).block_task().await?;
            let cwd = std::env::temp_dir();
            let sid = cx
                .send_request(s::NewSessionRequest::new(cwd))
                .block_task()
                .await?
                .session_id;
            let block = |t: &str| s::ContentBlock::Text(s::TextContent::new(t));
            let r = cx
                .send_request(s::PromptRequest::new(sid.clone(), vec![block("perm")]))
                .block_task()
                .await?;
            let first = serde_json::to_value(r.stop_reason).unwrap();
            // The second prompt waits in the agent until the editor cancels it.
            let pending = cx
                .send_request(s::PromptRequest::new(sid.clone(), vec![block("wait")]))
                .block_task();
            let cancel = {
                let cx = cx.clone();
                let t = text.clone();
                let sid = sid.clone();
                async move {
                    for _ in 0..500 {
                        if t.lock().unwrap().contains("waiting for cancel") {
                            break;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                    cx.send_notification(s::CancelNotification::new(sid))
                        .unwrap();
                }
            };
            let (r, ()) = tokio::join!(pending, cancel);
            let second = serde_json::to_value(r?.stop_reason).unwrap();
            // The cancelled prompt ended at once; its late end at B does not end the next.
            let r = cx
                .send_request(s::PromptRequest::new(sid.clone(), vec![block("again")]))
                .block_task()
                .await?;
            let third = serde_json::to_value(r.stop_reason).unwrap();
            Ok((first, second, third))
        });
    let (first, second, third) = tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the editor's session ends in time")
        .expect("ACP works");
    assert_eq!(first, "end_turn");
    assert_eq!(*asked.lock().unwrap(), vec!["ok".to_string(), "no".into()]);
    assert!(
        text.lock().unwrap().contains("permission: ok"),
        "{}",
        text.lock().unwrap()
    );
    assert_eq!(second, "cancelled");
    assert_eq!(third, "end_turn");
    let text = text.lock().unwrap().clone();
    assert!(text.contains("echo: again"), "{text}");
}

/// A prompt stuck in the agent holds only its own thread: another thread of the same peer
/// gets its answer meanwhile, and plain msgs between the nodes flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_prompt_does_not_stall_other_threads() {
    let s = setup().await;
    let stuck = say(&s.a, &s.b, None, "wait").await;
    wait_state(&s.a, &stuck, 0, "working").await;
    let started = std::time::Instant::now();
    let other = say(&s.a, &s.b, None, "meanwhile").await;
    wait_state(&s.a, &other, 0, "done").await;
    eprintln!(
        "a second thread answered in {} ms while the first was stuck",
        started.elapsed().as_millis()
    );
    // The stuck thread is still working (nothing ended it).
    let last = inbound(&s.a, &stuck)
        .await
        .into_iter()
        .rfind(|l| l["t"] == "state")
        .unwrap();
    assert_eq!(last["state"], "working");
    // The node's own traffic is not held up either: B's user writes to A directly.
    let r =
        s.b.ctl(Request::Send {
            peer: Some(s.a.key()),
            th: None,
            subject: Some("direct".into()),
            re: None,
            parts: vec![json!({"k": "text", "text": "direct"})],
            files: vec![],
            wait_ack_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.body["status"], "delivered", "{:?}", r.body);
}

/// A thread that B's user started is B's user's: A's reply in it is no prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_in_threads_the_serving_user_started_are_not_prompts() {
    let s = setup().await;
    let r =
        s.b.send(Some(&s.a.key()), None, "a question from bob's user")
            .await;
    let th = r["th"].as_str().unwrap().to_string();
    eventually(10, || async {
        (!inbound(&s.a, &th).await.is_empty()).then_some(())
    })
    .await;
    s.a.send(None, Some(&th), "hello, an answer for bob's user")
        .await;
    // A later thread of A is served; by then the reply has been seen and left alone.
    let other = say(&s.a, &s.b, None, "served").await;
    wait_state(&s.a, &other, 0, "done").await;
    let lines = inbound(&s.a, &th).await;
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["parts"][0]["text"], "a question from bob's user");
}

/// Runs `awp --home HOME acp ARGS…` as an editor's agent, driven by the crate's ACP client
/// running `main` (given the connection and the agent text received so far); permission
/// requests are denied. 60 s at most. Returns `main`'s result and the text.
async fn editor<T>(
    home: &Path,
    args: &[&str],
    main: impl AsyncFnOnce(
        acp::v1::ConnectionTo<acp::Agent>,
        Arc<Mutex<String>>,
    ) -> Result<T, acp::Error>,
) -> (Result<T, acp::Error>, String) {
    use acp::v1::schema as s;
    use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(home)
        .arg("acp")
        .args(args)
        .env_remove("AWP_HOME")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = acp::ByteStreams::new(
        child.stdin.take().unwrap().compat_write(),
        child.stdout.take().unwrap().compat(),
    );
    let text = Arc::new(Mutex::new(String::new()));
    let (t1, t2) = (text.clone(), text.clone());
    let run = acp::Client
        .v1()
        .on_receive_notification(
            async move |n: s::SessionNotification, _cx| {
                let v = serde_json::to_value(&n.update).unwrap();
                if let Some(t) = v["content"]["text"].as_str() {
                    t1.lock().unwrap().push_str(t);
                }
                Ok(())
            },
            acp::on_receive_notification!(),
        )
        .on_receive_request(
            async move |_r: s::RequestPermissionRequest, responder, _cx| {
                responder.respond(s::RequestPermissionResponse::new(
                    s::RequestPermissionOutcome::Cancelled,
                ))
            },
            acp::on_receive_request!(),
        )
        .connect_with(
            transport,
            async move |cx: acp::v1::ConnectionTo<acp::Agent>| {
                let init: s::InitializeRequest =
                    serde_json::from_value(json!({"protocolVersion": 1})).unwrap();
                cx.send_request(init).block_task().await?;
                main(cx, t2).await
            },
        );
    let r = tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the editor's session ends in time");
    let t = text.lock().unwrap().clone();
    (r, t)
}

/// A new session's id (`session/new`).
async fn new_session(
    cx: &acp::v1::ConnectionTo<acp::Agent>,
) -> Result<acp::v1::schema::SessionId, acp::Error> {
    let req = acp::v1::schema::NewSessionRequest::new(std::env::temp_dir());
    Ok(cx.send_request(req).block_task().await?.session_id)
}

fn prompt_req(sid: &acp::v1::schema::SessionId, t: &str) -> acp::v1::schema::PromptRequest {
    use acp::v1::schema as s;
    s::PromptRequest::new(
        sid.clone(),
        vec![s::ContentBlock::Text(s::TextContent::new(t))],
    )
}

/// The `state` lines B received from A in `th` (what B's served agent would see).
async fn received_states(b: &TestNode, th: &str) -> Vec<Value> {
    inbound(b, th)
        .await
        .into_iter()
        .filter(|l| l["t"] == "state")
        .collect()
}

/// `awp acp --peer B` where B serves no agent: the editor's cancel ends the prompt at once
/// with `cancelled` (before: ignored while waiting 30 min for B), and B's thread gets our
/// `failed` (`cancelled`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awp_acp_cancel_ends_the_prompt_when_the_peer_serves_no_agent() {
    use acp::v1::schema as s;
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let (r, _) = editor(&a.path(), &["--peer", &b.key()], async |cx, _t| {
        let sid = new_session(&cx).await?;
        let pending = cx
            .send_request(prompt_req(&sid, "anyone there?"))
            .block_task();
        let cancel = async {
            // Cancel once the msg reached B (the prompt is then waiting for B).
            eventually(20, || async {
                (!b.inbound().await.is_empty()).then_some(())
            })
            .await;
            cx.send_notification(s::CancelNotification::new(sid.clone()))
                .unwrap();
        };
        let (r, ()) = tokio::join!(pending, cancel);
        Ok(serde_json::to_value(r?.stop_reason).unwrap())
    })
    .await;
    assert_eq!(r.expect("the prompt ends"), "cancelled");
    let th = b.inbound().await[0]["th"].as_str().unwrap().to_string();
    let states = eventually(10, || async {
        let st = received_states(&b, &th).await;
        (!st.is_empty()).then_some(st)
    })
    .await;
    assert_eq!(states[0]["state"], "failed");
    assert_eq!(states[0]["note"], "cancelled");
}

/// `awp acp --peer B --answer-timeout 2s` where B serves no agent: the prompt ends with an
/// error saying B answered nothing (before: a 30 min wait), and the thread is ended at B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awp_acp_ends_a_prompt_the_peer_does_not_answer() {
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let args = ["--peer", &b.key(), "--answer-timeout", "2s"];
    let (r, _) = editor(&a.path(), &args, async |cx, _t| {
        let sid = new_session(&cx).await?;
        let r = cx
            .send_request(prompt_req(&sid, "hello?"))
            .block_task()
            .await;
        Ok(r.map(|r| r.stop_reason))
    })
    .await;
    let e = r.expect("the session runs").expect_err("the prompt fails");
    assert_eq!(e.code, acp::ErrorCode::INTERNAL_ERROR, "{e:?}");
    assert!(e.message.contains("answered nothing within 2 s"), "{e:?}");
    assert!(e.message.contains("serve an agent"), "{e:?}");
    let th = b.inbound().await[0]["th"].as_str().unwrap().to_string();
    let states = eventually(10, || async {
        let st = received_states(&b, &th).await;
        (!st.is_empty()).then_some(st)
    })
    .await;
    assert_eq!(states[0]["state"], "failed", "{states:?}");
    assert_eq!(states[0]["note"], "no answer within 2 s", "{states:?}");
}

/// `awp acp --peer NAME` for a peer the node does not know exits 2 before serving, with
/// the reason on stderr (before: it served, and exited 0 when the editor closed stdin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awp_acp_refuses_an_unknown_peer() {
    let a = TestNode::start("alice").await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(a.path())
        .args(["acp", "--peer", "nosuchpeer"])
        .env_remove("AWP_HOME")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), out)
        .await
        .expect("awp acp ends")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("nosuchpeer"), "{err}");
    assert!(out.stdout.is_empty(), "nothing served");
}

/// The served agent crashing mid-prompt: the editor's prompt ends `refusal` (ACP has no
/// stop reason for a failure; the closest is kept) with the peer's note as a last chunk.
/// And a prompt in an unknown session is an invalid-params error (-32602; before: -32603).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awp_acp_reports_a_crash_of_the_served_agent() {
    let st = setup().await;
    let (r, text) = editor(&st.a.path(), &["--peer", &st.b.key()], async |cx, _t| {
        let unknown = acp::v1::schema::SessionId::new("awp-999");
        let e = cx
            .send_request(prompt_req(&unknown, "hi"))
            .block_task()
            .await
            .expect_err("no such session");
        assert_eq!(e.code, acp::ErrorCode::INVALID_PARAMS, "{e:?}");
        let sid = new_session(&cx).await?;
        let r = cx
            .send_request(prompt_req(&sid, "crash"))
            .block_task()
            .await?;
        Ok(serde_json::to_value(r.stop_reason).unwrap())
    })
    .await;
    assert_eq!(r.expect("the prompt ends"), "refusal");
    assert!(text.contains("[failed: "), "{text}");
    assert!(text.contains("exited") || text.contains("closed"), "{text}");
    assert!(text.contains("restarted"), "{text}");
}

/// A burst of agent output far larger than the thread queue (2,000 chunks back to back)
/// reaches the peer whole and in order (before, chunks beyond the queue were dropped with
/// a WARN each and the thread still ended `done`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_agent_chunks_reaches_the_peer_whole_and_in_order() {
    let s = setup().await;
    let th = say(&s.a, &s.b, None, "burst 2000").await;
    wait_state(&s.a, &th, 0, "done").await;
    let got: String = inbound(&s.a, &th)
        .await
        .iter()
        .filter(|l| l["t"] == "msg")
        .flat_map(|l| l["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    let want: String = (0..2000).map(|i| format!("<{i}>")).collect();
    assert_eq!(
        got.len(),
        want.len(),
        "lost output: {}",
        s.stderr.lock().unwrap()
    );
    assert_eq!(got, want);
}

/// SIGTERM on `serve-agent` fails the running prompt's thread with a note naming the node
/// (before, it stayed `working` forever), then the process exits.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_serve_agent_fails_the_running_prompt() {
    stop_signal_fails_the_running_prompt(&["-TERM"]).await;
}

/// A terminal's Ctrl-C reaches the whole foreground process group. The agent runs in a
/// group of its own, so `serve-agent` sees the SIGINT, fails the prompt with its own note
/// and stops the agent (before, the agent died of the SIGINT first and the note said so).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_to_the_process_group_fails_the_running_prompt_with_the_stop_note() {
    stop_signal_fails_the_running_prompt(&["-INT", "--"]).await;
}

#[cfg(unix)]
async fn stop_signal_fails_the_running_prompt(signal: &[&str]) {
    let mut s = setup().await;
    let th = say(&s.a, &s.b, None, "wait").await;
    wait_state(&s.a, &th, 0, "working").await;
    eventually(10, || async {
        text(&s.a, &th)
            .await
            .contains("waiting for cancel")
            .then_some(())
    })
    .await;
    let pid = s._serve.id().expect("serve-agent runs");
    // `kill -INT -- -PID` signals the group PID leads (a terminal's Ctrl-C).
    let target = if signal.contains(&"--") {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let killed = std::process::Command::new("kill")
        .args(signal)
        .arg(&target)
        .status()
        .unwrap();
    assert!(killed.success());
    let failed = wait_state(&s.a, &th, 1, "failed").await;
    assert_eq!(failed["note"], "bob stopped serving the agent");
    let st = tokio::time::timeout(std::time::Duration::from_secs(20), s._serve.wait())
        .await
        .expect("serve-agent exits")
        .unwrap();
    assert!(st.success(), "{st}");
}

/// The editor closes `awp acp`'s stdin mid-prompt: the peer's thread gets our `failed`
/// (`cancelled`), as after `session/cancel` (before: the prompt was left open at the peer),
/// and `awp acp` exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awp_acp_cancels_prompts_in_flight_when_the_editor_closes_stdin() {
    editor_closes_stdin(false).await;
}

/// The same when stdin closes right after the prompt line, before the prompt's msg has
/// even been queued (before: the msg could still reach the peer with no end state, or be
/// lost): `awp acp` lets the prompt start, then ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awp_acp_ends_a_prompt_whose_editor_closed_stdin_at_once() {
    editor_closes_stdin(true).await;
}

async fn editor_closes_stdin(at_once: bool) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let a = TestNode::start("alice").await;
    let b = TestNode::start("bob").await;
    a.connect(&b).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(a.path())
        .args(["acp", "--peer", &b.key()])
        .env_remove("AWP_HOME")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let step = std::time::Duration::from_secs(20);
    let mut answer = async |id: u64| -> Value {
        for _ in 0..100 {
            let l = tokio::time::timeout(step, out.next_line())
                .await
                .expect("awp acp answers in time")
                .unwrap()
                .expect("a line");
            let v: Value = serde_json::from_str(&l).unwrap();
            if v["id"] == id {
                return v;
            }
        }
        panic!("no answer to {id}");
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}});
    stdin
        .write_all(format!("{init}\n").as_bytes())
        .await
        .unwrap();
    answer(1).await;
    let new = json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                     "params": {"cwd": std::env::temp_dir(), "mcpServers": []}});
    stdin
        .write_all(format!("{new}\n").as_bytes())
        .await
        .unwrap();
    let sid = answer(2).await["result"]["sessionId"].clone();
    let prompt = json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}});
    stdin
        .write_all(format!("{prompt}\n").as_bytes())
        .await
        .unwrap();
    stdin.flush().await.unwrap();
    let mut stdin = Some(stdin);
    if at_once {
        stdin = None;
    }
    eventually(20, || async {
        (!b.inbound().await.is_empty()).then_some(())
    })
    .await;
    drop(stdin);
    let th = b.inbound().await[0]["th"].as_str().unwrap().to_string();
    let states = eventually(10, || async {
        let st = received_states(&b, &th).await;
        (!st.is_empty()).then_some(st)
    })
    .await;
    assert_eq!(states[0]["state"], "failed", "{states:?}");
    assert_eq!(states[0]["note"], "cancelled", "{states:?}");
    tokio::time::timeout(step, child.wait())
        .await
        .expect("awp acp exits")
        .unwrap();
}

/// A second `serve-agent` for the same node home exits 2 naming the first one's pid
/// (before, both served and both answered every prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_agent_for_the_home_exits_2() {
    let s = setup().await;
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_awp"))
            .arg("--home")
            .arg(s.b.path())
            .args(["serve-agent", "--acp", "--root"])
            .arg(s.root.path())
            .arg("--")
            .arg(fake_agent())
            .env_remove("AWP_HOME")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the second serve-agent exits")
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let pid = s._serve.id().unwrap();
    assert!(
        err.contains(&format!(
            "another `awp serve-agent` (pid {pid}) already serves"
        )),
        "{err}"
    );
}

/// A prompt queued behind a running one and cleared by the peer's `failed` gets a msg in
/// reply to it, `cancelled before it ran` (before: it vanished without a word).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_prompt_cleared_by_a_cancel_gets_a_note() {
    let s = setup().await;
    let th = say(&s.a, &s.b, None, "wait").await;
    wait_state(&s.a, &th, 0, "working").await;
    eventually(10, || async {
        text(&s.a, &th)
            .await
            .contains("waiting for cancel")
            .then_some(())
    })
    .await;
    let queued = s.a.send(Some(&s.b.key()), Some(&th), "later").await;
    let queued_id = queued["id"].as_str().expect("the msg id").to_string();
    // The queued msg reached B before the cancel does.
    eventually(10, || async {
        inbound(&s.b, &th)
            .await
            .iter()
            .any(|l| l["id"] == queued_id.as_str())
            .then_some(())
    })
    .await;
    let r =
        s.a.ctl(Request::State {
            peer: Some(s.b.key()),
            th: th.clone(),
            state: "failed".into(),
            note: Some("cancelled".into()),
            wait_ack_ms: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let note = eventually(20, || async {
        inbound(&s.a, &th)
            .await
            .into_iter()
            .find(|l| l["t"] == "msg" && l["re"] == queued_id.as_str())
    })
    .await;
    assert_eq!(
        note["parts"][0]["text"], "cancelled before it ran",
        "{note}"
    );
}
