//! Store behaviour tests; each test has its own database directory.

use super::*;
use crate::wire::{Chunk, Msg, Part, Ping, State, TextPart};
use std::collections::BTreeMap;
use std::sync::Arc;
use tempfile::TempDir;

fn key(n: u8) -> PeerKey {
    let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
    PeerKey::from_bytes(&sk.verifying_key().to_bytes()).expect("valid test key")
}

fn open() -> (TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Store::open(dir.path()).expect("open");
    (dir, s)
}

fn msg(th: &str, subject: Option<&str>, text: &str, id: &str, ts: &str) -> Line {
    Line::Msg(Msg {
        id: id.into(),
        ts: ts.into(),
        th: th.into(),
        re: None,
        subject: subject.map(Into::into),
        parts: vec![Part::Text(TextPart { text: text.into() })],
    })
}

fn state(th: &str, st: &str, note: Option<&str>, id: &str, ts: &str) -> Line {
    Line::State(State {
        id: id.into(),
        ts: ts.into(),
        th: th.into(),
        re: None,
        state: st.into(),
        note: note.map(Into::into),
    })
}

fn chunk(th: Option<&str>, n: u64, id: &str, ts: &str) -> Line {
    Line::Chunk(Chunk {
        id: id.into(),
        ts: ts.into(),
        th: th.map(Into::into),
        blob_ref: "r1".into(),
        n,
        last: false,
        data: "AAAA".into(),
    })
}

/// Enqueue one msg in `th`; returns its id.
/// Every log entry's line by seq.
fn log_lines(s: &Store) -> BTreeMap<u64, Vec<u8>> {
    s.log(0, None, false, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.line))
        .collect()
}

fn send(s: &Store, p: &PeerKey, th: &str) -> String {
    let b = |id: &str, ts: &str| msg(th, Some("subj"), "hi", id, ts);
    s.enqueue(p, &[&b]).expect("enqueue")[0].id.clone()
}

fn send_chunk(s: &Store, p: &PeerKey, th: Option<&str>) -> String {
    let b = |id: &str, ts: &str| chunk(th, 0, id, ts);
    s.enqueue(p, &[&b]).expect("enqueue")[0].id.clone()
}

fn outbox_ids(s: &Store, p: &PeerKey) -> Vec<String> {
    s.outbox_after(p, None, usize::MAX)
        .expect("outbox")
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// An inbound line with a chosen id.
fn in_msg(th: &str, id: &str, subject: Option<&str>) -> (Line, Vec<u8>) {
    let l = msg(th, subject, "yo", id, "2026-01-01T00:00:00.000Z");
    let raw = l.encode();
    (l, raw)
}

const ID1: &str = "01HZZZZZZZZZZZZZZZZZZZZZZ1";
const ID2: &str = "01HZZZZZZZZZZZZZZZZZZZZZZ2";
const ID3: &str = "01HZZZZZZZZZZZZZZZZZZZZZZ3";
const ID4: &str = "01HZZZZZZZZZZZZZZZZZZZZZZ4";

#[test]
fn ids_strictly_increase_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    let mut all = Vec::new();
    for _ in 0..3 {
        let s = Store::open(dir.path()).unwrap();
        let seeded = s.last_id().unwrap();
        assert_eq!(seeded.as_ref(), all.last());
        for _ in 0..50 {
            all.push(send(&s, &p, "t1"));
        }
        s.flush_blocking().unwrap();
    }
    assert!(all.windows(2).all(|w| w[0] < w[1]), "ids not increasing");
    assert!(all.iter().all(|i| i.len() == 26));
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.last_id().unwrap().as_ref(), all.last());
    assert_eq!(outbox_ids(&s, &p), all);
}

#[test]
fn enqueue_many_is_one_transaction() {
    let (_d, s) = open();
    let p = key(1);
    let big = "x".repeat(crate::wire::MAX_LINE);
    let ok = |id: &str, ts: &str| msg("t", None, "small", id, ts);
    let too_big = |id: &str, ts: &str| msg("t", None, &big, id, ts);
    let err = s.enqueue(&p, &[&ok, &ok, &too_big]).unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err:?}");
    assert_eq!(s.outbox_len(&p).unwrap(), 0);
    assert!(s.log(0, None, false, 10).unwrap().is_empty());
    assert!(s.thread("t").unwrap().is_none());
    assert_eq!(s.last_id().unwrap(), None);

    let wrong_id = |_: &str, ts: &str| msg("t", None, "x", ID1, ts);
    let err = s.enqueue(&p, &[&ok, &wrong_id]).unwrap_err();
    assert!(matches!(err, StoreError::BadLine(_)), "{err:?}");
    assert_eq!(s.outbox_len(&p).unwrap(), 0);

    let out = s.enqueue(&p, &[&ok, &ok, &ok]).unwrap();
    assert_eq!(out.len(), 3);
    let log = s.log(0, None, false, 10).unwrap();
    assert_eq!(log.len(), 3);
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3], "no seq consumed by failed calls");
    for (e, o) in log.iter().zip(&out) {
        assert_eq!(e.id, o.id);
        assert_eq!(e.dir, Dir::Out);
        assert!(!e.acked);
        assert_eq!(e.line, o.line);
    }
    assert_eq!(s.last_id().unwrap().as_deref(), Some(out[2].id.as_str()));
    // The encoded line carries the allocated id.
    let text = String::from_utf8(out[0].line.clone()).unwrap();
    assert!(text.contains(&out[0].id));
}

/// Batches of [`imp::PARALLEL_RESOLVE`] records and more are resolved on two threads:
/// the lines still come in id order, each its own (the log entry of its seq), exactly
/// `limit` of them while more are queued, and a batch boundary skips and repeats nothing.
#[test]
fn outbox_batches_resolved_on_two_threads_keep_order_and_limit() {
    let (_d, s) = open();
    let (a, b) = (key(1), key(2));
    let texts: Vec<String> = (0..700).map(|i| format!("line {i}")).collect();
    type Builder = Box<dyn Fn(&str, &str) -> Line + Sync>;
    let builders: Vec<Builder> = texts
        .iter()
        .map(|t| {
            let t = t.clone();
            Box::new(move |id: &str, ts: &str| msg("t1", None, &t, id, ts)) as Builder
        })
        .collect();
    let refs: Vec<LineBuilder<'_>> = builders.iter().map(|b| &**b as LineBuilder<'_>).collect();
    let queued = s.enqueue(&a, &refs).unwrap();
    // Another peer's lines interleave in the log; they are not a's.
    send(&s, &b, "t2");
    let log = log_lines(&s);
    let mut got = Vec::new();
    let mut cursor: Option<String> = None;
    for want in [300usize, 300, 300] {
        let batch = s.outbox_after(&a, cursor.as_deref(), want).unwrap();
        assert_eq!(batch.len(), want.min(700 - got.len()));
        cursor = batch.last().map(|e| e.id.clone());
        got.extend(batch);
    }
    assert_eq!(got.len(), 700);
    for ((e, q), text) in got.iter().zip(&queued).zip(&texts) {
        assert_eq!(e.id, q.id);
        assert_eq!(e.line, q.line);
        assert_eq!(log.get(&e.seq), Some(&e.line));
        assert!(String::from_utf8_lossy(&e.line).contains(text.as_str()));
    }
    assert!(s
        .outbox_after(&a, cursor.as_deref(), 300)
        .unwrap()
        .is_empty());
}

#[test]
fn outbox_order_after_and_limit() {
    let (_d, s) = open();
    let (a, b) = (key(1), key(2));
    let ids: Vec<String> = (0..6)
        .map(|i| send(&s, &a, if i % 2 == 0 { "t1" } else { "t2" }))
        .collect();
    let other = send(&s, &b, "t3");
    assert_eq!(outbox_ids(&s, &a), ids);
    assert_eq!(outbox_ids(&s, &b), vec![other]);
    let after: Vec<String> = s
        .outbox_after(&a, Some(&ids[2]), 2)
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(after, ids[3..5].to_vec());
    assert!(s.outbox_after(&a, Some(&ids[5]), 10).unwrap().is_empty());
    assert_eq!(s.outbox_len(&a).unwrap(), 6);
    assert_eq!(s.outbox_len(&b).unwrap(), 1);
    let mut peers = s.outbox_peers().unwrap();
    peers.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(peers, want);
}

