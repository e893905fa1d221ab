//! Workspace state: threads (mode, focus, messages), artifacts with every version,
//! proposals, runs; and the per-participant dedup memory of the host.
//!
//! An artifact keeps only its current data in full. Each older version keeps the recorded
//! patch that produced it from the previous one (at most the event's own size), and every
//! so often a full checkpoint ([`Artifact::data_at`], spec/artifact-threads.md §Versions):
//! a tiny edit of a big artifact grows the state by the edit, not by the artifact.
//!
//! [`WorkspaceState`] is built only from events ([`WorkspaceState::apply_event`]): the host
//! applies the events the engine produced, a replica applies the events it received, and
//! [`Workspace::replay`] applies a stored log, so all three are equal by construction.
//! [`DedupMemory`] is host-only (results are not events) and is kept in the snapshot.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::frames::{
    Actor, Change, CommandResult, Decision, DeferredKind, Event, EventEnvelope, KnownEvent, Patch,
    ThreadMode,
};
use super::patch;

/// Most recent command results remembered per workspace (notes §7, §12).
pub const DEDUP_CAPACITY: usize = 10_000;

/// Longest run of patch versions between two full checkpoints of an artifact's data: a
/// version is rebuilt by at most this many patch applications (fewer than the events a
/// node replays after its last snapshot). Spec §Versions.
pub const CHECKPOINT_EVERY: usize = 1024;

/// Ended runs kept per workspace; past it the run that ended first is forgotten (its id
/// then answers not_found `run`). Spec §Runs.
pub const MAX_ENDED_RUNS: usize = 1000;

/// A thread inside the workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thread {
    /// Id.
    pub thread_id: String,
    /// Title.
    pub title: String,
    /// edit / suggest.
    pub mode: ThreadMode,
    /// Focused artifacts, in order.
    pub focus: Vec<String>,
    /// Messages, in seq order.
    pub messages: Vec<Message>,
}

/// A posted message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Id.
    pub message_id: String,
    /// Text.
    pub content: String,
    /// Author (envelope actor).
    pub actor: Actor,
    /// Seq of `message_posted`.
    pub seq: u64,
}

/// One version of an artifact: who made it and how its data is rebuilt. Its data is
/// [`Artifact::data_at`]`(version)`; only checkpoints hold it in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Version {
    /// 1, 2, …
    pub version: u64,
    /// The event's seq.
    pub seq: u64,
    /// Who committed it.
    pub actor: Actor,
    /// Summary (`created`, the change summary, or `archived`).
    pub summary: String,
    /// Accepted proposal that produced it.
    pub proposal_id: Option<String>,
    /// Checkpoint: the full data at this version (always on version 1). Snapshots written
    /// before versions were stored as patches have it on every version, and still load.
    #[serde(default, rename = "data", skip_serializing_if = "Option::is_none")]
    checkpoint: Option<Map<String, Value>>,
    /// Otherwise the recorded patch from the previous version's data (none: the same data,
    /// e.g. `archived`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    patch: Option<Patch>,
}

impl Version {
    /// Whether this version holds its data in full.
    pub fn is_checkpoint(&self) -> bool {
        self.checkpoint.is_some()
    }
}

/// An artifact: its current data in full and every version's metadata; older data is
/// rebuilt on demand ([`Artifact::data_at`], [`Artifact::history`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ArtifactRepr")]
pub struct Artifact {
    /// Id.
    pub artifact_id: String,
    /// Kind name.
    pub kind: String,
    /// Archived artifacts are frozen.
    pub archived: bool,
    /// Versions, `versions[i].version == i + 1`.
    pub versions: Vec<Version>,
    /// The current data (normalized).
    #[serde(rename = "data")]
    current: Map<String, Value>,
    /// Patch versions since the last checkpoint, and their patches' JSON bytes.
    #[serde(skip)]
    chain_len: usize,
    #[serde(skip)]
    chain_bytes: usize,
}

