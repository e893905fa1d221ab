//! `awp send -f FILE` (path resolution and the progress bar) and `awp blobs`.

use super::format::{self, str_field};
use super::{Ctx, Failure};
use crate::control::Request;
use serde_json::{Map, Value};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Transfers over this many bytes get a progress bar (on a terminal, without `--json`).
pub const PROGRESS_MIN_BYTES: u64 = 1024 * 1024;

/// How often the progress bar asks the node.
const POLL: Duration = Duration::from_millis(200);

/// Stop following a transfer after this long without progress while the peer is away.
const STALL: Duration = Duration::from_secs(5);

/// Absolute paths of the files to send; a missing file or a directory is a usage error
/// (exit 2) before anything is sent ([`local_file`], paths kept as given: not canonical).
pub fn resolve_files(files: &[PathBuf]) -> Result<Vec<String>, Failure> {
    const ARG: FileArg = FileArg {
        read_hint: "check the -f FILE path",
        not_file_hint: "-f takes files, not directories",
    };
    files
        .iter()
        .map(|f| local_file(f, false, &ARG).map(|l| l.path))
        .collect()
}

/// How the caller names a file argument in its usage errors (the hints of
/// [`local_file`]'s failures).
#[derive(Debug, Clone, Copy)]
pub struct FileArg {
    /// The hint when the path cannot be read (missing, unreadable, a broken link).
    pub read_hint: &'static str,
    /// The hint when the path is no regular file (a directory, a device…).
    pub not_file_hint: &'static str,
}

/// A local file to send, as checked by [`local_file`].
#[derive(Debug)]
pub struct LocalFile {
    /// The absolute path, UTF-8 (canonical, every symlink resolved, when asked).
    pub path: String,
    /// The file's metadata (symlinks followed), read once.
    pub meta: std::fs::Metadata,
}

/// The checks every front makes of a file it is asked to send (`awp send -f`, MCP
/// `awp_send` `files`): the path resolves (`canonical`: every symlink resolved, else
/// made absolute as given), names a regular file (symlinks followed), and is UTF-8 (the
/// control socket speaks JSON). The caller's own rules (MCP: its roots, never the node
/// home) come after, on the returned path and metadata.
///
/// Errors (usage, exit 2): `cannot read PATH: …` (missing, unreadable), `PATH is not a
/// regular file`, `PATH is not a UTF-8 path`, `cannot resolve PATH: …`.
pub fn local_file(f: &Path, canonical: bool, arg: &FileArg) -> Result<LocalFile, Failure> {
    let unreadable = |e: std::io::Error| {
        Failure::usage(format!("cannot read {}: {e}", f.display()), arg.read_hint)
    };
    let path = if canonical {
        f.canonicalize().map_err(unreadable)?
    } else {
        f.to_path_buf()
    };
    let meta = std::fs::metadata(&path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(Failure::usage(
            format!("{} is not a regular file", f.display()),
            arg.not_file_hint,
        ));
    }
    let abs = if canonical {
        path
    } else {
        std::path::absolute(f)
            .map_err(|e| Failure::usage(format!("cannot resolve {}: {e}", f.display()), ""))?
    };
    let path = abs.into_os_string().into_string().map_err(|p| {
        Failure::usage(
            format!("{} is not a UTF-8 path", PathBuf::from(p).display()),
            "rename the file",
        )
    })?;
    Ok(LocalFile { path, meta })
}

