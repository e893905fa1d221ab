//! The local artifactr.v1 endpoint (`--artifactr IP:PORT`, spec/artifact-threads.md
//! §Local endpoint): the HTTP routes and the WebSocket thread protocol of artifactr's HTTP
//! adapter, over this node's artifact threads, so that an artifactr frontend attaches
//! unchanged.
//!
//! - Off by default; loopback only unless `--artifactr-public` ([`crate::config`]).
//! - Every request needs the bearer token of `$AWP_HOME/artifactr.token` (32 random bytes,
//!   base64url, created 0600 at the first start with the endpoint on):
//!   `Authorization: Bearer <token>`, else 401. The WebSocket also takes `?token=<token>`
//!   (browsers cannot set headers on a WebSocket); a wrong or missing token there closes
//!   the socket with 4403 right after the upgrade.
//! - A workspace is an artifact thread (`workspace_id` = the AWP `th`). On the host the
//!   commands run at once as the node's user; on a guest the reads come from the replica
//!   and the commands go to the host over AWP, their `command_result` returned when it
//!   arrives (HTTP: up to `wait_ms`, then 202 `{"type":"queued",…}`).
//! - Stream (artifactr-notes §9): `hello` within 10 s (else 4408), wrong protocol or
//!   `from_head` with `resume_after_seq` ≠ 0 or not a hello → 4400; `welcome`, the replay
//!   of the events after `resume_after_seq` in pages of 500, `replay_complete`, then live
//!   events; more than 1000 frames waiting for a slow client → 4429.

use super::super::Inner;
use crate::artifact::{self, state::RunState, WorkspaceState};
use crate::store::{WsRecord, WsRole};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};

/// The token file in the home.
pub const TOKEN_FILE: &str = "artifactr.token";
/// The protocol a `hello` must name.
pub const PROTOCOL: &str = "artifactr.v1";
/// Time allowed from the upgrade to the `hello` (notes §9).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Events per replay page (notes §9), and the most events a `GET …/events` returns.
pub const PAGE: usize = 500;
/// Frames waiting for a slow client before it is closed with 4429 (notes §9).
pub const SEND_QUEUE: usize = 1000;
/// Largest WebSocket message or HTTP command body accepted, bytes.
pub const MAX_FRAME: usize = 1 << 20;
/// Default wait of `POST …/commands` on a replica for the host's result, ms.
pub const DEFAULT_WAIT_MS: u64 = 30_000;
/// Longest `wait_ms` accepted, ms.
pub const MAX_WAIT_MS: u64 = 600_000;
/// Client frames already waiting that are run together (one store transaction).
pub const MAX_BATCH: usize = 64;
/// Commands sent to the host and not yet answered, per stream connection.
pub const MAX_PENDING: usize = 1000;

/// Close codes (notes §9).
pub mod close {
    /// A bad first frame, wrong protocol, or `from_head` with `resume_after_seq` ≠ 0.
    pub const BAD_HELLO: u16 = 4400;
    /// The token is missing or wrong.
    pub const FORBIDDEN: u16 = 4403;
    /// No `hello` within [`super::HELLO_TIMEOUT`].
    pub const HELLO_TIMEOUT: u16 = 4408;
    /// More than [`super::SEND_QUEUE`] frames waiting.
    pub const SLOW: u16 = 4429;
    /// The workspace does not exist.
    pub const NOT_FOUND: u16 = 4404;
    /// The node is stopping.
    pub const GOING_AWAY: u16 = 1001;
}

#[derive(Clone)]
struct App {
    inner: Arc<Inner>,
    token: Arc<str>,
}

/// Read `$home/artifactr.token`, or create it (0600) with 32 random bytes, base64url.
pub fn load_or_create_token(home: &std::path::Path) -> std::io::Result<String> {
    use base64::Engine;
    let path = home.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            let t = t.trim().to_string();
            if t.len() < 16 {
                return Err(std::io::Error::other(format!(
                    "{} holds no token (16 characters at least); delete it to get a new one",
                    path.display()
                )));
            }
            return Ok(t);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut raw = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut raw);
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&path)?;
    f.write_all(format!("{token}\n").as_bytes())?;
    f.sync_all()?;
    Ok(token)
}

