//! Issue 14: `awp up` and `awp address` list a relay-circuit address only while the
//! standing connection to that relay (`--via`) is up, as presence does; a via that is down
//! is named on stderr, one line, and left out of the addresses (`--json` too).

mod common;

use awp_node::control::Request;
use awp_node::identity::Identity;
use awp_node::node::{NodeConfig, NodeHandle};
use common::{awp_cli as awp, ctl, eventually, free_port, stderr_text, stdout_text};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// Stops the node of a home when the test ends, pass or fail.
struct Down(PathBuf);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = std::process::Command::new(env!("CARGO_BIN_EXE_awp"))
            .arg("--home")
            .arg(&self.0)
            .arg("down")
            .env_remove("RUST_LOG")
            .env_remove("AWP_HOME")
            .output();
    }
}

async fn json(home: &Path, args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let o = awp(home, &a).await;
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr_text(&o));
    serde_json::from_str(stdout_text(&o).trim()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// Stderr lines that name `via`.
fn lines_naming(text: &str, via: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(via))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_via_that_is_down_is_named_on_stderr_and_its_circuit_left_out() {
    let relay_home = TempDir::new().unwrap();
    let relay = NodeHandle::start(NodeConfig {
        home: relay_home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("relay@test".into()),
        relay: true,
        ..Default::default()
    })
    .await
    .expect("relay starts");
    let live = relay.listening_event()["address"]
        .as_str()
        .unwrap()
        .to_string();
    // A closed port on 127.0.0.1 (free a moment ago), pinned to some key.
    let dead_key = Identity::from_seed(&[5; 32]).key();
    let dead = format!("tls:127.0.0.1:{}#{dead_key}", free_port());
    let (live_circuit, dead_circuit) = (format!("relay:{live}/"), format!("relay:{dead}/"));

    let home = TempDir::new().unwrap();
    let _down = Down(home.path().to_path_buf());
    let up = [
        "up",
        "--listen",
        "tls:127.0.0.1:0",
        "--via",
        &live,
        "--via",
        &dead,
    ];
    let o = awp(home.path(), &up).await;
    let (out, err) = (stdout_text(&o), stderr_text(&o));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains(&live_circuit), "the live via's circuit: {out}");
    assert!(
        !out.contains(&dead_circuit),
        "the dead via's circuit: {out}"
    );
    let named = lines_naming(&err, &dead);
    assert_eq!(named.len(), 1, "{err}");
    assert!(named[0].contains("is down"), "{err}");
    assert!(lines_naming(&err, &live).is_empty(), "{err}");

    // `awp address`: the same, one address a line.
    let o = awp(home.path(), &["address"]).await;
    let (out, err) = (stdout_text(&o), stderr_text(&o));
    assert_eq!(o.status.code(), Some(0), "{err}");
    let circuits: Vec<&str> = out.lines().filter(|l| l.starts_with("relay:")).collect();
    assert_eq!(circuits.len(), 1, "{out}");
    assert!(circuits[0].starts_with(&live_circuit), "{out}");
    assert_eq!(lines_naming(&err, &dead).len(), 1, "{err}");

    // `--json`: left out of `addresses`; `via` says which is up, and why the other is not.
    for args in [&["address"][..], &up[..]] {
        let body = json(home.path(), args).await;
        let addresses = strings(&body["addresses"]);
        assert!(
            addresses.iter().any(|a| a.starts_with(&live_circuit)),
            "{body}"
        );
        assert!(
            !addresses.iter().any(|a| a.starts_with(&dead_circuit)),
            "{body}"
        );
        let via = body["via"].as_array().unwrap();
        assert_eq!(via.len(), 2, "{body}");
        assert_eq!(
            (via[0]["relay"].as_str(), via[0]["up"].as_bool()),
            (Some(live.as_str()), Some(true))
        );
        assert_eq!(
            (via[1]["relay"].as_str(), via[1]["up"].as_bool()),
            (Some(dead.as_str()), Some(false))
        );
        assert!(via[1]["error"].is_string(), "{body}");
    }

    // The relay stops: its circuit leaves the addresses too.
    relay.shutdown();
    let body = eventually(10, || async {
        let r = ctl(home.path(), Request::Address).await;
        assert!(r.ok, "{:?}", r.error);
        let body = Value::Object(r.body);
        (!strings(&body["addresses"])
            .iter()
            .any(|a| a.starts_with("relay:")))
        .then_some(body)
    })
    .await;
    assert_eq!(body["via"][0]["up"], Value::Bool(false), "{body}");
    let o = awp(home.path(), &["address"]).await;
    let err = stderr_text(&o);
    assert_eq!(lines_naming(&err, &live).len(), 1, "{err}");
    assert_eq!(lines_naming(&err, &dead).len(), 1, "{err}");
}
