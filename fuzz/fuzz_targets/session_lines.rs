//! Lines from an authenticated peer, fed one by one into a `session::Session` after a
//! completed in-memory handshake, with commit/flushed after every few lines as the node
//! does. The input is split at `\n`. Nothing may panic, and every line the session writes
//! must be one that parses.
#![no_main]

use awp_node::identity::{auth_transcript, Identity};
use awp_node::session::{Phase, Session, SessionConfig};
use awp_node::store::Store;
use awp_node::wire::{self, b64, Line};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

struct Fixture {
    node: Arc<Identity>,
    peer: Identity,
    store: Arc<Store>,
    _dir: tempfile::TempDir,
}

/// One store for the whole run (opening sled per input would dominate); lines from earlier
/// inputs stay in it, as they would in a long-lived node.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("awp-fuzz-session-")
            .tempdir()
            .unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        Fixture {
            node: Arc::new(Identity::from_seed(&[1; 32])),
            peer: Identity::from_seed(&[2; 32]),
            store,
            _dir: dir,
        }
    })
}

/// Take everything the session wants to write; each line must parse.
fn drain(s: &mut Session) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..100_000 {
        let Some(l) = s.poll_transmit() else { break };
        if let Err(e) = wire::parse_line(&l) {
            panic!(
                "session wrote an invalid line ({e}): {}",
                String::from_utf8_lossy(&l)
            );
        }
        out.push(l);
    }
    while s.poll_event().is_some() {}
    out
}

fn settle(s: &mut Session) {
    if s.wants_flush() {
        s.commit();
        // Durability is not under test here: skip the fsync.
        s.flushed();
    }
    drain(s);
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let now = Instant::now();
    let cfg = SessionConfig {
        dialed: false,
        name: Some("fuzz@target".into()),
        about: None,
        caps: vec![],
        addr: None,
        cert_key: Some(f.peer.key()),
        expected_key: None,
        auth_grants: vec![],
    };
    let mut s = Session::new(cfg, f.node.clone(), f.store.clone(), now);
    let node_hello = drain(&mut s)
        .into_iter()
        .next()
        .expect("hello goes out first");

    // The peer's side of the handshake.
    let hello = Line::Hello(wire::Hello {
        id: "01K00000000000000000000000".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        v: 0,
        key: f.peer.key().to_string(),
        name: Some("fuzz@peer".into()),
        nonce: b64::encode_url(&[9u8; 32]),
        caps: vec!["presence".into()],
        about: None,
        addr: None,
        shares: None,
    })
    .encode();
    s.handle_line(&hello, now);
    let sig = f.peer.sign(&auth_transcript(&hello, &node_hello));
    let auth = Line::Auth(wire::Auth {
        id: "01K00000000000000000000001".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        sig: b64::encode_url(&sig),
        grants: vec![],
    })
    .encode();
    s.handle_line(&auth, now);
    assert_eq!(s.phase(), Phase::Admission, "auth verified, admission pending");
    // The node admits the peer (its policy is not under test here).
    s.admit(now);
    settle(&mut s);
    assert_eq!(s.phase(), Phase::Open, "the handshake must complete");

    let mut t = now;
    for (i, line) in data.split(|&b| b == b'\n').take(1024).enumerate() {
        t += Duration::from_millis(7);
        s.handle_line(line, t);
        if i % 4 == 3 || s.is_closed() {
            settle(&mut s);
        }
        if s.is_closed() {
            break;
        }
    }
    settle(&mut s);
    // Timers far ahead (resume timeout, pings, dead peer), then EOF.
    for step in 1..=4u64 {
        s.handle_timeout(t + Duration::from_secs(40 * step));
        settle(&mut s);
    }
    s.handle_eof();
    settle(&mut s);
    assert!(s.is_closed());
});
