//! `awp peers forget PEER`.

use super::format::str_field;
use super::{out, out_json, Ctx, Failure};
use crate::control::Request;
use serde_json::Value;

/// `awp peers forget PEER`: asks the node to forget the peer; prints `forgot KEY: N
/// threads, N log entries, N queued lines, N addresses` (with `--json`, the node's answer
/// `{key, removed: {peer, addresses, threads, log, outbox, seen}}`).
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
    ))
}