#[test]
fn ack_removes_and_is_cumulative_for_chunks() {
    let (_d, s) = open();
    let p = key(1);
    let c1 = send_chunk(&s, &p, Some("A"));
    let cb = send_chunk(&s, &p, Some("B"));
    let c2 = send_chunk(&s, &p, Some("A"));
    let cu = send_chunk(&s, &p, None);
    let m0 = send(&s, &p, "A");
    let m = send(&s, &p, "A");
    let c3 = send_chunk(&s, &p, Some("A"));
    assert_eq!(s.outbox_len(&p).unwrap(), 7);

    assert!(s.ack(&p, "A", &m).unwrap());
    // m and the earlier chunks of A go; the earlier msg m0 stays (acked on its own), as do
    // B's chunk, the unthreaded chunk and the later chunk.
    assert_eq!(outbox_ids(&s, &p), vec![cb.clone(), cu, m0.clone(), c3]);
    assert_eq!(s.outbox_len(&p).unwrap(), 4);
    let log = s.log(0, None, false, 100).unwrap();
    let acked: Vec<&str> = log
        .iter()
        .filter(|e| e.acked)
        .map(|e| e.id.as_str())
        .collect();
    assert_eq!(acked, vec![c1.as_str(), c2.as_str(), m.as_str()]);

    assert!(!s.ack(&p, "A", &m).unwrap(), "second ack finds nothing");
    assert!(!s.ack(&p, "A", ID1).unwrap(), "unknown id");
    assert!(!s.ack(&key(2), "B", &cb).unwrap(), "other peer's line");
    assert_eq!(s.outbox_len(&p).unwrap(), 4);
    // An acked chunk itself is removed but retires nothing else.
    assert!(s.ack(&p, "B", &cb).unwrap());
    assert!(s.ack(&p, "A", &m0).unwrap());
    assert_eq!(s.outbox_len(&p).unwrap(), 2);
}

#[test]
fn drop_seen_drops_up_to_seen_per_thread() {
    let (_d, s) = open();
    let p = key(1);
    let a1 = send(&s, &p, "A");
    let b1 = send(&s, &p, "B");
    let a2 = send(&s, &p, "A");
    let a3 = send(&s, &p, "A");
    let c1 = send(&s, &p, "C");
    let mut seen = BTreeMap::new();
    seen.insert("A".to_string(), a2.clone());
    seen.insert("B".to_string(), "0".to_string()); // smaller than any of ours
    seen.insert("Z".to_string(), "ZZZZZZZZZZZZZZZZZZZZZZZZZZ".to_string());
    assert_eq!(s.drop_seen(&p, &seen).unwrap(), 2);
    assert_eq!(outbox_ids(&s, &p), vec![b1, a3, c1]);
    assert_eq!(s.outbox_len(&p).unwrap(), 3);
    let acked: Vec<String> = s
        .log(0, None, false, 100)
        .unwrap()
        .into_iter()
        .filter(|e| e.acked)
        .map(|e| e.id)
        .collect();
    assert_eq!(acked, vec![a1, a2]);
    assert_eq!(s.drop_seen(&p, &seen).unwrap(), 0);
    assert_eq!(s.drop_seen(&p, &BTreeMap::new()).unwrap(), 0);
}

#[test]
fn receive_dedups_permanently() {
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    let (l, raw) = in_msg("T", ID2, Some("hello"));
    {
        let s = Store::open(dir.path()).unwrap();
        let r = s.receive(&p, &l, &raw).unwrap();
        assert_eq!(r, Received::New(1));
        assert_eq!(s.receive(&p, &l, &raw).unwrap(), Received::Duplicate);
        s.flush_blocking().unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.receive(&p, &l, &raw).unwrap(), Received::Duplicate);
    assert_eq!(s.thread("T").unwrap().unwrap().unread, 1);
    let log = s.log(0, None, false, 10).unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].line, raw);
    assert_eq!(log[0].dir, Dir::In);
    assert!(!log[0].read);
    assert_eq!(s.seen(&p).unwrap().get("T").map(String::as_str), Some(ID2));
    // The same id from another peer is a different line.
    assert!(matches!(
        s.receive(&key(2), &l, &raw).unwrap(),
        Received::New(_)
    ));
}

#[test]
fn seen_is_max_per_thread() {
    let (_d, s) = open();
    let p = key(1);
    for (th, id) in [
        ("A", ID2),
        ("A", ID1),
        ("B", "01HZZZZZZZZZZZZZZZZZZZZZY2"),
        ("A", ID3),
        ("B", "01HZZZZZZZZZZZZZZZZZZZZZY1"),
    ] {
        let (l, raw) = in_msg(th, id, None);
        s.receive(&p, &l, &raw).unwrap();
    }
    let ping = Line::Ping(Ping {
        id: "ZZZZZZZZZZZZZZZZZZZZZZZZZZ".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
    });
    assert_eq!(s.receive(&p, &ping, b"{}").unwrap(), Received::New(0));
    let unthreaded = chunk(None, 0, "ZZZZZZZZZZZZZZZZZZZZZZZZZY", "x");
    assert_eq!(s.receive(&p, &unthreaded, b"{}").unwrap(), Received::New(0));
    let threaded = chunk(Some("B"), 0, ID4, "x");
    assert!(matches!(
        s.receive(&p, &threaded, b"{}").unwrap(),
        Received::New(n) if n > 0
    ));
    let seen = s.seen(&p).unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen["A"], ID3);
    assert_eq!(seen["B"], ID4);
    assert!(s.seen(&key(2)).unwrap().is_empty());
    // The threaded chunk moved seen but is not counted unread.
    assert_eq!(s.thread("B").unwrap().unwrap().unread, 2);
}

#[test]
fn receive_batch_dedups_within_batch() {
    let (_d, s) = open();
    let p = key(1);
    let (l1, r1) = in_msg("T", ID1, None);
    let (l2, r2) = in_msg("T", ID2, None);
    let got = s
        .receive_batch(&p, &[(&l1, &r1), (&l2, &r2), (&l1, &r1)])
        .unwrap();
    assert_eq!(
        got,
        vec![Received::New(1), Received::New(2), Received::Duplicate]
    );
    assert_eq!(s.thread("T").unwrap().unwrap().unread, 2);
    assert_eq!(s.seen(&p).unwrap()["T"], ID2);
}

#[test]
fn thread_subject_and_states() {
    let (_d, s) = open();
    let p = key(1);
    let first = |id: &str, ts: &str| msg("T", Some("plan"), "hi", id, ts);
    let mine = |id: &str, ts: &str| state("T", "working", Some("on it"), id, ts);
    s.enqueue(&p, &[&first, &mine]).unwrap();
    let t = s.thread("T").unwrap().unwrap();
    assert_eq!(t.subject.as_deref(), Some("plan"));
    assert_eq!(t.mine.as_deref(), Some("working"));
    assert_eq!(t.my_note.as_deref(), Some("on it"));
    assert_eq!(t.peer, p);
    assert_eq!(t.theirs, None);
    assert_eq!(t.unread, 0);

    let (l, raw) = in_msg("T", ID1, Some("other subject"));
    s.receive(&p, &l, &raw).unwrap();
    let st = state("T", "done", None, ID2, "x");
    s.receive(&p, &st, &st.encode()).unwrap();
    let t = s.thread("T").unwrap().unwrap();
    assert_eq!(t.subject.as_deref(), Some("plan"), "first subject wins");
    assert_eq!(t.theirs.as_deref(), Some("done"));
    assert_eq!(t.their_note, None);
    assert_eq!(t.mine.as_deref(), Some("working"));
    assert_eq!(t.unread, 2);
    assert!(t.updated_ms >= t.since_ms);

    // A thread created by the peer takes the subject of its first msg.
    let (l, raw) = in_msg("U", ID3, Some("theirs"));
    s.receive(&p, &l, &raw).unwrap();
    assert_eq!(
        s.thread("U").unwrap().unwrap().subject.as_deref(),
        Some("theirs")
    );
    let all = s.threads().unwrap();
    assert_eq!(all.len(), 2);
    assert!(all[0].updated_ms >= all[1].updated_ms);
    assert!(s.thread("nope").unwrap().is_none());
}

#[test]
fn threads_most_recent_first() {
    let (_d, s) = open();
    let p = key(1);
    send(&s, &p, "old");
    std::thread::sleep(std::time::Duration::from_millis(5));
    send(&s, &p, "new");
    let order: Vec<String> = s.threads().unwrap().into_iter().map(|t| t.th).collect();
    assert_eq!(order, vec!["new", "old"]);
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (l, raw) = in_msg("old", ID1, None);
    s.receive(&p, &l, &raw).unwrap();
    let order: Vec<String> = s.threads().unwrap().into_iter().map(|t| t.th).collect();
    assert_eq!(order, vec!["old", "new"]);
}

#[test]
fn mark_read_and_log_filters() {
    let (_d, s) = open();
    let p = key(1);
    let out_id = send(&s, &p, "T");
    let (l1, r1) = in_msg("T", ID1, None);
    let (l2, r2) = in_msg("T", ID2, None);
    let (l3, r3) = in_msg("U", ID3, None);
    let Received::New(s1) = s.receive(&p, &l1, &r1).unwrap() else {
        panic!("new expected")
    };
    s.receive(&p, &l2, &r2).unwrap();
    s.receive(&p, &l3, &r3).unwrap();
    assert_eq!(s.thread("T").unwrap().unwrap().unread, 2);
    assert_eq!(s.log(0, None, true, 10).unwrap().len(), 3);
    assert_eq!(s.log(0, Some("T"), false, 10).unwrap().len(), 3);
    assert_eq!(s.log(0, Some("T"), true, 10).unwrap().len(), 2);
    assert_eq!(s.log(0, None, false, 2).unwrap().len(), 2);
    assert_eq!(s.log(2, None, false, 10).unwrap().len(), 2);
    assert!(s.log(u64::MAX, None, false, 10).unwrap().is_empty());

    let out_seq = s.log(0, None, false, 1).unwrap()[0].seq;
    assert_eq!(s.log(0, None, false, 1).unwrap()[0].id, out_id);
    assert_eq!(s.mark_read(&[s1, s1, out_seq, 999]).unwrap(), 1);
    assert_eq!(s.thread("T").unwrap().unwrap().unread, 1);
    assert_eq!(s.mark_read(&[s1]).unwrap(), 0);
    assert_eq!(s.log(0, Some("T"), true, 10).unwrap().len(), 1);
    assert_eq!(s.thread("U").unwrap().unwrap().unread, 1);
}