/// The stored form of an [`Artifact`]; `data` (current) is absent in snapshots written
/// before versions were stored as patches: then it is the last version's data.
#[derive(Deserialize)]
struct ArtifactRepr {
    artifact_id: String,
    kind: String,
    archived: bool,
    versions: Vec<Version>,
    #[serde(default)]
    data: Option<Map<String, Value>>,
}

impl TryFrom<ArtifactRepr> for Artifact {
    type Error = String;
    fn try_from(r: ArtifactRepr) -> Result<Self, String> {
        let id = &r.artifact_id;
        for (i, v) in r.versions.iter().enumerate() {
            if v.version != i as u64 + 1 {
                return Err(format!("artifact {id}: version {} at {}", v.version, i + 1));
            }
        }
        if !r.versions.first().is_some_and(Version::is_checkpoint) {
            return Err(format!("artifact {id}: version 1 has no data"));
        }
        let mut a = Artifact {
            artifact_id: r.artifact_id,
            kind: r.kind,
            archived: r.archived,
            versions: r.versions,
            current: Map::new(),
            chain_len: 0,
            chain_bytes: 0,
        };
        a.current = match r.data {
            Some(d) => d,
            None => a
                .data_at(a.head())
                .ok_or_else(|| format!("artifact {}: versions do not rebuild", a.artifact_id))?,
        };
        for v in a.versions.iter().rev() {
            if v.checkpoint.is_some() {
                break;
            }
            if let Some(p) = &v.patch {
                a.chain_len += 1;
                a.chain_bytes += json_len(p);
            }
        }
        Ok(a)
    }
}

/// Bytes of `v` as compact JSON, counted without building the text (should serialising
/// fail, the bytes written before the error).
pub(crate) fn json_len(v: &impl Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

impl Artifact {
    fn created(id: &str, kind: &str, data: Map<String, Value>, first: Version) -> Self {
        Artifact {
            artifact_id: id.to_owned(),
            kind: kind.to_owned(),
            archived: false,
            versions: vec![Version {
                checkpoint: Some(data.clone()),
                ..first
            }],
            current: data,
            chain_len: 0,
            chain_bytes: 0,
        }
    }

    /// Append version `head + 1`, reached from the current data by the recorded patch `p`
    /// giving `data` (None: the data is unchanged). It becomes a full checkpoint when the patches since the last
    /// one reach the data's size in bytes or [`CHECKPOINT_EVERY`] in number; so the
    /// checkpoints never take more bytes than the patches before them, plus
    /// 1/[`CHECKPOINT_EVERY`] of the data per version.
    fn push(&mut self, meta: Version, change: Option<(&Patch, Map<String, Value>)>) {
        let mut v = Version {
            checkpoint: None,
            patch: None,
            ..meta
        };
        if let Some((p, data)) = change {
            let bytes = self.chain_bytes + json_len(p);
            if bytes >= json_len(&data) || self.chain_len + 1 >= CHECKPOINT_EVERY {
                v.checkpoint = Some(data.clone());
                self.chain_len = 0;
                self.chain_bytes = 0;
            } else {
                v.patch = Some(p.clone());
                self.chain_len += 1;
                self.chain_bytes = bytes;
            }
            self.current = data;
        }
        self.versions.push(v);
    }

    /// The current version number.
    pub fn head(&self) -> u64 {
        self.versions.len() as u64
    }

    /// The current data.
    pub fn data(&self) -> &Map<String, Value> {
        &self.current
    }

    /// The data at `version` (1..=head), rebuilt from the nearest checkpoint at or below it
    /// (at most [`CHECKPOINT_EVERY`] patch applications). None for a version out of range,
    /// or when a stored patch no longer applies (a corrupt snapshot).
    pub fn data_at(&self, version: u64) -> Option<Map<String, Value>> {
        if version == 0 || version > self.head() {
            return None;
        }
        if version == self.head() && !self.current.is_empty() {
            return Some(self.current.clone());
        }
        let idx = (version - 1) as usize;
        let start = self.versions[..=idx]
            .iter()
            .rposition(Version::is_checkpoint)?;
        let mut data = self.versions[start].checkpoint.clone()?;
        for v in &self.versions[start + 1..=idx] {
            if let Some(p) = &v.patch {
                data = patch::apply(&data, p).ok()?;
            }
        }
        Some(data)
    }

    /// Every version with its data, oldest first, each rebuilt from the one before (one
    /// patch application per version). Stops early if a stored patch does not apply.
    pub fn history(&self) -> impl Iterator<Item = (&Version, Map<String, Value>)> + '_ {
        let mut data: Option<Map<String, Value>> = None;
        self.versions.iter().map_while(move |v| {
            let next = match (&v.checkpoint, &v.patch, data.take()) {
                (Some(c), _, _) => c.clone(),
                (None, Some(p), Some(d)) => patch::apply(&d, p).ok()?,
                (None, None, Some(d)) => d,
                (None, _, None) => return None,
            };
            data = Some(next.clone());
            Some((v, next))
        })
    }
}

