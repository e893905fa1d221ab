//! What the Roll front needs from the node, and its implementation over the local control
//! socket (`crate::control`), the same requests the CLI verbs make: `send`, `state`,
//! `peers`, and `subscribe` (live lines, and the stored lines of one thread).

use crate::control::{self, ClientError, Event, Page, Request, Response};
use std::path::PathBuf;
use std::time::Duration;

/// How long reading one thread's stored lines may take (`thread.open`, `thread.snapshot`,
/// `operation.get`).
pub const THREAD_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Most log lines visited for one thread read (older ones are not shown).
pub const MAX_THREAD_LINES: usize = 1_000_000;

/// The node as the front sees it.
#[allow(async_fn_in_trait)]
pub trait NodeApi {
    /// One control request (`send`, `state`, …) and its response.
    async fn call(&self, req: Request) -> Result<Response, ClientError>;
    /// Visit the stored `line` events of the AWP thread `th` with `peer`, in log order
    /// (at most [`MAX_THREAD_LINES`], within [`THREAD_READ_TIMEOUT`]).
    async fn thread_lines(
        &self,
        peer: &str,
        th: &str,
        visit: &mut dyn FnMut(&Event),
    ) -> Result<(), ClientError>;
}

/// The node behind `$AWP_HOME/awp.sock`.
#[derive(Debug, Clone)]
pub struct ControlNode {
    /// The control socket.
    pub socket: PathBuf,
}

impl NodeApi for ControlNode {
    async fn call(&self, req: Request) -> Result<Response, ClientError> {
        control::request(&self.socket, &req).await
    }

    async fn thread_lines(
        &self,
        peer: &str,
        th: &str,
        visit: &mut dyn FnMut(&Event),
    ) -> Result<(), ClientError> {
        let req = Request::Subscribe {
            th: Some(th.to_string()),
            peer: Some(peer.to_string()),
            from_seq: Some(0),
        };
        let read = async {
            let mut sub = control::subscribe(&self.socket, &req).await?;
            for _ in 0..MAX_THREAD_LINES {
                match sub.next_event().await? {
                    None => return Err(ClientError::Closed),
                    Some(ev) => match ev.get("event").and_then(|v| v.as_str()) {
                        Some("caught_up") => return Ok(()),
                        Some("line") => visit(&ev),
                        _ => {}
                    },
                }
            }
            Ok(())
        };
        tokio::time::timeout(THREAD_READ_TIMEOUT, read)
            .await
            .map_err(|_| ClientError::Timeout(THREAD_READ_TIMEOUT))?
    }
}

/// A known peer: full key and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// `ed25519:…`
    pub key: String,
    /// Its announced name (may be empty).
    pub name: String,
}

/// Why `--peer` names no single peer.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no known peer matches {0:?}")]
    NoSuchPeer(String),
    #[error("{0:?} matches several peers")]
    Ambiguous(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Node(String),
}

/// Resolve `--peer` among the node's known peers (`peers` listing), by the rule of every
/// peer argument (control `Request` docs): the full key, or a name, or a unique key
/// prefix of at least 4 characters with or without `ed25519:`.
pub async fn resolve_peer(node: &ControlNode, want: &str) -> Result<PeerInfo, ResolveError> {
    let mut page = Page::first();
    let mut found: Vec<PeerInfo> = Vec::new();
    let bare = want.strip_prefix("ed25519:").unwrap_or(want);
    // A bounded walk: at most 1000 pages of 500.
    for _ in 0..1000 {
        let r = control::request_page(&node.socket, &Request::Peers, &page).await?;
        if !r.ok {
            let e = r.error.map(|e| e.message).unwrap_or_default();
            return Err(ResolveError::Node(e));
        }
        for p in r
            .body
            .get("peers")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let key = p.get("key").and_then(|v| v.as_str()).unwrap_or_default();
            let name = p.get("name").and_then(|v| v.as_str()).unwrap_or_default();
            let key_bare = key.strip_prefix("ed25519:").unwrap_or(key);
            if key == want {
                return Ok(PeerInfo {
                    key: key.into(),
                    name: name.into(),
                });
            }
            if name == want || (bare.len() >= 4 && key_bare.starts_with(bare)) {
                found.push(PeerInfo {
                    key: key.into(),
                    name: name.into(),
                });
            }
        }
        match r.body.get("next").and_then(|v| v.as_str()) {
            Some(n) => page = Page::after(n),
            None => break,
        }
    }
    match found.len() {
        0 => Err(ResolveError::NoSuchPeer(want.into())),
        1 => Ok(found.remove(0)),
        _ => Err(ResolveError::Ambiguous(want.into())),
    }
}
