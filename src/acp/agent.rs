//! `awp acp --peer PEER`: an ACP agent on stdio for an editor, backed by PEER's served
//! agent (`awp serve-agent --acp` there, [`super::serve`]).
//!
//! - `session/new` opens nothing yet; the session's first prompt starts an AWP thread with
//!   PEER, and its later prompts go to the same thread.
//! - `session/prompt`: text blocks → text parts, resource links → their URI as text,
//!   embedded text resources → code parts; then PEER's msgs in the thread come back as
//!   `session/update`s (text → `agent_message_chunk`, a [`bridge::PLAN_MIME`] data part →
//!   `plan`) until PEER's state `done` (→ `end_turn`) or `failed` (→ the stop reason its
//!   note names, else `refusal`, with the note as a last chunk).
//! - A msg with a [`bridge::PERMISSION_MIME`] part → `session/request_permission` to the
//!   editor; the chosen option id (or `deny` when the editor cancels) is the reply.
//!   ACP has no stop reason for a failure (a crash of PEER's agent, an agent that cannot
//!   start): `refusal` is the closest and is kept, the note saying what happened.
//! - `session/cancel` → our state `failed` (note `cancelled`) in the thread, which PEER
//!   turns into `session/cancel` for its agent; the prompt ends `cancelled` at once (the
//!   late end state of the cancelled prompt is skipped by the session's next prompt).
//! - Every wait has a timeout: PEER's first line in the thread
//!   ([`AgentConfig::answer_timeout`]: a peer that serves no agent answers nothing; the
//!   prompt then fails with a JSON-RPC error saying so and our state `failed` ends the
//!   thread), the prompt as a whole ([`AgentConfig::prompt_timeout`]), permission questions
//!   ([`super::serve::PERMISSION_TIMEOUT`]).
//! - Errors: a prompt in an unknown session or without text is invalid params (-32602);
//!   a prompt that could not run is an internal error (-32603) whose message says why.

use super::bridge;
use crate::control::{self, Request};
use acp::v1::schema as s;
use acp::v1::ConnectionTo;
use agent_client_protocol as acp;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// What `awp acp` runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The node's control socket.
    pub socket: PathBuf,
    /// The peer serving an agent (key, prefix or name; the node resolves it).
    pub peer: String,
    /// Longest one prompt waits for the peer's end state.
    pub prompt_timeout: Duration,
    /// Longest one prompt waits for the peer's first line (progress or state) in the
    /// thread; then the prompt ends with an error saying the peer answered nothing.
    pub answer_timeout: Duration,
}

/// Most sessions one editor may open.
pub const MAX_SESSIONS: usize = 64;

#[derive(Default)]
struct Session {
    th: Option<String>,
    /// Set to true by `session/cancel`.
    cancel: Option<watch::Sender<bool>>,
    /// The last prompt was cancelled before the peer's end state came: the next prompt
    /// ignores one end state that comes before the peer's `working` (the late end of the
    /// cancelled one).
    stale_end: bool,
}

struct State {
    cfg: AgentConfig,
    sessions: Mutex<HashMap<String, Session>>,
    next: Mutex<u64>,
    /// Threads of the prompts in flight (sent, no end yet), with how many prompts each.
    in_flight: Mutex<HashMap<String, usize>>,
    /// Prompts taken from the editor whose msg is not in `in_flight` yet (being sent).
    starting: std::sync::atomic::AtomicUsize,
}

/// A prompt counted in [`State::starting`] until dropped (once it is in flight, or failed
/// before).
struct Starting<'a>(&'a State);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0
            .starting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How long `awp acp` may take, once the editor closed stdin, to end the prompts in
/// flight.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A prompt in flight in a thread, until dropped.
struct InFlight<'a> {
    st: &'a State,
    th: String,
}

impl<'a> InFlight<'a> {
    fn new(st: &'a State, th: &str) -> InFlight<'a> {
        *st.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(th.to_string())
            .or_default() += 1;
        InFlight {
            st,
            th: th.to_string(),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut m = self.st.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.th) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.th);
            }
        }
    }
}

