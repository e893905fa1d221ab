//! The Roll runtime core: Roll requests in, node requests and Roll responses and
//! `runtime.event` notifications out; AWP log lines in, Roll events out. No I/O of its
//! own besides the [`NodeApi`] it is given and the state file.
//!
//! The mapping (spec/roll-front.md): a Roll thread is one AWP thread with the peer;
//! `turn.start` sends an AWP `msg`; the peer's `state working` is `turn.started`, its
//! `msg`s are `message.*` (text) and `tool.*` / `reasoning.summary.delta` (data parts
//! [`TOOL_MIME`], [`REASONING_MIME`]), `state waiting` with a note is `approval.required`,
//! `done` / `failed` / `closed` end the turn.

use super::node::NodeApi;
use super::rpc::{self, RollCode, RollError};
use super::store::{ApprovalRec, Saved, StateFile, ThreadRec, TurnRec, MAX_PENDING, MAX_THREADS};
use crate::control::{ClientError, Event, Request, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet, VecDeque};

/// Mime of a data part that reports a tool call (`{"phase":"started"|"output"|
/// "completed","toolCallId","toolName","agentName"?,"input"?,"stream"?,"delta"?,
/// "outcome"?,"display"?}`).
pub const TOOL_MIME: &str = "application/vnd.awp.tool+json";
/// Mime of a data part carrying a reasoning summary piece (`{"delta": TEXT}`).
pub const REASONING_MIME: &str = "application/vnd.awp.reasoning+json";
/// Mime of the data part of our answer to an approval (`{"approvalId","decision",
/// "reason"?}`).
pub const APPROVAL_MIME: &str = "application/vnd.awp.approval+json";
/// Requests remembered for `requestId` idempotency (`limits.idempotencyCacheEntries`).
pub const IDEMPOTENCY_ENTRIES: usize = 1024;
/// Largest `message.delta`, in characters: a longer text is streamed in pieces.
pub const DELTA_CHARS: usize = 16 * 1024;
/// Longest tool or agent name taken from a peer's data part, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest approval preview taken from a peer's note, in characters.
pub const MAX_PREVIEW_CHARS: usize = 64 * 1024;

/// A UUID (version 8, RFC variant) derived from `parts`: the same AWP line always gives
/// the same stream, approval or operation id, across restarts.
pub fn derived_uuid(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_custom_bytes(b)
        .into_uuid()
        .hyphenated()
        .to_string()
}

fn now() -> String {
    crate::wire::time::format_ms(crate::wire::time::now_ms())
}

fn cut_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => s[..i].to_string(),
    }
}

/// A tool data part as a peer may send it (unknown fields ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolPart {
    phase: String,
    tool_call_id: String,
    tool_name: String,
    #[serde(default)]
    agent_name: Option<String>,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    delta: Option<String>,
    #[serde(default)]
    outcome: Option<Outcome>,
    #[serde(default)]
    display: Value,
}

#[derive(Debug, Deserialize)]
struct Outcome {
    kind: String,
    #[serde(default)]
    reason: Option<String>,
}

const OUTCOME_KINDS: &[&str] = &[
    "success",
    "user_rejected",
    "policy_denied",
    "invalid_input",
    "cancelled",
    "tool_failed",
];

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME_BYTES
}

/// A peer data part read as a tool report, or None when it is not a valid one.
fn tool_part(part: &Value, default_agent: &str) -> Option<(String, Map<String, Value>)> {
    if part.get("mime").and_then(Value::as_str) != Some(TOOL_MIME) {
        return None;
    }
    let t: ToolPart = serde_json::from_value(part.get("data")?.clone()).ok()?;
    let agent = t.agent_name.unwrap_or_else(|| default_agent.to_string());
    if !name_ok(&t.tool_call_id) || !name_ok(&t.tool_name) || !name_ok(&agent) {
        return None;
    }
    let mut m = Map::new();
    m.insert("toolCallId".into(), json!(t.tool_call_id));
    m.insert("agentName".into(), json!(agent));
    m.insert("toolName".into(), json!(t.tool_name));
    match t.phase.as_str() {
        "started" => {
            m.insert("input".into(), t.input);
        }
        "output" => {
            let stream = t.stream.unwrap_or_else(|| "stdout".into());
            if stream != "stdout" && stream != "stderr" {
                return None;
            }
            m.insert("stream".into(), json!(stream));
            m.insert("delta".into(), json!(t.delta?));
        }
        "completed" => {
            if let Some(o) = t.outcome {
                if !OUTCOME_KINDS.contains(&o.kind.as_str()) {
                    return None;
                }
                let mut om = json!({"kind": o.kind});
                if let Some(r) = o.reason {
                    om["reason"] = json!(r);
                }
                m.insert("outcome".into(), om);
            }
            m.insert("display".into(), t.display);
        }
        _ => return None,
    }
    Some((t.phase, m))
}