#[test]
fn peers_upsert_and_parked() {
    let (_d, s) = open();
    let p = key(1);
    assert!(s.peer(&p).unwrap().is_none());
    s.peer_seen(&p, Some("a@h"), None, &["blob".into()], 100)
        .unwrap();
    s.set_parked(&p, Park::PeerBye).unwrap();
    let r = s.peer(&p).unwrap().unwrap();
    assert!(r.parked && !r.parked_by_us);
    s.peer_seen(&p, Some("b@h"), Some("about"), &[], 200)
        .unwrap();
    let r = s.peer(&p).unwrap().unwrap();
    assert_eq!(r.name.as_deref(), Some("b@h"));
    assert_eq!(r.about.as_deref(), Some("about"));
    assert!(r.caps.is_empty());
    assert_eq!((r.first_seen_ms, r.last_seen_ms), (100, 200));
    assert!(!r.parked, "handshake clears parked");

    s.set_parked(&p, Park::PeerBye).unwrap();
    send(&s, &p, "T");
    assert!(
        !s.peer(&p).unwrap().unwrap().parked,
        "new traffic clears parked"
    );

    s.set_parked(&key(2), Park::Clear).unwrap();
    assert!(s.peer(&key(2)).unwrap().is_none());
    s.set_parked(&key(3), Park::PeerBye).unwrap();
    assert!(s.peer(&key(3)).unwrap().unwrap().parked);
    assert_eq!(s.peers().unwrap().len(), 2);
}

/// `awp disconnect` parks "by us"; the peer's bye in reply keeps that, and only new
/// traffic (or a handshake) clears it; the mark survives a reopen.
#[test]
fn parked_by_us_survives_the_reply_bye_and_a_reopen() {
    let d = tempfile::tempdir().unwrap();
    let p = key(1);
    {
        let s = Store::open(d.path()).unwrap();
        s.peer_seen(&p, Some("a@h"), None, &[], 100).unwrap();
        s.set_parked(&p, Park::ByUs).unwrap();
        s.set_parked(&p, Park::PeerBye).unwrap();
        let r = s.peer(&p).unwrap().unwrap();
        assert!(r.parked && r.parked_by_us, "the reply bye keeps our park");
    }
    let s = Store::open(d.path()).unwrap();
    let r = s.peer(&p).unwrap().unwrap();
    assert!(r.parked && r.parked_by_us, "reopened: {r:?}");
    send(&s, &p, "T");
    let r = s.peer(&p).unwrap().unwrap();
    assert!(!r.parked && !r.parked_by_us, "traffic clears both: {r:?}");
    // A park by the peer after traffic is the peer's own.
    s.set_parked(&p, Park::PeerBye).unwrap();
    let r = s.peer(&p).unwrap().unwrap();
    assert!(r.parked && !r.parked_by_us);
}

#[test]
fn address_rules() {
    let (_d, s) = open();
    let p = key(1);
    s.add_address_at(&p, "tcp://a:1", AddrSource::Hello, 1)
        .unwrap();
    s.add_address_at(&p, "tcp://a:1", AddrSource::Introduce, 2)
        .unwrap();
    s.add_address_at(&p, "tcp://b:2", AddrSource::Introduce, 3)
        .unwrap();
    s.add_address_at(&p, "tcp://c:3", AddrSource::Hello, 4)
        .unwrap();
    s.add_address_at(&p, "tcp://d:4", AddrSource::Connect, 5)
        .unwrap();
    s.add_address_at(&p, "tcp://d:4", AddrSource::Hello, 6)
        .unwrap();
    let get = |a: &str| {
        s.addresses(&p)
            .unwrap()
            .into_iter()
            .find(|r| r.address == a)
            .unwrap()
    };
    assert_eq!(
        get("tcp://a:1").source,
        AddrSource::Hello,
        "no sideways change"
    );
    assert_eq!(
        get("tcp://a:1").last_heard_ms,
        Some(1),
        "a hint is not heard"
    );
    assert_eq!(
        get("tcp://d:4").source,
        AddrSource::Connect,
        "never downgraded"
    );
    assert_eq!(get("tcp://d:4").last_heard_ms, Some(6), "heard again");
    assert_eq!(get("tcp://b:2").last_heard_ms, None);

    s.address_result(&p, "tcp://b:2", Ok(()), 50).unwrap();
    s.address_result(&p, "tcp://c:3", Ok(()), 10).unwrap();
    s.address_result(&p, "tcp://c:3", Err("refused"), 60)
        .unwrap();
    s.address_result(&p, "tcp://zz:9", Ok(()), 70).unwrap();
    let c = get("tcp://c:3");
    assert_eq!(c.last_ok_ms, Some(10));
    assert_eq!(c.last_err_ms, Some(60));
    assert_eq!(c.last_err.as_deref(), Some("refused"));
    assert!(c.failing());

    let order = |s: &Store| -> Vec<String> {
        s.addresses(&p)
            .unwrap()
            .into_iter()
            .map(|r| r.address)
            .collect()
    };
    // Freshest first (b worked at 50, d heard at 6, a heard at 1); c failed after it last
    // worked: after every address known good.
    assert_eq!(
        order(&s),
        ["tcp://b:2", "tcp://d:4", "tcp://a:1", "tcp://c:3"]
    );

    s.add_address_at(&p, "tcp://b:2", AddrSource::Connect, 80)
        .unwrap();
    let b = get("tcp://b:2");
    assert_eq!(b.source, AddrSource::Connect, "upgraded");
    assert_eq!(b.last_ok_ms, Some(50), "history kept");
    assert!(s.addresses(&key(2)).unwrap().is_empty());
}

/// Usability #1: a peer that moved to a new port announces it in its hello; that address
/// is dialed first, ahead of the old one that worked before.
#[test]
fn a_newly_announced_address_is_dialed_before_one_that_worked_earlier() {
    let (_d, s) = open();
    let p = key(1);
    s.add_address_at(&p, "tls:127.0.0.1:4000", AddrSource::Connect, 100)
        .unwrap();
    s.address_result(&p, "tls:127.0.0.1:4000", Ok(()), 101)
        .unwrap();
    // It restarted on another port and said so in its hello.
    s.add_address_at(&p, "tls:127.0.0.1:5000", AddrSource::Hello, 200)
        .unwrap();
    let first = s.addresses(&p).unwrap().remove(0);
    assert_eq!(first.address, "tls:127.0.0.1:5000");
    assert_eq!(first.fresh_ms(), Some(200));
}

/// Usability #1: the list is bounded; the stalest go, never the address just heard.
#[test]
fn a_peer_keeps_at_most_eight_addresses_dropping_the_stalest() {
    let (_d, s) = open();
    let p = key(1);
    for i in 0..12u64 {
        s.add_address_at(
            &p,
            &format!("tls:10.0.0.1:{}", 1000 + i),
            AddrSource::Hello,
            i,
        )
        .unwrap();
    }
    let left: Vec<String> = s
        .addresses(&p)
        .unwrap()
        .into_iter()
        .map(|a| a.address)
        .collect();
    assert_eq!(left.len(), crate::store::MAX_PEER_ADDRESSES);
    assert_eq!(left[0], "tls:10.0.0.1:1011");
    assert_eq!(left[7], "tls:10.0.0.1:1004");
    // Introduced hints past the bound are dropped first.
    s.introduce(&key(2), &p, None, Some("tls:9.9.9.9:1"), 8, 50)
        .unwrap();
    assert_eq!(s.addresses(&p).unwrap().len(), 8);
    assert!(s
        .addresses(&p)
        .unwrap()
        .iter()
        .all(|a| a.address != "tls:9.9.9.9:1"));
}

#[test]
fn prune_drops_old_keeps_dedup() {
    let (_d, s) = open();
    let p = key(1);
    send(&s, &p, "T");
    send_chunk(&s, &p, Some("T"));
    let (l, raw) = in_msg("T", ID1, None);
    s.receive(&p, &l, &raw).unwrap();
    let now = crate::wire::time::now_ms();
    assert_eq!(s.prune(now).unwrap(), 0);
    assert_eq!(s.prune(now + RETENTION_MS - 60_000).unwrap(), 0);
    assert_eq!(s.prune(now + RETENTION_MS + 60_000).unwrap(), 2 + 3);
    assert_eq!(s.outbox_len(&p).unwrap(), 0);
    assert!(s.outbox_peers().unwrap().is_empty());
    assert!(s.log(0, None, false, 10).unwrap().is_empty());
    assert_eq!(s.receive(&p, &l, &raw).unwrap(), Received::Duplicate);
    assert_eq!(s.seen(&p).unwrap()["T"], ID1);
    // New lines still get fresh, larger seqs.
    let Received::New(n) = s.receive(&p, &in_msg("T", ID2, None).0, b"{}").unwrap() else {
        panic!("new expected")
    };
    assert_eq!(n, 4);
}

