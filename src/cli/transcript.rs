//! `awp export THREAD [--format ndjson|json]` and `awp verify FILE`
//! (`spec/signed-lines.md`, [`crate::transcript`]).

use super::{client_failure, out, Ctx, Exit, Failure};
use crate::control::Request;
use crate::transcript::{self, Record};
use crate::wire::PeerKey;
use serde_json::Value;

/// Most lines one export holds (bounds memory against a runaway log).
pub const MAX_EXPORT_LINES: usize = 10_000_000;

/// Write thread `th`'s lines, in log order, to stdout as a transcript.
pub async fn export(ctx: &Ctx, th: String, format: &str) -> Result<(), Failure> {
    let mut sub = ctx
        .subscribe(&Request::Subscribe {
            th: Some(th.clone()),
            peer: None,
            from_seq: Some(0),
        })
        .await?;
    let me = crate::identity::Identity::load_or_create(&ctx.home)
        .map_err(|e| Failure::new(Exit::Failed, e.to_string(), "check identity.json"))?
        .key();
    let mut records = Vec::new();
    let mut peer: Option<PeerKey> = None;
    loop {
        let ev = match sub.next_event().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(Failure::new(Exit::Failed, "node closed the stream", "")),
            Err(e) => return Err(client_failure(&e, &ctx.home)),
        };
        match ev.get("event").and_then(Value::as_str) {
            Some("caught_up") => break,
            Some("line") => {}
            _ => continue,
        }
        let Some(p) = ev
            .get("peer")
            .and_then(Value::as_str)
            .and_then(|p| PeerKey::parse(p).ok())
        else {
            continue;
        };
        peer.get_or_insert(p);
        let from = if ev.get("dir").and_then(Value::as_str) == Some("out") {
            me
        } else {
            p
        };
        let line = ev.get("line").cloned().unwrap_or(Value::Null);
        records.push(Record { from, line });
        if records.len() > MAX_EXPORT_LINES {
            return Err(Failure::new(Exit::Failed, "thread too long to export", ""));
        }
    }
    if records.is_empty() {
        return Err(Failure::usage(
            format!("no lines in thread {th:?}"),
            "`awp threads` lists the threads",
        ));
    }
    let keys: Vec<PeerKey> = std::iter::once(me).chain(peer).collect();
    let header = transcript::header(&th, &keys);
    let text = match format {
        "json" => transcript::to_json(&header, &records) + "\n",
        _ => transcript::to_ndjson(&header, &records),
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(|e| Failure::new(Exit::Failed, format!("write: {e}"), ""))
}

/// Check a transcript file offline: one line per problem, exit 1 when there is any.
pub fn verify(path: &std::path::Path) -> Result<(), Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(
            format!("cannot read {}: {e}", path.display()),
            "give a file made by `awp export`",
        )
    })?;
    let problems = transcript::verify(&text);
    for p in &problems {
        out(&p.to_string())?;
    }
    if problems.is_empty() {
        out("ok: every signature, the thread, the id order and the re links hold")
    } else {
        Err(Failure::new(
            Exit::Failed,
            format!("{} problem(s) in {}", problems.len(), path.display()),
            "",
        ))
    }
}
