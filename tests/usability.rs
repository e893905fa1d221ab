//! What a new user trips on: each case of the usability issue as a test through the `awp`
//! binary (or the control socket) against a node in a temp home.

mod common;

use common::{eventually, TestNode};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// Run `awp --home HOME ARGS…` (off the async runtime).
async fn awp(home: &Path, args: &[&str]) -> Output {
    let home = home.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_awp"))
            .arg("--home")
            .arg(&home)
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("AWP_HOME")
            .output()
            .expect("awp runs")
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn peers(home: &Path) -> Vec<Value> {
    let o = awp(home, &["--json", "peers"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object per line"))
        .collect()
}

async fn threads(home: &Path) -> Vec<Value> {
    let o = awp(home, &["--json", "threads"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object per line"))
        .collect()
}

/// #15: a conform run leaves its test peers (named `awp-conform`) and their messages in
/// the node; `awp peers forget KEY` removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conform_peers_are_named_and_can_be_forgotten() {
    let node = TestNode::start("target@test").await;
    let home = node.path();
    let o = awp(
        &home,
        &["conform", "--scenario", "msg-ack,bye", &node.address()],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let left = peers(&home).await;
    assert!(!left.is_empty(), "the run leaves its peers behind");
    for p in &left {
        assert_eq!(p["name"], "awp-conform", "{p}");
    }
    assert!(!threads(&home).await.is_empty(), "and its msg-ack thread");
    for p in &left {
        let key = p["key"].as_str().unwrap().to_string();
        // A session may still be closing: forgetting a connected peer is refused.
        let o = eventually(10, || {
            let (home, key) = (home.clone(), key.clone());
            async move {
                let o = awp(&home, &["peers", "forget", &key]).await;
                (o.status.code() == Some(0)).then_some(o)
            }
        })
        .await;
        assert!(
            stdout(&o).starts_with(&format!("forgot {key}")),
            "{}",
            stdout(&o)
        );
    }
    assert!(peers(&home).await.is_empty());
    assert!(threads(&home).await.is_empty());
    // Forgetting an unknown peer says so.
    let key = left[0]["key"].as_str().unwrap();
    let o = awp(&home, &["peers", "forget", key]).await;
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("nothing is known"), "{}", stderr(&o));
    node.stop().await;
}

/// #17: the scripts that run the binary hard-coded `target/debug` or `target/release` and
/// failed with CARGO_TARGET_DIR set; they ask cargo where the binary is instead.
#[test]
fn scripts_ask_cargo_where_the_binary_is() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
    for name in [
        "demo.sh",
        "conform-self.sh",
        "bench.sh",
        "bench-blob.sh",
        "bench-relay.sh",
        "bench-artifact.sh",
        "bench-disk.sh",
    ] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        for bad in ["target/debug", "target/release"] {
            assert!(!text.contains(bad), "scripts/{name} hard-codes {bad}");
        }
        assert!(
            text.contains("cargo_exe "),
            "scripts/{name} does not use cargo_exe"
        );
    }
}

/// #17: `cargo_exe NAME` (scripts/lib.sh) prints the executable cargo reports for NAME,
/// wherever the target directory is, and fails when cargo built none.
#[test]
fn cargo_exe_prints_the_executable_cargo_reports() {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lib.sh");
    let tmp = tempfile::TempDir::new().unwrap();
    // A stand-in for cargo that prints what `cargo build --message-format=json` prints.
    let fake = tmp.path().join("cargo");
    std::fs::write(
        &fake,
        r#"#!/bin/sh
echo '{"reason":"compiler-artifact","target":{"name":"awp_node","kind":["lib"]},"executable":null,"fresh":true}'
echo '{"reason":"compiler-artifact","target":{"name":"relay_load","kind":["example"]},"executable":"/elsewhere/tgt/release/examples/relay_load","fresh":true}'
echo '{"reason":"compiler-artifact","target":{"name":"awp","kind":["bin"]},"executable":"/elsewhere/tgt/release/awp","fresh":false}'
echo '{"reason":"build-finished","success":true}'
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        tmp.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |name: &str| {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(". '{}'; cargo_exe {name} --release", lib.display()))
            .env("PATH", &path)
            .output()
            .expect("bash runs")
    };
    let o = run("awp");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "/elsewhere/tgt/release/awp\n");
    let o = run("relay_load");
    assert_eq!(stdout(&o), "/elsewhere/tgt/release/examples/relay_load\n");
    let o = run("nope");
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("no executable named nope"),
        "{}",
        stderr(&o)
    );
}

