//! End-to-end: the built `awp` binary driving two nodes in two temp homes over TLS on
//! 127.0.0.1 (background start, connect, send, tail, state, read, wait, threads, peers,
//! status, down).

use awp_node::identity::Identity;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use tempfile::TempDir;

fn awp(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run awp")
}

fn ok(home: &Path, args: &[&str]) -> String {
    let o = awp(home, args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "awp {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn json(home: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = ok(home, &a);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

fn json_lines(home: &Path, args: &[&str]) -> Vec<Value> {
    let mut a = args.to_vec();
    a.push("--json");
    ok(home, &a)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Stops the node of a home when the test ends, pass or fail.
struct Down<'a>(&'a Path);
impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = awp(self.0, &["down"]);
    }
}

/// A seed whose key's base64 starts with `-`, so its prefix looks like a flag.
fn hyphen_identity() -> Identity {
    (0u8..=255)
        .map(|n| Identity::from_seed(&[n; 32]))
        .find(|id| id.key().to_string().starts_with("ed25519:-"))
        .expect("one of 256 seeds gives a key starting with '-'")
}

#[test]
fn two_homes_hold_a_thread_through_the_cli() {
    let (ha, hb) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let (a, b) = (ha.path(), hb.path());
    // Bob's key starts with '-': peer prefixes like "-Abc" must still work.
    hyphen_identity().write_file(b).unwrap();
    let _down = (Down(a), Down(b));

    let up = json(
        a,
        &["up", "--listen", "tls:127.0.0.1:0", "--name", "alice@e2e"],
    );
    assert!(up["key"].as_str().unwrap().starts_with("ed25519:"));
    json(
        b,
        &["up", "--listen", "tls:127.0.0.1:0", "--name", "bob@e2e"],
    );
    // A second start on the same home reports the running node instead of starting one.
    let again = awp(a, &["up", "--listen", "tls:127.0.0.1:0"]);
    assert_eq!(again.status.code(), Some(0));

    let b_addr = ok(b, &["address"]).lines().next().unwrap().to_string();
    assert!(b_addr.starts_with("tls:127.0.0.1:") && b_addr.contains("#ed25519:-"));
    let c = json(a, &["connect", &b_addr]);
    let b_key = c["peer"].as_str().unwrap().to_string();
    let prefix = &b_key["ed25519:".len().."ed25519:".len() + 6];
    assert!(prefix.starts_with('-'));

    // Send by hyphen-leading key prefix, with data and a code file.
    let code = ha.path().join("fix.py");
    std::fs::write(&code, "print('hi')\n").unwrap();
    let sent = json(
        a,
        &[
            "send",
            prefix,
            "Run the suite on main",
            "-s",
            "CI run",
            "--data",
            r#"{"commit":"a1b2c3"}"#,
            "--code",
            code.to_str().unwrap(),
            "--wait-ack",
            "10s",
        ],
    );
    assert_eq!(sent["status"], "delivered");
    let th = sent["th"].as_str().unwrap().to_string();

    // Bob sees it, with every part.
    let log = json_lines(b, &["tail", "--once"]);
    let msg = log
        .iter()
        .find(|e| e["t"] == "msg")
        .expect("msg in bob's log");
    assert_eq!(msg["dir"], "in");
    assert_eq!(msg["th"], th.as_str());
    let parts = msg["line"]["parts"].as_array().unwrap();
    assert_eq!(parts[0]["text"], "Run the suite on main");
    assert!(parts
        .iter()
        .any(|p| p["k"] == "data" && p["data"]["commit"] == "a1b2c3"));
    assert!(parts
        .iter()
        .any(|p| p["k"] == "code" && p["text"] == "print('hi')\n" && p["lang"] == "python"));

    // wait --no-mark returns for the unread line and leaves it; read marks it; a second
    // read is empty. (A plain `wait` marks the line it reports: see usability_events.)
    ok(b, &["wait", "-t", &th, "--timeout", "5s", "--no-mark"]);
    let read = json_lines(b, &["read", &th]);
    assert_eq!(read.len(), 1);
    assert!(json_lines(b, &["read", &th]).is_empty());

    // Bob replies in the thread (peer implied) and updates his state.
    let s = json(
        b,
        &[
            "state",
            &th,
            "working",
            "-n",
            "running",
            "--wait-ack",
            "10s",
        ],
    );
    assert_eq!(s["status"], "delivered");
    let r = json(b, &["send", "-t", &th, "3 failing", "--wait-ack", "10s"]);
    assert_eq!(r["status"], "delivered");
    ok(
        b,
        &[
            "state",
            "alice@e2e",
            &th,
            "done",
            "-n",
            "all green",
            "--wait-ack",
            "10s",
        ],
    );

    // Alice: the thread shows bob's state; wait --state done returns at once.
    let threads = json_lines(a, &["threads"]);
    let t = threads.iter().find(|t| t["th"] == th.as_str()).unwrap();
    assert_eq!(t["theirs"], "done");
    assert_eq!(t["their_note"], "all green");
    assert_eq!(t["subject"], "CI run");
    ok(
        a,
        &[
            "wait",
            "-t",
            &th,
            "--state",
            "done,failed",
            "--timeout",
            "5s",
        ],
    );
    let peers = json_lines(a, &["peers"]);
    assert_eq!(peers[0]["key"], b_key.as_str());
    assert_eq!(peers[0]["name"], "bob@e2e");
    assert_eq!(peers[0]["connected"], true);

    // Stdin text.
    let mut child = Command::new(env!("CARGO_BIN_EXE_awp"))
        .arg("--home")
        .arg(a)
        .args(["send", "-t", &th, "-", "--wait-ack", "10s"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("delivered"));
    let log = json_lines(b, &["tail", "--once", "-t", &th]);
    assert!(log.iter().any(|e| e["line"]["parts"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("from stdin"))));

    // Unknown peer: exit 2, one line, nothing queued.
    let o = awp(a, &["send", "nobody", "x"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    assert_eq!(json(a, &["status"])["outbox"], 0);

    // down stops the node; status then exits 3.
    ok(a, &["down"]);
    assert_eq!(awp(a, &["status"]).status.code(), Some(3));
}

#[test]
fn a_second_node_on_one_home_names_the_holder() {
    let h = TempDir::new().unwrap();
    let _down = Down(h.path());
    let up = json(h.path(), &["up", "--listen", "tls:127.0.0.1:0"]);
    let pid = json(h.path(), &["status"])["pid"].as_u64().unwrap();
    assert!(up["key"].is_string());
    let o = awp(h.path(), &["daemon", "--listen", "tls:127.0.0.1:0"]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&pid.to_string()),
        "should name pid {pid}: {err}"
    );
}

/// `awp up --artifactr` prints where the endpoint listens and where its token is; `--json`
/// carries it as `artifactr` (null when the endpoint is off).
#[test]
fn up_prints_the_artifactr_endpoint() {
    let (ha, hb) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let _down = (Down(ha.path()), Down(hb.path()));
    let text = ok(
        ha.path(),
        &[
            "up",
            "--listen",
            "tls:127.0.0.1:0",
            "--artifactr",
            "127.0.0.1:0",
        ],
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("artifactr"))
        .unwrap_or_else(|| panic!("no artifactr line: {text}"));
    let addr = json(ha.path(), &["status"])["artifactr"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!addr.ends_with(":0"), "the bound port: {addr}");
    assert!(line.contains(&format!("http://{addr}")), "{line}");
    assert!(line.contains("artifactr.token"), "{line}");
    // Already running: the JSON answer names it too.
    let up = json(ha.path(), &["up"]);
    assert_eq!(up["artifactr"], Value::String(addr));
    // Off: null, and no line.
    let up = json(hb.path(), &["up", "--listen", "tls:127.0.0.1:0"]);
    assert_eq!(up["artifactr"], Value::Null);
}

#[test]
fn whoami_schema_and_version_work_without_a_node() {
    let h = TempDir::new().unwrap();
    let w = json(h.path(), &["whoami"]);
    assert!(w["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
    let schema: Value = serde_json::from_str(&ok(h.path(), &["schema"])).unwrap();
    let checked_in: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/spec/awp.schema.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(schema, checked_in);
    assert!(ok(h.path(), &["version"]).contains(env!("CARGO_PKG_VERSION")));
    assert_eq!(
        awp(h.path(), &["status"]).status.code(),
        Some(3),
        "status never starts a node"
    );
}
