//! The command engine: one command frame, for one actor with one capability set, at one
//! instant → a [`CommandResult`] and the events it appended. Pure: the time and the random
//! bytes for ids come in through [`Context`].
//!
//! Rules are artifactr's (`../shared/artifactr-notes.md`), in its order of checks (§1):
//! NUL in command_id (not remembered) → dedup per participant → NUL anywhere →
//! capabilities (the `authorize` hook: `artifact:resolve` for respond_to_proposal,
//! `artifact:admin` for create_thread, set_thread_mode, set_focus) → registered kind →
//! core rules (§3, §4, §5). Without `artifact:write` an external agent's create, edit and
//! archive become proposals, as for a kind whose write policy is `propose`.
//!
//! The engine never mutates state directly: it computes events from the current state and
//! applies them with [`WorkspaceState::apply_event`], the function replicas and replay
//! use, so a replica built from the events equals the host's state. A rejected command
//! appends nothing and changes nothing (except that its result is remembered). The state
//! is never copied per command.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::caps::{CapSet, ADMIN, RESOLVE};
use super::frames::{
    Actor, AppliedTag, ArchiveArtifact, Change, Command, CommandFrame, CommandResult,
    CreateArtifact, Decision, DeferredKind, EditArtifact, ErrorFrame, ErrorTag, Event,
    EventEnvelope, EventTag, KnownEvent, Outcome, Patch, ProposedTag, RecordedTag, Rejection,
    ResolvedTag, ThreadMode,
};
use super::kinds::{Kind, WritePolicy};
use super::patch;
use super::state::{ApplyError, Artifact, ProposalStatus, RunState, Workspace, WorkspaceState};

/// Largest integer artifactr accepts for seq, versions, counts (notes §12).
pub const MAX_INT: u64 = i64::MAX as u64;

/// A source of random bytes for generated ids (`art_`, `thr_`, `run_`, `prp_`, `msg_` + 16
/// hex of 8 bytes) and event ids (UUID4 of 16 bytes). The node passes a CSPRNG; tests
/// pass [`SeededIds`].
pub trait IdSource {
    /// Fill `buf` with random bytes.
    fn fill(&mut self, buf: &mut [u8]);
}

/// Any `rand` generator is an id source (the node passes `rand::rngs::OsRng`).
impl<R: rand::RngCore> IdSource for R {
    fn fill(&mut self, buf: &mut [u8]) {
        self.fill_bytes(buf);
    }
}

/// A deterministic [`IdSource`] (SplitMix64 from a seed), for tests and reproducible runs.
#[derive(Debug, Clone)]
pub struct SeededIds(pub u64);

impl IdSource for SeededIds {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf.iter_mut() {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            *b = (z ^ (z >> 31)) as u8;
        }
    }
}

