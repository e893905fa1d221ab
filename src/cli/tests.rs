//! Command line grammar, exit codes and request building.

use super::args::{parse_duration, Cli, Command, SendArgs};
use super::commands::{build_parts, delivery_line, lang_for_path, send_request, wait_matches};
use super::*;
use clap::Parser;
use serde_json::json;
use std::time::Duration;

fn parse_ok(args: &[&str]) -> Cli {
    let mut full = vec!["awp"];
    full.extend_from_slice(args);
    match Cli::try_parse_from(full) {
        Ok(c) => c,
        Err(e) => panic!("{args:?} did not parse: {e}"),
    }
}

fn parse_err(args: &[&str]) -> clap::Error {
    let mut full = vec!["awp"];
    full.extend_from_slice(args);
    Cli::try_parse_from(full).expect_err("should not parse")
}

fn send_args(args: &[&str]) -> SendArgs {
    let mut full = vec!["send"];
    full.extend_from_slice(args);
    match parse_ok(&full).command {
        Command::Send(s) => s,
        other => panic!("not send: {other:?}"),
    }
}

#[test]
fn global_options_anywhere() {
    let c = parse_ok(&["--home", "/h", "threads", "--json"]);
    assert_eq!(c.home.as_deref(), Some(std::path::Path::new("/h")));
    assert!(c.json);
    assert!(matches!(c.command, Command::Threads));
    let c = parse_ok(&["status"]);
    assert!(!c.json);
}

#[test]
fn node_commands_take_listen_options() {
    let c = parse_ok(&[
        "up",
        "--listen",
        "tls:0.0.0.0:7700",
        "--listen",
        "unix:/tmp/a.sock",
        "--name",
        "n",
        "--about",
        "a",
        "--allow-plaintext",
    ]);
    let Command::Up(n) = c.command else { panic!() };
    assert_eq!(n.listen, ["tls:0.0.0.0:7700", "unix:/tmp/a.sock"]);
    assert_eq!(n.name.as_deref(), Some("n"));
    assert_eq!(n.about.as_deref(), Some("a"));
    assert!(n.allow_plaintext);
    let c = parse_ok(&["listen", "--text", "--listen", "tcp:127.0.0.1:0"]);
    let Command::Listen { node, text } = c.command else {
        panic!()
    };
    assert!(text);
    assert_eq!(node.listen, ["tcp:127.0.0.1:0"]);
    let c = parse_ok(&["daemon", "--home", "/x"]);
    assert!(matches!(c.command, Command::Daemon(ref n) if n.listen.is_empty()));
}

#[test]
fn every_simple_command_parses() {
    assert!(matches!(parse_ok(&["down"]).command, Command::Down));
    assert!(matches!(parse_ok(&["address"]).command, Command::Address));
    assert!(matches!(
        parse_ok(&["peers"]).command,
        Command::Peers { action: None }
    ));
    assert!(matches!(parse_ok(&["whoami"]).command, Command::Whoami));
    assert!(matches!(parse_ok(&["schema"]).command, Command::Schema));
    assert!(matches!(parse_ok(&["version"]).command, Command::Version));
    let Command::Connect { address, timeout } =
        parse_ok(&["connect", "tls:h:1#ed25519:x", "--timeout", "3s"]).command
    else {
        panic!()
    };
    assert_eq!(address, "tls:h:1#ed25519:x");
    assert_eq!(timeout, Some(Duration::from_secs(3)));
    assert!(parse_err(&["connect"]).kind() == clap::error::ErrorKind::MissingRequiredArgument);
}

#[test]
fn send_peer_and_text() {
    let s = send_args(&[
        "alice",
        "hello",
        "-s",
        "subj",
        "--re",
        "01ID",
        "--wait-ack",
        "5s",
    ]);
    assert_eq!(s.peer_and_text(), (Some("alice"), "hello"));
    assert_eq!(s.subject.as_deref(), Some("subj"));
    assert_eq!(s.re.as_deref(), Some("01ID"));
    assert_eq!(s.wait_ack, Some(Duration::from_secs(5)));
    // Options before the positionals, and after them.
    let s = send_args(&["-t", "thr_1", "hi"]);
    assert_eq!(s.peer_and_text(), (None, "hi"));
    assert_eq!(s.thread.as_deref(), Some("thr_1"));
    let s = send_args(&["bob", "hi", "-t", "thr_2"]);
    assert_eq!(s.peer_and_text(), (Some("bob"), "hi"));
    assert_eq!(s.thread.as_deref(), Some("thr_2"));
    // One value without -t is the peer (content from --data, --code or -f).
    let s = send_args(&["bob", "--data", "{}"]);
    assert_eq!(s.peer_and_text(), (Some("bob"), ""));
}

