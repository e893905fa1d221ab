//! Run events from the other party's AWP thread state (spec/artifact-threads.md §Runs):
//!
//! | AWP `state` | run events (committed with the party as actor) |
//! |---|---|
//! | `working` | `run_started` (trigger `api` for a new run, `resume` after a pause); nothing if running |
//! | `waiting` with a note | `run_paused` with one question request `{tool_name: "ask", args: {question: note}}` (after a `run_started` if no run is open) |
//! | `done` | `run_ended` `completed` (if a run is open) |
//! | `failed` | `run_ended` `failed`, `error` = the note (if a run is open) |
//! | anything else, `waiting` without a note | nothing |
//!
//! A party has at most one open run per thread. Commit the returned events with
//! `engine::commit(ws, party, now_us, ids, events)`.

use serde_json::{Map, Value};

use super::engine::{new_id, IdSource};
use super::frames::{Actor, DeferredKind, DeferredRequest, KnownEvent, RunStatus, RunTrigger};
use super::state::{RunState, WorkspaceState};

/// Tool name of the question a `waiting` state asks.
pub const ASK_TOOL: &str = "ask";

/// The events that the AWP state `state` (with its optional `note`) of `party` in the
/// artifactr thread `thread_id` causes, given the current state. Empty when nothing changes.
pub fn on_peer_state(
    st: &WorkspaceState,
    party: &Actor,
    thread_id: &str,
    state: &str,
    note: Option<&str>,
    ids: &mut dyn IdSource,
) -> Vec<KnownEvent> {
    let open = st.open_run(party, thread_id);
    let note = note.filter(|n| !n.is_empty());
    let mut out = Vec::new();
    match state {
        "working" => match open {
            None => out.push(KnownEvent::RunStarted {
                run_id: new_id(ids, "run"),
                thread_id: thread_id.to_owned(),
                trigger: RunTrigger::Api,
            }),
            Some(r) if r.state == RunState::Paused => out.push(KnownEvent::RunStarted {
                run_id: r.run_id.clone(),
                thread_id: thread_id.to_owned(),
                trigger: RunTrigger::Resume,
            }),
            Some(_) => {}
        },
        "waiting" => {
            let Some(note) = note else { return out };
            let run_id = match open {
                Some(r) => {
                    let same_question = r.state == RunState::Paused
                        && r.requests
                            .iter()
                            .any(|q| q.args.get("question").and_then(Value::as_str) == Some(note));
                    if same_question {
                        return out;
                    }
                    r.run_id.clone()
                }
                None => {
                    let run_id = new_id(ids, "run");
                    out.push(KnownEvent::RunStarted {
                        run_id: run_id.clone(),
                        thread_id: thread_id.to_owned(),
                        trigger: RunTrigger::Api,
                    });
                    run_id
                }
            };
            let mut args = Map::new();
            args.insert("question".into(), Value::String(note.to_owned()));
            out.push(KnownEvent::RunPaused {
                run_id,
                thread_id: thread_id.to_owned(),
                requests: vec![DeferredRequest {
                    tool_call_id: new_id(ids, "call"),
                    tool_name: ASK_TOOL.into(),
                    kind: DeferredKind::Question,
                    args,
                }],
            });
        }
        "done" | "failed" => {
            if let Some(r) = open {
                let failed = state == "failed";
                out.push(KnownEvent::RunEnded {
                    run_id: r.run_id.clone(),
                    thread_id: thread_id.to_owned(),
                    status: if failed {
                        RunStatus::Failed
                    } else {
                        RunStatus::Completed
                    },
                    error: if failed {
                        note.map(str::to_owned)
                    } else {
                        None
                    },
                    usage: None,
                });
            }
        }
        _ => {}
    }
    out
}