/// The text a Roll client sees of an AWP msg: its text and code parts, joined by blank
/// lines.
fn msg_text(line: &Value) -> String {
    let mut out: Vec<&str> = Vec::new();
    for p in line
        .get("parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match p.get("k").and_then(Value::as_str) {
            Some("text") | Some("code") => {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    out.push(t);
                }
            }
            _ => {}
        }
    }
    out.join("\n\n")
}

/// The Roll runtime over one peer.
pub struct Front<N: NodeApi> {
    node: N,
    file: StateFile,
    saved: Saved,
    peer_name: String,
    instance: String,
    sequence: u64,
    initialized: bool,
    closing: bool,
    detached: HashSet<String>,
    idem: HashMap<String, (String, Value)>,
    idem_order: VecDeque<String>,
    out: Vec<Value>,
}

impl<N: NodeApi> Front<N> {
    /// A runtime for the peer `peer_key` (named `peer_name`) with the state read from
    /// `file`; a fresh `runtimeInstanceId`.
    pub fn new(node: N, file: StateFile, saved: Saved, peer_name: &str) -> Front<N> {
        let peer_name = if peer_name.is_empty() {
            saved.peer.chars().take(16).collect()
        } else {
            cut_chars(peer_name, 100)
        };
        Front {
            node,
            file,
            saved,
            peer_name,
            instance: uuid::Uuid::new_v4().hyphenated().to_string(),
            sequence: 0,
            initialized: false,
            closing: false,
            detached: HashSet::new(),
            idem: HashMap::new(),
            idem_order: VecDeque::new(),
            out: Vec::new(),
        }
    }

    /// This runtime's `runtimeInstanceId`.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The last node log seq applied.
    pub fn cursor(&self) -> u64 {
        self.saved.cursor
    }

    /// The peer's key.
    pub fn peer(&self) -> &str {
        &self.saved.peer
    }

    /// Start refusing requests with RUNTIME_CLOSING (the process is stopping).
    pub fn begin_closing(&mut self) {
        self.closing = true;
    }