#[test]
fn send_accepts_hyphen_leading_peer_and_text() {
    let s = send_args(&["-AbC", "hi"]);
    assert_eq!(s.peer_and_text(), (Some("-AbC"), "hi"));
    let s = send_args(&["-AbC", "-5 degrees", "-t", "thr_1"]);
    assert_eq!(s.peer_and_text(), (Some("-AbC"), "-5 degrees"));
    assert_eq!(s.thread.as_deref(), Some("thr_1"));
    let s = send_args(&["--xYz9", "hi"]);
    assert_eq!(s.peer_and_text(), (Some("--xYz9"), "hi"));
    // A peer made only of option letters needs `--`.
    let s = send_args(&["--", "-ts", "hi"]);
    assert_eq!(s.peer_and_text(), (Some("-ts"), "hi"));
}

#[test]
fn send_dash_text_means_stdin() {
    let s = send_args(&["alice", "-"]);
    assert_eq!(s.peer_and_text(), (Some("alice"), "-"));
}

#[test]
fn send_data_must_be_json() {
    let s = send_args(&[
        "alice",
        "x",
        "--data",
        "{\"a\":[1,2]}",
        "--mime",
        "application/json",
    ]);
    assert_eq!(s.data, Some(json!({"a": [1, 2]})));
    assert_eq!(s.mime.as_deref(), Some("application/json"));
    let e = parse_err(&["send", "alice", "x", "--data", "{bad"]);
    assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
    let line = clap_error_line(&e);
    assert!(
        line.starts_with("awp: invalid value '{bad' for '--data"),
        "{line}"
    );
    assert!(line.contains("not valid JSON"), "{line}");
    assert!(!line.contains('\n'));
    // --mime and --lang only with what they describe.
    assert!(
        parse_err(&["send", "a", "x", "--mime", "m"]).kind()
            == clap::error::ErrorKind::MissingRequiredArgument
    );
    assert!(
        parse_err(&["send", "a", "x", "--lang", "rust"]).kind()
            == clap::error::ErrorKind::MissingRequiredArgument
    );
}

#[test]
fn durations() {
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("soon").unwrap_err().contains("500ms"));
    assert_eq!(
        parse_err(&["wait", "--timeout", "x"]).kind(),
        clap::error::ErrorKind::ValueValidation
    );
}

#[test]
fn state_positionals() {
    let Command::State(s) = parse_ok(&["state", "thr_1", "done", "-n", "merged"]).command else {
        panic!()
    };
    assert_eq!(s.split(), (None, "thr_1", "done"));
    assert_eq!(s.note.as_deref(), Some("merged"));
    let Command::State(s) =
        parse_ok(&["state", "-AbC", "thr_1", "working", "--wait-ack", "1s"]).command
    else {
        panic!()
    };
    assert_eq!(s.split(), (Some("-AbC"), "thr_1", "working"));
    assert_eq!(s.wait_ack, Some(Duration::from_secs(1)));
    assert!(Cli::try_parse_from(["awp", "state", "thr_1"]).is_err());
    assert!(Cli::try_parse_from(["awp", "state", "a", "b", "c", "d"]).is_err());
}

