//! `awp serve-agent --acp -- CMD…`: a local ACP agent (a child process speaking ACP on its
//! stdio) served to remote AWP peers. This process is an ACP *client* of the agent and a
//! control-socket client of the node (like every CLI verb): it subscribes to the node's
//! events and answers through `send` / `state` requests.
//!
//! - Each AWP thread from a peer ↔ one ACP session (`session/new`, `cwd` = the root), one
//!   task per thread ([`MAX_THREADS`] at most, each with a bounded inbox). A thread where
//!   this node's user wrote first (seen while serving) is left to the user.
//! - An inbound msg becomes a `session/prompt` ([`bridge::prompt_blocks`]); msgs that come
//!   while a prompt runs wait (at most [`MAX_QUEUED_PROMPTS`]).
//! - `session/update`s become progress msgs ([`bridge::progress_of`], coalesced by
//!   [`bridge::Coalescer`]); the `stopReason` becomes our state `done` or `failed`. No
//!   update is dropped: each thread holds its session's updates outside its bounded inbox,
//!   up to [`MAX_PENDING_UPDATE_BYTES`], and beyond that the agent connection waits
//!   (backpressure to the agent's pipe).
//! - `session/request_permission`: approved at once when the peer holds the grant the tool
//!   kind needs ([`bridge::auto_approval`]), else our state `waiting` and a msg asking the
//!   peer, whose next msg answers it (`allow`, `deny` or an option id).
//! - `fs/read_text_file` / `fs/write_text_file`: confined to the root by
//!   [`crate::node::served_fs`] (as served requests), only for a peer holding `fs:read` /
//!   `fs:write`.
//! - The peer's state `closed` or `failed` → `session/cancel`.
//! - The agent is supervised: when it exits, or breaks its output (a line over
//!   [`MAX_AGENT_LINE`], or more than [`super::linecap::MAX_BAD_LINES`] lines in a row that
//!   are no JSON-RPC messages, as `yes` would write), it is killed and started again after
//!   a backoff (from [`BACKOFF_START`], doubling to [`BACKOFF_MAX`]); the prompts it was
//!   running end as `failed` with a note naming the cause. A prompt that finds no running
//!   agent waits for the next start, and ends `failed` with the last cause (e.g. `cannot
//!   start the agent …`) when that start fails too. Every request to the agent has a
//!   timeout.
//! - SIGINT/SIGTERM: every thread with a running or queued prompt gets our state `failed`
//!   with the note `NAME stopped serving the agent` (within [`STOP_TIMEOUT`]), then the
//!   process exits.

use super::bridge::{self, Coalescer, Progress};
pub use super::linecap::{line_cap, LineCap};
use crate::control::{self, Request};
use crate::node::served_fs;
use acp::v1::schema as s;
use acp::v1::ConnectionTo;
use agent_client_protocol as acp;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// Most threads served at once; a msg in a further thread is answered `failed` (busy).
pub const MAX_THREADS: usize = 256;
/// Events waiting for one thread's task.
pub const THREAD_QUEUE: usize = 256;
/// Prompts waiting behind the running one in one thread.
pub const MAX_QUEUED_PROMPTS: usize = 8;
/// Timeout of `initialize`, `session/new` and of waiting for a (re)started agent.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a permission question waits for the peer's answer (then: cancelled).
pub const PERMISSION_TIMEOUT: Duration = Duration::from_secs(600);
/// First restart delay of a dead agent.
pub const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// An agent that ran this long before dying is restarted after [`BACKOFF_START`] again.
pub const BACKOFF_RESET: Duration = Duration::from_secs(60);
/// Most pages of `grants` read to learn a peer's capabilities.
const MAX_GRANT_PAGES: usize = 20;
/// Longest line accepted from the agent, in bytes; a longer one ends the connection (the
/// agent is then restarted), so a runaway agent cannot fill our memory.
pub const MAX_AGENT_LINE: usize = 16 * 1024 * 1024;

/// What `awp serve-agent --acp` runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The node's control socket.
    pub socket: PathBuf,
    /// The directory sessions run in and fs requests are confined to.
    pub root: PathBuf,
    /// The agent command and its arguments.
    pub cmd: Vec<String>,
    /// Longest a `session/prompt` may run (then it ends `failed`).
    pub prompt_timeout: Duration,
}

type Conn = (u64, ConnectionTo<acp::Agent>);

/// Most bytes of agent updates (JSON) waiting for one thread's task; beyond it the agent
/// connection waits (backpressure to the agent's pipe) instead of dropping output.
pub const MAX_PENDING_UPDATE_BYTES: usize = 1024 * 1024;

#[derive(Clone)]
struct Route {
    peer: String,
    tx: mpsc::Sender<ThreadEvent>,
    /// Agent updates of the session, outside the bounded event queue.
    pending: Arc<Pending>,
}

/// A thread's agent updates not yet taken by its task, in order, with their size.
#[derive(Default)]
struct Pending {
    q: Mutex<(VecDeque<Value>, usize)>,
    /// Updates were added.
    ready: tokio::sync::Notify,
    /// Updates were taken.
    drained: tokio::sync::Notify,
}

