//! Served requests (off by default; `--serve exec,fs:read,fs:write --root DIR`).
//!
//! A request is a msg with a data part of mime `application/vnd.awp.<cap>+json`
//! (protocol-notes §Grants): `exec` {cmd: argv array or shell string, cwd, timeout_ms},
//! `fs-read` {path, offset, length}, `fs-write` {path, content, append}. It is served only
//! when this node serves that capability and the sender holds it now (an honored grant);
//! otherwise the msg is acked as usual and answered with `err forbidden`, re = the msg id.
//! Results go back as a msg in the same thread with `re` = the request id and a data part
//! `application/vnd.awp.<cap>-result+json`; output over 64 KiB (exec stdout/stderr, file
//! content) goes as a blob part of that msg (`stdout_blob`, `stderr_blob`,
//! `content_blob` name its ref), and fs-write may take its data from a blob part of the
//! request (`{path, blob: REF}`). Paths are confined to the root: `..`, absolute
//! paths outside it and symlinks that lead out are refused. Every served request is logged
//! (the node log, and one JSON line per request in `$AWP_HOME/served.log`).

use super::Inner;
use crate::blob::Outgoing;
use crate::wire::{self, code, DataPart, Line, Part, PeerKey};
use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Output kept inline per stream (stdout, stderr, file content), in bytes.
pub const MAX_INLINE: usize = 64 * 1024;
/// Default and largest `timeout_ms` of an exec request.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// Largest fs-read `length` and fs-write `content`, bytes.
pub const MAX_FS_BYTES: u64 = 8 * 1024 * 1024;
/// Most output captured per exec stream (the rest is read and dropped), bytes.
pub const MAX_CAPTURE: usize = 8 * 1024 * 1024;
/// How long fs-write waits for the request's blob to complete, ms.
const BLOB_WAIT_MS: u64 = 10_000;

/// A capability this node can serve, with its request and result mime types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Exec,
    FsRead,
    FsWrite,
}

impl Served {
    /// The capability name (`exec`, `fs:read`, `fs:write`).
    pub fn cap(self) -> &'static str {
        match self {
            Served::Exec => "exec",
            Served::FsRead => "fs:read",
            Served::FsWrite => "fs:write",
        }
    }
    fn slug(self) -> &'static str {
        match self {
            Served::Exec => "exec",
            Served::FsRead => "fs-read",
            Served::FsWrite => "fs-write",
        }
    }
    /// `application/vnd.awp.<slug>+json`.
    pub fn request_mime(self) -> String {
        format!("application/vnd.awp.{}+json", self.slug())
    }
    /// `application/vnd.awp.<slug>-result+json`.
    pub fn result_mime(self) -> String {
        format!("application/vnd.awp.{}-result+json", self.slug())
    }
    /// From a capability name.
    pub fn from_cap(c: &str) -> Option<Served> {
        [Served::Exec, Served::FsRead, Served::FsWrite]
            .into_iter()
            .find(|s| s.cap() == c)
    }
    fn from_mime(m: &str) -> Option<Served> {
        [Served::Exec, Served::FsRead, Served::FsWrite]
            .into_iter()
            .find(|s| s.request_mime() == m)
    }
}

/// What this node serves.
#[derive(Debug, Clone, Default)]
pub struct ServeConfig {
    pub caps: Vec<Served>,
    /// The canonical root directory requests are confined to.
    pub root: Option<PathBuf>,
}

