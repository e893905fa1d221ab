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

/// A reader that logs (tracing `warn`, so stderr) each complete line that is not blank
/// and is no JSON (after an optional UTF-8 BOM and `\r`), the way `rmcp` parses it.
pub struct DroppedLineLog<R> {
    inner: R,
    line: Vec<u8>,
    /// The current line went over [`MAX_CHECKED_LINE`] (left to `rmcp`).
    over: bool,
    /// Lines seen so far (for the log: the 1-based number of the dropped line).
    lines: u64,
}

impl<R> DroppedLineLog<R> {
    /// Watch `inner`.
    pub fn new(inner: R) -> DroppedLineLog<R> {
        DroppedLineLog {
            inner,
            line: Vec::new(),
            over: false,
            lines: 0,
        }
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

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for DroppedLineLog<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let me = &mut *self;
        let r = std::pin::Pin::new(&mut me.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &r {
            for &b in &buf.filled()[before..] {
                if b == b'\n' {
                    me.lines += 1;
                    if !me.over {
                        if let Some(why) = dropped_why(&me.line) {
                            tracing::warn!(
                                "awp mcp: input line {} ({} bytes) dropped without an answer: {why}",
                                me.lines,
                                me.line.len()
                            );
                        }
                    }
                    me.line.clear();
                    me.over = false;
                } else if me.over {
                } else if me.line.len() >= MAX_CHECKED_LINE {
                    me.over = true;
                    me.line = Vec::new();
                } else {
                    me.line.push(b);
                }
            }
        }
        r
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
