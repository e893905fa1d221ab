//! `awp artifact …`: artifact threads (artifactr.v1 workspaces on AWP threads). Threads,
//! artifacts and proposals are named by id or unique prefix. The node does the work (see
//! `node::artifacts::control`); this file builds the arguments and prints the answers.

use super::format::str_field;
use super::{out, out_json, Ctx, Exit, Failure};
use crate::control::Request;
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use std::io::Read;
use std::path::PathBuf;

/// `awp artifact` subcommands.
#[derive(Debug, Subcommand)]
pub enum ArtifactCmd {
    /// Create an artifact. With PEER: a new artifact thread with that peer, hosted here.
    /// With -t TH: in an existing artifact thread (sent to the host when it is the peer).
    New {
        /// The peer of a new artifact thread (key, key prefix or name).
        #[arg(allow_hyphen_values = true, required_unless_present = "thread")]
        peer: Option<String>,
        /// An existing artifact thread (id or unique prefix).
        #[arg(short = 't', long = "thread", value_name = "TH")]
        thread: Option<String>,
        /// markdown {text}, code {language, text} or json {value, schema}.
        #[arg(long, default_value = "markdown")]
        kind: String,
        /// Title of a new thread (the AWP subject and the artifactr thread title).
        #[arg(long, value_name = "T")]
        title: Option<String>,
        /// The text (markdown, code); `-` reads stdin.
        #[arg(long, value_name = "FILE", conflicts_with = "json_file")]
        text_file: Option<PathBuf>,
        /// The value of a json artifact; `-` reads stdin.
        #[arg(long, value_name = "FILE")]
        json_file: Option<PathBuf>,
        /// A JSON Schema the json artifact's value must satisfy (on every change).
        #[arg(long, value_name = "FILE")]
        schema: Option<PathBuf>,
        /// Language of a code artifact.
        #[arg(long)]
        language: Option<String>,
        /// The artifact id (default: generated `art_…`).
        #[arg(long)]
        id: Option<String>,
    },
    /// Artifact threads with their artifacts.
    List {
        /// Only this thread (prefix).
        #[arg(short = 't', long = "thread", value_name = "TH")]
        thread: Option<String>,
    },
    /// An artifact's content (current or `--version N`), or `--diff A..B`.
    Show {
        #[command(flatten)]
        at: At,
        /// A version (default: the current one).
        #[arg(long, value_name = "N")]
        version: Option<u64>,
        /// Unified diff between two versions, `A..B`.
        #[arg(long, value_name = "A..B", conflicts_with = "version")]
        diff: Option<String>,
    },
    /// Change an artifact (applied directly, or recorded as a proposal when this node may
    /// not write there).
    Edit {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        patch: PatchArgs,
        /// Version the change is based on (default: the current one known here).
        #[arg(long, value_name = "N")]
        base: Option<u64>,
        /// A summary of the change.
        #[arg(long)]
        summary: Option<String>,
    },
    /// Archive an artifact (read-only from then on).
    Archive {
        #[command(flatten)]
        at: At,
    },
    /// Propose a change for the other party to accept or reject.
    Propose {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        patch: PatchArgs,
        /// Why.
        #[arg(long)]
        rationale: Option<String>,
        /// Version the change is based on (default: the current one known here).
        #[arg(long, value_name = "N")]
        base: Option<u64>,
    },
    /// Pending proposals (`--all`: resolved ones too).
    Proposals {
        /// The artifact thread (id or unique prefix).
        th: String,
        #[arg(long)]
        all: bool,
    },
    /// Accept a proposal, optionally with your own changes on top.
    Accept {
        /// The artifact thread.
        th: String,
        /// The proposal (id or unique prefix).
        proposal: String,
        /// A JSON Patch file (or `-`) applied on top of the proposed change.
        #[arg(long, value_name = "FILE", conflicts_with = "with_replace")]
        with_changes: Option<PathBuf>,
        /// A text replacement applied on top of the proposed change.
        #[arg(long, num_args = 2, value_names = ["OLD", "NEW"], allow_hyphen_values = true)]
        with_replace: Vec<String>,
        /// Text field of `--with-replace` (default text).
        #[arg(long, default_value = "text")]
        field: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a proposal.
    Reject {
        th: String,
        proposal: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Set the thread's mode: `edit`, or `suggest` (agents' changes become proposals).
    Mode {
        th: String,
        #[arg(value_parser = ["edit", "suggest"])]
        mode: String,
    },
    /// Set the artifacts the thread is focused on.
    Focus { th: String, artifacts: Vec<String> },
    /// The thread's event log (`--follow`: then live events).
    Log {
        th: String,
        /// Only events with seq > N.
        #[arg(long, value_name = "N", default_value_t = 0)]
        after: u64,
        #[arg(long)]
        follow: bool,
    },
}

/// An artifact in a thread.
#[derive(Debug, Args)]
pub struct At {
    /// The artifact thread (id or unique prefix).
    pub th: String,
    /// The artifact (id or unique prefix).
    pub artifact: String,
}

/// A change: a JSON Patch or text replacements.
#[derive(Debug, Args)]
pub struct PatchArgs {
    /// RFC 6902 JSON Patch: a file with the ops array (or `{"ops": […]}`); `-` reads stdin.
    #[arg(long, value_name = "FILE", conflicts_with = "replace")]
    pub json_patch: Option<PathBuf>,
    /// Replace OLD (which must occur exactly once) with NEW; repeatable, applied in order.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"], allow_hyphen_values = true)]
    pub replace: Vec<String>,
    /// Text field of `--replace` (default text).
    #[arg(long, default_value = "text")]
    pub field: String,
}

fn read_input(p: &PathBuf) -> Result<String, Failure> {
    let mut s = String::new();
    let r = if p.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut s).map(|_| ())
    } else {
        std::fs::read_to_string(p).map(|t| s = t)
    };
    r.map_err(|e| Failure::usage(format!("cannot read {}: {e}", p.display()), ""))?;
    Ok(s)
}

