//! Control-socket actions of `awp artifact …` (request `{"op":"artifact","action":…,
//! "args":{…}}`, see [`crate::control::Request::Artifact`]).
//!
//! Threads, artifacts and proposals are named by full id or a unique prefix. On the host
//! a command runs at once as the node's user; on a replica it goes to the host as a
//! command msg and the answer waits for the host's result up to `wait_ms` (default
//! 10 s; then `{"queued": true}`: the result arrives later, see `awp artifact log`).

use super::super::server::{resolve_peer, Fail};
use super::super::Inner;
use crate::artifact::WorkspaceState;
use crate::store::{WsRecord, WsRole};
use crate::wire::{self, Line, PeerKey};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Default wait for a host's result, ms.
const DEFAULT_WAIT_MS: u64 = 10_000;

fn internal(e: impl std::fmt::Display) -> Fail {
    Fail::new("internal", e.to_string())
}

fn bad(msg: impl Into<String>) -> Fail {
    Fail::new("bad_request", msg)
}

fn s<'a>(args: &'a Value, k: &str) -> Option<&'a str> {
    args.get(k).and_then(Value::as_str)
}

fn need<'a>(args: &'a Value, k: &str) -> Result<&'a str, Fail> {
    s(args, k).ok_or_else(|| bad(format!("missing `{k}`")))
}

/// The one item of `ids` equal to `want` or starting with it.
fn unique<'a>(
    what: &str,
    want: &str,
    ids: impl Iterator<Item = &'a String>,
) -> Result<String, Fail> {
    let mut found: Vec<&String> = Vec::new();
    for id in ids {
        if id == want {
            return Ok(id.clone());
        }
        if id.starts_with(want) {
            found.push(id);
        }
    }
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(Fail::new("not_found", format!("no {what} {want}"))),
        _ => Err(bad(format!(
            "{what} prefix {want} is ambiguous ({} match)",
            found.len()
        ))),
    }
}

/// `caps` with each thread scope (`CAP@TH`) written out in full: `TH` may be a unique prefix
/// of an artifact thread this node hosts (a scope names one of the issuer's own threads,
/// spec/artifact-threads.md "Capabilities"). A scope that names no hosted thread, or
/// several, is refused (`not_found`, `bad_request`): a grant scoped to a thread id that
/// never matches would be signed and sent, then silently do nothing.
pub(in crate::node) fn scope_caps(inner: &Inner, caps: &[String]) -> Result<Vec<String>, Fail> {
    let mut hosted: Option<Vec<String>> = None;
    caps.iter()
        .map(|cap| {
            let Some((name, th)) = cap.split_once('@') else {
                return Ok(cap.clone());
            };
            if hosted.is_none() {
                let all = inner.store.art_workspaces().map_err(internal)?;
                hosted = Some(
                    all.into_iter()
                        .filter(|w| w.role == WsRole::Host)
                        .map(|w| w.th)
                        .collect(),
                );
            }
            let ths = hosted.as_ref().map(|v| v.iter()).into_iter().flatten();
            let th = unique("artifact thread hosted here", th, ths)?;
            Ok(format!("{name}@{th}"))
        })
        .collect()
}

fn workspace(inner: &Inner, th: &str) -> Result<WsRecord, Fail> {
    let all = inner.store.art_workspaces().map_err(internal)?;
    let ths: Vec<String> = all.iter().map(|w| w.th.clone()).collect();
    let th = unique("artifact thread", th, ths.iter())?;
    all.into_iter()
        .find(|w| w.th == th)
        .ok_or_else(|| Fail::new("not_found", th))
}

/// The current state of a workspace (host or replica).
pub(super) async fn state(inner: &Arc<Inner>, rec: &WsRecord) -> Result<WorkspaceState, Fail> {
    let arts = inner.artifacts.clone();
    let store = inner.store.clone();
    let rec = rec.clone();
    let (st, _) = tokio::task::spawn_blocking(move || {
        store.art_tx(|tx| {
            let (ws, bytes) = arts.load(tx, &rec)?;
            let st = ws.state.clone();
            arts.keep(ws, bytes);
            Ok(st)
        })
    })
    .await
    .map_err(internal)?
    .map_err(internal)?;
    Ok(st)
}

fn artifact_id(st: &WorkspaceState, want: &str) -> Result<String, Fail> {
    unique("artifact", want, st.artifacts.keys())
}

fn command_id() -> String {
    format!("cmd_{}", ulid::Ulid::generate().to_string().to_lowercase())
}

