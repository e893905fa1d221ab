//! Served requests (off by default; `--serve exec,fs:read,fs:write --root DIR`).
//!
//! A request is a msg with a data part of mime `application/vnd.awp.<cap>+json`
//! (protocol-notes §Grants): `exec` {cmd: argv array or shell string, cwd, timeout_ms},
//! `fs-read` {path, offset, length}, `fs-write` {path, content, append}. It is served only
//! when this node serves that capability and the sender holds it now (an honored grant);
//! otherwise the msg is acked as usual and answered with `err forbidden`, re = the msg id.
//! Results go back as a msg in the same thread with `re` = the request id and a data part
//! `application/vnd.awp.<cap>-result+json`. Paths are confined to the root: `..`, absolute
//! paths outside it and symlinks that lead out are refused. Every served request is logged
//! (the node log, and one JSON line per request in `$AWP_HOME/served.log`).

use super::Inner;
use crate::wire::{self, code, DataPart, Line, Part, PeerKey};
use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Output kept inline per stream (stdout, stderr, file content), in bytes.
pub const MAX_INLINE: usize = 64 * 1024;
/// Default and largest `timeout_ms` of an exec request.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// Largest fs-read `length` and fs-write `content`, bytes.
pub const MAX_FS_BYTES: u64 = 512 * 1024;

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
        let result = match kind {
            Served::Exec => exec(&root, &req).await,
            Served::FsRead => blocking(move || fs_read(&root, &req)).await,
            Served::FsWrite => blocking(move || fs_write(&root, &req)).await,
        };
        let outcome = if result.get("error").is_some() {
            "failed"
        } else {
            "served"
        };
        let detail = format!("{} ms", started.elapsed().as_millis());
        log(&inner, &from, kind, &re, outcome, &detail);
        reply(&inner, from, &th, &re, kind, result).await;
    });
}

async fn blocking(f: impl FnOnce() -> Value + Send + 'static) -> Value {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| json!({"error": format!("internal: {e}")}))
}

async fn reply(inner: &Arc<Inner>, to: PeerKey, th: &str, re: &str, kind: Served, result: Value) {
    let (th, re) = (th.to_string(), re.to_string());
    let mime = kind.result_mime();
    let build = move |id: &str, ts: &str| {
        Line::Msg(wire::Msg {
            id: id.into(),
            ts: ts.into(),
            th: th.clone(),
            re: Some(re.clone()),
            subject: None,
            parts: vec![Part::Data(DataPart {
                data: result.clone(),
                mime: Some(mime.clone()),
            })],
        })
    };
    let queued = inner.store.enqueue(&to, &[&build]);
    match queued {
        Ok(_) => {
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

async fn exec(root: &Path, req: &Value) -> Value {
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
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return json!({"error": format!("cannot start: {e}")}),
    };
    match tokio::time::timeout(Duration::from_millis(timeout), child.wait_with_output()).await {
        Ok(Ok(out)) => {
            let (stdout, t1) = clip(&out.stdout);
            let (stderr, t2) = clip(&out.stderr);
            json!({
                "exit": out.status.code(),
                "duration_ms": started.elapsed().as_millis() as u64,
                "stdout": stdout,
                "stderr": stderr,
                "truncated": t1 || t2,
            })
        }
        Ok(Err(e)) => json!({"error": format!("wait: {e}")}),
        Err(_) => json!({
            "exit": Value::Null,
            "duration_ms": started.elapsed().as_millis() as u64,
            "error": format!("timed out after {timeout} ms"),
            "stdout": "", "stderr": "", "truncated": false,
        }),
    }
}

fn fs_read(root: &Path, req: &Value) -> Value {
    let Some(path) = str_arg(req, "path") else {
        return json!({"error": "path is required"});
    };
    let full = match confine(root, path) {
        Ok(p) => p,
        Err(e) => return json!({"path": path, "error": e}),
    };
    let offset = req.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let length = req
        .get("length")
        .and_then(Value::as_u64)
        .unwrap_or(MAX_INLINE as u64)
        .min(MAX_FS_BYTES);
    let r = (|| -> std::io::Result<(Vec<u8>, u64)> {
        let mut f = std::fs::File::open(&full)?;
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
            match String::from_utf8(buf) {
                Ok(text) => out["content"] = json!(text),
                Err(e) => out["content_b64"] = json!(wire::b64::encode_std(e.as_bytes())),
            }
            out
        }
        Err(e) => json!({"path": path, "error": e.to_string()}),
    }
}

fn fs_write(root: &Path, req: &Value) -> Value {
    let Some(path) = str_arg(req, "path") else {
        return json!({"error": "path is required"});
    };
    let full = match confine(root, path) {
        Ok(p) => p,
        Err(e) => return json!({"path": path, "error": e}),
    };
    let Some(content) = str_arg(req, "content") else {
        return json!({"path": path, "error": "content (text) is required; blob content is not served yet"});
    };
    if content.len() as u64 > MAX_FS_BYTES {
        return json!({"path": path, "error": format!("content over {MAX_FS_BYTES} bytes")});
    }
    let append = req.get("append").and_then(Value::as_bool).unwrap_or(false);
    let r = (|| -> std::io::Result<u64> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&full)?;
        f.write_all(content.as_bytes())?;
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
        let w = fs_write(&root, &json!({"path": "notes.txt", "content": "hello"}));
        assert_eq!(w["written"], 5, "{w}");
        let w = fs_write(
            &root,
            &json!({"path": "notes.txt", "content": " world", "append": true}),
        );
        assert_eq!(w["size"], 11);
        let r = fs_read(&root, &json!({"path": "notes.txt", "offset": 6}));
        assert_eq!(r["content"], "world");
        assert_eq!(r["eof"], true);
        let r = fs_read(&root, &json!({"path": "../x"}));
        assert!(r["error"].is_string());
    }

    #[tokio::test]
    async fn exec_runs_in_the_root_with_a_timeout() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let r = exec(
            &root,
            &json!({"cmd": ["sh", "-c", "pwd; echo err >&2; exit 3"]}),
        )
        .await;
        assert_eq!(r["exit"], 3);
        assert_eq!(
            r["stdout"].as_str().unwrap().trim(),
            root.display().to_string()
        );
        assert_eq!(r["stderr"], "err\n");
        let r = exec(&root, &json!({"cmd": "sleep 5", "timeout_ms": 100})).await;
        assert!(r["error"].as_str().unwrap().contains("timed out"));
        let r = exec(
            &root,
            &json!({"cmd": "head -c 70000 /dev/zero | tr '\\0' a"}),
        )
        .await;
        assert_eq!(r["truncated"], true);
        assert_eq!(r["stdout"].as_str().unwrap().len(), MAX_INLINE);
        let r = exec(&root, &json!({"cmd": "true", "cwd": "../"})).await;
        assert!(r["error"].is_string());
    }
}