impl Pending {
    /// Queue `u`, waiting while [`MAX_PENDING_UPDATE_BYTES`] are already waiting.
    async fn push(&self, u: Value) {
        let size = u.to_string().len();
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            {
                let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
                if q.0.is_empty() || q.1 + size <= MAX_PENDING_UPDATE_BYTES {
                    q.0.push_back(u);
                    q.1 += size;
                    self.ready.notify_one();
                    return;
                }
            }
            drained.await;
        }
    }

    /// Everything waiting, oldest first.
    fn take(&self) -> VecDeque<Value> {
        let taken = {
            let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
            q.1 = 0;
            std::mem::take(&mut q.0)
        };
        self.drained.notify_waiters();
        taken
    }
}

struct Shared {
    socket: PathBuf,
    root: served_fs::Root,
    cmd: Vec<String>,
    prompt_timeout: Duration,
    /// Session id → the thread that owns it.
    routes: Mutex<HashMap<String, Route>>,
    conn: watch::Receiver<Option<Conn>>,
    /// How the agent's last run ended (could not start, exited, broke its output); it
    /// changes each time a run ends.
    down: watch::Receiver<Option<String>>,
    /// Peer msgs that reached a thread task as it ended (closed thread), to be served by
    /// a new task.
    redo: mpsc::Sender<((String, String), ThreadEvent)>,
}

enum ThreadEvent {
    PeerMsg {
        id: String,
        parts: Vec<Value>,
    },
    PeerState {
        state: String,
    },
    Permission {
        req: Value,
        reply: oneshot::Sender<Option<String>>,
    },
    PromptDone {
        generation: u64,
        result: Result<String, String>,
    },
    AgentDied {
        generation: u64,
        note: String,
    },
    /// `serve-agent` is stopping: fail the running and queued prompts with `note`, then
    /// end; `done` is answered once the state went out.
    Stop {
        note: String,
        done: oneshot::Sender<()>,
    },
}

/// How long stopping (SIGINT/SIGTERM) may take to fail the running prompts' threads.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Fail every running or queued prompt with "NAME stopped serving the agent", within
/// [`STOP_TIMEOUT`] in all.
async fn stop_threads(
    shared: &Arc<Shared>,
    threads: &HashMap<(String, String), mpsc::Sender<ThreadEvent>>,
) {
    let _ = tokio::time::timeout(STOP_TIMEOUT, async {
        let name = match control::request(&shared.socket, &Request::Whoami).await {
            Ok(r) if r.ok => r.body["name"].as_str().map(str::to_string),
            _ => None,
        };
        let note = format!(
            "{} stopped serving the agent",
            name.as_deref().unwrap_or("the node")
        );
        let mut waits = Vec::new();
        for tx in threads.values().filter(|tx| !tx.is_closed()) {
            let (done, wait) = oneshot::channel();
            let stop = ThreadEvent::Stop {
                note: note.clone(),
                done,
            };
            if tx.send(stop).await.is_ok() {
                waits.push(wait);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    })
    .await;
}

/// Run until the node closes the event stream (an error) or the process is interrupted.
pub async fn run(cfg: ServeConfig) -> Result<(), String> {
    if cfg.cmd.is_empty() {
        return Err("no agent command (awp serve-agent --acp -- CMD ARGS…)".into());
    }
    let root = served_fs::Root::open(&cfg.root, false)
        .map_err(|e| format!("cannot open the root {}: {e}", cfg.root.display()))?;
    let mut sub = control::subscribe(
        &cfg.socket,
        &Request::Subscribe {
            th: None,
            peer: None,
            from_seq: None,
        },
    )
    .await
    .map_err(|e| format!("cannot subscribe to the node: {e}"))?;
    let (conn_tx, conn_rx) = watch::channel(None);
    let (down_tx, down_rx) = watch::channel(None);
    let (redo_tx, mut redo_rx) = mpsc::channel(THREAD_QUEUE);
    let shared = Arc::new(Shared {
        socket: cfg.socket.clone(),
        root,
        cmd: cfg.cmd.clone(),
        prompt_timeout: cfg.prompt_timeout,
        routes: Mutex::new(HashMap::new()),
        conn: conn_rx,
        down: down_rx,
        redo: redo_tx,
    });
    let supervisor = tokio::spawn(supervise(shared.clone(), conn_tx, down_tx));
    let mut threads: HashMap<(String, String), mpsc::Sender<ThreadEvent>> = HashMap::new();
    let mut ours = std::collections::HashSet::new();
    let stop = stop_signal();
    tokio::pin!(stop);
    let result = loop {
        tokio::select! {
            ev = sub.next_event() => match ev {
                Ok(Some(ev)) => dispatch(&shared, &mut threads, &mut ours, ev),
                Ok(None) => break Err("the node closed the event stream".to_string()),
                Err(e) => break Err(format!("the node's event stream failed: {e}")),
            },
            Some((key, ev)) = redo_rx.recv() => {
                if threads.get(&key).is_none_or(|tx| tx.is_closed()) {
                    threads.remove(&key);
                    start_thread(&shared, &mut threads, key, ev);
                } else if let Some(tx) = threads.get(&key) {
                    let _ = tx.try_send(ev);
                }
            }
            _ = &mut stop => {
                stop_threads(&shared, &threads).await;
                break Ok(());
            }
        }
    };
    supervisor.abort();
    result
}

/// Threads remembered as started by this node's user (their replies are not prompts).
const MAX_OURS: usize = 4096;

fn dispatch(
    shared: &Arc<Shared>,
    threads: &mut HashMap<(String, String), mpsc::Sender<ThreadEvent>>,
    ours: &mut std::collections::HashSet<(String, String)>,
    ev: control::Event,
) {
    if ev.get("event").and_then(Value::as_str) != Some("line") {
        return;
    }
    let (Some(peer), Some(th)) = (
        ev.get("peer").and_then(Value::as_str),
        ev.get("th").and_then(Value::as_str),
    ) else {
        return;
    };
    let key = (peer.to_string(), th.to_string());
    match ev.get("dir").and_then(Value::as_str) {
        Some("in") if !ours.contains(&key) => {}
        Some("out") => {
            // A line of ours in a thread no session serves: the user talks to the peer
            // directly there, and the peer's replies are for the user, not the agent.
            if !threads.contains_key(&key) {
                if ours.len() >= MAX_OURS {
                    ours.clear();
                }
                ours.insert(key);
            }
            return;
        }
        _ => return,
    }
    let Some(line) = ev.get("line") else { return };
    let event = match line["t"].as_str() {
        Some("msg") => {
            let parts = line["parts"].as_array().cloned().unwrap_or_default();
            if parts.is_empty() || parts.iter().any(bridge::is_served_request) {
                return;
            }
            ThreadEvent::PeerMsg {
                id: line["id"].as_str().unwrap_or_default().to_string(),
                parts,
            }
        }
        Some("state") => {
            if !threads.contains_key(&key) {
                return;
            }
            ThreadEvent::PeerState {
                state: line["state"].as_str().unwrap_or_default().to_string(),
            }
        }
        _ => return,
    };
    if let Some(tx) = threads.get(&key) {
        match tx.try_send(event) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(peer, th, "thread queue full; msg dropped");
                busy(shared, peer, th, "too many events waiting in this thread");
                return;
            }
            Err(mpsc::error::TrySendError::Closed(ev)) => {
                threads.remove(&key);
                if matches!(ev, ThreadEvent::PeerState { .. }) {
                    return;
                }
                return start_thread(shared, threads, key, ev);
            }
        }
    }
    if matches!(event, ThreadEvent::PeerMsg { .. }) {
        start_thread(shared, threads, key, event);
    }
}