    /// Responses and notifications produced so far, in order.
    pub fn take_output(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.out)
    }

    fn save(&mut self) -> Result<(), RollError> {
        self.file.save(&self.saved).map_err(|e| {
            RollError::new(
                RollCode::InternalError,
                format!("cannot save Roll state: {e}"),
            )
        })
    }

    fn emit(&mut self, thread_id: &str, turn_id: Option<&str>, event: Value) {
        if !self.initialized || self.detached.contains(thread_id) {
            return;
        }
        self.sequence += 1;
        let mut params = json!({
            "protocolVersion": rpc::PROTOCOL_VERSION,
            "runtimeInstanceId": self.instance,
            "sequence": self.sequence,
            "timestamp": now(),
            "threadId": thread_id,
            "event": event,
        });
        if let Some(t) = turn_id {
            params["turnId"] = json!(t);
        }
        self.out
            .push(json!({"jsonrpc": "2.0", "method": "runtime.event", "params": params}));
    }

    // -----------------------------------------------------------------------------------
    // Requests

    /// Handle one request frame (without its `\n`); its response (if it has an id) and any
    /// notifications go to the output.
    pub async fn handle_frame(&mut self, bytes: &[u8]) {
        let env = match rpc::parse_frame(bytes) {
            rpc::Frame::Bad { id, error } => {
                self.out.push(rpc::failure(&id, error));
                return;
            }
            rpc::Frame::Request(env) => env,
        };
        let id = env.id.clone();
        let result = self.dispatch(&env.method, env.params).await;
        // A notification (no id) gets no response (JSON-RPC 2.0 §4.1).
        let Some(id) = id else { return };
        let line = match result {
            Ok(v) => rpc::success(&id, v),
            Err(Dispatch::Roll(e)) => rpc::failure(&id, e.to_json()),
            Err(Dispatch::NoMethod(m)) => rpc::failure(
                &id,
                rpc::plain_error(
                    rpc::METHOD_NOT_FOUND,
                    &format!("no method {:?}", cut_chars(&m, 64)),
                ),
            ),
        };
        self.out.push(line);
    }

    /// Answer a frame longer than [`rpc::MAX_FRAME_BYTES`] (already skipped).
    pub fn frame_too_large(&mut self) {
        let e = RollError::invalid(format!("frame longer than {} bytes", rpc::MAX_FRAME_BYTES));
        self.out.push(rpc::failure(&Value::Null, e.to_json()));
    }

    async fn dispatch(
        &mut self,
        method: &str,
        params: Option<&serde_json::value::RawValue>,
    ) -> Result<Value, Dispatch> {
        if !rpc::METHODS.contains(&method) {
            return Err(Dispatch::NoMethod(method.to_string()));
        }
        if self.closing {
            return Err(RollError::new(RollCode::RuntimeClosing, "the runtime is closing").into());
        }
        if method == "initialize" {
            return Ok(self.initialize(rpc::params(params)?)?);
        }
        if !self.initialized {
            return Err(
                RollError::new(RollCode::InitializeRequired, "call initialize first").into(),
            );
        }
        // Mutating methods: `requestId` is an idempotency key (the first success is
        // answered again; a key reused for another method is refused).
        macro_rules! once {
            ($ty:ty, $call:ident) => {{
                let p: $ty = rpc::params(params)?;
                let rid = p.request_id.clone();
                if let Some(v) = self.cached(method, &rid)? {
                    return Ok(v);
                }
                let v = self.$call(p).await?;
                self.remember(method, rid, v.clone());
                v
            }};
        }
        Ok(match method {
            "thread.list" => self.thread_list(rpc::params(params)?)?,
            "thread.create" => once!(rpc::ThreadCreateParams, thread_create),
            "thread.open" => self.thread_open(rpc::params(params)?).await?,
            "thread.snapshot" => self.thread_snapshot(rpc::params(params)?).await?,
            "thread.rename" => once!(rpc::ThreadRenameParams, thread_rename),
            "thread.delete" => once!(rpc::ThreadRequestParams, thread_delete),
            "thread.detach" => once!(rpc::ThreadRequestParams, thread_detach),
            "thread.capabilities" => self.thread_capabilities(rpc::params(params)?)?,
            "turn.start" => once!(rpc::TurnStartParams, turn_start),
            "turn.cancel" => once!(rpc::TurnCancelParams, turn_cancel),
            "approval.respond" => once!(rpc::ApprovalRespondParams, approval_respond),
            "operation.get" => self.operation_get(rpc::params(params)?).await?,
            other => return Err(Dispatch::NoMethod(other.to_string())),
        })
    }

    /// The remembered result of `request_id`, if any (refused when it was another method).
    fn cached(&self, method: &str, request_id: &str) -> Result<Option<Value>, RollError> {
        rpc::uuid_field("requestId", request_id)?;
        match self.idem.get(request_id) {
            None => Ok(None),
            Some((m, v)) if m == method => Ok(Some(v.clone())),
            Some((m, _)) => Err(RollError::invalid(format!(
                "requestId {request_id} was used for {m}"
            ))),
        }
    }

    fn remember(&mut self, method: &str, request_id: String, v: Value) {
        if self.idem_order.len() >= IDEMPOTENCY_ENTRIES {
            if let Some(old) = self.idem_order.pop_front() {
                self.idem.remove(&old);
            }
        }
        self.idem_order.push_back(request_id.clone());
        self.idem.insert(request_id, (method.to_string(), v));
    }
}

enum Dispatch {
    Roll(RollError),
    NoMethod(String),
}

impl From<RollError> for Dispatch {
    fn from(e: RollError) -> Dispatch {
        Dispatch::Roll(e)
    }
}

/// A node failure as a Roll error: not running (nothing was done: INTERNAL_ERROR,
/// retryable); no answer after the request was written (OUTCOME_UNKNOWN); a refusal
/// (INTERNAL_ERROR, retryable only for `disk_full`).
pub fn node_error(e: &ClientError) -> RollError {
    match e {
        ClientError::NotRunning { .. } => RollError::new(
            RollCode::InternalError,
            format!("the node is not running: {e}"),
        )
        .retryable(true)
        .details(json!({"node": "not_running"})),
        ClientError::Timeout(_) | ClientError::Closed | ClientError::Io(_) => RollError::new(
            RollCode::OutcomeUnknown,
            format!("the node did not answer: {e}"),
        ),
        ClientError::Refused(c) => refused(&c.code, &c.message),
        ClientError::TooLarge | ClientError::Malformed(_) => {
            RollError::new(RollCode::InternalError, e.to_string())
        }
    }
}

fn refused(code: &str, message: &str) -> RollError {
    RollError::new(
        RollCode::InternalError,
        format!("the node refused: {message}"),
    )
    .retryable(code == "disk_full")
    .details(json!({"node": code}))
}

/// The body of an ok response, or the Roll error of a refusal.
fn ok_body(r: Result<Response, ClientError>) -> Result<Map<String, Value>, RollError> {
    let r = r.map_err(|e| node_error(&e))?;
    if r.ok {
        Ok(r.body)
    } else {
        let e = r.error.unwrap_or(crate::control::ControlError {
            code: "internal".into(),
            message: "refused without a reason".into(),
            hint: None,
        });
        Err(refused(&e.code, &e.message))
    }
}