/// A proposal's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalStatus {
    /// Awaiting a response.
    Pending,
    /// Accepted.
    Accepted,
    /// Rejected.
    Rejected,
}

impl ProposalStatus {
    /// `pending` / `accepted` / `rejected`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalStatus::Pending => "pending",
            ProposalStatus::Accepted => "accepted",
            ProposalStatus::Rejected => "rejected",
        }
    }
}

/// A proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// Id.
    pub proposal_id: String,
    /// The change (as recorded in `proposal_created`).
    pub change: Change,
    /// Why.
    pub rationale: Option<String>,
    /// Context thread.
    pub thread_id: Option<String>,
    /// Run.
    pub run_id: Option<String>,
    /// Author.
    pub proposed_by: Actor,
    /// Status.
    pub status: ProposalStatus,
    /// Reviewer changes and reason, once resolved.
    pub changes: Option<Patch>,
    /// Reviewer's reason.
    pub reason: Option<String>,
    /// Resulting version on accept.
    pub version: Option<u64>,
}

/// A run's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Running.
    Running,
    /// Paused on deferred requests.
    Paused,
    /// Ended.
    Ended,
}

/// A deferred request of a run and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingRequest {
    /// Id.
    pub tool_call_id: String,
    /// question / approval.
    pub kind: DeferredKind,
    /// Arguments.
    pub args: Map<String, Value>,
    /// Whether it was answered.
    pub answered: bool,
}

/// A run (driven here by the other party's AWP thread state, see `runs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Id.
    pub run_id: String,
    /// Thread.
    pub thread_id: String,
    /// Whose run (envelope actor of `run_started`).
    pub actor: Actor,
    /// Status.
    pub state: RunState,
    /// Requests of the latest pause.
    pub requests: Vec<PendingRequest>,
    /// `completed` / `failed` / `stopped` once ended.
    pub ended: Option<super::frames::RunStatus>,
    /// Error of a failed run.
    pub error: Option<String>,
    /// Seq of its `run_ended` (the order in which ended runs are forgotten); absent in
    /// snapshots from before runs were pruned (then it counts as 0: forgotten first).
    #[serde(default)]
    pub ended_seq: Option<u64>,
}

/// Everything a replica knows, built only from events. Open runs are indexed by
/// (participant, thread) and at most [`MAX_ENDED_RUNS`] ended runs are kept; the indexes
/// are rebuilt when a snapshot loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "StateRepr")]
pub struct WorkspaceState {
    /// The workspace id (= the AWP thread `th`).
    pub workspace_id: String,
    /// Seq of the last event applied (0 = none).
    pub head_seq: u64,
    /// Threads by id.
    pub threads: BTreeMap<String, Thread>,
    /// Artifacts by id.
    pub artifacts: BTreeMap<String, Artifact>,
    /// Proposals by id.
    pub proposals: BTreeMap<String, Proposal>,
    /// Runs by id (those not ended, and the last [`MAX_ENDED_RUNS`] ended).
    pub runs: BTreeMap<String, Run>,
    /// Events of unknown types, kept opaque, by seq.
    pub unknown: BTreeMap<u64, Map<String, Value>>,
    /// Runs not ended by (participant key, thread id).
    #[serde(skip)]
    open_runs: BTreeMap<(String, String), BTreeSet<String>>,
    /// Ended runs by (ended_seq, run_id), the first to be forgotten first.
    #[serde(skip)]
    ended_runs: BTreeSet<(u64, String)>,
}

