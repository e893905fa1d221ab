//! `awp conform` against our own node (TLS, TCP, Unix), against deliberately broken fake
//! peers, and the command line surface (`--list`, `--json`, exit codes, `--listen`).

mod common;

use awp_node::conform::{self, Options, Status, SCENARIOS};
use awp_node::identity::{auth_transcript, Identity};
use awp_node::net::LineReader;
use awp_node::node::{NodeConfig, NodeHandle, CAPS};
use awp_node::wire::{self, b64, Line};
use serde_json::Value;
use std::process::Output;
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// A node listening on TLS, TCP and Unix at once; its three addresses in that order.
async fn three_binding_node() -> (TempDir, NodeHandle, Vec<String>) {
    let home = TempDir::new().unwrap();
    let sock = home.path().join("n.sock");
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec![
            "tls:127.0.0.1:0".parse().unwrap(),
            "tcp:127.0.0.1:0".parse().unwrap(),
            format!("unix:{}", sock.display()).parse().unwrap(),
        ],
        allow_plaintext: false,
        name: Some("conform-target".into()),
        about: None,
        ..Default::default()
    })
    .await
    .expect("node starts");
    let addrs: Vec<String> = handle.listening_event()["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(addrs.len(), 3, "{addrs:?}");
    assert!(addrs[0].starts_with("tls:") && addrs[0].contains("#ed25519:"));
    assert!(addrs[1].starts_with("tcp:"));
    assert!(addrs[2].starts_with("unix:"));
    (home, handle, addrs)
}

async fn stop(handle: NodeHandle) {
    handle.shutdown();
    handle.stopped().await;
}

/// The scenarios our node must skip, each with the capability its hello does not list.
/// Today the node announces no caps (`CAPS` is empty), so this is exactly
/// `[("chunk", "blob"), ("grant", "grant")]`; once the node announces `blob` and `grant`
/// it becomes empty and all 15 must pass.
fn expected_skips() -> Vec<(&'static str, &'static str)> {
    SCENARIOS
        .iter()
        .filter_map(|s| {
            let cap = s.needs_cap?;
            (!CAPS.contains(&cap)).then_some((s.name, cap))
        })
        .collect()
}

fn summary_line() -> String {
    let skips = expected_skips().len();
    format!("{} passed, 0 failed, {skips} skipped", 15 - skips)
}

/// Every scenario passed except the expected skips, which were skipped for their cap.
fn assert_conforms(report: &conform::Report, addr: &str) {
    let skips = expected_skips();
    assert!(
        skips
            .iter()
            .all(|(name, _)| *name == "chunk" || *name == "grant"),
        "only chunk and grant depend on caps: {skips:?}"
    );
    assert_eq!(report.results.len(), 15);
    for r in &report.results {
        match skips.iter().find(|(name, _)| *name == r.name) {
            Some((_, cap)) => {
                assert_eq!(r.status, Status::Skip, "{addr}: {r:?}");
                let reason = r.reason.as_deref().unwrap_or_default();
                assert!(reason.contains(&format!("`{cap}`")), "{addr}: {reason}");
            }
            None => assert_eq!(r.status, Status::Pass, "{addr}: {} failed: {r:#?}", r.name),
        }
    }
    assert_eq!(report.count(Status::Pass), 15 - skips.len());
    assert_eq!(report.count(Status::Skip), skips.len());
    assert!(report.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_node_conforms_over_tls_tcp_and_unix() {
    let (_home, handle, addrs) = three_binding_node().await;
    for addr in &addrs {
        let report = conform::run_connect(&addr.parse().unwrap(), &Options::default())
            .await
            .expect("run starts");
        assert_conforms(&report, addr);
    }
    stop(handle).await;
}

fn awp(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_awp"))
        .args(args)
        .env_remove("AWP_HOME")
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("awp runs")
}

async fn awp_async(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        awp(&args)
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_conforms_over_each_binding() {
    let (_home, handle, addrs) = three_binding_node().await;
    for addr in &addrs {
        let o = awp_async(vec!["conform".into(), addr.clone()]).await;
        let text = stdout(&o);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{addr}:\n{text}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(text.lines().last(), Some(summary_line().as_str()), "{text}");
        for (name, cap) in expected_skips() {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with("skip") && l.contains(&format!(" {name} ")))
                .unwrap_or_else(|| panic!("{name} is not skipped:\n{text}"));
            assert!(line.contains('§'), "{line}");
            assert!(
                text.contains(&format!("caps do not list `{cap}`")),
                "{text}"
            );
        }
    }
    stop(handle).await;
}

/// How a fake peer misbehaves.
#[derive(Clone, Copy)]
enum Fault {
    /// Completes the handshake, answers pings, never acks.
    NeverAcks,
    /// Like NeverAcks, and sends a line whose envelope breaks the schema (empty id)
    /// between its auth and its resume.
    BadEnvelope,
    /// Announces caps `blob` and `grant`, acks msg and state lines, and checks what the
    /// chunk and grant scenarios send: a wrong chunk or grant gets a closing `err
    /// bad_frame` with the reason in `detail`.
    Capable,
    /// Like NeverAcks, and answers a bye with a bye that carries no `re` (the schema
    /// allows it; the reference runner accepts it), then closes.
    ByeWithoutRe,
}

/// A raw TCP peer on 127.0.0.1 that speaks just enough AWP; serves connections until the
/// test ends. Returns its `tcp:` address.
async fn fake_peer(fault: Fault) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp:{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(serve_fake(sock, fault));
        }
    });
    addr
}

