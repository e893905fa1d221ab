//! A replica of a workspace hosted elsewhere: built only from the host's events, applied
//! strictly in `seq` order. Events after a gap are held back (at most [`MAX_HELD`] events
//! and [`MAX_HELD_BYTES`] bytes per thread) until the gap fills;
//! [`Replica::needs_resend_from`] tells which `after_seq` to ask the host to resend from.
//! A host whose log is behind the replica (its store was restored) answers the resend
//! with an error that [`resend_beyond_head`] recognizes: the replica then [`Replica::reset`]s
//! and rebuilds from seq 1 (spec/artifact-threads.md §Gaps).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::frames::EventEnvelope;
use super::state::{ApplyError, WorkspaceState};

/// Most events held back after a gap, per thread; more are refused.
pub const MAX_HELD: usize = 10_000;
/// Most bytes (events as JSON) held back after a gap, per thread: an event that would
/// pass it is refused (dropped, not stored) and comes back with the resend of the gap.
pub const MAX_HELD_BYTES: usize = 8 * 1024 * 1024;

/// Why an event was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    /// The event is of another workspace.
    #[error("event of workspace {got}, replica of {want}")]
    WrongWorkspace {
        /// Ours.
        want: String,
        /// Its.
        got: String,
    },
    /// Seq 0 (seqs start at 1).
    #[error("event seq 0")]
    ZeroSeq,
    /// Too many events (or bytes, [`MAX_HELD_BYTES`]) held back behind a gap: this one
    /// is dropped; ask for a resend once the gap is filled.
    #[error("{MAX_HELD} events or {MAX_HELD_BYTES} bytes already held back after seq {head}")]
    TooManyHeld {
        /// Last applied seq.
        head: u64,
    },
    /// The next event does not fit the state: the log and the replica disagree. The
    /// replica stays at `head_seq`; resync from scratch.
    #[error(transparent)]
    Inconsistent(#[from] ApplyError),
}

/// A replica: the state and the events held back after a gap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replica {
    /// State built from events 1..=head_seq.
    pub state: WorkspaceState,
    held: BTreeMap<u64, EventEnvelope>,
    /// JSON bytes of `held`.
    #[serde(default)]
    held_bytes: usize,
}

impl Replica {
    /// An empty replica of `workspace_id`.
    pub fn new(workspace_id: &str) -> Self {
        Replica {
            state: WorkspaceState::new(workspace_id),
            held: BTreeMap::new(),
            held_bytes: 0,
        }
    }

    /// Forget everything (state and held events) and start again from seq 1: the host's
    /// log is not the one this replica was built from (see [`resend_beyond_head`]).
    pub fn reset(&mut self) {
        *self = Replica::new(&self.state.workspace_id);
    }

    /// Last applied seq.
    pub fn head_seq(&self) -> u64 {
        self.state.head_seq
    }

    /// Receive one event. Returns the events applied now, in seq order (this one and any
    /// held ones it unblocked; empty when it was a duplicate or was held back). A seq at
    /// or below the head is a duplicate and ignored; one above head + 1 is held back.
    pub fn receive(&mut self, env: EventEnvelope) -> Result<Vec<EventEnvelope>, ReplicaError> {
        if env.workspace_id != self.state.workspace_id {
            return Err(ReplicaError::WrongWorkspace {
                want: self.state.workspace_id.clone(),
                got: env.workspace_id,
            });
        }
        if env.seq == 0 {
            return Err(ReplicaError::ZeroSeq);
        }
        if env.seq <= self.state.head_seq {
            return Ok(Vec::new());
        }
        if env.seq > self.state.head_seq + 1 {
            if self.held.contains_key(&env.seq) {
                return Ok(Vec::new());
            }
            let bytes = env_bytes(&env);
            if self.held.len() >= MAX_HELD || self.held_bytes + bytes > MAX_HELD_BYTES {
                return Err(ReplicaError::TooManyHeld {
                    head: self.state.head_seq,
                });
            }
            self.held_bytes += bytes;
            self.held.insert(env.seq, env);
            return Ok(Vec::new());
        }
        let mut applied = Vec::new();
        self.state.apply_event(&env)?;
        applied.push(env);
        while let Some(next) = self.held.remove(&(self.state.head_seq + 1)) {
            if let Err(e) = self.state.apply_event(&next) {
                self.held.insert(next.seq, next);
                return Err(e.into());
            }
            self.held_bytes = self.held_bytes.saturating_sub(env_bytes(&next));
            applied.push(next);
        }
        Ok(applied)
    }

    /// `Some(after_seq)` when events are held back behind a gap: ask the host to resend
    /// every event with seq > after_seq (= the last applied seq). None when there is no gap.
    pub fn needs_resend_from(&self) -> Option<u64> {
        (!self.held.is_empty()).then_some(self.state.head_seq)
    }

    /// Number of events held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Bytes (as JSON) of the events held back.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}

fn env_bytes(env: &EventEnvelope) -> usize {
    serde_json::to_vec(env).map_or(0, |b| b.len())
}

/// The host's head when `frame` (the data of an error part from the host) says that a
/// resend after `after_seq` asked for more than the host has: `{"type": "error",
/// "message": "resend after <after_seq>: head is <head>"}` with head < after_seq. Then
/// the host's log is not the one the replica was built from (e.g. its store was
/// restored from a backup): [`Replica::reset`] and ask again from seq 0. None for any
/// other frame, and for an answer to an older request (another `after_seq`).
pub fn resend_beyond_head(frame: &Value, after_seq: u64) -> Option<u64> {
    if frame.get("type").and_then(Value::as_str) != Some("error") {
        return None;
    }
    let msg = frame.get("message")?.as_str()?;
    let (after, head) = msg
        .strip_prefix("resend after ")?
        .split_once(": head is ")?;
    let after: u64 = after.parse().ok()?;
    let head: u64 = head.parse().ok()?;
    (after == after_seq && head < after).then_some(head)
}