/// The stored form of a [`WorkspaceState`] (without the indexes).
#[derive(Deserialize)]
struct StateRepr {
    workspace_id: String,
    head_seq: u64,
    threads: BTreeMap<String, Thread>,
    artifacts: BTreeMap<String, Artifact>,
    proposals: BTreeMap<String, Proposal>,
    runs: BTreeMap<String, Run>,
    unknown: BTreeMap<u64, Map<String, Value>>,
}

impl From<StateRepr> for WorkspaceState {
    fn from(r: StateRepr) -> Self {
        let mut st = WorkspaceState {
            workspace_id: r.workspace_id,
            head_seq: r.head_seq,
            threads: r.threads,
            artifacts: r.artifacts,
            proposals: r.proposals,
            runs: r.runs,
            unknown: r.unknown,
            open_runs: BTreeMap::new(),
            ended_runs: BTreeSet::new(),
        };
        for run in st.runs.values() {
            if run.state == RunState::Ended {
                st.ended_runs
                    .insert((run.ended_seq.unwrap_or(0), run.run_id.clone()));
            } else {
                st.open_runs
                    .entry((run.actor.participant(), run.thread_id.clone()))
                    .or_default()
                    .insert(run.run_id.clone());
            }
        }
        st.prune_ended_runs();
        st
    }
}

/// Why an event could not be applied to a state (a corrupt or foreign log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The event's seq is not head + 1.
    #[error("event seq {got} does not follow head {head}")]
    OutOfOrder {
        /// Current head.
        head: u64,
        /// The event's seq.
        got: u64,
    },
    /// The event belongs to another workspace.
    #[error("event of workspace {got} applied to workspace {want}")]
    WrongWorkspace {
        /// Ours.
        want: String,
        /// The event's.
        got: String,
    },
    /// The event contradicts the state (missing entity, wrong version, patch fails).
    #[error("event seq {seq} does not fit the state: {why}")]
    Inconsistent {
        /// The event's seq.
        seq: u64,
        /// What did not fit.
        why: String,
    },
}

impl WorkspaceState {
    /// An empty workspace (head_seq 0).
    pub fn new(workspace_id: &str) -> Self {
        WorkspaceState {
            workspace_id: workspace_id.to_owned(),
            head_seq: 0,
            threads: BTreeMap::new(),
            artifacts: BTreeMap::new(),
            proposals: BTreeMap::new(),
            runs: BTreeMap::new(),
            unknown: BTreeMap::new(),
            open_runs: BTreeMap::new(),
            ended_runs: BTreeSet::new(),
        }
    }