fn start_thread(
    shared: &Arc<Shared>,
    threads: &mut HashMap<(String, String), mpsc::Sender<ThreadEvent>>,
    key: (String, String),
    first: ThreadEvent,
) {
    if threads.len() >= MAX_THREADS {
        threads.retain(|_, tx| !tx.is_closed());
    }
    if threads.len() >= MAX_THREADS {
        busy(shared, &key.0, &key.1, "too many threads are being served");
        return;
    }
    let (tx, rx) = mpsc::channel(THREAD_QUEUE);
    let _ = tx.try_send(first);
    let actor = ThreadActor {
        shared: shared.clone(),
        peer: key.0.clone(),
        th: key.1.clone(),
        tx: tx.clone(),
        session: None,
        busy: None,
        queue: VecDeque::new(),
        pending: None,
        coalescer: Coalescer::new(),
        updates: Arc::new(Pending::default()),
        re: None,
        closing: false,
    };
    tokio::spawn(actor.run(rx));
    threads.insert(key, tx);
}

/// Answer a msg we cannot take with our state `failed` and a note.
fn busy(shared: &Arc<Shared>, peer: &str, th: &str, why: &str) {
    let (socket, peer, th, note) = (
        shared.socket.clone(),
        peer.to_string(),
        th.to_string(),
        format!("busy: {why}; try again later in a new thread"),
    );
    tokio::spawn(async move {
        let _ = control::request(
            &socket,
            &Request::State {
                peer: Some(peer),
                th,
                state: "failed".into(),
                note: Some(note),
                wait_ack_ms: None,
            },
        )
        .await;
    });
}

// ---------------------------------------------------------------------------------------
// The agent process and its ACP connection.

