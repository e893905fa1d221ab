//! Blobs on the node side of the control socket: reading files for `send`, recording what
//! was queued, and listing blobs both ways (`awp blobs`).

use super::lists::Pager;
use super::server::{resolve_peer, Fail};
use super::Inner;
use crate::blob::{pending, Hashing, Outgoing};
use crate::control::{shown, Page};
use crate::store::{InBlob, InStatus, OutBlob, OutBlobState, OutboxEntry};
use crate::wire::{self, PeerKey};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Open the files of a send request (on the blocking pool) without hashing them; their
/// data stays in the files and is read when the chunks are sent
/// ([`crate::blob::stream`]), and each file's SHA-256 is computed while its chunks go out
/// ([`start_hashing`]). A relative path, a missing file or one over the blob limit fails
/// the request with `bad_request`.
pub(super) async fn read_files(
    inner: &Arc<Inner>,
    files: &[String],
) -> Result<(Vec<Outgoing>, Vec<Hashing>), Fail> {
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
            .map(|p| Outgoing::open_unhashed(p, limit))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| Fail::new("internal", format!("reading files: {e}")))?;
    Ok(read
        .map_err(|e| Fail::new("bad_request", e.to_string()))?
        .into_iter()
        .unzip())
}

/// Hash the files of blobs just queued for `peer` (`jobs`: each blob's ref and its
/// [`Hashing`], registered with [`pending::begin`] before the queueing) on the blocking
/// pool. Each outcome is recorded, then published ([`pending::finish`]) on that thread, so
/// a stream waiting for it never depends on an async task being polled (a session may
/// wait on the runtime's only thread): a SHA-256 goes into the blob's record
/// ([`crate::store::Store::set_blob_out_digests`]); a failure (the file changed or could
/// not be read) stops the blob as the stream would ([`crate::store::Store::stop_changed_blob`]:
/// its queued lines leave the outbox and an `err blob_refused` is stored in its thread).
/// A task of its own then announces the refusals and flushes, so all of it also happens
/// when the request that started it is dropped. Its result: the outcomes, in the order
/// of `jobs`.
pub(super) fn start_hashing(
    inner: &Arc<Inner>,
    peer: PeerKey,
    jobs: Vec<(String, Hashing)>,
) -> tokio::task::JoinHandle<Vec<pending::Outcome>> {
    let store = inner.store.clone();
    let mut unpublished = Unpublished {
        peer,
        refs: jobs.iter().map(|(r, _)| r.clone()).collect(),
    };
    let hashed = tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(jobs.len());
        for (r, hashing) in jobs {
            let outcome = hashing.run().map_err(|e| e.to_string());
            let mut refusal = None;
            match &outcome {
                Ok(digests) => {
                    if let Err(e) = store.set_blob_out_digests(&peer, &r, digests) {
                        tracing::warn!(%peer, blob_ref = %r, "recording a blob's digests: {e}");
                    }
                }
                Err(why) => {
                    let detail = format!(
                        "not sent by this node: {why}; nothing more of it goes out, send the \
                         file again"
                    );
                    tracing::warn!(%peer, blob_ref = %r, "{detail}");
                    match store.stop_changed_blob(&peer, &r, "", &detail) {
                        Ok(stopped) => refusal = stopped.entry,
                        Err(e) => tracing::warn!(%peer, blob_ref = %r, "stopping a blob: {e}"),
                    }
                }
            }
            pending::finish(&peer, &r, outcome.clone());
            unpublished.refs.retain(|x| *x != r);
            out.push((outcome, refusal));
        }
        out
    });
    let inner = inner.clone();
    tokio::spawn(async move {
        let results = match hashed.await {
            Ok(results) => results,
            // Its guard published a failure for every blob it did not finish.
            Err(e) => {
                return vec![Err(format!("hashing the file failed: {e}"))];
            }
        };
        let mut outcomes = Vec::with_capacity(results.len());
        let mut stopped = false;
        for (outcome, refusal) in results {
            stopped |= outcome.is_err();
            if let Some(e) = refusal {
                if let Ok(line) = wire::parse_line(&e.line) {
                    let name = inner.peer_name(&peer);
                    inner.emit(super::conn::line_event(
                        e.seq,
                        "in",
                        &peer,
                        name.as_deref(),
                        &line,
                    ));
                }
            }
            outcomes.push(outcome);
        }
        if let Err(e) = inner.store.flush().await {
            tracing::warn!(%peer, "flushing blob hashes: {e}");
        }
        if stopped {
            inner.outbox_changed(&peer);
        }
        outcomes
    })
}