#[test]
fn meta_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.meta_get("presence_seq").unwrap(), None);
        s.meta_put("presence_seq", b"42").unwrap();
        s.meta_put("last_id", b"not the internal one").unwrap();
        s.flush_blocking().unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(
        s.meta_get("presence_seq").unwrap().as_deref(),
        Some(&b"42"[..])
    );
    assert_eq!(
        s.last_id().unwrap(),
        None,
        "user keys do not touch internal ones"
    );
    assert!(s.meta_remove("presence_seq").unwrap());
    assert!(!s.meta_remove("presence_seq").unwrap());
}

#[test]
fn reopen_keeps_flushed_data() {
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    let (id, raw) = {
        let s = Store::open(dir.path()).unwrap();
        let id = send(&s, &p, "T");
        let (l, raw) = in_msg("T", ID1, Some("s"));
        s.receive(&p, &l, &raw).unwrap();
        s.peer_seen(&p, Some("n"), None, &[], 5).unwrap();
        s.add_address(&p, "tcp://x:1", AddrSource::Connect).unwrap();
        s.flush_blocking().unwrap();
        (id, raw)
    };
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(outbox_ids(&s, &p), vec![id]);
    assert_eq!(s.outbox_len(&p).unwrap(), 1);
    assert_eq!(s.log(0, None, false, 10).unwrap().len(), 2);
    assert_eq!(s.log(0, None, false, 10).unwrap()[1].line, raw);
    assert_eq!(s.seen(&p).unwrap()["T"], ID1);
    assert_eq!(s.peer(&p).unwrap().unwrap().name.as_deref(), Some("n"));
    assert_eq!(s.addresses(&p).unwrap().len(), 1);
    assert_eq!(s.thread("T").unwrap().unwrap().unread, 1);
}

#[test]
fn second_open_fails_clearly() {
    let (d, s) = open();
    let t = std::time::Instant::now();
    match Store::open(d.path()) {
        Err(e @ StoreError::Locked { .. }) => assert!(e.to_string().contains("locked")),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("second open succeeded"),
    }
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "not at once"
    );
    // Once the first handle is gone the directory opens again.
    drop(s);
    Store::open(d.path()).expect("reopen after drop");
}

#[test]
fn corrupt_record_is_an_error() {
    // sled lets go of its lock a moment after a raw handle is dropped: retry opens here.
    fn retry<T, E: std::fmt::Debug>(mut f: impl FnMut() -> Result<T, E>) -> Result<T, E> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match f() {
                Err(e)
                    if format!("{e:?}").contains("ock") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                r => return r,
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let db = retry(|| sled::open(dir.path())).unwrap();
        let t = db.open_tree("threads").unwrap();
        t.insert("T", &b"\x00\x00\x00\x09not json!"[..]).unwrap();
        t.insert("U", &b"\xff"[..]).unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert("log_seq", &b"abc"[..])
            .unwrap();
        db.flush().unwrap();
    }
    match retry(|| Store::open(dir.path())) {
        Err(StoreError::Corrupt { tree: "meta", .. }) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened with a corrupt log seq"),
    }
    {
        let db = retry(|| sled::open(dir.path())).unwrap();
        db.open_tree("meta").unwrap().remove("log_seq").unwrap();
        db.flush().unwrap();
    }
    let s = retry(|| Store::open(dir.path())).unwrap();
    assert!(matches!(
        s.thread("T"),
        Err(StoreError::Corrupt {
            tree: "threads",
            ..
        })
    ));
    assert!(matches!(s.thread("U"), Err(StoreError::Corrupt { .. })));
    assert!(s.threads().is_err());
}

/// Holds the first flush until every other caller waits on it (they see it running, so
/// they need the next one), so what the test counts does not depend on how the callers
/// happen to be scheduled.
struct HoldFirstFlush {
    store: std::sync::Weak<Store>,
    others: usize,
    first: std::sync::atomic::AtomicBool,
}

