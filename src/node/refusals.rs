//! An `err` from a peer about one of our lines: stored in that line's thread (see
//! [`crate::store::Store::record_peer_err`]) and announced as a `line` event with
//! `"t": "err"`, so `read`, `tail`, `wait` and `listen` show it (issue 9, case 3).

use super::Inner;
use crate::store::ErrRecorded;
use crate::wire::{self, DataPart, Line, Part, PeerKey};
use serde_json::Value;

/// How long `send --wait-ack` keeps waiting after the ack of a served request for the
/// peer's refusal (`err forbidden` / `err busy` follow the ack at once), ms.
pub(super) const REFUSAL_GRACE_MS: u64 = 500;

/// Errs of one session that named none of our recent lines (or a line already refused)
/// after which that session's errs are no longer looked up, only logged: each lookup may
/// scan up to [`crate::store::ERR_SCAN_MAX`] log entries.
pub(super) const MAX_ERR_MISSES: u32 = 64;

/// Store `e` (from `peer`, named `name`) against our line it names and emit its `line`
/// event; an err about anything else is only logged (by the caller) and emitted as
/// `peer_err`. `misses` counts this session's errs that were not stored (see
/// [`MAX_ERR_MISSES`]).
pub(super) async fn on_peer_err(
    inner: &Inner,
    peer: &PeerKey,
    name: Option<&str>,
    e: &wire::ErrLine,
    misses: &mut u32,
) {
    if e.re.is_none() || *misses >= MAX_ERR_MISSES {
        return;
    }
    let outcome = inner.store.record_peer_err(peer, e);
    if !matches!(outcome, Ok(ErrRecorded::Stored(_))) {
        *misses += 1;
    }
    match outcome {
        Ok(ErrRecorded::Stored(entry)) => {
            if let Err(err) = inner.store.flush().await {
                tracing::warn!(%peer, "storing a peer's err: {err}");
                return;
            }
            if let Ok(line) = wire::parse_line(&entry.line) {
                inner.emit(super::conn::line_event(entry.seq, "in", peer, name, &line));
            }
        }
        Ok(ErrRecorded::Duplicate) => {
            tracing::debug!(%peer, re = ?e.re, "an err about that line is already stored")
        }
        Ok(ErrRecorded::NotOurs) => {}
        Err(err) => tracing::warn!(%peer, "storing a peer's err: {err}"),
    }
}

/// Whether a msg part list (wire parts as JSON) makes a served request (a data part of
/// mime `application/vnd.awp.<cap>+json` for exec, fs-read or fs-write): the peer answers
/// it with a result or an err after the ack.
pub(super) fn is_request(parts: &[Value]) -> bool {
    parts.iter().any(|p| {
        p.get("k").and_then(Value::as_str) == Some("data")
            && p.get("mime")
                .and_then(Value::as_str)
                .is_some_and(|m| super::serve::Served::from_mime(m).is_some())
    })
}

/// A request msg (a data part whose mime names a served capability) is answered by the
/// node itself, served or refused: mark its log entry `seq` read (durable with the next
/// flush), so it does not count as unread on the serving node.
pub(super) fn mark_answered(inner: &Inner, seq: u64, line: &Line) {
    let Line::Msg(m) = line else { return };
    let request = m.parts.iter().any(|p| {
        matches!(p, Part::Data(DataPart { mime: Some(mime), .. })
            if super::serve::Served::from_mime(mime).is_some())
    });
    if request {
        if let Err(e) = inner.store.mark_read(&[seq]) {
            tracing::warn!("marking a served request read: {e}");
        }
    }
}