    /// Apply one event: it must be the next seq of this workspace and fit the state.
    /// On error nothing changes.
    pub fn apply_event(&mut self, env: &EventEnvelope) -> Result<(), ApplyError> {
        if env.workspace_id != self.workspace_id {
            return Err(ApplyError::WrongWorkspace {
                want: self.workspace_id.clone(),
                got: env.workspace_id.clone(),
            });
        }
        if env.seq != self.head_seq + 1 {
            return Err(ApplyError::OutOfOrder {
                head: self.head_seq,
                got: env.seq,
            });
        }
        let seq = env.seq;
        let bad = |why: String| ApplyError::Inconsistent { seq, why };
        let ev = match &env.event {
            Event::Unknown(m) => {
                self.unknown.insert(seq, m.clone());
                self.head_seq = seq;
                return Ok(());
            }
            Event::Known(k) => k,
        };
        match ev {
            KnownEvent::ThreadCreated { thread_id, title } => {
                if self.threads.contains_key(thread_id) {
                    return Err(bad(format!("thread {thread_id} already exists")));
                }
                self.threads.insert(
                    thread_id.clone(),
                    Thread {
                        thread_id: thread_id.clone(),
                        title: title.clone(),
                        mode: ThreadMode::Edit,
                        focus: Vec::new(),
                        messages: Vec::new(),
                    },
                );
            }
            KnownEvent::ThreadModeChanged { thread_id, mode } => {
                let t = self.thread_mut(thread_id).map_err(bad)?;
                t.mode = *mode;
            }
            KnownEvent::FocusChanged {
                thread_id,
                artifact_ids,
            } => {
                let t = self.thread_mut(thread_id).map_err(bad)?;
                t.focus = artifact_ids.clone();
            }
            KnownEvent::MessagePosted {
                thread_id,
                message_id,
                content,
                ..
            } => {
                let t = self.thread_mut(thread_id).map_err(bad)?;
                t.messages.push(Message {
                    message_id: message_id.clone(),
                    content: content.clone(),
                    actor: env.actor.clone(),
                    seq,
                });
            }
            KnownEvent::ArtifactCreated {
                artifact_id,
                kind,
                version,
                data,
                proposal_id,
                ..
            } => {
                if self.artifacts.contains_key(artifact_id) || *version != 1 {
                    return Err(bad(format!("artifact {artifact_id} cannot be created")));
                }
                let first = Version {
                    version: 1,
                    seq,
                    actor: env.actor.clone(),
                    summary: "created".into(),
                    proposal_id: proposal_id.clone(),
                    checkpoint: None,
                    patch: None,
                };
                self.artifacts.insert(
                    artifact_id.clone(),
                    Artifact::created(artifact_id, kind, data.clone(), first),
                );
            }
            KnownEvent::ArtifactChanged {
                artifact_id,
                version,
                patch: p,
                summary,
                proposal_id,
                ..
            } => {
                let a = self.live_artifact(artifact_id, *version).map_err(bad)?;
                let data = patch::apply(a.data(), p)
                    .map_err(|r| bad(format!("recorded patch does not apply: {r:?}")))?;
                let a = self.artifacts.get_mut(artifact_id).expect("checked");
                let meta = Version {
                    version: *version,
                    seq,
                    actor: env.actor.clone(),
                    summary: summary.clone(),
                    proposal_id: proposal_id.clone(),
                    checkpoint: None,
                    patch: None,
                };
                a.push(meta, Some((p, data)));
            }
            KnownEvent::ArtifactArchived {
                artifact_id,
                version,
                proposal_id,
                ..
            } => {
                self.live_artifact(artifact_id, *version).map_err(bad)?;
                let a = self.artifacts.get_mut(artifact_id).expect("checked");
                a.archived = true;
                let meta = Version {
                    version: *version,
                    seq,
                    actor: env.actor.clone(),
                    summary: "archived".into(),
                    proposal_id: proposal_id.clone(),
                    checkpoint: None,
                    patch: None,
                };
                a.push(meta, None);
            }
            KnownEvent::ProposalCreated {
                proposal_id,
                change,
                rationale,
                thread_id,
                run_id,
            } => {
                if self.proposals.contains_key(proposal_id) {
                    return Err(bad(format!("proposal {proposal_id} already exists")));
                }
                self.proposals.insert(
                    proposal_id.clone(),
                    Proposal {
                        proposal_id: proposal_id.clone(),
                        change: change.clone(),
                        rationale: rationale.clone(),
                        thread_id: thread_id.clone(),
                        run_id: run_id.clone(),
                        proposed_by: env.actor.clone(),
                        status: ProposalStatus::Pending,
                        changes: None,
                        reason: None,
                        version: None,
                    },
                );
            }
            KnownEvent::ProposalResolved {
                proposal_id,
                decision,
                changes,
                reason,
                version,
                ..
            } => {
                let p = self
                    .proposals
                    .get_mut(proposal_id)
                    .ok_or_else(|| bad(format!("proposal {proposal_id} does not exist")))?;
                if p.status != ProposalStatus::Pending {
                    return Err(bad(format!("proposal {proposal_id} is not pending")));
                }
                p.status = match decision {
                    Decision::Accept => ProposalStatus::Accepted,
                    Decision::Reject => ProposalStatus::Rejected,
                };
                p.changes = changes.clone();
                p.reason = reason.clone();
                p.version = *version;
            }
            KnownEvent::RunStarted {
                run_id, thread_id, ..
            } => match self.runs.get_mut(run_id) {
                Some(r) if r.state == RunState::Paused => {
                    r.state = RunState::Running;
                    r.requests.clear();
                }
                Some(_) => return Err(bad(format!("run {run_id} is not paused"))),
                None => {
                    self.open_runs
                        .entry((env.actor.participant(), thread_id.clone()))
                        .or_default()
                        .insert(run_id.clone());
                    self.runs.insert(
                        run_id.clone(),
                        Run {
                            run_id: run_id.clone(),
                            thread_id: thread_id.clone(),
                            actor: env.actor.clone(),
                            state: RunState::Running,
                            requests: Vec::new(),
                            ended: None,
                            error: None,
                            ended_seq: None,
                        },
                    );
                }
            },
            KnownEvent::RunPaused {
                run_id, requests, ..
            } => {
                let r = self.run_mut(run_id).map_err(bad)?;
                if r.state == RunState::Ended {
                    return Err(bad(format!("run {run_id} has ended")));
                }
                r.state = RunState::Paused;
                r.requests = requests
                    .iter()
                    .map(|q| PendingRequest {
                        tool_call_id: q.tool_call_id.clone(),
                        kind: q.kind,
                        args: q.args.clone(),
                        answered: false,
                    })
                    .collect();
            }
            KnownEvent::DeferredAnswered {
                run_id,
                tool_call_id,
                ..
            } => {
                let r = self.run_mut(run_id).map_err(bad)?;
                let q = r
                    .requests
                    .iter_mut()
                    .find(|q| &q.tool_call_id == tool_call_id)
                    .ok_or_else(|| {
                        bad(format!("deferred request {tool_call_id} does not exist"))
                    })?;
                q.answered = true;
            }
            KnownEvent::RunEnded {
                run_id,
                status,
                error,
                ..
            } => {
                let r = self.run_mut(run_id).map_err(bad)?;
                let was_open = r.state != RunState::Ended;
                r.state = RunState::Ended;
                r.ended = Some(*status);
                r.error = error.clone();
                let key = (r.actor.participant(), r.thread_id.clone());
                let before = r.ended_seq.replace(seq);
                if was_open {
                    if let Some(ids) = self.open_runs.get_mut(&key) {
                        ids.remove(run_id);
                        if ids.is_empty() {
                            self.open_runs.remove(&key);
                        }
                    }
                } else {
                    self.ended_runs
                        .remove(&(before.unwrap_or(0), run_id.clone()));
                }
                self.ended_runs.insert((seq, run_id.clone()));
                self.prune_ended_runs();
            }
            KnownEvent::ToolCalled { .. }
            | KnownEvent::ToolReturned { .. }
            | KnownEvent::AppEvent { .. } => {}
        }
        self.head_seq = seq;
        Ok(())
    }

