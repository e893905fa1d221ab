//! A watch on `awp mcp`'s stdin: `rmcp` drops an input line that is not JSON without a
//! word (on purpose: answering unparsable input can start an error storm between two
//! programs that echo each other, and the other official MCP SDKs ignore it too), so the
//! harness's author would never learn why a request got no answer. This reader passes
//! every byte through unchanged and logs one line to stderr per dropped line.
//!
//! Lines over [`rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH`] are not copied:
//! `rmcp` drops and logs those itself. Blank lines are skipped by `rmcp` and not logged.
//! JSON that is no JSON-RPC message gets `rmcp`'s own `Invalid Request` answer.

/// Longest line copied to be checked, in bytes (`rmcp`'s own line cap).
pub const MAX_CHECKED_LINE: usize = 16 * 1024 * 1024;

use crate::linescan::{Line, LinePolicy, LineScan};

/// A reader that logs (tracing `warn`, so stderr) each complete line that is not blank
/// and is no JSON (after an optional UTF-8 BOM and `\r`), the way `rmcp` parses it. The
/// scanning is [`crate::linescan`]'s; the rules are [`DroppedLines`].
pub type DroppedLineLog<R> = LineScan<R, DroppedLines>;

/// Watch `inner`: a [`DroppedLineLog`].
pub fn dropped_line_log<R>(inner: R) -> DroppedLineLog<R> {
    LineScan::new(inner, MAX_CHECKED_LINE, DroppedLines::default())
}

/// `awp mcp`'s input rules: log each line [`dropped_why`] names; lines over
/// [`MAX_CHECKED_LINE`] are left to `rmcp`. Never fails the stream.
#[derive(Debug, Default)]
pub struct DroppedLines {
    /// Lines seen so far (for the log: the 1-based number of the dropped line). A line
    /// over the cap counts when it goes over it.
    lines: u64,
}

impl LinePolicy for DroppedLines {
    fn line(&mut self, line: Line<'_>) -> Result<(), String> {
        self.lines += 1;
        if let Line::Whole(line) = line {
            if let Some(why) = dropped_why(line) {
                tracing::warn!(
                    "awp mcp: input line {} ({} bytes) dropped without an answer: {why}",
                    self.lines,
                    line.len()
                );
            }
        }
        Ok(())
    }
}

/// Why `rmcp` drops `line` (without its `\n`) silently, if it does: it is not blank and
/// is no JSON.
pub fn dropped_why(line: &[u8]) -> Option<String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return None;
    }
    let body = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line);
    match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        Ok(_) => None,
        Err(e) => Some(format!("not JSON ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::dropped_why;

    #[test]
    fn lines_rmcp_drops_silently_are_named() {
        for bad in [&b"not json"[..], b"{\"a\":", b"\xff\xfe", b"}"] {
            assert!(dropped_why(bad).is_some_and(|w| w.starts_with("not JSON")));
        }
        for fine in [
            &b""[..],
            b"\r",
            b"{}",
            b"17",
            b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\r",
            b"\xef\xbb\xbf{}",
        ] {
            assert_eq!(dropped_why(fine), None, "{fine:?}");
        }
    }
}