async fn serve_fake(sock: tokio::net::TcpStream, fault: Fault) {
    let id = Identity::generate();
    let (r, mut w) = sock.into_split();
    let mut reader = LineReader::new(Box::new(r));
    let mut n = 0u32;
    let mut next_id = move || {
        n += 1;
        format!("01K{n:023}")
    };
    let ts = "2026-01-01T00:00:00.000Z".to_string();
    let mine = Line::Hello(wire::Hello {
        id: next_id(),
        ts: ts.clone(),
        v: 0,
        key: id.key().to_string(),
        name: Some("fake@test".into()),
        nonce: b64::encode_url(&[9u8; 32]),
        caps: match fault {
            Fault::Capable => vec!["blob".into(), "grant".into()],
            _ => vec![],
        },
        about: None,
        addr: None,
        shares: None,
    })
    .encode();
    let send = |line: Vec<u8>| {
        let mut l = line;
        l.push(b'\n');
        l
    };
    if w.write_all(&send(mine.clone())).await.is_err() {
        return;
    }
    let Ok(Some(theirs)) = reader.read_line().await else {
        return;
    };
    let sig = id.sign(&auth_transcript(&mine, &theirs));
    let auth = Line::Auth(wire::Auth {
        id: next_id(),
        ts: ts.clone(),
        sig: b64::encode_url(&sig),
        grants: vec![],
    });
    let resume = Line::Resume(wire::Resume {
        id: next_id(),
        ts: ts.clone(),
        seen: Default::default(),
    });
    let mut out = send(auth.encode());
    if let Fault::BadEnvelope = fault {
        out.extend(send(
            br#"{"t":"x-weird","id":"","ts":"2026-01-01T00:00:00Z"}"#.to_vec(),
        ));
    }
    out.extend(send(resume.encode()));
    if w.write_all(&out).await.is_err() {
        return;
    }
    // Blob refs named by a msg, and the next chunk index expected for each.
    let mut blobs: std::collections::HashMap<String, (u64, u64, String)> = Default::default();
    while let Ok(Some(line)) = reader.read_line().await {
        let reply = match wire::parse_line(&line) {
            Ok(Line::Ping(p)) => Line::Pong(wire::Pong {
                id: next_id(),
                ts: ts.clone(),
                re: p.id,
            }),
            Ok(Line::Msg(m)) if matches!(fault, Fault::Capable) => {
                for part in &m.parts {
                    if let wire::Part::Blob(b) = part {
                        blobs.insert(b.blob_ref.clone(), (0, b.size, m.th.clone()));
                    }
                }
                ack(next_id(), &ts, &m.th, &m.id)
            }
            Ok(Line::State(st)) if matches!(fault, Fault::Capable) => {
                ack(next_id(), &ts, &st.th, &st.id)
            }
            Ok(Line::Chunk(c)) => match check_chunk(&c, &mut blobs) {
                Ok(()) => continue,
                Err(why) => refuse(next_id(), &ts, why),
            },
            Ok(Line::Bye(_)) if matches!(fault, Fault::ByeWithoutRe) => {
                let bye = Line::Bye(wire::Bye {
                    id: next_id(),
                    ts: ts.clone(),
                    re: None,
                    reason: None,
                });
                let _ = w.write_all(&send(bye.encode())).await;
                return;
            }
            Ok(Line::Grant(g)) => match check_grant(&line, &g.grant, &id) {
                Ok(()) => continue,
                Err(why) => refuse(next_id(), &ts, why),
            },
            _ => continue,
        };
        let closing = matches!(&reply, Line::Err(_));
        if w.write_all(&send(reply.encode())).await.is_err() || closing {
            return;
        }
    }
}