    /// Runs in progress as `(run_id, thread_id)` (artifactr's `welcome.active_runs`: status
    /// running, paused ones excluded).
    pub fn active_runs(&self) -> Vec<(String, String)> {
        self.runs
            .values()
            .filter(|r| r.state == RunState::Running)
            .map(|r| (r.run_id.clone(), r.thread_id.clone()))
            .collect()
    }

    /// The run of `party` in `thread_id` that has not ended (the first by run id if a
    /// host opened several), found through the index: no scan of the runs.
    pub fn open_run(&self, party: &Actor, thread_id: &str) -> Option<&Run> {
        self.open_runs
            .get(&(party.participant(), thread_id.to_owned()))?
            .iter()
            .filter_map(|id| self.runs.get(id))
            .find(|r| &r.actor == party && r.state != RunState::Ended)
    }

    /// Forget the runs that ended first beyond [`MAX_ENDED_RUNS`].
    fn prune_ended_runs(&mut self) {
        while self.ended_runs.len() > MAX_ENDED_RUNS {
            if let Some((_, id)) = self.ended_runs.pop_first() {
                self.runs.remove(&id);
            }
        }
    }

    fn thread_mut(&mut self, id: &str) -> Result<&mut Thread, String> {
        self.threads
            .get_mut(id)
            .ok_or_else(|| format!("thread {id} does not exist"))
    }

