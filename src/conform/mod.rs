//! `awp conform`: a conformance runner that checks any AWP v0 peer (this node or another
//! implementation) against the rules of protocol-notes and the answers of vectors §6.
//!
//! The runner speaks the wire itself with a fresh random key. It knows fifteen scenarios
//! ([`SCENARIOS`], in run order); each names the protocol section it checks and produces a
//! list of [`Check`]s. Every line received is also validated against the JSON Schema of
//! [`crate::wire::schema::schema`]; a violation is a failed check of the scenario during
//! which the line arrived.
//!
//! - [`run_connect`] dials the peer: one shared session for the scenarios that can share
//!   it, and a connection of its own for each scenario that ends with a close (`version`,
//!   `auth-bad-sig`, `bad-frame`, `too-large`, `bye`).
//! - [`run_listen`] binds, accepts one inbound connection and runs the shared scenarios
//!   on it; the solo scenarios are reported as skipped.
//!
//! Nothing a peer sends can make the runner panic or wait forever: lines are framed with
//! the 1 MiB cap of [`crate::net::LineReader`] and every read and write is bounded by the
//! per-read timeout.

pub mod cli;
mod peer;
pub mod report;
mod runner;
mod scenarios;
pub mod schema;

pub use cli::ConformArgs;
pub use peer::RUNNER_NAME;
pub use report::{Check, Mode, Outcome, PeerInfo, Report, Status};
pub use runner::{run_connect, run_listen, ConformError, Options, ACCEPT_TIMEOUT};

/// One scenario of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    /// Stable name (`--scenario NAME`).
    pub name: &'static str,
    /// The protocol section it checks, e.g. `7` or `9.2`.
    pub section: &'static str,
    /// What it checks, one short sentence.
    pub what: &'static str,
    /// A capability the peer must list in its hello `caps`, else the scenario is skipped.
    pub needs_cap: Option<&'static str>,
    /// Whether it needs a connection of its own (it ends with the peer closing).
    pub solo: bool,
}

/// The v0 scenarios, in run order.
pub const SCENARIOS: [Scenario; 15] = [
    Scenario {
        name: "handshake",
        section: "7",
        what: "hello is valid (v 0, key, 32-byte nonce), auth verifies, resume follows, TLS cert key = hello key",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "version",
        section: "7.1",
        what: "hello with v 1 gets exactly err version after the peer's hello, then close, no auth",
        needs_cap: None,
        solo: true,
    },
    Scenario {
        name: "auth-bad-sig",
        section: "7.2",
        what: "auth with one signature bit flipped gets err auth, close, no resume",
        needs_cap: None,
        solo: true,
    },
    Scenario {
        name: "bad-frame",
        section: "9.7",
        what: "a line that is not JSON gets err bad_frame, then close",
        needs_cap: None,
        solo: true,
    },
    Scenario {
        name: "too-large",
        section: "9.7",
        what: "a line of 1,048,577 bytes gets err too_large, then close",
        needs_cap: None,
        solo: true,
    },
    Scenario {
        name: "ping",
        section: "9.4",
        what: "ping gets a pong with re = the ping's id",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "msg-ack",
        section: "9.2",
        what: "a msg is acked with its th and re = its id",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "state-ack",
        section: "8.1",
        what: "a state line is acked with its th and re = its id",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "dedup",
        section: "9.2",
        what: "the same msg id twice is acked twice (same re, different ack ids)",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "unknown-type",
        section: "5",
        what: "an unknown line type is ignored: a following ping gets only a pong",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "unknown-field",
        section: "5",
        what: "a msg with an unknown top-level field and an unknown part kind is acked, no err",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "err-nonclosing",
        section: "9.7",
        what: "err unsupported, forbidden, internal, blob_refused and an unknown code keep the connection open",
        needs_cap: None,
        solo: false,
    },
    Scenario {
        name: "chunk",
        section: "9.3",
        what: "a msg naming a blob, then its chunks: the msg is acked, no err, still open",
        needs_cap: Some("blob"),
        solo: false,
    },
    Scenario {
        name: "grant",
        section: "10.3",
        what: "a grant line with a valid signed grant for the peer: no err, still open",
        needs_cap: Some("grant"),
        solo: false,
    },
    Scenario {
        name: "bye",
        section: "9.6",
        what: "bye gets a bye back with re = ours, then the peer closes",
        needs_cap: None,
        solo: true,
    },
];

/// The scenario named `name`.
pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Scenarios selected by name (any order, duplicates allowed), returned in run order.
/// Empty `names` selects all. Errors with the first unknown name.
pub fn select(names: &[String]) -> Result<Vec<&'static Scenario>, String> {
    if let Some(bad) = names.iter().find(|n| scenario(n.trim()).is_none()) {
        return Err(bad.clone());
    }
    Ok(SCENARIOS
        .iter()
        .filter(|s| names.is_empty() || names.iter().any(|n| n.trim() == s.name))
        .collect())
}
