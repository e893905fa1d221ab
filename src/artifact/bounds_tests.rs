//! Bounds of the engine state: artifact versions as patches between full checkpoints,
//! ended runs, events held back by a replica, and the replica reset.

use serde_json::{json, Value};

use super::frames::{Actor, EventEnvelope};
use super::replica::{resend_beyond_head, Replica, ReplicaError, MAX_HELD_BYTES};
use super::runs;
use super::state::{WorkspaceState, MAX_ENDED_RUNS};

const WS: &str = "thr_bounds";

fn env_as(seq: u64, actor: Value, event: Value) -> EventEnvelope {
    serde_json::from_value(
        json!({"seq": seq, "id": format!("00000000-0000-4000-8000-{seq:012}"),
        "ts": "2026-01-01T00:00:00Z", "workspace_id": WS, "thread_id": WS, "run_id": null,
        "actor": actor, "traceparent": null, "event": event, "type": "event"}),
    )
    .unwrap()
}

fn env(seq: u64, event: Value) -> EventEnvelope {
    env_as(seq, json!({"kind": "user", "id": "u", "name": null}), event)
}

fn created(text: &str) -> EventEnvelope {
    env(
        1,
        json!({"type": "artifact_created", "artifact_id": "art_1", "kind": "markdown",
        "version": 1, "data": {"text": text}, "thread_id": WS, "proposal_id": null, "run_id": null}),
    )
}

/// Version `version` (≥ 2) of art_1 at seq `version`: flips the first letter a ↔ b.
fn flip(version: u64) -> EventEnvelope {
    let (old, new) = if version.is_multiple_of(2) {
        ("a", "b")
    } else {
        ("b", "a")
    };
    env(
        version,
        json!({"type": "artifact_changed", "artifact_id": "art_1", "kind": "markdown",
        "version": version, "summary": "s", "thread_id": WS, "proposal_id": null, "run_id": null,
        "patch": {"kind": "text_edits", "field": "text", "edits": [{"old": old, "new": new}]}}),
    )
}

fn size(st: &WorkspaceState) -> usize {
    serde_json::to_vec(st).unwrap().len()
}

fn text_at(st: &WorkspaceState, version: u64) -> String {
    let d = st.artifacts["art_1"]
        .data_at(version)
        .expect("version rebuilds");
    d["text"].as_str().unwrap().to_owned()
}

/// Version v of the flipped text: odd versions start with `a`, even ones with `b`.
fn expected(v: u64, tail: &str) -> String {
    format!("{}{tail}", if v.is_multiple_of(2) { "b" } else { "a" })
}

/// 600 one-letter edits of a 16 KiB text: the state (as the snapshot JSON; measured after
/// every checkpoint, the worst moments, and every 10th event) has grown by at most twice
/// the bytes of the change events received, although it passes several checkpoints (the old form grew by 16 KiB per event: ~10 MB here).
/// Every version still rebuilds to its exact text.
#[test]
fn state_grows_by_the_event_not_the_artifact_per_edit() {
    let tail = "y".repeat(16 * 1024);
    let mut st = WorkspaceState::new(WS);
    st.apply_event(&created(&format!("a{tail}"))).unwrap();
    let base = size(&st);
    let mut received = 0usize;
    for v in 2..=601u64 {
        let e = flip(v);
        received += serde_json::to_vec(&e).unwrap().len();
        st.apply_event(&e).unwrap();
        let checkpoint = st.artifacts["art_1"]
            .versions
            .last()
            .unwrap()
            .is_checkpoint();
        if !checkpoint && !v.is_multiple_of(10) {
            continue;
        }
        let grown = size(&st) - base;
        assert!(
            grown <= 2 * received,
            "after version {v}: {received} bytes of events grew the state by {grown}"
        );
    }
    let a = &st.artifacts["art_1"];
    let checkpoints = a.versions.iter().filter(|v| v.is_checkpoint()).count();
    assert!(
        (3..=20).contains(&checkpoints),
        "{checkpoints} checkpoints in 601 versions"
    );
    for (v, data) in a.history() {
        assert_eq!(data["text"], expected(v.version, &tail), "v{}", v.version);
    }
    assert_eq!(a.history().count(), 601);
    for v in (1..=601).step_by(37).chain([600, 601]) {
        assert_eq!(text_at(&st, v), expected(v, &tail), "v{v}");
    }
    assert_eq!(a.data_at(0), None);
    assert_eq!(a.data_at(602), None);
    // The snapshot keeps the same form and rebuilds the same versions.
    let back: WorkspaceState = serde_json::from_slice(&serde_json::to_vec(&st).unwrap()).unwrap();
    assert_eq!(back, st);
    assert_eq!(text_at(&back, 300), expected(300, &tail));
}

