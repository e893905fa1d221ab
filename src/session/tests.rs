//! Two sessions driven over in-memory queues with an explicit clock: no sockets, no sleeps.

use super::*;
use crate::store::Store;
use crate::wire::{Line, Msg, Part, TextPart};
use tempfile::TempDir;

struct End {
    s: Session,
    store: Arc<Store>,
    id: Arc<Identity>,
    _dir: TempDir,
    events: Vec<SessionEvent>,
    sent: Vec<Vec<u8>>,
    /// What [`drain`] answers an `Authenticated` event with: admit (as the node does when
    /// its policy accepts), or leave the decision pending (the test decides).
    admission: Admission,
    /// The clock the session was made with (admission runs at this instant).
    t0: Instant,
}

#[derive(Debug, Clone, PartialEq)]
enum Admission {
    Admit,
    Pending,
}

fn identity(n: u8) -> Arc<Identity> {
    Arc::new(Identity::from_seed(&[n; 32]))
}

fn end(id: Arc<Identity>, dialed: bool, now: Instant) -> End {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let cfg = SessionConfig {
        dialed,
        name: Some(format!("test@{}", if dialed { "a" } else { "b" })),
        about: None,
        caps: vec![],
        addr: None,
        cert_key: None,
        expected_key: None,
        auth_grants: vec![],
    };
    End {
        s: Session::new(cfg, id.clone(), store.clone(), now),
        store,
        id,
        _dir: dir,
        events: vec![],
        sent: vec![],
        admission: Admission::Admit,
        t0: now,
    }
}

fn pair(now: Instant) -> (End, End) {
    (end(identity(1), true, now), end(identity(2), false, now))
}

/// Drain one side: flush when asked, collect events and transmitted lines.
fn drain(e: &mut End) -> Vec<Vec<u8>> {
    if e.s.wants_flush() {
        e.s.commit();
        e.store.flush_blocking().unwrap();
        e.s.flushed();
    }
    while let Some(ev) = e.s.poll_event() {
        let authenticated = matches!(ev, SessionEvent::Authenticated { .. });
        e.events.push(ev);
        if authenticated && e.s.phase() == Phase::Admission {
            match e.admission {
                Admission::Admit => e.s.admit(e.t0),
                Admission::Pending => {}
            }
        }
    }
    if e.s.wants_flush() {
        // Lines held during admission, processed by admit.
        e.s.commit();
        e.store.flush_blocking().unwrap();
        e.s.flushed();
        while let Some(ev) = e.s.poll_event() {
            e.events.push(ev);
        }
    }
    let mut out = vec![];
    while let Some(l) = e.s.poll_transmit() {
        e.sent.push(l.clone());
        out.push(l);
    }
    out
}

/// Move lines both ways until nothing moves (bounded).
fn pump(a: &mut End, b: &mut End, now: Instant) {
    for _ in 0..1000 {
        let ab = drain(a);
        let ba = drain(b);
        if ab.is_empty() && ba.is_empty() && !a.s.wants_flush() && !b.s.wants_flush() {
            return;
        }
        for l in ab {
            b.s.handle_line(&l, now);
        }
        for l in ba {
            a.s.handle_line(&l, now);
        }
    }
    panic!("pump did not settle");
}

fn kinds(lines: &[Vec<u8>]) -> Vec<String> {
    lines
        .iter()
        .map(|l| crate::wire::parse_line(l).unwrap().kind().to_string())
        .collect()
}

fn err_code(line: &[u8]) -> Option<String> {
    match crate::wire::parse_line(line).unwrap() {
        Line::Err(e) => Some(e.code),
        _ => None,
    }
}

fn queue_msg(e: &End, to: PeerKey, th: &str, text: &str) -> String {
    let th = th.to_string();
    let text = text.to_string();
    let build = move |id: &str, ts: &str| {
        Line::Msg(Msg {
            id: id.into(),
            ts: ts.into(),
            th: th.clone(),
            re: None,
            subject: Some("s".into()),
            parts: vec![Part::Text(TextPart { text: text.clone() })],
        })
    };
    let q = e.store.enqueue(&to, &[&build]).unwrap();
    e.store.flush_blocking().unwrap();
    q[0].id.clone()
}

fn received(e: &End) -> Vec<String> {
    e.events
        .iter()
        .filter_map(|ev| match ev {
            SessionEvent::Received { line, .. } => line.id().map(str::to_string),
            _ => None,
        })
        .collect()
}

fn acked(e: &End) -> Vec<String> {
    e.events
        .iter()
        .filter_map(|ev| match ev {
            SessionEvent::Acked { re, .. } => Some(re.clone()),
            _ => None,
        })
        .collect()
}

fn raw(line: &str) -> Vec<u8> {
    line.as_bytes().to_vec()
}

/// Feed b's hello to a fresh `a` and return what `a` sends back after its own hello.
fn hello_exchange(a: &mut End, b: &mut End, now: Instant) {
    let bh = b.s.my_hello().to_vec();
    drain(a);
    a.s.handle_line(&bh, now);
}

#[test]
fn handshake_opens_both_sides_and_sends_resume() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    assert_eq!(a.s.phase(), Phase::Open);
    assert_eq!(b.s.phase(), Phase::Open);
    assert_eq!(a.s.peer(), Some(b.id.key()));
    assert_eq!(b.s.peer(), Some(a.id.key()));
    assert_eq!(kinds(&a.sent)[..3], ["hello", "auth", "resume"]);
    assert!(a
        .events
        .iter()
        .any(|e| matches!(e, SessionEvent::Authenticated { key, .. } if *key == b.id.key())));
    assert!(
        a.events.contains(&SessionEvent::Up),
        "resume counts as the first line after auth"
    );
}

