//! Security regressions for served requests (exec, fs:read, fs:write) between nodes over
//! TLS: FIFOs, hard links, outbox amplification, per-peer limits, the exec environment,
//! the Landlock sandbox and the modes of files in the home. The path race (a directory
//! swapped with a symlink) is a unit test beside the code (`node::served_fs`).

mod common;

use awp_node::control::Request;
use awp_node::node::{NodeConfig, NodeHandle};
use awp_node::wire::{self, DataPart, Line, Part};
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;
use tokio::sync::broadcast;

const READ: &str = "application/vnd.awp.fs-read+json";
const WRITE: &str = "application/vnd.awp.fs-write+json";
const EXEC: &str = "application/vnd.awp.exec+json";

/// A node serving exec, fs:read and fs:write beneath `root`, in `home`, with `config`
/// written to its config.toml first, and `tweak` applied to its config.
async fn serving_in(
    home: TempDir,
    root: &Path,
    config: &str,
    tweak: impl FnOnce(&mut NodeConfig),
) -> TestNode {
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    let mut cfg = NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("server@test".into()),
        serve: vec!["exec".into(), "fs:read".into(), "fs:write".into()],
        root: Some(root.to_path_buf()),
        ..Default::default()
    };
    tweak(&mut cfg);
    let handle = NodeHandle::start(cfg).await.expect("node starts");
    TestNode { home, handle }
}

/// A server beneath `root` and a connected client holding every served cap.
async fn pair(root: &Path, tweak: impl FnOnce(&mut NodeConfig)) -> (TestNode, TestNode) {
    let server = serving_in(TempDir::new().unwrap(), root, "", tweak).await;
    let client = TestNode::start("client@test").await;
    grant(&server, &client.key()).await;
    client.connect(&server).await;
    (server, client)
}

async fn grant(server: &TestNode, peer: &str) {
    let g = server
        .ctl(Request::Grant {
            peer: peer.to_string(),
            caps: vec!["exec".into(), "fs:read".into(), "fs:write".into()],
            ttl_s: 3600,
            aud: None,
        })
        .await;
    assert!(g.ok, "{:?}", g.error);
}

