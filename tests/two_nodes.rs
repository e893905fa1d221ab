//! Two nodes over real TLS on 127.0.0.1, and raw protocol peers against one node.

mod common;

use awp_node::control::Request;
use awp_node::identity::Identity;
use awp_node::net::{self, Address, DialOptions, TlsConfig};
use awp_node::wire::{self, Line};
use common::*;
use serde_json::{json, Value};

fn texts(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e["t"] == "msg")
        .map(|e| {
            e["line"]["parts"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn handshake_msg_ack_and_state_over_tls() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    let c = a.connect(&b).await;
    assert_eq!(c["peer"], b.key());
    assert_eq!(c["peer_name"], "bob@test");

    let r = a
        .ctl(Request::Send {
            peer: Some("bob@test".into()),
            th: None,
            subject: Some("CI run".into()),
            re: None,
            parts: vec![
                json!({"k":"text","text":"Run the suite on main"}),
                json!({"k":"data","data":{"commit":"a1b2c3"}}),
            ],
            files: vec![],
            wait_ack_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.body["status"], "delivered");
    let th = r.body["th"].as_str().unwrap().to_string();
    assert!(th.starts_with("thr_"));

    let inbound = b.inbound().await;
    assert_eq!(texts(&inbound), ["Run the suite on main"]);
    assert_eq!(inbound[0]["peer"], a.key());
    assert_eq!(inbound[0]["line"]["parts"][1]["data"]["commit"], "a1b2c3");

    // Bob answers in the thread and marks it working, then done.
    let r = b
        .ctl(Request::State {
            peer: None,
            th: th.clone(),
            state: "working".into(),
            note: None,
            wait_ack_ms: Some(10_000),
        })
        .await;
    assert_eq!(r.body["status"], "delivered", "{:?}", r.error);
    b.send(None, Some(&th), "3 failing").await;
    let r = b
        .ctl(Request::State {
            peer: None,
            th: th.clone(),
            state: "done".into(),
            note: Some("all green".into()),
            wait_ack_ms: Some(10_000),
        })
        .await;
    assert_eq!(r.body["status"], "delivered");

    let threads = a.ctl(Request::Threads).await;
    let t = &threads.body["threads"][0];
    assert_eq!(t["th"], th.as_str());
    assert_eq!(t["subject"], "CI run");
    assert_eq!(t["theirs"], "done");
    assert_eq!(t["their_note"], "all green");
    let got = eventually(10, || async {
        let t = texts(&a.inbound().await);
        (t.len() == 1).then_some(t)
    })
    .await;
    assert_eq!(got, ["3 failing"]);
}

#[tokio::test]
async fn resume_delivers_lines_queued_in_both_directions_exactly_once() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let first = a.send(Some(&b.key()), None, "hello").await;
    let th = first["th"].as_str().unwrap().to_string();
    eventually(10, || async {
        (b.inbound().await.len() == 1).then_some(())
    })
    .await;

    // Bob goes away; both sides queue while apart.
    let b_home = b.stop().await;
    for i in 0..3 {
        a.send(None, Some(&th), &format!("a{i}")).await;
    }
    let status = a.ctl(Request::Status).await;
    assert_eq!(status.body["outbox"], 3);
    let b = TestNode::start_in(b_home, "bob@test").await;
    for i in 0..2 {
        b.send(None, Some(&th), &format!("b{i}")).await;
    }
    // Reconnect (Bob has a new port).
    a.connect(&b).await;
    let got_b = eventually(15, || async {
        let t = texts(&b.inbound().await);
        (t.len() >= 4).then_some(t)
    })
    .await;
    assert_eq!(got_b, ["hello", "a0", "a1", "a2"]);
    let got_a = eventually(15, || async {
        let t = texts(&a.inbound().await);
        (t.len() >= 2).then_some(t)
    })
    .await;
    assert_eq!(got_a, ["b0", "b1"]);
    eventually(10, || async {
        let s = a.ctl(Request::Status).await;
        (s.body["outbox"] == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn replayed_msg_is_acked_twice_and_delivered_once() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 9).await;
    raw.handshake().await;
    let msg = br#"{"t":"msg","id":"01K00000000000000000000010","ts":"2026-01-01T00:00:00.000Z","th":"thr_x","parts":[{"k":"text","text":"once"}],"x-priority":"high"}"#;
    raw.write(msg).await;
    raw.write(msg).await;
    let mut acks = vec![];
    while acks.len() < 2 {
        match raw.read_line().await.expect("acks") {
            Line::Ack(a) => acks.push(a),
            Line::Err(e) => panic!("unexpected err {e:?}"),
            _ => {}
        }
    }
    assert_eq!(acks[0].re, "01K00000000000000000000010");
    assert_eq!(acks[1].re, "01K00000000000000000000010");
    assert_ne!(acks[0].id, acks[1].id, "each ack has its own id");
    assert_eq!(texts(&b.inbound().await), ["once"]);
}

#[tokio::test]
async fn unknown_part_and_unknown_type_are_ignored() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 9).await;
    raw.handshake().await;
    raw.write(br#"{"t":"frobnicate","id":"x1","ts":"2026-01-01T00:00:00Z"}"#)
        .await;
    raw.write(br#"{"t":"msg","id":"01K00000000000000000000011","ts":"2026-01-01T00:00:00.000Z","th":"t","parts":[{"k":"hologram"},{"k":"text","text":"ok"}]}"#).await;
    raw.write(br#"{"t":"ping","id":"p1","ts":"2026-01-01T00:00:00Z"}"#)
        .await;
    let mut kinds = vec![];
    while kinds.len() < 2 {
        let l = raw.read_line().await.expect("answers");
        if let Line::Pong(p) = &l {
            assert_eq!(p.re, "p1");
        }
        kinds.push(l.kind().to_string());
    }
    // The ack waits for the flush, so it may come after the pong.
    kinds.sort();
    assert_eq!(kinds, ["ack", "pong"], "only an ack and a pong, no err");
}

#[tokio::test]
async fn version_mismatch_gets_err_version_and_no_auth() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 9).await;
    let hello = raw.hello(1);
    raw.write(&hello).await;
    assert_eq!(raw.read_line().await.unwrap().kind(), "hello");
    let Some(Line::Err(e)) = raw.read_line().await else {
        panic!("expected err")
    };
    assert_eq!(e.code, "version");
    assert!(
        raw.read().await.is_none(),
        "closed after err version, no auth"
    );
}

#[tokio::test]
async fn reflection_of_the_nodes_own_key_is_refused() {
    let b = TestNode::start("bob@test").await;
    let own = Identity::load_or_create(&b.path()).unwrap();
    let tls = TlsConfig::new(&own).unwrap();
    let addr: Address = b.address().parse().unwrap();
    let c = net::dial(&addr, &tls, &DialOptions::default())
        .await
        .unwrap();
    let mut raw = Raw {
        identity: own,
        reader: c.reader,
        writer: c.writer,
    };
    let hello = raw.hello(0);
    raw.write(&hello).await;
    assert_eq!(raw.read_line().await.unwrap().kind(), "hello");
    let Some(Line::Err(e)) = raw.read_line().await else {
        panic!("expected err")
    };
    assert_eq!(e.code, "auth");
    assert!(raw.read().await.is_none());
}

#[tokio::test]
async fn msg_before_auth_is_refused() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 9).await;
    let hello = raw.hello(0);
    raw.write(&hello).await;
    raw.write(br#"{"t":"msg","id":"m","ts":"2026-01-01T00:00:00Z","th":"t","parts":[]}"#)
        .await;
    let mut lines = vec![];
    while let Some(l) = raw.read_line().await {
        lines.push(l);
    }
    let kinds: Vec<&str> = lines.iter().map(|l| l.kind()).collect();
    assert_eq!(kinds.first(), Some(&"hello"));
    let Some(Line::Err(e)) = lines.last() else {
        panic!("expected err, got {kinds:?}")
    };
    assert_eq!(e.code, "auth");
    assert!(!kinds.contains(&"resume"));
}

#[tokio::test]
async fn bad_frame_and_too_large_close_with_err() {
    let b = TestNode::start("bob@test").await;
    for (input, code) in [
        (b"this is not json".to_vec(), "bad_frame"),
        (vec![b'x'; wire::MAX_LINE + 1], "too_large"),
    ] {
        let mut raw = Raw::dial(&b.address(), 9).await;
        raw.handshake().await;
        raw.write(&input).await;
        let mut last = None;
        while let Some(l) = raw.read_line().await {
            last = Some(l);
        }
        let Some(Line::Err(e)) = last else {
            panic!("expected err {code}")
        };
        assert_eq!(e.code, code);
    }
}

#[tokio::test]
async fn exactly_one_mib_line_is_accepted() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 9).await;
    raw.handshake().await;
    let head = r#"{"t":"msg","id":"01K00000000000000000000012","ts":"2026-01-01T00:00:00.000Z","th":"t","parts":[{"k":"text","text":""#;
    let tail = r#""}]}"#;
    let fill = wire::MAX_LINE - head.len() - tail.len();
    let line = format!("{head}{}{tail}", "a".repeat(fill));
    assert_eq!(line.len(), wire::MAX_LINE);
    raw.write(line.as_bytes()).await;
    let l = raw.read_line().await.expect("answer");
    assert_eq!(l.kind(), "ack");
}