#[test]
fn msg_is_acked_only_after_flush_and_delivered_once() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let id = queue_msg(&a, b.id.key(), "thr_1", "hello");
    a.s.outbox_changed();
    let lines = drain(&mut a);
    assert_eq!(kinds(&lines), ["msg"]);
    b.s.handle_line(&lines[0], now);
    // Not yet durable: no ack may go out.
    assert!(b.s.wants_flush());
    assert!(b.s.poll_transmit().is_none());
    b.s.commit();
    assert!(
        b.s.poll_transmit().is_none(),
        "stored but not yet durable: still no ack"
    );
    b.store.flush_blocking().unwrap();
    b.s.flushed();
    let out = drain(&mut b);
    assert_eq!(kinds(&out), ["ack"]);
    // Same msg again (a replay): re-acked, not delivered again.
    b.s.handle_line(&lines[0], now);
    let again = drain(&mut b);
    assert_eq!(kinds(&again), ["ack"]);
    assert_eq!(received(&b), vec![id.clone()]);
    for l in out.iter().chain(again.iter()) {
        a.s.handle_line(l, now);
    }
    drain(&mut a);
    assert_eq!(acked(&a)[0], id);
    assert_eq!(a.store.outbox_len(&b.id.key()).unwrap(), 0);
}

#[test]
fn resume_drops_what_the_peer_has_seen_and_replays_the_rest_in_order() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let ids: Vec<String> = (0..3)
        .map(|i| queue_msg(&a, b.id.key(), "thr_r", &format!("m{i}")))
        .collect();
    // b already holds the first two (received on an earlier connection).
    for id in &ids[..2] {
        let line = Line::Msg(Msg {
            id: id.clone(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: "thr_r".into(),
            re: None,
            subject: None,
            parts: vec![],
        });
        b.store.receive(&a.id.key(), &line, &line.encode()).unwrap();
    }
    b.store.flush_blocking().unwrap();
    pump(&mut a, &mut b, now);
    let msgs: Vec<String> = a
        .sent
        .iter()
        .filter_map(|l| match crate::wire::parse_line(l).unwrap() {
            Line::Msg(m) => Some(m.id),
            _ => None,
        })
        .collect();
    assert_eq!(
        msgs,
        vec![ids[2].clone()],
        "only the unseen line is replayed"
    );
    assert_eq!(a.store.outbox_len(&b.id.key()).unwrap(), 0);
}

#[test]
fn replay_starts_without_resume_after_15s() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let id = queue_msg(&a, b.id.key(), "thr_t", "x");
    // Run the handshake but drop b's resume on the floor.
    for _ in 0..3 {
        let a_out = drain(&mut a);
        for l in drain(&mut b) {
            if crate::wire::parse_line(&l).unwrap().kind() != "resume" {
                a.s.handle_line(&l, now);
            }
        }
        for l in &a_out {
            b.s.handle_line(l, now);
        }
    }
    assert_eq!(a.s.phase(), Phase::Open);
    assert!(drain(&mut a)
        .iter()
        .all(|l| crate::wire::parse_line(l).unwrap().kind() != "msg"));
    a.s.handle_timeout(now + Duration::from_secs(14));
    assert!(drain(&mut a).is_empty());
    a.s.handle_timeout(now + RESUME_TIMEOUT);
    let out = drain(&mut a);
    assert_eq!(kinds(&out), ["msg"]);
    assert_eq!(
        crate::wire::parse_line(&out[0]).unwrap().id(),
        Some(id.as_str())
    );
}

#[test]
fn version_mismatch_gets_err_version_and_no_auth() {
    let now = Instant::now();
    let (mut a, b) = pair(now);
    let hello = String::from_utf8(b.s.my_hello().to_vec())
        .unwrap()
        .replace("\"v\":0", "\"v\":1");
    drain(&mut a);
    a.s.handle_line(&raw(&hello), now);
    let out = drain(&mut a);
    assert_eq!(out.len(), 1);
    assert_eq!(err_code(&out[0]).as_deref(), Some("version"));
    assert!(a.s.is_closed());
}

#[test]
fn own_key_in_hello_is_refused() {
    let now = Instant::now();
    let mut a = end(identity(1), true, now);
    let mirror = end(identity(1), false, now);
    drain(&mut a);
    a.s.handle_line(mirror.s.my_hello(), now);
    let out = drain(&mut a);
    assert_eq!(err_code(&out[0]).as_deref(), Some("auth"));
    assert!(a.s.is_closed());
}

#[test]
fn cert_key_must_match_hello_key() {
    let now = Instant::now();
    let (mut a, b) = pair(now);
    a.s.cfg.cert_key = Some(identity(3).key());
    drain(&mut a);
    a.s.handle_line(b.s.my_hello(), now);
    let out = drain(&mut a);
    assert_eq!(err_code(&out[0]).as_deref(), Some("auth"));
}

#[test]
fn second_line_must_be_auth() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    hello_exchange(&mut a, &mut b, now);
    drain(&mut a);
    let msg = r#"{"t":"msg","id":"01K00000000000000000000009","ts":"2026-01-01T00:00:00.000Z","th":"x","parts":[]}"#;
    a.s.handle_line(&raw(msg), now);
    let out = drain(&mut a);
    assert_eq!(err_code(&out[0]).as_deref(), Some("auth"));
    assert!(a.s.is_closed());
}

#[test]
fn flipped_signature_bit_is_refused_without_resume() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    hello_exchange(&mut a, &mut b, now);
    hello_exchange(&mut b, &mut a, now);
    drain(&mut a);
    let b_out = drain(&mut b);
    let auth = b_out
        .iter()
        .find(|l| crate::wire::parse_line(l).unwrap().kind() == "auth")
        .unwrap();
    let Line::Auth(mut auth) = crate::wire::parse_line(auth).unwrap() else {
        unreachable!()
    };
    let mut sig = crate::wire::b64::decode_any(&auth.sig).unwrap();
    sig[10] ^= 0x01;
    auth.sig = crate::wire::b64::encode_url(&sig);
    a.s.handle_line(&Line::Auth(auth).encode(), now);
    let out = drain(&mut a);
    assert_eq!(kinds(&out), ["err"]);
    assert_eq!(err_code(&out[0]).as_deref(), Some("auth"));
    assert!(a.s.is_closed());
}