/// An archive adds a version with no data of its own; a version right after a
/// checkpoint and the archived head rebuild.
#[test]
fn archived_version_repeats_the_data_without_storing_it() {
    let mut st = WorkspaceState::new(WS);
    st.apply_event(&created("a-doc")).unwrap();
    st.apply_event(&flip(2)).unwrap();
    st.apply_event(&env(
        3,
        json!({"type": "artifact_archived", "artifact_id": "art_1", "kind": "markdown",
        "version": 3, "thread_id": WS, "proposal_id": null, "run_id": null}),
    ))
    .unwrap();
    let a = &st.artifacts["art_1"];
    assert_eq!(a.head(), 3);
    assert!(!a.versions[2].is_checkpoint());
    let json = serde_json::to_value(&a.versions[2]).unwrap();
    assert!(
        json.get("data").is_none() && json.get("patch").is_none(),
        "{json}"
    );
    assert_eq!(text_at(&st, 3), "b-doc");
    assert_eq!(text_at(&st, 2), "b-doc");
    assert_eq!(text_at(&st, 1), "a-doc");
}

/// A snapshot written before versions were stored as patches (every version with its
/// full `data`, no current `data`, runs without `ended_seq`) still loads, with the same
/// data per version, and takes further events.
#[test]
fn snapshots_with_a_full_copy_per_version_still_load() {
    let mut st = WorkspaceState::new(WS);
    st.apply_event(&created("a-doc")).unwrap();
    for v in 2..=5 {
        st.apply_event(&flip(v)).unwrap();
    }
    let mut old = serde_json::to_value(&st).unwrap();
    let a = &st.artifacts["art_1"];
    let versions: Vec<Value> = a
        .history()
        .map(|(v, data)| {
            json!({"version": v.version, "data": data, "seq": v.seq, "actor": v.actor,
                "summary": v.summary, "proposal_id": v.proposal_id})
        })
        .collect();
    old["artifacts"]["art_1"] = json!({"artifact_id": "art_1", "kind": "markdown",
        "archived": false, "versions": versions});
    let back: WorkspaceState = serde_json::from_value(old).unwrap();
    for v in 1..=5 {
        assert_eq!(text_at(&back, v), expected(v, "-doc"), "v{v}");
    }
    assert_eq!(back.artifacts["art_1"].data(), st.artifacts["art_1"].data());
    let mut back = back;
    back.apply_event(&flip(6)).unwrap();
    assert_eq!(text_at(&back, 6), "b-doc");
    // A stored artifact whose versions are not dense or lack version 1's data is refused.
    let mut bad = serde_json::to_value(&st).unwrap();
    bad["artifacts"]["art_1"]["versions"][0]
        .as_object_mut()
        .unwrap()
        .remove("data");
    assert!(serde_json::from_value::<WorkspaceState>(bad).is_err());
    let mut bad = serde_json::to_value(&st).unwrap();
    bad["artifacts"]["art_1"]["versions"][1]["version"] = json!(7);
    assert!(serde_json::from_value::<WorkspaceState>(bad).is_err());
}

fn party(n: usize) -> Actor {
    Actor::ExternalAgent {
        client_id: format!("p{n}"),
        name: None,
    }
}

fn actor_json(a: &Actor) -> Value {
    serde_json::to_value(a).unwrap()
}

/// Ended runs are kept up to MAX_ENDED_RUNS, the first ended forgotten first; open runs
/// are found through the index, also after a snapshot round trip.
#[test]
fn ended_runs_are_bounded_and_open_runs_are_indexed() {
    let mut st = WorkspaceState::new(WS);
    let mut seq = 0;
    let mut next = |st: &mut WorkspaceState, actor: &Actor, ev: Value| {
        seq += 1;
        st.apply_event(&env_as(seq, actor_json(actor), ev)).unwrap();
    };
    let total = MAX_ENDED_RUNS + 5;
    for i in 0..total {
        let who = party(i % 3);
        let run = format!("run_{i:05}");
        next(
            &mut st,
            &who,
            json!({"type": "run_started", "run_id": run, "thread_id": "main", "trigger": "api"}),
        );
        next(
            &mut st,
            &who,
            json!({"type": "run_ended", "run_id": run, "thread_id": "main", "status": "completed",
            "error": null, "usage": null}),
        );
    }
    assert_eq!(st.runs.len(), MAX_ENDED_RUNS);
    for i in 0..5 {
        assert!(
            !st.runs.contains_key(&format!("run_{i:05}")),
            "run {i} kept"
        );
    }
    assert!(st.runs.contains_key(&format!("run_{:05}", total - 1)));
    // p1 starts a run: the AWP state `done` ends exactly that one.
    next(
        &mut st,
        &party(1),
        json!({"type": "run_started", "run_id": "run_open", "thread_id": "main", "trigger": "api"}),
    );
    let st: WorkspaceState = serde_json::from_slice(&serde_json::to_vec(&st).unwrap()).unwrap();
    assert_eq!(st.open_run(&party(1), "main").unwrap().run_id, "run_open");
    assert!(st.open_run(&party(0), "main").is_none());
    assert!(st.open_run(&party(1), "other").is_none());
    let mut ids = super::engine::SeededIds(1);
    let evs = runs::on_peer_state(&st, &party(1), "main", "done", None, &mut ids);
    let v = serde_json::to_value(&evs).unwrap();
    assert_eq!(v[0]["type"], "run_ended");
    assert_eq!(v[0]["run_id"], "run_open");
    assert_eq!(v.as_array().unwrap().len(), 1);
}