fn read_json(p: &PathBuf) -> Result<Value, Failure> {
    serde_json::from_str(&read_input(p)?)
        .map_err(|e| Failure::usage(format!("{} is not JSON: {e}", p.display()), ""))
}

fn json_patch(p: &PathBuf) -> Result<Value, Failure> {
    let v = read_json(p)?;
    let ops = match v {
        Value::Array(_) => v,
        Value::Object(ref m) if m.get("ops").is_some_and(Value::is_array) => m["ops"].clone(),
        _ => return Err(Failure::usage("a JSON Patch is an array of ops", "")),
    };
    Ok(json!({"kind": "json_patch", "ops": ops}))
}

/// A `text_edits` change of `field`: each pair of `pairs` is OLD, NEW.
pub(crate) fn text_edits(field: &str, pairs: &[String]) -> Value {
    let edits: Vec<Value> = pairs
        .chunks(2)
        .map(|c| json!({"old": c[0], "new": c.get(1).cloned().unwrap_or_default()}))
        .collect();
    json!({"kind": "text_edits", "field": field, "edits": edits})
}

fn patch(p: &PatchArgs) -> Result<Value, Failure> {
    match (&p.json_patch, p.replace.is_empty()) {
        (Some(f), _) => json_patch(f),
        (None, false) => Ok(text_edits(&p.field, &p.replace)),
        (None, true) => Err(Failure::usage(
            "no change given",
            "use --json-patch FILE or --replace OLD NEW",
        )),
    }
}

async fn call(ctx: &Ctx, action: &str, args: Value) -> Result<Map<String, Value>, Failure> {
    ctx.call(&Request::Artifact {
        action: action.into(),
        args,
    })
    .await
}

/// Print a command's answer: the result (exit 1 on a rejection), or `queued`.
fn print_result(ctx: &Ctx, body: &Map<String, Value>) -> Result<(), Failure> {
    let report = result_report(body);
    if ctx.json {
        out_json(&Value::Object(body.clone()))?;
        return report
            .map(|_| ())
            .map_err(|_| Failure::silent(Exit::Failed));
    }
    out(&report?)
}

