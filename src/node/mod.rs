//! The running node: listeners, dialers, one connection per peer, reconnects, the control
//! socket server and the event stream.

use crate::control::Event;
use crate::net::Address;
use std::path::PathBuf;

/// How a node is started (`awp daemon`, `awp listen`, `awp up`).
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// `$AWP_HOME`.
    pub home: PathBuf,
    /// Addresses to listen on; empty = `tls:0.0.0.0:7700`, or a free port when taken.
    pub listen: Vec<Address>,
    /// Allow plaintext tcp to/from public addresses.
    pub allow_plaintext: bool,
    /// Name in hello (default `awp@<hostname>`).
    pub name: Option<String>,
    /// About text in hello.
    pub about: Option<String>,
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another process runs a node on this home.
    #[error("a node already runs on {home} (pid {pid})")]
    AlreadyRunning { home: String, pid: u32 },
    #[error("{0}")]
    Other(String),
}

/// A started node.
pub struct NodeHandle {}

impl NodeHandle {
    /// Start: take the home lock, open identity and store, bind listeners and the control
    /// socket, start dialing peers with queued lines.
    pub async fn start(config: NodeConfig) -> Result<NodeHandle, StartError> {
        let _ = config;
        todo!()
    }
    /// The `{"event":"listening",…}` event (address, addresses, key, name).
    pub fn listening_event(&self) -> Event {
        todo!()
    }
    /// Live events (see [`crate::control::Event`]).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        todo!()
    }
    /// Resolves when the node has stopped (shutdown request, `awp down`, or a signal).
    pub async fn stopped(&self) {
        todo!()
    }
    /// Ask the node to stop.
    pub fn shutdown(&self) {
        todo!()
    }
}