#[test]
fn bad_frame_closes_with_the_id_when_readable() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    a.s.handle_line(
        br#"{"t":"msg","id":"m1","ts":"2026-01-01T00:00:00Z","th":"x"}"#,
        now,
    );
    let out = drain(&mut a);
    let Line::Err(e) = crate::wire::parse_line(&out[0]).unwrap() else {
        panic!()
    };
    assert_eq!(e.code, "bad_frame");
    assert_eq!(e.re.as_deref(), Some("m1"));
    assert!(a.s.is_closed());
}

#[test]
fn unknown_type_is_ignored_and_ping_gets_pong() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    a.s.handle_line(
        br#"{"t":"frobnicate","id":"x1","ts":"2026-01-01T00:00:00Z"}"#,
        now,
    );
    a.s.handle_line(
        br#"{"t":"ping","id":"p1","ts":"2026-01-01T00:00:00Z"}"#,
        now,
    );
    let out = drain(&mut a);
    assert_eq!(kinds(&out), ["pong"]);
    let Line::Pong(p) = crate::wire::parse_line(&out[0]).unwrap() else {
        panic!()
    };
    assert_eq!(p.re, "p1");
}

#[test]
fn non_closing_errs_keep_the_connection_open() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    for code in [
        "unsupported",
        "forbidden",
        "internal",
        "blob_refused",
        "some_future_code",
    ] {
        let l =
            format!(r#"{{"t":"err","id":"e-{code}","ts":"2026-01-01T00:00:00Z","code":"{code}"}}"#);
        a.s.handle_line(l.as_bytes(), now);
        assert_eq!(a.s.phase(), Phase::Open, "{code} must not close");
    }
    a.s.handle_line(
        br#"{"t":"err","id":"e9","ts":"2026-01-01T00:00:00Z","code":"auth"}"#,
        now,
    );
    assert!(a.s.is_closed());
}

#[test]
fn ping_after_idle_and_dead_after_two_missed_pongs() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    assert_eq!(a.s.poll_timeout(), Some(now + PING_IDLE));
    let t1 = now + PING_IDLE;
    a.s.handle_timeout(t1);
    assert_eq!(kinds(&drain(&mut a)), ["ping"]);
    let t2 = t1 + PING_IDLE;
    a.s.handle_timeout(t2);
    assert_eq!(kinds(&drain(&mut a)), ["ping"]);
    assert_eq!(a.s.phase(), Phase::Open);
    a.s.handle_timeout(t2 + PING_IDLE);
    assert!(a.s.is_closed());
    assert_eq!(a.s.close_reason(), Some(&CloseReason::Dead));
}

#[test]
fn any_inbound_line_resets_the_ping_timer() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let t = now + Duration::from_secs(29);
    a.s.handle_line(
        br#"{"t":"pong","id":"q","ts":"2026-01-01T00:00:00Z","re":"zz"}"#,
        t,
    );
    a.s.handle_timeout(now + PING_IDLE);
    assert!(drain(&mut a).is_empty(), "no ping 1 s after traffic");
    assert_eq!(a.s.poll_timeout(), Some(t + PING_IDLE));
}

#[test]
fn bye_is_answered_with_bye_and_parks_the_peer() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    a.store.peer_seen(&b.id.key(), None, None, &[], 1).unwrap();
    a.s.handle_line(
        br#"{"t":"bye","id":"b1","ts":"2026-01-01T00:00:00Z","reason":"done"}"#,
        now,
    );
    let out = drain(&mut a);
    assert_eq!(kinds(&out), ["bye"]);
    let Line::Bye(bye) = crate::wire::parse_line(&out[0]).unwrap() else {
        panic!()
    };
    assert_eq!(bye.re.as_deref(), Some("b1"));
    assert!(a.s.is_closed());
    assert!(a.store.peer(&b.id.key()).unwrap().unwrap().parked);
}

#[test]
fn local_bye_waits_for_the_peers_bye_then_closes() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    a.s.close_local("shutdown", true, now);
    assert_eq!(a.s.phase(), Phase::Closing);
    pump(&mut a, &mut b, now);
    assert!(a.s.is_closed());
    assert!(b.s.is_closed());
    assert!(matches!(a.s.close_reason(), Some(CloseReason::Bye { .. })));
}

#[test]
fn local_bye_gives_up_after_5s() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    a.s.close_local("shutdown", true, now);
    drain(&mut a);
    a.s.handle_timeout(now + Duration::from_secs(4));
    assert_eq!(a.s.phase(), Phase::Closing);
    a.s.handle_timeout(now + BYE_LINGER);
    assert!(a.s.is_closed());
}

#[test]
fn messages_queued_in_both_directions_cross_on_resume() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let x = queue_msg(&a, b.id.key(), "thr_ab", "from a");
    let y = queue_msg(&b, a.id.key(), "thr_ba", "from b");
    pump(&mut a, &mut b, now);
    assert_eq!(received(&b), vec![x.clone()]);
    assert_eq!(received(&a), vec![y.clone()]);
    assert_eq!(acked(&a), vec![x]);
    assert_eq!(acked(&b), vec![y]);
}

#[test]
fn a_batch_is_one_commit_with_dedup_inside_it_and_raw_bytes_kept() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let m1 = br#"{"t":"msg","id":"01K00000000000000000000021","ts":"2026-01-01T00:00:00Z","th":"t","parts":[],"x-priority":"high"}"#;
    let m2 = br#"{"t":"msg","id":"01K00000000000000000000022","ts":"2026-01-01T00:00:00Z","th":"t","parts":[]}"#;
    for l in [&m1[..], &m2[..], &m1[..]] {
        b.s.handle_line(l, now);
    }
    assert!(b.s.pending_bytes() >= m1.len() * 2 + m2.len());
    let flushes = b.store.flush_count();
    let out = drain(&mut b);
    assert_eq!(
        b.store.flush_count(),
        flushes + 1,
        "one fsync for the batch"
    );
    assert_eq!(
        kinds(&out),
        ["ack", "ack", "ack"],
        "the duplicate is acked too"
    );
    assert_eq!(received(&b).len(), 2, "delivered once each");
    let log = b.store.log(0, Some("t"), false, 10).unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(
        log[0].line,
        m1.to_vec(),
        "inbound lines are kept as received"
    );
}