/// Messages and operations of one thread, as `thread.open` / `thread.snapshot` show them.
struct Transcript {
    messages: VecDeque<Value>,
    messages_cut: bool,
    operations: VecDeque<Value>,
    operations_cut: bool,
}

fn push_bounded(q: &mut VecDeque<Value>, cut: &mut bool, v: Value, limit: usize) {
    q.push_back(v);
    if q.len() > limit {
        q.pop_front();
        *cut = true;
    }
}

fn page(q: VecDeque<Value>, cut: bool) -> Value {
    let next = if cut {
        q.front()
            .and_then(|m| m.get("sequence"))
            .cloned()
            .unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    json!({"items": Vec::from(q), "nextBeforeSequence": next})
}

impl<N: NodeApi> Front<N> {
    fn initialize(&mut self, p: rpc::InitializeParams) -> Result<Value, RollError> {
        let name_ok = |s: &str| (1..=100).contains(&s.chars().count());
        if p.protocol_versions.is_empty()
            || p.protocol_versions.iter().any(|v| v.is_empty())
            || !name_ok(&p.client.name)
            || !name_ok(&p.client.version)
        {
            return Err(RollError::invalid(
                "protocolVersions needs at least one version; client name and version 1..=100 characters",
            ));
        }
        if !p
            .protocol_versions
            .iter()
            .any(|v| v == rpc::PROTOCOL_VERSION)
        {
            return Err(RollError::new(
                RollCode::ProtocolVersionUnsupported,
                format!("this runtime speaks only {}", rpc::PROTOCOL_VERSION),
            )
            .details(json!({"supported": [rpc::PROTOCOL_VERSION]})));
        }
        self.initialized = true;
        Ok(json!({
            "protocolVersion": rpc::PROTOCOL_VERSION,
            "runtimeInstanceId": self.instance,
            "server": {
                "name": "awp-node",
                "version": env!("CARGO_PKG_VERSION"),
                "runtimeVersion": "awp-v0",
            },
            "features": [
                "thread-management", "snapshots", "turns", "approvals", "tool-streaming",
                "reasoning-summary", "operation-projection", "process-local-sequence",
            ],
            "limits": {
                "maxFrameBytes": rpc::MAX_FRAME_BYTES,
                "maxPageSize": rpc::MAX_PAGE,
                "eventReplay": false,
                "idempotencyCacheEntries": IDEMPOTENCY_ENTRIES,
            },
        }))
    }

    fn thread_index(&self, id: &str) -> Result<usize, RollError> {
        rpc::uuid_field("threadId", id)?;
        self.saved
            .threads
            .iter()
            .position(|t| t.id == id)
            .ok_or_else(|| RollError::new(RollCode::ThreadNotFound, format!("no thread {id}")))
    }

    fn thread_view(&self, t: &ThreadRec) -> Value {
        let mut v = json!({
            "id": t.id,
            "model": format!("awp:{}", self.peer_name),
            "createdAt": t.created_at,
            "updatedAt": t.updated_at,
            "messageCount": t.message_count,
        });
        if let Some(title) = &t.title {
            v["title"] = json!(title);
        }
        v
    }

    fn thread_list(&mut self, p: rpc::ThreadListParams) -> Result<Value, RollError> {
        let limit = rpc::page_limit(p.limit)?;
        let start = match p.cursor.as_deref() {
            None => 0,
            Some(c) => c
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| c.parse::<usize>().ok())
                .flatten()
                .ok_or_else(|| RollError::invalid("cursor must be a decimal number"))?,
        };
        // Newest first.
        let all: Vec<&ThreadRec> = self.saved.threads.iter().rev().collect();
        let items: Vec<Value> = all
            .iter()
            .skip(start)
            .take(limit)
            .map(|t| self.thread_view(t))
            .collect();
        let end = start.saturating_add(items.len());
        let next = if end < all.len() {
            json!(end.to_string())
        } else {
            Value::Null
        };
        Ok(json!({"items": items, "nextCursor": next}))
    }

    async fn thread_create(&mut self, p: rpc::ThreadCreateParams) -> Result<Value, RollError> {
        if let Some(t) = &p.title {
            if !(1..=200).contains(&t.chars().count()) {
                return Err(RollError::invalid("title must be 1..=200 characters"));
            }
        }
        if self.saved.threads.len() >= MAX_THREADS {
            return Err(RollError::new(
                RollCode::InternalError,
                format!("at most {MAX_THREADS} Roll threads per peer; delete some"),
            ));
        }
        let at = now();
        let rec = ThreadRec {
            id: uuid::Uuid::new_v4().hyphenated().to_string(),
            th: format!("thr_{}", ulid::Ulid::generate()),
            title: p.title,
            created_at: at.clone(),
            updated_at: at,
            message_count: 0,
            turns: vec![],
            pending: vec![],
        };
        let view = self.thread_view(&rec);
        self.saved.threads.push(rec);
        if let Err(e) = self.save() {
            self.saved.threads.pop();
            return Err(e);
        }
        Ok(json!({ "thread": view }))
    }

    async fn thread_rename(&mut self, p: rpc::ThreadRenameParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        if !(1..=200).contains(&p.title.chars().count()) {
            return Err(RollError::invalid("title must be 1..=200 characters"));
        }
        let old = self.saved.threads[i].clone();
        self.saved.threads[i].title = Some(p.title);
        self.saved.threads[i].updated_at = now();
        if let Err(e) = self.save() {
            self.saved.threads[i] = old;
            return Err(e);
        }
        Ok(json!({ "thread": self.thread_view(&self.saved.threads[i]) }))
    }

    async fn thread_delete(&mut self, p: rpc::ThreadRequestParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        if let Some(t) = self.saved.threads[i].active_turn() {
            return Err(RollError::new(
                RollCode::ThreadBusy,
                format!("turn {} is running; cancel it first", t.id),
            ));
        }
        // Local only: the AWP thread stays in the node's store and at the peer.
        let old = self.saved.threads.remove(i);
        if let Err(e) = self.save() {
            self.saved.threads.insert(i, old);
            return Err(e);
        }
        self.detached.remove(&p.thread_id);
        Ok(json!({"deleted": true}))
    }

    async fn thread_detach(&mut self, p: rpc::ThreadRequestParams) -> Result<Value, RollError> {
        self.thread_index(&p.thread_id)?;
        // No more events of this thread to this client until it opens it again.
        let newly = self.detached.insert(p.thread_id);
        Ok(json!({ "detached": newly }))
    }

    fn thread_capabilities(&mut self, p: rpc::ThreadIdParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        let t = &self.saved.threads[i];
        Ok(json!({"manifest": {
            "runtime": "awp-roll",
            "peer": {"key": self.saved.peer, "name": self.peer_name},
            "awpThread": t.th,
            "input": ["text"],
            "approvals": true,
            "toolMime": TOOL_MIME,
            "reasoningMime": REASONING_MIME,
            "cancel": "AWP state closed",
        }}))
    }

    /// Read the thread's stored lines into messages and operations (at most `limit` of
    /// each, before the given sequences).
    async fn transcript(
        &self,
        i: usize,
        msg_before: Option<u64>,
        op_before: Option<u64>,
        limit: usize,
    ) -> Result<Transcript, RollError> {
        let th = self.saved.threads[i].th.clone();
        let agent = self.peer_name.clone();
        let mut tr = Transcript {
            messages: VecDeque::new(),
            messages_cut: false,
            operations: VecDeque::new(),
            operations_cut: false,
        };
        let mut visit = |ev: &Event| {
            if ev.get("t").and_then(Value::as_str) != Some("msg") {
                return;
            }
            let (Some(seq), Some(line)) = (ev.get("seq").and_then(Value::as_u64), ev.get("line"))
            else {
                return;
            };
            let at = ev.get("at").cloned().unwrap_or_else(|| json!(now()));
            let inbound = ev.get("dir").and_then(Value::as_str) == Some("in");
            let text = msg_text(line);
            if !text.is_empty() && msg_before.is_none_or(|b| seq < b) {
                let role = if inbound { "assistant" } else { "user" };
                let m = json!({"sequence": seq, "role": role, "createdAt": at,
                    "parts": [{"type": "text", "text": text}]});
                push_bounded(&mut tr.messages, &mut tr.messages_cut, m, limit);
            }
            if !inbound || op_before.is_some_and(|b| seq >= b) {
                return;
            }
            let id = ev.get("id").and_then(Value::as_str).unwrap_or_default();
            for (n, part) in line
                .get("parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some((phase, mut m)) = tool_part(part, &agent) {
                    if phase != "completed" {
                        continue;
                    }
                    m.insert(
                        "id".into(),
                        json!(derived_uuid(&["op", &th, id, &n.to_string()])),
                    );
                    m.insert("sequence".into(), json!(seq));
                    m.insert("createdAt".into(), at.clone());
                    m.entry("outcome").or_insert(json!({"kind": "success"}));
                    push_bounded(
                        &mut tr.operations,
                        &mut tr.operations_cut,
                        Value::Object(m),
                        limit,
                    );
                }
            }
        };
        self.node
            .thread_lines(&self.saved.peer, &th, &mut visit)
            .await
            .map_err(|e| node_error(&e))?;
        Ok(tr)
    }

    fn snapshot_value(&self, i: usize, tr: Transcript) -> Value {
        let t = &self.saved.threads[i];
        let mut v = json!({
            "thread": self.thread_view(t),
            "messages": page(tr.messages, tr.messages_cut),
            "operations": page(tr.operations, tr.operations_cut),
            "pendingApprovals": t.pending.iter().map(|a| self.approval_view(a)).collect::<Vec<_>>(),
            "transcriptCompleteness": "complete",
        });
        if let Some(turn) = t.active_turn() {
            v["activeTurn"] =
                json!({"id": turn.id, "status": "running", "startedAt": turn.started_at});
        }
        v
    }

    fn approval_view(&self, a: &ApprovalRec) -> Value {
        json!({
            "id": a.id,
            "turnId": a.turn_id,
            "agentName": self.peer_name,
            "toolName": "awp.state.waiting",
            "preview": a.note,
            "reason": a.note,
        })
    }

    async fn thread_open(&mut self, p: rpc::ThreadIdParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        let tr = self
            .transcript(i, None, None, rpc::DEFAULT_PAGE as usize)
            .await?;
        self.detached.remove(&p.thread_id);
        Ok(self.snapshot_value(i, tr))
    }

    async fn thread_snapshot(&mut self, p: rpc::ThreadSnapshotParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        let limit = rpc::page_limit(p.limit)?;
        let tr = self
            .transcript(
                i,
                p.message_before_sequence,
                p.operation_before_sequence,
                limit,
            )
            .await?;
        Ok(self.snapshot_value(i, tr))
    }

    async fn operation_get(&mut self, p: rpc::OperationGetParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        rpc::uuid_field("operationId", &p.operation_id)?;
        let tr = self.transcript(i, None, None, usize::MAX).await?;
        let op = tr
            .operations
            .into_iter()
            .find(|o| o.get("id").and_then(Value::as_str) == Some(p.operation_id.as_str()));
        Ok(json!({"operation": op.unwrap_or(Value::Null)}))
    }

    async fn turn_start(&mut self, p: rpc::TurnStartParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        rpc::uuid_field("turnId", &p.turn_id)?;
        if p.input.text.is_empty() || p.input.text.len() > rpc::MAX_INPUT_BYTES {
            return Err(RollError::invalid(format!(
                "input.text must be 1..={} bytes",
                rpc::MAX_INPUT_BYTES
            )));
        }
        let t = &self.saved.threads[i];
        if let Some(active) = t.active_turn() {
            return Err(RollError::new(
                RollCode::TurnAlreadyActive,
                format!("turn {} is running in this thread", active.id),
            )
            .details(json!({"activeTurnId": active.id})));
        }
        if t.turns.iter().any(|x| x.id == p.turn_id) {
            return Err(RollError::invalid(format!(
                "turn {} already ran",
                p.turn_id
            )));
        }
        // The first msg of the AWP thread carries its subject.
        let subject = (t.message_count == 0 && t.turns.is_empty())
            .then(|| t.title.clone().unwrap_or_else(|| "Roll thread".into()));
        let req = Request::Send {
            peer: Some(self.saved.peer.clone()),
            th: Some(t.th.clone()),
            subject,
            re: None,
            parts: vec![json!({"k": "text", "text": p.input.text})],
            files: vec![],
            wait_ack_ms: None,
        };
        let body = ok_body(self.node.call(req).await)?;
        let msg_id = body
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let at = now();
        let t = &mut self.saved.threads[i];
        t.updated_at = at.clone();
        t.push_turn(TurnRec {
            id: p.turn_id.clone(),
            msg_id,
            msg_seq: None,
            started_at: at,
            status: "running".into(),
            announced: false,
        });
        // The msg is on disk at the node; a failed save here loses only the Roll view of
        // the turn, which the client learns from this error.
        self.save()?;
        Ok(json!({"accepted": true, "turnId": p.turn_id}))
    }

    fn turn_index(&self, i: usize, turn_id: &str) -> Result<usize, RollError> {
        rpc::uuid_field("turnId", turn_id)?;
        self.saved.threads[i]
            .turns
            .iter()
            .position(|t| t.id == turn_id)
            .ok_or_else(|| RollError::new(RollCode::TurnNotFound, format!("no turn {turn_id}")))
    }

    async fn turn_cancel(&mut self, p: rpc::TurnCancelParams) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        let k = self.turn_index(i, &p.turn_id)?;
        if !self.saved.threads[i].turns[k].active() {
            return Ok(json!({"cancelling": false}));
        }
        let req = Request::State {
            peer: Some(self.saved.peer.clone()),
            th: self.saved.threads[i].th.clone(),
            state: "closed".into(),
            note: Some("cancelled by the Roll client".into()),
            wait_ack_ms: None,
        };
        ok_body(self.node.call(req).await)?;
        let t = &mut self.saved.threads[i];
        t.turns[k].status = "cancelled".into();
        t.pending.retain(|a| a.turn_id != p.turn_id);
        t.updated_at = now();
        self.save()?;
        let ev = json!({"type": "turn.cancelled", "reason": "client", "message": "cancelled by the client"});
        self.emit(&p.thread_id, Some(&p.turn_id), ev);
        Ok(json!({"cancelling": true}))
    }

    async fn approval_respond(
        &mut self,
        p: rpc::ApprovalRespondParams,
    ) -> Result<Value, RollError> {
        let i = self.thread_index(&p.thread_id)?;
        let k = self.turn_index(i, &p.turn_id)?;
        rpc::uuid_field("approvalId", &p.approval_id)?;
        if p.reason
            .as_ref()
            .is_some_and(|r| r.len() > rpc::MAX_REASON_BYTES)
        {
            return Err(RollError::invalid(format!(
                "reason longer than {} bytes",
                rpc::MAX_REASON_BYTES
            )));
        }
        let t = &self.saved.threads[i];
        if !t.turns[k].active() {
            return Err(RollError::new(
                RollCode::TurnNotFound,
                format!("turn {} is not running", p.turn_id),
            ));
        }
        let Some(a) = t
            .pending
            .iter()
            .position(|a| a.id == p.approval_id && a.turn_id == p.turn_id)
        else {
            return Err(RollError::new(
                RollCode::ApprovalNotFound,
                format!(
                    "no pending approval {} in turn {}",
                    p.approval_id, p.turn_id
                ),
            ));
        };
        let (word, done) = match p.decision {
            rpc::Decision::Approve => ("approve", "approved"),
            rpc::Decision::Reject => ("reject", "rejected"),
        };
        let text = match &p.reason {
            Some(r) if !r.is_empty() => format!("{done}: {r}"),
            _ => done.to_string(),
        };
        let mut data = json!({"approvalId": p.approval_id, "decision": word});
        if let Some(r) = &p.reason {
            data["reason"] = json!(r);
        }
        let req = Request::Send {
            peer: Some(self.saved.peer.clone()),
            th: Some(t.th.clone()),
            subject: None,
            re: Some(t.pending[a].state_id.clone()),
            parts: vec![
                json!({"k": "text", "text": text}),
                json!({"k": "data", "mime": APPROVAL_MIME, "data": data}),
            ],
            files: vec![],
            wait_ack_ms: None,
        };
        ok_body(self.node.call(req).await)?;
        let t = &mut self.saved.threads[i];
        t.pending.remove(a);
        t.updated_at = now();
        self.save()?;
        Ok(json!({"resolved": true}))
    }
}

