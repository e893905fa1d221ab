//! A cap on the lines of the agent's stdout (`awp serve-agent --acp`): the ACP crate
//! buffers a whole line before parsing it, so a line without end would fill our memory;
//! and it queues every line that is no JSON-RPC message (without bound) and answers it
//! with an error response the agent may never read, so a flood of such lines (`-- yes`)
//! would grow our memory without end.

/// Most lines in a row that the ACP crate would reject as malformed (not JSON, a batch,
/// or JSON that is no JSON-RPC message: [`agent_client_protocol::TransportFrame::parse_json`])
/// before the stream fails.
pub const MAX_BAD_LINES: usize = 64;

use crate::linescan::{Line, LinePolicy, LineScan};

/// A reader that fails with `InvalidData` once more than `max` bytes come without a `\n`,
/// or once more than [`MAX_BAD_LINES`] lines in a row are malformed JSON-RPC (judged by
/// the ACP crate's own frame parser, on a copy of the line). The scanning is
/// [`crate::linescan`]'s; the rules are [`AgentLines`].
pub type LineCap<R> = LineScan<R, AgentLines>;

/// Cap the lines of `inner` at `max` bytes (without the newline): a [`LineCap`].
pub fn line_cap<R>(inner: R, max: usize) -> LineCap<R> {
    LineScan::new(inner, max, AgentLines::default())
}

/// The agent's stdout rules: a line over the cap fails the stream, and so does the
/// line after [`MAX_BAD_LINES`] malformed ones in a row.
#[derive(Debug, Default)]
pub struct AgentLines {
    /// Malformed lines in a row.
    bad: usize,
}

impl LinePolicy for AgentLines {
    fn line(&mut self, line: Line<'_>) -> Result<(), String> {
        match line {
            Line::Over(max) => Err(format!("the agent wrote a line over {max} bytes")),
            Line::Whole(line) if is_message(line) => {
                self.bad = 0;
                Ok(())
            }
            Line::Whole(_) => {
                self.bad += 1;
                if self.bad > MAX_BAD_LINES {
                    return Err(format!(
                        "the agent wrote over {MAX_BAD_LINES} lines in a row that are no JSON-RPC messages"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Whether the ACP crate would take `line` (without its `\n`) as one JSON-RPC message.
fn is_message(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    match std::str::from_utf8(line) {
        Ok(s) => matches!(
            agent_client_protocol::TransportFrame::parse_json(s),
            agent_client_protocol::TransportFrame::Single(_)
        ),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{line_cap, MAX_BAD_LINES};
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn agent_lines_over_the_cap_end_the_stream() {
        let mut ok = line_cap(&b"12345\n12345\n"[..], 5);
        let mut out = Vec::new();
        ok.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), 12);
        let mut long = line_cap(&b"12345\n123456\n"[..], 5);
        let err = long.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn lines_that_are_no_json_rpc_end_the_stream_after_the_bound() {
        let msg = r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#;
        // Up to the bound in a row, then a message (CRLF too) resets the count.
        let mut ok = "y\n".repeat(MAX_BAD_LINES);
        ok.push_str(&format!("{msg}\r\n"));
        ok.push_str(&"\n".repeat(MAX_BAD_LINES));
        ok.push_str(&format!("{msg}\n"));
        let mut out = Vec::new();
        line_cap(ok.as_bytes(), 1000)
            .read_to_end(&mut out)
            .await
            .unwrap();
        assert_eq!(out, ok.as_bytes());
        // One more in a row fails: `yes`, blank lines, JSON that is no object, a batch, a
        // cut object, an object that is no JSON-RPC message, bytes that are no UTF-8.
        for line in [
            "y",
            "",
            "17",
            "[{}]",
            "{\"a\":",
            "{}",
            "{\"a\": 1}",
            "\u{fffd}",
        ] {
            let mut flood = format!("{line}\n").repeat(MAX_BAD_LINES + 1).into_bytes();
            if line == "\u{fffd}" {
                flood = b"\xff\n".repeat(MAX_BAD_LINES + 1);
            }
            let err = line_cap(&flood[..], 1000)
                .read_to_end(&mut Vec::new())
                .await
                .unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{line:?}");
            assert!(err.to_string().contains("no JSON-RPC messages"), "{err}");
        }
    }
}