/// An artifact command's answer as `awp artifact` reports it: the line (`applied ART vN
/// (thread TH, seq S)`, `proposed …`, `accepted …`, `queued for the host of TH …`), or
/// for a rejection by the engine the failure (exit 1) `rejected: TYPE: MESSAGE`, with
/// the grant cap it lacks in the hint.
pub(crate) fn result_report(body: &Map<String, Value>) -> Result<String, Failure> {
    let result = body.get("result").cloned().unwrap_or(Value::Null);
    let rejected =
        result.get("ok") == Some(&json!(false)) || result.get("type") == Some(&json!("error"));
    if body.get("queued") == Some(&json!(true)) {
        return Ok(format!(
            "queued for the host of {} (the result shows in `awp artifact log`)",
            str_field(body, &["th"]).unwrap_or("?")
        ));
    }
    if rejected {
        let r = result
            .get("rejection")
            .or(Some(&result))
            .cloned()
            .unwrap_or(Value::Null);
        // A `forbidden` names the grant cap it lacks (spec/artifact-threads.md).
        let hint = match r.get("cap").and_then(Value::as_str) {
            Some(cap) => format!(
                "it needs the grant cap {cap}: ask the thread's host for `awp grant PEER {cap}`"
            ),
            None => String::new(),
        };
        return Err(Failure::new(
            Exit::Failed,
            format!(
                "rejected: {}: {}",
                r.get("type").and_then(Value::as_str).unwrap_or("error"),
                r.get("message").and_then(Value::as_str).unwrap_or("")
            ),
            hint,
        ));
    }
    let o = result.get("outcome").cloned().unwrap_or(Value::Null);
    let th = str_field(body, &["th"]).unwrap_or("?");
    Ok(match o.get("type").and_then(Value::as_str) {
        Some("applied") => format!(
            "applied {} v{} (thread {th}, seq {})",
            o["artifact_id"].as_str().unwrap_or("?"),
            o["version"],
            o["seq"]
        ),
        Some("proposed") => format!(
            "proposed {} (thread {th}, seq {})",
            o["proposal_id"].as_str().unwrap_or("?"),
            o["seq"]
        ),
        Some("resolved") => format!(
            "{} {} (version {}, seq {})",
            if o["decision"] == "accept" {
                "accepted"
            } else {
                "rejected"
            },
            o["proposal_id"].as_str().unwrap_or("?"),
            o["version"],
            o["seq"]
        ),
        _ => format!("done (thread {th}, seq {})", o["seq"]),
    })
}

/// The text a version shows: the `text` field, or the value/data as pretty JSON.
pub(crate) fn render(kind: &str, data: &Value) -> String {
    match (kind, data.get("text").and_then(Value::as_str)) {
        ("markdown" | "code", Some(t)) => t.to_string(),
        _ => {
            let v = data.get("value").unwrap_or(data);
            serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
        }
    }
}