#[test]
fn lines_before_a_bad_frame_are_stored_but_not_acked() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    b.s.handle_line(br#"{"t":"msg","id":"01K00000000000000000000031","ts":"2026-01-01T00:00:00Z","th":"t","parts":[]}"#, now);
    b.s.handle_line(b"[1,2,3]", now);
    let out = drain(&mut b);
    assert_eq!(
        kinds(&out),
        ["err"],
        "nothing after the closing err, no ack"
    );
    assert_eq!(received(&b).len(), 1, "the msg is on disk and reported");
}

// ---------------------------------------------------------------------------------------
// Admission is part of the handshake: nothing a peer sends after its auth is stored, acted
// on or answered before the node decided to admit it.

/// Every kind of line a peer may pipeline behind its auth, in one write, with what the
/// session does with it once the peer is admitted (the `t` of its answer, or the kind of
/// event it produces). Keys and signatures need not verify here: the session hands grants,
/// introductions and presence to the node, which checks them.
fn pipelined_lines() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("msg", br#"{"t":"msg","id":"01K00000000000000000000101","ts":"2026-01-01T00:00:00Z","th":"thr_p","subject":"pipelined","parts":[{"k":"text","text":"hi"}]}"#),
        ("state", br#"{"t":"state","id":"01K00000000000000000000102","ts":"2026-01-01T00:00:00Z","th":"thr_p","state":"working"}"#),
        ("chunk", br#"{"t":"chunk","id":"01K00000000000000000000103","ts":"2026-01-01T00:00:00Z","th":"thr_p","ref":"r1","n":0,"last":true,"data":"aGk="}"#),
        ("blob msg", br#"{"t":"msg","id":"01K00000000000000000000104","ts":"2026-01-01T00:00:00Z","th":"thr_p","parts":[{"k":"blob","ref":"r1","size":2,"name":"f.txt","mime":"text/plain"}]}"#),
        ("grant", br#"{"t":"grant","id":"01K00000000000000000000105","ts":"2026-01-01T00:00:00Z","grant":{"iss":"ed25519:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI","sub":"ed25519:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI","caps":["exec"],"exp":"2099-01-01T00:00:00Z","nonce":"AAAA","sig":"AAAA"}}"#),
        ("introduce", br#"{"t":"introduce","id":"01K00000000000000000000106","ts":"2026-01-01T00:00:00Z","peer":{"key":"ed25519:AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM","name":"bob","address":"tls:10.0.0.1:7700"}}"#),
        ("presence", br#"{"t":"presence","id":"01K00000000000000000000107","ts":"2026-01-01T00:00:00Z","doc":{"origin":"ed25519:AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM","seq":1,"ts":"2026-01-01T00:00:00Z","sig":"AAAA"},"hops":0}"#),
        ("ack", br#"{"t":"ack","id":"01K00000000000000000000108","ts":"2026-01-01T00:00:00Z","th":"thr_out","re":"01K00000000000000000000001"}"#),
        ("resume", br#"{"t":"resume","id":"01K00000000000000000000109","ts":"2026-01-01T00:00:00Z","seen":{}}"#),
        ("ping", br#"{"t":"ping","id":"01K00000000000000000000110","ts":"2026-01-01T00:00:00Z"}"#),
    ]
}

/// `b` (accepting, with a blob receiver) gets a's hello, then a's auth followed by every
/// line of [`pipelined_lines`] in one batch, as a pipelining peer's single write arrives.
/// Returns what b wrote after its own hello and auth, with b left in admission.
fn pipelined_into(a: &mut End, b: &mut End, now: Instant) -> Vec<Vec<u8>> {
    b.admission = Admission::Pending;
    let blob_dir = b._dir.path().join("blobs");
    b.s.set_blob_receiver(crate::blob::BlobReceiver::new(
        b.store.clone(),
        blob_dir,
        1 << 20,
    ));
    // Hellos both ways, then a's auth.
    let bh = drain(b);
    let ah = drain(a);
    b.s.handle_line(&ah[0], now);
    for l in &bh {
        a.s.handle_line(l, now);
    }
    let a_auth = drain(a)
        .into_iter()
        .find(|l| kinds(std::slice::from_ref(l)) == ["auth"])
        .expect("a's auth");
    b.s.handle_line(&a_auth, now);
    for (_, line) in pipelined_lines() {
        b.s.handle_line(line, now);
    }
    b.s.handle_eof();
    drain(b)
}

fn stored_nothing(e: &End) -> Result<(), String> {
    let threads = e.store.threads().unwrap();
    let log = e.store.log(0, None, false, 100).unwrap();
    let blob_files = std::fs::read_dir(e._dir.path().join("blobs"))
        .map(|d| d.count())
        .unwrap_or(0);
    let acted: Vec<&SessionEvent> = e
        .events
        .iter()
        .filter(|ev| {
            !matches!(
                ev,
                SessionEvent::Authenticated { .. } | SessionEvent::Closed(_)
            )
        })
        .collect();
    if threads.is_empty() && log.is_empty() && blob_files == 0 && acted.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "threads {threads:?}, log entries {}, blob files {blob_files}, events {acted:?}",
            log.len()
        ))
    }
}

#[test]
fn lines_pipelined_behind_auth_wait_for_the_admission_decision() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let out = pipelined_into(&mut a, &mut b, now);
    assert_eq!(b.s.phase(), Phase::Admission);
    assert!(
        b.s.backlogged(),
        "the driver stops reading during admission"
    );
    assert_eq!(
        kinds(&out),
        ["auth"],
        "no resume, ack, pong or err before admission (only our own auth)"
    );
    assert!(!b.s.wants_flush());
    stored_nothing(&b).unwrap();
    assert_eq!(b.s.poll_timeout(), None);
}

#[test]
fn a_refused_peer_leaves_nothing_of_what_it_pipelined() {
    // One row per kind of line: each alone behind the auth, then refused.
    for (kind, line) in pipelined_lines() {
        let now = Instant::now();
        let (mut a, mut b) = pair(now);
        b.admission = Admission::Pending;
        let bh = drain(&mut b);
        let ah = drain(&mut a);
        b.s.handle_line(&ah[0], now);
        for l in &bh {
            a.s.handle_line(l, now);
        }
        let a_auth = drain(&mut a).pop().unwrap();
        b.s.handle_line(&a_auth, now);
        b.s.handle_line(line, now);
        drain(&mut b);
        b.s.refuse("not allowed here");
        let out = drain(&mut b);
        assert_eq!(kinds(&out), ["err"], "{kind}: only the refusal goes out");
        assert_eq!(err_code(&out[0]).as_deref(), Some("auth"), "{kind}");
        assert!(b.s.is_closed(), "{kind}");
        if let Err(e) = stored_nothing(&b) {
            panic!("{kind}: refused peer left {e}");
        }
    }
    // And all of them in one write.
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pipelined_into(&mut a, &mut b, now);
    b.s.refuse("not allowed here");
    let out = drain(&mut b);
    assert_eq!(kinds(&out), ["err"]);
    stored_nothing(&b).unwrap();
    // Lines arriving after the refusal are ignored too.
    b.s.handle_line(pipelined_lines()[0].1, now);
    drain(&mut b);
    stored_nothing(&b).unwrap();
}

#[test]
fn an_admitted_peer_that_pipelines_gets_everything_processed_in_order() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pipelined_into(&mut a, &mut b, now);
    b.s.admit(now);
    assert_eq!(b.s.phase(), Phase::Closed, "the held EOF comes last");
    let out = drain(&mut b);
    assert_eq!(
        kinds(&out),
        ["resume", "pong"],
        "resume first, then the pong; the held EOF ended the session before the acks"
    );
    // Stored and reported: msg, state, blob msg (the blob is complete too).
    let ids = received(&b);
    assert_eq!(
        ids,
        [
            "01K00000000000000000000101",
            "01K00000000000000000000102",
            "01K00000000000000000000104"
        ]
    );
    assert_eq!(b.store.threads().unwrap().len(), 1);
    let has = |f: &dyn Fn(&SessionEvent) -> bool| b.events.iter().any(f);
    assert!(has(&|e| matches!(e, SessionEvent::Grants(_))), "grant");
    assert!(
        has(&|e| matches!(e, SessionEvent::Other(Line::Introduce(_)))),
        "introduce"
    );
    assert!(
        has(&|e| matches!(e, SessionEvent::Other(Line::Presence(_)))),
        "presence"
    );
    assert!(has(&|e| matches!(e, SessionEvent::BlobReceived(_))), "blob");
    assert!(has(&|e| matches!(e, SessionEvent::Up)), "up");
}

#[test]
fn an_admitted_peer_that_pipelines_is_acked_and_answered() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    b.admission = Admission::Pending;
    let bh = drain(&mut b);
    let ah = drain(&mut a);
    b.s.handle_line(&ah[0], now);
    for l in &bh {
        a.s.handle_line(l, now);
    }
    let a_auth = drain(&mut a).pop().unwrap();
    b.s.handle_line(&a_auth, now);
    for (_, line) in pipelined_lines() {
        b.s.handle_line(line, now);
    }
    assert_eq!(kinds(&drain(&mut b)), ["auth"]);
    b.s.admit(now);
    let out = drain(&mut b);
    let k = kinds(&out);
    assert_eq!(k[0], "resume", "{k:?}");
    assert_eq!(k.iter().filter(|k| *k == "ack").count(), 3, "{k:?}");
    assert!(k.contains(&"pong".to_string()), "{k:?}");
    assert_eq!(b.s.phase(), Phase::Open);
}

#[test]
fn too_much_input_before_admission_is_refused() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    b.admission = Admission::Pending;
    let bh = drain(&mut b);
    let ah = drain(&mut a);
    b.s.handle_line(&ah[0], now);
    for l in &bh {
        a.s.handle_line(l, now);
    }
    let a_auth = drain(&mut a).pop().unwrap();
    b.s.handle_line(&a_auth, now);
    let ping = pipelined_lines().last().unwrap().1;
    for _ in 0..=ADMISSION_HOLD_LINES {
        b.s.handle_line(ping, now);
    }
    assert!(b.s.is_closed());
    let out = drain(&mut b);
    assert_eq!(err_code(out.last().unwrap()).as_deref(), Some("auth"));
    b.s.admit(now);
    assert!(b.s.is_closed(), "admit after a refusal does nothing");
}

#[test]
fn a_session_closed_during_admission_never_reads_what_it_held() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pipelined_into(&mut a, &mut b, now);
    // E.g. a simultaneous open decided against this connection, or a handshake timeout.
    b.s.close_local("simultaneous open", false, now);
    b.s.admit(now);
    drain(&mut b);
    assert!(b.s.is_closed());
    stored_nothing(&b).unwrap();
}

