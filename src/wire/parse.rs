//! Strict line parsing (protocol-notes §Framing).

use super::types::Line;

/// Why a line was refused. Every variant maps to an err code via [`FrameError::code`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    #[error("line is over {max} bytes")]
    TooLarge { max: usize },
    #[error("bad frame: {detail}")]
    BadFrame {
        detail: String,
        /// The line's `id` when one was readable (goes in the err's `re`).
        id: Option<String>,
    },
}

impl FrameError {
    /// `too_large` or `bad_frame`; both close the connection.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::TooLarge { .. } => super::code::TOO_LARGE,
            FrameError::BadFrame { .. } => super::code::BAD_FRAME,
        }
    }
}

/// Parse one line (without its `\n`). Refuses: over [`super::MAX_LINE`], invalid UTF-8,
/// not a JSON object, duplicate keys at any depth, integers beyond ±(2^53−1), missing `t`,
/// a known type with a required field missing or of the wrong type, a `ts` that is not
/// RFC 3339. Unknown `t` gives [`Line::Unknown`]; unknown fields are ignored.
pub fn parse_line(bytes: &[u8]) -> Result<Line, FrameError> {
    todo!("{bytes:?}")
}

impl Line {
    /// Exact encoding without the `\n`: compact JSON, `t,id,ts,th,re` first, no HTML
    /// escaping. `Unknown` encodes as `{"t":…,"id":…}`.
    pub fn encode(&self) -> Vec<u8> {
        todo!()
    }
    /// The `t` of this line.
    pub fn kind(&self) -> &str {
        todo!()
    }
    /// The line's `id` (None only for an Unknown line without one).
    pub fn id(&self) -> Option<&str> {
        todo!()
    }
    /// The line's `th`, if it has one.
    pub fn th(&self) -> Option<&str> {
        todo!()
    }
}
