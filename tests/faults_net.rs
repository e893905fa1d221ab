//! Network faults and hostile handshakes (issue 8 §3 and §4b): silent and non-reading peers,
//! idle sockets holding handshake slots, self-connection, simultaneous `connect`, hello
//! nonce checks, close_notify on shutdown, BOM and line separators.
//!
//! Every test runs nodes in temp homes on 127.0.0.1 ephemeral ports and bounds its loops.

mod common;

use awp_node::wire::{self, b64, Line};
use common::{Raw, TestNode};
use std::time::Duration;

const TS: &str = "2026-01-01T00:00:00.000Z";

/// A hello from `raw` with `nonce` as given (everything else valid).
fn hello_with_nonce(raw: &Raw, nonce: &str) -> Vec<u8> {
    Line::Hello(wire::Hello {
        id: "01K00000000000000000000000".into(),
        ts: TS.into(),
        v: 0,
        key: raw.identity.key().to_string(),
        name: Some("raw@test".into()),
        nonce: nonce.into(),
        caps: vec![],
        about: None,
        addr: None,
        shares: None,
    })
    .encode()
}

/// Send a hello carrying `nonce`; the node's answer after its own hello.
async fn answer_to_nonce(node: &TestNode, seed: u8, nonce: &str) -> Line {
    let mut raw = Raw::dial(&node.address(), seed).await;
    let hello = hello_with_nonce(&raw, nonce);
    raw.write(&hello).await;
    let first = raw.read_line().await.expect("node hello");
    assert_eq!(first.kind(), "hello");
    raw.read_line().await.expect("an answer to our hello")
}

fn assert_err_auth(line: &Line, what: &str) {
    match line {
        Line::Err(e) => assert_eq!(e.code, "auth", "{what}: {e:?}"),
        other => panic!("{what}: expected err auth, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_nonce_empty_is_refused() {
    let node = TestNode::start("n").await;
    assert_err_auth(&answer_to_nonce(&node, 11, "").await, "empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_nonce_not_base64_is_refused() {
    let node = TestNode::start("n").await;
    assert_err_auth(&answer_to_nonce(&node, 12, "!!!").await, "!!!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_nonce_of_one_byte_is_refused() {
    let node = TestNode::start("n").await;
    let one = b64::encode_url(&[7u8]);
    assert_err_auth(&answer_to_nonce(&node, 13, &one).await, "1 byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_nonce_of_31_bytes_is_refused() {
    let node = TestNode::start("n").await;
    let short = b64::encode_url(&[7u8; 31]);
    assert_err_auth(&answer_to_nonce(&node, 14, &short).await, "31 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_nonce_with_non_canonical_trailing_bits_is_refused() {
    let node = TestNode::start("n").await;
    // 43 characters hold 258 bits: the last 2 must be zero in the canonical form.
    let canonical = b64::encode_url(&[0u8; 32]);
    assert!(canonical.ends_with('A'));
    let odd = format!("{}B", &canonical[..42]);
    assert_err_auth(&answer_to_nonce(&node, 15, &odd).await, "trailing bits");
    // The same 32 bytes in their canonical form get auth.
    let ok = answer_to_nonce(&node, 16, &canonical).await;
    assert_eq!(ok.kind(), "auth", "{ok:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bom_before_the_first_line_is_named_in_the_refusal() {
    let node = TestNode::start("n").await;
    let mut raw = Raw::dial(&node.address(), 17).await;
    let mut hello = "\u{feff}".as_bytes().to_vec();
    hello.extend(raw.hello(0));
    raw.write(&hello).await;
    let _their_hello = raw.read_line().await.expect("node hello");
    let Some(Line::Err(e)) = raw.read_line().await else {
        panic!("expected err bad_frame")
    };
    assert_eq!(e.code, "bad_frame");
    let detail = e.detail.unwrap_or_default();
    assert!(
        detail.contains("byte order mark") && detail.contains("U+FEFF"),
        "{detail}"
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), raw.read())
            .await
            .unwrap()
            .is_none(),
        "closed after the refusal"
    );
}

/// One control request, the raw response bytes.
async fn ctl_raw(home: &std::path::Path, req: &awp_node::control::Request) -> Vec<u8> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let sock = awp_node::daemon::socket_path(home);
    let stream = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(req).unwrap();
    line.push(b'\n');
    w.write_all(&line).await.unwrap();
    let mut r = tokio::io::BufReader::new(r);
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), r.read_until(b'\n', &mut resp))
        .await
        .expect("control response in time")
        .unwrap();
    resp
}

/// An empty `resume` (the node replays its outbox on it).
fn resume_line() -> String {
    format!(r#"{{"t":"resume","id":"01K00000000000000000000002","ts":"{TS}","seen":{{}}}}"#)
}

fn has_raw_separator(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.contains('\u{2028}') || text.contains('\u{2029}')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_separators_are_escaped_to_peers_and_in_control_output() {
    let node = TestNode::start("n").await;
    let mut raw = Raw::dial(&node.address(), 18).await;
    raw.handshake().await;
    raw.write(resume_line().as_bytes()).await;
    let text = "one\u{2028}two\u{2029}three";
    node.send(Some(&raw.identity.key().to_string()), None, text)
        .await;
    // Lines to the peer: the msg carries the escapes, never the raw characters.
    let mut got = None;
    for _ in 0..20 {
        let Some(l) = raw.read().await else { break };
        if wire::parse_line(&l).is_ok_and(|p| p.kind() == "msg") {
            got = Some(l);
            break;
        }
    }
    let msg = got.expect("the msg reaches the peer");
    assert!(
        !has_raw_separator(&msg),
        "{}",
        String::from_utf8_lossy(&msg)
    );
    let s = String::from_utf8(msg.clone()).unwrap();
    assert!(s.contains("one\\u2028two\\u2029three"), "{s}");
    // The value is unchanged.
    let Line::Msg(m) = wire::parse_line(&msg).unwrap() else {
        panic!()
    };
    assert_eq!(
        m.parts[0],
        wire::Part::Text(wire::TextPart { text: text.into() })
    );

    // A peer's raw separators come out of the control socket escaped too.
    let th = "thr_sep";
    let line = format!(
        r#"{{"t":"msg","id":"01K00000000000000000000009","ts":"{TS}","th":"{th}","parts":[{{"k":"text","text":"x{}y"}}]}}"#,
        '\u{2028}'
    );
    raw.write(line.as_bytes()).await;
    for _ in 0..20 {
        match raw.read_line().await {
            Some(Line::Ack(_)) => break,
            Some(_) => continue,
            None => panic!("no ack"),
        }
    }
    let resp = ctl_raw(
        node.home.path(),
        &awp_node::control::Request::Read {
            th: Some(th.into()),
            mark: false,
        },
    )
    .await;
    let s = String::from_utf8(resp.clone()).unwrap();
    assert!(s.contains("x\\u2028y"), "{s}");
    assert!(!has_raw_separator(&resp), "{s}");
}