/// Run `awp artifact …`.
pub async fn run(ctx: &Ctx, cmd: ArtifactCmd) -> Result<(), Failure> {
    match cmd {
        ArtifactCmd::New {
            peer,
            thread,
            kind,
            title,
            text_file,
            json_file,
            schema,
            language,
            id,
        } => {
            let data = match kind.as_str() {
                "json" => {
                    let value = match &json_file {
                        Some(f) => read_json(f)?,
                        None => json!({}),
                    };
                    let mut d = json!({"value": value});
                    if let Some(s) = &schema {
                        d["schema"] = read_json(s)?;
                    }
                    d
                }
                _ => {
                    let text = match &text_file {
                        Some(f) => read_input(f)?,
                        None => String::new(),
                    };
                    let mut d = json!({"text": text});
                    if kind == "code" {
                        d["language"] = json!(language.unwrap_or_default());
                    }
                    d
                }
            };
            let body = call(
                ctx,
                "new",
                json!({"peer": peer, "th": thread, "kind": kind, "title": title, "data": data, "artifact_id": id}),
            )
            .await?;
            print_result(ctx, &body)
        }
        ArtifactCmd::List { thread } => {
            let body = call(ctx, "list", json!({"th": thread})).await?;
            let threads = body
                .get("threads")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if ctx.json {
                for t in &threads {
                    out_json(t)?;
                }
                return Ok(());
            }
            for t in threads {
                out(&format!(
                    "{}  {}  with {}  seq {}  mode {}  {} pending proposal(s)  {}",
                    t["th"].as_str().unwrap_or("?"),
                    t["role"].as_str().unwrap_or("?"),
                    t["peer_name"]
                        .as_str()
                        .or(t["peer"].as_str())
                        .unwrap_or("?"),
                    t["head_seq"],
                    t["mode"].as_str().unwrap_or("edit"),
                    t["pending_proposals"],
                    t["title"].as_str().unwrap_or(""),
                ))?;
                for a in t["artifacts"].as_array().into_iter().flatten() {
                    out(&format!(
                        "  {}  {}  v{}{}",
                        a["artifact_id"].as_str().unwrap_or("?"),
                        a["kind"].as_str().unwrap_or("?"),
                        a["version"],
                        if a["archived"] == json!(true) {
                            "  archived"
                        } else {
                            ""
                        }
                    ))?;
                }
            }
            Ok(())
        }
        ArtifactCmd::Show { at, version, diff } => {
            let mut args = json!({"th": at.th, "artifact": at.artifact, "version": version});
            if let Some(d) = &diff {
                let (a, b) = d
                    .split_once("..")
                    .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                    .ok_or_else(|| {
                        Failure::usage(format!("--diff {d}: use A..B"), "e.g. --diff 1..3")
                    })?;
                args["diff_from"] = json!(a);
                args["diff_to"] = json!(b);
            }
            let body = call(ctx, "show", args).await?;
            if ctx.json {
                return out_json(&Value::Object(body));
            }
            let kind = str_field(&body, &["kind"]).unwrap_or("").to_string();
            if diff.is_some() {
                let (fa, fb) = (&body["from"], &body["to"]);
                let a = render(&kind, &fa["data"]);
                let b = render(&kind, &fb["data"]);
                let id = str_field(&body, &["artifact_id"]).unwrap_or("?");
                let udiff = similar::TextDiff::from_lines(&a, &b)
                    .unified_diff()
                    .header(
                        &format!("{id} v{}", fa["version"]),
                        &format!("{id} v{}", fb["version"]),
                    )
                    .to_string();
                print!("{udiff}");
                return Ok(());
            }
            let text = render(&kind, &body["data"]);
            print!("{text}");
            Ok(())
        }
        ArtifactCmd::Edit {
            at,
            patch: p,
            base,
            summary,
        } => {
            let args = json!({"th": at.th, "artifact": at.artifact, "patch": patch(&p)?, "base_version": base, "summary": summary});
            print_result(ctx, &call(ctx, "edit", args).await?)
        }
        ArtifactCmd::Archive { at } => {
            let args = json!({"th": at.th, "artifact": at.artifact});
            print_result(ctx, &call(ctx, "archive", args).await?)
        }
        ArtifactCmd::Propose {
            at,
            patch: p,
            rationale,
            base,
        } => {
            let args = json!({"th": at.th, "artifact": at.artifact, "patch": patch(&p)?, "rationale": rationale, "base_version": base});
            print_result(ctx, &call(ctx, "propose", args).await?)
        }
        ArtifactCmd::Proposals { th, all } => {
            let body = call(ctx, "proposals", json!({"th": th, "all": all})).await?;
            let list = body
                .get("proposals")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for p in list {
                if ctx.json {
                    out_json(&p)?;
                    continue;
                }
                let by = &p["proposed_by"];
                out(&format!(
                    "{}  {}  {}  by {}  {}",
                    p["proposal_id"].as_str().unwrap_or("?"),
                    p["status"].as_str().unwrap_or("?"),
                    p["artifact_id"].as_str().unwrap_or("?"),
                    by["name"]
                        .as_str()
                        .or(by["client_id"].as_str())
                        .or(by["id"].as_str())
                        .unwrap_or("?"),
                    p["rationale"].as_str().unwrap_or(""),
                ))?;
            }
            Ok(())
        }
        ArtifactCmd::Accept {
            th,
            proposal,
            with_changes,
            with_replace,
            field,
            reason,
        } => {
            let changes = match (&with_changes, with_replace.is_empty()) {
                (Some(f), _) => Some(json_patch(f)?),
                (None, false) => Some(text_edits(&field, &with_replace)),
                _ => None,
            };
            let args =
                json!({"th": th, "proposal": proposal, "changes": changes, "reason": reason});
            print_result(ctx, &call(ctx, "accept", args).await?)
        }
        ArtifactCmd::Reject {
            th,
            proposal,
            reason,
        } => {
            let args = json!({"th": th, "proposal": proposal, "reason": reason});
            print_result(ctx, &call(ctx, "reject", args).await?)
        }
        ArtifactCmd::Mode { th, mode } => print_result(
            ctx,
            &call(ctx, "mode", json!({"th": th, "mode": mode})).await?,
        ),
        ArtifactCmd::Focus { th, artifacts } => print_result(
            ctx,
            &call(ctx, "focus", json!({"th": th, "artifacts": artifacts})).await?,
        ),
        ArtifactCmd::Log { th, after, follow } => log(ctx, th, after, follow).await,
    }
}