    fn run_mut(&mut self, id: &str) -> Result<&mut Run, String> {
        self.runs
            .get_mut(id)
            .ok_or_else(|| format!("run {id} does not exist"))
    }

    fn live_artifact(&self, id: &str, version: u64) -> Result<&Artifact, String> {
        let a = self
            .artifacts
            .get(id)
            .ok_or_else(|| format!("artifact {id} does not exist"))?;
        if a.archived {
            return Err(format!("artifact {id} is archived"));
        }
        if version != a.head() + 1 {
            return Err(format!(
                "artifact {id} is at version {}, event has {version}",
                a.head()
            ));
        }
        Ok(a)
    }
}

/// Results remembered per (participant, command_id), the oldest evicted first past
/// [`DEDUP_CAPACITY`]. Serializes as the list of entries, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Vec<DedupEntry>", into = "Vec<DedupEntry>")]
pub struct DedupMemory {
    order: VecDeque<(String, String)>,
    results: HashMap<(String, String), CommandResult>,
}

/// One remembered result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DedupEntry {
    /// Participant key (`external_agent:<key>`, `user:<key>`, …).
    pub participant: String,
    /// The command id.
    pub command_id: String,
    /// The first result, returned verbatim on a repeat.
    pub result: CommandResult,
}

impl From<Vec<DedupEntry>> for DedupMemory {
    fn from(v: Vec<DedupEntry>) -> Self {
        let mut m = DedupMemory::default();
        for e in v {
            m.remember(&e.participant, &e.command_id, e.result);
        }
        m
    }
}

impl From<DedupMemory> for Vec<DedupEntry> {
    fn from(mut m: DedupMemory) -> Self {
        m.order
            .drain(..)
            .filter_map(|k| {
                let result = m.results.remove(&k)?;
                Some(DedupEntry {
                    participant: k.0,
                    command_id: k.1,
                    result,
                })
            })
            .collect()
    }
}

impl DedupMemory {
    /// The remembered result of `command_id` from `participant`.
    pub fn get(&self, participant: &str, command_id: &str) -> Option<&CommandResult> {
        self.results
            .get(&(participant.to_owned(), command_id.to_owned()))
    }
    /// Remember a result (first one wins), evicting the oldest past capacity.
    pub fn remember(&mut self, participant: &str, command_id: &str, result: CommandResult) {
        let key = (participant.to_owned(), command_id.to_owned());
        if self.results.contains_key(&key) {
            return;
        }
        self.order.push_back(key.clone());
        self.results.insert(key, result);
        while self.order.len() > DEDUP_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.results.remove(&old);
            }
        }
    }
    /// Number of remembered results.
    pub fn len(&self) -> usize {
        self.order.len()
    }
    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// The host's workspace: the replicated state plus the dedup memory. Serialize it as the
/// snapshot; the event log alone rebuilds `state` ([`Workspace::replay`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workspace {
    /// State built from events.
    pub state: WorkspaceState,
    /// Results of commands, per participant.
    pub dedup: DedupMemory,
}

impl Workspace {
    /// A new, empty workspace.
    pub fn new(workspace_id: &str) -> Self {
        Workspace {
            state: WorkspaceState::new(workspace_id),
            dedup: DedupMemory::default(),
        }
    }

    /// Rebuild from a log (seq 1, 2, … in order); the dedup memory starts empty.
    pub fn replay<'a>(
        workspace_id: &str,
        events: impl IntoIterator<Item = &'a EventEnvelope>,
    ) -> Result<Self, ApplyError> {
        let mut ws = Workspace::new(workspace_id);
        for e in events {
            ws.state.apply_event(e)?;
        }
        Ok(ws)
    }
}
