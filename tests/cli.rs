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