/// One event line for humans: `seq type actor details`.
pub fn event_text(frame: &Value) -> String {
    let ev = &frame["event"];
    let actor = &frame["actor"];
    let who = actor["name"]
        .as_str()
        .or(actor["client_id"].as_str())
        .or(actor["id"].as_str())
        .unwrap_or("?");
    let detail = [
        "artifact_id",
        "proposal_id",
        "version",
        "decision",
        "summary",
        "mode",
        "run_id",
        "status",
    ]
    .iter()
    .filter_map(|k| {
        ev.get(*k).filter(|v| !v.is_null()).map(|v| {
            format!(
                "{k}={}",
                v.as_str().map(str::to_string).unwrap_or(v.to_string())
            )
        })
    })
    .collect::<Vec<_>>()
    .join(" ");
    format!(
        "#{} {} by {who} {detail}",
        frame["seq"],
        ev["type"].as_str().unwrap_or("?")
    )
}

/// Where `awp artifact log` reads a thread's events: pages from the node's store, and the
/// node's live events (a subscription).
trait LogSource {
    /// Events of the thread with seq > `after` (empty when there are none), and the full
    /// thread id.
    async fn page(&mut self, after: u64) -> Result<(String, Vec<Value>), Failure>;
    /// Start receiving live node events; every event emitted after this returns is
    /// delivered by [`LogSource::live`].
    async fn subscribe(&mut self) -> Result<(), Failure>;
    /// The next live node event; `None` when the node stopped.
    async fn live(&mut self) -> Result<Option<Value>, Failure>;
}

struct NodeLog<'a> {
    ctx: &'a Ctx,
    th: String,
    sub: Option<crate::control::Subscription>,
}

impl LogSource for NodeLog<'_> {
    async fn page(&mut self, after: u64) -> Result<(String, Vec<Value>), Failure> {
        let body = call(self.ctx, "log", json!({"th": self.th, "after": after})).await?;
        let th = str_field(&body, &["th"]).unwrap_or(&self.th).to_string();
        let events = body
            .get("events")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok((th, events))
    }

    async fn subscribe(&mut self) -> Result<(), Failure> {
        let sub = self
            .ctx
            .subscribe(&Request::Subscribe {
                th: None,
                peer: None,
                from_seq: None,
            })
            .await?;
        self.sub = Some(sub);
        Ok(())
    }

    async fn live(&mut self) -> Result<Option<Value>, Failure> {
        match self.sub.as_mut() {
            Some(sub) => Ok(sub.next_event().await.ok().flatten().map(Value::Object)),
            None => Ok(None),
        }
    }
}

/// The stored events of artifact thread `th` (id or unique prefix) with seq > `after`,
/// in seq order (`awp artifact log` without `--follow`): artifactr event frames.
pub(crate) async fn log_frames(ctx: &Ctx, th: String, after: u64) -> Result<Vec<Value>, Failure> {
    let mut src = NodeLog { ctx, th, sub: None };
    let mut frames = Vec::new();
    log_events(&mut src, after, false, |e| {
        frames.push(e.clone());
        Ok(())
    })
    .await?;
    Ok(frames)
}

async fn log(ctx: &Ctx, th: String, after: u64, follow: bool) -> Result<(), Failure> {
    let mut src = NodeLog { ctx, th, sub: None };
    let done = log_events(&mut src, after, follow, |e| {
        if ctx.json {
            out_json(e)
        } else {
            out(&event_text(e))
        }
    })
    .await?;
    if done {
        Ok(())
    } else {
        Err(Failure::new(Exit::Failed, "the node stopped", ""))
    }
}