/// If `line` is a request msg, serve it (in a task) or refuse it.
pub(super) fn on_msg(inner: &Arc<Inner>, from: PeerKey, line: &Line) {
    let Line::Msg(m) = line else { return };
    let Some((kind, req)) = m.parts.iter().find_map(|p| match p {
        Part::Data(DataPart {
            data,
            mime: Some(mime),
        }) => Served::from_mime(mime).map(|k| (k, data.clone())),
        _ => None,
    }) else {
        return;
    };
    let served = inner.serve.caps.contains(&kind) && inner.serve.root.is_some();
    let holds = served
        && super::grants::honored_caps(inner, &from)
            .iter()
            .any(|c| c == kind.cap());
    if !holds {
        let detail = if served {
            format!("{} needs a grant for `{}`", kind.request_mime(), kind.cap())
        } else {
            format!("this node does not serve `{}`", kind.cap())
        };
        log(inner, &from, kind, &m.id, "refused", &detail);
        let err = Line::Err(wire::ErrLine {
            id: inner.store.next_control_id(),
            ts: wire::time::format_ms(wire::time::now_ms()),
            th: Some(m.th.clone()),
            re: Some(m.id.clone()),
            code: code::FORBIDDEN.into(),
            detail: Some(detail),
            blob_ref: None,
        });
        inner.send_ephemeral(&from, &err);
        return;
    }
    let inner = inner.clone();
    let (th, re) = (m.th.clone(), m.id.clone());
    inner.tasks.clone().spawn(async move {
        let root = inner.serve.root.clone().unwrap_or_default();
        let started = Instant::now();
        let mut blobs = Vec::new();
        let result = match kind {
            Served::Exec => exec(&root, &req, &mut blobs).await,
            Served::FsRead => {
                let (v, b) = blocking(move || fs_read(&root, &req)).await;
                blobs.extend(b);
                v
            }
            Served::FsWrite => {
                let source = match req.get("blob").and_then(Value::as_str) {
                    Some(r) => wait_for_blob(&inner, &from, r).await.map(Some),
                    None => Ok(None),
                };
                match source {
                    Ok(src) => {
                        blocking(move || (fs_write(&root, &req, src.as_deref()), vec![]))
                            .await
                            .0
                    }
                    Err(e) => json!({"path": req.get("path"), "error": e}),
                }
            }
        };
        let outcome = if result.get("error").is_some() {
            "failed"
        } else {
            "served"
        };
        let detail = format!("{} ms", started.elapsed().as_millis());
        log(&inner, &from, kind, &re, outcome, &detail);
        reply(&inner, from, &th, &re, kind, result, blobs).await;
    });
}

async fn blocking(
    f: impl FnOnce() -> (Value, Vec<Outgoing>) + Send + 'static,
) -> (Value, Vec<Outgoing>) {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| (json!({"error": format!("internal: {e}")}), vec![]))
}

/// Output as a blob to attach to the result msg.
fn output_blob(name: &str, mime: &str, data: Vec<u8>) -> Outgoing {
    use sha2::Digest;
    Outgoing {
        blob_ref: ulid::Ulid::generate().to_string(),
        name: name.into(),
        mime: mime.into(),
        sha256: crate::blob::hex(&sha2::Sha256::digest(&data)),
        data,
        source: PathBuf::new(),
    }
}