// ---------------------------------------------------------------------------------------
// AWP lines in

impl<N: NodeApi> Front<N> {
    /// Apply one node event (a `line` of the peer's threads, in log order). Lines at or
    /// below the cursor were applied already and are skipped; lines of threads that are
    /// not Roll threads only move the cursor. Returns an error only when the state could
    /// not be saved.
    pub fn apply(&mut self, ev: &Event) -> Result<(), RollError> {
        if ev.get("event").and_then(Value::as_str) != Some("line") {
            return Ok(());
        }
        let Some(seq) = ev.get("seq").and_then(Value::as_u64) else {
            return Ok(());
        };
        if seq <= self.saved.cursor {
            return Ok(());
        }
        if ev.get("peer").and_then(Value::as_str) != Some(self.saved.peer.as_str()) {
            return Ok(());
        }
        self.saved.cursor = seq;
        let th = ev.get("th").and_then(Value::as_str).unwrap_or_default();
        let Some(i) = self.saved.threads.iter().position(|t| t.th == th) else {
            return Ok(());
        };
        let inbound = ev.get("dir").and_then(Value::as_str) == Some("in");
        let id = ev
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let null = Value::Null;
        let line = ev.get("line").unwrap_or(&null);
        let changed = match (ev.get("t").and_then(Value::as_str), inbound) {
            (Some("msg"), false) => {
                let t = &mut self.saved.threads[i];
                t.message_count += 1;
                if let Some(turn) = t.turns.iter_mut().find(|x| x.msg_id == id) {
                    turn.msg_seq = Some(seq);
                }
                true
            }
            (Some("msg"), true) => {
                self.peer_msg(i, seq, &id, line);
                true
            }
            (Some("state"), true) => self.peer_state(i, seq, &id, line),
            _ => false,
        };
        if changed {
            self.saved.threads[i].updated_at = now();
            self.save()?;
        }
        Ok(())
    }

