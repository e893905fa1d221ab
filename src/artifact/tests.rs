//! Engine tests: one table row per rejection of artifactr-notes §1–§6, event shapes and
//! order, serialization order, seed-schema validation, replay, replica gaps, runs, and
//! property tests over random command sequences from random actors.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::caps::CapSet;
use super::engine::{apply, commit, parse_command_frame, Context, SeededIds};
use super::frames::{Actor, CommandFrame, CommandResult, EventEnvelope};
use super::replica::Replica;
use super::runs;
use super::state::{Workspace, DEDUP_CAPACITY};

const WS: &str = "thr_01JAWPTHREAD";
const T0: i64 = 1_764_500_000_000_000;

fn alice() -> Actor {
    Actor::User {
        id: "ed25519:alice".into(),
        name: None,
    }
}
fn bob() -> Actor {
    Actor::ExternalAgent {
        client_id: "ed25519:bob".into(),
        name: Some("bob@laptop".into()),
    }
}
fn carol() -> Actor {
    Actor::ExternalAgent {
        client_id: "ed25519:carol".into(),
        name: Some("carol@ci".into()),
    }
}

/// A host with its event log, a clock and an id source.
struct Host {
    ws: Workspace,
    log: Vec<EventEnvelope>,
    ids: SeededIds,
    now: i64,
}

impl Host {
    fn new() -> Self {
        Host {
            ws: Workspace::new(WS),
            log: Vec::new(),
            ids: SeededIds(7),
            now: T0,
        }
    }

    /// Run a frame given as JSON (parsed like a received data part).
    fn run(
        &mut self,
        actor: &Actor,
        caps: CapSet,
        frame: Value,
    ) -> (CommandResult, Vec<EventEnvelope>) {
        let frame = parse_command_frame(&frame).expect("frame parses");
        self.run_frame(actor, caps, &frame)
    }

    fn run_frame(
        &mut self,
        actor: &Actor,
        caps: CapSet,
        frame: &CommandFrame,
    ) -> (CommandResult, Vec<EventEnvelope>) {
        self.now += 1_000;
        let mut ctx = Context {
            actor: actor.clone(),
            caps,
            now_us: self.now,
            ids: &mut self.ids,
        };
        let (r, evs) = apply(&mut self.ws, &mut ctx, frame);
        self.log.extend(evs.iter().cloned());
        (r, evs)
    }

    fn ok(&mut self, actor: &Actor, caps: CapSet, frame: Value) -> Value {
        let (r, _) = self.run(actor, caps, frame.clone());
        assert!(r.ok, "{frame} → {}", serde_json::to_string(&r).unwrap());
        serde_json::to_value(r.outcome.unwrap()).unwrap()
    }
}

fn cmd(id: &str, command: Value) -> Value {
    json!({"type": "command", "command_id": id, "command": command})
}

fn write() -> CapSet {
    CapSet {
        write: true,
        ..CapSet::none()
    }
}

/// alice hosts: thread `main`, markdown `art_doc` = "Hello world" (v1).
fn seeded() -> Host {
    let mut h = Host::new();
    h.ok(
        &alice(),
        CapSet::all(),
        cmd(
            "c1",
            json!({"type": "create_thread", "thread_id": "main", "title": "Plan"}),
        ),
    );
    h.ok(
        &alice(),
        CapSet::all(),
        cmd(
            "c2",
            json!({"type": "create_artifact", "artifact_id": "art_doc", "kind": "markdown",
                   "data": {"text": "Hello world"}, "thread_id": "main"}),
        ),
    );
    h
}

fn rejection(r: &CommandResult) -> Value {
    assert!(!r.ok && r.outcome.is_none());
    serde_json::to_value(r.rejection.as_ref().unwrap()).unwrap()
}

fn edit(base: u64, old: &str, new: &str) -> Value {
    json!({"type": "edit_artifact", "artifact_id": "art_doc", "base_version": base,
           "patch": {"kind": "text_edits", "edits": [{"old": old, "new": new}]}})
}

// ---------------------------------------------------------------- rejection table