/// The request's blob (a ref named by a blob part of the request msg), once it is complete
/// on disk: its path. Waits up to [`BLOB_WAIT_MS`].
async fn wait_for_blob(inner: &Inner, peer: &PeerKey, blob_ref: &str) -> Result<PathBuf, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(BLOB_WAIT_MS);
    loop {
        match inner.store.blob_in(peer, blob_ref) {
            Ok(Some(b)) if b.status == crate::store::InStatus::Complete => {
                if let Some(p) = b.path.map(PathBuf::from).filter(|p| p.exists()) {
                    return Ok(p);
                }
            }
            Ok(Some(b)) if b.status == crate::store::InStatus::Refused => {
                return Err(format!("blob {blob_ref} was refused"))
            }
            Err(e) => return Err(e.to_string()),
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("blob {blob_ref} did not arrive"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn reply(
    inner: &Arc<Inner>,
    to: PeerKey,
    th: &str,
    re: &str,
    kind: Served,
    result: Value,
    blobs: Vec<Outgoing>,
) {
    let (th, re) = (th.to_string(), re.to_string());
    let mime = kind.result_mime();
    let mut parts = vec![Part::Data(DataPart {
        data: result,
        mime: Some(mime),
    })];
    parts.extend(blobs.iter().map(Outgoing::part));
    let th2 = th.clone();
    let build = move |id: &str, ts: &str| {
        Line::Msg(wire::Msg {
            id: id.into(),
            ts: ts.into(),
            th: th2.clone(),
            re: Some(re.clone()),
            subject: None,
            parts: parts.clone(),
        })
    };
    // Chunks first, then the msg naming them, in one transaction (protocol-notes §Blobs).
    let chunks = super::blobs::chunk_builders(&blobs, &th);
    let mut builders: Vec<crate::store::LineBuilder<'_>> = chunks
        .iter()
        .map(|b| b.as_ref() as crate::store::LineBuilder<'_>)
        .collect();
    builders.push(&build);
    match inner.store.enqueue(&to, &builders) {
        Ok(entries) => {
            if !blobs.is_empty() {
                let _ = super::blobs::record(inner, &to, &blobs, &entries);
            }
            if let Err(e) = inner.store.flush().await {
                tracing::warn!("served result not flushed: {e}");
            }
            inner.outbox_changed(&to);
        }
        Err(e) => tracing::warn!("served result not queued: {e}"),
    }
}

fn log(inner: &Inner, from: &PeerKey, kind: Served, id: &str, outcome: &str, detail: &str) {
    tracing::info!(peer = %from, cap = kind.cap(), request = id, outcome, detail, "served request");
    let line = json!({
        "at": wire::time::format_ms(wire::time::now_ms()),
        "peer": from.to_string(),
        "cap": kind.cap(),
        "request": id,
        "outcome": outcome,
        "detail": detail,
    });
    let path = inner.home.join("served.log");
    let r = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = r {
        tracing::warn!("{}: {e}", path.display());
    }
}

/// Resolve `rel` inside `root` (canonical): no `..`, no absolute path outside the root,
/// and the nearest existing ancestor, with symlinks resolved, must stay inside the root.
pub fn confine(root: &Path, rel: &str) -> Result<PathBuf, String> {
    let p = Path::new(rel);
    let rel_part: PathBuf = if p.is_absolute() {
        p.strip_prefix(root)
            .map_err(|_| "path is outside the root".to_string())?
            .to_path_buf()
    } else {
        p.to_path_buf()
    };
    for c in rel_part.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err("path may not contain `..` or a root".into()),
        }
    }
    let full = root.join(&rel_part);
    // The last component is opened with O_NOFOLLOW as well; refusing a symlink here also
    // covers a dangling one (which canonicalize cannot resolve).
    if full
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err("path is a symlink".into());
    }
    // The nearest existing ancestor (the file itself when it exists), symlinks resolved.
    let mut probe = full.as_path();
    let resolved = loop {
        match probe.canonicalize() {
            Ok(c) => break c,
            Err(_) => match probe.parent() {
                Some(parent) => probe = parent,
                None => return Err("path does not resolve".into()),
            },
        }
    };
    if !resolved.starts_with(root) {
        return Err("path leads outside the root (symlink)".into());
    }
    Ok(full)
}

fn str_arg<'a>(req: &'a Value, k: &str) -> Option<&'a str> {
    req.get(k).and_then(Value::as_str)
}

fn clip(bytes: &[u8]) -> (String, bool) {
    let truncated = bytes.len() > MAX_INLINE;
    let b = &bytes[..bytes.len().min(MAX_INLINE)];
    (String::from_utf8_lossy(b).into_owned(), truncated)
}

/// Read a child's pipe, keeping at most [`MAX_CAPTURE`] bytes and draining the rest so the
/// child never blocks on a full pipe. Returns the bytes and whether some were dropped.
async fn capture(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut dropped = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, dropped),
            Ok(n) => {
                let room = MAX_CAPTURE.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                dropped |= n > room;
            }
        }
    }
}