#[test]
fn lines_fed_while_a_flush_runs_are_acked_only_after_their_own_flush() {
    // The connection keeps reading while the flush of the last commit runs: a line fed
    // then is not in that flush, so its ack waits for the next commit and flush, and the
    // session still asks for that flush once the first one completed.
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let first = queue_msg(&a, b.id.key(), "thr_o", "one");
    let second = queue_msg(&a, b.id.key(), "thr_o", "two");
    a.s.outbox_changed();
    let lines = drain(&mut a);
    assert_eq!(kinds(&lines), ["msg", "msg"]);
    b.s.handle_line(&lines[0], now);
    b.s.commit();
    // The flush of `first` is running; `second` arrives meanwhile.
    b.s.handle_line(&lines[1], now);
    b.store.flush_blocking().unwrap();
    b.s.flushed();
    let out = drain_transmit(&mut b);
    assert_eq!(kinds(&out), ["ack"]);
    assert!(String::from_utf8_lossy(&out[0]).contains(&first));
    assert!(
        b.s.wants_flush(),
        "the line fed during the flush still needs its own commit and flush"
    );
    b.s.commit();
    assert!(drain_transmit(&mut b).is_empty(), "not durable yet: no ack");
    b.store.flush_blocking().unwrap();
    b.s.flushed();
    let out = drain_transmit(&mut b);
    assert_eq!(kinds(&out), ["ack"]);
    assert!(String::from_utf8_lossy(&out[0]).contains(&second));
    assert!(!b.s.wants_flush());
}

