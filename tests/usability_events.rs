//! Issue 9 (usability), the cases about refusals, events, read marks, paging, grant caps
//! and JSON errors: each through the `awp` binary (or the control socket) against nodes in
//! temp homes.

mod common;

use awp_node::control::{Event, Request};
use awp_node::node::{NodeConfig, NodeHandle};
use common::{awp_cli as awp, eventually, stderr_text as stderr, stdout_text as stdout, TestNode};
use serde_json::Value;
use std::process::Output;
use std::time::Duration;
use tokio::sync::broadcast;

/// stdout as one JSON value per line.
fn json_lines(o: &Output) -> Vec<Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

/// The one JSON error object of a failed `--json` command: `{"error":{code,message,hint}}`
/// alone on stdout, the text line on stderr.
fn json_error(o: &Output) -> Value {
    let lines = json_lines(o);
    assert_eq!(lines.len(), 1, "stdout: {}", stdout(o));
    let e = lines[0]["error"].clone();
    assert!(e["code"].is_string(), "{e}");
    assert!(!e["message"].as_str().unwrap_or("").is_empty(), "{e}");
    assert!(e["hint"].is_string(), "{e}");
    assert!(stderr(o).starts_with("awp: "), "stderr: {}", stderr(o));
    e
}

/// The next event named `name` (and passing `keep`) within 10 s.
async fn next_event(
    rx: &mut broadcast::Receiver<Event>,
    name: &str,
    keep: impl Fn(&Event) -> bool,
) -> Event {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await {
                Ok(ev) if ev.get("event").and_then(Value::as_str) == Some(name) && keep(&ev) => {
                    return ev
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {name} event within 10 s"))
}

/// Two connected nodes: (client, server); the server serves nothing.
async fn pair() -> (TestNode, TestNode) {
    let client = TestNode::start("client").await;
    let server = TestNode::start("server").await;
    client.connect(&server).await;
    (client, server)
}

/// `awp --json send PEER --data {"cmd":["true"]} --mime …exec+json --wait-ack 10s`.
async fn send_exec_request(client: &TestNode, to: &str) -> Output {
    awp(
        &client.path(),
        &[
            "--json",
            "send",
            to,
            "--data",
            r#"{"cmd":["true"]}"#,
            "--mime",
            "application/vnd.awp.exec+json",
            "--wait-ack",
            "10s",
        ],
    )
    .await
}

/// #3: a served request the peer refuses (`err forbidden`, after its ack) is stored in the
/// request's thread: `send --wait-ack` exits 1 with the code, `tail` and `read` show the
/// err, the node emits it as a `line` event, and `wait` on the thread exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_request_reaches_send_read_tail_listen_and_wait() {
    let (client, server) = pair().await;
    let home = client.path();
    let mut events = client.handle.subscribe();

    let o = send_exec_request(&client, &server.key()).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let e = json_error(&o);
    assert_eq!(e["code"], "forbidden", "{e}");
    assert!(stderr(&o).contains("forbidden"), "{}", stderr(&o));

    // The err as a line event of the request's thread (what `awp listen` prints).
    let ev = next_event(&mut events, "line", |ev| {
        ev.get("t").and_then(Value::as_str) == Some("err")
    })
    .await;
    assert_eq!(ev["dir"], "in");
    assert_eq!(ev["line"]["code"], "forbidden");
    let th = ev["th"].as_str().unwrap().to_string();
    let re = ev["line"]["re"].as_str().unwrap().to_string();

    // tail: our request, then the peer's err about it, in its thread.
    let o = awp(&home, &["--json", "tail", "--once", "-t", &th]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines = json_lines(&o);
    let kinds: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["dir"].as_str().unwrap(), l["t"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("out", "msg"), ("in", "err")], "{lines:?}");
    assert_eq!(lines[0]["id"], re.as_str());
    let o = awp(&home, &["tail", "--once", "-t", &th]).await;
    assert!(stdout(&o).contains("ERROR forbidden"), "{}", stdout(&o));

    // read (unmarked): the err is unread.
    let o = awp(&home, &["--json", "read", &th, "--no-mark"]).await;
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["t"], "err");
    assert_eq!(lines[0]["line"]["re"], re.as_str());

    // wait on the thread: ended by the refusal, exit 1 with the code; it consumes it.
    let o = awp(&home, &["wait", "-t", &th, "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stderr(&o).contains("forbidden"), "{}", stderr(&o));
    let o = awp(&home, &["--json", "read", &th]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(json_lines(&o).is_empty(), "{}", stdout(&o));
    client.stop().await;
    server.stop().await;
}

/// #5: the serving node answers a request itself (here: refuses it), so the request is not
/// left unread there for a later `read` or `wait` to return at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_request_is_not_left_unread_on_the_serving_node() {
    let (client, server) = pair().await;
    send_exec_request(&client, &server.key()).await;
    // A plain msg after it: once it is in, it is the only unread line on the server.
    client.send(Some(&server.key()), None, "plain").await;
    let home = server.path();
    let unread = eventually(10, || {
        let home = home.clone();
        async move {
            let o = awp(&home, &["--json", "read", "--no-mark"]).await;
            let lines = json_lines(&o);
            let plain = lines
                .iter()
                .any(|l| l["line"]["parts"][0]["text"] == "plain");
            plain.then_some(lines)
        }
    })
    .await;
    assert_eq!(unread.len(), 1, "the request is left unread: {unread:?}");
    client.stop().await;
    server.stop().await;
}

/// #5: `awp wait && awp read` prints the line that ended the wait once: `wait` marks it
/// read, so `read` and a later `wait` do not return it again (`--no-mark` leaves it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_consumes_the_line_it_reports() {
    let (client, server) = pair().await;
    let home = server.path();
    client.send(Some(&server.key()), None, "first").await;
    let o = awp(&home, &["wait", "--no-mark", "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("first"), "{}", stdout(&o));
    let o = awp(&home, &["--json", "wait", "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines[0]["line"]["parts"][0]["text"], "first", "{lines:?}");
    let o = awp(&home, &["--json", "read"]).await;
    assert!(json_lines(&o).is_empty(), "printed twice: {}", stdout(&o));
    let o = awp(&home, &["wait", "--timeout", "300ms"]).await;
    assert_eq!(
        o.status.code(),
        Some(2),
        "returned on an old line: {}",
        stdout(&o)
    );
    client.stop().await;
    server.stop().await;
}

/// A peer name with a typo gets the known name it is closest to; a text close to none
/// does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typo_in_a_peer_name_gets_the_close_name() {
    let (client, server) = pair().await;
    let home = client.path();
    let o = awp(&home, &["--json", "send", "sever", "hi"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = json_error(&o);
    assert_eq!(e["code"], "no_such_peer", "{e}");
    assert_eq!(
        e["message"], "no peer named \"sever\"; did you mean \"server\"?",
        "{e}"
    );
    let o = awp(&home, &["--json", "connect", "sever"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        json_error(&o)["message"],
        "no peer named \"sever\"; did you mean \"server\"?"
    );
    let o = awp(&home, &["--json", "send", "zzzzzz", "hi"]).await;
    let e = json_error(&o);
    assert!(
        !e["message"].as_str().unwrap().contains("did you mean"),
        "{e}"
    );
    client.stop().await;
    server.stop().await;
}

/// #5b: `read --limit N` says when more unread lines exist (`{"more":true,"next":C}` as
/// the last JSON line; a text line otherwise), `--after C` continues, `--all` has no limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_pages_say_more_and_continue_after_the_cursor() {
    let (client, server) = pair().await;
    let first = client.send(Some(&server.key()), None, "m0").await;
    let th = first["th"].as_str().unwrap().to_string();
    for i in 1..3 {
        client.send(None, Some(&th), &format!("m{i}")).await;
    }
    let home = server.path();
    eventually(10, || {
        let home = home.clone();
        async move {
            let o = awp(&home, &["--json", "read", "--no-mark"]).await;
            (json_lines(&o).len() == 3).then_some(())
        }
    })
    .await;
    let text = |l: &Value| l["line"]["parts"][0]["text"].as_str().unwrap().to_string();

    let o = awp(&home, &["--json", "read", "--no-mark", "--limit", "2"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!([text(&lines[0]), text(&lines[1])], ["m0", "m1"]);
    assert_eq!(lines[2]["more"], true, "{lines:?}");
    let next = lines[2]["next"].as_str().unwrap().to_string();

    let o = awp(&home, &["--json", "read", "--no-mark", "--after", &next]).await;
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(text(&lines[0]), "m2");

    let o = awp(&home, &["read", "--no-mark", "--limit", "1"]).await;
    let out = stdout(&o);
    assert!(
        out.lines().last().unwrap().contains("more unread lines"),
        "{out}"
    );

    // Marking: only what was printed.
    let o = awp(&home, &["--json", "read", "--limit", "2"]).await;
    assert_eq!(json_lines(&o).len(), 3);
    let o = awp(&home, &["--json", "read", "--all"]).await;
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(text(&lines[0]), "m2");
    client.stop().await;
    server.stop().await;
}

/// A node that publishes its presence document.
async fn presence_node(name: &str) -> TestNode {
    let home = tempfile::TempDir::new().unwrap();
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        presence: true,
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}

/// #4: grants received and revoked, introductions and a newly present agent are events in
/// the node's stream (`awp listen`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_introductions_and_presence_are_events() {
    let alice = TestNode::start("alice").await;
    let bob = TestNode::start("bob").await;
    let carol = presence_node("carol").await;
    let mut bob_events = bob.handle.subscribe();
    let mut alice_events = alice.handle.subscribe();
    alice.connect(&bob).await;
    alice.connect(&carol).await;

    // A grant from alice reaches bob: `grant`, role held.
    let r = alice
        .ctl(Request::Grant {
            peer: bob.key(),
            caps: vec!["exec".into()],
            ttl_s: 600,
            aud: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let hash = r.body["hash"].as_str().unwrap().to_string();
    let ev = next_event(&mut bob_events, "grant", |_| true).await;
    assert_eq!(ev["role"], "held");
    assert_eq!(ev["hash"], hash.as_str());
    assert_eq!(ev["caps"], serde_json::json!(["exec"]));
    assert_eq!(ev["peer"], alice.key().as_str());

    // alice revokes it: `grant_revoked`.
    let r = alice.ctl(Request::Revoke { hash: hash.clone() }).await;
    assert!(r.ok, "{:?}", r.error);
    let ev = next_event(&mut alice_events, "grant_revoked", |_| true).await;
    assert_eq!(ev["hash"], hash.as_str());

    // alice introduces carol to bob: `introduced`.
    let r = alice
        .ctl(Request::Introduce {
            to: bob.key(),
            peer: carol.key(),
            caps: vec![],
            ttl_s: 600,
            th: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let ev = next_event(&mut bob_events, "introduced", |_| true).await;
    assert_eq!(ev["peer"], carol.key().as_str());
    assert_eq!(ev["by"], alice.key().as_str());

    // carol (publishing presence) connects to bob: bob sees a new agent.
    carol.connect(&bob).await;
    let ev = next_event(&mut bob_events, "presence", |ev| {
        ev.get("origin").and_then(Value::as_str) == Some(&carol.key())
    })
    .await;
    assert_eq!(ev["name"], "carol");
    for n in [alice, bob, carol] {
        n.stop().await;
    }
}

/// #9: `awp grant` checks capability names before signing: an unknown one is refused
/// (exit 2, nothing stored) unless `--custom` or `custom:NAME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_grant_caps_need_custom() {
    let node = TestNode::start("granter").await;
    let home = node.path();
    let bob = awp_node::identity::Identity::from_seed(&[9; 32])
        .key()
        .to_string();
    let o = awp(&home, &["grant", &bob, "nonsense-cap"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("unknown capability"), "{}", stderr(&o));
    let o = awp(&home, &["--json", "grants"]).await;
    assert!(json_lines(&o).is_empty(), "signed anyway: {}", stdout(&o));

    let o = awp(
        &home,
        &["--json", "grant", &bob, "--custom", "nonsense-cap"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        json_lines(&o)[0]["grant"]["caps"],
        serde_json::json!(["nonsense-cap"])
    );
    let o = awp(&home, &["--json", "grant", &bob, "custom:deploy", "exec"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        json_lines(&o)[0]["grant"]["caps"],
        serde_json::json!(["deploy", "exec"])
    );
    node.stop().await;
}

/// #11: under `--json` a failure is one JSON object on stdout (the text stays on stderr)
/// with the same exit code; `up --json` on a running node says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_errors_are_one_object_on_stdout() {
    let node = TestNode::start("erring").await;
    let home = node.path();
    let o = awp(&home, &["--json", "send", "nobody-here", "hi"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(json_error(&o)["code"], "no_such_peer");
    // `connect` to a name never met: neither a peer nor an address, and every address
    // form is named (relay: included).
    let o = awp(&home, &["--json", "connect", "nobody-here"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = json_error(&o);
    assert_eq!(e["code"], "no_such_peer", "{e}");
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("neither a known peer"), "{m}");
    for form in ["tls:HOST:PORT", "tcp:", "unix:", "relay:tls:"] {
        assert!(m.contains(form), "{form}: {m}");
    }

    // A grammar error too.
    let o = awp(&home, &["--json", "read", "--limit", "0"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(json_error(&o)["code"], "usage");
    // Without --json, stdout stays empty.
    let o = awp(&home, &["send", "nobody-here", "hi"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));

    // Reading a thread that does not exist is refused like `state` and `send -t` do, not
    // answered "no unread lines".
    let o = awp(&home, &["--json", "read", "thr_nope"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(json_error(&o)["code"], "no_such_thread");

    let o = awp(&home, &["--json", "up"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = &json_lines(&o)[0];
    assert_eq!(v["already_running"], true, "{v}");
    assert_eq!(v["pid"], std::process::id(), "{v}");
    node.stop().await;
}

/// #3 bounds, from a hostile peer: an err about a line that is not ours is not stored, a
/// second err about the same line is not stored, and after 64 such misses in one session
/// the peer's errs are no longer looked up at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_store_errs_beyond_one_per_line_of_ours() {
    use awp_node::wire::{ErrLine, Line};
    let node = TestNode::start("target").await;
    let home = node.path();
    let mut raw = common::Raw::dial(&node.address(), 77).await;
    raw.handshake().await;
    raw.write(br#"{"t":"resume","id":"01K000000000000000000000FF","ts":"2026-01-01T00:00:00.000Z","seen":{}}"#).await;
    let raw_key = raw.identity.key().to_string();
    // Two lines of ours to the raw peer.
    let first = node.send(Some(&raw_key), None, "one").await;
    let th = first["th"].as_str().unwrap().to_string();
    let second = node.send(None, Some(&th), "two").await;
    let ids = [
        first["id"].as_str().unwrap(),
        second["id"].as_str().unwrap(),
    ];
    let err = |n: u32, re: &str| {
        Line::Err(ErrLine {
            id: format!("01K0000000000000000000{n:04}"),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: Some(th.clone()),
            re: Some(re.to_string()),
            code: "forbidden".into(),
            detail: Some("no".into()),
            blob_ref: None,
        })
        .encode()
    };
    let stored = |home: std::path::PathBuf| async move {
        let o = awp(&home, &["--json", "read", "--no-mark"]).await;
        json_lines(&o)
            .into_iter()
            .filter(|l| l["t"] == "err")
            .count()
    };
    // About our first line: stored; twice more about it: not.
    for n in 0..3 {
        raw.write(&err(n, ids[0])).await;
    }
    // 64 misses: ids that are not ours (one is a duplicate above, so 62 more).
    let now = awp_node::wire::time::now_ms();
    for n in 0..62u32 {
        let fake = ulid::Ulid::from_parts(now, u128::from(n)).to_string();
        raw.write(&err(100 + n, &fake)).await;
    }
    // Now even an err about our second line is not looked up.
    raw.write(&err(999, ids[1])).await;
    // A msg after them: once it is stored, every err before it was handled.
    raw.write(
        common::data_msg_line(
            "01K0000000000000000000ZZZZ",
            &th,
            &[("application/json", serde_json::json!(1))],
        )
        .as_bytes(),
    )
    .await;
    eventually(10, || {
        let home = home.clone();
        async move {
            let o = awp(&home, &["--json", "read", "--no-mark"]).await;
            json_lines(&o).iter().any(|l| l["t"] == "msg").then_some(())
        }
    })
    .await;
    assert_eq!(stored(home.clone()).await, 1);
    node.stop().await;
}