/// Bind `addr`, serve until the node stops; the bound address (port 0 picks one).
pub(crate) async fn start(inner: Arc<Inner>, addr: SocketAddr) -> Result<SocketAddr, String> {
    let token = load_or_create_token(&inner.home).map_err(|e| format!("token: {e}"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| e.to_string())?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let _ = inner.artifactr.set(bound);
    let app = App {
        inner: inner.clone(),
        token: token.into(),
    };
    let router = router(app);
    let stop = inner.shutdown.clone();
    inner.tasks.spawn(async move {
        let r = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::warn!("artifactr endpoint stopped: {e}");
        }
    });
    tracing::info!(%bound, "artifactr endpoint listening");
    Ok(bound)
}

fn router(app: App) -> Router {
    let reads = Router::new()
        .route("/workspaces", get(list_workspaces))
        .route("/workspaces/{id}/commands", post(post_command))
        .route("/workspaces/{id}/artifacts", get(list_artifacts))
        .route("/workspaces/{id}/artifacts/{aid}", get(get_artifact))
        .route("/workspaces/{id}/artifacts/{aid}/revisions", get(revisions))
        .route("/workspaces/{id}/events", get(events))
        .route("/workspaces/{id}/threads", get(list_threads))
        .route("/workspaces/{id}/threads/{tid}", get(get_thread))
        .route("/workspaces/{id}/proposals", get(proposals))
        .route("/workspaces/{id}/runs/{rid}", get(get_run))
        .layer(middleware::from_fn_with_state(app.clone(), require_token));
    Router::new()
        .route("/workspaces/{id}/stream", get(stream))
        .merge(reads)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FRAME))
        .with_state(app)
}

/// Equal in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How a request presented the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    Ok,
    /// No `Authorization: Bearer …` header (and, on the stream, no `?token=`).
    Missing,
    /// A token that is not this node's.
    Wrong,
}

impl Auth {
    /// The message of a refusal (401 body, 4403 close reason).
    fn refusal(self) -> &'static str {
        match self {
            Auth::Wrong => "wrong bearer token (see $AWP_HOME/artifactr.token)",
            _ => "a bearer token is required (see $AWP_HOME/artifactr.token)",
        }
    }
}

/// Check the bearer header, and on the stream also `?token=` (`query`): Ok when either
/// matches, Wrong when one was given and none matches, Missing when none was given.
fn check_token(headers: &HeaderMap, query: Option<&str>, token: &str) -> Auth {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let given = [bearer, query];
    if given
        .iter()
        .flatten()
        .any(|t| same(t.as_bytes(), token.as_bytes()))
    {
        Auth::Ok
    } else if given.iter().any(Option::is_some) {
        Auth::Wrong
    } else {
        Auth::Missing
    }
}

async fn require_token(State(app): State<App>, req: Request, next: Next) -> Response {
    let auth = check_token(req.headers(), None, &app.token);
    if auth == Auth::Ok {
        next.run(req).await
    } else {
        let mut r = err(StatusCode::UNAUTHORIZED, auth.refusal());
        r.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        r
    }
}

/// An `ErrorFrame`-shaped body.
fn err(code: StatusCode, message: impl Into<String>) -> Response {
    (
        code,
        Json(json!({"type": "error", "message": message.into()})),
    )
        .into_response()
}

/// An error answer: its status and the `ErrorFrame` message.
struct Fail(StatusCode, String);

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        err(self.0, self.1)
    }
}

fn not_found(entity: &str, id: &str) -> Fail {
    Fail(
        StatusCode::NOT_FOUND,
        format!("{entity} {id} does not exist"),
    )
}

fn internal(e: impl std::fmt::Display) -> Fail {
    tracing::warn!("artifactr endpoint: {e}");
    Fail(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the node failed to read its store".into(),
    )
}

fn unprocessable(msg: impl Into<String>) -> Fail {
    Fail(StatusCode::UNPROCESSABLE_ENTITY, msg.into())
}

fn record(inner: &Inner, id: &str) -> Result<WsRecord, Fail> {
    inner
        .store
        .art_workspace(id)
        .map_err(internal)?
        .ok_or_else(|| not_found("workspace", id))
}

/// The current state of `id` (host or replica).
async fn state(inner: &Arc<Inner>, id: &str) -> Result<(WsRecord, WorkspaceState), Fail> {
    let rec = record(inner, id)?;
    let st = super::control::state(inner, &rec)
        .await
        .map_err(|f| internal(format!("{f:?}")))?;
    Ok((rec, st))
}

fn role(r: WsRole) -> &'static str {
    match r {
        WsRole::Host => "host",
        WsRole::Replica => "replica",
    }
}

