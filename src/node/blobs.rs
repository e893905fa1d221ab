//! Blobs on the node side of the control socket: reading files for `send`, recording what
//! was queued, and listing blobs both ways (`awp blobs`).

use super::server::{resolve_peer, Fail};
use super::Inner;
use crate::blob::Outgoing;
use crate::store::{InStatus, OutBlobState, OutboxEntry};
use crate::wire::{self, PeerKey};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Read the files of a send request (on the blocking pool). A relative path, a missing
/// file or one over the blob limit fails the request with `bad_request`.
pub(super) async fn read_files(
    inner: &Arc<Inner>,
    files: &[String],
) -> Result<Vec<Outgoing>, Fail> {
    let mut paths = Vec::with_capacity(files.len());
    for f in files {
        let p = PathBuf::from(f);
        if !p.is_absolute() {
            return Err(Fail::new(
                "bad_request",
                format!("file path {f:?} is not absolute"),
            ));
        }
        paths.push(p);
    }
    let limit = inner.blob_limit;
    let read = tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .map(|p| Outgoing::read(p, limit))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| Fail::new("internal", format!("reading files: {e}")))?;
    read.map_err(|e| Fail::new("bad_request", e.to_string()))
}

/// A line builder that owns its captures (see [`crate::store::LineBuilder`]).
pub(super) type BoxedBuilder<'a> = Box<dyn Fn(&str, &str) -> wire::Line + Send + Sync + 'a>;

/// Builders of every chunk of `blobs` in thread `th`, in order (n from 0 per blob).
pub(super) fn chunk_builders<'a>(blobs: &'a [Outgoing], th: &str) -> Vec<BoxedBuilder<'a>> {
    let mut out: Vec<BoxedBuilder<'a>> = Vec::new();
    for b in blobs {
        for n in 0..b.chunk_count() {
            let th = th.to_string();
            out.push(Box::new(move |id: &str, ts: &str| b.chunk(n, &th, id, ts)));
        }
    }
    out
}

/// After a send with blobs was queued (`entries`: every blob's chunks in order, then the
/// msg): record each blob for `awp blobs` and describe them for the response.
pub(super) fn record(
    inner: &Inner,
    peer: &PeerKey,
    blobs: &[Outgoing],
    entries: &[OutboxEntry],
) -> Result<Value, Fail> {
    let internal = |e: crate::store::StoreError| Fail::new("internal", e.to_string());
    let Some(msg) = entries.last() else {
        return Ok(json!([]));
    };
    let th = msg.th.clone().unwrap_or_default();
    let now = wire::time::now_ms();
    let mut at = 0;
    let mut out = Vec::new();
    for b in blobs {
        let n = b.chunk_count();
        let ids: Vec<String> = entries
            .get(at..at + n)
            .unwrap_or_default()
            .iter()
            .map(|e| e.id.clone())
            .collect();
        at += n;
        let st = OutBlobState {
            th: th.clone(),
            msg_id: msg.id.clone(),
            chunk_ids: ids,
            name: b.name.clone(),
            mime: b.mime.clone(),
            size: b.size(),
            sha256: b.sha256.clone(),
            source: b.source.display().to_string(),
            refused: false,
            at_ms: now,
        };
        inner
            .store
            .put_blob_out(peer, &b.blob_ref, &st)
            .map_err(internal)?;
        out.push(json!({
            "ref": b.blob_ref,
            "name": b.name,
            "size": b.size(),
            "mime": b.mime,
            "sha256": b.sha256,
            "chunks": n,
        }));
    }
    Ok(Value::Array(out))
}

/// Chunks of `ids` written to the live connection to `peer` (ids up to its cursor).
fn written(inner: &Inner, peer: &PeerKey, ids: &[String]) -> usize {
    let cursor = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(peer)
        .and_then(|c| {
            c.handles
                .cursor
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        });
    match cursor {
        Some(c) => ids.partition_point(|id| id.as_str() <= c.as_str()),
        None => 0,
    }
}

/// The `blobs` control request (see [`crate::control::Request::Blobs`]).
pub(super) fn list(
    inner: &Inner,
    peer: Option<&str>,
    blob_ref: Option<&str>,
) -> Result<Value, Fail> {
    let internal = |e: crate::store::StoreError| Fail::new("internal", e.to_string());
    let peer = peer.map(|p| resolve_peer(inner, p)).transpose()?;
    let wanted =
        |k: &PeerKey, r: &str| peer.is_none_or(|p| p == *k) && blob_ref.is_none_or(|w| w == r);
    let store = &inner.store;
    let mut rows: Vec<(u64, Value)> = Vec::new();
    for b in store.blobs_out().map_err(internal)? {
        if !wanted(&b.peer, &b.blob_ref) {
            continue;
        }
        let s = &b.state;
        let total = s.chunk_ids.len();
        let acked = store
            .chunks_retired(&b.peer, &s.chunk_ids)
            .map_err(internal)?;
        let status = if s.refused {
            "refused"
        } else if store.outbox_has(&b.peer, &s.msg_id).map_err(internal)? {
            "queued"
        } else {
            "sent"
        };
        let acked = if status == "sent" { total } else { acked };
        let sent = written(inner, &b.peer, &s.chunk_ids).max(acked);
        rows.push((
            s.at_ms,
            json!({
                "dir": "out",
                "peer": b.peer.to_string(),
                "peer_name": inner.peer_name(&b.peer),
                "ref": b.blob_ref,
                "th": s.th,
                "msg": s.msg_id,
                "name": s.name,
                "mime": s.mime,
                "size": s.size,
                "sha256": s.sha256,
                "status": status,
                "path": s.source,
                "chunks": total,
                "chunks_sent": sent,
                "chunks_acked": acked,
                "at": wire::time::format_ms(s.at_ms),
            }),
        ));
    }
    for b in store.blobs_in().map_err(internal)? {
        if !wanted(&b.peer, &b.blob_ref) {
            continue;
        }
        let s = &b.state;
        let status = match s.status {
            InStatus::Pending => "pending",
            // Marked complete; the move to the final path follows the store flush.
            InStatus::Complete if !s.path.as_deref().is_some_and(|p| Path::new(p).exists()) => {
                "pending"
            }
            InStatus::Complete => "complete",
            InStatus::Refused => "refused",
        };
        rows.push((
            s.started_ms,
            json!({
                "dir": "in",
                "peer": b.peer.to_string(),
                "peer_name": inner.peer_name(&b.peer),
                "ref": b.blob_ref,
                "th": s.th,
                "msg": s.msg_id,
                "name": s.name,
                "mime": s.mime,
                "size": s.size,
                "sha256": s.sha256,
                "status": status,
                "path": s.path,
                "bytes": s.offset,
                "reason": s.reason,
                "at": wire::time::format_ms(s.started_ms),
            }),
        ));
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    Ok(json!({ "blobs": rows.into_iter().map(|(_, v)| v).collect::<Vec<_>>() }))
}