/// `<prefix>_` + 16 lowercase hex (8 random bytes), notes §10.
pub fn new_id(ids: &mut dyn IdSource, prefix: &str) -> String {
    let mut b = [0u8; 8];
    ids.fill(&mut b);
    let mut s = String::with_capacity(prefix.len() + 17);
    s.push_str(prefix);
    s.push('_');
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// A UUID4 string from 16 random bytes (event envelope `id`).
pub fn new_uuid(ids: &mut dyn IdSource) -> String {
    let mut b = [0u8; 16];
    ids.fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Envelope `ts` from Unix microseconds: `YYYY-MM-DDTHH:MM:SSZ`, with `.ffffff` only when
/// the microseconds are non-zero (notes §8). Clamped to years 1970–9999.
pub fn format_ts(unix_us: i64) -> String {
    const MAX_US: i64 = 253_402_300_799_999_999;
    let us = unix_us.clamp(0, MAX_US);
    let dt = time::OffsetDateTime::from_unix_timestamp_nanos(us as i128 * 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let base = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    match dt.microsecond() {
        0 => format!("{base}Z"),
        m => format!("{base}.{m:06}Z"),
    }
}

/// Everything a command runs with besides the workspace.
pub struct Context<'a> {
    /// The committer: `ExternalAgent{client_id: peer key, name: hello name}` for a remote
    /// peer, `User{id: host key}` for the host's own CLI.
    pub actor: Actor,
    /// Its capabilities in this workspace ([`CapSet::all`] for the host's user).
    pub caps: CapSet,
    /// Now, Unix microseconds (envelope `ts`).
    pub now_us: i64,
    /// Random bytes for generated ids.
    pub ids: &'a mut dyn IdSource,
}

/// Parse a command frame from JSON as received (a data part's `data`), with artifactr's
/// model limits (§12): command_id, content ≥ 1 char; edits ≥ 1; base_version in
/// 1..=2^63−1; ids of things being created non-empty when given. Failure is the
/// `error` frame `not a command frame: <reason>`; no command_result is due.
pub fn parse_command_frame(v: &Value) -> Result<CommandFrame, ErrorFrame> {
    let frame = CommandFrame::deserialize(v).map_err(|e| ErrorFrame {
        tag: ErrorTag,
        message: format!("not a command frame: {e}"),
    })?;
    check_limits(&frame).map_err(|why| ErrorFrame {
        tag: ErrorTag,
        message: format!("not a command frame: {why}"),
    })?;
    Ok(frame)
}

fn check_limits(f: &CommandFrame) -> Result<(), String> {
    if f.command_id.is_empty() {
        return Err("command_id: String should have at least 1 character".into());
    }
    let nonempty = |name: &str, v: &Option<String>| match v {
        Some(s) if s.is_empty() => Err(format!("{name}: String should have at least 1 character")),
        _ => Ok(()),
    };
    let base = |b: u64| {
        if (1..=MAX_INT).contains(&b) {
            Ok(())
        } else {
            Err("base_version: Input should be greater than or equal to 1".to_string())
        }
    };
    let patch_ok = |p: &Patch| match p {
        Patch::TextEdits { edits, .. } if edits.is_empty() => {
            Err("edits: List should have at least 1 item".to_string())
        }
        _ => Ok(()),
    };
    let create_ok = |c: &CreateArtifact| {
        nonempty("artifact_id", &c.artifact_id)?;
        nonempty("proposal_id", &c.proposal_id)
    };
    let edit_ok = |c: &EditArtifact| {
        base(c.base_version)?;
        patch_ok(&c.patch)?;
        nonempty("proposal_id", &c.proposal_id)
    };
    let archive_ok = |c: &ArchiveArtifact| {
        base(c.base_version)?;
        nonempty("proposal_id", &c.proposal_id)
    };
    match &f.command {
        Command::CreateArtifact(c) => create_ok(c),
        Command::EditArtifact(c) => edit_ok(c),
        Command::ArchiveArtifact(c) => archive_ok(c),
        Command::ProposeChange(p) => {
            nonempty("proposal_id", &p.proposal_id)?;
            match &p.change {
                Change::CreateArtifact(c) => create_ok(c),
                Change::EditArtifact(c) => edit_ok(c),
                Change::ArchiveArtifact(c) => archive_ok(c),
            }
        }
        Command::RespondToProposal(r) => r.changes.as_ref().map_or(Ok(()), patch_ok),
        Command::CreateThread(c) => nonempty("thread_id", &c.thread_id),
        Command::PostMessage(m) => {
            if m.content.is_empty() {
                return Err("content: String should have at least 1 character".into());
            }
            nonempty("message_id", &m.message_id)
        }
        _ => Ok(()),
    }
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

fn nul_rejection() -> Rejection {
    Rejection::validation("text cannot hold a NUL character", Vec::new())
}

/// What a successful command yields before seqs are assigned.
enum Done {
    Applied {
        artifact_id: String,
        version: u64,
    },
    Proposed {
        proposal_id: String,
    },
    Resolved {
        proposal_id: String,
        decision: Decision,
        version: Option<u64>,
    },
    Recorded,
}

/// Apply one command frame (notes §1). Returns the result (also remembered for dedup,
/// except for a NUL in `command_id`) and the events appended, with consecutive seqs from
/// `head_seq + 1`. A repeated `command_id` from the same participant returns the first
/// result and no events.
pub fn apply(
    ws: &mut Workspace,
    ctx: &mut Context<'_>,
    frame: &CommandFrame,
) -> (CommandResult, Vec<EventEnvelope>) {
    let cid = frame.command_id.as_str();
    if cid.contains('\0') {
        return (CommandResult::rejected(cid, nul_rejection()), Vec::new());
    }
    let participant = ctx.actor.participant();
    if let Some(r) = ws.dedup.get(&participant, cid) {
        return (r.clone(), Vec::new());
    }
    let (result, envs) = match run(&ws.state, ctx, frame) {
        Err(rej) => (CommandResult::rejected(cid, rej), Vec::new()),
        Ok((done, events)) => {
            let envs = envelopes(&ws.state, &ctx.actor, ctx.now_us, ctx.ids, events);
            match apply_in_place(&mut ws.state, envs) {
                Ok(envs) => {
                    let seq = envs.last().map(|e| e.seq);
                    (CommandResult::ok(cid, outcome(done, seq)), envs)
                }
                // Only if the engine and apply_event disagree (a bug, which the property
                // tests look for): reported, never a panic. The events applied before the
                // failing one are returned so that the log stays equal to the state.
                Err(CommitError { error, applied }) => {
                    debug_assert!(false, "an engine event does not apply: {error}");
                    let why = format!("command {cid} failed on the server: {error}");
                    (
                        CommandResult::rejected(cid, Rejection::invalid_state(why)),
                        applied,
                    )
                }
            }
        }
    };
    ws.dedup.remember(&participant, cid, result.clone());
    (result, envs)
}

/// Events that did not all apply: `error` for the first that failed, `applied` = those
/// before it, which are in the state and must go to the log.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error} ({} events applied before it)", applied.len())]
pub struct CommitError {
    /// Why the failing event did not apply.
    pub error: ApplyError,
    /// Events applied before it, in seq order.
    pub applied: Vec<EventEnvelope>,
}

/// Append events the host causes itself (run events from AWP thread states, see `runs`),
/// committed by `actor` at `now_us`, with the next seqs. The events must be computed from
/// the current state, as `runs::on_peer_state` does; then they all apply. Otherwise the
/// error names the first that failed and the ones applied before it.
pub fn commit(
    ws: &mut Workspace,
    actor: &Actor,
    now_us: i64,
    ids: &mut dyn IdSource,
    events: Vec<KnownEvent>,
) -> Result<Vec<EventEnvelope>, CommitError> {
    let envs = envelopes(&ws.state, actor, now_us, ids, events);
    apply_in_place(&mut ws.state, envs)
}

/// Apply envelopes in order without copying the state (artifacts keep every version).
fn apply_in_place(
    st: &mut WorkspaceState,
    envs: Vec<EventEnvelope>,
) -> Result<Vec<EventEnvelope>, CommitError> {
    let mut applied = Vec::with_capacity(envs.len());
    for e in envs {
        if let Err(error) = st.apply_event(&e) {
            return Err(CommitError { error, applied });
        }
        applied.push(e);
    }
    Ok(applied)
}

fn envelopes(
    st: &WorkspaceState,
    actor: &Actor,
    now_us: i64,
    ids: &mut dyn IdSource,
    events: Vec<KnownEvent>,
) -> Vec<EventEnvelope> {
    let ts = format_ts(now_us);
    events
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let event = Event::Known(k);
            EventEnvelope {
                seq: st.head_seq + 1 + i as u64,
                id: new_uuid(ids),
                ts: ts.clone(),
                workspace_id: st.workspace_id.clone(),
                thread_id: event.thread_id().map(str::to_owned),
                run_id: event.run_id().map(str::to_owned),
                actor: actor.clone(),
                traceparent: None,
                event,
                tag: EventTag,
            }
        })
        .collect()
}

fn outcome(done: Done, seq: Option<u64>) -> Outcome {
    match done {
        Done::Applied {
            artifact_id,
            version,
        } => Outcome::Applied {
            seq,
            tag: AppliedTag,
            artifact_id,
            version,
        },
        Done::Proposed { proposal_id } => Outcome::Proposed {
            seq,
            tag: ProposedTag,
            proposal_id,
        },
        Done::Resolved {
            proposal_id,
            decision,
            version,
        } => Outcome::Resolved {
            seq,
            tag: ResolvedTag,
            proposal_id,
            decision,
            version,
        },
        Done::Recorded => Outcome::Recorded {
            seq,
            tag: RecordedTag,
        },
    }
}

fn forbidden(action: &str, cap: &str) -> Rejection {
    Rejection::Forbidden {
        message: format!("artifactr:{action} is refused in this workspace"),
        cap: Some(cap.to_owned()),
    }
}

/// Fill the ids the server generates when omitted (pydantic default factories, so every
/// one is drawn, used or not).
fn fill_ids(cmd: &mut Command, ids: &mut dyn IdSource) {
    fn fill(slot: &mut Option<String>, ids: &mut dyn IdSource, prefix: &str) {
        if slot.is_none() {
            *slot = Some(new_id(ids, prefix));
        }
    }
    fn fill_change(c: &mut Change, ids: &mut dyn IdSource) {
        match c {
            Change::CreateArtifact(c) => {
                fill(&mut c.artifact_id, ids, "art");
                fill(&mut c.proposal_id, ids, "prp");
            }
            Change::EditArtifact(c) => fill(&mut c.proposal_id, ids, "prp"),
            Change::ArchiveArtifact(c) => fill(&mut c.proposal_id, ids, "prp"),
        }
    }
    match cmd {
        Command::CreateArtifact(c) => {
            fill(&mut c.artifact_id, ids, "art");
            fill(&mut c.proposal_id, ids, "prp");
        }
        Command::EditArtifact(c) => fill(&mut c.proposal_id, ids, "prp"),
        Command::ArchiveArtifact(c) => fill(&mut c.proposal_id, ids, "prp"),
        Command::ProposeChange(p) => {
            fill_change(&mut p.change, ids);
            fill(&mut p.proposal_id, ids, "prp");
        }
        Command::CreateThread(c) => fill(&mut c.thread_id, ids, "thr"),
        Command::PostMessage(m) => fill(&mut m.message_id, ids, "msg"),
        _ => {}
    }
}

type Step = Result<(Done, Vec<KnownEvent>), Rejection>;

fn run(st: &WorkspaceState, ctx: &mut Context<'_>, frame: &CommandFrame) -> Step {
    // A typed frame built in code gets the same limits as a parsed one.
    if let Err(why) = check_limits(frame) {
        return Err(Rejection::validation(why, Vec::new()));
    }
    let mut cmd = frame.command.clone();
    fill_ids(&mut cmd, ctx.ids);
    // §1 step 4: NUL in any string of the command.
    if has_nul(&serde_json::to_value(&cmd).unwrap_or(Value::Null)) {
        return Err(nul_rejection());
    }
    // §1 step 5: the authorize hook = AWP capabilities.
    let action = cmd.type_name();
    match &cmd {
        Command::RespondToProposal(_) if !ctx.caps.resolve => {
            return Err(forbidden(action, RESOLVE))
        }
        Command::CreateThread(_) | Command::SetThreadMode(_) | Command::SetFocus(_)
            if !ctx.caps.admin =>
        {
            return Err(forbidden(action, ADMIN))
        }
        _ => {}
    }
    // §1 step 6: the app's accepted kinds.
    let kind_name = match &cmd {
        Command::CreateArtifact(c) => Some(c.kind.as_str()),
        Command::ProposeChange(p) => match &p.change {
            Change::CreateArtifact(c) => Some(c.kind.as_str()),
            _ => None,
        },
        _ => None,
    };
    if let Some(k) = kind_name {
        if Kind::by_name(k).is_none() {
            return Err(Rejection::not_found("artifact type", k));
        }
    }
    let r = Rules {
        st,
        actor: &ctx.actor,
        caps: ctx.caps,
    };
    match cmd {
        Command::CreateThread(c) => {
            let id = c.thread_id.unwrap_or_default();
            if st.threads.contains_key(&id) {
                return Err(Rejection::invalid_state(format!(
                    "thread {id} already exists"
                )));
            }
            Ok((
                Done::Recorded,
                vec![KnownEvent::ThreadCreated {
                    thread_id: id,
                    title: c.title,
                }],
            ))
        }
        Command::SetThreadMode(c) => {
            let t = r.thread(&c.thread_id)?;
            let ev = (t.mode != c.mode).then(|| KnownEvent::ThreadModeChanged {
                thread_id: c.thread_id.clone(),
                mode: c.mode,
            });
            Ok((Done::Recorded, ev.into_iter().collect()))
        }
        Command::SetFocus(c) => {
            let t = r.thread(&c.thread_id)?;
            let mut ids: Vec<String> = Vec::new();
            for a in &c.artifact_ids {
                if !st.artifacts.contains_key(a) {
                    return Err(Rejection::not_found("artifact", a));
                }
                if !ids.contains(a) {
                    ids.push(a.clone());
                }
            }
            let ev = (t.focus != ids).then(|| KnownEvent::FocusChanged {
                thread_id: c.thread_id.clone(),
                artifact_ids: ids,
            });
            Ok((Done::Recorded, ev.into_iter().collect()))
        }
        Command::PostMessage(m) => {
            r.thread(&m.thread_id)?;
            let id = m.message_id.unwrap_or_default();
            let used = st
                .threads
                .values()
                .any(|t| t.messages.iter().any(|x| x.message_id == id));
            if used {
                return Err(Rejection::invalid_state(format!(
                    "message {id} already exists"
                )));
            }
            Ok((
                Done::Recorded,
                vec![KnownEvent::MessagePosted {
                    thread_id: m.thread_id,
                    message_id: id,
                    content: m.content,
                    run_id: None,
                }],
            ))
        }
        Command::CreateArtifact(c) => r.create(c),
        Command::EditArtifact(c) => r.edit(c),
        Command::ArchiveArtifact(c) => r.archive(c),
        Command::ProposeChange(p) => {
            let ctx_thread = p
                .change
                .thread_id()
                .map(str::to_owned)
                .or_else(|| r.own_thread());
            r.propose(
                p.proposal_id.unwrap_or_default(),
                p.change,
                p.rationale,
                ctx_thread,
            )
        }
        Command::RespondToProposal(c) => r.respond(c),
        Command::AnswerDeferred(c) => {
            let run = st
                .runs
                .get(&c.run_id)
                .ok_or_else(|| Rejection::not_found("run", &c.run_id))?;
            if run.state != RunState::Paused {
                return Err(Rejection::invalid_state(format!(
                    "run {} is not paused",
                    c.run_id
                )));
            }
            let q = run
                .requests
                .iter()
                .find(|q| q.tool_call_id == c.tool_call_id)
                .ok_or_else(|| Rejection::not_found("deferred request", &c.tool_call_id))?;
            if q.answered {
                return Err(Rejection::invalid_state(format!(
                    "deferred request {} is already answered",
                    c.tool_call_id
                )));
            }
            match (q.kind, c.approved) {
                (DeferredKind::Approval, None) => {
                    return Err(Rejection::invalid_state(format!(
                        "deferred request {} is an approval: approved is required",
                        c.tool_call_id
                    )))
                }
                (DeferredKind::Question, Some(_)) => {
                    return Err(Rejection::invalid_state(format!(
                        "deferred request {} is a question: approved must be null",
                        c.tool_call_id
                    )))
                }
                _ => {}
            }
            Ok((
                Done::Recorded,
                vec![KnownEvent::DeferredAnswered {
                    run_id: c.run_id,
                    thread_id: run.thread_id.clone(),
                    tool_call_id: c.tool_call_id,
                    answer: c.answer,
                    approved: c.approved,
                }],
            ))
        }
        // Runs here are the other party's work, never running in this process (§3).
        Command::StopRun(super::frames::StopRun { run_id })
        | Command::WatchRun(super::frames::WatchRun { run_id }) => {
            if !st.runs.contains_key(&run_id) {
                return Err(Rejection::not_found("run", &run_id));
            }
            Err(Rejection::not_found("running run", &run_id))
        }
    }
}

struct Rules<'a> {
    st: &'a WorkspaceState,
    actor: &'a Actor,
    caps: CapSet,
}