/// Serve ACP on stdin/stdout until the editor closes it; then every prompt still in
/// flight ends at the peer as after `session/cancel` (our state `failed`, note
/// `cancelled`), within [`CLOSE_TIMEOUT`].
pub async fn run(cfg: AgentConfig) -> Result<(), String> {
    let st = Arc::new(State {
        cfg,
        sessions: Mutex::new(HashMap::new()),
        next: Mutex::new(0),
        in_flight: Mutex::new(HashMap::new()),
        starting: std::sync::atomic::AtomicUsize::new(0),
    });
    let st_end = st.clone();
    let (s1, s2, s3) = (st.clone(), st.clone(), st.clone());
    let ended = acp::Agent
        .v1()
        .name("awp acp")
        .on_receive_request(
            async move |r: s::InitializeRequest, responder, _cx| {
                let resp: s::InitializeResponse = serde_json::from_value(json!({
                    "protocolVersion": r.protocol_version,
                    "agentCapabilities": {"loadSession": false, "promptCapabilities": {"embeddedContext": true}},
                    "authMethods": [],
                    "agentInfo": {"name": "awp", "version": env!("CARGO_PKG_VERSION")},
                }))
                .map_err(acp::Error::into_internal_error)?;
                responder.respond(resp)
            },
            acp::on_receive_request!(),
        )
        .on_receive_request(
            async move |_r: s::NewSessionRequest, responder, _cx| {
                let id = {
                    let mut n = s1.next.lock().unwrap_or_else(|p| p.into_inner());
                    *n += 1;
                    format!("awp-{}", *n)
                };
                let mut sessions = s1.sessions.lock().unwrap_or_else(|p| p.into_inner());
                if sessions.len() >= MAX_SESSIONS {
                    drop(sessions);
                    return responder.respond_with_error(
                        acp::Error::internal_error().data(format!("at most {MAX_SESSIONS} sessions")),
                    );
                }
                sessions.insert(id.clone(), Session::default());
                drop(sessions);
                responder.respond(s::NewSessionResponse::new(s::SessionId::new(id)))
            },
            acp::on_receive_request!(),
        )
        .on_receive_request(
            async move |r: s::PromptRequest, responder, cx: ConnectionTo<acp::Client>| {
                let st = s2.clone();
                // Counted before the task runs, so that a stdin closed right after this
                // line still waits for the prompt to be sent and then ends it.
                st.starting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let result = st.prompt(r, &cx).await;
                    let _ = match result {
                        Ok(reason) => match serde_json::from_value::<s::PromptResponse>(
                            json!({"stopReason": reason}),
                        ) {
                            Ok(resp) => responder.respond(resp),
                            Err(e) => responder.respond_with_error(acp::Error::into_internal_error(e)),
                        },
                        Err(e) => responder.respond_with_error(e),
                    };
                });
                Ok(())
            },
            acp::on_receive_request!(),
        )
        .on_receive_notification(
            async move |n: s::CancelNotification, _cx| {
                s3.cancel(&n.session_id.0);
                Ok(())
            },
            acp::on_receive_notification!(),
        )
        .connect_to(acp::Stdio::new())
        .await
        .map_err(|e| format!("ACP connection: {e}"));
    // The editor is gone: end every prompt in flight as `session/cancel` would, once the
    // prompts still being sent are in flight (polled, within the same bound).
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while st_end.starting.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let open: Vec<String> = st_end
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for th in open {
            st_end.end_thread(&th, "cancelled").await;
        }
    })
    .await;
    ended
}

/// The AWP parts of an ACP prompt.
pub fn prompt_parts(blocks: &[Value]) -> Vec<Value> {
    let mut parts = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => {
                if let Some(t) = b["text"].as_str() {
                    parts.push(json!({"k": "text", "text": t}));
                }
            }
            Some("resource_link") => {
                if let Some(u) = b["uri"].as_str() {
                    parts.push(json!({"k": "text", "text": format!("<{u}>")}));
                }
            }
            Some("resource") => {
                let r = &b["resource"];
                if let Some(t) = r["text"].as_str() {
                    let mut p = json!({"k": "code", "text": t});
                    if let Some(u) = r["uri"].as_str() {
                        p["lang"] = json!(u.rsplit('.').next().unwrap_or(""));
                    }
                    parts.push(p);
                }
            }
            _ => {}
        }
    }
    parts
}

/// The ACP stop reason for the peer's state `failed` with `note`: the reason the note
/// names (as [`bridge::stop_state`] writes it), else `refusal`.
pub fn failed_reason(note: &str) -> &'static str {
    let named = note.strip_prefix("the agent stopped: ").unwrap_or("");
    match named.trim() {
        "max_tokens" => "max_tokens",
        "max_turn_requests" => "max_turn_requests",
        "cancelled" => "cancelled",
        _ => "refusal",
    }
}

/// A prompt that could not run: JSON-RPC internal error (-32603) with `msg` as its message.
fn failure(msg: impl std::fmt::Display) -> acp::Error {
    acp::Error::new(acp::ErrorCode::INTERNAL_ERROR, msg.to_string())
}