async fn list_workspaces(State(app): State<App>) -> Response {
    let recs = match app.inner.store.art_workspaces() {
        Ok(r) => r,
        Err(e) => return internal(e).into_response(),
    };
    let list: Vec<Value> = recs
        .iter()
        .map(|r| {
            json!({
                "workspace_id": r.th,
                "head_seq": r.head_seq,
                "role": role(r.role),
                "peer": r.peer.to_string(),
            })
        })
        .collect();
    Json(json!({ "workspaces": list })).into_response()
}

fn artifact_row(a: &artifact::state::Artifact, with_data: bool) -> Value {
    let head = a.versions.last();
    let mut v = json!({
        "artifact_id": a.artifact_id,
        "kind": a.kind,
        "version": a.head(),
        "archived": a.archived,
        "seq": head.map(|h| h.seq),
        "actor": head.map(|h| &h.actor),
        "summary": head.map(|h| &h.summary),
        "proposal_id": head.and_then(|h| h.proposal_id.as_ref()),
    });
    if with_data {
        v["data"] = Value::Object(a.data().clone());
    }
    v
}

async fn list_artifacts(State(app): State<App>, Path(id): Path<String>) -> Response {
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let list: Vec<Value> = st
        .artifacts
        .values()
        .map(|a| artifact_row(a, false))
        .collect();
    Json(json!({"workspace_id": id, "head_seq": st.head_seq, "artifacts": list})).into_response()
}

async fn get_artifact(State(app): State<App>, Path((id, aid)): Path<(String, String)>) -> Response {
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match st.artifacts.get(&aid) {
        Some(a) => Json(artifact_row(a, true)).into_response(),
        None => not_found("artifact", &aid).into_response(),
    }
}

async fn revisions(State(app): State<App>, Path((id, aid)): Path<(String, String)>) -> Response {
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let Some(a) = st.artifacts.get(&aid) else {
        return not_found("artifact", &aid).into_response();
    };
    let revs: Vec<Value> = a
        .history()
        .map(|(v, data)| {
            json!({
                "version": v.version,
                "seq": v.seq,
                "actor": v.actor,
                "summary": v.summary,
                "proposal_id": v.proposal_id,
                "data": data,
            })
        })
        .collect();
    Json(json!({"artifact_id": aid, "kind": a.kind, "revisions": revs})).into_response()
}

async fn list_threads(State(app): State<App>, Path(id): Path<String>) -> Response {
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let list: Vec<Value> = st
        .threads
        .values()
        .map(|t| {
            json!({
                "thread_id": t.thread_id,
                "title": t.title,
                "mode": t.mode,
                "focus": t.focus,
                "message_count": t.messages.len(),
            })
        })
        .collect();
    Json(json!({"workspace_id": id, "threads": list})).into_response()
}

async fn get_thread(State(app): State<App>, Path((id, tid)): Path<(String, String)>) -> Response {
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match st.threads.get(&tid) {
        Some(t) => Json(json!(t)).into_response(),
        None => not_found("thread", &tid).into_response(),
    }
}

async fn proposals(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let want = match q.get("status").map(String::as_str) {
        None | Some("") => None,
        Some(s @ ("pending" | "accepted" | "rejected")) => Some(s.to_string()),
        Some(other) => {
            return err(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("status {other:?} is not pending, accepted or rejected"),
            )
        }
    };
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let list: Vec<Value> = st
        .proposals
        .values()
        .filter(|p| want.as_deref().is_none_or(|w| p.status.as_str() == w))
        .map(|p| json!(p))
        .collect();
    Json(json!({"workspace_id": id, "proposals": list})).into_response()
}

async fn get_run(State(app): State<App>, Path((id, rid)): Path<(String, String)>) -> Response {
    let (_, st) = match state(&app.inner, &id).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match st.runs.get(&rid) {
        Some(r) => Json(json!(r)).into_response(),
        None => not_found("run", &rid).into_response(),
    }
}

fn q_u64(q: &HashMap<String, String>, k: &str) -> Result<Option<u64>, Fail> {
    match q.get(k).map(|v| v.trim()) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<u64>()
            .map(Some)
            .map_err(|_| unprocessable(format!("{k} must be an integer ≥ 0, not {v:?}"))),
    }
}

