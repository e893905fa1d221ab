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
//! request (`{path, blob: REF}`). Every served request is logged (the node log, and one
//! JSON line per request in `$AWP_HOME/served.log`, created 0600).
//!
//! Limits (a peer with a grant is still hostile input):
//! - Paths are resolved beneath the root's open handle ([`super::served_fs`]): no `..`,
//!   no symlink out, regular files only, no hard links unless `--allow-hardlinks`.
//! - Work runs on the served workers ([`super::workers`]), never on tokio's blocking pool,
//!   and optionally inside a Landlock sandbox (`--sandbox`).
//! - At most [`MAX_RUNNING_PER_PEER`] requests of one peer run at once and
//!   [`MAX_QUEUED_PER_PEER`] more wait for a slot, in arrival order; beyond, and while the
//!   peer's outbox is over its quota (`outbox_quota_bytes`, `outbox_quota_lines`),
//!   requests are answered `err busy` (re = the request id). An fs-read result that would
//!   take the outbox over the quota is answered `err busy` too; an exec result goes
//!   without its output blobs (`output_dropped` says why), since the command did run.
//! - exec runs with a clean environment ([`exec_env`]): not the node's, not `AWP_HOME`.
//!   A peer with `exec` is still trusted with a shell as this user.

use super::served_fs::{self, Root, WriteSource};
use super::workers::{Sandbox, Workers};
use super::Inner;
use crate::blob::Outgoing;
use crate::wire::{self, code, DataPart, Line, Part, PeerKey};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use super::served_fs::{relative, MAX_FS_BYTES, MAX_INLINE};

/// Default and largest `timeout_ms` of an exec request.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// Most output captured per exec stream (the rest is read and dropped), bytes.
pub const MAX_CAPTURE: usize = 8 * 1024 * 1024;
/// How long fs-write waits for the request's blob to complete, ms.
const BLOB_WAIT_MS: u64 = 10_000;
/// Served requests of one peer running at once; more wait in the peer's queue.
pub const MAX_RUNNING_PER_PEER: usize = 4;
/// Served requests of one peer waiting for a running slot; more are answered `err busy`
/// (issue 8 §4: one peer cannot hold the served workers, nor queue without end).
pub const MAX_QUEUED_PER_PEER: usize = 4;
/// `PATH` of an exec child.
pub const EXEC_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

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
    pub(crate) fn from_mime(m: &str) -> Option<Served> {
        [Served::Exec, Served::FsRead, Served::FsWrite]
            .into_iter()
            .find(|s| s.request_mime() == m)
    }
}

/// Per-peer outbox quota for served results: a peer whose queued lines reach either
/// number gets `err busy` instead of more output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxQuota {
    /// Queued lines (default [`crate::config::DEFAULT_OUTBOX_QUOTA_LINES`]).
    pub lines: u64,
    /// Queued bytes (default [`crate::config::DEFAULT_OUTBOX_QUOTA_BYTES`]).
    pub bytes: u64,
}

impl Default for OutboxQuota {
    fn default() -> Self {
        OutboxQuota {
            lines: crate::config::DEFAULT_OUTBOX_QUOTA_LINES,
            bytes: crate::config::DEFAULT_OUTBOX_QUOTA_BYTES,
        }
    }
}

/// What this node serves, and the state of serving it.
#[derive(Debug, Default)]
pub struct ServeConfig {
    pub caps: Vec<Served>,
    /// The root requests are confined to (opened at start).
    pub root: Option<Root>,
    /// Landlock domain for served work (`--sandbox`).
    pub sandbox: Option<Sandbox>,
    /// Per-peer outbox quota for results.
    pub quota: OutboxQuota,
    /// Threads served work runs on.
    pub workers: Workers,
    /// Requests admitted (running or queued) per peer.
    running: Arc<Mutex<HashMap<PeerKey, PeerSlots>>>,
}