impl Rules<'_> {
    fn thread(&self, id: &str) -> Result<&super::state::Thread, Rejection> {
        self.st
            .threads
            .get(id)
            .ok_or_else(|| Rejection::not_found("thread", id))
    }

    fn own_thread(&self) -> Option<String> {
        match self.actor {
            Actor::Agent { thread_id, .. } => Some(thread_id.clone()),
            _ => None,
        }
    }

    fn own_run(&self) -> Option<String> {
        match self.actor {
            Actor::Agent { run_id, .. } => run_id.clone(),
            _ => None,
        }
    }

    /// The context thread and whether the actor must propose (notes §2).
    fn must_propose(
        &self,
        kind: Kind,
        thread_id: Option<&str>,
    ) -> Result<(bool, Option<String>), Rejection> {
        let ctx_thread = thread_id.map(str::to_owned).or_else(|| self.own_thread());
        if !self.actor.is_agent() {
            return Ok((false, ctx_thread));
        }
        if kind.write_policy() == WritePolicy::Propose || !self.caps.write {
            return Ok((true, ctx_thread));
        }
        match &ctx_thread {
            Some(t) => {
                let th = self.thread(t)?;
                Ok((th.mode == ThreadMode::Suggest, ctx_thread))
            }
            None => Ok((false, None)),
        }
    }

    fn artifact(&self, id: &str) -> Result<&Artifact, Rejection> {
        self.st
            .artifacts
            .get(id)
            .ok_or_else(|| Rejection::not_found("artifact", id))
    }

    fn live(&self, id: &str) -> Result<&Artifact, Rejection> {
        let a = self.artifact(id)?;
        if a.archived {
            return Err(Rejection::invalid_state(format!(
                "artifact {id} is archived"
            )));
        }
        Ok(a)
    }

    fn at_base(&self, id: &str, base: u64) -> Result<&Artifact, Rejection> {
        let a = self.live(id)?;
        if a.head() != base {
            return Err(Rejection::version_conflict(id, base, a.head()));
        }
        Ok(a)
    }

    fn kind_of(a: &Artifact) -> Result<Kind, Rejection> {
        Kind::by_name(&a.kind).ok_or_else(|| Rejection::not_found("artifact type", &a.kind))
    }

    /// Validate a new artifact; returns its normalized data.
    fn check_create(&self, c: &CreateArtifact) -> Result<(Kind, Map<String, Value>), Rejection> {
        let kind =
            Kind::by_name(&c.kind).ok_or_else(|| Rejection::not_found("artifact type", &c.kind))?;
        let id = c.artifact_id.as_deref().unwrap_or_default();
        if self.st.artifacts.contains_key(id) {
            return Err(Rejection::invalid_state(format!(
                "artifact {id} already exists"
            )));
        }
        Ok((kind, kind.normalize(&c.data)?))
    }

    fn create(&self, c: CreateArtifact) -> Step {
        let kind =
            Kind::by_name(&c.kind).ok_or_else(|| Rejection::not_found("artifact type", &c.kind))?;
        let (must, ctx_thread) = self.must_propose(kind, c.thread_id.as_deref())?;
        if must {
            let pid = c.proposal_id.clone().unwrap_or_default();
            return self.propose(pid, Change::CreateArtifact(c), None, ctx_thread);
        }
        let (_, data) = self.check_create(&c)?;
        let id = c.artifact_id.unwrap_or_default();
        Ok((
            Done::Applied {
                artifact_id: id.clone(),
                version: 1,
            },
            vec![KnownEvent::ArtifactCreated {
                artifact_id: id,
                kind: c.kind,
                version: 1,
                data,
                thread_id: c.thread_id,
                run_id: self.own_run(),
                proposal_id: None,
            }],
        ))
    }

    fn edit(&self, c: EditArtifact) -> Step {
        let a = self.at_base(&c.artifact_id, c.base_version)?;
        let kind = Self::kind_of(a)?;
        let (must, ctx_thread) = self.must_propose(kind, c.thread_id.as_deref())?;
        if must {
            let pid = c.proposal_id.clone().unwrap_or_default();
            return self.propose(pid, Change::EditArtifact(c), None, ctx_thread);
        }
        let (recorded, _) = compute_edit(a, kind, &c.patch, None)?;
        let version = a.head() + 1;
        Ok((
            Done::Applied {
                artifact_id: c.artifact_id.clone(),
                version,
            },
            vec![KnownEvent::ArtifactChanged {
                artifact_id: c.artifact_id,
                kind: a.kind.clone(),
                version,
                summary: summary_of(c.summary.as_deref(), &c.patch),
                patch: recorded,
                thread_id: c.thread_id,
                run_id: self.own_run(),
                proposal_id: None,
            }],
        ))
    }

    fn archive(&self, c: ArchiveArtifact) -> Step {
        let a = self.at_base(&c.artifact_id, c.base_version)?;
        let kind = Self::kind_of(a)?;
        let (must, ctx_thread) = self.must_propose(kind, c.thread_id.as_deref())?;
        if must {
            let pid = c.proposal_id.clone().unwrap_or_default();
            return self.propose(pid, Change::ArchiveArtifact(c), None, ctx_thread);
        }
        let version = a.head() + 1;
        Ok((
            Done::Applied {
                artifact_id: c.artifact_id.clone(),
                version,
            },
            vec![KnownEvent::ArtifactArchived {
                artifact_id: c.artifact_id,
                kind: a.kind.clone(),
                version,
                thread_id: c.thread_id,
                run_id: self.own_run(),
                proposal_id: None,
            }],
        ))
    }

    /// §4: a new proposal, dry-run now.
    fn propose(
        &self,
        proposal_id: String,
        mut change: Change,
        rationale: Option<String>,
        ctx_thread: Option<String>,
    ) -> Step {
        if self.st.proposals.contains_key(&proposal_id) {
            return Err(Rejection::invalid_state(format!(
                "proposal {proposal_id} already exists"
            )));
        }
        match &mut change {
            Change::CreateArtifact(c) => {
                self.check_create(c)?;
            }
            Change::EditArtifact(c) => {
                let a = self.at_base(&c.artifact_id, c.base_version)?;
                let kind = Self::kind_of(a)?;
                compute_edit(a, kind, &c.patch, None)?;
                if c.summary.as_deref().unwrap_or("").is_empty() {
                    c.summary = Some(patch::summarize(&c.patch));
                }
            }
            Change::ArchiveArtifact(c) => {
                self.at_base(&c.artifact_id, c.base_version)?;
            }
        }
        Ok((
            Done::Proposed {
                proposal_id: proposal_id.clone(),
            },
            vec![KnownEvent::ProposalCreated {
                proposal_id,
                change,
                rationale,
                thread_id: ctx_thread,
                run_id: self.own_run(),
            }],
        ))
    }

    fn respond(&self, c: super::frames::RespondToProposal) -> Step {
        let p = self
            .st
            .proposals
            .get(&c.proposal_id)
            .ok_or_else(|| Rejection::not_found("proposal", &c.proposal_id))?;
        if p.status != ProposalStatus::Pending {
            return Err(Rejection::invalid_state(format!(
                "proposal {} is already {}",
                c.proposal_id,
                p.status.as_str()
            )));
        }
        if p.proposed_by.participant() == self.actor.participant() {
            return Err(Rejection::Forbidden {
                message: "a proposal must be resolved by someone other than its author".into(),
                cap: None,
            });
        }
        let mut events = Vec::new();
        let mut version = None;
        if c.decision == Decision::Accept {
            let (ev, v) = self.accept(p, c.changes.as_ref())?;
            events.push(ev);
            version = Some(v);
        }
        events.push(KnownEvent::ProposalResolved {
            proposal_id: c.proposal_id.clone(),
            decision: c.decision,
            proposed_by: p.proposed_by.clone(),
            artifact_id: p.change.artifact_id().to_owned(),
            changes: c.changes,
            reason: c.reason,
            version,
            thread_id: p.thread_id.clone(),
            run_id: p.run_id.clone(),
        });
        Ok((
            Done::Resolved {
                proposal_id: c.proposal_id,
                decision: c.decision,
                version,
            },
            events,
        ))
    }

    /// Re-apply the proposal's change on the current version (rebasing), with the
    /// reviewer's `changes` on top.
    fn accept(
        &self,
        p: &super::state::Proposal,
        changes: Option<&Patch>,
    ) -> Result<(KnownEvent, u64), Rejection> {
        let pid = Some(p.proposal_id.clone());
        match &p.change {
            Change::CreateArtifact(c) => {
                let (kind, mut data) = self.check_create(c)?;
                if let Some(ch) = changes {
                    data = kind.normalize(&patch::apply(&data, ch)?)?;
                }
                Ok((
                    KnownEvent::ArtifactCreated {
                        artifact_id: c.artifact_id.clone().unwrap_or_default(),
                        kind: c.kind.clone(),
                        version: 1,
                        data,
                        thread_id: p.thread_id.clone(),
                        run_id: p.run_id.clone(),
                        proposal_id: pid,
                    },
                    1,
                ))
            }
            Change::EditArtifact(c) => {
                let a = self.live(&c.artifact_id)?;
                let kind = Self::kind_of(a)?;
                let (recorded, _) = compute_edit(a, kind, &c.patch, changes)?;
                let version = a.head() + 1;
                Ok((
                    KnownEvent::ArtifactChanged {
                        artifact_id: c.artifact_id.clone(),
                        kind: a.kind.clone(),
                        version,
                        patch: recorded,
                        summary: summary_of(c.summary.as_deref(), &c.patch),
                        thread_id: p.thread_id.clone(),
                        run_id: p.run_id.clone(),
                        proposal_id: pid,
                    },
                    version,
                ))
            }
            Change::ArchiveArtifact(c) => {
                if changes.is_some() {
                    return Err(Rejection::patch_failed(
                        "changes cannot be applied to an archive proposal",
                    ));
                }
                let a = self.live(&c.artifact_id)?;
                let version = a.head() + 1;
                Ok((
                    KnownEvent::ArtifactArchived {
                        artifact_id: c.artifact_id.clone(),
                        kind: a.kind.clone(),
                        version,
                        thread_id: p.thread_id.clone(),
                        run_id: p.run_id.clone(),
                        proposal_id: pid,
                    },
                    version,
                ))
            }
        }
    }
}

fn summary_of(given: Option<&str>, p: &Patch) -> String {
    match given {
        Some(s) if !s.is_empty() => s.to_owned(),
        _ => patch::summarize(p),
    }
}

/// Apply `p` (and reviewer `changes`) to the artifact's current data, validate and
/// normalize as the kind; returns the recorded patch and the new data (notes §5).
fn compute_edit(
    a: &Artifact,
    kind: Kind,
    p: &Patch,
    changes: Option<&Patch>,
) -> Result<(Patch, Map<String, Value>), Rejection> {
    let before = a.data();
    let raw = patch::apply(before, p)?;
    let mut result = kind.normalize(&raw)?;
    let mut rewritten = !same_json(&raw, &result);
    if let Some(ch) = changes {
        result = kind.normalize(&patch::apply(&result, ch)?)?;
        rewritten = true;
    }
    kind.check_change(before, &result)?;
    if same_json(before, &result) {
        return Err(Rejection::patch_failed(
            "the change leaves the artifact unchanged",
        ));
    }
    let recorded = if rewritten {
        patch::diff(before, &result)
    } else {
        p.clone()
    };
    Ok((recorded, result))
}

/// JSON equality of objects, without regard to key order.
fn same_json(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a == b
}