/// #18: shell completions and a man page, generated from the clap definitions.
#[tokio::test]
async fn completions_and_man_page_come_from_the_clap_definitions() {
    let home = tempfile::TempDir::new().unwrap();
    for (shell, marker) in [
        ("bash", "_awp()"),
        ("zsh", "#compdef awp"),
        ("fish", "complete -c awp"),
    ] {
        let o = awp(home.path(), &["completions", shell]).await;
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        assert!(script.contains(marker), "{shell}: {script}");
        // Subcommands and their flags are in it.
        for word in ["conform", "revoke", "scenario"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let o = awp(home.path(), &["completions", "tcsh"]).await;
    assert_eq!(
        o.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    let o = awp(home.path(), &["man"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.contains(".TH awp 1"), "{page}");
    assert!(
        page.contains(".SH SUBCOMMANDS") || page.contains("conform"),
        "{page}"
    );
    // Neither needs (nor starts) a node.
    assert!(!home.path().join("awp.sock").exists());
}

/// #10: `awp revoke PREFIX` accepts a unique prefix of the grant hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_accepts_a_unique_hash_prefix() {
    let node = TestNode::start("issuer@test").await;
    let home = node.path();
    let sub = awp_node::identity::Identity::generate().key().to_string();
    let o = awp(&home, &["--json", "grant", &sub, "exec", "--ttl", "1h"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let hash = v["hash"].as_str().unwrap().to_string();
    let o = awp(&home, &["revoke", &hash[..6]]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), format!("revoked {hash}"));
    node.stop().await;
}

/// The first stderr line of a failed command.
fn error_line(o: &Output) -> String {
    assert_ne!(
        o.status.code(),
        Some(0),
        "expected a failure: {}",
        stdout(o)
    );
    stderr(o).lines().next().unwrap_or_default().to_string()
}

/// #6: not-found, ambiguous-name, revoke, thread and presence errors give one hint each
/// (`awp: WHAT; HINT`), not the node's advice and then the CLI's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_error_gives_one_hint() {
    let node = TestNode::start("hints@test").await;
    let home = node.path();
    // Two peers that call themselves the same name.
    let mut twins = Vec::new();
    for seed in [41u8, 42] {
        let mut raw = common::Raw::dial(&node.address(), seed).await;
        let hello = raw.hello_full(0, "twin@x", None);
        raw.handshake_with(hello).await;
        twins.push(raw);
    }
    eventually(10, || {
        let home = home.clone();
        async move { (peers(&home).await.len() == 2).then_some(()) }
    })
    .await;
    let cases: [&[&str]; 6] = [
        &["send", "nosuchpeer", "hi"],
        &["send", "ab", "hi"],
        &["send", "twin", "hi"],
        &["send", "-t", "thr_nope", "hi"],
        &["revoke", "0000"],
        &["presence", "nobody"],
    ];
    for args in cases {
        let line = error_line(&awp(&home, args).await);
        assert!(line.starts_with("awp: "), "{args:?}: {line}");
        assert_eq!(line.matches("; ").count(), 1, "{args:?}: one hint: {line}");
        // No command is suggested twice.
        let cmds: Vec<&str> = line.split('`').skip(1).step_by(2).collect();
        let mut uniq = cmds.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), cmds.len(), "{args:?}: {line}");
    }
    let line = error_line(&awp(&home, &["send", "twin", "hi"]).await);
    assert!(
        line.contains("matches") && line.contains("give more"),
        "{line}"
    );
    drop(twins);
    node.stop().await;
}
