//! A cap on the lines of the agent's stdout (`awp serve-agent --acp`): the ACP crate
//! buffers a whole line before parsing it, so a line without end would fill our memory.

/// A reader that fails with `InvalidData` once more than `max` bytes come without a `\n`.
pub struct LineCap<R> {
    inner: R,
    max: usize,
    run: usize,
}

impl<R> LineCap<R> {
    /// Cap the lines of `inner` at `max` bytes (without the newline).
    pub fn new(inner: R, max: usize) -> LineCap<R> {
        LineCap { inner, max, run: 0 }
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
            let mut over = false;
            for &b in &buf.filled()[before..] {
                if b == b'\n' {
                    me.run = 0;
                } else {
                    me.run += 1;
                    over |= me.run > me.max;
                }
            }
            if over {
                // A failed read hands out nothing.
                buf.set_filled(before);
                return std::task::Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the agent wrote a line over {} bytes", me.max),
                )));
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::LineCap;
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
}