/// After `send`: follow the blobs of the reply with a progress bar when they total more
/// than [`PROGRESS_MIN_BYTES`] and stderr is a terminal (never with `--json`). The bar
/// counts the chunks written to the peer's connection; it completes when the peer acks
/// the msg naming the blobs (which retires every chunk). When the peer is not connected
/// and nothing moves for a while, it stops and says the transfer continues in the
/// background.
pub async fn progress(ctx: &Ctx, reply: &Map<String, Value>) -> Result<(), Failure> {
    let blobs: Vec<&Map<String, Value>> = reply
        .get("blobs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_object).collect())
        .unwrap_or_default();
    let total: u64 = blobs
        .iter()
        .filter_map(|b| b.get("size").and_then(Value::as_u64))
        .sum();
    if ctx.json || total <= PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return Ok(());
    }
    if reply.get("status").and_then(Value::as_str) == Some("delivered") {
        return Ok(());
    }
    let Some(peer) = str_field(reply, &["peer"]).map(str::to_string) else {
        return Ok(());
    };
    let refs: Vec<String> = blobs
        .iter()
        .filter_map(|b| str_field(b, &["ref"]).map(str::to_string))
        .collect();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(if refs.len() == 1 {
        format::clip(str_field(blobs[0], &["name"]).unwrap_or("file"), 30)
    } else {
        format!("{} files", refs.len())
    });
    let mut last_pos = 0;
    let mut last_move = tokio::time::Instant::now();
    loop {
        let all = ctx
            .call_all(
                &Request::Blobs {
                    peer: Some(peer.clone()),
                    blob_ref: None,
                },
                "blobs",
            )
            .await?;
        let rows: Vec<&Map<String, Value>> = all
            .iter()
            .filter_map(Value::as_object)
            .filter(|b| {
                str_field(b, &["dir"]) == Some("out")
                    && str_field(b, &["ref"]).is_some_and(|r| refs.iter().any(|x| x == r))
            })
            .collect();
        let mut pos = 0u64;
        let mut open = 0;
        let mut refused = 0;
        for b in &rows {
            let size = b.get("size").and_then(Value::as_u64).unwrap_or(0);
            let chunks = b.get("chunks").and_then(Value::as_u64).unwrap_or(1).max(1);
            let sent = b.get("chunks_sent").and_then(Value::as_u64).unwrap_or(0);
            match str_field(b, &["status"]) {
                Some("sent") => pos += size,
                Some("refused") => refused += 1,
                _ => {
                    open += 1;
                    pos += (size.saturating_mul(sent) / chunks).min(size);
                }
            }
        }
        bar.set_position(pos);
        if open == 0 {
            if refused > 0 {
                bar.abandon_with_message(format!("{refused} refused by the peer"));
            } else {
                bar.finish_with_message("delivered");
            }
            return Ok(());
        }
        if pos != last_pos {
            last_pos = pos;
            last_move = tokio::time::Instant::now();
        } else if last_move.elapsed() > STALL {
            bar.abandon_with_message("waiting for the peer; the node keeps sending");
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `awp blobs [-p PEER]`: one line per blob (JSON objects with `--json`).
pub async fn list(ctx: &Ctx, peer: Option<String>) -> Result<(), Failure> {
    let req = Request::Blobs {
        peer,
        blob_ref: None,
    };
    super::commands::list_with(ctx, &req, "blobs", blobs_table).await
}

/// The `awp blobs` table: DIR STATUS PEER SIZE SHA256 NAME PATH.
pub fn blobs_table(items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .filter_map(Value::as_object)
        .map(|b| {
            let size = b.get("size").and_then(Value::as_u64);
            let size = match (str_field(b, &["dir"]), size) {
                (Some("in"), _) if str_field(b, &["status"]) == Some("pending") => format!(
                    "{}/{}",
                    b.get("bytes").and_then(Value::as_u64).unwrap_or(0),
                    size.map(|s| s.to_string()).unwrap_or_else(|| "?".into())
                ),
                (_, Some(s)) => s.to_string(),
                (_, None) => "?".into(),
            };
            let mut status = str_field(b, &["status"]).unwrap_or("?").to_string();
            if status == "queued" {
                let sent = b.get("chunks_sent").and_then(Value::as_u64).unwrap_or(0);
                let all = b.get("chunks").and_then(Value::as_u64).unwrap_or(0);
                status = format!("queued {sent}/{all}");
            }
            vec![
                str_field(b, &["dir"]).unwrap_or("?").to_string(),
                status,
                format::peer_label(str_field(b, &["peer"]), str_field(b, &["peer_name"])),
                size,
                str_field(b, &["sha256"]).unwrap_or("-").to_string(),
                format::clip(str_field(b, &["name"]).unwrap_or("-"), 40),
                str_field(b, &["path"]).unwrap_or("-").to_string(),
            ]
        })
        .collect();
    format::table(
        &["DIR", "STATUS", "PEER", "SIZE", "SHA256", "NAME", "PATH"],
        &rows,
    )
}