/// `GET …/events?after_seq=&before_seq=&thread_id=&limit=&last=`: events with
/// `after_seq < seq < before_seq` (and envelope `thread_id` = `thread_id` when given), the
/// first `limit` (default and most 500), or with `last=N` the last N (most 500), in seq
/// order.
async fn events(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let parsed = (|| {
        let after = q_u64(&q, "after_seq")?.unwrap_or(0);
        let before = q_u64(&q, "before_seq")?;
        let limit = q_u64(&q, "limit")?;
        let last = q_u64(&q, "last")?;
        for (k, v) in [("limit", limit), ("last", last)] {
            if let Some(n) = v {
                if n == 0 || n > PAGE as u64 {
                    return Err(unprocessable(format!("{k} must be 1 to {PAGE}")));
                }
            }
        }
        if limit.is_some() && last.is_some() {
            return Err(unprocessable("give limit or last, not both"));
        }
        Ok((after, before, limit, last))
    })();
    let (after, before, limit, last) = match parsed {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let thread = q.get("thread_id").filter(|t| !t.is_empty()).cloned();
    let rec = match record(&app.inner, &id) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let store = app.inner.store.clone();
    let th = id.clone();
    let head = rec.head_seq;
    let end = before.map_or(head, |b| b.saturating_sub(1).min(head));
    let res = tokio::task::spawn_blocking(move || -> Result<(Vec<Value>, bool), String> {
        let keep = last.or(limit).unwrap_or(PAGE as u64) as usize;
        let mut out: VecDeque<Value> = VecDeque::new();
        let mut cursor = after;
        let mut more = false;
        while cursor < end {
            let page = store
                .art_events(&th, cursor, PAGE)
                .map_err(|e| e.to_string())?;
            if page.is_empty() {
                break;
            }
            for e in page {
                let seq = e.get("seq").and_then(Value::as_u64).unwrap_or(0);
                if seq > end {
                    return Ok((out.into(), more));
                }
                cursor = seq;
                let fits = thread
                    .as_deref()
                    .is_none_or(|t| e.get("thread_id").and_then(Value::as_str) == Some(t));
                if !fits {
                    continue;
                }
                if out.len() == keep {
                    more = true;
                    if last.is_none() {
                        return Ok((out.into(), more));
                    }
                    out.pop_front();
                }
                out.push_back(e);
            }
        }
        Ok((out.into(), more))
    })
    .await;
    match res {
        Ok(Ok((evs, more))) => Json(json!({
            "workspace_id": id,
            "head_seq": head,
            "events": evs,
            "has_more": more,
        }))
        .into_response(),
        Ok(Err(e)) => internal(e).into_response(),
        Err(e) => internal(e).into_response(),
    }
}

/// HTTP status of a command result (artifactr-notes §6).
pub fn status_of(result: &Value) -> StatusCode {
    if result.get("ok") == Some(&Value::Bool(true)) {
        return StatusCode::OK;
    }
    match result.pointer("/rejection/type").and_then(Value::as_str) {
        Some("version_conflict" | "invalid_state") => StatusCode::CONFLICT,
        Some("not_found") => StatusCode::NOT_FOUND,
        Some("patch_failed" | "validation_failed") => StatusCode::UNPROCESSABLE_ENTITY,
        Some("forbidden") => StatusCode::FORBIDDEN,
        Some("unsupported_protocol") => StatusCode::BAD_REQUEST,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// Run `frame` (already parsed once) on the host now, as the node's user.
async fn run_on_host(inner: &Arc<Inner>, th: &str, frame: Value) -> Result<Value, String> {
    let (mut results, _) = super::run_local(inner, th, vec![frame], None, None)
        .await
        .map_err(|e| e.to_string())?;
    results.pop().ok_or_else(|| "no result".to_string())
}

/// Queue `frame` for the host of `rec` (a replica).
async fn send_to_host(inner: &Arc<Inner>, rec: &WsRecord, frame: Value) -> Result<(), String> {
    super::control::send_commands(inner, rec, vec![frame])
        .await
        .map_err(|e| format!("{e:?}"))
}

/// The `result` of a node event `artifact_result` for `th` whose command id is in `ids`.
fn result_for<'a>(
    ev: &'a serde_json::Map<String, Value>,
    th: &str,
) -> Option<(&'a str, &'a Value)> {
    if ev.get("event").and_then(Value::as_str) != Some("artifact_result")
        || ev.get("th").and_then(Value::as_str) != Some(th)
    {
        return None;
    }
    let cid = ev.get("command_id").and_then(Value::as_str)?;
    Some((cid, ev.get("result")?))
}

async fn post_command(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    let frame: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return err(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("not a command frame: {e}"),
            )
        }
    };
    if let Err(e) = artifact::parse_command_frame(&frame) {
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(json!(e))).into_response();
    }
    let wait_ms = match q_u64(&q, "wait_ms") {
        Ok(w) => w.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS),
        Err(r) => return r.into_response(),
    };
    let rec = match record(&app.inner, &id) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let inner = &app.inner;
    if rec.role == WsRole::Host {
        return match run_on_host(inner, &id, frame).await {
            Ok(result) => (status_of(&result), Json(result)).into_response(),
            Err(e) => internal(e).into_response(),
        };
    }
    let cid = frame
        .get("command_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut rx = inner.events.subscribe();
    if let Err(e) = send_to_host(inner, &rec, frame).await {
        return internal(e).into_response();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(ev)) => {
                if let Some((c, result)) = result_for(&ev, &id) {
                    if c == cid {
                        return (status_of(result), Json(result.clone())).into_response();
                    }
                }
            }
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
            Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => {
                return (
                    StatusCode::ACCEPTED,
                    Json(json!({"type": "queued", "workspace_id": id, "command_id": cid})),
                )
                    .into_response()
            }
        }
    }
}