impl StoreFaults for HoldFirstFlush {
    fn flush(&self) -> std::io::Result<()> {
        if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while std::time::Instant::now() < until {
                let Some(s) = self.store.upgrade() else { break };
                if s.flush_waiters() >= self.others {
                    break;
                }
                drop(s);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_shares_flushes() {
    let (_d, s) = open();
    let s = Arc::new(s);
    let p = key(1);
    let n = 100;
    s.set_faults(Some(Arc::new(HoldFirstFlush {
        store: Arc::downgrade(&s),
        others: n - 1,
        first: true.into(),
    })));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let s = Arc::clone(&s);
        tasks.push(tokio::spawn(async move {
            let id = send(&s, &p, "T");
            s.flush().await.map(|_| id)
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let flushes = s.flush_count();
    s.set_faults(None);
    // The first caller's flush, and one more for every caller that came while it ran.
    assert!(
        (1..=2).contains(&flushes),
        "{flushes} flushes for {n} callers"
    );
    assert_eq!(s.outbox_len(&p).unwrap(), n as u64);

    // A lone caller still gets its own flush, which starts after its call.
    let before = s.flush_count();
    s.flush().await.unwrap();
    assert_eq!(s.flush_count(), before + 1);
}

#[test]
fn flush_blocking_from_threads_is_shared() {
    let (_d, s) = open();
    let s = Arc::new(s);
    let p = key(1);
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for _ in 0..25 {
                    send(&s, &p, "T");
                    s.flush_blocking().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let flushes = s.flush_count();
    eprintln!(
        "200 enqueue+flush_blocking on 8 threads: {flushes} flushes in {:?}",
        start.elapsed()
    );
    assert!(flushes < 200, "{flushes}");
    assert_eq!(s.outbox_len(&p).unwrap(), 200);
}

const CRASH_ENV: &str = "AWP_STORE_CRASH_DIR";

/// Child half of [`crash_keeps_every_flushed_line`]: enqueue and flush forever, printing
/// each id after its flush returned.
#[test]
#[ignore = "helper run by crash_keeps_every_flushed_line"]
fn crash_child() {
    use std::io::Write;
    let Ok(dir) = std::env::var(CRASH_ENV) else {
        return;
    };
    let s = Store::open(std::path::Path::new(&dir)).unwrap();
    let p = key(1);
    let mut out = std::io::stdout().lock();
    loop {
        let a = |id: &str, ts: &str| msg("T", None, "crash", id, ts);
        let b = |id: &str, ts: &str| chunk(Some("T"), 0, id, ts);
        let ids: Vec<String> = s
            .enqueue(&p, &[&a, &b])
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        s.flush_blocking().unwrap();
        writeln!(out, "FLUSHED {} {}", ids[0], ids[1]).unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn crash_keeps_every_flushed_line() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    let mut flushed: Vec<String> = Vec::new();
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "store::tests::crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let want = 50 + 40 * round;
        let mut got = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got < want && std::time::Instant::now() < deadline {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(rest) = l.strip_prefix("FLUSHED ") {
                        flushed.extend(rest.split(' ').map(str::to_owned));
                        got += 1;
                    }
                }
                _ => break,
            }
        }
        child.kill().unwrap();
        // Lines the child completed before dying count too.
        for l in lines.map_while(Result::ok) {
            if let Some(rest) = l.strip_prefix("FLUSHED ") {
                let parts: Vec<&str> = rest.split(' ').collect();
                if parts.len() == 2 && parts.iter().all(|p| p.len() == 26) {
                    flushed.extend(parts.into_iter().map(str::to_owned));
                }
            }
        }
        child.wait().unwrap();
        assert!(got > 0, "child printed nothing in round {round}");
        eprintln!("crash round {round}: {} ids flushed so far", flushed.len());

        let s = Store::open(dir.path()).expect("reopen after kill");
        let present: std::collections::HashSet<String> = outbox_ids(&s, &p).into_iter().collect();
        let missing: Vec<&String> = flushed.iter().filter(|i| !present.contains(*i)).collect();
        assert!(missing.is_empty(), "round {round}: lost {missing:?}");
        let last = s.last_id().unwrap().unwrap();
        assert!(flushed.iter().all(|i| *i <= last), "last id went back");
        assert_eq!(s.outbox_len(&p).unwrap(), present.len() as u64);
    }
}

/// Throughput figures (run with `--ignored --nocapture`; not an assertion).
#[test]
#[ignore = "measurement"]
fn measure_rates() {
    let (_d, s) = open();
    let p = key(1);
    let n = 2000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        send(&s, &p, "T");
    }
    let e = t.elapsed();
    eprintln!("enqueue: {:.0}/s", n as f64 / e.as_secs_f64());
    let n = 300;
    let t = std::time::Instant::now();
    for _ in 0..n {
        send(&s, &p, "T");
        s.flush_blocking().unwrap();
    }
    let e = t.elapsed();
    eprintln!(
        "enqueue+flush (sequential): {:.0}/s",
        n as f64 / e.as_secs_f64()
    );
    let lines: Vec<(Line, Vec<u8>)> = (0..n)
        .map(|i| in_msg("R", &format!("01J{i:023}"), None))
        .collect();
    let t = std::time::Instant::now();
    for (l, raw) in &lines {
        s.receive(&p, l, raw).unwrap();
    }
    let e = t.elapsed();
    eprintln!("receive: {:.0}/s", n as f64 / e.as_secs_f64());
}

#[test]
fn a_second_peer_using_a_thread_id_gets_its_own_thread_and_leaves_the_first_alone() {
    let (_d, s) = open();
    let (owner, stranger) = (key(1), key(2));
    send(&s, &owner, "thr_own");
    let before = s.thread_with(&owner, "thr_own").unwrap().unwrap();
    let st = state(
        "thr_own",
        "done",
        Some("hijacked"),
        "01K00000000000000000000099",
        "2026-01-01T00:00:00Z",
    );
    let r = s.receive(&stranger, &st, &st.encode()).unwrap();
    assert!(matches!(r, Received::New(n) if n > 0));
    let after = s.thread_with(&owner, "thr_own").unwrap().unwrap();
    assert_eq!(after.peer, owner);
    assert_eq!(after.theirs, before.theirs);
    assert_eq!(after.their_note, None);
    assert_eq!(after.unread, before.unread);
    let theirs = s.thread_with(&stranger, "thr_own").unwrap().unwrap();
    assert_eq!(theirs.theirs.as_deref(), Some("done"));
    assert_eq!(theirs.unread, 1);
    assert!(!theirs.opened_by_us);
    let named: Vec<PeerKey> = s
        .threads_named("thr_own")
        .unwrap()
        .into_iter()
        .map(|t| t.peer)
        .collect();
    assert_eq!(named.len(), 2);
    assert!(named.contains(&owner) && named.contains(&stranger));
    // An id of one peer is not "the" thread any more: both must be named with their peer.
    assert!(s.thread("thr_own").unwrap().is_none());
    let log = s.thread_log(0, &stranger, "thr_own", false, 10).unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].peer, stranger);
}

#[test]
fn introductions_are_hints_that_never_outrank_an_address_that_worked() {
    let (_d, s) = open();
    let (real, introducer) = (key(1), key(2));
    s.peer_seen(&real, Some("real@host"), None, &[], 1).unwrap();
    s.add_address_at(&real, "tls:10.0.0.9:7700", AddrSource::Hello, 1)
        .unwrap();
    // A false address sorting first as text, introduced for the real peer.
    let got = s
        .introduce(
            &introducer,
            &real,
            Some("evil"),
            Some("tls:1.1.1.1:1"),
            8,
            2,
        )
        .unwrap();
    assert_eq!(got, Introduced::Added);
    let order = |s: &Store| -> Vec<String> {
        s.addresses(&real)
            .unwrap()
            .into_iter()
            .map(|a| a.address)
            .collect()
    };
    assert_eq!(order(&s), ["tls:10.0.0.9:7700", "tls:1.1.1.1:1"]);
    // Even once the real one failed and the hint never worked.
    s.address_result(&real, "tls:10.0.0.9:7700", Err("refused"), 3)
        .unwrap();
    assert_eq!(order(&s)[0], "tls:10.0.0.9:7700");
    // A hint that worked ranks with the addresses learned from the peer.
    s.address_result(&real, "tls:1.1.1.1:1", Ok(()), 4).unwrap();
    assert_eq!(order(&s)[0], "tls:1.1.1.1:1");
    let hint = s
        .addresses(&real)
        .unwrap()
        .into_iter()
        .find(|a| a.source == AddrSource::Introduce)
        .unwrap();
    assert_eq!(hint.introduced_by, Some(introducer));
    // The known peer's record is untouched (no rename, not marked introduced).
    let rec = s.peer(&real).unwrap().unwrap();
    assert_eq!(rec.name.as_deref(), Some("real@host"));
    assert_eq!(rec.introduced_by, None);
}

#[test]
fn an_introduced_peer_is_marked_until_its_own_handshake() {
    let (_d, s) = open();
    let (p, introducer, other) = (key(3), key(4), key(5));
    s.introduce(&introducer, &p, Some("carol"), None, 8, 1)
        .unwrap();
    assert_eq!(s.peer(&p).unwrap().unwrap().introduced_by, Some(introducer));
    // A second introducer does not rename it.
    s.introduce(&other, &p, Some("mallory"), None, 8, 2)
        .unwrap();
    assert_eq!(s.peer(&p).unwrap().unwrap().name.as_deref(), Some("carol"));
    // Its handshake makes it a known peer.
    s.peer_seen(&p, Some("carol@host"), None, &[], 3).unwrap();
    assert_eq!(s.peer(&p).unwrap().unwrap().introduced_by, None);
}

#[test]
fn each_introducer_has_a_quota_of_keys() {
    let (_d, s) = open();
    let introducer = key(6);
    let mut outcomes = Vec::new();
    for n in 10..20u8 {
        outcomes.push(s.introduce(&introducer, &key(n), None, None, 4, 1).unwrap());
    }
    use Introduced::*;
    assert_eq!(
        outcomes,
        [
            Added, Added, Added, Added, OverQuota, OverQuota, OverQuota, OverQuota, OverQuota,
            OverQuota
        ]
    );
    // A repeat of a key it introduced is not a new one.
    assert_eq!(
        s.introduce(&introducer, &key(10), None, None, 4, 1)
            .unwrap(),
        Again
    );
    assert!(
        s.peer(&key(14)).unwrap().is_none(),
        "nothing stored over quota"
    );
    // Another introducer has its own quota.
    assert_eq!(
        s.introduce(&key(7), &key(14), None, None, 4, 1).unwrap(),
        Added
    );
}

/// The sum of the stored outbox records of `p` and the lines kept for them in the log,
/// the slow way.
fn outbox_bytes_scanned(s: &Store, p: &PeerKey) -> u64 {
    s.trees
        .t(super::tx::T::Outbox)
        .scan_prefix(p.as_bytes())
        .map(|kv| {
            let v = kv.unwrap().1;
            let (rec, _): (super::codec::OutRec, super::codec::Payload) =
                super::codec::unpack("outbox", &v).unwrap();
            rec.queued_len(v.len()) as u64
        })
        .sum()
}

#[test]
fn outbox_usage_counts_lines_and_bytes_through_every_removal() {
    let (d, s) = open();
    let p = key(1);
    let q = key(2);
    assert_eq!(s.outbox_usage(&p).unwrap(), (0, 0));
    let c1 = send_chunk(&s, &p, Some("A"));
    let _c2 = send_chunk(&s, &p, Some("A"));
    let m = send(&s, &p, "A");
    let b1 = send(&s, &p, "B");
    let b2 = send(&s, &p, "B");
    send(&s, &q, "Q");
    let (lines, bytes) = s.outbox_usage(&p).unwrap();
    assert_eq!(lines, 5);
    assert!(bytes > 0);
    assert_eq!(bytes, outbox_bytes_scanned(&s, &p));
    // Cumulative ack (msg and the chunks before it).
    assert!(s.ack(&p, "A", &m).unwrap());
    assert_eq!(s.outbox_usage(&p).unwrap().0, 2);
    assert_eq!(s.outbox_usage(&p).unwrap().1, outbox_bytes_scanned(&s, &p));
    // Resume.
    let seen = BTreeMap::from([("B".to_string(), b1.clone())]);
    assert_eq!(s.drop_seen(&p, &seen).unwrap(), 1);
    assert_eq!(s.outbox_usage(&p).unwrap().1, outbox_bytes_scanned(&s, &p));
    // Refused blob chunks (no record: scanned by ref).
    let c3 = send_chunk(&s, &p, Some("C"));
    assert_eq!(s.drop_blob_chunks(&p, "r1").unwrap(), vec![c3]);
    assert_eq!(s.outbox_usage(&p).unwrap().1, outbox_bytes_scanned(&s, &p));
    assert!(s.ack(&p, "B", &b2).unwrap());
    assert_eq!(s.outbox_usage(&p).unwrap(), (0, 0));
    assert_eq!(s.outbox_usage(&q).unwrap().1, outbox_bytes_scanned(&s, &q));
    // Retention.
    assert!(
        s.prune(crate::wire::time::now_ms() + RETENTION_MS + 60_000)
            .unwrap()
            > 0
    );
    assert_eq!(s.outbox_usage(&q).unwrap(), (0, 0));
    let _ = c1;
    // A database written before the counter existed gets it counted at open.
    send(&s, &q, "Q");
    let want = s.outbox_usage(&q).unwrap();
    s.trees.raw(super::tx::T::OutboxB).clear().unwrap();
    s.trees.t(super::tx::T::Meta).remove(b"outbox_b").unwrap();
    s.flush_blocking().unwrap();
    drop(s);
    let s = Store::open(d.path()).unwrap();
    assert_eq!(s.outbox_usage(&q).unwrap(), want);
}

/// The finished `snap.*` files sled left in `dir`.
fn snapshots(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("snap.") && !n.ends_with(".generating")
        })
        .collect();
    v.sort();
    v
}