/// The events of a thread with seq > `after`, each passed to `emit` once and in seq order:
/// the stored ones, then (`follow`) the live ones. With `follow`, the subscription starts
/// BEFORE the stored events are read, so an event appended during the read is not missed;
/// live events at or below the last seq emitted are duplicates and are dropped. Returns
/// true when done (not following), false when the live events ended (the node stopped).
async fn log_events(
    src: &mut impl LogSource,
    after: u64,
    follow: bool,
    mut emit: impl FnMut(&Value) -> Result<(), Failure>,
) -> Result<bool, Failure> {
    if follow {
        src.subscribe().await?;
    }
    let mut last = after;
    let mut full_th = None;
    for _ in 0..10_000 {
        let (th, events) = src.page(last).await?;
        full_th = Some(th);
        if events.is_empty() {
            break;
        }
        for e in events {
            last = e["seq"].as_u64().unwrap_or(last);
            emit(&e)?;
        }
    }
    if !follow {
        return Ok(true);
    }
    let full_th = full_th.unwrap_or_default();
    loop {
        let Some(ev) = src.live().await? else {
            return Ok(false);
        };
        if ev["event"] != "artifact" || ev["th"].as_str() != Some(full_th.as_str()) {
            continue;
        }
        let frame = &ev["frame"];
        let seq = frame["seq"].as_u64().unwrap_or(0);
        if seq <= last {
            continue;
        }
        last = seq;
        emit(frame)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose thread gets one more event right after each read of the log, which
    /// only subscriptions that exist at that moment see live.
    struct RacyNode {
        log: Vec<Value>,
        subscribed: bool,
        live: std::collections::VecDeque<Value>,
        appends_left: u64,
        last_appended: bool,
    }

    fn frame(seq: u64) -> Value {
        json!({"seq": seq, "event": {"type": "message_posted"}, "actor": {}})
    }

    impl RacyNode {
        fn append(&mut self) {
            let seq = self.log.len() as u64 + 1;
            self.log.push(frame(seq));
            if self.subscribed {
                self.live
                    .push_back(json!({"event": "artifact", "th": "thr_full", "frame": frame(seq)}));
                // Another thread's event is not this log's.
                self.live.push_back(
                    json!({"event": "artifact", "th": "thr_other", "frame": frame(seq + 100)}),
                );
            }
        }
    }

    impl LogSource for RacyNode {
        async fn page(&mut self, after: u64) -> Result<(String, Vec<Value>), Failure> {
            let page: Vec<Value> = self
                .log
                .iter()
                .skip(after as usize)
                .take(2)
                .cloned()
                .collect();
            // One event lands after each read while any are left, and always one right
            // after the read that found nothing more (the window before a subscription).
            if self.appends_left > 0 || (page.is_empty() && !self.last_appended) {
                self.appends_left = self.appends_left.saturating_sub(1);
                self.last_appended |= page.is_empty();
                self.append();
            }
            Ok(("thr_full".into(), page))
        }
        async fn subscribe(&mut self) -> Result<(), Failure> {
            self.subscribed = true;
            Ok(())
        }
        async fn live(&mut self) -> Result<Option<Value>, Failure> {
            Ok(self.live.pop_front())
        }
    }

    /// `log --follow` used to read and then subscribe: an event appended between the last
    /// read and the subscription was never shown. Every event must be shown once, in order.
    #[tokio::test]
    async fn follow_misses_no_event_appended_during_the_read_and_shows_none_twice() {
        for appends in [0, 1, 2, 5] {
            let mut node = RacyNode {
                log: (1..=3).map(frame).collect(),
                subscribed: false,
                live: Default::default(),
                appends_left: appends,
                last_appended: false,
            };
            let mut seen = Vec::new();
            let done = log_events(&mut node, 0, true, |e| {
                seen.push(e["seq"].as_u64().unwrap());
                Ok(())
            })
            .await
            .unwrap();
            assert!(!done, "the live events ended");
            let want: Vec<u64> = (1..=3 + appends + 1).collect();
            assert_eq!(seen, want, "{appends} appended during the read");
        }
        // Without --follow: the stored events after `after`, and no subscription.
        let mut node = RacyNode {
            log: (1..=5).map(frame).collect(),
            subscribed: false,
            live: Default::default(),
            appends_left: 0,
            last_appended: true,
        };
        let mut seen = Vec::new();
        let done = log_events(&mut node, 2, false, |e| {
            seen.push(e["seq"].as_u64().unwrap());
            Ok(())
        })
        .await
        .unwrap();
        assert!(done);
        assert!(!node.subscribed);
        assert_eq!(seen, vec![3, 4, 5]);
    }
}
