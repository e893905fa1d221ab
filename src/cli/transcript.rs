//! `awp export THREAD [--format ndjson|json] [--with-blobs DIR]` and `awp verify FILE
//! [--blobs DIR]`
//! (`spec/signed-lines.md`, [`crate::transcript`]).

use super::{out, Ctx, Exit, Failure};
use crate::control::Request;
use crate::transcript::{self, Record};
use crate::wire::PeerKey;
use serde_json::Value;
use std::path::Path;

/// Most lines one export holds (bounds memory against a runaway log).
pub const MAX_EXPORT_LINES: usize = 10_000_000;

/// Write thread `th`'s lines, in log order and exactly as stored (control request
/// `thread_lines`), to stdout as a transcript; with `blob_dir`, also its blobs as files
/// named by SHA-256 there ([`transcript::copy_blob`]), listed in the header. Errors: exit 1
/// when `blob_dir` exists and is not a directory (nothing is written then).
pub async fn export(
    ctx: &Ctx,
    th: String,
    format: &str,
    blob_dir: Option<&Path>,
) -> Result<(), Failure> {
    if let Some(dir) = blob_dir.filter(|d| d.exists() && !d.is_dir()) {
        return Err(Failure::new(
            Exit::Failed,
            format!("--with-blobs {}: not a directory", dir.display()),
            "give a directory (it is created when missing)",
        ));
    }
    // Our key as the running node has it (no secret key read, no identity created).
    let me = ctx
        .call(&Request::Whoami)
        .await?
        .get("key")
        .and_then(Value::as_str)
        .and_then(|k| PeerKey::parse(k).ok())
        .ok_or_else(|| Failure::new(Exit::Failed, "the node named no key", ""))?;
    let mut records = Vec::new();
    let mut peer: Option<PeerKey> = None;
    let mut thread = th.clone();
    let mut after = 0u64;
    loop {
        let body = ctx
            .call(&Request::ThreadLines {
                th: th.clone(),
                after,
            })
            .await?;
        let p = body
            .get("peer")
            .and_then(Value::as_str)
            .and_then(|p| PeerKey::parse(p).ok())
            .ok_or_else(|| Failure::new(Exit::Failed, "the node named no peer", ""))?;
        peer.get_or_insert(p);
        if let Some(t) = body.get("th").and_then(Value::as_str) {
            thread = t.to_string();
        }
        for l in body
            .get("lines")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let from = if l.get("dir").and_then(Value::as_str) == Some("out") {
                me
            } else {
                p
            };
            let line = l.get("line").and_then(Value::as_str).unwrap_or_default();
            records.push(Record {
                from,
                line: line.to_string(),
            });
        }
        if records.len() > MAX_EXPORT_LINES {
            return Err(Failure::new(Exit::Failed, "thread too long to export", ""));
        }
        match body.get("next").and_then(Value::as_u64) {
            Some(n) if n > after => after = n,
            _ => break,
        }
    }
    if records.is_empty() {
        return Err(Failure::usage(
            format!("no lines in thread {th:?}"),
            "`awp threads` lists the threads",
        ));
    }
    let keys: Vec<PeerKey> = std::iter::once(me).chain(peer).collect();
    let mut header = transcript::header(&thread, &keys);
    if let (Some(dir), Some(peer)) = (blob_dir, peer) {
        let blobs = copy_blobs(ctx, &records, me, peer, dir).await?;
        header = transcript::with_blobs(header, &blobs);
    }
    let text = match format {
        "json" => transcript::to_json(&header, &records) + "\n",
        _ => transcript::to_ndjson(&header, &records),
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(|e| Failure::new(Exit::Failed, format!("write: {e}"), ""))
}

/// Copy the blobs the thread's msgs name into `dir` by SHA-256, from the node's blob
/// records (`blobs` listing: a received blob's file once complete, a sent blob's source
/// file if it still holds the bytes sent). A blob without such a file is left out of the
/// header, with a warning on stderr (so `awp verify --blobs` reports it).
async fn copy_blobs(
    ctx: &Ctx,
    records: &[Record],
    me: PeerKey,
    peer: PeerKey,
    dir: &Path,
) -> Result<Vec<transcript::BlobEntry>, Failure> {
    let mut out = Vec::new();
    for (from, blob_ref, size) in transcript::named_blobs(records) {
        let want = if from == me { "out" } else { "in" };
        let body = ctx
            .call(&Request::Blobs {
                peer: Some(peer.to_string()),
                blob_ref: Some(blob_ref.clone()),
            })
            .await?;
        let row = body
            .get("blobs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|b| {
                b.get("dir").and_then(Value::as_str) == Some(want)
                    && b.get("ref").and_then(Value::as_str) == Some(&blob_ref)
            });
        let (Some(path), Some(sha256)) = (
            row.and_then(|b| b.get("path")).and_then(Value::as_str),
            row.and_then(|b| b.get("sha256")).and_then(Value::as_str),
        ) else {
            eprintln!("awp: blob {blob_ref:?} has no complete file here; not exported");
            continue;
        };
        match transcript::copy_blob(Path::new(path), dir, sha256, size) {
            Ok(()) => out.push(transcript::BlobEntry {
                from,
                blob_ref,
                size,
                sha256: sha256.to_string(),
            }),
            Err(e) => eprintln!("awp: blob {blob_ref:?}: {e}; not exported"),
        }
    }
    Ok(out)
}

/// Check a transcript file offline: one line per problem, exit 1 when there is any.
/// With `blob_dir`, the blob files the header lists are checked too.
pub fn verify(path: &Path, blob_dir: Option<&Path>) -> Result<(), Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(
            format!("cannot read {}: {e}", path.display()),
            "give a file made by `awp export`",
        )
    })?;
    let problems = transcript::verify_with(&text, blob_dir);
    for p in &problems {
        out(&p.to_string())?;
    }
    if problems.is_empty() {
        out("ok: every signature, the thread, the id order and the re links hold")
    } else {
        Err(Failure::new(
            Exit::Failed,
            format!("{} problem(s) in {}", problems.len(), path.display()),
            "",
        ))
    }
}