/// A store in `home/db` with `n` queued lines, flushed and closed; returns their ids.
fn filled_home(home: &std::path::Path, n: usize) -> Vec<String> {
    let s = Store::open(&home.join("db")).unwrap();
    let ids: Vec<String> = (0..n).map(|_| send(&s, &key(1), "T")).collect();
    s.flush_blocking().unwrap();
    drop(s);
    // sled writes its snapshot while recovering at open.
    drop(Store::open(&home.join("db")).unwrap());
    ids
}

/// Regression (sled 0.34.7 reads a leftover `snap.*.generating` because it sorts last): a
/// kill during a snapshot write left the node unable to start.
#[test]
fn leftover_generating_snapshot_is_quarantined() {
    let home = tempfile::tempdir().unwrap();
    let ids = filled_home(home.path(), 50);
    let db = home.path().join("db");
    let snaps = snapshots(&db);
    assert!(!snaps.is_empty(), "sled wrote no snapshot");
    let good = std::fs::read(snaps.last().unwrap()).unwrap();
    let cut = good.len().min(2000) / 2;
    std::fs::write(db.join("snap.00000000FFFFFFFF.generating"), &good[..cut]).unwrap();
    let s = Store::open(&db).expect("opens with a leftover snapshot");
    assert_eq!(outbox_ids(&s, &key(1)), ids);
    drop(s);
    assert!(!db.join("snap.00000000FFFFFFFF.generating").exists());
    let q: Vec<String> = std::fs::read_dir(home.path().join("quarantine"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(q.len(), 1);
    assert!(q[0].ends_with("-snap.00000000FFFFFFFF.generating"), "{q:?}");
}

/// Lines of 256 bytes or more are stored compressed (DEFLATE from 1 KiB, LZ4 below) and
/// read back byte-exact; records written by earlier versions (DEFLATE at any size, or from
/// before compression) still read.
#[test]
fn long_lines_are_stored_compressed_and_old_records_still_read() {
    use super::codec::{pack, unpack, Payload, DEFLATED, DEFLATE_MIN, LZ4};
    let word = |r: &[u8]| u32::from_be_bytes(r[..4].try_into().unwrap());
    let (_d, s) = open();
    let p = key(1);
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(30);
    let b = |id: &str, ts: &str| msg("T", Some("subj"), &text, id, ts);
    let e = s.enqueue(&p, &[&b]).unwrap().pop().unwrap();
    assert!(e.line.len() > 1000);
    // The line is kept once, in the log (the outbox record points at it).
    let raw = s.trees.t(tx::T::Log).iter().next().unwrap().unwrap().1;
    assert_eq!(
        word(&raw) & (LZ4 | DEFLATED),
        DEFLATED,
        "stored DEFLATE-compressed"
    );
    assert!(raw.len() < e.line.len() / 2, "{} bytes stored", raw.len());
    assert_eq!(outbox_ids(&s, &p), vec![e.id.clone()]);
    assert_eq!(s.outbox_after(&p, None, 1).unwrap()[0].line, e.line);
    let (stored, logical) = s.data_bytes().unwrap();
    assert!(
        logical > stored + e.line.len() as u64 / 2,
        "{stored} {logical}"
    );
    // Log entry reads back byte-exact, also after a read-mark rewrite of its header.
    assert!(s.ack(&p, "T", &e.id).unwrap());
    let log = s.log(0, None, false, 10).unwrap();
    assert!(log[0].acked);
    assert_eq!(log[0].line, e.line);

    let hdr = serde_json::json!({"a": 1});
    let h = serde_json::to_vec(&hdr).unwrap();
    let old = |flag: u32, payload: &[u8]| {
        let mut r = (h.len() as u32 | flag).to_be_bytes().to_vec();
        r.extend_from_slice(&h);
        r.extend_from_slice(payload);
        r
    };
    // An uncompressed record in the old layout.
    let rec = old(0, text.as_bytes());
    let (got, payload): (serde_json::Value, Payload) = unpack("log", &rec).unwrap();
    assert_eq!(got, hdr);
    assert_eq!(&*payload.get("log").unwrap(), text.as_bytes());
    // A raw-DEFLATE record as earlier versions wrote it.
    let z = miniz_oxide::deflate::compress_to_vec(text.as_bytes(), 1);
    let rec = old(DEFLATED, &z);
    let (got, payload): (serde_json::Value, Payload) = unpack("log", &rec).unwrap();
    assert_eq!(got, hdr);
    assert_eq!(&*payload.get("log").unwrap(), text.as_bytes());
    // Kept as stored when only the header changes.
    let again = super::codec::repack(&hdr, payload).unwrap();
    assert_eq!(word(&again) & (LZ4 | DEFLATED), DEFLATED);
    // Below DEFLATE_MIN: LZ4, read back byte-exact.
    let mid = &text.as_bytes()[..DEFLATE_MIN - 1];
    let rec = pack(&hdr, mid).unwrap();
    assert_eq!(word(&rec) & (LZ4 | DEFLATED), LZ4);
    assert!(rec.len() < mid.len() / 2);
    let (_, payload): (serde_json::Value, Payload) = unpack("log", &rec).unwrap();
    assert_eq!(&*payload.get("log").unwrap(), mid);
    let again = super::codec::repack(&hdr, payload).unwrap();
    assert_eq!(word(&again) & (LZ4 | DEFLATED), LZ4);
    // Short payloads stay raw.
    let short = pack(&hdr, b"short").unwrap();
    assert_eq!(word(&short) & (LZ4 | DEFLATED), 0);
    // Blob chunk sized payloads too (no compression time on file transfers).
    let chunk = pack(&hdr, &vec![b'A'; super::codec::COMPRESS_MAX + 1]).unwrap();
    assert_eq!(word(&chunk) & (LZ4 | DEFLATED), 0);
    // Payloads that do not shrink by a sixteenth stay raw.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let noise: Vec<u8> = (0..600)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    let n = pack(&hdr, &noise).unwrap();
    assert_eq!(word(&n) & (LZ4 | DEFLATED), 0);
    assert_eq!(&n[n.len() - noise.len()..], &noise[..]);
}

/// Damaged compressed payloads read as corrupt (never a panic, nor an allocation beyond
/// what the codec ever compresses), for each codec.
#[test]
fn damaged_compressed_payloads_are_corrupt() {
    use super::codec::{pack, unpack, Payload, COMPRESS_MAX, DEFLATED, LZ4};
    let hdr = serde_json::json!({"a": 1});
    // Under DEFLATE_MIN: stored as LZ4.
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(15);
    let corrupt = |rec: &[u8]| match unpack::<serde_json::Value>("log", rec) {
        Err(StoreError::Corrupt { .. }) => true,
        Ok((_, payload)) => matches!(payload.get("log"), Err(StoreError::Corrupt { .. })),
        Err(e) => panic!("{e}"),
    };
    let good = pack(&hdr, text.as_bytes()).unwrap();
    assert_ne!(u32::from_be_bytes(good[..4].try_into().unwrap()) & LZ4, 0);
    let (_, payload): (serde_json::Value, Payload) = unpack("log", &good).unwrap();
    assert_eq!(&*payload.get("log").unwrap(), text.as_bytes());
    // Truncated block.
    assert!(corrupt(&good[..good.len() - 10]));
    // Shorter than the length prefix of the block.
    let h = serde_json::to_vec(&hdr).unwrap();
    let payload_at = 4 + h.len();
    assert!(corrupt(&good[..payload_at + 2]));
    // A length prefix over the line cap, or one that does not match the block.
    for len in [u32::MAX, (COMPRESS_MAX + 1) as u32, text.len() as u32 + 1] {
        let mut bad = good.clone();
        bad[payload_at..payload_at + 4].copy_from_slice(&len.to_le_bytes());
        assert!(corrupt(&bad), "length {len}");
    }
    // Both codec bits at once.
    let mut both = good.clone();
    let w = u32::from_be_bytes(both[..4].try_into().unwrap()) | DEFLATED | LZ4;
    both[..4].copy_from_slice(&w.to_be_bytes());
    assert!(corrupt(&both));
    // Garbage marked as DEFLATE.
    let mut bad = good[..payload_at].to_vec();
    let w = (h.len() as u32) | DEFLATED;
    bad[..4].copy_from_slice(&w.to_be_bytes());
    bad.extend_from_slice(&[0xff; 40]);
    assert!(corrupt(&bad));
}

#[test]
fn forget_peer_removes_its_records_and_no_other_peers() {
    let (_d, s) = open();
    let (a, b) = (key(1), key(2));
    for p in [&a, &b] {
        s.peer_seen(p, Some("x"), None, &[], 1).unwrap();
        s.add_address(p, "tcp:127.0.0.1:1", AddrSource::Connect)
            .unwrap();
    }
    send(&s, &a, "thr_a_out");
    send(&s, &b, "thr_b_out");
    let l = msg(
        "thr_a_in",
        None,
        "hi",
        "01K00000000000000000000001",
        "2026-01-01T00:00:00.000Z",
    );
    s.receive(&a, &l, &l.encode()).unwrap();
    let l = msg(
        "thr_b_in",
        None,
        "hi",
        "01K00000000000000000000001",
        "2026-01-01T00:00:00.000Z",
    );
    s.receive(&b, &l, &l.encode()).unwrap();
    assert!(!s.seen(&a).unwrap().is_empty());

    let f = s.forget_peer(&a).unwrap();
    assert_eq!(
        f,
        Forgotten {
            peer: true,
            addresses: 1,
            threads: 2,
            log: 2,
            outbox: 1,
            seen: 1,
        }
    );
    assert!(s.peer(&a).unwrap().is_none());
    assert!(s.addresses(&a).unwrap().is_empty());
    assert!(s.seen(&a).unwrap().is_empty());
    assert_eq!(s.outbox_len(&a).unwrap(), 0);
    assert!(!s.outbox_peers().unwrap().contains(&a));
    let threads: Vec<String> = s.threads().unwrap().into_iter().map(|t| t.th).collect();
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert!(
        threads.iter().all(|t| t.starts_with("thr_b")),
        "{threads:?}"
    );
    assert!(s
        .log(0, None, false, 100)
        .unwrap()
        .iter()
        .all(|e| e.peer == b));
    // The other peer is untouched.
    assert!(s.peer(&b).unwrap().is_some());
    assert_eq!(s.addresses(&b).unwrap().len(), 1);
    assert_eq!(s.outbox_len(&b).unwrap(), 1);
    // A replay of a line it sent before is still a duplicate (dedup is permanent).
    let l = msg(
        "thr_a_in",
        None,
        "hi",
        "01K00000000000000000000001",
        "2026-01-01T00:00:00.000Z",
    );
    assert_eq!(s.receive(&a, &l, &l.encode()).unwrap(), Received::Duplicate);
    // Forgetting again removes nothing.
    assert!(!s.forget_peer(&a).unwrap().any());
}

#[test]
fn dedup_from_memory_keeps_lower_new_ids_and_replays_after_reopen() {
    // The in-memory dedup bound (largest id received per peer) only skips the disk read
    // for ids above it: a new line with a lower id is still new, a replay of any earlier
    // line is still a duplicate, also after a reopen (the bound is reloaded from disk).
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    let (l3, r3) = in_msg("T", ID3, None);
    let (l1, r1) = in_msg("T", ID1, None);
    let (l2, r2) = in_msg("U", ID2, None);
    let (l4, r4) = in_msg("T", ID4, None);
    {
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.receive(&p, &l3, &r3).unwrap(), Received::New(1));
        let got = s
            .receive_batch(&p, &[(&l1, &r1), (&l3, &r3), (&l1, &r1), (&l2, &r2)])
            .unwrap();
        assert_eq!(
            got,
            vec![
                Received::New(2),
                Received::Duplicate,
                Received::Duplicate,
                Received::New(3)
            ]
        );
        s.flush_blocking().unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    for (l, r) in [(&l1, &r1), (&l2, &r2), (&l3, &r3)] {
        assert_eq!(s.receive(&p, l, r).unwrap(), Received::Duplicate);
    }
    assert_eq!(s.receive(&p, &l4, &r4).unwrap(), Received::New(4));
    assert_eq!(s.receive(&p, &l4, &r4).unwrap(), Received::Duplicate);
    assert_eq!(s.thread("T").unwrap().unwrap().unread, 3);
    assert_eq!(s.seen(&p).unwrap()["T"], ID4);
    assert_eq!(s.seen(&p).unwrap()["U"], ID2);
}

/// The queue of `ack_removes_and_is_cumulative_for_chunks`, in `s` for `p`.
fn chunks_and_msgs(s: &Store, p: &PeerKey) -> [String; 7] {
    let c1 = send_chunk(s, p, Some("A"));
    let cb = send_chunk(s, p, Some("B"));
    let c2 = send_chunk(s, p, Some("A"));
    let cu = send_chunk(s, p, None);
    let m0 = send(s, p, "A");
    let m = send(s, p, "A");
    let c3 = send_chunk(s, p, Some("A"));
    [c1, cb, c2, cu, m0, m, c3]
}

#[test]
fn acks_of_a_batch_and_its_lines_are_one_transaction_with_the_effect_of_single_acks() {
    let (_d, s) = open();
    let p = key(1);
    let [_c1, cb, _c2, cu, m0, m, c3] = chunks_and_msgs(&s, &p);
    let (line, raw) = in_msg("T", ID1, None);
    let before = s.transaction_count();
    let acks = [
        ("A", m.as_str()),
        ("A", m.as_str()),
        ("B", cb.as_str()),
        ("A", ID2),
        ("A", m0.as_str()),
    ];
    let (got, found) = s.receive_batch_acks(&p, &[(&line, &raw)], &acks).unwrap();
    assert_eq!(
        s.transaction_count() - before,
        1,
        "lines and acks: one transaction"
    );
    assert!(matches!(got[..], [Received::New(n)] if n > 0));
    assert_eq!(found, vec![true, false, true, false, true]);
    assert_eq!(outbox_ids(&s, &p), vec![cu, c3]);
    assert_eq!(s.received_line(&p, ID1).unwrap(), Some(raw.clone()));

    // The same acks one at a time on the same queue leave the same counters.
    let (_d2, t) = open();
    let [_, cb2, _, _, m02, m2, _] = chunks_and_msgs(&t, &p);
    for re in [&m2, &m2, &cb2, &m02] {
        t.ack(&p, "A", re).unwrap();
    }
    assert_eq!(s.outbox_usage(&p).unwrap(), t.outbox_usage(&p).unwrap());
    assert_eq!(s.outbox_usage(&p).unwrap().0, 2);
    let acked = |st: &Store| {
        st.log(0, None, false, 100)
            .unwrap()
            .iter()
            .filter(|e| e.dir == Dir::Out && e.acked)
            .count()
    };
    assert_eq!(acked(&s), 5);
    assert_eq!(acked(&s), acked(&t));

    // Acks alone: one transaction too; none that retires nothing.
    let before = s.transaction_count();
    let (_, found) = s.receive_batch_acks(&p, &[], &[("A", ID2)]).unwrap();
    assert_eq!(found, vec![false]);
    assert_eq!(
        s.transaction_count(),
        before,
        "nothing to write, nothing committed"
    );
}

/// A queued line (other than a chunk) is stored once: the outbox record holds no copy and
/// reads its line from the out log; the peer's queued bytes still count the line; an ack
/// marks the log entry without rewriting it; pruning keeps the log entry of a line still
/// queued; an outbox record in the older layout (the line as its payload) still reads.
#[test]
fn a_queued_line_is_stored_once_and_read_from_the_log() {
    use super::codec::{pack, unpack, OutRec, Payload};
    let (_d, s) = open();
    let p = key(1);
    let text = "x".repeat(40_000);
    let b = |id: &str, ts: &str| msg("T", None, &text, id, ts);
    let e = s.enqueue(&p, &[&b]).unwrap().pop().unwrap();
    let raw = s.trees.t(tx::T::Outbox).iter().next().unwrap().unwrap().1;
    assert!(raw.len() < 200, "outbox record of {} bytes", raw.len());
    let (rec, payload): (OutRec, Payload) = unpack("outbox", &raw).unwrap();
    assert_eq!(rec.log_len, Some(e.line.len() as u64));
    assert_eq!(payload.stored_len(), 0);
    assert_eq!(s.outbox_after(&p, None, 10).unwrap()[0].line, e.line);
    let (n, bytes) = s.outbox_usage(&p).unwrap();
    assert_eq!(n, 1);
    assert!(bytes >= e.line.len() as u64, "{bytes} queued bytes");
    assert_eq!(bytes, outbox_bytes_scanned(&s, &p));

    // Prune long after: the queued line's log entry stays with its outbox record.
    let far = crate::wire::time::now_ms() + 30 * 24 * 3600 * 1000;
    let kept_seq = rec.seq;
    s.trees
        .t(tx::T::Outbox)
        .insert(
            super::codec::pkey(&p, b"7ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
            pack(&rec, b"").unwrap(),
        )
        .unwrap();
    s.trees
        .t(tx::T::Outbox)
        .remove(super::codec::pkey(&p, e.id.as_bytes()))
        .unwrap();
    s.prune(far).unwrap();
    assert!(s
        .trees
        .t(tx::T::Log)
        .get(super::codec::u64_be(kept_seq))
        .unwrap()
        .is_some());
    assert_eq!(s.outbox_after(&p, None, 10).unwrap()[0].line, e.line);
    s.trees.raw(tx::T::Outbox).clear().unwrap();

    // The ack marks the entry apart; the entry itself is not rewritten.
    let usage = s.outbox_usage(&p).unwrap();
    let e2 = s.enqueue(&p, &[&b]).unwrap().pop().unwrap();
    let queued = s.outbox_usage(&p).unwrap();
    assert_eq!(queued.0, usage.0 + 1);
    assert!(queued.1 >= usage.1 + e2.line.len() as u64);
    let before = s
        .trees
        .t(tx::T::Log)
        .get(super::codec::u64_be(e2.seq))
        .unwrap();
    assert!(s.ack(&p, "T", &e2.id).unwrap());
    let after = s
        .trees
        .t(tx::T::Log)
        .get(super::codec::u64_be(e2.seq))
        .unwrap();
    assert_eq!(before, after);
    let log = s.log(e2.seq - 1, None, false, 10).unwrap();
    assert!(log[0].acked);
    assert_eq!(log[0].line, e2.line);
    assert_eq!(s.outbox_usage(&p).unwrap(), usage);

    // Older layout: the line in the outbox record itself.
    let old = OutRec {
        th: Some("T".into()),
        kind: "msg".into(),
        seq: 999_999,
        log_len: None,
    };
    s.trees
        .t(tx::T::Outbox)
        .insert(
            super::codec::pkey(&p, b"01JOLD0000000000000000000A"),
            pack(&old, b"{\"t\":\"ping\"}").unwrap(),
        )
        .unwrap();
    assert_eq!(
        s.outbox_after(&p, None, 10).unwrap()[0].line,
        b"{\"t\":\"ping\"}"
    );
}

/// A replay reading the outbox while a prune (or a forget) removes old lines with their
/// log entries in one transaction: a record the scan saw before that commit and whose log
/// entry is gone after it has left the outbox, so it is skipped, not a corrupt store (which
/// closed the peer's session with `err internal`). Bounded: 12 rounds of 300 lines, each
/// read at most 40 times while the prune runs.
#[test]
fn a_replay_racing_a_prune_skips_the_lines_pruned_meanwhile() {
    for _ in 0..12 {
        let (_d, s) = open();
        let s = Arc::new(s);
        let p = key(1);
        let b = |id: &str, ts: &str| msg("T", None, "hello there", id, ts);
        let builders: Vec<LineBuilder<'_>> = (0..300).map(|_| &b as LineBuilder<'_>).collect();
        s.enqueue(&p, &builders).unwrap();
        let pruner = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.prune(crate::wire::time::now_ms() + 30 * 24 * 3600 * 1000)
                    .unwrap()
            })
        };
        for _ in 0..40 {
            let lines = s.outbox_after(&p, None, usize::MAX).unwrap();
            assert!(lines.iter().all(|e| !e.line.is_empty()));
            if pruner.is_finished() {
                break;
            }
        }
        assert_eq!(pruner.join().unwrap(), 600);
        assert!(s.outbox_after(&p, None, usize::MAX).unwrap().is_empty());
    }
}