#[test]
fn tail_read_wait() {
    let Command::Tail { once, thread, peer } =
        parse_ok(&["tail", "--once", "-t", "thr_1", "-p", "-AbC"]).command
    else {
        panic!()
    };
    assert!(once);
    assert_eq!(thread.as_deref(), Some("thr_1"));
    assert_eq!(peer.as_deref(), Some("-AbC"));
    let Command::Read {
        thread, no_mark, ..
    } = parse_ok(&["read", "thr_9", "--no-mark"]).command
    else {
        panic!()
    };
    assert_eq!(thread.as_deref(), Some("thr_9"));
    assert!(no_mark);
    let Command::Read {
        thread,
        no_mark,
        limit,
        all,
        after,
    } = parse_ok(&["read"]).command
    else {
        panic!()
    };
    assert_eq!((thread, no_mark), (None, false));
    assert_eq!((limit, all, after), (super::args::READ_LIMIT, false, None));
    let Command::Read {
        limit, all, after, ..
    } = parse_ok(&["read", "--limit", "5", "--after", "42"]).command
    else {
        panic!()
    };
    assert_eq!((limit, all, after), (5, false, Some(42)));
    parse_err(&["read", "--limit", "0"]);
    parse_err(&["read", "--limit", "5", "--all"]);
    parse_err(&["read", "--after", "next"]);
    let Command::Wait {
        thread,
        state,
        timeout,
        no_mark,
    } = parse_ok(&[
        "wait",
        "-t",
        "thr_1",
        "--state",
        "done,failed",
        "--timeout",
        "30s",
    ])
    .command
    else {
        panic!()
    };
    assert_eq!(thread.as_deref(), Some("thr_1"));
    assert_eq!(state, ["done", "failed"]);
    assert_eq!(timeout, Some(Duration::from_secs(30)));
    assert!(!no_mark);
}

