//! A replica of a workspace hosted elsewhere: built only from the host's events, applied
//! strictly in `seq` order. Events after a gap are held back (at most [`MAX_HELD`]) until
//! the gap fills; [`Replica::needs_resend_from`] tells which `after_seq` to ask the host
//! to resend from (spec/artifact-threads.md §Gaps).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::frames::EventEnvelope;
use super::state::{ApplyError, WorkspaceState};

/// Most events held back after a gap; more are refused.
pub const MAX_HELD: usize = 10_000;

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
    /// Too many events held back behind a gap.
    #[error("{MAX_HELD} events already held back after seq {head}")]
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
}

impl Replica {
    /// An empty replica of `workspace_id`.
    pub fn new(workspace_id: &str) -> Self {
        Replica {
            state: WorkspaceState::new(workspace_id),
            held: BTreeMap::new(),
        }
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
            if !self.held.contains_key(&env.seq) && self.held.len() >= MAX_HELD {
                return Err(ReplicaError::TooManyHeld {
                    head: self.state.head_seq,
                });
            }
            self.held.entry(env.seq).or_insert(env);
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
            applied.push(next);
        }
        self.held.retain(|&s, _| s > self.state.head_seq);
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
}