/// `payload_only` (the outbox's replay reads a log record's line without its header)
/// returns what `unpack` returns as payload, and refuses what `unpack` refuses for the
/// record's framing: a missing length word, two codec bits, a header past the end.
#[test]
fn payload_only_agrees_with_unpack_and_refuses_bad_framing() {
    use super::codec::{pack, payload_only, unpack, Payload, DEFLATED, LZ4};
    let hdr = serde_json::json!({"dir": "out", "id": "x"});
    // Over DEFLATE_MIN (DEFLATE), 300 bytes (LZ4), 5 bytes (raw).
    let text = "a line long enough to be compressed, ".repeat(40);
    assert!(text.len() >= super::codec::DEFLATE_MIN);
    for payload in [&b"short"[..], text.as_bytes(), &text.as_bytes()[..300]] {
        let rec = pack(&hdr, payload).unwrap();
        let (_, full): (serde_json::Value, Payload) = unpack("log", &rec).unwrap();
        let only = payload_only("log", &rec).unwrap();
        assert_eq!(&*only.get("log").unwrap(), payload);
        assert_eq!(&*full.get("log").unwrap(), payload);
    }
    let err = |rec: &[u8]| match payload_only("log", rec) {
        Err(StoreError::Corrupt {
            tree: "log",
            detail,
        }) => detail,
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(_) => panic!("accepted {rec:?}"),
    };
    assert!(err(&[0, 0, 1]).contains("shorter than its length prefix"));
    let mut two = (2u32 | LZ4 | DEFLATED).to_be_bytes().to_vec();
    two.extend_from_slice(b"{}x");
    assert!(err(&two).contains("two codecs"));
    let mut past = 50u32.to_be_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert!(err(&past).contains("out of range"));
    // The header is not read: one that is not JSON still gives the payload (unpack refuses
    // it; the outbox checks the line's length against its own record instead).
    let mut bad_header = 3u32.to_be_bytes().to_vec();
    bad_header.extend_from_slice(b"{{{line");
    assert_eq!(
        &*payload_only("log", &bad_header)
            .unwrap()
            .get("log")
            .unwrap(),
        b"line"
    );
    assert!(unpack::<serde_json::Value>("log", &bad_header).is_err());
}

