//! Artifact threads: the artifactr.v1 model (threads, artifacts with versions, JSON Patch
//! and text edits, proposals, thread modes, focus, runs, events with `seq`) as a pure
//! engine, to be carried over AWP threads (`spec/artifact-threads.md`).
//!
//! No I/O and no clock reads: the time and the random bytes for ids are passed in. One
//! hosted AWP thread is one artifactr workspace (`workspace_id` = the AWP `th`).
//!
//! - [`frames`]: typed frames (commands, results, outcomes, rejections, events, envelopes),
//!   serialized in artifactr's field order with nulls; unknown events kept opaque.
//! - [`kinds`]: the registered kinds `markdown`, `code`, `json` (+ optional JSON Schema).
//! - [`patch`]: text edits, RFC 6902 JSON Patch (`json-patch` crate), summaries, diffs.
//! - [`state`]: workspace state built only from events; per-participant dedup memory.
//! - [`engine`]: `apply(workspace, context, frame) -> (result, events)`; `commit` for
//!   events the host causes itself; id and timestamp helpers.
//! - [`replica`]: a replica applying events strictly in seq order, with gap detection.
//! - [`caps`]: `artifact:write|resolve|admin[@th]` grant caps → a capability set.
//! - [`runs`]: AWP thread states (working, waiting, done, failed) → run events.

pub mod caps;
pub mod engine;
pub mod frames;
pub mod kinds;
pub mod patch;
pub mod replica;
pub mod runs;
pub mod state;

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod tests;

pub use caps::CapSet;
pub use engine::{apply, commit, parse_command_frame, Context, IdSource, SeededIds};
pub use frames::{Actor, Command, CommandFrame, CommandResult, Event, EventEnvelope, Rejection};
pub use replica::Replica;
pub use state::{Workspace, WorkspaceState};

/// Mime of a data part whose `data` is a `CommandFrame`.
pub const MIME_COMMAND: &str = "application/vnd.artifactr.v1.command+json";
/// Mime of a data part whose `data` is a `CommandResult`.
pub const MIME_RESULT: &str = "application/vnd.artifactr.v1.result+json";
/// Mime of a data part whose `data` is an `EventFrame` (envelope).
pub const MIME_EVENT: &str = "application/vnd.artifactr.v1.event+json";
/// Mime of a data part whose `data` is an `ErrorFrame` (a command that did not parse).
pub const MIME_ERROR: &str = "application/vnd.artifactr.v1.error+json";
/// Mime of a data part `{"after_seq": N}`: a replica asks the host to resend events > N.
pub const MIME_RESEND: &str = "application/vnd.artifactr.v1.resend+json";