// ------------------------------------------------------------------ stream

async fn stream(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let auth = check_token(&headers, q.get("token").map(String::as_str), &app.token);
    ws.max_message_size(MAX_FRAME)
        .max_frame_size(MAX_FRAME)
        .on_upgrade(move |socket| async move {
            if auth != Auth::Ok {
                refuse(socket, close::FORBIDDEN, auth.refusal()).await;
                return;
            }
            Conn::run(app, id, socket).await;
        })
}

async fn refuse(mut socket: WebSocket, code: u16, reason: &str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

/// What the writer task sends.
enum Out {
    Frame(String),
}

/// The §8 thread filter: artifact_*/proposal_* events and events without a thread reach
/// every subscriber; others only when their thread is followed (`None`: all).
fn reaches(env: &Value, threads: Option<&HashSet<String>>) -> bool {
    let Some(set) = threads else { return true };
    let ty = env
        .pointer("/event/type")
        .and_then(Value::as_str)
        .unwrap_or("");
    if ty.starts_with("artifact_") || ty.starts_with("proposal_") {
        return true;
    }
    match env.get("thread_id").and_then(Value::as_str) {
        None => true,
        Some(t) => set.contains(t),
    }
}

/// A parsed `hello`.
struct Hello {
    resume_after_seq: u64,
    from_head: bool,
    threads: Option<HashSet<String>>,
}

/// Parse the first frame (notes §9); `Err(reason)` closes with 4400.
fn parse_hello(text: &str) -> Result<Hello, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let o = v.as_object().ok_or("not a hello")?;
    match o.get("type") {
        None => {}
        Some(Value::String(t)) if t == "hello" => {}
        _ => return Err("not a hello".into()),
    }
    match o.get("protocol") {
        Some(Value::String(p)) if p == PROTOCOL => {}
        Some(Value::String(p)) => return Err(format!("unsupported protocol {p:?}")),
        _ => return Err("hello needs a protocol".into()),
    }
    let resume_after_seq = match o.get("resume_after_seq") {
        None | Some(Value::Null) => 0,
        Some(x) => x
            .as_u64()
            .ok_or("resume_after_seq must be an integer ≥ 0")?,
    };
    let from_head = match o.get("from_head") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err("from_head must be a boolean".into()),
    };
    if from_head && resume_after_seq != 0 {
        return Err("from_head needs resume_after_seq 0".into());
    }
    let threads = match o.get("threads") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<HashSet<_>>>()
                .ok_or("threads must be strings")?,
        ),
        _ => return Err("threads must be a list or null".into()),
    };
    Ok(Hello {
        resume_after_seq,
        from_head,
        threads,
    })
}

/// One stream connection after the upgrade.
struct Conn {
    app: App,
    id: String,
    tx: mpsc::Sender<Out>,
    /// Set once to close with that code (the writer sends the close frame).
    close: Option<oneshot::Sender<(u16, String)>>,
    threads: Option<HashSet<String>>,
    /// Last seq sent (or skipped by the filter).
    last: u64,
    /// Commands sent to the host (replica), waiting for their results.
    pending: HashSet<String>,
}

impl Conn {
    async fn run(app: App, id: String, socket: WebSocket) {
        use futures_util::{SinkExt, StreamExt};
        let (mut sink, mut stream) = socket.split();
        let (tx, mut rx) = mpsc::channel::<Out>(SEND_QUEUE);
        let (close_tx, mut close_rx) = oneshot::channel::<(u16, String)>();
        let writer = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    c = &mut close_rx => {
                        if let Ok((code, reason)) = c {
                            let _ = sink
                                .send(Message::Close(Some(CloseFrame { code, reason: reason.into() })))
                                .await;
                        }
                        break;
                    }
                    m = rx.recv() => match m {
                        Some(Out::Frame(s)) => {
                            if sink.send(Message::Text(s.into())).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
            let _ = sink.close().await;
        });
        let mut c = Conn {
            app,
            id,
            tx,
            close: Some(close_tx),
            threads: None,
            last: 0,
            pending: HashSet::new(),
        };
        c.session(&mut stream).await;
        drop(c);
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    }