/// The blobs whose hash outcome was not published yet: a hashing thread that panics
/// publishes a failure for each when it unwinds, so no stream waits for ever.
struct Unpublished {
    peer: PeerKey,
    refs: Vec<String>,
}

impl Drop for Unpublished {
    fn drop(&mut self) {
        for r in &self.refs {
            pending::finish(&self.peer, r, Err("hashing the file failed".into()));
        }
    }
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

/// The record of `b` for `blobs_out` (`th`, `msg_id` and `chunk_ids` left empty:
/// [`crate::store::Store::enqueue_with_blobs`] fills them in).
fn out_state(b: &Outgoing, now: u64) -> OutBlobState {
    OutBlobState {
        th: String::new(),
        msg_id: String::new(),
        chunk_ids: Vec::new(),
        name: b.name.clone(),
        mime: b.mime.clone(),
        size: b.size(),
        sha256: b.sha256.clone(),
        source: b.source.display().to_string(),
        refused: false,
        at_ms: now,
        chunk_size: b.stream.map(|_| crate::blob::CHUNK_SIZE as u64),
        mtime_ns: b.stream.map(|s| s.mtime_ns),
        reason: None,
        blake3: None,
    }
}

/// Queue `builders` for `peer` (every blob's chunks in order, then the msg naming them,
/// last) together with the records of `blobs`, in one transaction
/// ([`crate::store::Store::enqueue_with_blobs`]); without blobs, a plain enqueue.
pub(super) fn enqueue(
    inner: &Inner,
    peer: &PeerKey,
    builders: &[crate::store::LineBuilder<'_>],
    blobs: &[Outgoing],
) -> Result<Vec<OutboxEntry>, crate::store::StoreError> {
    if blobs.is_empty() {
        return inner.store.enqueue(peer, builders);
    }
    let now = wire::time::now_ms();
    let records = blobs
        .iter()
        .map(|b| (b.blob_ref.clone(), b.chunk_count(), out_state(b, now)))
        .collect();
    inner.store.enqueue_with_blobs(peer, builders, records)
}

/// How the response of a send describes its blobs (`sha256`: each blob's SHA-256, in
/// order; the blobs' own when shorter).
pub(super) fn describe(blobs: &[Outgoing], sha256: &[String]) -> Value {
    Value::Array(
        blobs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                json!({
                    "ref": b.blob_ref,
                    "name": b.name,
                    "size": b.size(),
                    "mime": b.mime,
                    "sha256": sha256.get(i).unwrap_or(&b.sha256),
                    "chunks": b.chunk_count(),
                })
            })
            .collect(),
    )
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

/// Where a blob sorts in the `blobs` listing: newest first, then direction, peer and ref
/// (a total order, so a page can resume after any row). Serialized as the page cursor.
type RowKey = (std::cmp::Reverse<u64>, String, String, String);

fn cursor_of(k: &RowKey) -> String {
    json!([k.0 .0, k.1, k.2, k.3]).to_string()
}

fn parse_cursor(c: &str) -> Result<RowKey, Fail> {
    let bad = || Fail::new("bad_request", format!("bad blobs cursor {c:?}"));
    let (at, dir, peer, r): (u64, String, String, String) =
        serde_json::from_str(c).map_err(|_| bad())?;
    Ok((std::cmp::Reverse(at), dir, peer, r))
}

/// The `blobs` control request (see [`crate::control::Request::Blobs`]): one page, the
/// status of only the rows on it worked out.
pub(super) fn list(
    inner: &Inner,
    peer: Option<&str>,
    blob_ref: Option<&str>,
    page: &Page,
) -> Result<Value, Fail> {
    let internal = |e: crate::store::StoreError| Fail::new("internal", e.to_string());
    let peer = peer.map(|p| resolve_peer(inner, p)).transpose()?;
    let after = page.cursor.as_deref().map(parse_cursor).transpose()?;
    let wanted =
        |k: &PeerKey, r: &str| peer.is_none_or(|p| p == *k) && blob_ref.is_none_or(|w| w == r);
    let store = &inner.store;
    let outs = store.blobs_out().map_err(internal)?;
    let ins = store.blobs_in().map_err(internal)?;
    let key = |at: u64, dir: &str, peer: &PeerKey, r: &str| -> RowKey {
        (
            std::cmp::Reverse(at),
            dir.into(),
            peer.to_string(),
            r.into(),
        )
    };
    // (order, index into outs (Ok) or ins (Err)), after the cursor.
    let mut order: Vec<(RowKey, Result<usize, usize>)> = Vec::new();
    for (i, b) in outs.iter().enumerate() {
        if wanted(&b.peer, &b.blob_ref) {
            order.push((key(b.state.at_ms, "out", &b.peer, &b.blob_ref), Ok(i)));
        }
    }
    for (i, b) in ins.iter().enumerate() {
        if wanted(&b.peer, &b.blob_ref) {
            order.push((key(b.state.started_ms, "in", &b.peer, &b.blob_ref), Err(i)));
        }
    }
    if let Some(a) = &after {
        order.retain(|(k, _)| k > a);
    }
    order.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Pager::new(page);
    for (k, which) in order {
        let row = match which {
            Ok(i) => out_row(inner, &outs[i]).map_err(internal)?,
            Err(i) => in_row(inner, &ins[i]),
        };
        if !out.push(cursor_of(&k), row) {
            break;
        }
    }
    Ok(out.finish("blobs"))
}

fn out_row(inner: &Inner, b: &OutBlob) -> Result<Value, crate::store::StoreError> {
    let store = &inner.store;
    let s = &b.state;
    let total = s.chunk_ids.len();
    let acked = store.chunks_retired(&b.peer, &s.chunk_ids)?;
    let status = if s.refused {
        "refused"
    } else if store.outbox_has(&b.peer, &s.msg_id)? {
        "queued"
    } else {
        "sent"
    };
    let acked = if status == "sent" { total } else { acked };
    let sent = written(inner, &b.peer, &s.chunk_ids).max(acked);
    Ok(json!({
        "dir": "out",
        "peer": b.peer.to_string(),
        "peer_name": inner.peer_name(&b.peer),
        "ref": b.blob_ref,
        "th": s.th,
        "msg": s.msg_id,
        "name": shown(&s.name),
        "mime": shown(&s.mime),
        "size": s.size,
        // null while the file is still being hashed after queueing (`blob::pending`).
        "sha256": (!s.sha256.is_empty()).then_some(&s.sha256),
        "status": status,
        "reason": s.reason.as_deref().map(shown),
        "path": s.source,
        "chunks": total,
        "chunks_sent": sent,
        "chunks_acked": acked,
        "at": wire::time::format_ms(s.at_ms),
    }))
}

fn in_row(inner: &Inner, b: &InBlob) -> Value {
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
    json!({
        "dir": "in",
        "peer": b.peer.to_string(),
        "peer_name": inner.peer_name(&b.peer),
        "ref": b.blob_ref,
        "th": s.th,
        "msg": s.msg_id,
        "name": s.name.as_deref().map(shown),
        "mime": s.mime.as_deref().map(shown),
        "size": s.size,
        "sha256": s.sha256,
        "status": status,
        "path": s.path,
        "bytes": s.offset,
        "reason": s.reason.as_deref().map(shown),
        "at": wire::time::format_ms(s.started_ms),
    })
}

/// Expire unfinished inbound blobs without data for a day ([`crate::blob::expire`]),
/// except those of peers connected now (their session may be writing them); on the
/// blocking pool.
pub(super) async fn expire_unfinished(inner: &Arc<Inner>) {
    let connected: Vec<PeerKey> = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .copied()
        .collect();
    let mut rx = crate::blob::BlobReceiver::new(
        inner.store.clone(),
        inner.home.join(super::BLOBS_DIR),
        inner.blob_limit,
    );
    let r = tokio::task::spawn_blocking(move || {
        rx.expire_unfinished(
            wire::time::now_ms(),
            crate::blob::expire::UNFINISHED_MAX_AGE_MS,
            &connected,
        )
    })
    .await;
    match r {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::info!("blobs: {n} unfinished inbound blob(s) expired"),
        Ok(Err(e)) => tracing::warn!("blob expiry: {e}"),
        Err(e) => tracing::warn!("blob expiry task: {e}"),
    }
}