impl State {
    fn cancel(&self, sid: &str) {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = sessions.get(sid).and_then(|s| s.cancel.as_ref()) {
            let _ = tx.send(true);
        }
    }

    async fn prompt(
        &self,
        r: s::PromptRequest,
        cx: &ConnectionTo<acp::Client>,
    ) -> Result<String, acp::Error> {
        let starting = Starting(self);
        let sid = r.session_id.0.to_string();
        let (cancel_tx, mut cancel_rx) = watch::channel(false);
        let (th, mut stale_end) = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let Some(s) = sessions.get_mut(&sid) else {
                return Err(acp::Error::invalid_params().data(format!("no session {sid:?}")));
            };
            s.cancel = Some(cancel_tx);
            (s.th.clone(), std::mem::take(&mut s.stale_end))
        };
        let blocks = serde_json::to_value(&r.prompt).map_err(failure)?;
        let parts = prompt_parts(blocks.as_array().map(Vec::as_slice).unwrap_or(&[]));
        if parts.is_empty() {
            return Err(acp::Error::invalid_params().data("the prompt has no text"));
        }
        let socket = &self.cfg.socket;
        // Subscribe before sending: nothing the peer answers can be missed.
        let mut sub = control::subscribe(
            socket,
            &Request::Subscribe {
                th: None,
                peer: Some(self.cfg.peer.clone()),
                from_seq: None,
            },
        )
        .await
        .map_err(failure)?;
        let resp = control::request(
            socket,
            &Request::Send {
                peer: Some(self.cfg.peer.clone()),
                th: th.clone(),
                subject: th.is_none().then(|| "ACP session".to_string()),
                re: None,
                parts,
                files: vec![],
                wait_ack_ms: None,
            },
        )
        .await
        .map_err(failure)?;
        if !resp.ok {
            return Err(failure(resp.error.map(|e| e.message).unwrap_or_default()));
        }
        let th = resp
            .body
            .get("th")
            .and_then(Value::as_str)
            .ok_or_else(|| failure("the node did not name the thread"))?
            .to_string();
        let peer_key = resp
            .body
            .get("peer")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(s) = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&sid)
        {
            s.th = Some(th.clone());
        }
        let _in_flight = InFlight::new(self, &th);
        drop(starting);
        let start = tokio::time::Instant::now();
        let deadline = start + self.cfg.prompt_timeout;
        let answer_deadline = start + self.cfg.answer_timeout;
        let mut answered = false;
        // False once the sender is gone (a later prompt of the session took its place).
        let mut cancel_live = true;
        loop {
            let ev = tokio::select! {
                ev = sub.next_event() => ev.map_err(failure)?.ok_or_else(|| failure("the node closed the event stream"))?,
                r = cancel_rx.changed(), if cancel_live => {
                    if r.is_err() {
                        cancel_live = false;
                        continue;
                    }
                    // Ended at once: the peer (its agent cancelled by our `failed`) may
                    // answer late or never; its late end is skipped by the next prompt.
                    self.end_thread(&th, "cancelled").await;
                    if let Some(s) = self.sessions.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&sid) {
                        s.stale_end = true;
                    }
                    return Ok("cancelled".into());
                }
                _ = tokio::time::sleep_until(answer_deadline), if !answered => {
                    let secs = self.cfg.answer_timeout.as_secs();
                    self.end_thread(&th, &format!("no answer within {secs} s")).await;
                    return Err(failure(format!(
                        "the peer {} answered nothing within {secs} s: does it serve an agent (`awp serve-agent --acp` there)?",
                        self.cfg.peer
                    )));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let secs = self.cfg.prompt_timeout.as_secs();
                    self.end_thread(&th, &format!("no end within {secs} s")).await;
                    return Err(failure(format!("the peer's agent did not finish within {secs} s")));
                }
            };
            if ev.get("event").and_then(Value::as_str) != Some("line")
                || ev.get("dir").and_then(Value::as_str) != Some("in")
                || ev.get("th").and_then(Value::as_str) != Some(th.as_str())
                || peer_key
                    .as_deref()
                    .is_some_and(|k| ev.get("peer").and_then(Value::as_str) != Some(k))
            {
                continue;
            }
            let line = &ev["line"];
            match line["t"].as_str() {
                Some("msg") => {
                    answered = true;
                    self.relay_msg(&sid, &th, line, cx).await;
                }
                Some("state") => {
                    let note = line["note"].as_str().unwrap_or("");
                    let state = line["state"].as_str();
                    if stale_end {
                        // The late end of a cancelled prompt comes before our `working`.
                        stale_end = false;
                        if matches!(state, Some("done") | Some("failed")) {
                            continue;
                        }
                    }
                    answered = true;
                    match state {
                        Some("done") => return Ok("end_turn".into()),
                        Some("failed") => {
                            let reason = failed_reason(note);
                            if reason == "refusal" && !note.is_empty() {
                                notify(
                                    cx,
                                    &sid,
                                    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("\n[failed: {note}]")}}),
                                );
                            }
                            return Ok(reason.into());
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }

    /// Our state `failed` with `note` in `th` (the peer's served agent cancels its
    /// prompt), best effort.
    async fn end_thread(&self, th: &str, note: &str) {
        let req = Request::State {
            peer: Some(self.cfg.peer.clone()),
            th: th.to_string(),
            state: "failed".into(),
            note: Some(note.into()),
            wait_ack_ms: None,
        };
        if let Err(e) = control::request(&self.cfg.socket, &req).await {
            tracing::warn!(th, "cannot end the thread: {e}");
        }
    }

    /// One msg of the peer as `session/update`s, or a permission question to the editor.
    async fn relay_msg(&self, sid: &str, th: &str, line: &Value, cx: &ConnectionTo<acp::Client>) {
        let parts = line["parts"].as_array().cloned().unwrap_or_default();
        if let Some(q) = parts.iter().find(|p| p["mime"] == bridge::PERMISSION_MIME) {
            let req: Result<s::RequestPermissionRequest, _> = serde_json::from_value(json!({
                "sessionId": sid,
                "toolCall": q["data"]["toolCall"],
                "options": q["data"]["options"],
            }));
            let answer = match req {
                Ok(req) => {
                    match tokio::time::timeout(
                        super::serve::PERMISSION_TIMEOUT,
                        cx.send_request(req).block_task(),
                    )
                    .await
                    {
                        Ok(Ok(resp)) => match resp.outcome {
                            s::RequestPermissionOutcome::Selected(sel) => {
                                sel.option_id.0.to_string()
                            }
                            _ => "deny".into(),
                        },
                        _ => "deny".into(),
                    }
                }
                Err(_) => "deny".into(),
            };
            let _ = control::request(
                &self.cfg.socket,
                &Request::Send {
                    peer: Some(self.cfg.peer.clone()),
                    th: Some(th.to_string()),
                    subject: None,
                    re: line["id"].as_str().map(str::to_string),
                    parts: vec![json!({"k": "text", "text": answer})],
                    files: vec![],
                    wait_ack_ms: None,
                },
            )
            .await;
            return;
        }
        for p in parts {
            match p["k"].as_str() {
                Some("text") | Some("code") => {
                    if let Some(t) = p["text"].as_str() {
                        notify(
                            cx,
                            sid,
                            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": t}}),
                        );
                    }
                }
                Some("data") if p["mime"] == bridge::PLAN_MIME => {
                    notify(
                        cx,
                        sid,
                        json!({"sessionUpdate": "plan", "entries": p["data"]["entries"]}),
                    );
                }
                Some("data") => {
                    notify(
                        cx,
                        sid,
                        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": p["data"].to_string()}}),
                    );
                }
                _ => {}
            }
        }
    }
}