/// Every rejection of the notes, one row each: (who, caps, setup frames by alice, the
/// command, expected rejection subset).
#[test]
fn rejection_table() {
    struct Row {
        name: &'static str,
        actor: Actor,
        caps: CapSet,
        setup: Vec<Value>,
        command: Value,
        want: Value,
    }
    let all = CapSet::all();
    let rows = vec![
        Row {
            name: "create_thread exists",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_thread", "thread_id": "main"}),
            want: json!({"type": "invalid_state", "message": "thread main already exists"}),
        },
        Row {
            name: "set_thread_mode thread missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "set_thread_mode", "thread_id": "nope", "mode": "suggest"}),
            want: json!({"type": "not_found", "entity": "thread", "id": "nope",
                         "message": "thread nope does not exist"}),
        },
        Row {
            name: "set_focus thread missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "set_focus", "thread_id": "nope", "artifact_ids": []}),
            want: json!({"type": "not_found", "entity": "thread", "id": "nope"}),
        },
        Row {
            name: "set_focus artifact missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "set_focus", "thread_id": "main", "artifact_ids": ["art_doc", "art_x"]}),
            want: json!({"type": "not_found", "entity": "artifact", "id": "art_x"}),
        },
        Row {
            name: "post_message thread missing",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: json!({"type": "post_message", "thread_id": "nope", "content": "hi"}),
            want: json!({"type": "not_found", "entity": "thread", "id": "nope"}),
        },
        Row {
            name: "post_message id used",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![
                json!({"type": "post_message", "thread_id": "main", "content": "a", "message_id": "msg_1"}),
            ],
            command: json!({"type": "post_message", "thread_id": "main", "content": "b", "message_id": "msg_1"}),
            want: json!({"type": "invalid_state", "message": "message msg_1 already exists"}),
        },
        Row {
            name: "create_artifact unknown kind",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "kind": "slides", "data": {}}),
            want: json!({"type": "not_found", "entity": "artifact type", "id": "slides",
                         "message": "artifact type slides does not exist"}),
        },
        Row {
            name: "propose_change of unknown kind",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: json!({"type": "propose_change", "change": {"type": "create_artifact", "kind": "slides", "data": {}}}),
            want: json!({"type": "not_found", "entity": "artifact type", "id": "slides"}),
        },
        Row {
            name: "create_artifact id exists",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "artifact_id": "art_doc", "kind": "markdown", "data": {}}),
            want: json!({"type": "invalid_state", "message": "artifact art_doc already exists"}),
        },
        Row {
            name: "create_artifact data invalid (unknown field)",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "kind": "markdown", "data": {"text": "x", "extra": 1}}),
            want: json!({"type": "validation_failed", "message": "invalid markdown data",
                         "errors": [{"type": "extra_forbidden", "loc": ["extra"], "msg": "Extra inputs are not permitted"}]}),
        },
        Row {
            name: "create code without language",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "kind": "code", "data": {"text": "fn main() {}"}}),
            want: json!({"type": "validation_failed", "message": "invalid code data",
                         "errors": [{"type": "missing", "loc": ["language"], "msg": "Field required"}]}),
        },
        Row {
            name: "create json against its schema",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "kind": "json",
                            "data": {"value": {"port": "x"}, "schema": {"type": "object", "properties": {"port": {"type": "integer"}}}}}),
            want: json!({"type": "validation_failed", "message": "invalid json data"}),
        },
        Row {
            name: "create json with an invalid schema",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "kind": "json", "data": {"value": 1, "schema": {"type": 12}}}),
            want: json!({"type": "validation_failed", "message": "invalid json data"}),
        },
        Row {
            name: "create json nested deeper than 64 levels",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "create_artifact", "kind": "json", "data": {"value": nested(64)}}),
            want: json!({"type": "validation_failed", "message": "invalid json data",
                         "errors": [{"type": "too_deep", "loc": ["data"]}]}),
        },
        Row {
            name: "edit past the data size cap",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: edit(1, "Hello", &"x".repeat(super::kinds::MAX_DATA_BYTES)),
            want: json!({"type": "validation_failed", "message": "invalid markdown data",
                         "errors": [{"type": "too_large", "loc": ["data"]}]}),
        },
        Row {
            name: "edit missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "edit_artifact", "artifact_id": "art_x", "base_version": 1,
                            "patch": {"kind": "json_patch", "ops": []}}),
            want: json!({"type": "not_found", "entity": "artifact", "id": "art_x"}),
        },
        Row {
            name: "edit archived",
            actor: alice(),
            caps: all,
            setup: vec![
                json!({"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 1}),
            ],
            command: edit(2, "Hello", "Bye"),
            want: json!({"type": "invalid_state", "message": "artifact art_doc is archived"}),
        },
        Row {
            name: "edit version conflict",
            actor: alice(),
            caps: all,
            setup: vec![edit(1, "world", "there")],
            command: edit(1, "Hello", "Bye"),
            want: json!({"type": "version_conflict", "artifact_id": "art_doc", "base": 1, "head": 2,
                         "message": "artifact art_doc is at version 2, but the change was based on 1"}),
        },
        Row {
            name: "edit anchor not found",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: edit(1, "absent", "x"),
            want: json!({"type": "patch_failed", "message": "the anchor 'absent' is not found"}),
        },
        Row {
            name: "edit anchor ambiguous",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: edit(1, "o", "0"),
            want: json!({"type": "patch_failed", "message": "the anchor 'o' is ambiguous: it occurs 2 times"}),
        },
        Row {
            name: "edit not a text field",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "edit_artifact", "artifact_id": "art_doc", "base_version": 1,
                            "patch": {"kind": "text_edits", "field": "title", "edits": [{"old": "", "new": "x"}]}}),
            want: json!({"type": "patch_failed", "message": "'title' is not a text field"}),
        },
        Row {
            name: "edit json patch does not apply",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "edit_artifact", "artifact_id": "art_doc", "base_version": 1,
                            "patch": {"kind": "json_patch", "ops": [{"op": "remove", "path": "/nope"}]}}),
            want: json!({"type": "patch_failed"}),
        },
        Row {
            name: "edit result invalid for the kind",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "edit_artifact", "artifact_id": "art_doc", "base_version": 1,
                            "patch": {"kind": "json_patch", "ops": [{"op": "replace", "path": "/text", "value": 5}]}}),
            want: json!({"type": "validation_failed", "message": "invalid markdown data",
                         "errors": [{"type": "string_type", "loc": ["text"]}]}),
        },
        Row {
            name: "edit leaves the artifact unchanged",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: edit(1, "Hello", "Hello"),
            want: json!({"type": "patch_failed", "message": "the change leaves the artifact unchanged"}),
        },
        Row {
            name: "archive missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "archive_artifact", "artifact_id": "art_x", "base_version": 1}),
            want: json!({"type": "not_found", "entity": "artifact", "id": "art_x"}),
        },
        Row {
            name: "archive version conflict",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 3}),
            want: json!({"type": "version_conflict", "base": 3, "head": 1}),
        },
        Row {
            name: "propose edit whose dry run fails",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: edit(1, "absent", "x"),
            want: json!({"type": "patch_failed", "message": "the anchor 'absent' is not found"}),
        },
        Row {
            name: "propose edit at an old version",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![edit(1, "world", "there")],
            command: edit(1, "Hello", "Bye"),
            want: json!({"type": "version_conflict", "base": 1, "head": 2}),
        },
        Row {
            name: "proposal id exists",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: json!({"type": "propose_change", "proposal_id": "prp_a",
                            "change": {"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 1}}),
            want: json!({"type": "invalid_state", "message": "proposal prp_a already exists"}),
        },
        Row {
            name: "agent edit in a missing context thread",
            actor: bob(),
            caps: write(),
            setup: vec![],
            command: json!({"type": "edit_artifact", "artifact_id": "art_doc", "base_version": 1, "thread_id": "nope",
                            "patch": {"kind": "text_edits", "edits": [{"old": "Hello", "new": "Bye"}]}}),
            want: json!({"type": "not_found", "entity": "thread", "id": "nope"}),
        },
        Row {
            name: "respond without artifact:resolve",
            actor: bob(),
            caps: write(),
            setup: vec![],
            command: json!({"type": "respond_to_proposal", "proposal_id": "prp_a", "decision": "accept"}),
            want: json!({"type": "forbidden", "cap": "artifact:resolve",
                         "message": "artifactr:respond_to_proposal is refused in this workspace"}),
        },
        Row {
            name: "set_thread_mode without artifact:admin",
            actor: bob(),
            caps: CapSet {
                write: true,
                resolve: true,
                admin: false,
            },
            setup: vec![],
            command: json!({"type": "set_thread_mode", "thread_id": "main", "mode": "suggest"}),
            want: json!({"type": "forbidden", "cap": "artifact:admin",
                         "message": "artifactr:set_thread_mode is refused in this workspace"}),
        },
        Row {
            name: "set_focus without artifact:admin",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: json!({"type": "set_focus", "thread_id": "main", "artifact_ids": []}),
            want: json!({"type": "forbidden", "cap": "artifact:admin"}),
        },
        Row {
            name: "create_thread without artifact:admin",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: json!({"type": "create_thread", "title": "mine"}),
            want: json!({"type": "forbidden", "cap": "artifact:admin"}),
        },
        Row {
            name: "respond to a missing proposal",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "respond_to_proposal", "proposal_id": "prp_x", "decision": "reject"}),
            want: json!({"type": "not_found", "entity": "proposal", "id": "prp_x"}),
        },
        Row {
            name: "respond to a resolved proposal",
            actor: alice(),
            caps: all,
            setup: vec![
                json!({"type": "respond_to_proposal", "proposal_id": "prp_a", "decision": "reject"}),
            ],
            command: json!({"type": "respond_to_proposal", "proposal_id": "prp_a", "decision": "accept"}),
            want: json!({"type": "invalid_state", "message": "proposal prp_a is already rejected"}),
        },
        Row {
            name: "accept whose rebase fails",
            actor: alice(),
            caps: all,
            setup: vec![edit(1, "Hello world", "Goodbye")],
            command: json!({"type": "respond_to_proposal", "proposal_id": "prp_a", "decision": "accept"}),
            want: json!({"type": "patch_failed", "message": "the anchor 'world' is not found"}),
        },
        Row {
            name: "accept an archive with changes",
            actor: carol(),
            caps: all,
            setup: vec![json!({"type": "propose_change", "proposal_id": "prp_arch",
                               "change": {"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 1}})],
            command: json!({"type": "respond_to_proposal", "proposal_id": "prp_arch", "decision": "accept",
                            "changes": {"kind": "text_edits", "edits": [{"old": "Hello", "new": "Hi"}]}}),
            want: json!({"type": "patch_failed"}),
        },
        Row {
            name: "NUL in the command",
            actor: bob(),
            caps: CapSet::none(),
            setup: vec![],
            command: json!({"type": "post_message", "thread_id": "main", "content": "a\u{0}b"}),
            want: json!({"type": "validation_failed", "message": "text cannot hold a NUL character", "errors": []}),
        },
        Row {
            name: "answer_deferred run missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "answer_deferred", "run_id": "run_x", "tool_call_id": "call_1"}),
            want: json!({"type": "not_found", "entity": "run", "id": "run_x"}),
        },
        Row {
            name: "stop_run run missing",
            actor: alice(),
            caps: all,
            setup: vec![],
            command: json!({"type": "stop_run", "run_id": "run_x"}),
            want: json!({"type": "not_found", "entity": "run", "id": "run_x"}),
        },
    ];
    for row in rows {
        let mut h = seeded();
        // Every row may use bob's pending proposal prp_a (an edit "world" → "there" at v1).
        h.ok(
            &bob(),
            CapSet::none(),
            cmd(
                "setup-p",
                json!({"type": "propose_change", "proposal_id": "prp_a", "change": edit(1, "world", "there")}),
            ),
        );
        for (i, s) in row.setup.iter().enumerate() {
            h.ok(
                &alice(),
                CapSet::all(),
                cmd(&format!("setup-{i}"), s.clone()),
            );
        }
        let before = h.ws.state.clone();
        let (r, evs) = h.run(&row.actor, row.caps, cmd("under-test", row.command.clone()));
        assert!(!r.ok, "{}: expected a rejection, got {:?}", row.name, r);
        let got = rejection(&r);
        assert_subset(&row.want, &got, row.name);
        assert!(evs.is_empty(), "{}: a rejection appends no event", row.name);
        assert_eq!(
            h.ws.state, before,
            "{}: a rejection changes nothing",
            row.name
        );
        // Rejections are remembered: the same id again gives the same result.
        let (again, evs) = h.run(
            &row.actor,
            row.caps,
            cmd("under-test", json!({"type": "create_thread"})),
        );
        assert_eq!(again, r, "{}: remembered", row.name);
        assert!(evs.is_empty());
    }
}

/// `n` nested arrays around 0.
fn nested(n: usize) -> Value {
    (0..n).fold(json!(0), |v, _| json!([v]))
}

#[test]
fn data_at_the_depth_limit_is_accepted() {
    let mut h = seeded();
    // The data object is level 1, `value` level 2: 63 arrays make 64 levels in all.
    let out = h.ok(
        &alice(),
        CapSet::all(),
        cmd(
            "deep",
            json!({"type": "create_artifact", "kind": "json", "data": {"value": nested(63)}}),
        ),
    );
    assert_eq!(out["version"], 1);
    let ev = serde_json::to_string(h.log.last().unwrap()).unwrap();
    assert!(
        serde_json::from_str::<EventEnvelope>(&ev).is_ok(),
        "a replica can parse it"
    );
}

fn assert_subset(want: &Value, got: &Value, ctx: &str) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let gv = g
                    .get(k)
                    .unwrap_or_else(|| panic!("{ctx}: missing {k} in {got}"));
                assert_subset(v, gv, ctx);
            }
        }
        (Value::Array(w), Value::Array(g)) if !w.is_empty() => {
            assert_eq!(w.len(), g.len(), "{ctx}: {got}");
            for (a, b) in w.iter().zip(g) {
                assert_subset(a, b, ctx);
            }
        }
        _ => assert_eq!(want, got, "{ctx}"),
    }
}

