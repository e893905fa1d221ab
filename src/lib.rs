//! awp-node: a peer-to-peer node for the Agent Wire Protocol (AWP v0).
//!
//! Each node holds an Ed25519 identity, speaks newline-delimited AWP lines to its peers
//! over TLS (or plain TCP / Unix sockets), and keeps a durable outbox so that nothing
//! acknowledged is lost when a peer sleeps or a process is killed.
//!
//! # Layout
//! - [`wire`]: typed lines, strict parsing, exact encoding, keys, base64, timestamps,
//!   monotonic ULID ids, the generated JSON Schema.
//! - [`canonical`]: RFC 8785 canonical JSON (JCS) and signing of JSON objects (grants,
//!   presence).
//! - [`blob`]: files as blob parts with chunk lines: reading and chunking for sending, and
//!   crash-safe assembly of received blobs.
//! - [`grant`]: signed capability grants: mint, verify, hash, the honoring rules.
//! - [`artifact`]: artifact threads (artifactr.v1 over AWP): a pure engine for commands,
//!   events, proposals, replicas with gap detection, grant caps and run events.
//! - [`identity`]: the node's key file and the auth transcript.
//! - [`transcript`]: signed thread transcripts (`awp export`) and their offline check
//!   (`awp verify`); content lines are signed by [`wire::sig`] (`spec/signed-lines.md`).
//! - [`net`]: addresses, TLS binding (mTLS, self-signed Ed25519 certificates), listeners,
//!   dialers and line framing with the 1 MiB cap.
//! - [`store`]: the only code that names the database (sled): outbox, message log, seen,
//!   threads, peers, addresses; group commit.
//! - [`session`]: the per-connection protocol state machine (handshake, resume, acks,
//!   dedup, ping, bye), free of I/O and driven with an explicit clock.
//! - [`node`]: wiring: listeners, dialers, one connection per peer, reconnects, events.
//! - [`presence`]: signed presence documents and the rules for relaying them (sans-I/O).
//! - [`config`]: settings from `config.toml`, `AWP_*` variables and flags.
//! - [`control`]: the local control socket protocol (NDJSON) between the CLI and the node.
//! - [`cli`]: the `awp` command line.
//! - [`roll`]: `awp roll`, a Roll Runtime Protocol v1 front: Roll threads and turns as AWP
//!   threads and msgs with one peer, over the control socket.
//! - [`mcp`]: `awp mcp`, the CLI's verbs as MCP tools on stdio for agent harnesses.
//! - [`conform`]: `awp conform`, a conformance runner that checks any AWP peer.
//! - [`daemon`]: the home, the single-node lock, the control socket path, background start.
//! - [`doctor`]: `awp doctor`, checks of a home (store files, identity, config, modes) and
//!   their safe fixes.
//! - [`linescan`]: the newline scanner over a reader that the stdio fronts ([`acp`],
//!   [`mcp`]) use to judge the lines their JSON-RPC crates read.
//! - [`acp`]: Agent Client Protocol bridges: `awp serve-agent --acp` (a local ACP agent
//!   served to peers) and `awp acp` (an ACP agent for an editor, backed by a peer).
#![forbid(unsafe_code)]

pub mod acp;
pub mod artifact;
pub mod blob;
pub mod canonical;
pub mod cli;
pub mod config;
pub mod conform;
pub mod control;
pub mod daemon;
pub mod doctor;
pub mod grant;
pub mod identity;
pub mod linescan;
pub mod mcp;
pub mod net;
pub mod node;
pub mod par;
pub mod presence;
pub mod roll;
pub mod session;
pub mod store;
pub mod transcript;
pub mod wire;