    /// The running turn that a peer line with `seq` belongs to: one whose msg is in the
    /// log before it.
    fn turn_for(&self, i: usize, seq: u64) -> Option<usize> {
        let t = &self.saved.threads[i];
        t.turns
            .iter()
            .rposition(|x| x.active() && x.msg_seq.is_some_and(|s| s < seq))
    }

    fn announce(&mut self, i: usize, k: usize) {
        let t = &mut self.saved.threads[i];
        if t.turns[k].announced {
            return;
        }
        t.turns[k].announced = true;
        let (thread_id, turn_id) = (t.id.clone(), t.turns[k].id.clone());
        self.emit(&thread_id, Some(&turn_id), json!({"type": "turn.started"}));
    }

    fn peer_msg(&mut self, i: usize, seq: u64, id: &str, line: &Value) {
        self.saved.threads[i].message_count += 1;
        let k = self.turn_for(i, seq);
        if let Some(k) = k {
            self.announce(i, k);
        }
        let t = &self.saved.threads[i];
        let (thread_id, th) = (t.id.clone(), t.th.clone());
        let turn_id = k.map(|k| t.turns[k].id.clone());
        let turn = turn_id.as_deref();
        let text = msg_text(line);
        if !text.is_empty() {
            let stream = derived_uuid(&["stream", &th, id]);
            self.emit(
                &thread_id,
                turn,
                json!({"type": "message.started", "streamId": stream}),
            );
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(DELTA_CHARS) {
                let delta: String = piece.iter().collect();
                self.emit(
                    &thread_id,
                    turn,
                    json!({"type": "message.delta", "streamId": stream, "delta": delta}),
                );
            }
            self.emit(
                &thread_id,
                turn,
                json!({"type": "message.completed", "streamId": stream, "text": text}),
            );
        }
        let parts = line
            .get("parts")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (n, part) in parts.iter().enumerate() {
            if part.get("k").and_then(Value::as_str) != Some("data") {
                continue;
            }
            if part.get("mime").and_then(Value::as_str) == Some(REASONING_MIME) {
                if let Some(d) = part.pointer("/data/delta").and_then(Value::as_str) {
                    let ev = json!({"type": "reasoning.summary.delta",
                        "reasoningId": format!("{id}/{n}"), "delta": d});
                    self.emit(&thread_id, turn, ev);
                }
                continue;
            }
            let Some((phase, mut m)) = tool_part(part, &self.peer_name) else {
                continue;
            };
            m.insert("type".into(), json!(format!("tool.{phase}")));
            if phase == "completed" {
                let op = derived_uuid(&["op", &th, id, &n.to_string()]);
                m.insert("operationId".into(), json!(op));
            }
            self.emit(&thread_id, turn, Value::Object(m));
        }
    }