fn frame(command: Value) -> Value {
    json!({"type": "command", "command_id": command_id(), "command": command})
}

/// Run `frame` on `rec`: locally on the host, or sent to the host and awaited.
async fn submit(
    inner: &Arc<Inner>,
    rec: &WsRecord,
    frame: Value,
    wait_ms: u64,
) -> Result<Value, Fail> {
    let cid = frame.get("command_id").cloned().unwrap_or(Value::Null);
    if rec.role == WsRole::Host {
        let (mut results, events) = super::run_local(inner, &rec.th, vec![frame], None, None)
            .await
            .map_err(internal)?;
        let result = results.pop().unwrap_or(Value::Null);
        return Ok(json!({"th": rec.th, "role": "host", "result": result, "events": events.len()}));
    }
    let mut rx = inner.events.subscribe();
    send_commands(inner, rec, vec![frame]).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(ev)) => {
                let is_ours = ev.get("event").and_then(Value::as_str) == Some("artifact_result")
                    && ev.get("th").and_then(Value::as_str) == Some(rec.th.as_str())
                    && ev.get("command_id") == Some(&cid);
                if is_ours {
                    return Ok(
                        json!({"th": rec.th, "role": "replica", "result": ev.get("result")}),
                    );
                }
            }
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => continue,
            _ => {
                return Ok(
                    json!({"th": rec.th, "role": "replica", "queued": true, "command_id": cid}),
                )
            }
        }
    }
}

/// A line builder that can be held across an await.
type Builder = Box<dyn Fn(&str, &str) -> Line + Send + Sync>;

/// Queue the frames for the host of `rec`, packed several per msg
/// ([`super::pack_commands`], spec §Wire), in one transaction; flush.
pub(super) async fn send_commands(
    inner: &Arc<Inner>,
    rec: &WsRecord,
    frames: Vec<Value>,
) -> Result<(), Fail> {
    let builders: Vec<Builder> = super::pack_commands(frames)
        .into_iter()
        .map(|parts| {
            let th = rec.th.clone();
            // The builder runs once per enqueue: it hands over the parts without a copy.
            let parts = std::sync::Mutex::new(Some(parts));
            Box::new(move |id: &str, ts: &str| {
                Line::Msg(wire::Msg {
                    id: id.into(),
                    ts: ts.into(),
                    th: th.clone(),
                    re: None,
                    subject: None,
                    parts: parts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take()
                        .unwrap_or_default(),
                })
            }) as Builder
        })
        .collect();
    let refs: Vec<crate::store::LineBuilder<'_>> =
        builders.iter().map(|b| b.as_ref() as _).collect();
    inner.store.enqueue(&rec.peer, &refs).map_err(internal)?;
    drop(refs);
    drop(builders);
    inner.store.flush().await.map_err(internal)?;
    inner.outbox_changed(&rec.peer);
    Ok(())
}

fn artifact_json(a: &crate::artifact::state::Artifact) -> Value {
    let head = a.versions.last();
    json!({
        "artifact_id": a.artifact_id,
        "kind": a.kind,
        "version": a.head(),
        "archived": a.archived,
        "summary": head.map(|v| v.summary.clone()),
    })
}