/// Pings read while a flush runs are answered behind that flush's acks (held): they count
/// toward the control high-water mark, so the driver stops reading instead of holding
/// an unbounded number of pongs for as long as the flush takes.
#[test]
fn pongs_held_behind_a_running_flush_stop_the_reading() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    queue_msg(&a, b.id.key(), "thr_p", "one");
    a.s.outbox_changed();
    let lines = drain(&mut a);
    b.s.handle_line(&lines[0], now);
    b.s.commit();
    // The flush runs; the peer sends pings meanwhile.
    let mut n = 0;
    while !b.s.backlogged() && n <= CONTROL_HIGH_WATER {
        let ping = Line::Ping(wire::Ping {
            id: format!("p{n}"),
            ts: now_ts(),
        })
        .encode();
        b.s.handle_line(&ping, now);
        n += 1;
    }
    assert!(
        b.s.backlogged(),
        "{n} pongs held behind the flush and still reading"
    );
    b.store.flush_blocking().unwrap();
    b.s.flushed();
    let out = drain_transmit(&mut b);
    assert_eq!(kinds(&out[..1]), ["ack"], "the ack goes first");
    assert!(kinds(&out[1..]).iter().all(|k| k == "pong"));
    assert_eq!(out.len(), n + 1, "every ping answered");
}

/// What the session would write now, without committing or flushing anything.
fn drain_transmit(e: &mut End) -> Vec<Vec<u8>> {
    let mut out = vec![];
    while let Some(l) = e.s.poll_transmit() {
        out.push(l);
    }
    out
}

/// A msg line from `from` in `th`, signed by it when `sign` (as a signing peer sends it).
fn peer_msg(from: &Identity, id: &str, th: &str, text: &str, sign: bool) -> Vec<u8> {
    let line = Line::Msg(Msg {
        id: id.into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: th.into(),
        re: None,
        subject: None,
        parts: vec![Part::Text(TextPart { text: text.into() })],
    })
    .encode();
    if sign {
        crate::wire::sig::sign_encoded(from, &line).unwrap()
    } else {
        line
    }
}

fn ack_line(id: &str, th: &str, re: &str) -> Vec<u8> {
    Line::Ack(crate::wire::Ack {
        id: id.into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: th.into(),
        re: re.into(),
    })
    .encode()
}

#[test]
fn acks_and_lines_of_one_batch_are_stored_in_one_transaction() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let ours: Vec<String> = (0..3)
        .map(|i| queue_msg(&a, b.id.key(), "thr_x", &format!("m{i}")))
        .collect();
    assert_eq!(a.store.outbox_len(&b.id.key()).unwrap(), 3);
    let before = a.store.transaction_count();
    // One read batch: the peer's acks of our three lines and two lines of its own.
    for (i, re) in ours.iter().enumerate() {
        a.s.handle_line(&ack_line(&format!("01K5{i:022}"), "thr_x", re), now);
    }
    for i in 0..2 {
        let id = format!("01K6{i:022}");
        a.s.handle_line(&peer_msg(&b.id, &id, "thr_y", "hi", false), now);
    }
    assert!(a.s.wants_flush());
    a.s.commit();
    assert_eq!(
        a.store.transaction_count() - before,
        1,
        "three acks and two lines: one transaction"
    );
    assert_eq!(a.store.outbox_len(&b.id.key()).unwrap(), 0);
    let out = drain(&mut a);
    assert_eq!(kinds(&out), ["ack", "ack"]);
    assert_eq!(acked(&a), ours);

    // Acks alone (no line to commit them with): one transaction for the read batch too.
    let more: Vec<String> = (0..3)
        .map(|i| queue_msg(&a, b.id.key(), "thr_x", &format!("n{i}")))
        .collect();
    let before = a.store.transaction_count();
    for (i, re) in more.iter().enumerate() {
        a.s.handle_line(&ack_line(&format!("01K7{i:022}"), "thr_x", re), now);
    }
    drain(&mut a);
    assert_eq!(a.store.transaction_count() - before, 1);
    assert_eq!(a.store.outbox_len(&b.id.key()).unwrap(), 0);
    assert_eq!(acked(&a)[3..], more[..]);
}

/// A session `a` whose peer `b` announces `signed-lines` (so `a` verifies b's lines).
fn signing_pair(now: Instant) -> (End, End) {
    let a = end(identity(1), true, now);
    let mut b = end(identity(2), false, now);
    b.s = Session::new(
        SessionConfig {
            caps: vec![crate::wire::sig::CAP.into()],
            ..b.s.cfg.clone()
        },
        b.id.clone(),
        b.store.clone(),
        now,
    );
    (a, b)
}