#[test]
fn exit_codes() {
    assert_eq!(Exit::Ok.code(), 0);
    assert_eq!(Exit::Failed.code(), 1);
    assert_eq!(Exit::Usage.code(), 2);
    assert_eq!(Exit::NoNode.code(), 3);
    for code in [
        "bad_request",
        "no_such_peer",
        "ambiguous_peer",
        "no_such_thread",
        "ambiguous_thread",
    ] {
        assert_eq!(exit_for_node_error(code), Exit::Usage, "{code}");
    }
    for code in ["connect_failed", "internal", "something_new"] {
        assert_eq!(exit_for_node_error(code), Exit::Failed, "{code}");
    }
    let home = std::path::Path::new("/h");
    let f = node_failure(
        &crate::control::ControlError {
            code: "connect_failed".into(),
            message: "refused".into(),
            hint: None,
        },
        home,
    );
    assert_eq!(f.exit, Exit::Failed);
    assert_eq!(
        f.message().unwrap(),
        "awp: refused; check the address and that the peer's node is up"
    );
    let not_running = crate::control::ClientError::NotRunning {
        path: "/h/awp.sock".into(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    assert_eq!(client_failure(&not_running, home).exit, Exit::NoNode);
}

#[test]
fn failure_message_is_one_line() {
    let f = Failure::usage("two\nlines", "do this");
    assert_eq!(f.message().unwrap(), "awp: two lines; do this");
    assert_eq!(Failure::silent(Exit::Ok).message(), None);
}

#[test]
fn failure_message_escapes_peer_chosen_controls() {
    // An ambiguous_peer message quotes the names peers chose.
    let f = Failure::usage(
        "\"bob\" matches bob\u{202E}gnp.exe, \u{1b}[2Jeve",
        "give more",
    );
    let m = f.message().unwrap();
    assert!(
        !m.chars()
            .any(|c| c.is_control() || format::is_bidi_control(c)),
        "{m}"
    );
    assert!(m.contains("bob\\u{202e}gnp.exe"), "{m}");
}

#[test]
fn help_documents_exit_codes() {
    use clap::CommandFactory;
    let help = Cli::command().render_long_help().to_string();
    for want in [
        "Exit codes:",
        "0  success",
        "1  the operation failed",
        "2  usage error",
        "3  no node running",
    ] {
        assert!(help.contains(want), "{want:?} missing from help");
    }
}

#[test]
fn parts_from_text_code_and_data() {
    let parts = build_parts(
        "hi",
        Some(("fn main() {}\n".into(), Some("rust".into()))),
        Some((json!({"n": 1}), Some("application/json".into()))),
    );
    assert_eq!(
        parts,
        vec![
            json!({"k": "text", "text": "hi"}),
            json!({"k": "code", "text": "fn main() {}\n", "lang": "rust"}),
            json!({"k": "data", "data": {"n": 1}, "mime": "application/json"}),
        ]
    );
    assert_eq!(
        build_parts("", None, Some((json!(null), None))),
        vec![json!({"k": "data", "data": null})]
    );
    assert!(build_parts("", None, None).is_empty());
}

#[test]
fn code_language_from_extension() {
    assert_eq!(lang_for_path("a/b.rs".as_ref()).as_deref(), Some("rust"));
    assert_eq!(lang_for_path("x.PY".as_ref()).as_deref(), Some("python"));
    assert_eq!(lang_for_path("x.go".as_ref()).as_deref(), Some("go"));
    assert_eq!(lang_for_path("Makefile".as_ref()), None);
}

#[test]
fn send_request_from_args() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snippet.py");
    std::fs::write(&file, "print(1)\n").unwrap();
    let s = send_args(&[
        "alice",
        "look",
        "--code",
        file.to_str().unwrap(),
        "-s",
        "review",
        "--wait-ack",
        "500ms",
    ]);
    let req = send_request(&s).unwrap();
    assert_eq!(
        req,
        crate::control::Request::Send {
            peer: Some("alice".into()),
            th: None,
            subject: Some("review".into()),
            re: None,
            parts: vec![
                json!({"k": "text", "text": "look"}),
                json!({"k": "code", "text": "print(1)\n", "lang": "python"}),
            ],
            files: vec![],
            wait_ack_ms: Some(500),
        }
    );
    // --lang wins over the extension.
    let s = send_args(&[
        "alice",
        "",
        "--code",
        file.to_str().unwrap(),
        "--lang",
        "py3",
    ]);
    let crate::control::Request::Send { parts, .. } = send_request(&s).unwrap() else {
        panic!()
    };
    assert_eq!(
        parts,
        vec![json!({"k": "code", "text": "print(1)\n", "lang": "py3"})]
    );
    // With -t and one positional the peer comes from the thread.
    let s = send_args(&["-t", "thr_1", "again"]);
    let crate::control::Request::Send { peer, th, .. } = send_request(&s).unwrap() else {
        panic!()
    };
    assert_eq!((peer, th.as_deref()), (None, Some("thr_1")));
}

#[test]
fn send_request_input_errors_are_usage() {
    // One positional without a thread is the peer: the text is missing (not the peer).
    let f = send_request(&send_args(&["bob"])).unwrap_err();
    assert_eq!(f.exit, Exit::Usage);
    assert_eq!(
        f.what,
        "nothing to send to bob: the text, a file or data is missing"
    );
    // The text alone: taken as the peer, which the message says.
    let f = send_request(&send_args(&["hello there"])).unwrap_err();
    assert_eq!(f.exit, Exit::Usage);
    assert!(
        f.what
            .starts_with("nothing to send to \"hello there\": a single argument is the peer"),
        "{}",
        f.what
    );
    // -f alone (no positional, no thread): the peer is missing.
    let f = send_request(&send_args(&["-f", "/etc/hostname"])).unwrap_err();
    assert!(f.what.contains("needs a peer"), "{}", f.what);
    // Nothing to send.
    let f = send_request(&send_args(&["alice", ""])).unwrap_err();
    assert_eq!(f.exit, Exit::Usage);
    // Unreadable code file.
    let f = send_request(&send_args(&[
        "alice",
        "x",
        "--code",
        "/nonexistent/file.rs",
    ]))
    .unwrap_err();
    assert_eq!(f.exit, Exit::Usage);
    assert!(f.what.contains("/nonexistent/file.rs"));
}

#[test]
fn delivery_lines() {
    let body = |v: serde_json::Value| v.as_object().unwrap().clone();
    assert_eq!(
        delivery_line(&body(
            json!({"status": "delivered", "id": "01A", "th": "thr_1"})
        )),
        "delivered 01A in thr_1"
    );
    assert_eq!(
        delivery_line(&body(
            json!({"status": "queued", "id": "01A", "th": "thr_1", "connected": false})
        )),
        "queued 01A in thr_1 (peer offline)"
    );
    assert_eq!(
        delivery_line(&body(
            json!({"status": "queued", "id": "01A", "th": "thr_1", "connected": true})
        )),
        "queued 01A in thr_1",
        "connected: not offline, just not waited for"
    );
}

#[test]
fn wait_matching() {
    let ev = |v: serde_json::Value| v.as_object().unwrap().clone();
    let msg_in =
        ev(json!({"event": "line", "dir": "in", "th": "thr_1", "t": "msg", "line": {"t": "msg"}}));
    let msg_out =
        ev(json!({"event": "line", "dir": "out", "th": "thr_1", "t": "msg", "line": {"t": "msg"}}));
    let done_in = ev(
        json!({"event": "line", "dir": "in", "th": "thr_1", "t": "state",
        "line": {"t": "state", "state": "done"}}),
    );
    let ack = ev(json!({"event": "ack", "th": "thr_1", "re": "x"}));
    let none: Vec<String> = vec![];
    let states = vec!["done".to_string(), "failed".to_string()];
    assert!(wait_matches(&msg_in, None, &none));
    assert!(wait_matches(&msg_in, Some("thr_1"), &none));
    assert!(!wait_matches(&msg_in, Some("thr_2"), &none));
    assert!(!wait_matches(&msg_out, None, &none));
    assert!(!wait_matches(&ack, None, &none));
    assert!(!wait_matches(&msg_in, None, &states));
    assert!(wait_matches(&done_in, Some("thr_1"), &states));
    assert!(!wait_matches(&done_in, None, &["working".to_string()]));
}

#[test]
fn clap_errors_become_one_line() {
    let e = parse_err(&["send"]);
    let line = clap_error_line(&e);
    assert!(!line.contains('\n'));
    assert!(
        line.starts_with("awp: the following required arguments were not provided: <PEER|TEXT>"),
        "{line}"
    );
    let line = clap_error_line(&parse_err(&["frobnicate"]));
    assert!(
        line.starts_with("awp: unrecognized subcommand 'frobnicate'"),
        "{line}"
    );
}

#[test]
fn send_with_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.pdf");
    std::fs::write(&file, b"%PDF-1.7").unwrap();
    let f = file.to_str().unwrap();
    // One positional with -f and no -t is the peer; the text may be left out.
    let s = send_args(&["bob", "-f", f, "-f", f]);
    assert_eq!(s.peer_and_text(), (Some("bob"), ""));
    let crate::control::Request::Send {
        peer, parts, files, ..
    } = send_request(&s).unwrap()
    else {
        panic!()
    };
    assert_eq!(peer.as_deref(), Some("bob"));
    assert!(parts.is_empty());
    assert_eq!(files, vec![f.to_string(), f.to_string()]);
    // With -t, no positional is needed.
    let s = send_args(&["-t", "thr_1", "-f", f]);
    assert_eq!(s.peer_and_text(), (None, ""));
    // Text and files together.
    let s = send_args(&["bob", "see attached", "--file", f]);
    assert_eq!(s.peer_and_text(), (Some("bob"), "see attached"));
    // A relative path is made absolute; a missing file or a directory is exit 2.
    let s = send_args(&["bob", "-f", "Cargo.toml"]);
    let crate::control::Request::Send { files, .. } = send_request(&s).unwrap() else {
        panic!()
    };
    assert!(std::path::Path::new(&files[0]).is_absolute());
    for bad in ["/nonexistent/file", dir.path().to_str().unwrap()] {
        let s = send_args(&["bob", "-f", bad]);
        assert_eq!(send_request(&s).unwrap_err().exit, Exit::Usage);
    }
}