/// A relay that terminates TLS on both sides with its own key and forwards lines.
async fn mitm(target: String) -> String {
    let m = Identity::from_seed(&[66; 32]);
    let tls = std::sync::Arc::new(TlsConfig::new(&m).unwrap());
    let listener = net::Listener::bind(
        &"tls:127.0.0.1:0".parse().unwrap(),
        &tls,
        &DialOptions::default(),
    )
    .await
    .unwrap();
    let addr = listener.local_address().to_string();
    tokio::spawn(async move {
        while let Ok(inc) = listener.accept().await {
            let tls = tls.clone();
            let target = target.clone();
            tokio::spawn(async move {
                let Ok(down) = inc.handshake().await else {
                    return;
                };
                let t: Address = target.parse().unwrap();
                // Dial the real node without a pin: the attacker presents its own key.
                let t = match t {
                    Address::Tls { host, port, .. } => Address::Tls {
                        host,
                        port,
                        pin: None,
                    },
                    o => o,
                };
                let Ok(up) = net::dial(&t, &tls, &DialOptions::default()).await else {
                    return;
                };
                let (mut dr, mut dw) = (down.reader, down.writer);
                let (mut ur, mut uw) = (up.reader, up.writer);
                use tokio::io::AsyncWriteExt;
                let a = async move {
                    while let Ok(Some(l)) = dr.read_line().await {
                        if uw.write_all(&[l, b"\n".to_vec()].concat()).await.is_err() {
                            break;
                        }
                        let _ = uw.flush().await;
                    }
                };
                let b = async move {
                    while let Ok(Some(l)) = ur.read_line().await {
                        if dw.write_all(&[l, b"\n".to_vec()].concat()).await.is_err() {
                            break;
                        }
                        let _ = dw.flush().await;
                    }
                };
                tokio::join!(a, b);
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_man_in_the_middle_fails_the_handshake() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    let m = mitm(b.address()).await;
    // Unpinned address of the relay: the hello key (Bob) differs from the TLS key (relay).
    let unpinned = m.split('#').next().unwrap().to_string();
    let r = a
        .ctl(Request::Connect {
            address: unpinned,
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(!r.ok, "MITM must not pass");
    // Pinned to Bob's key: the TLS handshake itself fails.
    let pinned = format!("{}#{}", m.split('#').next().unwrap(), b.key());
    let r = a
        .ctl(Request::Connect {
            address: pinned,
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(!r.ok);
    let peers = a.ctl(Request::Peers).await;
    assert!(peers.body["peers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["connected"] != true));
}

#[tokio::test]
async fn simultaneous_dial_leaves_one_connection_per_peer() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    let (ra, rb) = tokio::join!(
        a.ctl(Request::Connect {
            address: b.address(),
            timeout_ms: Some(10_000)
        }),
        b.ctl(Request::Connect {
            address: a.address(),
            timeout_ms: Some(10_000)
        }),
    );
    // At least one side reports success; the loser may be closed by the tie break.
    assert!(ra.ok || rb.ok, "{:?} {:?}", ra.error, rb.error);
    let count = |s: &awp_node::control::Response| {
        s.body["connections"]
            .as_array()
            .map(|c| c.len())
            .unwrap_or(0)
    };
    eventually(10, || async {
        let (sa, sb) = (a.ctl(Request::Status).await, b.ctl(Request::Status).await);
        (count(&sa) == 1 && count(&sb) == 1).then_some(())
    })
    .await;
    // And the surviving connection carries traffic both ways.
    let r = a
        .ctl(Request::Send {
            peer: Some(b.key()),
            th: None,
            subject: None,
            re: None,
            parts: vec![json!({"k":"text","text":"x"})],
            files: vec![],
            wait_ack_ms: Some(10_000),
        })
        .await;
    assert_eq!(r.body["status"], "delivered", "{:?}", r.error);
    assert_eq!(count(&a.ctl(Request::Status).await), 1);
}

#[tokio::test]
async fn a_stranger_cannot_take_over_a_peers_name_or_key_prefix() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let bob_prefix = b.key()["ed25519:".len().."ed25519:".len() + 8].to_string();
    // Two strangers: one calls itself "bob", one uses bob's key prefix as its name.
    for (seed, name) in [(21u8, "bob"), (22u8, bob_prefix.as_str())] {
        let mut raw = Raw::dial(&a.address(), seed).await;
        let hello = raw.hello_full(0, name, Some("tcp:127.0.0.1:9"));
        raw.handshake_with(hello).await;
        // Keep it alive until the node has stored the peer.
        raw.write(br#"{"t":"ping","id":"p","ts":"2026-01-01T00:00:00Z"}"#)
            .await;
        assert_eq!(raw.read_line().await.unwrap().kind(), "pong");
    }
    for who in ["bob", bob_prefix.as_str()] {
        let r = a
            .ctl(Request::Send {
                peer: Some(who.into()),
                th: None,
                subject: None,
                re: None,
                parts: vec![json!({"k":"text","text":"secret"})],
                files: vec![],
                wait_ack_ms: None,
            })
            .await;
        assert!(!r.ok, "{who:?} must not resolve to a stranger");
        assert_eq!(r.error.unwrap().code, "ambiguous_peer");
    }
    // The full name still works and goes to bob.
    let r = a
        .ctl(Request::Send {
            peer: Some("bob@test".into()),
            th: None,
            subject: None,
            re: None,
            parts: vec![json!({"k":"text","text":"hi"})],
            files: vec![],
            wait_ack_ms: None,
        })
        .await;
    assert_eq!(r.body["peer"], b.key());
    // A plaintext hello.addr from a stranger is not kept as a dial-back address.
    let peers = a.ctl(Request::Peers).await;
    for p in peers.body["peers"].as_array().unwrap() {
        for addr in p["addresses"].as_array().unwrap() {
            assert!(
                addr["address"].as_str().unwrap().starts_with("tls:"),
                "{addr}"
            );
        }
    }
}

#[tokio::test]
async fn a_state_from_another_peer_does_not_change_the_thread() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let th = a.send(Some(&b.key()), None, "job").await["th"]
        .as_str()
        .unwrap()
        .to_string();
    let mut raw = Raw::dial(&a.address(), 23).await;
    raw.handshake().await;
    let st = format!(
        r#"{{"t":"state","id":"01K00000000000000000000077","ts":"2026-01-01T00:00:00Z","th":"{th}","state":"done"}}"#
    );
    raw.write(st.as_bytes()).await;
    while let Some(l) = raw.read_line().await {
        if l.kind() == "ack" {
            break;
        }
    }
    // A thread is (peer, th): the stranger's line makes a thread of its own.
    let threads = a.ctl(Request::Threads).await;
    let list = threads.body["threads"].as_array().unwrap();
    let of = |key: &str| {
        list.iter()
            .find(|t| t["th"] == th.as_str() && t["peer"] == key)
            .cloned()
    };
    let t = of(&b.key()).expect("bob's thread");
    assert_ne!(t["theirs"], "done", "a stranger cannot finish bob's thread");
    let strangers = of(&raw.identity.key().to_string()).expect("the stranger's own thread");
    assert_eq!(strangers["theirs"], "done");
    let r = a
        .ctl(Request::Read {
            th: Some(format!("{}/{th}", b.key())),
            mark: false,
        })
        .await;
    assert!(
        r.body["entries"].as_array().unwrap().is_empty(),
        "the stranger's line is not shown as part of the thread"
    );
}
