//! What a new user trips on: each case of the usability issue as a test through the `awp`
//! binary (or the control socket) against a node in a temp home.

mod common;

use common::{awp_cli as awp, eventually, stderr_text as stderr, stdout_text as stdout, TestNode};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

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
/// failed with CARGO_TARGET_DIR set; they ask cargo where the binary is instead (`cargo_exe`,
/// or `awp_exe` for the awp binary).
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
            text.contains("cargo_exe ") || text.contains("awp_exe "),
            "scripts/{name} uses neither cargo_exe nor awp_exe"
        );
    }
    // awp_exe is cargo_exe for the awp binary, built with the test build's features.
    let lib = std::fs::read_to_string(dir.join("lib.sh")).unwrap();
    let body = lib
        .split("awp_exe() {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("scripts/lib.sh defines awp_exe");
    assert!(
        body.contains("cargo_exe awp "),
        "awp_exe does not ask cargo_exe: {body}"
    );
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

/// `awp down` on every home given, when dropped (a failed assertion leaves no daemon).
struct Downs(Vec<std::path::PathBuf>);

impl Drop for Downs {
    fn drop(&mut self) {
        for h in &self.0 {
            let _ = std::process::Command::new(env!("CARGO_BIN_EXE_awp"))
                .arg("--home")
                .arg(h)
                .arg("down")
                .env_remove("AWP_HOME")
                .output();
        }
    }
}

/// The one JSON object `awp --json …` printed.
fn json_out(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_str(stdout(o).trim()).expect("one JSON object")
}

/// The port of `tls:HOST:PORT#…`.
fn port_of(address: &str) -> u16 {
    let hostport = address.trim_start_matches("tls:");
    let hostport = hostport.split('#').next().unwrap();
    hostport.rsplit(':').next().unwrap().parse().unwrap()
}

/// #1, end to end as the README runs two homes on one host (`up --listen
/// tls:127.0.0.1:0`): a restart keeps the port (the peer's address stays good); when the
/// port is taken while the node is down, `up` says so, and the peer — told the new
/// address by the node's hello — lists it and `connect NAME` dials it, not the dead one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_never_left_at_a_stale_address() {
    let (a, b) = (
        tempfile::TempDir::new().unwrap(),
        tempfile::TempDir::new().unwrap(),
    );
    let (a, b) = (a.path(), b.path());
    let _downs = Downs(vec![a.to_path_buf(), b.to_path_buf()]);
    let up = |home: &Path, name: &str| {
        let (home, name) = (home.to_path_buf(), name.to_string());
        async move {
            let o = awp(
                &home,
                &[
                    "--json",
                    "up",
                    "--listen",
                    "tls:127.0.0.1:0",
                    "--name",
                    &name,
                ],
            )
            .await;
            (json_out(&o), stderr(&o))
        }
    };
    let (ua, _) = up(a, "alice").await;
    let (ub, _) = up(b, "bob").await;
    let a1 = ua["address"].as_str().unwrap().to_string();
    assert!(ub["address"].is_string());
    let o = awp(b, &["connect", &a1, "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A restart with the same command keeps the address bob holds.
    assert_eq!(awp(a, &["down"]).await.status.code(), Some(0));
    let (ua, err) = up(a, "alice").await;
    assert_eq!(ua["address"].as_str().unwrap(), a1, "{err}");
    assert_eq!(ua["notices"], serde_json::json!([]));
    let o = awp(b, &["--json", "connect", "alice", "--timeout", "10s"]).await;
    assert_eq!(json_out(&o)["address"].as_str().unwrap(), a1);

    // The port is taken while alice is down: she gets another, and says so.
    assert_eq!(awp(a, &["down"]).await.status.code(), Some(0));
    let holder = std::net::TcpListener::bind(("127.0.0.1", port_of(&a1)))
        .expect("alice's old port is free after down");
    let (ua, err) = up(a, "alice").await;
    let a2 = ua["address"].as_str().unwrap().to_string();
    assert_ne!(port_of(&a2), port_of(&a1));
    let said = format!("port {} ", port_of(&a1));
    assert!(
        err.contains(&said) && err.contains("is taken") && err.contains(&port_of(&a2).to_string()),
        "up says the port changed: {err}"
    );
    assert!(ua["notices"][0].as_str().unwrap().contains("is taken"));

    // Alice reaches bob (her hello carries her new address) ...
    let o = awp(a, &["connect", "bob", "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // ... so bob lists it, and dials it first.
    let listed = eventually(10, || {
        let b = b.to_path_buf();
        let a2 = a2.clone();
        async move {
            let ps = peers(&b).await;
            let alice = ps.into_iter().find(|p| p["name"] == "alice")?;
            (alice["address"] == a2.as_str()).then_some(alice)
        }
    })
    .await;
    assert!(listed["addresses_total"].as_u64().unwrap() >= 2, "{listed}");
    // Apart again (a second connection now would meet the first in a tie break).
    let o = awp(a, &["disconnect", "bob"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = awp(b, &["--json", "connect", "alice", "--timeout", "10s"]).await;
    assert_eq!(json_out(&o)["address"].as_str().unwrap(), a2);
    drop(holder);
}

/// #2: a command other than `up` never starts a node: it says so and exits 3, and nothing
/// listens afterwards.
#[tokio::test]
async fn commands_never_start_a_node() {
    let home = tempfile::TempDir::new().unwrap();
    let h = home.path();
    let cases: [&[&str]; 12] = [
        &["connect", "tls:127.0.0.1:1"],
        &["send", "alice", "hi"],
        &["peers"],
        &["threads"],
        &["address"],
        &["read"],
        &["tail", "--once"],
        &["wait", "--timeout", "1s"],
        &["disconnect", "alice"],
        &["grants"],
        &["blobs"],
        &["peers", "forget", "alice"],
    ];
    for args in cases {
        let o = awp(h, args).await;
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
        // The hint names the home: a plain `awp up` would start a node elsewhere.
        assert_eq!(
            error_line(&o),
            format!(
                "awp: no node running; start one with `awp --home {} up`",
                h.display()
            ),
            "{args:?}"
        );
        for f in ["awp.sock", "node.lock", "node.log"] {
            assert!(!h.join(f).exists(), "{args:?} left {f}");
        }
    }
}

/// #16: `awp disconnect PEER --reason TEXT` says bye with the reason and parks the peer:
/// no redial (though it was dialed with `connect`, a lasting reason to redial), until the
/// next `connect`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_says_bye_and_parks_until_the_next_connect() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let mut events = b.handle.subscribe();
    let o = awp(
        &a.path(),
        &["disconnect", "bob", "--reason", "done for today"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with(&format!("disconnected bob@test ({})", b.key())),
        "{}",
        stdout(&o)
    );
    // Bob heard the bye and its reason.
    let down = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let ev = events.recv().await.expect("event stream");
            if ev.get("event").and_then(Value::as_str) == Some("peer_down") {
                return ev;
            }
        }
    })
    .await
    .expect("bob sees alice go");
    assert!(
        down.get("reason")
            .map(|r| r.to_string())
            .unwrap_or_default()
            .contains("done for today"),
        "{down:?}"
    );
    let bob = |ps: Vec<Value>| ps.into_iter().find(|p| p["name"] == "bob@test").unwrap();
    let rec = bob(peers(&a.path()).await);
    assert_eq!(rec["parked"], true, "{rec}");
    assert_eq!(rec["connected"], false, "{rec}");
    // Not redialed: still apart a while later (a dialer redials a `connect`ed peer at once).
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(bob(peers(&a.path()).await)["connected"], false);
    }
    // The next connect unparks it.
    let o = awp(&a.path(), &["connect", "bob", "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rec = bob(peers(&a.path()).await);
    assert_eq!(rec["parked"], false, "{rec}");
    // Disconnecting an unknown peer names the problem.
    let o = awp(&a.path(), &["disconnect", "nosuchpeer"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    a.stop().await;
    b.stop().await;
}

/// #16, from the side that was dialed: after `awp disconnect` of a peer known only from its
/// hello, the next send dials it at once (no wait for the peer to redial, which it will not
/// do after our bye): delivered within the send's wait, far below the 15 s hello grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_after_disconnect_redials_a_peer_that_had_dialed_us() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    // Bob dials Alice: Alice knows Bob's address only from his hello.
    b.connect(&a).await;
    let first = b.send(Some(&a.key()), None, "hi alice").await;
    let th = first["th"].as_str().unwrap().to_string();
    eventually(10, || async {
        (!a.inbound().await.is_empty()).then_some(())
    })
    .await;
    let o = awp(&a.path(), &["disconnect", "bob"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = awp(
        &a.path(),
        &[
            "send",
            "bob",
            "after disconnect",
            "-t",
            &th,
            "--wait-ack",
            "8s",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("delivered"), "{}", stdout(&o));
    a.stop().await;
    b.stop().await;
}

/// #7: a pinned key that is not the peer's says the key differs (and what the peer's is),
/// not "check that the peer's node is up"; a pinned key with its last character changed
/// is "not a valid key (non-canonical encoding)", not "not base64".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_pinned_key_is_named_as_such() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    let other = awp_node::identity::Identity::generate().key();
    let addr = b.address();
    let base = addr.split('#').next().unwrap();
    let o = awp(&a.path(), &["connect", &format!("{base}#{other}")]).await;
    assert_eq!(o.status.code(), Some(1));
    let line = error_line(&o);
    assert!(!line.contains("is up"), "{line}");
    let real = awp_node::wire::PeerKey::parse(&b.key()).unwrap();
    assert!(
        line.contains(&b.key())
            && line.contains(&real.fingerprint())
            && line.contains("awp whoami"),
        "{line}"
    );
    // Last character changed: it carries 4 bits of the key and 2 zero bits; the next
    // character of the alphabet sets one of those zero bits.
    let key = b.key();
    const URL: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let last = URL.find(key.chars().last().unwrap()).unwrap();
    assert_eq!(last % 4, 0, "{key}");
    let bad = format!(
        "{base}#{}{}",
        &key[..key.len() - 1],
        &URL[last + 1..last + 2]
    );
    let line = error_line(&awp(&a.path(), &["connect", &bad]).await);
    assert!(
        line.contains("not a valid key") && line.contains("non-canonical"),
        "{line}"
    );
    assert!(!line.contains("not base64"), "{line}");
    a.stop().await;
    b.stop().await;
}

/// Minor: `awp doctor --fix` prints its report and nothing else (no raw log line on
/// stderr about the file it moved).
#[tokio::test]
async fn doctor_fix_prints_only_its_report() {
    let home = tempfile::TempDir::new().unwrap();
    // A home as a stopped node leaves it: identity and database.
    let node = TestNode::start_in(home, "doc@test").await;
    let home = node.stop().await;
    let db = home.path().join("db");
    let leftover = db.join("snap.00000000FFFFFFFF.generating");
    std::fs::write(&leftover, b"partial snapshot").unwrap();
    let o = awp(home.path(), &["doctor", "--fix"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(!leftover.exists(), "fixed");
    assert!(stdout(&o).contains("quarantine"), "{}", stdout(&o));
    assert_eq!(stderr(&o), "", "only the report");
}

/// Minor: the man page named sub-pages (`awp-up(1)`, …) that nothing generates; it is one
/// page that lists every command (nested ones too) with its usage instead.
#[tokio::test]
async fn the_man_page_names_no_pages_that_do_not_exist() {
    let home = tempfile::TempDir::new().unwrap();
    let o = awp(home.path(), &["man"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(!page.contains("(1)"), "names another page: {page}");
    for usage in [
        r"\fBawp up [OPTIONS]\fR",
        r"\fBawp peers forget [OPTIONS] <PEER>\fR",
        r"\fBawp disconnect [OPTIONS] <PEER>\fR",
    ] {
        assert!(page.contains(usage), "{usage} missing");
    }
}

/// Minor: `awp peers forget` removes the peer's records but not its blobs, artifact
/// threads or grants; the output says what was kept and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_forget_says_what_it_kept_and_why() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let file = a.path().join("notes.txt");
    std::fs::write(&file, b"hello").unwrap();
    let o = awp(&a.path(), &["send", "bob", "-f", file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = awp(&a.path(), &["grant", "bob", "exec"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = awp(&a.path(), &["disconnect", "bob"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = awp(&a.path(), &["peers", "forget", "bob"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let kept = text.lines().nth(1).unwrap_or_default();
    assert!(kept.starts_with("kept: 1 blob records"), "{text}");
    assert!(
        kept.contains("1 grants") && kept.contains("awp revoke"),
        "{text}"
    );
    let o = awp(&a.path(), &["--json", "peers", "forget", &b.key()]).await;
    assert_ne!(o.status.code(), Some(0), "nothing left to forget");
    a.stop().await;
    b.stop().await;
}

/// #1: `awp connect NAME` tries the peer's addresses freshest first and falls back to an
/// older one when the freshest is dead, recording the failure on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_by_name_falls_back_to_an_older_address() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let b1 = b.address();
    // Bob restarts while his port is held: he gets another, and tells alice in his hello.
    let home = b.stop().await;
    let holder = std::net::TcpListener::bind(("127.0.0.1", port_of(&b1))).unwrap();
    let b = TestNode::start_in(home, "bob@test").await;
    let b2 = b.address();
    assert_ne!(b2, b1);
    let o = awp(&b.path(), &["connect", "alice", "--timeout", "10s"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    eventually(10, || {
        let (home, b2) = (a.path(), b2.clone());
        async move {
            let ps = peers(&home).await;
            (ps.iter().any(|p| p["address"] == b2.as_str())).then_some(())
        }
    })
    .await;
    // Bob comes back on his first port: the freshest address alice holds is dead now.
    let home = b.stop().await;
    drop(holder);
    let b = TestNode {
        handle: awp_node::node::NodeHandle::start(awp_node::node::NodeConfig {
            home: home.path().to_path_buf(),
            listen: vec![b1.split('#').next().unwrap().parse().unwrap()],
            name: Some("bob@test".into()),
            ..Default::default()
        })
        .await
        .unwrap(),
        home,
    };
    assert_eq!(b.address(), b1);
    let o = awp(&a.path(), &["--json", "connect", "bob", "--timeout", "10s"]).await;
    assert_eq!(json_out(&o)["address"].as_str().unwrap(), b1);
    let bob = peers(&a.path())
        .await
        .into_iter()
        .find(|p| p["name"] == "bob@test")
        .unwrap();
    let dead = bob["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["address"] == b2.as_str())
        .unwrap()
        .clone();
    assert!(dead["last_err"].is_string(), "{bob}");
    assert_eq!(
        bob["address"],
        b1.as_str(),
        "the one that worked last first"
    );
    a.stop().await;
    b.stop().await;
}