async fn supervise(
    shared: Arc<Shared>,
    conn_tx: watch::Sender<Option<Conn>>,
    down_tx: watch::Sender<Option<String>>,
) {
    let mut generation = 0u64;
    let mut backoff = BACKOFF_START;
    loop {
        generation += 1;
        let started = Instant::now();
        let note = run_agent(&shared, generation, &conn_tx).await;
        conn_tx.send_replace(None);
        tracing::warn!("{note}; restarting it in {} ms", backoff.as_millis());
        // Prompts waiting for a connection learn why there is none.
        down_tx.send_replace(Some(note.clone()));
        let routes: Vec<Route> = {
            let mut r = shared.routes.lock().unwrap_or_else(|p| p.into_inner());
            r.drain().map(|(_, v)| v).collect()
        };
        for r in routes {
            let _ = r.tx.try_send(ThreadEvent::AgentDied {
                generation,
                note: note.clone(),
            });
        }
        if started.elapsed() >= BACKOFF_RESET {
            backoff = BACKOFF_START;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Start the agent, initialize it, publish the connection; returns how it ended.
async fn run_agent(
    shared: &Arc<Shared>,
    generation: u64,
    conn_tx: &watch::Sender<Option<Conn>>,
) -> String {
    let mut cmd = tokio::process::Command::new(&shared.cmd[0]);
    cmd.args(&shared.cmd[1..])
        .current_dir(&shared.root.path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    // A process group of its own: a terminal's Ctrl-C (SIGINT to the foreground group)
    // reaches `serve-agent`, which fails the running prompts with its stop note and then
    // stops the agent, instead of the agent dying of the signal first.
    #[cfg(unix)]
    cmd.process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // The path stays in our log; the peer's note names only the cause.
            tracing::warn!("cannot start the agent {:?}: {e}", shared.cmd[0]);
            return format!("the agent could not be started ({e})");
        }
    };
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return "the agent's stdio is not available".into();
    };
    let stdout = line_cap(stdout, MAX_AGENT_LINE);
    let transport = acp::ByteStreams::new(stdin.compat_write(), stdout.compat());
    let (s1, s2, s3, s4) = (
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
    );
    let conn_tx = conn_tx.clone();
    let connection = acp::Client
        .v1()
        .name("awp serve-agent")
        .on_receive_notification(
            async move |n: s::SessionNotification, _cx| {
                s1.on_update(n).await;
                Ok(())
            },
            acp::on_receive_notification!(),
        )
        .on_receive_request(
            async move |r: s::RequestPermissionRequest, responder, _cx| {
                s2.on_permission(r, responder);
                Ok(())
            },
            acp::on_receive_request!(),
        )
        .on_receive_request(
            async move |r: s::ReadTextFileRequest, responder, _cx| {
                s3.on_read(r, responder);
                Ok(())
            },
            acp::on_receive_request!(),
        )
        .on_receive_request(
            async move |r: s::WriteTextFileRequest, responder, _cx| {
                s4.on_write(r, responder);
                Ok(())
            },
            acp::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<acp::Agent>| {
            let init: s::InitializeRequest = serde_json::from_value(json!({
                "protocolVersion": 1,
                "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": false},
                "clientInfo": {"name": "awp", "version": env!("CARGO_PKG_VERSION")},
            }))
            .map_err(acp::Error::into_internal_error)?;
            match tokio::time::timeout(REQUEST_TIMEOUT, cx.send_request(init).block_task()).await
            {
                Ok(r) => {
                    r?;
                }
                Err(_) => {
                    return Err(acp::Error::internal_error().data("initialize timed out"));
                }
            }
            conn_tx.send_replace(Some((generation, cx.clone())));
            cx.incoming_closed().await;
            Ok(())
        });
    let exited = |st: std::io::Result<std::process::ExitStatus>| match st {
        Ok(st) => format!("the agent exited ({st})"),
        Err(e) => format!("the agent process is lost: {e}"),
    };
    let ended = tokio::select! {
        r = connection => {
            // Its exit status says more than a closed pipe: wait a little for it.
            match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
                Ok(st) => exited(st),
                Err(_) => match r {
                    Ok(()) => "the agent closed its output".to_string(),
                    Err(e) => {
                        // One line, bounded: the error may hold pretty-printed JSON.
                        let one = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
                        let one: String = one.chars().take(300).collect();
                        format!("the agent's connection failed: {one}")
                    }
                },
            }
        }
        st = child.wait() => exited(st),
    };
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    ended
}