    fn peer_state(&mut self, i: usize, seq: u64, id: &str, line: &Value) -> bool {
        let Some(k) = self.turn_for(i, seq) else {
            return false;
        };
        let state = line
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let note = line.get("note").and_then(Value::as_str).unwrap_or_default();
        let (thread_id, turn_id) = {
            let t = &self.saved.threads[i];
            (t.id.clone(), t.turns[k].id.clone())
        };
        match state {
            "working" => self.announce(i, k),
            "waiting" if !note.is_empty() => {
                self.announce(i, k);
                let th = self.saved.threads[i].th.clone();
                let a = ApprovalRec {
                    id: derived_uuid(&["approval", &th, id]),
                    turn_id: turn_id.clone(),
                    state_id: id.to_string(),
                    note: cut_chars(note, MAX_PREVIEW_CHARS),
                };
                let view = self.approval_view(&a);
                let t = &mut self.saved.threads[i];
                if t.pending.iter().any(|p| p.id == a.id) {
                    return false;
                }
                t.pending.push(a);
                if t.pending.len() > MAX_PENDING {
                    t.pending.remove(0);
                }
                self.emit(
                    &thread_id,
                    Some(&turn_id),
                    json!({"type": "approval.required", "approval": view}),
                );
            }
            "done" | "failed" | "closed" => {
                self.announce(i, k);
                let (status, ev) = match state {
                    "done" => ("completed", json!({"type": "turn.completed"})),
                    "failed" => {
                        let m = if note.is_empty() {
                            "the peer reported failed"
                        } else {
                            note
                        };
                        (
                            "failed",
                            json!({"type": "turn.failed", "stage": "execute", "message": cut_chars(m, MAX_PREVIEW_CHARS)}),
                        )
                    }
                    _ => {
                        let m = if note.is_empty() {
                            "the peer closed the thread"
                        } else {
                            note
                        };
                        (
                            "cancelled",
                            json!({"type": "turn.cancelled", "reason": "peer_closed", "message": cut_chars(m, MAX_PREVIEW_CHARS)}),
                        )
                    }
                };
                let t = &mut self.saved.threads[i];
                t.turns[k].status = status.into();
                t.pending.retain(|a| a.turn_id != turn_id);
                self.emit(&thread_id, Some(&turn_id), ev);
            }
            _ => return false,
        }
        true
    }
}