/// An ended run cannot be paused again (it would be open without being indexed).
#[test]
fn an_ended_run_is_not_paused_again() {
    let mut st = WorkspaceState::new(WS);
    let who = actor_json(&party(0));
    for (seq, ev) in [
        json!({"type": "run_started", "run_id": "r", "thread_id": "main", "trigger": "api"}),
        json!({"type": "run_ended", "run_id": "r", "thread_id": "main", "status": "completed", "error": null, "usage": null}),
    ]
    .into_iter()
    .enumerate()
    {
        st.apply_event(&env_as(seq as u64 + 1, who.clone(), ev))
            .unwrap();
    }
    let pause = json!({"type": "run_paused", "run_id": "r", "thread_id": "main", "requests": [
        {"tool_call_id": "c1", "tool_name": "ask", "kind": "question", "args": {}}]});
    assert!(st.apply_event(&env_as(3, who, pause)).is_err());
    assert_eq!(st.head_seq, 2);
}

fn big_unknown(seq: u64, bytes: usize) -> EventEnvelope {
    env(seq, json!({"type": "x_blob", "blob": "z".repeat(bytes)}))
}

/// Events after a gap are held up to MAX_HELD_BYTES: the one past it is dropped
/// (TooManyHeld), the gap fills, and the dropped one comes again with the resend.
#[test]
fn held_events_are_bounded_in_bytes() {
    let mut r = Replica::new(WS);
    r.receive(big_unknown(1, 10)).unwrap();
    let each = 256 * 1024;
    let mut refused = None;
    for seq in 3..3 + (MAX_HELD_BYTES / each) as u64 + 2 {
        match r.receive(big_unknown(seq, each)) {
            Ok(applied) => assert!(applied.is_empty()),
            Err(ReplicaError::TooManyHeld { head: 1 }) => {
                refused = Some(seq);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let refused = refused.expect("the bytes bound refused an event");
    assert!(r.held_bytes() <= MAX_HELD_BYTES);
    assert_eq!(r.held() as u64, refused - 3);
    assert_eq!(r.needs_resend_from(), Some(1));
    // The gap fills: everything held applies, and the bytes are released.
    let applied = r.receive(big_unknown(2, 10)).unwrap();
    assert_eq!(applied.len() as u64, refused - 2);
    assert_eq!((r.held(), r.held_bytes()), (0, 0));
    // The resend brings the dropped one.
    assert_eq!(r.receive(big_unknown(refused, each)).unwrap().len(), 1);
    assert_eq!(r.head_seq(), refused);
}

/// The host answers a resend after the replica's head with its own, lower head (its store
/// was restored): the replica recognizes it, resets, and rebuilds from seq 1.
#[test]
fn replica_resets_when_the_host_log_is_behind_it() {
    let mut r = Replica::new(WS);
    r.receive(created("a-doc")).unwrap();
    for v in 2..=4 {
        r.receive(flip(v)).unwrap();
    }
    r.receive(flip(6)).unwrap(); // held back after a gap at 5
    assert_eq!(r.needs_resend_from(), Some(4));
    let answer =
        json!({"type": "error", "message": format!("resend after {}: head is 2", r.head_seq())});
    assert_eq!(resend_beyond_head(&answer, r.head_seq()), Some(2));
    r.reset();
    assert_eq!((r.head_seq(), r.held(), r.held_bytes()), (0, 0, 0));
    assert!(r.state.artifacts.is_empty());
    // The host's (new) log from seq 1.
    r.receive(created("a-new")).unwrap();
    r.receive(flip(2)).unwrap();
    assert_eq!(text_at(&r.state, 2), "b-new");
    // Not a beyond-head answer: other after_seq, a head at or past it, other messages.
    for (frame, after) in [
        (
            json!({"type": "error", "message": "resend after 3: head is 2"}),
            4,
        ),
        (
            json!({"type": "error", "message": "resend after 4: head is 4"}),
            4,
        ),
        (
            json!({"type": "error", "message": "resend after 4: head is x"}),
            4,
        ),
        (json!({"type": "error", "message": "outbox over quota"}), 4),
        (
            json!({"type": "command_result", "message": "resend after 4: head is 2"}),
            4,
        ),
        (json!({"type": "error"}), 4),
    ] {
        assert_eq!(resend_beyond_head(&frame, after), None, "{frame}");
    }
}