/// Inline text, and the whole output as a blob when it is over [`MAX_INLINE`].
fn output(name: &str, data: Vec<u8>, blobs: &mut Vec<Outgoing>) -> (String, bool, Option<String>) {
    let (text, cut) = clip(&data);
    if !cut {
        return (text, false, None);
    }
    let b = output_blob(name, "text/plain", data);
    let r = b.blob_ref.clone();
    blobs.push(b);
    (text, true, Some(r))
}

async fn exec(root: &Path, req: &Value, blobs: &mut Vec<Outgoing>) -> Value {
    let cwd = match str_arg(req, "cwd").map(|c| confine(root, c)).transpose() {
        Ok(c) => c.unwrap_or_else(|| root.to_path_buf()),
        Err(e) => return json!({"error": e}),
    };
    let mut cmd = match req.get("cmd") {
        Some(Value::String(s)) => {
            let mut c = tokio::process::Command::new("sh");
            c.arg("-c").arg(s);
            c
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
            let argv: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            let mut c = tokio::process::Command::new(argv[0]);
            c.args(&argv[1..]);
            c
        }
        _ => return json!({"error": "cmd must be a string or a non-empty array of strings"}),
    };
    let timeout = req
        .get("timeout_ms")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TIMEOUT_MS)
        .min(MAX_TIMEOUT_MS);
    cmd.current_dir(&cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    // Its own process group, so a timeout (or the end of the command) stops everything it
    // started, background processes included.
    cmd.process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return json!({"error": format!("cannot start: {e}")}),
    };
    let pid = child.id();
    let out_task = tokio::spawn(capture(child.stdout.take()));
    let err_task = tokio::spawn(capture(child.stderr.take()));
    let status = tokio::time::timeout(Duration::from_millis(timeout), child.wait()).await;
    if let Some(pid) = pid {
        kill_group(pid).await;
    }
    if status.is_err() {
        let _ = child.kill().await;
    }
    let collect = |t: tokio::task::JoinHandle<(Vec<u8>, bool)>| async move {
        match tokio::time::timeout(Duration::from_secs(2), t).await {
            Ok(Ok(v)) => v,
            _ => (Vec::new(), true),
        }
    };
    let (out, d1) = collect(out_task).await;
    let (err, d2) = collect(err_task).await;
    let (stdout, t1, out_blob) = output("stdout.txt", out, blobs);
    let (stderr, t2, err_blob) = output("stderr.txt", err, blobs);
    let mut result = json!({
        "exit": Value::Null,
        "duration_ms": started.elapsed().as_millis() as u64,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": t1 || t2,
        "stdout_blob": out_blob,
        "stderr_blob": err_blob,
        "dropped": d1 || d2,
    });
    match status {
        Ok(Ok(st)) => result["exit"] = json!(st.code()),
        Ok(Err(e)) => result["error"] = json!(format!("wait: {e}")),
        Err(_) => result["error"] = json!(format!("timed out after {timeout} ms")),
    }
    result
}

/// SIGKILL every process of group `pgid` (via kill(1): this crate has no unsafe code).
async fn kill_group(pgid: u32) {
    let _ = tokio::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
}

