//! Refusals from peers: an `err` whose `re` names one of our lines is stored in that
//! line's thread, so `read`, `tail` and `wait` show it (issue 9, case 3).

use super::codec::{dec, enc, hex, pack, u64_be, unpack, LogRec, Payload, ThreadRec};
use super::imp::META_LOG_SEQ;
use super::tx::{db_err, Tx, T};
use super::{Dir, LogEntry, Store, StoreError};
use crate::wire::{self, Line, PeerKey};

/// Most log entries [`Store::record_peer_err`] looks at (newest first) to find the line
/// an err names: an err about an older line is not stored (only logged and emitted).
pub const ERR_SCAN_MAX: usize = 20_000;

/// Longest `detail` of a stored err, bytes (cut on a character boundary).
pub const MAX_ERR_DETAIL: usize = 1024;

/// Clock slack when the ULID time of `re` bounds the scan: entries logged more than this
/// long before the id's time cannot be the line, ms.
const ID_TIME_SLACK_MS: u64 = 60_000;

/// What [`Store::record_peer_err`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum ErrRecorded {
    /// Stored as an unread inbound entry of our line's thread.
    Stored(LogEntry),
    /// An err about that line from that peer is already stored: nothing changed.
    Duplicate,
    /// No `re`, or `re` is not one of our recent lines to this peer: nothing stored.
    NotOurs,
}

impl Store {
    /// Store `err` from `peer` against the thread of our line `err.re`, as an unread
    /// inbound log entry of kind `err` (`detail` cut to [`MAX_ERR_DETAIL`] bytes; the
    /// thread's unread count and updated time move). Not durable until [`Store::flush`].
    ///
    /// Bounds (peer input): only an err whose `re` is the id (a ULID, not from the future)
    /// of one of our lines to this same peer among the newest [`ERR_SCAN_MAX`] log entries
    /// logged since the id's time counts, and at most one err
    /// per such line is stored ([`ErrRecorded::Duplicate`] after that), so a peer can store
    /// no more errs than we sent it lines. The thread is taken from our line, never from
    /// the err's `th`.
    pub fn record_peer_err(
        &self,
        peer: &PeerKey,
        err: &wire::ErrLine,
    ) -> Result<ErrRecorded, StoreError> {
        self.record_peer_err_within(peer, err, ERR_SCAN_MAX)
    }

    /// [`Store::record_peer_err`] looking at most `scan_max` log entries.
    fn record_peer_err_within(
        &self,
        peer: &PeerKey,
        err: &wire::ErrLine,
        scan_max: usize,
    ) -> Result<ErrRecorded, StoreError> {
        let Some(re) = err.re.as_deref() else {
            return Ok(ErrRecorded::NotOurs);
        };
        // Our ids are ULIDs: anything else, or one from the future, is not ours (and costs
        // no scan).
        let Ok(id) = ulid::Ulid::from_string(re) else {
            return Ok(ErrRecorded::NotOurs);
        };
        let id_ms = id.timestamp_ms();
        if id_ms > wire::time::now_ms().saturating_add(ID_TIME_SLACK_MS) {
            return Ok(ErrRecorded::NotOurs);
        }
        let mut w = self.writer();
        let peer_hex = hex(peer.as_bytes());
        let mut th = None;
        // Newest first, back to the id's time: headers only, a line is read only for an
        // err of this peer.
        for kv in self.trees.t(T::Log).iter().rev().take(scan_max) {
            let (_, v) = kv.map_err(db_err)?;
            let (l, payload): (LogRec, Payload) = unpack("log", &v)?;
            if l.at.saturating_add(ID_TIME_SLACK_MS) < id_ms {
                break;
            }
            if l.peer != peer_hex {
                continue;
            }
            match l.dir {
                Dir::In if l.kind == "err" => {
                    let line = payload.get("log")?;
                    let same = matches!(wire::parse_line(&line),
                        Ok(Line::Err(x)) if x.re.as_deref() == Some(re));
                    if same {
                        return Ok(ErrRecorded::Duplicate);
                    }
                }
                Dir::Out if l.id == re => {
                    th = l.th;
                    break;
                }
                _ => {}
            }
        }
        let Some(th) = th else {
            return Ok(ErrRecorded::NotOurs);
        };
        let mut stored = err.clone();
        stored.th = Some(th.clone());
        if let Some(d) = &stored.detail {
            stored.detail = Some(crate::blob::cut(d, MAX_ERR_DETAIL).to_string());
        }
        let line = Line::Err(stored).encode();
        let now = wire::time::now_ms();
        let seq = w.log_seq_value() + 1;
        let mut tx = Tx::new(&self.trees);
        let entry = put_err_entry(&mut tx, peer, seq, err.id.clone(), th, line, now)?;
        tx.commit()?;
        let ids = w.ids_clone();
        w.set_after_commit(ids, seq);
        Ok(ErrRecorded::Stored(entry))
    }
}