/// Handle one `artifact` control request.
pub(crate) async fn handle(inner: &Arc<Inner>, action: &str, args: Value) -> Result<Value, Fail> {
    let wait_ms = args
        .get("wait_ms")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_WAIT_MS);
    match action {
        "new" => {
            let kind = need(&args, "kind")?.to_string();
            let data = args.get("data").cloned().unwrap_or_else(|| json!({}));
            if !data.is_object() {
                return Err(bad("`data` must be an object"));
            }
            let title = s(&args, "title").map(str::to_string);
            let mut cmd = json!({"type": "create_artifact", "kind": kind, "data": data});
            if let Some(id) = s(&args, "artifact_id") {
                cmd["artifact_id"] = json!(id);
            }
            match (s(&args, "th"), s(&args, "peer")) {
                (Some(th), _) => match workspace(inner, th) {
                    Ok(rec) => {
                        cmd["thread_id"] = json!(rec.th);
                        submit(inner, &rec, frame(cmd), wait_ms).await
                    }
                    Err(e) => {
                        // A plain AWP thread with a peer becomes an artifact thread hosted here.
                        let Some(t) =
                            crate::node::thread_ref::resolve(inner, None, th)?.and_then(|n| n.info)
                        else {
                            return Err(e);
                        };
                        cmd["thread_id"] = json!(t.th);
                        let (mut results, events) = super::run_local(
                            inner,
                            &t.th,
                            vec![frame(cmd)],
                            Some(t.peer),
                            title.or(t.subject),
                        )
                        .await
                        .map_err(internal)?;
                        let result = results.pop().unwrap_or(Value::Null);
                        Ok(
                            json!({"th": t.th, "role": "host", "result": result, "events": events.len()}),
                        )
                    }
                },
                (None, Some(peer)) => {
                    let peer: PeerKey = resolve_peer(inner, peer)?;
                    let th = format!("thr_{}", ulid::Ulid::generate());
                    cmd["thread_id"] = json!(th);
                    let subject = title.or_else(|| Some("artifact thread".into()));
                    let (mut results, events) =
                        super::run_local(inner, &th, vec![frame(cmd)], Some(peer), subject)
                            .await
                            .map_err(internal)?;
                    let result = results.pop().unwrap_or(Value::Null);
                    Ok(json!({"th": th, "role": "host", "result": result, "events": events.len()}))
                }
                (None, None) => Err(bad("give a peer (a new thread) or a thread")),
            }
        }
        "list" => {
            let mut out = Vec::new();
            for rec in inner.store.art_workspaces().map_err(internal)? {
                if let Some(th) = s(&args, "th") {
                    if !rec.th.starts_with(th) {
                        continue;
                    }
                }
                let st = state(inner, &rec).await?;
                let title = st.threads.get(&rec.th).map(|t| t.title.clone());
                let pending = st
                    .proposals
                    .values()
                    .filter(|p| p.status == crate::artifact::state::ProposalStatus::Pending)
                    .count();
                out.push(json!({
                    "th": rec.th,
                    "role": rec.role,
                    "peer": rec.peer.to_string(),
                    "peer_name": inner.peer_name(&rec.peer),
                    "title": title,
                    "head_seq": rec.head_seq,
                    "mode": st.threads.get(&rec.th).map(|t| t.mode),
                    "focus": st.threads.get(&rec.th).map(|t| t.focus.clone()),
                    "pending_proposals": pending,
                    "artifacts": st.artifacts.values().map(artifact_json).collect::<Vec<_>>(),
                }));
            }
            Ok(json!({"threads": out}))
        }
        "show" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let st = state(inner, &rec).await?;
            let id = artifact_id(&st, need(&args, "artifact")?)?;
            let a = &st.artifacts[&id];
            let pick = |n: u64| -> Result<&crate::artifact::state::Version, Fail> {
                a.versions.get((n as usize).wrapping_sub(1)).ok_or_else(|| {
                    Fail::new("not_found", format!("{id} has versions 1..{}", a.head()))
                })
            };
            let v = pick(
                args.get("version")
                    .and_then(Value::as_u64)
                    .unwrap_or(a.head()),
            )?;
            let mut out = json!({
                "th": rec.th,
                "artifact_id": id,
                "kind": a.kind,
                "version": v.version,
                "head": a.head(),
                "archived": a.archived,
                "data": a.data_at(v.version),
                "summary": v.summary,
                "actor": v.actor,
                "proposal_id": v.proposal_id,
                "seq": v.seq,
            });
            if let (Some(from), Some(to)) = (
                args.get("diff_from").and_then(Value::as_u64),
                args.get("diff_to").and_then(Value::as_u64),
            ) {
                out["from"] =
                    json!({"version": from, "data": pick(from).map(|v| a.data_at(v.version))?});
                out["to"] = json!({"version": to, "data": pick(to).map(|v| a.data_at(v.version))?});
            }
            Ok(out)
        }
        "edit" | "archive" | "propose" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let st = state(inner, &rec).await?;
            let change = if action == "propose" && args.get("data").is_some() {
                let mut c = json!({"type": "create_artifact", "kind": need(&args, "kind")?, "data": args["data"], "thread_id": rec.th});
                if let Some(id) = s(&args, "artifact_id") {
                    c["artifact_id"] = json!(id);
                }
                c
            } else {
                let id = artifact_id(&st, need(&args, "artifact")?)?;
                let base = match args.get("base_version").and_then(Value::as_u64) {
                    Some(b) => b,
                    None => st.artifacts[&id].head(),
                };
                if action == "archive" || args.get("archive") == Some(&json!(true)) {
                    json!({"type": "archive_artifact", "artifact_id": id, "base_version": base, "thread_id": rec.th})
                } else {
                    let patch = args
                        .get("patch")
                        .cloned()
                        .ok_or_else(|| bad("missing `patch`"))?;
                    let mut c = json!({"type": "edit_artifact", "artifact_id": id, "base_version": base, "patch": patch, "thread_id": rec.th});
                    if let Some(sm) = s(&args, "summary") {
                        c["summary"] = json!(sm);
                    }
                    c
                }
            };
            let cmd = if action == "propose" {
                json!({"type": "propose_change", "change": change, "rationale": args.get("rationale")})
            } else {
                change
            };
            submit(inner, &rec, frame(cmd), wait_ms).await
        }
        "proposals" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let st = state(inner, &rec).await?;
            let all = args.get("all") == Some(&json!(true));
            let list: Vec<Value> = st
                .proposals
                .values()
                .filter(|p| all || p.status == crate::artifact::state::ProposalStatus::Pending)
                .map(|p| {
                    json!({
                        "proposal_id": p.proposal_id,
                        "status": p.status.as_str(),
                        "artifact_id": p.change.artifact_id(),
                        "change": p.change,
                        "rationale": p.rationale,
                        "proposed_by": p.proposed_by,
                        "version": p.version,
                        "reason": p.reason,
                    })
                })
                .collect();
            Ok(json!({"th": rec.th, "proposals": list}))
        }
        "accept" | "reject" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let st = state(inner, &rec).await?;
            let pid = unique("proposal", need(&args, "proposal")?, st.proposals.keys())?;
            let cmd = json!({
                "type": "respond_to_proposal",
                "proposal_id": pid,
                "decision": action,
                "changes": args.get("changes"),
                "reason": args.get("reason"),
            });
            submit(inner, &rec, frame(cmd), wait_ms).await
        }
        "mode" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let cmd = json!({"type": "set_thread_mode", "thread_id": rec.th, "mode": need(&args, "mode")?});
            submit(inner, &rec, frame(cmd), wait_ms).await
        }
        "focus" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let st = state(inner, &rec).await?;
            let mut ids = Vec::new();
            for a in args
                .get("artifacts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let a = a.as_str().ok_or_else(|| bad("artifacts are strings"))?;
                ids.push(artifact_id(&st, a)?);
            }
            let cmd = json!({"type": "set_focus", "thread_id": rec.th, "artifact_ids": ids});
            submit(inner, &rec, frame(cmd), wait_ms).await
        }
        "log" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let after = args.get("after").and_then(Value::as_u64).unwrap_or(0);
            let limit = args
                .get("limit")
                .and_then(Value::as_u64)
                .unwrap_or(1000)
                .min(10_000) as usize;
            let events = inner
                .store
                .art_events(&rec.th, after, limit)
                .map_err(internal)?;
            let held = inner.store.art_held(&rec.th).map_err(internal)?;
            Ok(
                json!({"th": rec.th, "role": rec.role, "head_seq": rec.head_seq, "held": held, "events": events}),
            )
        }
        "commands" => {
            // Many frames at once (`{"th", "commands": [CommandFrame…]}`): on the host one
            // transaction; on a replica packed several per msg, queued in one transaction
            // and not awaited (results arrive as `artifact_result` events).
            let rec = workspace(inner, need(&args, "th")?)?;
            let frames: Vec<Value> = args
                .get("commands")
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| bad("missing `commands`"))?;
            let n = frames.len();
            if rec.role == WsRole::Host {
                let (results, events) = super::run_local(inner, &rec.th, frames, None, None)
                    .await
                    .map_err(internal)?;
                let ok = results
                    .iter()
                    .filter(|r| r.get("ok") == Some(&json!(true)))
                    .count();
                return Ok(
                    json!({"th": rec.th, "role": "host", "commands": n, "succeeded": ok, "events": events.len()}),
                );
            }
            send_commands(inner, &rec, frames).await?;
            Ok(json!({"th": rec.th, "role": "replica", "commands": n, "queued": true}))
        }
        "command" => {
            let rec = workspace(inner, need(&args, "th")?)?;
            let cmd = args
                .get("command")
                .cloned()
                .ok_or_else(|| bad("missing `command`"))?;
            let mut f = frame(cmd);
            if let Some(Value::String(c)) = args.get("command_id") {
                f["command_id"] = json!(c);
            }
            submit(inner, &rec, f, wait_ms).await
        }
        other => Err(bad(format!("unknown artifact action {other:?}"))),
    }
}