/// Send a request from `from` to `to`; returns its msg id once acked.
async fn request(from: &TestNode, to: &str, mime: &str, data: Value) -> String {
    let r = from
        .ctl(Request::Send {
            peer: Some(to.to_string()),
            th: None,
            subject: Some("request".into()),
            re: None,
            parts: vec![json!({"k": "data", "mime": mime, "data": data})],
            wait_ack_ms: Some(10_000),
            files: vec![],
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.body["status"], "delivered", "the request itself is acked");
    r.body["id"].as_str().unwrap().into()
}

/// The answer to request `id`: `{"result": <data of the result part>}` or
/// `{"err": <code>, "detail": …}`; panics after `secs` seconds without one.
async fn answer(
    client: &TestNode,
    events: &mut broadcast::Receiver<awp_node::control::Event>,
    id: &str,
    secs: u64,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        while let Ok(ev) = events.try_recv() {
            if ev.get("event").and_then(Value::as_str) == Some("peer_err")
                && ev.get("re").and_then(Value::as_str) == Some(id)
            {
                return json!({"err": ev["code"], "detail": ev["detail"]});
            }
        }
        if let Some(e) = client
            .inbound()
            .await
            .into_iter()
            .find(|e| e["line"]["re"] == id)
        {
            return json!({"result": e["line"]["parts"][0]["data"]});
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer to {id} within {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Ask and wait for the answer.
async fn ask(server: &TestNode, client: &TestNode, mime: &str, data: Value) -> Value {
    let mut events = client.handle.subscribe();
    let id = request(client, &server.key(), mime, data).await;
    answer(client, &mut events, &id, 10).await
}

/// Opens each FIFO for writing when dropped, so a reader stuck in open(2) (the old
/// behaviour) is released and the test fails instead of hanging.
struct ReleaseFifos(Vec<std::path::PathBuf>);

impl Drop for ReleaseFifos {
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        for p in &self.0 {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(p);
        }
    }
}

/// Issue §4: fs:read of a FIFO inside the root used to block a worker forever.
#[tokio::test]
async fn a_fifo_in_the_root_is_refused_at_once() {
    let root = TempDir::new().unwrap();
    let fifos: Vec<_> = (0..3).map(|i| root.path().join(format!("p{i}"))).collect();
    for f in &fifos {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }
    let _release = ReleaseFifos(fifos.clone());
    std::fs::write(root.path().join("ok.txt"), "fine").unwrap();
    let (server, client) = pair(root.path(), |_| {}).await;
    for i in 0..3 {
        let a = ask(&server, &client, READ, json!({"path": format!("p{i}")})).await;
        assert_eq!(a["result"]["error"], "not a regular file", "{a}");
        // Writing to it (append) is refused too, without waiting for a reader.
        let a = ask(
            &server,
            &client,
            WRITE,
            json!({"path": format!("p{i}"), "content": "x", "append": true}),
        )
        .await;
        assert!(a["result"]["error"].is_string(), "{a}");
    }
    let a = ask(&server, &client, READ, json!({"path": "ok.txt"})).await;
    assert_eq!(a["result"]["content"], "fine");
    // The node still stops promptly.
    server.handle.shutdown();
    tokio::time::timeout(Duration::from_secs(10), server.handle.stopped())
        .await
        .expect("the node stops");
}

/// Issue §5: a hard link inside the root to a file outside it.
#[tokio::test]
async fn hard_links_to_outside_files_are_not_read_or_rewritten() {
    struct Row {
        allow: bool,
        read_ok: bool,
    }
    let table = [
        Row {
            allow: false,
            read_ok: false,
        },
        Row {
            allow: true,
            read_ok: true,
        },
    ];
    for row in table {
        let root = TempDir::new().unwrap();
        let outside = TempDir::new().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "outside secret").unwrap();
        std::fs::hard_link(&secret, root.path().join("link")).unwrap();
        let (server, client) = pair(root.path(), |c| c.allow_hardlinks = row.allow).await;
        let a = ask(&server, &client, READ, json!({"path": "link"})).await;
        if row.read_ok {
            assert_eq!(a["result"]["content"], "outside secret", "{a}");
        } else {
            assert!(a["result"]["error"].is_string(), "{a}");
            assert!(a["result"].get("content").is_none(), "{a}");
        }
        // A write replaces the name inside the root; the outside file is untouched.
        let a = ask(
            &server,
            &client,
            WRITE,
            json!({"path": "link", "content": "replaced"}),
        )
        .await;
        assert_eq!(a["result"]["written"], 8, "{a}");
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "outside secret");
        assert_eq!(
            std::fs::read_to_string(root.path().join("link")).unwrap(),
            "replaced"
        );
        // Append to a file that has another link is refused unless allowed.
        std::fs::hard_link(&secret, root.path().join("link2")).unwrap();
        let a = ask(
            &server,
            &client,
            WRITE,
            json!({"path": "link2", "content": "+", "append": true}),
        )
        .await;
        let appended = std::fs::read_to_string(&secret).unwrap() == "outside secret+";
        assert_eq!(appended, row.allow, "{a}");
        server.stop().await;
    }
}

/// A raw peer (never acks) holding the served caps.
async fn raw_peer(server: &TestNode, seed: u8) -> Raw {
    let mut raw = Raw::dial(&server.address(), seed).await;
    grant(server, &raw.identity.key().to_string()).await;
    raw.handshake().await;
    let resume = Line::Resume(wire::Resume {
        id: "01K00000000000000000000002".into(),
        ts: wire::time::format_ms(wire::time::now_ms()),
        seen: Default::default(),
    });
    raw.write(&resume.encode()).await;
    raw
}

fn raw_request(n: u32, mime: &str, data: Value) -> (String, Vec<u8>) {
    let id = format!("01KA{n:022}");
    let line = Line::Msg(wire::Msg {
        id: id.clone(),
        ts: wire::time::format_ms(wire::time::now_ms()),
        th: "01KB0000000000000000000000".into(),
        re: None,
        subject: None,
        parts: vec![Part::Data(DataPart {
            data,
            mime: Some(mime.into()),
        })],
    });
    (id, line.encode())
}

/// Read lines until the answer to `id` (a result msg or an err); returns (kind, code or
/// the result's data as JSON text, base64 chunk bytes seen meanwhile).
async fn raw_answer(raw: &mut Raw, id: &str) -> (String, String, usize) {
    let mut chunk_bytes = 0;
    loop {
        let line = raw
            .read_line()
            .await
            .expect("an answer before EOF or timeout");
        match line {
            Line::Chunk(c) => chunk_bytes += c.data.len(),
            Line::Msg(m) if m.re.as_deref() == Some(id) => {
                let data = match &m.parts[0] {
                    Part::Data(d) => d.data.to_string(),
                    _ => String::new(),
                };
                return ("msg".into(), data, chunk_bytes);
            }
            Line::Err(e) if e.re.as_deref() == Some(id) => {
                return ("err".into(), e.code, chunk_bytes)
            }
            _ => {}
        }
    }
}

/// Issue §6: results for a peer that never acks stop at its outbox quota (`err busy`).
#[tokio::test]
async fn a_peer_that_never_acks_gets_err_busy_at_its_outbox_quota() {
    const QUOTA: usize = 3 * 1024 * 1024;
    let root = TempDir::new().unwrap();
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.path().join("big.bin"), &data).unwrap();
    let server = serving_in(
        TempDir::new().unwrap(),
        root.path(),
        &format!("outbox_quota_bytes = {QUOTA}\n"),
        |_| {},
    )
    .await;
    let mut raw = raw_peer(&server, 41).await;
    let (mut results, mut busy, mut received) = (0, 0, 0);
    for n in 0..6 {
        let (id, line) = raw_request(n, READ, json!({"path": "big.bin", "length": 1 << 20}));
        raw.write(&line).await;
        let (kind, code, bytes) = raw_answer(&mut raw, &id).await;
        received += bytes;
        match (kind.as_str(), code.as_str()) {
            ("msg", _) => results += 1,
            ("err", "busy") => busy += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    eprintln!("quota {QUOTA}: {results} results, {busy} busy, {received} base64 bytes of chunks");
    assert!(results >= 1, "results up to the quota are served");
    assert!(busy >= 1, "then err busy ({results} results)");
    assert!(
        received <= QUOTA,
        "{received} bytes queued over a {QUOTA} quota"
    );
    let log = std::fs::read_to_string(server.path().join("served.log")).unwrap();
    assert_eq!(log.matches("\"busy\"").count(), busy, "{log}");
    // An exec did run: its result comes without the output blob that would not fit.
    let (id, line) = raw_request(
        100,
        EXEC,
        json!({"cmd": "head -c 3000000 /dev/zero | tr '\\0' a"}),
    );
    raw.write(&line).await;
    let (kind, data, bytes) = raw_answer(&mut raw, &id).await;
    assert_eq!(kind, "msg", "{data}");
    let data: Value = serde_json::from_str(&data).unwrap();
    assert!(data["output_dropped"].is_string(), "{data}");
    assert!(data["stdout_blob"].is_null(), "{data}");
    assert_eq!(data["exit"], 0, "{data}");
    assert_eq!(bytes, 0);
}

/// Issue §6: at most four requests of one peer run at once; more get `err busy`.
#[tokio::test]
async fn requests_beyond_four_running_and_four_queued_get_err_busy() {
    let root = TempDir::new().unwrap();
    let server = serving_in(TempDir::new().unwrap(), root.path(), "", |_| {}).await;
    let mut raw = raw_peer(&server, 42).await;
    let mut ids = Vec::new();
    for n in 0..12 {
        let (id, line) = raw_request(n, EXEC, json!({"cmd": "sleep 1", "timeout_ms": 20000}));
        raw.write(&line).await;
        ids.push(id);
    }
    let (mut results, mut busy) = (0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while results + busy < ids.len() && tokio::time::Instant::now() < deadline {
        match raw.read_line().await {
            Some(Line::Msg(m)) if m.re.as_ref().is_some_and(|r| ids.contains(r)) => results += 1,
            Some(Line::Err(e)) if e.re.as_ref().is_some_and(|r| ids.contains(r)) => {
                assert_eq!(e.code, "busy");
                busy += 1;
            }
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(results + busy, 12, "every request is answered");
    assert!(
        results >= 8,
        "four run and four wait their turn ({results})"
    );
    assert!(
        busy >= 1,
        "the rest are refused while eight are in ({busy})"
    );
}

/// Issue §15: exec does not see the node's environment (AWP_HOME and the rest).
#[tokio::test]
async fn exec_gets_a_clean_environment() {
    // SAFETY of the test: only this test reads the variable.
    std::env::set_var("AWP_TEST_NODE_SECRET", "do-not-leak");
    let root = TempDir::new().unwrap();
    let (server, client) = pair(root.path(), |_| {}).await;
    let a = ask(&server, &client, EXEC, json!({"cmd": ["env"]})).await;
    let out = a["result"]["stdout"].as_str().expect("stdout").to_string();
    assert!(!out.contains("do-not-leak"), "{out}");
    assert!(!out.contains("AWP_"), "{out}");
    let canon = root.path().canonicalize().unwrap();
    assert!(
        out.contains(&format!("HOME={}\n", canon.display())),
        "{out}"
    );
    assert!(out.contains("PATH=/usr/local/bin:/usr/bin:/bin\n"), "{out}");
}

/// Issue §15: with `--sandbox`, exec and fs reach the root and read-only system paths,
/// not the node's home (its private key).
#[tokio::test]
async fn the_sandbox_keeps_exec_out_of_the_home() {
    let probe = awp_node::node::workers::Sandbox::new(Path::new("/"));
    if let Err(e) = probe.probe() {
        eprintln!("skipped: Landlock is not enforced here ({e})");
        return;
    }
    let root = TempDir::new().unwrap();
    std::fs::write(root.path().join("in.txt"), "inside").unwrap();
    let (server, client) = pair(root.path(), |c| c.sandbox = true).await;
    let key = server.path().join("identity.json");
    let a = ask(
        &server,
        &client,
        EXEC,
        json!({"cmd": ["cat", key.display().to_string()]}),
    )
    .await;
    assert_ne!(a["result"]["exit"], 0, "{a}");
    assert!(
        !a["result"]["stdout"].as_str().unwrap().contains("seed"),
        "{a}"
    );
    let a = ask(
        &server,
        &client,
        EXEC,
        json!({"cmd": "cat in.txt; ls /usr/bin >/dev/null"}),
    )
    .await;
    assert_eq!(a["result"]["exit"], 0, "{a}");
    assert_eq!(a["result"]["stdout"], "inside");
    let a = ask(&server, &client, READ, json!({"path": "in.txt"})).await;
    assert_eq!(a["result"]["content"], "inside");
    let a = ask(
        &server,
        &client,
        WRITE,
        json!({"path": "new.txt", "content": "w"}),
    )
    .await;
    assert_eq!(a["result"]["written"], 1, "{a}");
}

/// Issue §13: every file and directory the node creates in its home is private, even
/// under umask 000 (sled's own files sit in the 0700 `db` directory).
#[tokio::test]
async fn home_files_are_private_under_umask_000() {
    // SAFETY: umask(2) cannot fail; the old mask is restored below.
    let old = unsafe { libc::umask(0) };
    let base = TempDir::new().unwrap();
    let home = base.path().join("home");
    let root = TempDir::new().unwrap();
    let server = {
        let handle = NodeHandle::start(NodeConfig {
            home: home.clone(),
            listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
            serve: vec!["exec".into()],
            root: Some(root.path().to_path_buf()),
            ..Default::default()
        })
        .await
        .expect("node starts");
        TestNode {
            home: TempDir::new().unwrap(),
            handle,
        }
    };
    let client = TestNode::start("client@test").await;
    let r = client
        .ctl(Request::Connect {
            address: server.address(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let g = ctl(
        &home,
        Request::Grant {
            peer: client.key(),
            caps: vec!["exec".into()],
            ttl_s: 3600,
            aud: None,
        },
    )
    .await;
    assert!(g.ok);
    // A served request (served.log) and a received blob (blobs/<peer>/<name>).
    let mut events = client.handle.subscribe();
    let id = request(&client, &server.key(), EXEC, json!({"cmd": "echo hi"})).await;
    let a = answer(&client, &mut events, &id, 10).await;
    assert_eq!(a["result"]["stdout"], "hi\n", "{a}");
    let file = base.path().join("f.txt");
    std::fs::write(&file, "blob").unwrap();
    let s = client
        .ctl(Request::Send {
            peer: Some(server.key()),
            th: None,
            subject: None,
            re: None,
            parts: vec![],
            wait_ack_ms: Some(10_000),
            files: vec![file.display().to_string()],
        })
        .await;
    assert!(s.ok, "{:?}", s.error);
    eventually(10, || async { home.join("blobs").exists().then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.handle.shutdown();
    server.handle.stopped().await;
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let mut open = Vec::new();
    let mut seen = 0;
    let mut stack = vec![home.clone()];
    while let Some(p) = stack.pop() {
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::symlink_metadata(&p).unwrap();
        seen += 1;
        if m.permissions().mode() & 0o077 != 0 {
            open.push(format!(
                "{} {:o}",
                p.display(),
                m.permissions().mode() & 0o777
            ));
        }
        if m.is_dir() && p != home.join("db") {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    assert!(home.join("served.log").exists());
    assert!(seen >= 6, "{seen}");
    assert!(open.is_empty(), "open to other users: {open:?}");
}