#[test]
fn signed_lines_of_a_batch_verify_together_and_a_bad_one_is_refused_alone() {
    let now = Instant::now();
    let (mut a, mut b) = signing_pair(now);
    pump(&mut a, &mut b, now);
    assert_eq!(a.s.phase(), Phase::Open);
    let peer = b.id.key();
    // More lines than one verify_batch call takes: all verify, all stored and acked.
    let n = crate::wire::sig::BATCH_MAX + 3;
    let ids: Vec<String> = (0..n).map(|i| format!("01K1{i:022}")).collect();
    for id in &ids {
        a.s.handle_line(&peer_msg(&b.id, id, "thr_s", "fine", true), now);
    }
    let out = drain(&mut a);
    assert_eq!(out.len(), n);
    assert!(kinds(&out).iter().all(|k| k == "ack"));
    assert!(!a.s.is_closed());

    // One read batch of four signed lines; the third was altered after signing.
    let ids: Vec<String> = (0..4).map(|i| format!("01K2{i:022}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let mut line = peer_msg(&b.id, id, "thr_s", "text", true);
        if i == 2 {
            let at = line.windows(4).position(|w| w == b"text").unwrap();
            line[at] = b'T';
        }
        a.s.handle_line(&line, now);
    }
    let out = drain(&mut a);
    // Refused alone: err auth naming the bad line; the lines before it are stored (not
    // acked, the connection is closed), it and the line after it are not.
    assert_eq!(kinds(&out), ["err"]);
    let Line::Err(e) = crate::wire::parse_line(&out[0]).unwrap() else {
        unreachable!()
    };
    assert_eq!(e.code, "auth");
    assert_eq!(e.re.as_deref(), Some(ids[2].as_str()));
    assert!(a.s.is_closed());
    for (i, id) in ids.iter().enumerate() {
        let stored = a.store.received_line(&peer, id).unwrap().is_some();
        assert_eq!(stored, i < 2, "line {i}");
    }
}

#[test]
fn unsigned_line_from_a_signing_peer_is_refused_on_arrival() {
    let now = Instant::now();
    let (mut a, mut b) = signing_pair(now);
    pump(&mut a, &mut b, now);
    let id = "01K3000000000000000000000A";
    a.s.handle_line(&peer_msg(&b.id, id, "thr_s", "x", false), now);
    assert!(a.s.is_closed(), "no sig: refused before any commit");
    let out = drain(&mut a);
    assert_eq!(err_code(&out[0]).as_deref(), Some("auth"));
    assert_eq!(a.store.received_line(&b.id.key(), id).unwrap(), None);
}

/// A chunk line of blob `r` in `th`, signed by `from` when `sign`.
fn chunk_line(
    from: &Identity,
    id: &str,
    r: &str,
    n: u64,
    last: bool,
    data: &[u8],
    sign: bool,
) -> Vec<u8> {
    let line = Line::Chunk(crate::wire::Chunk {
        id: id.into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: Some("thr_blob".into()),
        blob_ref: r.into(),
        n,
        last,
        data: crate::wire::b64::encode_std(data),
    })
    .encode();
    if sign {
        crate::wire::sig::sign_encoded(from, &line).unwrap()
    } else {
        line
    }
}

/// The msg naming blob `r` of `size` bytes.
fn blob_msg(id: &str, r: &str, size: u64) -> Vec<u8> {
    format!(
        r#"{{"t":"msg","id":"{id}","ts":"2026-01-01T00:00:00Z","th":"thr_blob","parts":[{{"k":"blob","ref":"{r}","size":{size},"name":"f.bin"}}]}}"#
    )
    .into_bytes()
}

fn with_blobs(e: &mut End) -> std::path::PathBuf {
    let root = e._dir.path().join("blobs");
    e.s.set_blob_receiver(crate::blob::BlobReceiver::new(
        e.store.clone(),
        root.clone(),
        1 << 20,
    ));
    root
}

#[test]
fn chunks_read_while_a_blob_fsync_runs_are_written_then_and_recorded_after_the_next() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let root = with_blobs(&mut a);
    let peer = b.id.key();
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
    let partial = crate::blob::partial_path(&crate::blob::peer_dir(&root, &peer), "r1");
    feed_chunk(&mut a, &b.id, "r1", 0, false, &data[..2000], now);
    let job = a.s.commit_start().expect("blob data to fsync");
    // Read while that fsync runs: the last chunk and the msg naming the blob.
    feed_chunk(&mut a, &b.id, "r1", 1, true, &data[2000..], now);
    let msg_id = "01K40000000000000000000003";
    a.s.handle_line(&blob_msg(msg_id, "r1", 5000), now);
    a.s.prewrite_blobs();
    assert_eq!(
        std::fs::read(&partial).unwrap(),
        data,
        "the chunk is written while the fsync runs"
    );
    assert!(
        a.store.blob_in(&peer, "r1").unwrap().is_none(),
        "nothing recorded before the fsync"
    );
    job.run().unwrap();
    a.s.commit_synced(Ok(()));
    let st = a.store.blob_in(&peer, "r1").unwrap().unwrap();
    assert_eq!(
        (st.offset, st.next_n),
        (2000, 1),
        "only the synced chunk is recorded"
    );
    a.store.flush_blocking().unwrap();
    a.s.flushed();
    assert!(drain_transmit(&mut a).is_empty(), "chunks are not acked");
    assert!(
        a.s.wants_flush(),
        "the chunk written early still needs its commit"
    );
    // The next commit syncs and records it, stores the msg, and acks it after the flush.
    let out = drain(&mut a);
    assert_eq!(kinds(&out), ["ack"]);
    assert!(String::from_utf8_lossy(&out[0]).contains(msg_id));
    let done: Vec<_> = a
        .events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::BlobReceived(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(std::fs::read(&done[0].path).unwrap(), data);
    assert_eq!(
        done[0].sha256,
        crate::blob::hex(&<sha2::Sha256 as sha2::Digest>::digest(&data))
    );
    assert!(!a.s.wants_flush());
}

#[test]
fn a_chunk_behind_a_signed_line_is_not_written_before_that_line_is_checked() {
    // Chunks are not a signed kind, but one read behind a signed msg waits for the msg's
    // check (made at the commit): when it fails, the lines after it are never taken.
    let now = Instant::now();
    let (mut a, mut b) = signing_pair(now);
    pump(&mut a, &mut b, now);
    let root = with_blobs(&mut a);
    let peer = b.id.key();
    let partial = crate::blob::partial_path(&crate::blob::peer_dir(&root, &peer), "r1");
    feed_chunk(&mut a, &b.id, "r1", 0, false, b"abc", now);
    let job = a.s.commit_start().expect("blob data to fsync");
    // Altered after signing.
    let mut bad = peer_msg(
        &b.id,
        "01K50000000000000000000002",
        "thr_blob",
        "text",
        true,
    );
    let at = bad.windows(4).position(|w| w == b"text").unwrap();
    bad[at] = b'T';
    a.s.handle_line(&bad, now);
    feed_chunk(&mut a, &b.id, "r1", 1, true, b"def", now);
    a.s.prewrite_blobs();
    assert_eq!(
        std::fs::read(&partial).unwrap(),
        b"abc",
        "nothing written before the check"
    );
    job.run().unwrap();
    a.s.commit_synced(Ok(()));
    a.store.flush_blocking().unwrap();
    a.s.flushed();
    let out = drain(&mut a);
    assert_eq!(err_code(&out[0]).as_deref(), Some("auth"));
    assert!(a.s.is_closed());
    assert_eq!(std::fs::read(&partial).unwrap(), b"abc");
    assert_eq!(a.store.blob_in(&peer, "r1").unwrap().unwrap().offset, 3);
}

#[test]
fn after_a_failed_blob_fsync_nothing_more_is_recorded() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let _root = with_blobs(&mut a);
    let peer = b.id.key();
    let data: Vec<u8> = (0..4000u32).map(|i| (i % 241) as u8).collect();
    feed_chunk(&mut a, &b.id, "r1", 0, false, &data[..2000], now);
    let job = a.s.commit_start().expect("blob data to fsync");
    // Read while that fsync runs (conn.rs: prewrite_blobs in the read branch).
    feed_chunk(&mut a, &b.id, "r1", 1, false, &data[2000..], now);
    a.s.prewrite_blobs();
    drop(job);
    // The fsync of chunk 0 failed (EIO).
    fail_blob_sync(&mut a);
    let wants = a.s.wants_flush();
    // the connection commits whenever wants_flush() and no flight runs, closed or not.
    if wants {
        a.s.commit();
        a.store.flush_blocking().unwrap();
        a.s.flushed();
    }
    let st = a.store.blob_in(&peer, "r1").unwrap();
    assert!(
        st.is_none(),
        "wants_flush after the failure: {wants}; recorded past data whose fsync failed: {:?}",
        st.map(|s| (s.offset, s.next_n))
    );
}