impl Shared {
    fn route(&self, session: &s::SessionId) -> Option<Route> {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&*session.0)
            .cloned()
    }

    /// The live connection, waiting up to [`REQUEST_TIMEOUT`] for a (re)started agent;
    /// an error naming the cause when the agent's next run ends without a connection (it
    /// could not start, or exited at once) or none came in time.
    async fn connection(&self) -> Result<Conn, String> {
        let mut rx = self.conn.clone();
        let mut down = self.down.clone();
        down.borrow_and_update();
        let why = |note: Option<String>| {
            format!(
                "the agent is not running: {}; it is restarted with backoff",
                note.as_deref().unwrap_or("it did not start in time")
            )
        };
        tokio::select! {
            got = tokio::time::timeout(REQUEST_TIMEOUT, rx.wait_for(Option::is_some)) => match got {
                Ok(Ok(c)) => Ok(c.clone().expect("is_some")),
                _ => Err(why(down.borrow().clone())),
            },
            r = down.changed() => match r {
                Ok(()) => Err(why(down.borrow().clone())),
                Err(_) => Err(why(None)),
            },
        }
    }

    /// Queue an update for its thread's task; never drops it: while the thread has
    /// [`MAX_PENDING_UPDATE_BYTES`] waiting, this waits (and so does the agent's pipe).
    async fn on_update(&self, n: s::SessionNotification) {
        let Some(route) = self.route(&n.session_id) else {
            return;
        };
        let Ok(update) = serde_json::to_value(&n.update) else {
            return;
        };
        route.pending.push(update).await;
    }

    fn on_permission(
        &self,
        r: s::RequestPermissionRequest,
        responder: acp::v1::Responder<s::RequestPermissionResponse>,
    ) {
        let route = self.route(&r.session_id);
        let req = serde_json::to_value(&r).unwrap_or(Value::Null);
        tokio::spawn(async move {
            let mut chosen = None;
            if let Some(route) = route {
                let (tx, rx) = oneshot::channel();
                let ev = ThreadEvent::Permission { req, reply: tx };
                if tokio::time::timeout(REQUEST_TIMEOUT, route.tx.send(ev))
                    .await
                    .is_ok_and(|r| r.is_ok())
                {
                    chosen = tokio::time::timeout(PERMISSION_TIMEOUT, rx)
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .flatten();
                }
            }
            let outcome = match chosen {
                Some(id) => {
                    s::RequestPermissionOutcome::Selected(s::SelectedPermissionOutcome::new(id))
                }
                None => s::RequestPermissionOutcome::Cancelled,
            };
            let _ = responder.respond(s::RequestPermissionResponse::new(outcome));
        });
    }

    fn on_read(
        self: &Arc<Self>,
        r: s::ReadTextFileRequest,
        responder: acp::v1::Responder<s::ReadTextFileResponse>,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let result = async {
                me.check_fs_grant(&r.session_id, "fs:read").await?;
                let root = me.root.clone();
                let path = r.path.to_string_lossy().into_owned();
                let v = tokio::task::spawn_blocking(move || {
                    served_fs::fs_read(
                        &root,
                        &json!({"path": path, "length": served_fs::MAX_INLINE}),
                    )
                    .0
                })
                .await
                .map_err(|e| e.to_string())?;
                if let Some(e) = v["error"].as_str() {
                    return Err(e.to_string());
                }
                if v["eof"] != true {
                    return Err(format!(
                        "the file is larger than {} bytes",
                        served_fs::MAX_INLINE
                    ));
                }
                let Some(text) = v["content"].as_str() else {
                    return Err("the file is not UTF-8 text".into());
                };
                Ok(select_lines(text, r.line, r.limit))
            }
            .await;
            let _ = match result {
                Ok(content) => responder.respond(s::ReadTextFileResponse::new(content)),
                Err(e) => responder.respond_with_error(acp::Error::invalid_params().data(e)),
            };
        });
    }

    fn on_write(
        self: &Arc<Self>,
        r: s::WriteTextFileRequest,
        responder: acp::v1::Responder<s::WriteTextFileResponse>,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let result = async {
                me.check_fs_grant(&r.session_id, "fs:write").await?;
                if r.content.len() as u64 > served_fs::MAX_FS_BYTES {
                    return Err(format!("content over {} bytes", served_fs::MAX_FS_BYTES));
                }
                let root = me.root.clone();
                let path = r.path.to_string_lossy().into_owned();
                let content = r.content;
                let v = tokio::task::spawn_blocking(move || {
                    served_fs::fs_write(&root, &json!({"path": path, "content": content}), None)
                })
                .await
                .map_err(|e| e.to_string())?;
                match v["error"].as_str() {
                    Some(e) => Err(e.to_string()),
                    None => Ok(()),
                }
            }
            .await;
            let _ = match result {
                Ok(()) => responder.respond(s::WriteTextFileResponse::new()),
                Err(e) => responder.respond_with_error(acp::Error::invalid_params().data(e)),
            };
        });
    }

    async fn check_fs_grant(&self, session: &s::SessionId, cap: &str) -> Result<(), String> {
        let route = self.route(session).ok_or("no such session")?;
        let caps = peer_caps(&self.socket, &route.peer).await?;
        if caps.iter().any(|c| c == cap) {
            Ok(())
        } else {
            Err(format!("the peer holds no `{cap}` grant here"))
        }
    }
}

/// `line` (1-based) and `limit` (lines) of ACP `fs/read_text_file` applied to `text`.
pub fn select_lines(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_string();
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// The capabilities `peer` (a full key) holds at the node now: the union of the honored
/// caps of the valid grants whose subject it is (`grants` control request).
pub async fn peer_caps(socket: &std::path::Path, peer: &str) -> Result<Vec<String>, String> {
    let mut caps: Vec<String> = Vec::new();
    let mut page = control::Page::first();
    for _ in 0..MAX_GRANT_PAGES {
        let r = control::request_page(socket, &Request::Grants, &page)
            .await
            .map_err(|e| e.to_string())?;
        if !r.ok {
            return Err(r.error.map(|e| e.message).unwrap_or_default());
        }
        for g in r
            .body
            .get("grants")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if g["role"] != "held" && g["sub"] == peer && g["validity"] == "valid" {
                for c in g["honored_caps"].as_array().into_iter().flatten() {
                    if let Some(c) = c.as_str() {
                        if !caps.iter().any(|x| x == c) {
                            caps.push(c.to_string());
                        }
                    }
                }
            }
        }
        match r.body.get("next").and_then(Value::as_str) {
            Some(n) => page = control::Page::after(n),
            None => break,
        }
    }
    Ok(caps)
}