#[test]
fn nul_in_command_id_is_not_remembered() {
    let mut h = seeded();
    let (r, _) = h.run(
        &alice(),
        CapSet::all(),
        cmd(
            "a\u{0}",
            json!({"type": "create_thread", "thread_id": "t2"}),
        ),
    );
    assert_eq!(rejection(&r)["type"], "validation_failed");
    assert!(h.ws.dedup.get(&alice().participant(), "a\u{0}").is_none());
}

#[test]
fn parse_failures_are_error_frames() {
    for bad in [
        json!({"command_id": "", "command": {"type": "create_thread"}}),
        json!({"command_id": "x", "command": {"type": "create_thread", "colour": "red"}}),
        json!({"command_id": "x", "command": {"type": "post_message", "thread_id": "t", "content": ""}}),
        json!({"command_id": "x", "command": {"type": "edit_artifact", "artifact_id": "a", "base_version": 0,
                                               "patch": {"kind": "json_patch", "ops": []}}}),
        json!({"command_id": "x", "command": {"type": "edit_artifact", "artifact_id": "a", "base_version": 1,
                                               "patch": {"kind": "text_edits", "edits": []}}}),
        json!({"command_id": "x", "command": {"type": "fly"}}),
        json!({"command_id": "x", "command": {"type": "create_thread"}, "extra": 1}),
        json!({"type": "hello", "command_id": "x", "command": {"type": "create_thread"}}),
        json!({"command_id": "x", "command": {"type": "create_thread", "thread_id": ""}}),
    ] {
        let e = parse_command_frame(&bad).unwrap_err();
        assert!(
            e.message.starts_with("not a command frame: "),
            "{bad}: {}",
            e.message
        );
    }
    // The frame `type` may be omitted (default "command").
    assert!(
        parse_command_frame(&json!({"command_id": "x", "command": {"type": "create_thread"}}))
            .is_ok()
    );
}

// ---------------------------------------------------------------- behaviour

#[test]
fn peer_without_write_proposes_and_host_accepts_with_changes() {
    let mut h = seeded();
    let (r, evs) = h.run(&bob(), CapSet::none(), cmd("b1", edit(1, "world", "there")));
    let out = serde_json::to_value(r.outcome.unwrap()).unwrap();
    assert_eq!(out["type"], "proposed");
    let pid = out["proposal_id"].as_str().unwrap().to_owned();
    assert!(pid.starts_with("prp_") && pid.len() == 20, "{pid}");
    assert_eq!(evs.len(), 1);
    let ev = serde_json::to_value(&evs[0]).unwrap();
    assert_eq!(ev["event"]["type"], "proposal_created");
    assert_eq!(
        ev["event"]["change"]["summary"],
        "edited text (1 replacement)"
    );
    assert_eq!(
        ev["actor"],
        json!({"kind": "external_agent", "client_id": "ed25519:bob", "name": "bob@laptop"})
    );
    assert_eq!(
        h.ws.state.artifacts["art_doc"].head(),
        1,
        "a proposal uses no version"
    );

    // Alice changes the doc meanwhile; the proposal rebases on v2 at acceptance.
    h.ok(&alice(), CapSet::all(), cmd("a1", edit(1, "Hello", "Hi")));
    let (r, evs) = h.run(
        &alice(),
        CapSet::all(),
        cmd(
            "a2",
            json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": "accept",
                   "changes": {"kind": "text_edits", "edits": [{"old": "there", "new": "there!"}]}}),
        ),
    );
    let out = serde_json::to_value(r.outcome.unwrap()).unwrap();
    assert_eq!(
        out,
        json!({"seq": evs[1].seq, "type": "resolved", "proposal_id": pid, "decision": "accept", "version": 3})
    );
    let changed = serde_json::to_value(&evs[0]).unwrap();
    assert_eq!(changed["event"]["type"], "artifact_changed");
    assert_eq!(changed["event"]["proposal_id"], json!(pid));
    assert_eq!(
        changed["actor"]["kind"], "user",
        "envelope actor = the resolver"
    );
    assert_eq!(
        changed["event"]["patch"]["kind"], "json_patch",
        "layered changes record a diff"
    );
    let resolved = serde_json::to_value(&evs[1]).unwrap();
    assert_eq!(resolved["event"]["proposed_by"]["client_id"], "ed25519:bob");
    assert_eq!(resolved["event"]["version"], 3);
    assert_eq!(h.ws.state.artifacts["art_doc"].data()["text"], "Hi there!");
    let replayed = Workspace::replay(WS, &h.log).unwrap();
    assert_eq!(replayed.state, h.ws.state);
}