#[test]
fn a_refusal_of_a_chunk_taken_early_goes_out() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let _root = with_blobs(&mut a);
    feed_chunk(&mut a, &b.id, "r1", 0, false, b"abc", now);
    let job = a.s.commit_start().expect("blob data to fsync");
    // A chunk of another blob with bad base64... use a gap: n 3 where 0 is next.
    feed_chunk(&mut a, &b.id, "r2", 3, false, b"zz", now);
    a.s.prewrite_blobs();
    job.run().unwrap();
    a.s.commit_synced(Ok(()));
    a.store.flush_blocking().unwrap();
    a.s.flushed();
    // Nothing else arrives from the peer.
    let mut out = drain(&mut a);
    out.extend(drain(&mut a));
    let codes: Vec<_> = out.iter().map(|l| err_code(l)).collect();
    assert!(
        codes.iter().any(|c| c.as_deref() == Some("blob_refused")),
        "wants_flush {}; sent {codes:?}",
        a.s.wants_flush()
    );
}

#[test]
fn a_ping_read_while_a_blob_fsync_runs_is_answered_after_the_batch_acks() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let _root = with_blobs(&mut a);
    feed_chunk(&mut a, &b.id, "r1", 0, true, b"abc", now);
    let msg_id = "01K80000000000000000000002";
    a.s.handle_line(&blob_msg(msg_id, "r1", 3), now);
    let job = a.s.commit_start().expect("blob data to fsync");
    // Read while the fsync runs (as when the flush held up reading, a ping read while the
    // driver commits a batch is answered after that batch's acks: session/mod.rs on Ping).
    a.s.handle_line(
        br#"{"t":"ping","id":"p1","ts":"2026-01-01T00:00:00Z"}"#,
        now,
    );
    let mut out = drain_transmit(&mut a);
    job.run().unwrap();
    a.s.commit_synced(Ok(()));
    a.store.flush_blocking().unwrap();
    a.s.flushed();
    out.extend(drain_transmit(&mut a));
    assert_eq!(kinds(&out), ["ack", "pong"]);
}

#[test]
fn after_a_storage_failure_lines_read_since_are_not_stored() {
    // A msg read while a failing blob fsync ran must not be stored after the failure: it
    // would raise seen past the msg of the failed batch, and the peer would drop that
    // one from its outbox without an ack.
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    pump(&mut a, &mut b, now);
    let _root = with_blobs(&mut a);
    let peer = b.id.key();
    let first = "01K90000000000000000000002";
    let later = "01K90000000000000000000003";
    feed_chunk(&mut a, &b.id, "r1", 0, false, b"abc", now);
    a.s.handle_line(&peer_msg(&b.id, first, "thr_blob", "one", false), now);
    let job = a.s.commit_start().expect("blob data to fsync");
    a.s.handle_line(&peer_msg(&b.id, later, "thr_blob", "two", false), now);
    // Behind a msg: not taken early; waits in the pending lines.
    feed_chunk(&mut a, &b.id, "r1", 1, false, b"def", now);
    a.s.prewrite_blobs();
    drop(job);
    fail_blob_sync(&mut a);
    assert!(
        !a.s.wants_flush(),
        "nothing more to store after a storage failure"
    );
    a.s.commit();
    a.store.flush_blocking().unwrap();
    a.s.flushed();
    assert_eq!(a.store.received_line(&peer, first).unwrap(), None);
    assert_eq!(a.store.received_line(&peer, later).unwrap(), None);
    assert!(!a.store.seen(&peer).unwrap().contains_key("thr_blob"));
    assert!(
        a.store.blob_in(&peer, "r1").unwrap().is_none(),
        "no record, no refusal"
    );
}

/// The blob fsync of `e`'s running commit failed (EIO): the session fails; the store flush
/// that follows a Synced stage runs whatever its result (`landed` in the connection),
/// then `flushed`.
fn fail_blob_sync(e: &mut End) {
    e.s.commit_synced(Err(crate::blob::BlobError::Io {
        path: "partial".into(),
        source: std::io::Error::other("EIO"),
    }));
    assert!(e.s.is_closed());
    e.store.flush_blocking().unwrap();
    e.s.flushed();
}

/// Feed `e` chunk `n` of blob `r` from `from` (unsigned, with a fresh id) as it is read.
fn feed_chunk(
    e: &mut End,
    from: &Identity,
    r: &str,
    n: u64,
    last: bool,
    data: &[u8],
    now: Instant,
) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = format!(
        "01KC{:022}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    e.s.handle_line(&chunk_line(from, &id, r, n, last, data, false), now);
}
