//! One newline scanner over an [`tokio::io::AsyncRead`], shared by the stdio fronts that
//! watch the lines a line-based JSON-RPC crate reads: `awp serve-agent --acp` caps the
//! agent's stdout lines ([`crate::acp::linecap`]), `awp mcp` logs the input lines `rmcp`
//! drops without a word ([`crate::mcp::input`]).
//!
//! [`LineScan`] passes every byte through unchanged and hands each line to a
//! [`LinePolicy`]; the policy decides what a line (or a line over the cap) means for its
//! front. A policy that answers `Err` fails the read with `InvalidData`.

/// What the scanner hands its [`LinePolicy`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A complete line of at most the cap, without its `\n` (a `\r` before it stays).
    Whole(&'a [u8]),
    /// The current line went past the cap (the value, in bytes): reported once, at its
    /// first byte past the cap. Its bytes are not kept: the rest of it passes unchecked up
    /// to its `\n`, which is not reported again.
    Over(usize),
}

/// What a front does with each line its [`LineScan`] sees.
pub trait LinePolicy {
    /// Judge one line. `Err(why)` fails the read that brought it (`InvalidData`, `why` as
    /// the message) and every read after it.
    fn line(&mut self, line: Line<'_>) -> Result<(), String>;
}

/// A reader that passes the bytes of `inner` through and hands each line (split at `\n`)
/// to its policy `P`. It keeps at most `max` bytes of the current line: a longer one is
/// [`Line::Over`].
///
/// Errors: once the policy fails a line, the read that brought it hands out no bytes and
/// fails with `InvalidData`, and so does every later read (the stream stays broken).
pub struct LineScan<R, P> {
    inner: R,
    max: usize,
    /// The current line so far (at most `max` bytes; empty once it went over).
    line: Vec<u8>,
    /// The current line went over `max`.
    over: bool,
    policy: P,
    /// Why the policy failed the stream, once it did.
    failed: Option<String>,
}

impl<R, P> LineScan<R, P> {
    /// Scan the lines of `inner` with `policy`, keeping lines of at most `max` bytes
    /// (without the newline).
    pub fn new(inner: R, max: usize, policy: P) -> LineScan<R, P> {
        LineScan {
            inner,
            max,
            line: Vec::new(),
            over: false,
            policy,
            failed: None,
        }
    }

    /// The policy (for its counts).
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

impl<R: tokio::io::AsyncRead + Unpin, P: LinePolicy + Unpin> tokio::io::AsyncRead
    for LineScan<R, P>
{
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let me = &mut *self;
        if let Some(why) = &me.failed {
            return std::task::Poll::Ready(Err(invalid(why.clone())));
        }
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut me.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &r {
            for &b in &buf.filled()[before..] {
                let verdict = if b == b'\n' {
                    let v = if me.over {
                        Ok(())
                    } else {
                        me.policy.line(Line::Whole(&me.line))
                    };
                    me.line.clear();
                    me.over = false;
                    v
                } else if me.over {
                    Ok(())
                } else if me.line.len() >= me.max {
                    me.over = true;
                    me.line = Vec::new();
                    me.policy.line(Line::Over(me.max))
                } else {
                    me.line.push(b);
                    Ok(())
                };
                if let Err(why) = verdict {
                    me.failed = Some(why);
                    break;
                }
            }
            if let Some(why) = &me.failed {
                // A failed read hands out nothing.
                buf.set_filled(before);
                return std::task::Poll::Ready(Err(invalid(why.clone())));
            }
        }
        r
    }
}

fn invalid(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::{Line, LinePolicy, LineScan};
    use tokio::io::AsyncReadExt;

    /// Records what it is handed; fails on a line `fail`.
    #[derive(Default)]
    struct Record {
        seen: Vec<Option<Vec<u8>>>,
        fail: Option<&'static [u8]>,
    }

    impl LinePolicy for Record {
        fn line(&mut self, line: Line<'_>) -> Result<(), String> {
            match line {
                Line::Whole(l) => {
                    self.seen.push(Some(l.to_vec()));
                    if self.fail == Some(l) {
                        return Err("failed".into());
                    }
                }
                Line::Over(max) => {
                    assert_eq!(max, 5);
                    self.seen.push(None)
                }
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn lines_whole_and_over_the_cap_reach_the_policy_and_bytes_pass() {
        // The last line has no `\n`: it is never reported.
        let input = b"ab\r\n\n12345\n123456789\nxy\ntail";
        let mut scan = LineScan::new(&input[..], 5, Record::default());
        let mut out = Vec::new();
        scan.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, input);
        let want: Vec<Option<Vec<u8>>> = vec![
            Some(b"ab\r".to_vec()),
            Some(b"".to_vec()),
            Some(b"12345".to_vec()),
            None,
            Some(b"xy".to_vec()),
        ];
        assert_eq!(scan.policy().seen, want);
    }

    #[tokio::test]
    async fn a_failed_line_fails_the_read_and_every_later_one() {
        let input = b"ok\nbad\nok\n";
        let policy = Record {
            fail: Some(b"bad"),
            ..Record::default()
        };
        // One byte per read: the failing read is the one bringing the `\n` after `bad`.
        let (mut w, r) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut w, input)
            .await
            .unwrap();
        drop(w);
        let mut scan = LineScan::new(r, 100, policy);
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        let err = loop {
            match scan.read(&mut byte).await {
                Ok(0) => panic!("the stream ended without failing"),
                Ok(_) => got.push(byte[0]),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(got, b"ok\nbad");
        let again = scan.read(&mut byte).await.unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(again.to_string(), "failed");
    }
}
