//! `awp peers forget PEER`, `awp disconnect PEER`.

use super::format::str_field;
use super::{out, out_json, Ctx, Failure};
use crate::control::Request;
use serde_json::Value;

/// `awp peers forget PEER`: asks the node to forget the peer; prints `forgot KEY: N
/// threads, N log entries, N queued lines, N addresses`, then `kept: …` naming what stays
/// and why (blobs, artifact threads, grants) when any does (with `--json`, the node's
/// answer `{key, removed: {peer, addresses, threads, log, outbox, seen}, kept: {blobs,
/// artifact_threads, grants}}`).
pub async fn forget(ctx: &Ctx, peer: String) -> Result<(), Failure> {
    let body = ctx.call(&Request::ForgetPeer { peer }).await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    let n = |k: &str| {
        body.get("removed")
            .and_then(|r| r.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    out(&format!(
        "forgot {}: {} threads, {} log entries, {} queued lines, {} addresses",
        str_field(&body, &["key"]).unwrap_or("?"),
        n("threads"),
        n("log"),
        n("outbox"),
        n("addresses"),
    ))?;
    // What stays, and why (a newcomer expects "forget" to remove everything).
    let kept = |k: &str| {
        body.get("kept")
            .and_then(|r| r.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let mut why = Vec::new();
    if kept("blobs") > 0 {
        why.push(format!(
            "{} blob records and their files (your data: `awp blobs` lists the paths; delete \
             files by hand)",
            kept("blobs")
        ));
    }
    if kept("artifact_threads") > 0 {
        why.push(format!(
            "{} artifact threads (shared documents with your own work in them: `awp artifact \
             list`)",
            kept("artifact_threads")
        ));
    }
    if kept("grants") > 0 {
        why.push(format!(
            "{} grants issued to it (still valid until revoked: `awp revoke HASH`)",
            kept("grants")
        ));
    }
    if !why.is_empty() {
        out(&format!("kept: {}", why.join("; ")))?;
    }
    Ok(())
}

/// `awp disconnect PEER [--reason TEXT]`: prints `disconnected NAME (KEY); not redialed
/// until `awp connect` or a send` (or `… was not connected; parked …`); with `--json`, the
/// node's answer `{key, peer_name, was_connected, parked}`.
pub async fn disconnect(ctx: &Ctx, peer: String, reason: Option<String>) -> Result<(), Failure> {
    let body = ctx.call(&Request::Disconnect { peer, reason }).await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    let key = str_field(&body, &["key"]).unwrap_or("?");
    let who = match str_field(&body, &["peer_name"]) {
        Some(name) => format!("{name} ({key})"),
        None => key.to_string(),
    };
    let was = body.get("was_connected").and_then(Value::as_bool) == Some(true);
    let what = if was {
        format!("disconnected {who}")
    } else {
        format!("{who} was not connected")
    };
    out(&format!(
        "{what}; parked: not redialed until `awp connect` to it or a send"
    ))
}