fn fs_read(root: &Path, req: &Value) -> (Value, Vec<Outgoing>) {
    let Some(path) = str_arg(req, "path") else {
        return (json!({"error": "path is required"}), vec![]);
    };
    let full = match confine(root, path) {
        Ok(p) => p,
        Err(e) => return (json!({"path": path, "error": e}), vec![]),
    };
    let offset = req.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let length = req
        .get("length")
        .and_then(Value::as_u64)
        .unwrap_or(MAX_INLINE as u64)
        .min(MAX_FS_BYTES);
    let r = (|| -> std::io::Result<(Vec<u8>, u64)> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&full)?;
        let size = f.metadata()?.len();
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::new();
        f.take(length).read_to_end(&mut buf)?;
        Ok((buf, size))
    })();
    match r {
        Ok((buf, size)) => {
            let eof = offset + buf.len() as u64 >= size;
            let mut out = json!({"path": path, "offset": offset, "length": buf.len(), "size": size, "eof": eof});
            if buf.len() > MAX_INLINE {
                let name = Path::new(path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "content".into());
                let mime = crate::blob::guess_mime(&name, &buf[..buf.len().min(512)]);
                let b = output_blob(&name, &mime, buf);
                out["content_blob"] = json!(b.blob_ref);
                return (out, vec![b]);
            }
            match String::from_utf8(buf) {
                Ok(text) => out["content"] = json!(text),
                Err(e) => out["content_b64"] = json!(wire::b64::encode_std(e.as_bytes())),
            }
            (out, vec![])
        }
        Err(e) => (json!({"path": path, "error": e.to_string()}), vec![]),
    }
}

