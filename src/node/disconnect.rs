//! `awp disconnect PEER [--reason TEXT]` (usability #16): say bye to one peer and park it.
//!
//! Parking (the mark a peer's own `bye` sets, protocol-notes §Liveness and close) keeps the
//! dialer from redialing it; the next `awp connect` to it (its handshake) or a line queued
//! for it (`send`, `state`) clears the mark.

use super::server::{internal, resolve_peer, Fail, Reply};
use super::Inner;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Longest `bye` reason sent, in bytes (a longer one is cut at a character boundary).
pub const MAX_BYE_REASON: usize = 256;
/// How long `disconnect` waits for the connection to close after its `bye`.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Park `peer`, then close its live connection (if any) with a `bye` carrying `reason`,
/// waiting for the close at most [`CLOSE_WAIT`].
pub(super) async fn disconnect(inner: &Arc<Inner>, peer: &str, reason: Option<&str>) -> Reply {
    let key = resolve_peer(inner, peer)?;
    inner
        .store
        .set_parked(&key, crate::store::Park::ByUs)
        .map_err(internal)?;
    inner.store.flush().await.map_err(internal)?;
    let handles = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .map(|c| c.handles.clone());
    let was_connected = handles.is_some();
    if let Some(h) = handles {
        let reason = reason
            .map(|r| crate::blob::cut(r, MAX_BYE_REASON).to_string())
            .unwrap_or_else(|| "disconnect".into());
        h.bye(reason);
        let closed = tokio::time::timeout(CLOSE_WAIT, h.closed()).await;
        if closed.is_err() {
            return Err(Fail::new(
                "internal",
                format!(
                    "the connection to {key} did not close within {}s",
                    CLOSE_WAIT.as_secs()
                ),
            ));
        }
    }
    // Our own close: the peer will not redial on its own account, so a later send or
    // connect dials its hello-learned address at once.
    super::dialer::closed_by_us(inner, key);
    Ok(json!({
        "key": key.to_string(),
        "peer_name": inner.peer_name(&key),
        "was_connected": was_connected,
        "parked": true,
    }))
}