// ---------------------------------------------------------------------------------------
// One thread ↔ one session.

struct ThreadActor {
    shared: Arc<Shared>,
    peer: String,
    th: String,
    tx: mpsc::Sender<ThreadEvent>,
    /// (agent generation, session id).
    session: Option<(u64, String)>,
    /// The generation of the agent running our prompt.
    busy: Option<u64>,
    queue: VecDeque<(String, Vec<Value>)>,
    /// A permission question waiting for the peer: its options and where the answer goes.
    pending: Option<(Vec<Value>, oneshot::Sender<Option<String>>)>,
    coalescer: Coalescer,
    /// Agent updates of our session not yet handled.
    updates: Arc<Pending>,
    /// The msg our progress answers.
    re: Option<String>,
    closing: bool,
}

impl ThreadActor {
    async fn run(mut self, mut rx: mpsc::Receiver<ThreadEvent>) {
        let mut tick = tokio::time::interval(bridge::COALESCE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let updates = self.updates.clone();
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ev) => {
                        // Updates the agent sent before this event go first.
                        self.on_updates().await;
                        self.on_event(ev).await
                    }
                    None => break,
                },
                _ = updates.ready.notified() => self.on_updates().await,
                _ = tick.tick() => {
                    if let Some(t) = self.coalescer.poll(Instant::now()) {
                        self.send_text(t).await;
                    }
                }
            }
            if self.closing && self.busy.is_none() {
                // No event is lost: msgs already queued here go to a new task (later
                // sends see the channel closed and start one themselves).
                rx.close();
                while let Ok(ev) = rx.try_recv() {
                    if matches!(ev, ThreadEvent::PeerMsg { .. }) {
                        let key = (self.peer.clone(), self.th.clone());
                        let _ = self.shared.redo.try_send((key, ev));
                    }
                }
                break;
            }
        }
        if let Some((_, sid)) = self.session.take() {
            self.unroute(&sid);
        }
    }

    /// Handle the agent updates waiting, in order.
    async fn on_updates(&mut self) {
        for u in self.updates.take() {
            match bridge::progress_of(&u) {
                Progress::Text(t) => {
                    if let Some(t) = self.coalescer.push(&t, Instant::now()) {
                        self.send_text(t).await;
                    }
                }
                Progress::Line(l) => {
                    self.flush().await;
                    self.send_text(l).await;
                }
                Progress::Data(mime, data) => {
                    self.flush().await;
                    self.send(vec![json!({"k": "data", "mime": mime, "data": data})])
                        .await;
                }
                Progress::None => {}
            }
        }
    }

    async fn on_event(&mut self, ev: ThreadEvent) {
        match ev {
            ThreadEvent::PeerMsg { id, parts } => self.on_peer_msg(id, parts).await,
            ThreadEvent::PeerState { state } => {
                if state == "closed" || state == "failed" {
                    self.closing = true;
                    // Each queued prompt that will never run gets a word, as a reply to it.
                    for (id, _) in std::mem::take(&mut self.queue) {
                        self.reply(&id, "cancelled before it ran").await;
                    }
                    if let Some((_, reply)) = self.pending.take() {
                        let _ = reply.send(None);
                    }
                    if let (Some(_), Some((generation, sid))) = (self.busy, &self.session) {
                        if let Ok((g, cx)) = self.shared.connection().await {
                            if g == *generation {
                                let _ = cx.send_notification(s::CancelNotification::new(
                                    s::SessionId::new(sid.as_str()),
                                ));
                            }
                        }
                    }
                }
            }
            ThreadEvent::Permission { req, reply } => self.on_permission(req, reply).await,
            ThreadEvent::PromptDone { generation, result } => {
                if self.busy != Some(generation) {
                    return;
                }
                self.busy = None;
                self.pending = None;
                self.flush().await;
                let (state, note) = match result {
                    Ok(reason) => {
                        let (st, note) = bridge::stop_state(&reason);
                        (st, note)
                    }
                    Err(e) => ("failed", e),
                };
                self.state(state, Some(note)).await;
                self.next_prompt().await;
            }
            ThreadEvent::Stop { note, done } => {
                if self.busy.is_some() || !self.queue.is_empty() {
                    self.busy = None;
                    self.queue.clear();
                    if let Some((_, reply)) = self.pending.take() {
                        let _ = reply.send(None);
                    }
                    self.flush().await;
                    self.state("failed", Some(note)).await;
                }
                self.closing = true;
                let _ = done.send(());
            }
            ThreadEvent::AgentDied { generation, note } => {
                if self.session.as_ref().is_some_and(|(g, _)| *g == generation) {
                    self.session = None;
                }
                if self.busy == Some(generation) {
                    self.busy = None;
                    self.pending = None;
                    self.flush().await;
                    self.state("failed", Some(format!("{note}; restarted with backoff")))
                        .await;
                    self.next_prompt().await;
                }
            }
        }
    }

    async fn on_peer_msg(&mut self, id: String, parts: Vec<Value>) {
        if let Some((options, _)) = &self.pending {
            let text: String = parts
                .iter()
                .filter_map(|p| (p["k"] == "text").then(|| p["text"].as_str()).flatten())
                .collect::<Vec<_>>()
                .join(" ");
            match bridge::answer_option(&text, options) {
                Some(choice) => {
                    if let Some((_, reply)) = self.pending.take() {
                        let _ = reply.send(Some(choice));
                    }
                    self.state("working", None).await;
                }
                None => {
                    let ids: Vec<&str> = options
                        .iter()
                        .filter_map(|o| o["optionId"].as_str())
                        .collect();
                    let t = format!(
                        "not understood; reply `allow`, `deny` or one of: {}",
                        ids.join(", ")
                    );
                    self.send_text(t).await;
                }
            }
            return;
        }
        if self.closing {
            self.closing = false;
        }
        if self.busy.is_some() {
            if self.queue.len() >= MAX_QUEUED_PROMPTS {
                self.send_text(format!(
                    "busy: {MAX_QUEUED_PROMPTS} prompts are already waiting in this thread; this one is dropped"
                ))
                .await;
            } else {
                self.queue.push_back((id, parts));
            }
            return;
        }
        self.start_prompt(id, parts).await;
    }

    async fn next_prompt(&mut self) {
        if let Some((id, parts)) = self.queue.pop_front() {
            Box::pin(self.start_prompt(id, parts)).await;
        }
    }

    async fn start_prompt(&mut self, id: String, parts: Vec<Value>) {
        self.re = Some(id);
        let (generation, cx) = match self.shared.connection().await {
            Ok(c) => c,
            Err(e) => return self.state("failed", Some(e)).await,
        };
        let sid = match &self.session {
            Some((g, sid)) if *g == generation => sid.clone(),
            _ => match self.new_session(&cx).await {
                Ok(sid) => {
                    self.shared
                        .routes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(
                            sid.clone(),
                            Route {
                                peer: self.peer.clone(),
                                tx: self.tx.clone(),
                                pending: self.updates.clone(),
                            },
                        );
                    self.session = Some((generation, sid.clone()));
                    sid
                }
                Err(e) => {
                    return self
                        .state("failed", Some(format!("session/new failed: {e}")))
                        .await
                }
            },
        };
        let mut paths = HashMap::new();
        for p in &parts {
            if p["k"] == "blob" {
                if let Some(r) = p["ref"].as_str() {
                    if let Some(path) = self.blob_path(r).await {
                        paths.insert(r.to_string(), path);
                    }
                }
            }
        }
        let blocks = bridge::prompt_blocks(&parts, |r| paths.get(r).cloned());
        let blocks: Vec<s::ContentBlock> = match serde_json::from_value(Value::Array(blocks)) {
            Ok(b) => b,
            Err(e) => return self.state("failed", Some(format!("bad prompt: {e}"))).await,
        };
        self.state("working", None).await;
        self.busy = Some(generation);
        let tx = self.tx.clone();
        let mut conn = self.shared.conn.clone();
        let timeout = self.shared.prompt_timeout;
        let req = s::PromptRequest::new(s::SessionId::new(sid.as_str()), blocks);
        tokio::spawn(async move {
            let result =
                match tokio::time::timeout(timeout, cx.send_request(req).block_task()).await {
                    Ok(Ok(resp)) => Ok(serde_json::to_value(resp.stop_reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_else(|| "unknown".into())),
                    Ok(Err(e)) => {
                        // When the agent died, the supervisor's AgentDied ends the prompt
                        // with the reason; only a live agent's error is reported here.
                        let gone = conn.wait_for(|c| c.as_ref().map(|c| c.0) != Some(generation));
                        if tokio::time::timeout(Duration::from_secs(2), gone)
                            .await
                            .is_ok()
                        {
                            return;
                        }
                        Err(format!("the prompt failed: {e}"))
                    }
                    Err(_) => Err(format!(
                        "the prompt took longer than {} s",
                        timeout.as_secs()
                    )),
                };
            let _ = tx
                .send(ThreadEvent::PromptDone { generation, result })
                .await;
        });
    }

    async fn new_session(&self, cx: &ConnectionTo<acp::Agent>) -> Result<String, String> {
        let req = s::NewSessionRequest::new(self.shared.root.path.clone());
        match tokio::time::timeout(REQUEST_TIMEOUT, cx.send_request(req).block_task()).await {
            Ok(Ok(r)) => Ok(r.session_id.0.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// The received file of blob `r` from our peer, waiting a little for it to complete.
    async fn blob_path(&self, r: &str) -> Option<String> {
        for _ in 0..10 {
            let req = Request::Blobs {
                peer: Some(self.peer.clone()),
                blob_ref: Some(r.to_string()),
            };
            if let Ok(resp) = control::request(&self.shared.socket, &req).await {
                let found = resp
                    .body
                    .get("blobs")
                    .and_then(Value::as_array)
                    .and_then(|b| {
                        b.iter()
                            .find(|b| b["dir"] == "in" && b["ref"] == r)
                            .cloned()
                    });
                if let Some(b) = found {
                    if b["status"] == "complete" {
                        return b["path"].as_str().map(str::to_string);
                    }
                    if b["status"] == "refused" {
                        return None;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        None
    }

    async fn on_permission(&mut self, req: Value, reply: oneshot::Sender<Option<String>>) {
        let options = req["options"].as_array().cloned().unwrap_or_default();
        let tool = &req["toolCall"];
        let caps = peer_caps(&self.shared.socket, &self.peer)
            .await
            .unwrap_or_default();
        if let Some(choice) = bridge::auto_approval(tool, &options, &caps) {
            let _ = reply.send(Some(choice));
            let title = tool["title"].as_str().unwrap_or("a tool call");
            self.flush().await;
            self.send_text(format!(
                "approved (you hold the grant): {}",
                bridge::cut(title, bridge::MAX_TOOL_LINE)
            ))
            .await;
            return;
        }
        if let Some((_, old)) = self.pending.take() {
            let _ = old.send(None);
        }
        self.flush().await;
        let question = bridge::permission_question(tool, &options);
        self.send(vec![
            json!({"k": "text", "text": question}),
            json!({"k": "data", "mime": bridge::PERMISSION_MIME, "data": {"toolCall": tool, "options": &options}}),
        ])
        .await;
        self.pending = Some((options, reply));
        self.state("waiting", Some("permission asked".into())).await;
    }

    fn unroute(&self, sid: &str) {
        self.shared
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(sid);
    }

    async fn flush(&mut self) {
        if let Some(t) = self.coalescer.flush(Instant::now()) {
            self.send_text(t).await;
        }
    }

    /// A text msg in reply to the peer's msg `id`.
    async fn reply(&self, id: &str, text: &str) {
        self.send_re(
            Some(id.to_string()),
            vec![json!({"k": "text", "text": text})],
        )
        .await;
    }

    async fn send_text(&self, text: String) {
        self.send(vec![json!({"k": "text", "text": text})]).await;
    }

    /// A msg in reply to the prompt being answered (`self.re`).
    async fn send(&self, parts: Vec<Value>) {
        self.send_re(self.re.clone(), parts).await;
    }

    /// A msg with `parts` in this thread, in reply to `re`; a refusal or failure is
    /// logged.
    async fn send_re(&self, re: Option<String>, parts: Vec<Value>) {
        let req = Request::Send {
            peer: Some(self.peer.clone()),
            th: Some(self.th.clone()),
            subject: None,
            re,
            parts,
            files: vec![],
            wait_ack_ms: None,
        };
        match control::request(&self.shared.socket, &req).await {
            Ok(r) if r.ok => {}
            Ok(r) => tracing::warn!(th = self.th, "send refused: {:?}", r.error),
            Err(e) => tracing::warn!(th = self.th, "send failed: {e}"),
        }
    }

    async fn state(&self, state: &str, note: Option<String>) {
        let req = Request::State {
            peer: Some(self.peer.clone()),
            th: self.th.clone(),
            state: state.into(),
            note,
            wait_ack_ms: None,
        };
        match control::request(&self.shared.socket, &req).await {
            Ok(r) if r.ok => {}
            Ok(r) => tracing::warn!(th = self.th, "state refused: {:?}", r.error),
            Err(e) => tracing::warn!(th = self.th, "state failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pending_updates_wait_beyond_the_cap_and_keep_order() {
        let p = Arc::new(Pending::default());
        let big = json!("x".repeat(MAX_PENDING_UPDATE_BYTES / 2 - 10));
        p.push(big.clone()).await;
        p.push(big.clone()).await;
        // A third does not fit: it waits until the thread takes the first two.
        let p2 = p.clone();
        let third = tokio::spawn(async move { p2.push(json!([3, "x".repeat(64)])).await });
        tokio::task::yield_now().await;
        assert!(!third.is_finished());
        assert_eq!(p.take().len(), 2);
        tokio::time::timeout(Duration::from_secs(10), third)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(p.take()[0][0], 3);
    }

    #[test]
    fn read_text_file_line_and_limit() {
        let t = "a\nb\nc\n";
        assert_eq!(select_lines(t, None, None), t);
        assert_eq!(select_lines(t, Some(2), None), "b\nc\n");
        assert_eq!(select_lines(t, Some(2), Some(1)), "b\n");
        assert_eq!(select_lines(t, None, Some(1)), "a\n");
        assert_eq!(select_lines(t, Some(9), None), "");
    }
}
