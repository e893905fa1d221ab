//! Refusals from peers: an `err` whose `re` names one of our lines is stored in that
//! line's thread, so `read`, `tail` and `wait` show it (issue 9, case 3).

use super::codec::{dec, enc, hex, pack, u64_be, LogRec, ThreadRec};
use super::imp::{log_entry, META_LOG_SEQ};
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
    /// Bounds (peer input): only an err whose `re` is the id of one of our lines to this
    /// same peer among the newest [`ERR_SCAN_MAX`] log entries counts, and at most one err
    /// per such line is stored ([`ErrRecorded::Duplicate`] after that), so a peer can store
    /// no more errs than we sent it lines. The thread is taken from our line, never from
    /// the err's `th`.
    pub fn record_peer_err(
        &self,
        peer: &PeerKey,
        err: &wire::ErrLine,
    ) -> Result<ErrRecorded, StoreError> {
        let Some(re) = err.re.as_deref() else {
            return Ok(ErrRecorded::NotOurs);
        };
        let mut w = self.writer();
        let id_ms = ulid::Ulid::from_string(re).ok().map(|u| u.timestamp_ms());
        let mut th = None;
        for kv in self.trees.t(T::Log).iter().rev().take(ERR_SCAN_MAX) {
            let (k, v) = kv.map_err(db_err)?;
            let e = log_entry(&k, &v)?;
            if id_ms.is_some_and(|t| e.at_ms.saturating_add(ID_TIME_SLACK_MS) < t) {
                break;
            }
            if e.peer != *peer {
                continue;
            }
            match e.dir {
                Dir::In if e.kind == "err" => {
                    let same = wire::parse_line(&e.line)
                        .ok()
                        .is_some_and(|l| matches!(l, Line::Err(x) if x.re.as_deref() == Some(re)));
                    if same {
                        return Ok(ErrRecorded::Duplicate);
                    }
                }
                Dir::Out if e.id == re => {
                    th = e.th;
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
        let peer_hex = hex(peer.as_bytes());
        let mut tx = Tx::new(&self.trees);
        let rec = LogRec {
            dir: Dir::In,
            peer: peer_hex.clone(),
            id: err.id.clone(),
            th: Some(th.clone()),
            kind: "err".into(),
            at: now,
            read: false,
            acked: true,
        };
        tx.put(T::Log, u64_be(seq), pack(&rec, &line)?);
        if let Some(v) = tx.get(T::Threads, th.as_bytes())? {
            let mut t: ThreadRec = dec("threads", &v)?;
            if t.peer == peer_hex {
                t.unread += 1;
                t.updated = t.updated.max(now);
                tx.put(T::Threads, th.as_bytes(), enc(&t)?);
            }
        }
        tx.put(T::Meta, META_LOG_SEQ, u64_be(seq).to_vec());
        tx.commit()?;
        let ids = w.ids_clone();
        w.set_after_commit(ids, seq);
        Ok(ErrRecorded::Stored(LogEntry {
            seq,
            dir: Dir::In,
            peer: *peer,
            id: err.id.clone(),
            th: Some(th),
            kind: "err".into(),
            line,
            at_ms: now,
            read: false,
            acked: true,
        }))
    }
}