fn ack(id: String, ts: &str, th: &str, re: &str) -> Line {
    Line::Ack(wire::Ack {
        id,
        ts: ts.into(),
        th: th.into(),
        re: re.into(),
    })
}

fn refuse(id: String, ts: &str, why: String) -> Line {
    Line::Err(wire::ErrLine {
        id,
        ts: ts.into(),
        th: None,
        re: None,
        code: "bad_frame".into(),
        detail: Some(why),
        blob_ref: None,
    })
}

/// A chunk must follow its naming msg, count from 0, carry the msg's th and standard
/// base64, and end (last) exactly at the declared size.
fn check_chunk(
    c: &wire::Chunk,
    blobs: &mut std::collections::HashMap<String, (u64, u64, String)>,
) -> Result<(), String> {
    let Some((next, left, th)) = blobs.get_mut(&c.blob_ref) else {
        return Err("chunk before its msg".into());
    };
    if c.n != *next {
        return Err(format!("chunk n {} where {} was next", c.n, next));
    }
    if c.th.as_deref() != Some(th.as_str()) {
        return Err("chunk without the msg's th".into());
    }
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD
        .decode(&c.data)
        .map_err(|e| format!("chunk data is not padded standard base64: {e}"))?;
    *left = left
        .checked_sub(data.len() as u64)
        .ok_or("more data than the declared size")?;
    *next += 1;
    if c.last != (*left == 0) {
        return Err(format!("last is {} with {} bytes left", c.last, left));
    }
    Ok(())
}

/// A grant must be for us, issued by the sender's key, for exec, expire in about an hour
/// at whole seconds, carry a 16-byte nonce, and verify over its canonical JSON.
fn check_grant(raw: &[u8], g: &wire::Grant, me: &Identity) -> Result<(), String> {
    let v: Value = serde_json::from_slice(raw).unwrap();
    let obj = v["grant"].as_object().unwrap();
    let iss = awp_node::wire::PeerKey::parse(&g.iss).map_err(|e| e.to_string())?;
    if !awp_node::canonical::verify_object(&iss, obj) {
        return Err("grant signature does not verify".into());
    }
    if g.sub != me.key().to_string() {
        return Err("grant sub is not the peer's key".into());
    }
    if g.caps != ["exec"] {
        return Err(format!("grant caps {:?}", g.caps));
    }
    let exp = time::OffsetDateTime::parse(&g.exp, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("exp {:?}: {e}", g.exp))?;
    let left = exp - time::OffsetDateTime::now_utc();
    if exp.nanosecond() != 0
        || left < time::Duration::minutes(55)
        || left > time::Duration::hours(1)
    {
        return Err(format!("exp {:?} is not now + 1 h in whole seconds", g.exp));
    }
    if b64::decode_any(&g.nonce).map(|n| n.len()) != Ok(16) || g.nonce.contains(['+', '/', '=']) {
        return Err(format!(
            "nonce {:?} is not 16 bytes of unpadded base64url",
            g.nonce
        ));
    }
    Ok(())
}

fn quick(names: &[&str]) -> Options {
    Options {
        scenarios: conform::select(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap(),
        timeout: Duration::from_millis(700),
        ..Options::default()
    }
}

#[tokio::test]
async fn a_peer_that_never_acks_fails_msg_ack() {
    let addr = fake_peer(Fault::NeverAcks).await;
    let report = conform::run_connect(&addr.parse().unwrap(), &quick(&["ping", "msg-ack"]))
        .await
        .unwrap();
    assert_eq!(
        report.get("ping").unwrap().status,
        Status::Pass,
        "{report:#?}"
    );
    let m = report.get("msg-ack").unwrap();
    assert_eq!(m.status, Status::Fail);
    assert!(
        m.reason.as_deref().unwrap().contains("is acked"),
        "{:?}",
        m.reason
    );
    assert!(!report.success());

    // The binary says FAIL under the scenario and exits 1.
    let o = awp_async(vec![
        "conform".into(),
        "--timeout".into(),
        "700ms".into(),
        "--scenario".into(),
        "msg-ack".into(),
        addr,
    ])
    .await;
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("FAIL  msg-ack"), "{text}");
    assert!(text.contains("          - the msg is acked"), "{text}");
    assert_eq!(text.lines().last(), Some("0 passed, 1 failed, 0 skipped"));
}