#[test]
fn author_cannot_resolve_own_proposal() {
    let mut h = seeded();
    let all_but_user = CapSet::all();
    let out = h.ok(
        &bob(),
        all_but_user,
        cmd(
            "b1",
            json!({"type": "propose_change", "change": edit(1, "world", "you")}),
        ),
    );
    let pid = out["proposal_id"].clone();
    let (r, _) = h.run(
        &bob(),
        all_but_user,
        cmd(
            "b2",
            json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": "accept"}),
        ),
    );
    let rej = rejection(&r);
    assert_eq!(rej["type"], "forbidden");
    assert_eq!(
        rej["message"],
        "a proposal must be resolved by someone other than its author"
    );
    // Another peer with resolve may.
    let (r, _) = h.run(&carol(), CapSet { resolve: true, ..CapSet::none() }, cmd("c1", json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": "reject", "reason": "no"})));
    assert!(r.ok);
}

#[test]
fn write_cap_applies_directly_but_suggest_mode_still_proposes() {
    let mut h = seeded();
    let out = h.ok(&bob(), write(), cmd("b1", edit(1, "world", "there")));
    assert_eq!(out["type"], "applied");
    assert_eq!(out["version"], 2);
    h.ok(
        &alice(),
        CapSet::all(),
        cmd(
            "a1",
            json!({"type": "set_thread_mode", "thread_id": "main", "mode": "suggest"}),
        ),
    );
    let mut e = edit(2, "there", "all");
    e["thread_id"] = json!("main");
    let out = h.ok(&bob(), write(), cmd("b2", e.clone()));
    assert_eq!(out["type"], "proposed");
    // The host's user is never forced to propose.
    let out = h.ok(&alice(), CapSet::all(), cmd("a2", e));
    assert_eq!(out["type"], "applied");
}

#[test]
fn no_op_commands_record_without_events() {
    let mut h = seeded();
    let (r, evs) = h.run(
        &alice(),
        CapSet::all(),
        cmd(
            "m",
            json!({"type": "set_thread_mode", "thread_id": "main", "mode": "edit"}),
        ),
    );
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        json!({"type": "command_result", "command_id": "m", "ok": true,
        "outcome": {"seq": null, "type": "recorded"}, "rejection": null})
    );
    assert!(evs.is_empty());
    let (_, evs) = h.run(&alice(), CapSet::all(), cmd("f1", json!({"type": "set_focus", "thread_id": "main", "artifact_ids": ["art_doc", "art_doc"]})));
    assert_eq!(
        serde_json::to_value(&evs[0].event).unwrap()["artifact_ids"],
        json!(["art_doc"]),
        "duplicates dropped"
    );
    let (_, evs) = h.run(
        &alice(),
        CapSet::all(),
        cmd(
            "f2",
            json!({"type": "set_focus", "thread_id": "main", "artifact_ids": ["art_doc"]}),
        ),
    );
    assert!(evs.is_empty(), "unchanged focus → no event");
}

#[test]
fn repeated_command_id_returns_first_result_per_participant() {
    let mut h = seeded();
    let (r1, e1) = h.run(
        &bob(),
        CapSet::none(),
        cmd(
            "same",
            json!({"type": "post_message", "thread_id": "main", "content": "one"}),
        ),
    );
    let state = h.ws.state.clone();
    let (r2, e2) = h.run(
        &bob(),
        CapSet::none(),
        cmd(
            "same",
            json!({"type": "post_message", "thread_id": "main", "content": "two"}),
        ),
    );
    assert_eq!(r1, r2);
    assert_eq!(e1.len(), 1);
    assert!(e2.is_empty());
    assert_eq!(h.ws.state, state);
    // Another participant's same id runs on its own.
    let (r3, e3) = h.run(
        &carol(),
        CapSet::none(),
        cmd(
            "same",
            json!({"type": "post_message", "thread_id": "main", "content": "three"}),
        ),
    );
    assert!(r3.ok && e3.len() == 1);
}

#[test]
fn dedup_memory_evicts_oldest_past_capacity() {
    let mut h = seeded();
    let frame = |i: usize| {
        parse_command_frame(&cmd(
            &format!("d{i}"),
            json!({"type": "set_thread_mode", "thread_id": "main", "mode": "edit"}),
        ))
        .unwrap()
    };
    for i in 0..=DEDUP_CAPACITY {
        h.run_frame(&bob(), CapSet::all(), &frame(i));
    }
    assert_eq!(h.ws.dedup.len(), DEDUP_CAPACITY);
    assert!(h.ws.dedup.get(&bob().participant(), "d0").is_none());
    assert!(h.ws.dedup.get(&bob().participant(), "d1").is_some());
}

#[test]
fn normalization_change_records_a_diff_and_replays() {
    let mut h = seeded();
    // Removing `text` is normalized back to "" by the markdown kind: recorded as a diff.
    let (r, evs) = h.run(&alice(), CapSet::all(), cmd("a", json!({"type": "edit_artifact", "artifact_id": "art_doc",
        "base_version": 1, "patch": {"kind": "json_patch", "ops": [{"op": "remove", "path": "/text"}]}})));
    assert!(r.ok, "{r:?}");
    let ev = serde_json::to_value(&evs[0].event).unwrap();
    assert_eq!(
        ev["patch"],
        json!({"kind": "json_patch", "ops": [{"op": "replace", "path": "/text", "value": ""}]})
    );
    assert_eq!(ev["summary"], "remove /text");
    assert_eq!(Workspace::replay(WS, &h.log).unwrap().state, h.ws.state);
}

#[test]
fn json_kind_keeps_its_schema_fixed() {
    let mut h = seeded();
    let schema = json!({"type": "object", "properties": {"port": {"type": "integer"}}, "required": ["port"]});
    let out = h.ok(
        &alice(),
        CapSet::all(),
        cmd(
            "j",
            json!({"type": "create_artifact", "artifact_id": "art_cfg", "kind": "json",
        "data": {"value": {"port": 80}, "schema": schema}}),
        ),
    );
    assert_eq!(out["version"], 1);
    let bad = json!({"type": "edit_artifact", "artifact_id": "art_cfg", "base_version": 1,
        "patch": {"kind": "json_patch", "ops": [{"op": "replace", "path": "/value/port", "value": "80"}]}});
    assert_eq!(
        rejection(&h.run(&alice(), CapSet::all(), cmd("j2", bad)).0)["type"],
        "validation_failed"
    );
    let drop_schema = json!({"type": "edit_artifact", "artifact_id": "art_cfg", "base_version": 1,
        "patch": {"kind": "json_patch", "ops": [{"op": "replace", "path": "/schema", "value": null}]}});
    assert_eq!(
        rejection(&h.run(&alice(), CapSet::all(), cmd("j3", drop_schema)).0)["type"],
        "validation_failed"
    );
    let good = json!({"type": "edit_artifact", "artifact_id": "art_cfg", "base_version": 1,
        "patch": {"kind": "json_patch", "ops": [{"op": "replace", "path": "/value/port", "value": 8080}]}});
    assert_eq!(h.ok(&alice(), CapSet::all(), cmd("j4", good))["version"], 2);
    // A json artifact without schema normalizes to schema null.
    h.ok(&alice(), CapSet::all(), cmd("j5", json!({"type": "create_artifact", "artifact_id": "art_free", "kind": "json", "data": {"value": [1]}})));
    assert_eq!(
        h.ws.state.artifacts["art_free"].data()["schema"],
        Value::Null
    );
}

#[test]
fn serialization_order_matches_the_reference() {
    let mut h = seeded();
    let (r, evs) = h.run(&alice(), CapSet::all(), cmd("o", edit(1, "world", "there")));
    let r = serde_json::to_string(&r).unwrap();
    assert!(r.starts_with(r#"{"type":"command_result","command_id":"o","ok":true,"outcome":{"seq":3,"type":"applied","artifact_id":"art_doc","version":2},"rejection":null}"#), "{r}");
    let e = serde_json::to_value(&evs[0]).unwrap();
    let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "seq",
            "id",
            "ts",
            "workspace_id",
            "thread_id",
            "run_id",
            "actor",
            "traceparent",
            "event",
            "type"
        ]
    );
    assert_eq!(e["ts"], "2025-11-30T10:53:20.003000Z");
    assert_eq!(e["workspace_id"], WS);
    let id = e["id"].as_str().unwrap();
    assert_eq!((id.len(), &id[14..15]), (36, "4"), "UUID4: {id}");
    // Envelopes round-trip.
    let back: EventEnvelope = serde_json::from_value(e.clone()).unwrap();
    assert_eq!(back, evs[0]);
    assert_eq!(
        super::engine::format_ts(1_764_500_000_000_000),
        "2025-11-30T10:53:20Z"
    );
}

#[test]
fn unknown_events_are_kept_opaque_and_replayed() {
    let mut h = seeded();
    let mut e = serde_json::to_value(&h.log[1]).unwrap();
    e["seq"] = json!(3);
    e["event"] = json!({"type": "sticker_added", "thread_id": "main", "sticker": "🎉"});
    let env: EventEnvelope = serde_json::from_value(e.clone()).unwrap();
    assert!(matches!(env.event, super::frames::Event::Unknown(_)));
    assert_eq!(serde_json::to_value(&env).unwrap(), e);
    h.log.push(env);
    let ws = Workspace::replay(WS, &h.log).unwrap();
    assert_eq!(ws.state.head_seq, 3);
    assert_eq!(ws.state.unknown[&3]["sticker"], "🎉");
    // A known type with a malformed body is refused, not taken as unknown.
    let mut bad = e;
    bad["event"] = json!({"type": "thread_created"});
    assert!(serde_json::from_value::<EventEnvelope>(bad).is_err());
}

#[test]
fn replica_applies_in_order_and_reports_gaps() {
    let mut h = seeded();
    for i in 0..4 {
        h.ok(
            &bob(),
            CapSet::none(),
            cmd(
                &format!("m{i}"),
                json!({"type": "post_message", "thread_id": "main", "content": format!("m{i}")}),
            ),
        );
    }
    let log = h.log.clone();
    assert_eq!(log.len(), 6);
    let mut r = Replica::new(WS);
    assert_eq!(r.receive(log[0].clone()).unwrap().len(), 1);
    // 3 and 5 arrive before 2: held back, gap reported from 1.
    assert!(r.receive(log[2].clone()).unwrap().is_empty());
    assert!(r.receive(log[4].clone()).unwrap().is_empty());
    assert_eq!(r.needs_resend_from(), Some(1));
    assert_eq!(r.head_seq(), 1);
    // 2 fills the first gap: 2 and 3 apply; 5 still waits behind 4.
    let applied: Vec<u64> = r
        .receive(log[1].clone())
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(applied, [2, 3]);
    assert_eq!(r.needs_resend_from(), Some(3));
    // A duplicate is ignored.
    assert!(r.receive(log[0].clone()).unwrap().is_empty());
    let applied: Vec<u64> = r
        .receive(log[3].clone())
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(applied, [4, 5]);
    r.receive(log[5].clone()).unwrap();
    assert_eq!(r.needs_resend_from(), None);
    assert_eq!(r.state, h.ws.state);
    // Foreign workspace and seq 0 are refused.
    let mut foreign = log[0].clone();
    foreign.workspace_id = "thr_other".into();
    assert!(r.receive(foreign).is_err());
    let mut zero = log[0].clone();
    zero.seq = 0;
    assert!(r.receive(zero).is_err());
}

#[test]
fn replica_refuses_an_event_that_does_not_fit() {
    let h = seeded();
    let mut r = Replica::new(WS);
    let mut wrong = h.log[1].clone();
    wrong.seq = 1; // artifact_created in a thread-less state is fine, but version 2 is not
    if let super::frames::Event::Known(super::frames::KnownEvent::ArtifactCreated {
        version, ..
    }) = &mut wrong.event
    {
        *version = 2;
    }
    assert!(r.receive(wrong).is_err());
    assert_eq!(r.head_seq(), 0);
}

#[test]
fn runs_follow_the_other_partys_awp_state() {
    let mut h = seeded();
    let party = bob();
    let step = |h: &mut Host, state: &str, note: Option<&str>| -> Vec<Value> {
        let evs = runs::on_peer_state(&h.ws.state, &party, "main", state, note, &mut h.ids);
        let envs = commit(&mut h.ws, &party, h.now, &mut h.ids, evs).unwrap();
        h.log.extend(envs.iter().cloned());
        envs.iter()
            .map(|e| serde_json::to_value(&e.event).unwrap())
            .collect()
    };
    let e = step(&mut h, "working", None);
    assert_eq!(e.len(), 1);
    assert_eq!(
        (e[0]["type"].as_str(), e[0]["trigger"].as_str()),
        (Some("run_started"), Some("api"))
    );
    let run_id = e[0]["run_id"].clone();
    assert!(step(&mut h, "working", None).is_empty(), "already running");
    assert_eq!(
        h.ws.state.active_runs(),
        [(run_id.as_str().unwrap().to_owned(), "main".to_owned())]
    );
    let e = step(&mut h, "waiting", Some("which port?"));
    assert_eq!(e[0]["type"], "run_paused");
    assert_eq!(e[0]["requests"][0]["kind"], "question");
    assert_eq!(e[0]["requests"][0]["args"]["question"], "which port?");
    assert!(
        step(&mut h, "waiting", Some("which port?")).is_empty(),
        "same question"
    );
    assert!(
        h.ws.state.active_runs().is_empty(),
        "a paused run is not active"
    );
    // The host answers the question.
    let call = e[0]["requests"][0]["tool_call_id"].clone();
    let out = h.ok(&alice(), CapSet::all(), cmd("ans", json!({"type": "answer_deferred", "run_id": run_id, "tool_call_id": call, "answer": "8080"})));
    assert_eq!(out["type"], "recorded");
    let (r, _) = h.run(&alice(), CapSet::all(), cmd("ans2", json!({"type": "answer_deferred", "run_id": run_id, "tool_call_id": call, "answer": "x"})));
    assert_eq!(rejection(&r)["type"], "invalid_state");
    let e = step(&mut h, "working", None);
    assert_eq!(
        (e[0]["trigger"].as_str(), &e[0]["run_id"]),
        (Some("resume"), &run_id)
    );
    let e = step(&mut h, "failed", Some("disk full"));
    assert_eq!(
        e[0],
        json!({"type": "run_ended", "run_id": run_id, "thread_id": "main", "status": "failed", "error": "disk full", "usage": null})
    );
    assert!(step(&mut h, "done", None).is_empty(), "no open run");
    let e = step(&mut h, "waiting", Some("ready?"));
    assert_eq!(e.len(), 2, "a question without a run starts one");
    let e = step(&mut h, "done", Some("ignored"));
    assert_eq!(
        (e[0]["status"].as_str(), &e[0]["error"]),
        (Some("completed"), &Value::Null)
    );
    assert!(step(&mut h, "closed", None).is_empty());
    assert_eq!(Workspace::replay(WS, &h.log).unwrap().state, h.ws.state);
}

#[test]
fn snapshot_round_trips_through_json() {
    let mut h = seeded();
    h.ok(&bob(), CapSet::none(), cmd("b", edit(1, "world", "there")));
    let snap = serde_json::to_string(&h.ws).unwrap();
    let back: Workspace = serde_json::from_str(&snap).unwrap();
    assert_eq!(back, h.ws);
    assert!(back.dedup.get(&bob().participant(), "b").is_some());
}

// ---------------------------------------------------------------- seed schema

/// The seed schema with the UnknownEvent fix (spec/artifactr.v1.schema.json), rooted at
/// `$defs/<def>`.
fn validator(def: &str) -> jsonschema::Validator {
    let text = include_str!("../../spec/artifactr.v1.schema.json");
    let mut s: Value = serde_json::from_str(text).unwrap();
    s["$ref"] = json!(format!("#/$defs/{def}"));
    jsonschema::validator_for(&s).unwrap()
}

fn assert_valid(v: &jsonschema::Validator, x: &Value) {
    let errs: Vec<String> = v.iter_errors(x).map(|e| e.to_string()).collect();
    assert!(errs.is_empty(), "{x}\n{errs:?}");
}

#[test]
fn spec_schema_is_the_seed_with_the_unknown_event_fix() {
    let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/seeds/artifactr.v1.schema.json");
    let Ok(text) = std::fs::read_to_string(&seed) else {
        eprintln!("skipped: ../shared/seeds/artifactr.v1.schema.json is absent");
        return;
    };
    let mut seed: Value = serde_json::from_str(&text).unwrap();
    let ours: Value =
        serde_json::from_str(include_str!("../../spec/artifactr.v1.schema.json")).unwrap();
    let fixed = &ours["$defs"]["UnknownEvent"];
    assert_eq!(
        fixed["properties"]["type"]["not"]["enum"]
            .as_array()
            .unwrap()
            .len(),
        super::frames::KNOWN_EVENT_TYPES.len()
    );
    let names: Vec<&str> = fixed["properties"]["type"]["not"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(names, super::frames::KNOWN_EVENT_TYPES);
    seed["$defs"]["UnknownEvent"] = fixed.clone();
    assert_eq!(seed, ours, "only UnknownEvent differs from the seed");
    // Without the fix, a known event fails (it matches two oneOf branches).
    let mut raw: Value = serde_json::from_str(&text).unwrap();
    raw["$ref"] = json!("#/$defs/EventFrame");
    let v = jsonschema::validator_for(&raw).unwrap();
    let h = seeded();
    assert!(!v.is_valid(&serde_json::to_value(&h.log[0]).unwrap()));
}

#[test]
fn every_frame_validates_against_the_schema() {
    let mut h = seeded();
    let frames = vec![
        (
            alice(),
            CapSet::all(),
            cmd(
                "s1",
                json!({"type": "set_thread_mode", "thread_id": "main", "mode": "suggest"}),
            ),
        ),
        (
            alice(),
            CapSet::all(),
            cmd(
                "s2",
                json!({"type": "set_focus", "thread_id": "main", "artifact_ids": ["art_doc"]}),
            ),
        ),
        (
            bob(),
            CapSet::none(),
            cmd(
                "b1",
                json!({"type": "post_message", "thread_id": "main", "content": "hi"}),
            ),
        ),
        (
            bob(),
            CapSet::none(),
            cmd(
                "b2",
                json!({"type": "create_artifact", "kind": "code", "data": {"language": "rust"}}),
            ),
        ),
        (bob(), CapSet::none(), cmd("b3", edit(1, "world", "there"))),
        (
            bob(),
            CapSet::none(),
            cmd(
                "b4",
                json!({"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 1}),
            ),
        ),
        (bob(), CapSet::none(), cmd("b5", edit(1, "nope", "x"))),
        (
            alice(),
            CapSet::all(),
            cmd(
                "a3",
                json!({"type": "set_thread_mode", "thread_id": "main", "mode": "edit"}),
            ),
        ),
        (alice(), CapSet::all(), cmd("a4", edit(1, "Hello", "Hi"))),
        (
            alice(),
            CapSet::all(),
            cmd(
                "a5",
                json!({"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 1}),
            ),
        ),
        (
            alice(),
            CapSet::all(),
            cmd(
                "a6",
                json!({"type": "create_artifact", "kind": "json", "data": {"value": {"a": 1}}}),
            ),
        ),
    ];
    let vc = validator("CommandFrame");
    let vr = validator("CommandResult");
    for (actor, caps, f) in frames {
        assert_valid(&vc, &f);
        let (r, _) = h.run(&actor, caps, f);
        assert_valid(&vr, &serde_json::to_value(&r).unwrap());
    }
    // Accept and reject the two proposals bob made.
    let pids: Vec<String> = h.ws.state.proposals.keys().cloned().collect();
    for (i, pid) in pids.iter().enumerate() {
        let decision = if i == 0 { "accept" } else { "reject" };
        let f = cmd(
            &format!("r{i}"),
            json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": decision}),
        );
        assert_valid(&vc, &f);
        let (r, _) = h.run(&alice(), CapSet::all(), f);
        assert_valid(&vr, &serde_json::to_value(&r).unwrap());
    }
    let party = bob();
    for (state, note) in [
        ("working", None),
        ("waiting", Some("ok?")),
        ("failed", Some("boom")),
    ] {
        let evs = runs::on_peer_state(&h.ws.state, &party, "main", state, note, &mut h.ids);
        h.log
            .extend(commit(&mut h.ws, &party, h.now, &mut h.ids, evs).unwrap());
    }
    let ve = validator("EventFrame");
    let types: std::collections::BTreeSet<String> = h
        .log
        .iter()
        .map(|e| {
            serde_json::to_value(&e.event).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for e in &h.log {
        assert_valid(&ve, &serde_json::to_value(e).unwrap());
    }
    for t in [
        "thread_created",
        "thread_mode_changed",
        "focus_changed",
        "message_posted",
        "artifact_created",
        "artifact_changed",
        "artifact_archived",
        "proposal_created",
        "proposal_resolved",
        "run_started",
        "run_paused",
        "run_ended",
    ] {
        assert!(types.contains(t), "{t} not covered: {types:?}");
    }
}

// ---------------------------------------------------------------- properties

/// One random step: who and which command.
#[derive(Debug, Clone)]
enum Op {
    /// Answer the first pending question of any paused run.
    Answer {
        who: u8,
    },
    /// An AWP `state` line of a peer (1..=3): 0 working, 1 waiting, 2 done, 3 failed.
    AwpState {
        who: u8,
        state: u8,
        note: bool,
    },
    Edit {
        who: u8,
        art: u8,
        base_off: i8,
        text: u8,
    },
    Create {
        who: u8,
        art: u8,
    },
    Archive {
        who: u8,
        art: u8,
    },
    Respond {
        who: u8,
        prop: u8,
        accept: bool,
        changes: bool,
    },
    Mode {
        who: u8,
        suggest: bool,
    },
    Post {
        who: u8,
    },
    Repeat {
        back: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4u8, 0..3u8, -1..2i8, 0..4u8).prop_map(|(who, art, base_off, text)| Op::Edit { who, art, base_off, text }),
        2 => (0..4u8, 0..4u8).prop_map(|(who, art)| Op::Create { who, art }),
        1 => (0..4u8, 0..3u8).prop_map(|(who, art)| Op::Archive { who, art }),
        3 => (0..4u8, 0..6u8, any::<bool>(), any::<bool>()).prop_map(|(who, prop, accept, changes)| Op::Respond { who, prop, accept, changes }),
        1 => (0..4u8, any::<bool>()).prop_map(|(who, suggest)| Op::Mode { who, suggest }),
        1 => (0..4u8).prop_map(|who| Op::Post { who }),
        2 => (0..8u8).prop_map(|back| Op::Repeat { back }),
        1 => (0..4u8).prop_map(|who| Op::Answer { who }),
        2 => (1..4u8, 0..4u8, any::<bool>()).prop_map(|(who, state, note)| Op::AwpState { who, state, note }),
    ]
}

/// Actors: 0 alice (user, all caps), 1 bob (no caps), 2 carol (write+resolve), 3 dave
/// (resolve+admin, scoped grants).
fn actor_of(who: u8) -> (Actor, CapSet) {
    match who {
        0 => (alice(), CapSet::all()),
        1 => (bob(), CapSet::from_grant_caps(Vec::<String>::new(), WS)),
        2 => (
            carol(),
            CapSet::from_grant_caps(["artifact:write", "artifact:resolve"], WS),
        ),
        _ => (
            Actor::ExternalAgent {
                client_id: "ed25519:dave".into(),
                name: None,
            },
            CapSet::from_grant_caps(
                [
                    format!("artifact:resolve@{WS}"),
                    format!("artifact:admin@{WS}"),
                    "artifact:write@thr_other".into(),
                ],
                WS,
            ),
        ),
    }
}

const TEXTS: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

fn frame_of(
    op: &Op,
    i: usize,
    h: &Host,
    sent: &[(u8, CommandFrame)],
) -> Option<(u8, CommandFrame)> {
    let art_id = |a: u8| format!("art_{a}");
    let head = |a: u8| h.ws.state.artifacts.get(&art_id(a)).map_or(1, |x| x.head());
    let command = match *op {
        Op::Edit {
            who,
            art,
            base_off,
            text,
        } => {
            let cur =
                h.ws.state
                    .artifacts
                    .get(&art_id(art))
                    .map(|a| a.data()["text"].as_str().unwrap_or("").to_owned())
                    .unwrap_or_default();
            let old = cur.split(' ').next().unwrap_or("").to_owned();
            let base = (head(art) as i64 + base_off as i64).max(1);
            (
                who,
                json!({"type": "edit_artifact", "artifact_id": art_id(art), "base_version": base, "thread_id": "main",
                         "patch": {"kind": "text_edits", "edits": [{"old": old, "new": TEXTS[text as usize]}]}}),
            )
        }
        Op::Create { who, art } => (
            who,
            json!({"type": "create_artifact", "artifact_id": art_id(art), "kind": "markdown", "data": {"text": "seed text"}}),
        ),
        Op::Archive { who, art } => (
            who,
            json!({"type": "archive_artifact", "artifact_id": art_id(art), "base_version": head(art)}),
        ),
        Op::Respond {
            who,
            prop,
            accept,
            changes,
        } => {
            // Mostly a pending proposal; sometimes any (resolved ones too) or none.
            let pending =
                h.ws.state
                    .proposals
                    .values()
                    .filter(|p| p.status == super::state::ProposalStatus::Pending);
            let pid = if prop < 4 {
                pending
                    .map(|p| p.proposal_id.clone())
                    .nth(prop as usize % 2)
            } else {
                h.ws.state.proposals.keys().nth(prop as usize - 4).cloned()
            }
            .unwrap_or_else(|| "prp_none".into());
            let ch = if changes {
                json!({"kind": "json_patch", "ops": [{"op": "replace", "path": "/text", "value": format!("reviewed {i}")}]})
            } else {
                Value::Null
            };
            (
                who,
                json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": if accept {"accept"} else {"reject"}, "changes": ch}),
            )
        }
        Op::Mode { who, suggest } => (
            who,
            json!({"type": "set_thread_mode", "thread_id": "main", "mode": if suggest {"suggest"} else {"edit"}}),
        ),
        Op::Post { who } => (
            who,
            json!({"type": "post_message", "thread_id": "main", "content": format!("note {i}")}),
        ),
        Op::Repeat { back } => {
            let k = sent.len().checked_sub(1 + back as usize)?;
            return Some(sent[k].clone());
        }
        Op::AwpState { .. } => return None,
        Op::Answer { who } => {
            let (run_id, call) =
                h.ws.state
                    .runs
                    .values()
                    .find_map(|r| {
                        r.requests
                            .first()
                            .map(|q| (r.run_id.clone(), q.tool_call_id.clone()))
                    })
                    .unwrap_or_else(|| ("run_none".into(), "call_none".into()));
            (
                who,
                json!({"type": "answer_deferred", "run_id": run_id, "tool_call_id": call, "answer": i}),
            )
        }
    };
    let f = parse_command_frame(&cmd(&format!("p{i}"), command.1)).ok()?;
    Some((command.0, f))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_replica_equal_versions_dense_and_rejections_inert(ops in proptest::collection::vec(op(), 1..40)) {
        let mut h = seeded();
        let mut replica = Replica::new(WS);
        for e in h.log.clone() { replica.receive(e).unwrap(); }
        let mut sent: Vec<(u8, CommandFrame)> = Vec::new();
        // The data of every version, seen while it was the head.
        let mut seen = std::collections::BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            if let Op::AwpState { who, state, note } = *op {
                // Run events the host commits for a peer's AWP state reach the replica too.
                let (party, _) = actor_of(who);
                let state = ["working", "waiting", "done", "failed"][state as usize];
                let note = note.then(|| format!("note {i}"));
                let evs = runs::on_peer_state(&h.ws.state, &party, "main", state, note.as_deref(), &mut h.ids);
                let envs = commit(&mut h.ws, &party, h.now, &mut h.ids, evs).unwrap();
                h.log.extend(envs.iter().cloned());
                for e in envs { replica.receive(e).unwrap(); }
                continue;
            }
            let Some((who, frame)) = frame_of(op, i, &h, &sent) else { continue };
            let (actor, caps) = actor_of(who);
            let before = h.ws.state.clone();
            let remembered = h.ws.dedup.get(&actor.participant(), &frame.command_id).cloned();
            let repeat = remembered.is_some();
            let (r, evs) = h.run_frame(&actor, caps, &frame);
            if let Some(first) = remembered {
                // A repeated command_id is a no-op returning the first result.
                prop_assert_eq!(&r, &first);
                prop_assert!(evs.is_empty());
                prop_assert_eq!(&h.ws.state, &before);
            }
            if !r.ok {
                prop_assert!(evs.is_empty());
                prop_assert_eq!(&h.ws.state, &before);
            }
            // Seqs are consecutive and the outcome's seq is the last one.
            for (k, e) in evs.iter().enumerate() {
                prop_assert_eq!(e.seq, before.head_seq + 1 + k as u64);
            }
            if let (Some(o), false) = (&r.outcome, repeat) {
                let seq = serde_json::to_value(o).unwrap()["seq"].as_u64();
                prop_assert_eq!(seq, evs.last().map(|e| e.seq));
            }
            // Every version strictly increases by one.
            for (id, a) in &h.ws.state.artifacts {
                seen.entry((id.clone(), a.head())).or_insert_with(|| a.data().clone());
                for (k, v) in a.versions.iter().enumerate() {
                    prop_assert_eq!(v.version, k as u64 + 1, "{}", id);
                }
                if let Some(b) = before.artifacts.get(id) {
                    prop_assert!(a.head() == b.head() || a.head() == b.head() + 1);
                }
            }
            // Events reach the replica in a shuffled-by-one order (pairs swapped).
            let mut evs = evs;
            if evs.len() == 2 { evs.swap(0, 1); }
            for e in evs {
                let e: EventEnvelope = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
                replica.receive(e).unwrap();
            }
            prop_assert_eq!(replica.needs_resend_from(), None);
            sent.push((who, frame));
        }
        prop_assert_eq!(&replica.state, &h.ws.state);
        prop_assert_eq!(&Workspace::replay(WS, &h.log).unwrap().state, &h.ws.state);
        // Older versions rebuild to the data they had (versions are stored as patches).
        for ((id, v), data) in &seen {
            let a = &replica.state.artifacts[id];
            let at = a.data_at(*v);
            prop_assert_eq!(at.as_ref(), Some(data), "{} v{}", id, v);
            let (hv, hd) = a.history().nth(*v as usize - 1).unwrap();
            prop_assert_eq!((hv.version, &hd), (*v, data));
        }
    }
}

/// spec/artifact-threads.md §11, step by step: the outcomes, versions and recorded patch the
/// example shows.
#[test]
fn worked_example_of_the_spec() {
    let th = "thr_01JPLAN";
    let alice = Actor::User {
        id: "ed25519:ALICE".into(),
        name: None,
    };
    let bob = Actor::ExternalAgent {
        client_id: "ed25519:BOB".into(),
        name: Some("bob@laptop".into()),
    };
    let bob_caps = CapSet::from_grant_caps([format!("artifact:resolve@{th}")], th);
    let mut h = Host::new();
    h.ws = Workspace::new(th);
    h.ok(
        &alice,
        CapSet::all(),
        cmd(
            "open-1",
            json!({"type": "create_thread", "thread_id": th, "title": "Release plan"}),
        ),
    );
    h.ok(
        &alice,
        CapSet::all(),
        cmd(
            "open-2",
            json!({"type": "create_artifact", "artifact_id": "art_5e1f0c2a9b7d4e31",
        "kind": "markdown", "data": {"text": "# Plan\nShip on Friday.\n"}, "thread_id": th}),
        ),
    );
    let mut replica = Replica::new(th);
    for e in h.log.clone() {
        replica.receive(e).unwrap();
    }
    // 2. bob's edit becomes a proposal (seq 3).
    let (r, evs) = h.run(&bob, bob_caps, cmd("cmd-bob-1", json!({"type": "edit_artifact",
        "artifact_id": "art_5e1f0c2a9b7d4e31", "base_version": 1,
        "patch": {"kind": "text_edits", "field": "text", "edits": [{"old": "Friday", "new": "Thursday"}]}})));
    let out = serde_json::to_value(r.outcome.unwrap()).unwrap();
    assert_eq!(
        (out["seq"].as_u64(), out["type"].as_str()),
        (Some(3), Some("proposed"))
    );
    let pid = out["proposal_id"].clone();
    let ev = serde_json::to_value(&evs[0]).unwrap();
    assert_eq!(ev["thread_id"], Value::Null);
    assert_eq!(
        ev["event"]["change"]["summary"],
        "edited text (1 replacement)"
    );
    // 3. bob may not accept his own.
    let (r, _) = h.run(
        &bob,
        bob_caps,
        cmd(
            "cmd-bob-2",
            json!({"type": "respond_to_proposal", "proposal_id": pid, "decision": "accept"}),
        ),
    );
    assert_eq!(
        rejection(&r),
        json!({"type": "forbidden", "message": "a proposal must be resolved by someone other than its author"})
    );
    // 4. alice accepts with changes: seq 4 artifact_changed (diff), seq 5 proposal_resolved.
    let (r, evs) = h.run(&alice, CapSet::all(), cmd("cli-1", json!({"type": "respond_to_proposal", "proposal_id": pid,
        "decision": "accept", "changes": {"kind": "text_edits", "edits": [{"old": "Thursday", "new": "Thursday 10:00"}]}})));
    assert_eq!(
        serde_json::to_value(r.outcome.unwrap()).unwrap(),
        json!({"seq": 5, "type": "resolved", "proposal_id": pid, "decision": "accept", "version": 2})
    );
    let changed = serde_json::to_value(&evs[0].event).unwrap();
    assert_eq!(
        changed["patch"],
        json!({"kind": "json_patch", "ops": [{"op": "replace", "path": "/text",
        "value": "# Plan\nShip on Thursday 10:00.\n"}]})
    );
    assert_eq!(changed["summary"], "edited text (1 replacement)");
    // 5. bob's replica gets 5 before 4: held, resend after 3, then both apply.
    for e in h.log[2..3].iter().cloned() {
        replica.receive(e).unwrap();
    }
    replica.receive(h.log[4].clone()).unwrap();
    assert_eq!(replica.needs_resend_from(), Some(3));
    replica.receive(h.log[3].clone()).unwrap();
    assert_eq!(replica.needs_resend_from(), None);
    assert_eq!(replica.state, h.ws.state);
}

#[test]
fn commit_reports_the_first_event_that_does_not_fit() {
    use super::frames::{KnownEvent, RunTrigger};
    let mut h = seeded();
    let start = KnownEvent::RunStarted {
        run_id: "run_a".into(),
        thread_id: "main".into(),
        trigger: RunTrigger::Api,
    };
    let end_unknown = KnownEvent::RunEnded {
        run_id: "run_zz".into(),
        thread_id: "main".into(),
        status: super::frames::RunStatus::Completed,
        error: None,
        usage: None,
    };
    let err = commit(
        &mut h.ws,
        &bob(),
        h.now,
        &mut h.ids,
        vec![start, end_unknown],
    )
    .unwrap_err();
    assert_eq!(err.applied.len(), 1, "run_started applied");
    assert_eq!(err.applied[0].seq, 3);
    assert!(
        matches!(
            err.error,
            super::state::ApplyError::Inconsistent { seq: 4, .. }
        ),
        "{err}"
    );
    assert_eq!(h.ws.state.head_seq, 3);
    h.log.extend(err.applied);
    assert_eq!(Workspace::replay(WS, &h.log).unwrap().state, h.ws.state);
}

/// Random JSON values: scalars (strings with NUL, empty, unicode), arrays, objects.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        "[a-z\u{0}é/~0~1 ]{0,8}".prop_map(Value::String),
        Just(json!("art_doc")),
        Just(json!("main")),
        Just(json!("text")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("text".to_owned()),
                    Just("op".to_owned()),
                    Just("path".to_owned()),
                    Just("value".to_owned()),
                    "[a-z_]{1,6}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Valid commands of every type; the test replaces some of their fields with hostile values.
fn templates() -> Vec<Value> {
    vec![
        json!({"type": "create_artifact", "kind": "markdown", "data": {"text": "x"}, "thread_id": "main"}),
        json!({"type": "create_artifact", "kind": "json", "data": {"value": 1, "schema": {"type": "integer"}}}),
        edit(1, "Hello", "Bye"),
        json!({"type": "edit_artifact", "artifact_id": "art_doc", "base_version": 1,
               "patch": {"kind": "json_patch", "ops": [{"op": "add", "path": "/text", "value": "y"}]}}),
        json!({"type": "archive_artifact", "artifact_id": "art_doc", "base_version": 1}),
        json!({"type": "propose_change", "change": edit(1, "world", "there"), "rationale": "r"}),
        json!({"type": "respond_to_proposal", "proposal_id": "prp_a", "decision": "accept",
               "changes": {"kind": "text_edits", "edits": [{"old": "there", "new": "you"}]}}),
        json!({"type": "create_thread", "title": "t"}),
        json!({"type": "post_message", "thread_id": "main", "content": "hi"}),
        json!({"type": "set_focus", "thread_id": "main", "artifact_ids": ["art_doc"]}),
        json!({"type": "set_thread_mode", "thread_id": "main", "mode": "suggest"}),
        json!({"type": "answer_deferred", "run_id": "run_x", "tool_call_id": "c"}),
        json!({"type": "stop_run", "run_id": "run_x"}),
        json!({"type": "watch_run", "run_id": "run_x"}),
    ]
}

/// Replace the value at a random path inside `v` (descending `depth` steps) with `new`.
fn mutate(v: &mut Value, mut pick: usize, depth: usize, new: Value) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let key = m.keys().nth(pick % m.len()).cloned().unwrap();
            let child = m.get_mut(&key).unwrap();
            if depth == 0 || !(child.is_object() || child.is_array()) {
                *child = new;
            } else {
                pick /= 3;
                mutate(child, pick, depth - 1, new);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let n = a.len();
            let child = &mut a[pick % n];
            if depth == 0 || !(child.is_object() || child.is_array()) {
                *child = new;
            } else {
                mutate(child, pick / 3, depth - 1, new);
            }
        }
        _ => *v = new,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, max_shrink_iters: 100, ..ProptestConfig::default() })]

    /// Hostile command data: valid commands with random fields replaced by random JSON
    /// (strings with NUL, empty strings, wrong types, deep values). Parsing never panics;
    /// a parsed frame applies without panic; a rejection changes nothing; an applied
    /// command replays to the same state.
    #[test]
    fn hostile_command_data_never_panics(
        t in 0..14usize,
        mutations in proptest::collection::vec((any::<usize>(), 0..4usize, any_json()), 0..3),
        who in 0..4u8,
    ) {
        let mut command = templates()[t].clone();
        for (pick, depth, v) in mutations {
            mutate(&mut command, pick, depth, v);
        }
        if let Value::Object(m) = &mut command {
            m.insert("type".into(), templates()[t]["type"].clone());
        }
        let frame = json!({"command_id": "h", "command": command});
        let Ok(frame) = parse_command_frame(&frame) else { return Ok(()) };
        let mut h = seeded();
        h.ok(&bob(), CapSet::none(), cmd("setup-p", json!({"type": "propose_change", "proposal_id": "prp_a", "change": edit(1, "world", "there")})));
        let before = h.ws.state.clone();
        let (actor, caps) = actor_of(who);
        let (r, evs) = h.run_frame(&actor, caps, &frame);
        if r.ok {
            let replayed = Workspace::replay(WS, &h.log).unwrap();
            prop_assert_eq!(&replayed.state, &h.ws.state);
        } else {
            prop_assert!(evs.is_empty());
            prop_assert_eq!(&h.ws.state, &before);
        }
    }
}
