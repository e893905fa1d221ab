//! The AWP v0 wire: typed lines, strict parsing and exact encoding.
//!
//! Rules: protocol-notes §Framing and §Envelope. A line is at most [`MAX_LINE`] bytes
//! excluding the `\n`.

pub mod b64;
pub mod ids;
pub mod key;
pub mod parse;
pub mod schema;
pub mod separators;
pub mod sig;
pub mod time;
pub mod types;

pub use key::{KeyError, PeerKey};
pub use parse::{parse_line, FrameError};
pub use separators::escape_separators;
pub use types::*;

/// Largest accepted line, in bytes, excluding the terminating `\n` (exactly this many is
/// accepted; one more is `too_large`).
pub const MAX_LINE: usize = 1_048_576;

/// Largest safe integer on the wire, 2^53 − 1 (protocol-notes §Framing).
pub const MAX_SAFE_INT: u64 = (1 << 53) - 1;

/// Error codes of §9.7 this node emits.
pub mod code {
    pub const BAD_FRAME: &str = "bad_frame";
    pub const TOO_LARGE: &str = "too_large";
    pub const VERSION: &str = "version";
    pub const AUTH: &str = "auth";
    pub const UNSUPPORTED: &str = "unsupported";
    pub const FORBIDDEN: &str = "forbidden";
    pub const BLOB_REFUSED: &str = "blob_refused";
    pub const INTERNAL: &str = "internal";
    /// Extension (not in §9.7; does not close): a served request refused for now because
    /// the peer has too many requests running or too much output queued, or a line not
    /// stored because it would open a thread over the per-peer bound. Ask again later.
    pub const BUSY: &str = "busy";

    /// Whether receiving (or sending) this code closes the connection (§9.7 table).
    /// Unknown codes never close.
    pub fn closes(code: &str) -> bool {
        matches!(code, BAD_FRAME | TOO_LARGE | VERSION | AUTH)
    }
}