#[test]
fn blobs_command_parses() {
    assert!(matches!(
        parse_ok(&["blobs"]).command,
        Command::Blobs { peer: None }
    ));
    assert!(matches!(
        parse_ok(&["blobs", "-p", "-AbC"]).command,
        Command::Blobs { peer: Some(p) } if p == "-AbC"
    ));
}

#[test]
fn blobs_table_shows_direction_status_size_sha_and_path() {
    let items = vec![
        json!({"dir":"out","status":"queued","peer":"ed25519:AAAAAAAAAAAA","peer_name":"bob",
               "size":3000000,"sha256":"ab".repeat(32),"name":"a.bin","path":"/tmp/a.bin",
               "chunks":12,"chunks_sent":5}),
        json!({"dir":"in","status":"pending","peer":"ed25519:BBBBBBBBBBBB","size":10,"bytes":4,
               "name":"x\u{1b}[2J","path":null}),
    ];
    let t = super::blobs::blobs_table(&items);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("DIR"));
    assert!(lines[1].contains("queued 5/12") && lines[1].contains(&"ab".repeat(32)));
    assert!(lines[1].contains("/tmp/a.bin"));
    assert!(lines[2].contains("4/10") && !lines[2].contains('\u{1b}'));
}

/// An artifact, thread or proposal that does not exist is bad input (exit 2) with a hint
/// that lists what exists, not a pointer to the node's log.
#[test]
fn artifact_not_found_is_usage_with_a_listing_hint() {
    assert_eq!(exit_for_node_error("not_found"), Exit::Usage);
    let err = crate::control::ControlError {
        code: "not_found".into(),
        message: "no artifact art_zz".into(),
        hint: None,
    };
    let f = node_failure(&err, std::path::Path::new("/h"));
    assert_eq!(f.exit, Exit::Usage);
    assert!(f.hint.contains("awp artifact list"), "{}", f.hint);
}