/// Write `content` (text) or the file at `blob` (a completed request blob) to `path`.
fn fs_write(root: &Path, req: &Value, blob: Option<&Path>) -> Value {
    let Some(path) = str_arg(req, "path") else {
        return json!({"error": "path is required"});
    };
    let full = match confine(root, path) {
        Ok(p) => p,
        Err(e) => return json!({"path": path, "error": e}),
    };
    let data: Vec<u8> = match (str_arg(req, "content"), blob) {
        (Some(c), _) => c.as_bytes().to_vec(),
        (None, Some(b)) => match std::fs::read(b) {
            Ok(d) => d,
            Err(e) => return json!({"path": path, "error": format!("blob: {e}")}),
        },
        (None, None) => {
            return json!({"path": path, "error": "content (text) or blob (the ref of a blob part of this msg) is required"})
        }
    };
    let content = data.as_slice();
    if content.len() as u64 > MAX_FS_BYTES {
        return json!({"path": path, "error": format!("content over {MAX_FS_BYTES} bytes")});
    }
    let append = req.get("append").and_then(Value::as_bool).unwrap_or(false);
    let r = (|| -> std::io::Result<u64> {
        let mut f = std::fs::OpenOptions::new()
            .custom_flags(libc::O_NOFOLLOW)
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&full)?;
        f.write_all(content)?;
        f.sync_data()?;
        Ok(f.metadata()?.len())
    })();
    match r {
        Ok(size) => json!({"path": path, "written": content.len(), "size": size, "append": append}),
        Err(e) => json!({"path": path, "error": e.to_string()}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_root() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), "x").unwrap();
        assert_eq!(confine(&root, "sub/a.txt").unwrap(), root.join("sub/a.txt"));
        assert_eq!(
            confine(&root, "new/file.txt").unwrap(),
            root.join("new/file.txt")
        );
        assert!(confine(&root, "../etc/passwd").is_err());
        assert!(confine(&root, "sub/../../x").is_err());
        assert!(confine(&root, "/etc/passwd").is_err());
        assert!(confine(&root, &root.join("sub/a.txt").display().to_string()).is_ok());
        // A symlink that leads out of the root.
        let outside = tempfile::TempDir::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
        assert!(confine(&root, "escape/secret").is_err());
        assert!(confine(&root, "escape").is_err());
        // A dangling symlink whose target would be outside.
        std::os::unix::fs::symlink(outside.path().join("new"), root.join("dangling")).unwrap();
        assert!(confine(&root, "dangling").is_err());
        let w = fs_write(&root, &json!({"path": "dangling", "content": "x"}), None);
        assert!(w["error"].is_string(), "{w}");
        assert!(!outside.path().join("new").exists());
    }

    #[test]
    fn mime_types_and_caps() {
        assert_eq!(Served::Exec.request_mime(), "application/vnd.awp.exec+json");
        assert_eq!(
            Served::FsRead.result_mime(),
            "application/vnd.awp.fs-read-result+json"
        );
        assert_eq!(Served::from_cap("fs:write"), Some(Served::FsWrite));
        assert_eq!(
            Served::from_mime("application/vnd.awp.fs-write+json"),
            Some(Served::FsWrite)
        );
        assert_eq!(Served::from_cap("admin"), None);
    }

    #[test]
    fn fs_read_and_write_round_trip_and_cap_output() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let w = fs_write(
            &root,
            &json!({"path": "notes.txt", "content": "hello"}),
            None,
        );
        assert_eq!(w["written"], 5, "{w}");
        let w = fs_write(
            &root,
            &json!({"path": "notes.txt", "content": " world", "append": true}),
            None,
        );
        assert_eq!(w["size"], 11);
        let (r, blobs) = fs_read(&root, &json!({"path": "notes.txt", "offset": 6}));
        assert_eq!(r["content"], "world");
        assert_eq!(r["eof"], true);
        assert!(blobs.is_empty());
        let (r, _) = fs_read(&root, &json!({"path": "../x"}));
        assert!(r["error"].is_string());
        // Over 64 KiB: the content goes as a blob.
        std::fs::write(root.join("big.bin"), vec![7u8; MAX_INLINE + 1]).unwrap();
        let (r, blobs) = fs_read(&root, &json!({"path": "big.bin", "length": 1_000_000}));
        assert_eq!(r["content_blob"], blobs[0].blob_ref.as_str());
        assert_eq!(blobs[0].data.len(), MAX_INLINE + 1);
        assert!(r.get("content").is_none());
        // From a blob file.
        let src = root.join("src.bin");
        std::fs::write(&src, b"from a blob").unwrap();
        let w = fs_write(&root, &json!({"path": "copy.bin", "blob": "R"}), Some(&src));
        assert_eq!(w["written"], 11, "{w}");
        assert_eq!(
            std::fs::read(root.join("copy.bin")).unwrap(),
            b"from a blob"
        );
        let w = fs_write(&root, &json!({"path": "none.bin"}), None);
        assert!(w["error"].is_string());
    }

    #[tokio::test]
    async fn exec_runs_in_the_root_with_a_timeout() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mut blobs = vec![];
        let r = exec(
            &root,
            &json!({"cmd": ["sh", "-c", "pwd; echo err >&2; exit 3"]}),
            &mut blobs,
        )
        .await;
        assert_eq!(r["exit"], 3);
        assert_eq!(
            r["stdout"].as_str().unwrap().trim(),
            root.display().to_string()
        );
        assert_eq!(r["stderr"], "err\n");
        let r = exec(
            &root,
            &json!({"cmd": "sleep 5", "timeout_ms": 100}),
            &mut blobs,
        )
        .await;
        assert!(r["error"].as_str().unwrap().contains("timed out"));
        assert!(blobs.is_empty());
        let r = exec(
            &root,
            &json!({"cmd": "head -c 70000 /dev/zero | tr '\\0' a"}),
            &mut blobs,
        )
        .await;
        assert_eq!(r["truncated"], true);
        assert_eq!(r["stdout"].as_str().unwrap().len(), MAX_INLINE);
        assert_eq!(
            r["stdout_blob"],
            blobs[0].blob_ref.as_str(),
            "the whole output goes as a blob"
        );
        assert_eq!(blobs[0].data.len(), 70000);
        let r = exec(&root, &json!({"cmd": "true", "cwd": "../"}), &mut blobs).await;
        assert!(r["error"].is_string());
        // A background process holding the pipe: the output so far comes back, and the
        // whole group is stopped.
        let marker = root.join("still-running");
        let cmd = format!("(sleep 0.3; touch {}) & echo started", marker.display());
        let r = exec(&root, &json!({"cmd": cmd, "timeout_ms": 2000}), &mut blobs).await;
        assert_eq!(r["stdout"], "started\n", "{r}");
        assert_eq!(r["exit"], 0);
        // Had it survived, it would have created the marker after 0.3 s.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            !marker.exists(),
            "the background process was stopped with the group"
        );
    }
}