/// The outbox reads a queued line from its out log entry without the entry's header; a log
/// entry whose line is not the queued one (another length) is reported, not sent.
#[test]
fn an_outbox_line_whose_log_entry_changed_is_reported() {
    let (_d, s) = open();
    let p = key(1);
    let b = |id: &str, ts: &str| msg("T", None, "hello there", id, ts);
    let e = s.enqueue(&p, &[&b]).unwrap().pop().unwrap();
    assert_eq!(s.outbox_after(&p, None, 10).unwrap()[0].line, e.line);
    let log = s.trees.t(tx::T::Log);
    let (k, _) = log.iter().next().unwrap().unwrap();
    let other = super::codec::pack(&serde_json::json!({}), b"{\"t\":\"msg\"}").unwrap();
    log.insert(k, other).unwrap();
    match s.outbox_after(&p, None, 10) {
        Err(StoreError::Corrupt {
            tree: "outbox",
            detail,
        }) => {
            assert!(detail.contains("is not the queued line"), "{detail}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// A replay batch reads its lines' log entries with one range scan when their seqs are
/// dense (at most twice as many entries as lines between the first and the last) and
/// looks each one up otherwise; either way every line is its log entry's, in queue order.
#[test]
fn outbox_lines_resolve_from_a_dense_scan_or_from_lookups() {
    // (other peers' lines logged after each of a's, whether the scan reads ahead)
    for (between, scans) in [(0, true), (1, true), (2, false)] {
        let (_d, s) = open();
        let a = key(1);
        let mut ids = Vec::new();
        for i in 0..40u8 {
            ids.push(send(&s, &a, "t1"));
            for j in 0..between {
                send(&s, &key(10 + j), "t2");
            }
            if i == 0 {
                // A line of another peer between a's first two: still in the scan's range.
                send(&s, &key(9), "t3");
            }
        }
        let batch = s.outbox_after(&a, None, usize::MAX).unwrap();
        assert_eq!(batch.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), ids);
        let log = log_lines(&s);
        for e in &batch {
            assert_eq!(log.get(&e.seq), Some(&e.line), "between {between}");
        }
        let run = super::outbox::LogRun::read(&s.trees, batch.iter().map(|e| e.seq)).unwrap();
        let span = (batch.last().unwrap().seq - batch[0].seq + 1) as usize;
        assert!(span > batch.len() || between == 0);
        if scans {
            // Only a's entries are kept from the span.
            assert_eq!(run.read_ahead(), batch.len(), "between {between}: one scan");
        } else {
            assert_eq!(run.read_ahead(), 0, "between {between}: lookups only");
        }
    }
}

/// A dense batch's scan keeps only the entries it wants and stops once the other peers'
/// entries it passed over reach a bound in bytes (their lines may be 1 MiB each): the
/// lines it did not reach are looked up, and every line is still its log entry's.
#[test]
fn a_dense_scan_stops_after_a_bound_of_other_peers_bytes() {
    let (_d, s) = open();
    let (a, big_peer) = (key(1), key(10));
    // Letters from a xorshift generator: large after compression too.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let big: String = (0..400_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (b'a' + (x % 26) as u8) as char
        })
        .collect();
    let b = |id: &str, ts: &str| msg("t2", None, &big, id, ts);
    for _ in 0..20 {
        send(&s, &a, "t1");
        s.enqueue(&big_peer, &[&b]).unwrap();
    }
    let batch = s.outbox_after(&a, None, usize::MAX).unwrap();
    assert_eq!(batch.len(), 20);
    for e in &batch {
        assert_eq!(s.log(e.seq - 1, None, false, 1).unwrap()[0].line, e.line);
    }
    let run = super::outbox::LogRun::read(&s.trees, batch.iter().map(|e| e.seq)).unwrap();
    // Dense (one big line between two of a's), but the scan stopped early.
    assert!(
        run.read_ahead() > 0 && run.read_ahead() < batch.len(),
        "kept {}",
        run.read_ahead()
    );
}

/// `outbox_has` answers for one line without reading the outbox: true once queued, false
/// after its ack, for another peer, and for an id never queued.
#[test]
fn outbox_has_follows_a_line_from_queue_to_ack() {
    let (_d, s) = open();
    let (a, b) = (key(1), key(2));
    let id = send(&s, &a, "t1");
    let other = send(&s, &a, "t1");
    assert!(s.outbox_has(&a, &id).unwrap());
    assert!(!s.outbox_has(&b, &id).unwrap(), "another peer's outbox");
    assert!(!s.outbox_has(&a, "01NEVERQUEUED").unwrap());
    assert!(s.ack(&a, "t1", &id).unwrap());
    assert!(!s.outbox_has(&a, &id).unwrap(), "acked");
    assert!(s.outbox_has(&a, &other).unwrap());
}