/// One peer's served requests: how many are admitted, and the permits to run.
#[derive(Debug)]
struct PeerSlots {
    admitted: usize,
    run: Arc<tokio::sync::Semaphore>,
}

impl ServeConfig {
    /// Serving `caps` beneath `root`.
    pub fn new(
        caps: Vec<Served>,
        root: Option<Root>,
        sandbox: Option<Sandbox>,
        quota: OutboxQuota,
    ) -> ServeConfig {
        ServeConfig {
            caps,
            root,
            sandbox,
            quota,
            ..Default::default()
        }
    }
}

/// One admitted request of a peer (running, or queued until [`Running::run`] gives it a
/// permit); dropping it frees the peer's place.
struct Running {
    map: Arc<Mutex<HashMap<PeerKey, PeerSlots>>>,
    peer: PeerKey,
    run: Arc<tokio::sync::Semaphore>,
}

impl Running {
    /// Wait for one of the peer's [`MAX_RUNNING_PER_PEER`] running slots (in arrival order).
    async fn run(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.run.clone().acquire_owned().await.ok()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get_mut(&self.peer) {
            s.admitted -= 1;
            if s.admitted == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

/// A place for one more request of `peer`, unless [`MAX_RUNNING_PER_PEER`] run and
/// [`MAX_QUEUED_PER_PEER`] wait already.
fn begin(serve: &ServeConfig, peer: PeerKey) -> Option<Running> {
    let mut m = serve.running.lock().unwrap_or_else(|p| p.into_inner());
    let s = m.entry(peer).or_insert_with(|| PeerSlots {
        admitted: 0,
        run: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING_PER_PEER)),
    });
    if s.admitted >= MAX_RUNNING_PER_PEER + MAX_QUEUED_PER_PEER {
        return None;
    }
    s.admitted += 1;
    Some(Running {
        map: serve.running.clone(),
        peer,
        run: s.run.clone(),
    })
}

/// Why `peer`'s outbox cannot take `extra` (lines, bytes) more, if it cannot.
pub(super) fn over_quota(inner: &Inner, peer: &PeerKey, extra: (u64, u64)) -> Option<String> {
    let q = inner.serve.quota;
    let (lines, bytes) = match inner.store.outbox_usage(peer) {
        Ok(u) => u,
        Err(e) => return Some(format!("outbox: {e}")),
    };
    let (l, b) = (lines.saturating_add(extra.0), bytes.saturating_add(extra.1));
    (l > q.lines || b > q.bytes || lines >= q.lines || bytes >= q.bytes).then(|| {
        format!(
            "the outbox for you holds {lines} lines, {bytes} bytes (quota {} lines, {} bytes): ack what you received, then ask again",
            q.lines, q.bytes
        )
    })
}

/// Answer `re` with `err <code>` (not queued: sent when connected).
fn refuse(inner: &Inner, to: &PeerKey, th: &str, re: &str, code: &str, detail: String) {
    let err = Line::Err(wire::ErrLine {
        id: inner.store.next_control_id(),
        ts: wire::time::format_ms(wire::time::now_ms()),
        th: Some(th.to_string()),
        re: Some(re.to_string()),
        code: code.into(),
        detail: Some(detail),
        blob_ref: None,
    });
    inner.send_ephemeral(to, &err);
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
        refuse(inner, &from, &m.th, &m.id, code::FORBIDDEN, detail);
        return;
    }
    let busy = |detail: String| {
        log(inner, &from, kind, &m.id, "busy", &detail);
        refuse(inner, &from, &m.th, &m.id, code::BUSY, detail);
    };
    if let Some(detail) = over_quota(inner, &from, (0, 0)) {
        return busy(detail);
    }
    let Some(running) = begin(&inner.serve, from) else {
        return busy(format!(
            "{MAX_RUNNING_PER_PEER} of your requests are running and {MAX_QUEUED_PER_PEER} waiting; ask again when one is answered"
        ));
    };
    let inner = inner.clone();
    let (th, re) = (m.th.clone(), m.id.clone());
    inner.tasks.clone().spawn(async move {
        // Stopping the node does not wait for served work: the task ends (an exec child
        // is killed, a queued request is dropped), a job on a worker thread finishes on
        // its own.
        tokio::select! {
            _ = inner.shutdown.cancelled() => {}
            _ = async {
                let Some(_slot) = running.run().await else { return };
                serve_one(&inner, from, kind, req, &th, &re).await
            } => {}
        }
        drop(running);
    });
}