fn notify(cx: &ConnectionTo<acp::Client>, sid: &str, update: Value) {
    match serde_json::from_value::<s::SessionNotification>(
        json!({"sessionId": sid, "update": update}),
    ) {
        Ok(n) => {
            let _ = cx.send_notification(n);
        }
        Err(e) => tracing::warn!("cannot relay an update: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_blocks_become_parts() {
        let blocks = vec![
            json!({"type": "text", "text": "hi"}),
            json!({"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs"}),
            json!({"type": "resource", "resource": {"uri": "file:///b.py", "text": "x = 1"}}),
            json!({"type": "image", "data": "AAAA", "mimeType": "image/png"}),
        ];
        let parts = prompt_parts(&blocks);
        assert_eq!(
            parts,
            vec![
                json!({"k": "text", "text": "hi"}),
                json!({"k": "text", "text": "<file:///a.rs>"}),
                json!({"k": "code", "text": "x = 1", "lang": "py"}),
            ]
        );
    }

    #[test]
    fn failed_notes_name_stop_reasons() {
        assert_eq!(failed_reason("the agent stopped: max_tokens"), "max_tokens");
        assert_eq!(failed_reason("the agent stopped: cancelled"), "cancelled");
        assert_eq!(failed_reason("the agent stopped: refusal"), "refusal");
        assert_eq!(failed_reason("the agent process exited"), "refusal");
    }
}