    fn close(&mut self, code: u16, reason: &str) {
        if let Some(c) = self.close.take() {
            let _ = c.send((code, reason.to_string()));
        }
    }

    /// Send now, waiting for room (replay, results).
    async fn send(&mut self, v: &Value) -> bool {
        self.tx.send(Out::Frame(v.to_string())).await.is_ok()
    }

    /// Send a live frame; a full queue closes with 4429.
    fn send_live(&mut self, v: &Value) -> bool {
        match self.tx.try_send(Out::Frame(v.to_string())) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.close(close::SLOW, "the client reads too slowly");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    async fn session(&mut self, stream: &mut futures_util::stream::SplitStream<WebSocket>) {
        use futures_util::StreamExt;
        // hello
        let first = match tokio::time::timeout(HELLO_TIMEOUT, stream.next()).await {
            Err(_) => return self.close(close::HELLO_TIMEOUT, "no hello in time"),
            Ok(None) | Ok(Some(Err(_))) => return,
            Ok(Some(Ok(m))) => m,
        };
        let text = match first {
            Message::Text(t) => t.to_string(),
            Message::Close(_) => return,
            _ => return self.close(close::BAD_HELLO, "not a hello"),
        };
        let hello = match parse_hello(&text) {
            Ok(h) => h,
            Err(e) => return self.close(close::BAD_HELLO, &e),
        };
        let inner = self.app.inner.clone();
        // Subscribe before reading the head, so that no event falls between.
        let mut rx = inner.events.subscribe();
        let (rec, st) = match state(&inner, &self.id).await {
            Ok(s) => s,
            Err(_) => return self.close(close::NOT_FOUND, "no such workspace"),
        };
        let head = st.head_seq;
        let reset = !hello.from_head && hello.resume_after_seq > head;
        let active: Vec<Value> = st
            .runs
            .values()
            .filter(|r| r.state == RunState::Running)
            .map(|r| json!({"run_id": r.run_id, "thread_id": r.thread_id}))
            .collect();
        self.threads = hello.threads;
        let welcome = json!({
            "type": "welcome",
            "protocol": PROTOCOL,
            "workspace_id": self.id,
            "head_seq": head,
            "reset": reset,
            "active_runs": active,
        });
        if !self.send(&welcome).await {
            return;
        }
        let after = if hello.from_head {
            head
        } else if reset {
            0
        } else {
            hello.resume_after_seq
        };
        if !self.replay(after, head).await {
            return;
        }
        if !self
            .send(&json!({"type": "replay_complete", "up_to_seq": head}))
            .await
        {
            return;
        }
        self.last = head;
        // live
        let stop = inner.shutdown.clone();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return self.close(close::GOING_AWAY, "the node is stopping"),
                m = stream.next() => {
                    let Some(Ok(m)) = m else { return };
                    // This frame and those already waiting run together (on the host: one
                    // store transaction and one flush).
                    let mut batch = Vec::new();
                    let mut closed = false;
                    let mut m = Some(m);
                    while let Some(msg) = m.take() {
                        match msg {
                            Message::Text(t) => batch.push(Some(t.to_string())),
                            Message::Binary(_) => batch.push(None),
                            Message::Close(_) => {
                                closed = true;
                                break;
                            }
                            _ => {}
                        }
                        if batch.len() >= MAX_BATCH {
                            break;
                        }
                        match futures_util::FutureExt::now_or_never(stream.next()) {
                            Some(Some(Ok(n))) => m = Some(n),
                            Some(_) => closed = true,
                            None => {}
                        }
                    }
                    if !self.commands(&rec, batch).await || closed {
                        return;
                    }
                }
                ev = rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.get("event").and_then(Value::as_str) == Some("artifact")
                            && ev.get("th").and_then(Value::as_str) == Some(self.id.as_str())
                            && ev.get("seq").and_then(Value::as_u64).is_some_and(|s| s > self.last)
                        {
                            if !self.catch_up() { return; }
                        } else if let Some((cid, result)) = result_for(&ev, &self.id) {
                            if self.pending.remove(cid) {
                                let r = result.clone();
                                if !self.send_live(&r) { return; }
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if !self.catch_up() { return; }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }

    /// Events `after < seq ≤ head` in pages of [`PAGE`].
    async fn replay(&mut self, mut after: u64, head: u64) -> bool {
        while after < head {
            let page = match self.app.inner.store.art_events(&self.id, after, PAGE) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("artifactr replay: {e}");
                    return false;
                }
            };
            if page.is_empty() {
                break;
            }
            for e in page {
                let seq = e.get("seq").and_then(Value::as_u64).unwrap_or(0);
                if seq > head {
                    return true;
                }
                after = seq;
                if reaches(&e, self.threads.as_ref()) && !self.send(&e).await {
                    return false;
                }
            }
        }
        true
    }

    /// Send the stored events after `last` (live), so that a lagged or out-of-order
    /// notification never loses or repeats one.
    fn catch_up(&mut self) -> bool {
        loop {
            let page = match self.app.inner.store.art_events(&self.id, self.last, PAGE) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("artifactr live: {e}");
                    return false;
                }
            };
            if page.is_empty() {
                return true;
            }
            for e in page {
                self.last = e.get("seq").and_then(Value::as_u64).unwrap_or(self.last);
                if reaches(&e, self.threads.as_ref()) && !self.send_live(&e) {
                    return false;
                }
            }
        }
    }

    /// A client frame after the handshake: a command frame, or an error frame to send.
    fn parse(text: Option<&str>) -> Result<Value, Value> {
        let Some(text) = text else {
            return Err(json!({"type":"error","message":"not a command frame: binary message"}));
        };
        let v: Value = serde_json::from_str(text)
            .map_err(|e| json!({"type":"error","message": format!("not a command frame: {e}")}))?;
        if v.get("type").and_then(Value::as_str) == Some("hello") {
            return Err(
                json!({"type":"error","message":"not a command frame: hello was already received"}),
            );
        }
        artifact::parse_command_frame(&v).map_err(|e| json!(e))?;
        Ok(v)
    }

    /// Client frames after the handshake, in order: commands (→ `command_result`, on the
    /// host after the commands' events) or error frames.
    async fn commands(&mut self, rec: &WsRecord, batch: Vec<Option<String>>) -> bool {
        enum Item {
            Out(Value),
            Result(usize),
        }
        let mut items = Vec::with_capacity(batch.len());
        let mut frames = Vec::new();
        for text in &batch {
            match Self::parse(text.as_deref()) {
                Err(e) => items.push(Item::Out(e)),
                Ok(v) => {
                    let cid = v
                        .get("command_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    if rec.role == WsRole::Replica
                        && self.pending.len() + frames.len() >= MAX_PENDING
                    {
                        items.push(Item::Out(json!({"type":"error","message": format!("command {cid}: {MAX_PENDING} commands already wait for the host")})));
                        continue;
                    }
                    items.push(Item::Result(frames.len()));
                    frames.push((cid, v));
                }
            }
        }
        let inner = self.app.inner.clone();
        let failed = |cid: &str| json!({"type":"error","message": format!("command {cid} failed on the server")});
        let mut results: Vec<Option<Value>> = vec![None; frames.len()];
        if !frames.is_empty() {
            let cids: Vec<String> = frames.iter().map(|(c, _)| c.clone()).collect();
            let values: Vec<Value> = frames.into_iter().map(|(_, v)| v).collect();
            if rec.role == WsRole::Host {
                match super::run_local(&inner, &self.id, values, None, None).await {
                    Ok((rs, _)) => {
                        for (slot, r) in results.iter_mut().zip(rs) {
                            *slot = Some(r);
                        }
                        // The commands' events (durable now) before their results.
                        if !self.catch_up() {
                            return false;
                        }
                    }
                    Err(e) => {
                        tracing::warn!("artifactr command: {e}");
                        for (slot, c) in results.iter_mut().zip(&cids) {
                            *slot = Some(failed(c));
                        }
                    }
                }
            } else {
                match super::control::send_commands(&inner, rec, values).await {
                    // The results are sent when the host's answers arrive.
                    Ok(()) => self.pending.extend(cids),
                    Err(e) => {
                        tracing::warn!("artifactr command: {e:?}");
                        for (slot, c) in results.iter_mut().zip(&cids) {
                            *slot = Some(failed(c));
                        }
                    }
                }
            }
        }
        for item in items {
            let v = match item {
                Item::Out(v) => Some(v),
                Item::Result(i) => results[i].take(),
            };
            if let Some(v) = v {
                if !self.send(&v).await {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_rules() {
        let ok = parse_hello(
            r#"{"type":"hello","protocol":"artifactr.v1","resume_after_seq":3,"threads":["a"]}"#,
        )
        .unwrap();
        assert_eq!(ok.resume_after_seq, 3);
        assert!(ok.threads.unwrap().contains("a"));
        // The type tag may be omitted (notes §0).
        assert!(parse_hello(r#"{"protocol":"artifactr.v1"}"#).is_ok());
        for bad in [
            r#"{"type":"hello","protocol":"artifactr.v2"}"#,
            r#"{"type":"hello"}"#,
            r#"{"type":"command","protocol":"artifactr.v1"}"#,
            r#"{"type":"hello","protocol":"artifactr.v1","resume_after_seq":-1}"#,
            r#"{"type":"hello","protocol":"artifactr.v1","resume_after_seq":"1"}"#,
            r#"{"type":"hello","protocol":"artifactr.v1","from_head":true,"resume_after_seq":2}"#,
            r#"{"type":"hello","protocol":"artifactr.v1","threads":[1]}"#,
            r#"{"type":"hello","protocol":"artifactr.v1","threads":"a"}"#,
            r#"[]"#,
            r#"hello"#,
        ] {
            assert!(parse_hello(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_wrong_token_is_told_apart_from_a_missing_one() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(
                axum::http::header::AUTHORIZATION,
                axum::http::HeaderValue::from_str(v).unwrap(),
            );
            m
        };
        let tok = "s3cret-token-of-this-node";
        let none = HeaderMap::new();
        assert_eq!(check_token(&none, None, tok), Auth::Missing);
        assert_eq!(check_token(&h("Basic abc"), None, tok), Auth::Missing);
        assert_eq!(check_token(&h("Bearer nope"), None, tok), Auth::Wrong);
        assert_eq!(check_token(&none, Some("nope"), tok), Auth::Wrong);
        assert_eq!(
            check_token(&h(&format!("Bearer {tok}")), None, tok),
            Auth::Ok
        );
        assert_eq!(
            check_token(&h(&format!("Bearer {tok} ")), None, tok),
            Auth::Ok
        );
        assert_eq!(check_token(&h("Bearer nope"), Some(tok), tok), Auth::Ok);
        assert_eq!(check_token(&none, Some(tok), tok), Auth::Ok);
        assert!(Auth::Wrong.refusal().starts_with("wrong bearer token"));
        assert!(Auth::Missing
            .refusal()
            .starts_with("a bearer token is required"));
    }

    #[test]
    fn status_table() {
        let rej = |t: &str| json!({"ok": false, "rejection": {"type": t}});
        assert_eq!(status_of(&json!({"ok": true})), StatusCode::OK);
        assert_eq!(status_of(&rej("version_conflict")), StatusCode::CONFLICT);
        assert_eq!(status_of(&rej("invalid_state")), StatusCode::CONFLICT);
        assert_eq!(status_of(&rej("not_found")), StatusCode::NOT_FOUND);
        assert_eq!(
            status_of(&rej("patch_failed")),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            status_of(&rej("validation_failed")),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(status_of(&rej("forbidden")), StatusCode::FORBIDDEN);
        assert_eq!(
            status_of(&rej("unsupported_protocol")),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn thread_filter() {
        let set: HashSet<String> = ["t1".to_string()].into();
        let ev = |ty: &str, th: Value| json!({"thread_id": th, "event": {"type": ty}});
        assert!(reaches(&ev("message_posted", json!("t1")), Some(&set)));
        assert!(!reaches(&ev("message_posted", json!("t2")), Some(&set)));
        assert!(reaches(&ev("message_posted", Value::Null), Some(&set)));
        assert!(reaches(&ev("artifact_changed", json!("t2")), Some(&set)));
        assert!(reaches(&ev("proposal_created", json!("t2")), Some(&set)));
        assert!(reaches(&ev("message_posted", json!("t2")), None));
    }

    #[test]
    fn token_file_is_private_and_stable() {
        let home = tempfile::TempDir::new().unwrap();
        let a = load_or_create_token(home.path()).unwrap();
        assert_eq!(a.len(), 43);
        assert_eq!(load_or_create_token(home.path()).unwrap(), a);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let m = std::fs::metadata(home.path().join(TOKEN_FILE)).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, 0o600);
        }
        std::fs::write(home.path().join(TOKEN_FILE), "\n").unwrap();
        assert!(load_or_create_token(home.path()).is_err());
    }
}
