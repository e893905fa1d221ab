//! A cap on the lines of the agent's stdout (`awp serve-agent --acp`): the ACP crate
//! buffers a whole line before parsing it, so a line without end would fill our memory;
//! and it queues every line that is no JSON-RPC message (without bound) and answers it
//! with an error response the agent may never read, so a flood of such lines (`-- yes`)
//! would grow our memory without end.

/// Most lines in a row that the ACP crate would reject as malformed (not JSON, a batch,
/// or JSON that is no JSON-RPC message: [`agent_client_protocol::TransportFrame::parse_json`])
/// before the stream fails.
pub const MAX_BAD_LINES: usize = 64;

/// A reader that fails with `InvalidData` once more than `max` bytes come without a `\n`,
/// or once more than [`MAX_BAD_LINES`] lines in a row are malformed JSON-RPC (judged by
/// the ACP crate's own frame parser, on a copy of the line).
pub struct LineCap<R> {
    inner: R,
    max: usize,
    /// The current line so far (at most `max` bytes).
    line: Vec<u8>,
    /// Malformed lines in a row.
    bad: usize,
}

impl<R> LineCap<R> {
    /// Cap the lines of `inner` at `max` bytes (without the newline).
    pub fn new(inner: R, max: usize) -> LineCap<R> {
        LineCap {
            inner,
            max,
            line: Vec::new(),
            bad: 0,
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

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LineCap<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let me = &mut *self;
        let r = std::pin::Pin::new(&mut me.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &r {
            let mut why = None;
            for &b in &buf.filled()[before..] {
                if b == b'\n' {
                    if is_message(&me.line) {
                        me.bad = 0;
                    } else {
                        me.bad += 1;
                        if me.bad > MAX_BAD_LINES {
                            why = Some(format!(
                                "the agent wrote over {MAX_BAD_LINES} lines in a row that are no JSON-RPC messages"
                            ));
                            break;
                        }
                    }
                    me.line.clear();
                } else if me.line.len() >= me.max {
                    why = Some(format!("the agent wrote a line over {} bytes", me.max));
                    break;
                } else {
                    me.line.push(b);
                }
            }
            if let Some(why) = why {
                // A failed read hands out nothing.
                buf.set_filled(before);
                return std::task::Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    why,
                )));
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::{LineCap, MAX_BAD_LINES};
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn agent_lines_over_the_cap_end_the_stream() {
        let mut ok = LineCap::new(&b"12345\n12345\n"[..], 5);
        let mut out = Vec::new();
        ok.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), 12);
        let mut long = LineCap::new(&b"12345\n123456\n"[..], 5);
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
        LineCap::new(ok.as_bytes(), 1000)
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
            let err = LineCap::new(&flood[..], 1000)
                .read_to_end(&mut Vec::new())
                .await
                .unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{line:?}");
            assert!(err.to_string().contains("no JSON-RPC messages"), "{err}");
        }
    }
}
