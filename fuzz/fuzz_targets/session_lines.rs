//! Lines from an authenticated peer, fed one by one into a `session::Session` after a
//! completed in-memory handshake, with commit, store flush and flushed after every few
//! lines as the node does. The input is split at `\n`. Nothing may panic, and every line
//! the session writes must be one that parses.
//!
//! The store runs without fsyncs (`shared::NoDurability`) and is replaced by a fresh one
//! every `shared::FRESH_EVERY` inputs.
#![no_main]

#[path = "shared.rs"]
mod shared;

use awp_node::identity::{auth_transcript, Identity};
use awp_node::session::{Phase, Session, SessionConfig};
use awp_node::store::Store;
use awp_node::wire::{self, b64, Line};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Fixture {
    node: Arc<Identity>,
    peer: Identity,
    store: Arc<Store>,
    inputs: u64,
    // Declared after `store`: the directory goes after the database is closed.
    _dir: tempfile::TempDir,
}

fn open() -> (Arc<Store>, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("awp-fuzz-session-")
        .tempdir()
        .unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    store.set_faults(Some(Arc::new(shared::NoDurability)));
    (store, dir)
}

/// One store for many inputs (opening sled per input would dominate); lines from earlier
/// inputs stay in it, as they would in a long-lived node, until it is replaced.
fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| {
        let (store, dir) = open();
        Mutex::new(Fixture {
            node: Arc::new(Identity::from_seed(&[1; 32])),
            peer: Identity::from_seed(&[2; 32]),
            store,
            inputs: 0,
            _dir: dir,
        })
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

fn settle(s: &mut Session, store: &Store) {
    if s.wants_flush() {
        s.commit();
        // As the node's driver does (the flush skips its fsync, see the module doc).
        match store.flush_blocking() {
            Ok(()) => s.flushed(),
            Err(e) => s.flush_failed(&e),
        }
    }
    drain(s);
}

fuzz_target!(|data: &[u8]| {
    let mut f = fixture().lock().unwrap_or_else(|p| p.into_inner());
    f.inputs += 1;
    if f.inputs % shared::FRESH_EVERY == 0 {
        let (store, dir) = open();
        f.store = store;
        f._dir = dir;
    }
    let f = &*f;
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
    assert_eq!(
        s.phase(),
        Phase::Admission,
        "auth verified, admission pending"
    );
    // The node admits the peer (its policy is not under test here).
    s.admit(now);
    settle(&mut s, &f.store);
    assert_eq!(s.phase(), Phase::Open, "the handshake must complete");

    let mut t = now;
    for (i, line) in data.split(|&b| b == b'\n').take(1024).enumerate() {
        t += Duration::from_millis(7);
        s.handle_line(line, t);
        if i % 4 == 3 || s.is_closed() {
            settle(&mut s, &f.store);
        }
        if s.is_closed() {
            break;
        }
    }
    settle(&mut s, &f.store);
    // Timers far ahead (resume timeout, pings, dead peer), then EOF.
    for step in 1..=4u64 {
        s.handle_timeout(t + Duration::from_secs(40 * step));
        settle(&mut s, &f.store);
    }
    s.handle_eof();
    settle(&mut s, &f.store);
    assert!(s.is_closed());
});
