//! `NodeHandle::control_line`, the fuzzing harness's in-process path to the control
//! handler, answers every line exactly as the control socket does.

mod common;

use awp_node::control::{Response, MAX_CONTROL_LINE};
use common::TestNode;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Write `line` (and `\n`) as the first line of a new control connection; the one response.
async fn by_socket(home: &Path, line: &[u8]) -> Response {
    let sock = awp_node::daemon::socket_path(home);
    let stream = UnixStream::connect(&sock).await.expect("control socket");
    let (r, mut w) = stream.into_split();
    w.write_all(line).await.unwrap();
    w.write_all(b"\n").await.unwrap();
    let mut resp = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        BufReader::new(r).read_line(&mut resp),
    )
    .await
    .expect("control response in time")
    .unwrap();
    serde_json::from_str(&resp).expect("response is JSON")
}

#[tokio::test]
async fn control_line_answers_as_the_socket_does() {
    let node = TestNode::start("inproc@test").await;
    let long = format!(
        r#"{{"op":"threads","x":"{}"}}"#,
        "a".repeat(MAX_CONTROL_LINE)
    );
    // Exactly the limit, and one byte under it: with the socket's `\n` the first is over.
    // (`whoami`: an answer that does not change over time, unlike `status`'s uptime.)
    let whoami = |len: usize| {
        let pad = len - r#"{"op":"whoami","x":""}"#.len();
        format!(r#"{{"op":"whoami","x":"{}"}}"#, "a".repeat(pad))
    };
    let (at_limit, under) = (whoami(MAX_CONTROL_LINE), whoami(MAX_CONTROL_LINE - 1));
    assert_eq!(at_limit.len(), MAX_CONTROL_LINE);
    let lines: Vec<&[u8]> = vec![
        b"",
        b"not json",
        br#"{"op":"nope"}"#,
        br#"{"op":"threads"}"#,
        br#"{"op":"threads","limit":"x"}"#,
        br#"{"op":"peers","cursor":"zz"}"#,
        br#"{"op":"read","th":"thr_none"}"#,
        br#"{"op":"send","parts":[]}"#,
        long.as_bytes(),
        at_limit.as_bytes(),
        under.as_bytes(),
    ];
    for line in lines {
        let inproc = node
            .handle
            .control_line(line)
            .await
            .expect("answered in-process");
        let socket = by_socket(node.home.path(), line).await;
        assert_eq!(inproc, socket, "line {:?}", String::from_utf8_lossy(line));
    }
    // What only the socket serves.
    for line in [&br#"{"op":"subscribe"}"#[..], br#"{"op":"shutdown"}"#] {
        assert!(node.handle.control_line(line).await.is_none());
    }
    // Still up.
    assert!(by_socket(node.home.path(), br#"{"op":"status"}"#).await.ok);
    node.stop().await;
}