/// Store `line` (an encoded `err`, id `id`, in thread `th`) in `tx` as the unread inbound
/// log entry `seq` from `peer`: the thread's unread count rises (only this peer's thread
/// of that id) and the log sequence becomes `seq`. Returns the entry.
pub(super) fn put_err_entry(
    tx: &mut Tx<'_>,
    peer: &PeerKey,
    seq: u64,
    id: String,
    th: String,
    line: Vec<u8>,
    now: u64,
) -> Result<LogEntry, StoreError> {
    let rec = LogRec {
        dir: Dir::In,
        peer: hex(peer.as_bytes()),
        id: id.clone(),
        th: Some(th.clone()),
        kind: "err".into(),
        at: now,
        read: false,
        acked: true,
    };
    tx.put(T::Log, u64_be(seq), pack(&rec, &line)?);
    // Threads are keyed by (th, peer): only this peer's thread is touched.
    let tk = super::threads::tkey(&th, peer);
    if let Some(v) = tx.get(T::Threads, &tk)? {
        let mut t: ThreadRec = dec("threads", &v)?;
        t.unread += 1;
        t.updated = t.updated.max(now);
        tx.put(T::Threads, tk, enc(&t)?);
    }
    tx.put(T::Meta, META_LOG_SEQ, u64_be(seq).to_vec());
    Ok(LogEntry {
        seq,
        dir: Dir::In,
        peer: *peer,
        id,
        th: Some(th),
        kind: "err".into(),
        line,
        at_ms: now,
        read: false,
        acked: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Msg, Part, TextPart};

    fn key(n: u8) -> PeerKey {
        crate::identity::Identity::from_seed(&[n; 32]).key()
    }

    fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(dir.path()).expect("open");
        (dir, s)
    }

    /// Queue a msg to `p` in `th`; its id.
    fn send(s: &Store, p: &PeerKey, th: &str) -> String {
        let b = |id: &str, ts: &str| {
            Line::Msg(Msg {
                id: id.into(),
                ts: ts.into(),
                th: th.into(),
                re: None,
                subject: None,
                parts: vec![Part::Text(TextPart { text: "hi".into() })],
            })
        };
        s.enqueue(p, &[&b]).expect("enqueue")[0].id.clone()
    }

    fn err(id: &str, th: Option<&str>, re: Option<&str>, detail: &str) -> wire::ErrLine {
        wire::ErrLine {
            id: id.into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: th.map(Into::into),
            re: re.map(Into::into),
            code: "forbidden".into(),
            detail: Some(detail.into()),
            blob_ref: None,
        }
    }

    fn unread(s: &Store, th: &str) -> u64 {
        s.thread(th).unwrap().map(|t| t.unread).unwrap_or(0)
    }

    #[test]
    fn an_err_about_our_line_is_stored_unread_in_its_thread() {
        let (_d, s) = open();
        let bob = key(2);
        let id = send(&s, &bob, "thr_a");
        // The err's own `th` is not trusted: the thread comes from our line.
        let r = s
            .record_peer_err(
                &bob,
                &err(
                    "01K0000000000000000000000E",
                    Some("thr_other"),
                    Some(&id),
                    "no grant",
                ),
            )
            .unwrap();
        let ErrRecorded::Stored(e) = r else {
            panic!("not stored: {r:?}")
        };
        assert_eq!(e.th.as_deref(), Some("thr_a"));
        assert_eq!(e.kind, "err");
        let unread_lines = s.log(0, Some("thr_a"), true, 10).unwrap();
        assert_eq!(unread_lines.len(), 1);
        let Ok(Line::Err(stored)) = wire::parse_line(&unread_lines[0].line) else {
            panic!("not an err line")
        };
        assert_eq!(stored.re.as_deref(), Some(id.as_str()));
        assert_eq!(stored.th.as_deref(), Some("thr_a"));
        assert_eq!(unread(&s, "thr_a"), 1);
        assert!(s.thread("thr_other").unwrap().is_none());
    }

    #[test]
    fn a_second_err_about_the_same_line_is_not_stored() {
        let (_d, s) = open();
        let bob = key(2);
        let id = send(&s, &bob, "thr_a");
        let first = s
            .record_peer_err(
                &bob,
                &err("01K0000000000000000000000E", None, Some(&id), "x"),
            )
            .unwrap();
        assert!(matches!(first, ErrRecorded::Stored(_)));
        for n in 0..3 {
            let again = s
                .record_peer_err(
                    &bob,
                    &err(
                        &format!("01K000000000000000000000F{n}"),
                        None,
                        Some(&id),
                        "y",
                    ),
                )
                .unwrap();
            assert_eq!(again, ErrRecorded::Duplicate);
        }
        assert_eq!(s.log(0, Some("thr_a"), true, 10).unwrap().len(), 1);
        assert_eq!(unread(&s, "thr_a"), 1);
    }

    #[test]
    fn an_err_without_re_or_about_a_line_that_is_not_ours_is_not_stored() {
        let (_d, s) = open();
        let (bob, carol) = (key(2), key(3));
        let to_carol = send(&s, &carol, "thr_c");
        let cases = [
            ("no re", None),
            ("unknown id", Some("01K00000000000000000000ZZZ")),
            ("not an id", Some("hello")),
            ("an id from the future", Some("7ZZZZZZZZZZZZZZZZZZZZZZZZZ")),
            // Our line to another peer: bob cannot refuse it.
            ("another peer's line", Some(to_carol.as_str())),
        ];
        for (what, re) in cases {
            let r = s
                .record_peer_err(
                    &bob,
                    &err("01K0000000000000000000000E", Some("thr_c"), re, "x"),
                )
                .unwrap();
            assert_eq!(r, ErrRecorded::NotOurs, "{what}");
        }
        assert!(s.log(0, None, true, 10).unwrap().is_empty());
        assert_eq!(unread(&s, "thr_c"), 0);
    }

    #[test]
    fn a_long_detail_is_cut() {
        let (_d, s) = open();
        let bob = key(2);
        let id = send(&s, &bob, "thr_a");
        let long = "é".repeat(MAX_ERR_DETAIL);
        let ErrRecorded::Stored(e) = s
            .record_peer_err(
                &bob,
                &err("01K0000000000000000000000E", None, Some(&id), &long),
            )
            .unwrap()
        else {
            panic!("not stored")
        };
        let Ok(Line::Err(stored)) = wire::parse_line(&e.line) else {
            panic!("not an err line")
        };
        let d = stored.detail.unwrap();
        assert!(
            d.len() <= MAX_ERR_DETAIL && d.len() >= MAX_ERR_DETAIL - 1,
            "{}",
            d.len()
        );
    }

    #[test]
    fn the_scan_for_our_line_is_bounded() {
        let (_d, s) = open();
        let bob = key(2);
        let old = send(&s, &bob, "thr_a");
        for _ in 0..20 {
            send(&s, &bob, "thr_b");
        }
        let e = err("01K0000000000000000000000E", None, Some(&old), "x");
        let r = s.record_peer_err_within(&bob, &e, 20).unwrap();
        assert_eq!(r, ErrRecorded::NotOurs);
        // One entry further back, it is found.
        let r = s.record_peer_err_within(&bob, &e, 21).unwrap();
        assert!(matches!(r, ErrRecorded::Stored(_)), "{r:?}");
    }
}