#[tokio::test]
async fn schema_violations_fail_the_scenario_they_arrive_in() {
    let addr = fake_peer(Fault::BadEnvelope).await;
    let report = conform::run_connect(&addr.parse().unwrap(), &quick(&["handshake", "ping"]))
        .await
        .unwrap();
    let h = report.get("handshake").unwrap();
    assert_eq!(h.status, Status::Fail, "{h:#?}");
    let bad = h.checks.iter().find(|c| !c.ok).unwrap();
    assert_eq!(bad.what, "received lines follow the schema");
    assert!(
        bad.detail.contains("x-weird") && bad.detail.contains("/id"),
        "{bad:?}"
    );
    // Later scenarios on the same session are not blamed for it.
    assert_eq!(report.get("ping").unwrap().status, Status::Pass);

    // Without the handshake scenario, the scenario that opened the session carries it.
    let report = conform::run_connect(&addr.parse().unwrap(), &quick(&["ping"]))
        .await
        .unwrap();
    let p = report.get("ping").unwrap();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
    assert!(
        p.checks[0].what.starts_with("opening the session:"),
        "{p:#?}"
    );
}

#[test]
fn list_names_every_scenario_in_order() {
    let o = awp(&["conform", "--list"]);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "handshake",
            "version",
            "auth-bad-sig",
            "bad-frame",
            "too-large",
            "ping",
            "msg-ack",
            "state-ack",
            "dedup",
            "unknown-type",
            "unknown-field",
            "err-nonclosing",
            "chunk",
            "grant",
            "bye"
        ]
    );
    assert!(text.lines().all(|l| l.contains(" §")), "{text}");
    let msg_ack = text.lines().find(|l| l.starts_with("msg-ack ")).unwrap();
    assert!(msg_ack.contains(" §9.2 "), "{msg_ack}");

    let o = awp(&["--json", "conform", "--list"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 15);
    assert_eq!(v[12]["name"], "chunk");
    assert_eq!(v[12]["needs_cap"], "blob");
    assert_eq!(v[1]["solo"], true);
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec!["conform"],
        vec!["conform", "--scenario", "nope", "tcp:127.0.0.1:1"],
        vec!["conform", "bogus:addr"],
        vec!["conform", "--run", "true", "tcp:127.0.0.1:1"],
        vec!["conform", "--timeout", "soon", "tcp:127.0.0.1:1"],
    ] {
        let o = awp(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn unreachable_peer_fails_every_scenario() {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = awp(&[
        "--json",
        "conform",
        "--scenario",
        "ping,bye",
        &format!("tcp:127.0.0.1:{port}"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["failed"], 2);
    assert!(v["results"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("connect"));
}

/// A check stricter than the reference runner (here: the bye reply's `re`) is a warning,
/// never a failure: a peer that passes the reference passes ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bye_reply_without_re_passes_with_a_warning() {
    let addr = fake_peer(Fault::ByeWithoutRe).await;
    let o = awp_async(vec![
        "--json".into(),
        "conform".into(),
        "--scenario".into(),
        "bye".into(),
        addr,
    ])
    .await;
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(o.status.code(), Some(0), "{v:#}");
    assert_eq!(v["results"][0]["status"], "pass", "{v:#}");
    assert_eq!(v["failed"], 0);
    let warnings = v["warnings"].as_array().expect("a warnings list");
    assert_eq!(warnings.len(), 1, "{v:#}");
    assert_eq!(warnings[0]["name"], "bye");
    assert!(
        warnings[0]["what"].as_str().unwrap().contains("re"),
        "{v:#}"
    );
    // The text report shows it as a warning, not as a failure.
    let o = awp_async(vec![
        "conform".into(),
        "--scenario".into(),
        "bye".into(),
        fake_peer(Fault::ByeWithoutRe).await,
    ])
    .await;
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("warn"), "{text}");
    assert!(text.contains("1 passed, 0 failed, 0 skipped"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_shape() {
    let (_home, handle, addrs) = three_binding_node().await;
    let o = awp_async(vec![
        "--json".into(),
        "conform".into(),
        "--scenario".into(),
        "ping,msg-ack".into(),
        "--scenario".into(),
        "chunk".into(),
        addrs[1].clone(),
    ])
    .await;
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let chunk_skipped = !CAPS.contains(&"blob");
    assert_eq!(v["passed"], if chunk_skipped { 2 } else { 3 });
    assert_eq!(v["failed"], 0);
    assert_eq!(v["skipped"], if chunk_skipped { 1 } else { 0 });
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["ping", "msg-ack", "chunk"],
        "run order, not argument order"
    );
    // The reference runner's report shape (extra fields allowed).
    assert_eq!(v["mode"], "connect");
    assert_eq!(v["addr"], addrs[1].as_str());
    assert!(v["duration"].is_u64() && v["duration"].as_u64().unwrap() > 0);
    let peer = &v["peer"];
    assert!(peer["key"].as_str().unwrap().starts_with("ed25519:"));
    assert_eq!(peer["v"], 0);
    assert!(peer["caps"].is_array());
    assert!(peer.get("name").is_some() && peer.get("about").is_some());
    for r in results {
        for k in [
            "name", "section", "doc", "status", "reason", "checks", "lines",
        ] {
            assert!(r.get(k).is_some(), "result lacks {k}: {r}");
        }
        assert!(r["doc"].as_str().is_some_and(|d| !d.is_empty()));
        assert!(["pass", "fail", "skip"].contains(&r["status"].as_str().unwrap()));
        for c in r["checks"].as_array().unwrap() {
            assert!(c["what"].is_string() && c["ok"].is_boolean() && c["detail"].is_string());
        }
    }
    // The ping scenario's transcript: our ping, then the peer's pong.
    let lines: Vec<&str> = results[0]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("> ") && l.contains(r#""t":"ping""#)),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("< ") && l.contains(r#""t":"pong""#)),
        "{lines:?}"
    );
    assert_eq!(results[0]["section"], "9.4");
    assert_eq!(results[0]["status"], "pass");
    assert!(results[0]["reason"].is_null());
    assert!(!results[1]["checks"].as_array().unwrap().is_empty());
    if chunk_skipped {
        assert_eq!(results[2]["status"], "skip");
        assert!(results[2]["checks"].as_array().unwrap().is_empty());
        assert!(results[2]["reason"].as_str().unwrap().contains("`blob`"));
    }
    stop(handle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_mode_runs_shared_scenarios_on_one_inbound_connection() {
    let (home, handle, _addrs) = three_binding_node().await;
    // `--run` asks our node (through its control socket) to dial the runner.
    let run = format!(
        "'{}' --home '{}' connect {{addr}}",
        env!("CARGO_BIN_EXE_awp"),
        home.path().display()
    );
    let o = awp_async(vec![
        "conform".into(),
        "--listen".into(),
        "tls:127.0.0.1:0".into(),
        "--run".into(),
        run,
    ])
    .await;
    let text = stdout(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{text}\n{stderr}");
    assert!(stderr.contains("listening on tls:127.0.0.1:"), "{stderr}");
    assert!(stderr.contains("#ed25519:"), "{stderr}");
    let solo: Vec<&str> = SCENARIOS
        .iter()
        .filter(|s| s.solo)
        .map(|s| s.name)
        .collect();
    assert_eq!(
        solo,
        ["version", "auth-bad-sig", "bad-frame", "too-large", "bye"]
    );
    let skipped = solo.len() + expected_skips().len();
    assert_eq!(
        text.lines().last(),
        Some(format!("{} passed, 0 failed, {skipped} skipped", 15 - skipped).as_str()),
        "{text}"
    );
    assert!(text.contains("--listen accepts one"), "{text}");
    stop(handle).await;
}

#[tokio::test]
async fn chunk_and_grant_run_against_a_peer_with_the_caps() {
    let addr = fake_peer(Fault::Capable).await;
    let report = conform::run_connect(
        &addr.parse().unwrap(),
        &quick(&["handshake", "msg-ack", "chunk", "grant"]),
    )
    .await
    .unwrap();
    for r in &report.results {
        assert_eq!(r.status, Status::Pass, "{r:#?}");
    }
    assert_eq!(report.summary(), "4 passed, 0 failed, 0 skipped");
}

/// A peer that echoes every line back: its hello carries the runner's own key.
async fn echo_peer() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp:{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = sock.into_split();
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), tokio::io::copy(&mut r, &mut w))
                        .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_echoing_peer_fails_the_handshake_as_reflection() {
    let addr = echo_peer().await;
    let report = conform::run_connect(&addr.parse().unwrap(), &quick(&["handshake"]))
        .await
        .unwrap();
    let h = report.get("handshake").unwrap();
    assert_eq!(h.status, Status::Fail, "{report:#?}");
    assert!(!report.success());
}