/// Serve one request whose peer holds the capability, and queue the result.
async fn serve_one(
    inner: &Arc<Inner>,
    from: PeerKey,
    kind: Served,
    req: Value,
    th: &str,
    re: &str,
) {
    let Some(root) = inner.serve.root.clone() else {
        return;
    };
    let sandbox = inner.serve.sandbox.as_ref();
    let workers = &inner.serve.workers;
    let started = Instant::now();
    let mut blobs = Vec::new();
    let internal = |e: String| json!({"error": format!("internal: {e}")});
    let result = match kind {
        Served::Exec => exec(&root, sandbox, workers, &req, &mut blobs).await,
        Served::FsRead => {
            match workers
                .run(sandbox, move || served_fs::fs_read(&root, &req))
                .await
            {
                Ok((v, b)) => {
                    blobs = b;
                    v
                }
                Err(e) => internal(e),
            }
        }
        Served::FsWrite => {
            let source = match req.get("blob").and_then(Value::as_str) {
                Some(r) => wait_for_blob(inner, &from, r)
                    .await
                    .and_then(|p| std::fs::File::open(&p).map_err(|e| format!("blob: {e}")))
                    .map(|f| Some(WriteSource::File(f))),
                None => Ok(None),
            };
            match source {
                Ok(src) => workers
                    .run(sandbox, move || served_fs::fs_write(&root, &req, src))
                    .await
                    .unwrap_or_else(internal),
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
    log(inner, &from, kind, re, outcome, &detail);
    reply(inner, from, th, re, kind, result, blobs).await;
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
        file: None,
        source: PathBuf::new(),
        stream: None,
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

/// What queuing `result` with `blobs` adds to an outbox: (lines, bytes), an upper
/// estimate (base64 of each chunk plus its line and record overhead).
fn result_cost(result: &Value, blobs: &[Outgoing]) -> (u64, u64) {
    const PER_LINE: u64 = 512;
    let mut lines = 1u64;
    let mut bytes = result.to_string().len() as u64 + PER_LINE;
    for b in blobs {
        let n = b.chunk_count() as u64;
        lines += n;
        bytes += b.size().div_ceil(3) * 4 + n * PER_LINE;
    }
    (lines, bytes)
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
    let (mut result, mut blobs) = (result, blobs);
    let over = over_quota(inner, &to, result_cost(&result, &blobs));
    if let Some(detail) = over.filter(|_| kind == Served::FsRead || !blobs.is_empty()) {
        if kind == Served::FsRead {
            // Nothing happened: refuse, the peer may ask again once it has acked.
            log(inner, &to, kind, re, "busy", &detail);
            refuse(inner, &to, th, re, code::BUSY, detail);
            return;
        }
        // exec and fs-write did run: say so, without the blobs.
        for b in ["stdout_blob", "stderr_blob"] {
            if result.get(b).is_some() {
                result[b] = Value::Null;
            }
        }
        result["output_dropped"] = json!(detail);
        blobs.clear();
    }
    let (th, re) = (th.to_string(), re.to_string());
    let mime = kind.result_mime();
    let mut parts = vec![Part::Data(DataPart {
        data: result,
        mime: Some(mime),
    })];
    parts.extend(blobs.iter().map(Outgoing::part));
    // Chunks first, then the msg naming them, in one transaction (protocol-notes §Blobs).
    // Chunks of a file blob are read from the file as they are built, so this runs on a
    // worker (outside the sandbox: it writes the store).
    let inner2 = inner.clone();
    let queued = inner
        .serve
        .workers
        .run(None, move || {
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
            let chunks = super::blobs::chunk_builders(&blobs, &th);
            let mut builders: Vec<crate::store::LineBuilder<'_>> = chunks
                .iter()
                .map(|b| b.as_ref() as crate::store::LineBuilder<'_>)
                .collect();
            builders.push(&build);
            // The blobs' records commit with their lines.
            super::blobs::enqueue(&inner2, &to, &builders, &blobs)?;
            Ok::<_, crate::store::StoreError>(())
        })
        .await;
    match queued {
        Ok(Ok(())) => {
            if let Err(e) = inner.store.flush().await {
                tracing::warn!("served result not flushed: {e}");
            }
            inner.outbox_changed(&to);
        }
        Ok(Err(e)) => tracing::warn!("served result not queued: {e}"),
        Err(e) => tracing::warn!("served result not queued: {e}"),
    }
}

/// Create (0600, whatever the umask) or open `path` for appending; an existing file that
/// others could read or write (left by an older version) is made 0600. A symlink is
/// refused.
pub(crate) fn open_private_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mode = f.metadata()?.permissions().mode();
    if mode & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(f)
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
    let r = open_private_append(&path).and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = r {
        tracing::warn!("{}: {e}", path.display());
    }
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

/// The whole environment of an exec child: `PATH` = [`EXEC_PATH`], `HOME` = the root,
/// `LANG` (the node's, else `C.UTF-8`). Nothing else of the node's environment (so no
/// `AWP_HOME`) is passed on.
pub fn exec_env(root: &Path) -> Vec<(String, String)> {
    let lang = std::env::var("LANG")
        .ok()
        .filter(|l| !l.is_empty() && l.len() < 64 && !l.contains('/'))
        .unwrap_or_else(|| "C.UTF-8".into());
    vec![
        ("PATH".into(), EXEC_PATH.into()),
        ("HOME".into(), root.display().to_string()),
        ("LANG".into(), lang),
    ]
}

async fn exec(
    root: &Root,
    sandbox: Option<&Sandbox>,
    workers: &Workers,
    req: &Value,
    blobs: &mut Vec<Outgoing>,
) -> Value {
    let cwd = match str_arg(req, "cwd")
        .map(|c| relative(&root.path, c))
        .transpose()
    {
        Ok(c) => c.unwrap_or_default(),
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
    cmd.env_clear()
        .envs(exec_env(&root.path))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // Its own process group, so a timeout (or the end of the command) stops everything it
    // started, background processes included.
    cmd.process_group(0);
    let started = Instant::now();
    // The working directory is opened beneath the root and entered through its descriptor
    // (never re-walked by name); the child is started on a worker, inside the sandbox
    // when there is one, and inherits it.
    let dir = root.dir.clone();
    let rt = tokio::runtime::Handle::current();
    let spawned = workers
        .run(sandbox, move || {
            let _rt = rt.enter();
            let d = if cwd.as_os_str().is_empty() {
                dir.try_clone()
            } else {
                dir.open_dir(&cwd)
            }
            .map_err(|e| format!("cwd: {e}"))?;
            use std::os::fd::AsRawFd;
            cmd.current_dir(format!("/proc/self/fd/{}", d.as_raw_fd()));
            let child = cmd.spawn().map_err(|e| format!("cannot start: {e}"));
            drop(d);
            child
        })
        .await;
    let mut child = match spawned {
        Ok(Ok(c)) => c,
        Ok(Err(e)) | Err(e) => return json!({"error": e}),
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
        .env_clear()
        .env("PATH", EXEC_PATH)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn a_peer_runs_at_most_so_many_requests_at_once_and_queues_a_bounded_number() {
        let serve = ServeConfig::default();
        let p = PeerKey::parse("ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg").unwrap();
        let q = PeerKey::parse("ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc").unwrap();
        let mut held: Vec<_> = (0..MAX_RUNNING_PER_PEER + MAX_QUEUED_PER_PEER)
            .map(|_| begin(&serve, p).expect("a place"))
            .collect();
        assert!(begin(&serve, p).is_none(), "one more is refused");
        // Four run; the queued ones wait for a permit.
        let mut permits = Vec::new();
        for r in &held[..MAX_RUNNING_PER_PEER] {
            permits.push(r.run().await.expect("a running slot"));
        }
        let queued = &held[MAX_RUNNING_PER_PEER];
        assert!(
            tokio::time::timeout(Duration::from_millis(20), queued.run())
                .await
                .is_err(),
            "a fifth waits"
        );
        permits.pop();
        assert!(
            queued.run().await.is_some(),
            "a finished request lets the next run"
        );
        assert!(begin(&serve, q).is_some(), "another peer is not affected");
        held.pop();
        assert!(
            begin(&serve, p).is_some(),
            "a finished request frees its slot"
        );
        drop(held);
        assert!(serve.running.lock().unwrap().is_empty());
    }

    #[test]
    fn result_cost_covers_the_chunks() {
        let b = output_blob("x", "text/plain", vec![1u8; 3 * 256 * 1024 + 1]);
        let (lines, bytes) = result_cost(&json!({"a": 1}), std::slice::from_ref(&b));
        assert_eq!(lines, 1 + b.chunk_count() as u64);
        let exact: u64 = (0..b.chunk_count())
            .map(|n| {
                b.chunk(
                    n,
                    "01ARZ3NDEKTSV4RRFFQ69G5FAV",
                    "01ARZ3NDEKTSV4RRFFQ69G5FAV",
                    "2026-01-01T00:00:00.000Z",
                )
                .encode()
                .len() as u64
            })
            .sum();
        assert!(bytes > exact, "{bytes} > {exact}");
    }

    async fn exec_in(root: &Root, req: Value, blobs: &mut Vec<Outgoing>) -> Value {
        exec(root, None, &Workers::new(2), &req, blobs).await
    }

    #[tokio::test]
    async fn exec_runs_in_the_root_with_a_timeout() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = Root::open(dir.path(), false).unwrap();
        let mut blobs = vec![];
        let r = exec_in(
            &root,
            json!({"cmd": ["sh", "-c", "pwd -P; echo err >&2; exit 3"]}),
            &mut blobs,
        )
        .await;
        assert_eq!(r["exit"], 3, "{r}");
        assert_eq!(
            r["stdout"].as_str().unwrap().trim(),
            root.path.display().to_string()
        );
        assert_eq!(r["stderr"], "err\n");
        let r = exec_in(
            &root,
            json!({"cmd": "sleep 5", "timeout_ms": 100}),
            &mut blobs,
        )
        .await;
        assert!(r["error"].as_str().unwrap().contains("timed out"));
        assert!(blobs.is_empty());
        let r = exec_in(
            &root,
            json!({"cmd": "head -c 70000 /dev/zero | tr '\\0' a"}),
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
        let r = exec_in(&root, json!({"cmd": "true", "cwd": "../"}), &mut blobs).await;
        assert!(r["error"].is_string());
        // A cwd inside the root.
        std::fs::create_dir(root.path.join("sub")).unwrap();
        let r = exec_in(&root, json!({"cmd": "pwd -P", "cwd": "sub"}), &mut blobs).await;
        assert_eq!(
            r["stdout"].as_str().unwrap().trim(),
            root.path.join("sub").display().to_string()
        );
        // A background process holding the pipe: the output so far comes back, and the
        // whole group is stopped.
        let marker = root.path.join("still-running");
        let cmd = format!("(sleep 0.3; touch {}) & echo started", marker.display());
        let r = exec_in(&root, json!({"cmd": cmd, "timeout_ms": 2000}), &mut blobs).await;
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