/// Usability #12b: a peer named by a key prefix that starts with `-` (keys are base64url)
/// is accepted by every verb that takes a peer, `connect` included.
#[test]
fn every_verb_accepts_a_hyphen_leading_peer() {
    let p = "-LhWGFku";
    let cases: [&[&str]; 14] = [
        &["connect", p],
        &["connect", p, "--timeout", "3s"],
        &["disconnect", p, "--reason", "done"],
        &["send", p, "hi"],
        &["state", p, "thr_1", "done"],
        &["presence", p],
        &["grant", p, "exec"],
        &["grant", "bob", "exec", "--aud", p],
        &["introduce", p, "bob"],
        &["introduce", "bob", p],
        &["peers", "forget", p],
        &["artifact", "new", p],
        &["tail", "-p", p],
        &["blobs", "-p", p],
    ];
    for args in cases {
        let c = parse_ok(args);
        assert!(
            format!("{:?}", c.command).contains(&format!("{p:?}")),
            "{args:?}: {:?}",
            c.command
        );
    }
}

/// The whole grammar passes clap's own checks (conflicting names, bad defaults, groups)
/// in every subcommand, not only in those a test happens to parse.
#[test]
fn the_command_grammar_passes_clap_checks() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

/// Usability #12b: the rule as a property of the grammar, so a new verb cannot miss it:
/// every argument that names a peer (a value name with PEER, or ids peer/to/aud) accepts
/// values that start with `-`.
#[test]
fn every_peer_argument_allows_hyphen_values() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: &str, seen: &mut usize) {
        for arg in cmd.get_arguments() {
            let names: Vec<String> = arg
                .get_value_names()
                .unwrap_or_default()
                .iter()
                .map(|n| n.to_string())
                .collect();
            let id = arg.get_id().as_str();
            let names_peer =
                names.iter().any(|n| n.contains("PEER")) || ["peer", "to", "aud"].contains(&id);
            if names_peer {
                *seen += 1;
                assert!(
                    arg.is_allow_hyphen_values_set(),
                    "`awp {path}` argument {id} names a peer but refuses a leading `-`"
                );
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), seen);
        }
    }
    let mut seen = 0;
    walk(&Cli::command(), "", &mut seen);
    assert!(seen >= 12, "found only {seen} peer arguments");
}

/// Exit 3's hint names a home that a plain `awp up` would not use, quoted for the shell
/// when it needs to be.
#[test]
fn start_hint_names_the_home_quoted_for_the_shell() {
    assert_eq!(
        super::start_hint(Path::new("/nonexistent/awp-homes/a")),
        "start one with `awp --home /nonexistent/awp-homes/a up`"
    );
    assert_eq!(
        super::start_hint(Path::new("/nonexistent/it's a home")),
        "start one with `awp --home '/nonexistent/it'\\''s a home' up`"
    );
}
