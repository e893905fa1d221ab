//! Line framing (protocol-notes §Framing): split on `\n` only, never buffer more than the
//! cap (+1 byte) while looking for it, keep a trailing `\r` (the auth signature covers
//! hello bytes as received).
//!
//! The reader keeps one buffer of at most [`MAX_LINE`] + 1 bytes. Unconsumed bytes live in
//! `buf[start..end]`; bytes already searched for a newline are remembered so a long line
//! arriving in small pieces is scanned once. Consuming a line only moves `start`; the
//! pending bytes are moved to the front only when the buffer is full (or reset for free
//! when everything was consumed), so many small lines cost no copying beyond the line
//! itself.

use super::BoxReader;
use crate::wire::MAX_LINE;

/// Framing failures.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A line longer than [`crate::wire::MAX_LINE`]: answer `err too_large` and close.
    /// Sticky: later reads return it again.
    #[error("line over the size limit")]
    TooLarge,
    /// The transport failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// First buffer size; grows by doubling up to `MAX_LINE + 1` (after a longer line, a new
/// buffer starts at that line's size: `LineReader::last_len`).
const INITIAL_BUFFER: usize = 8 * 1024;
/// Hard cap on buffered bytes: one maximal line and its newline.
const BUFFER_CAP: usize = MAX_LINE + 1;

/// Buffered line reader over a connection's read half.
pub struct LineReader {
    reader: BoxReader,
    /// Storage: `buf[..end]` holds what was read (`buf.len()` is `end`); its capacity is the
    /// window reads fill (used up to [`BUFFER_CAP`]).
    buf: Vec<u8>,
    /// Start of unconsumed bytes.
    start: usize,
    /// End of valid bytes.
    end: usize,
    /// How many bytes from `start` are known to hold no `\n`.
    scanned: usize,
    /// The reader returned end of file.
    eof: bool,
    /// Length of the last line taken, with its `\n`. After a line longer than
    /// [`INITIAL_BUFFER`], the next is expected to be as long (a blob's chunk lines come
    /// in one size): a new buffer is taken at that size instead of doubling from the
    /// initial one, and a read stops where the next line would end. A line that matches
    /// then fills its buffer exactly and becomes the line without a copy.
    last_len: usize,
}

impl LineReader {
    /// Wrap a reader.
    pub fn new(r: BoxReader) -> LineReader {
        LineReader {
            reader: r,
            buf: Vec::new(),
            start: 0,
            end: 0,
            scanned: 0,
            eof: false,
            last_len: 0,
        }
    }

    /// Next line without its `\n` (a `\r` before it is kept); `Ok(None)` at a clean EOF (a
    /// partial last line without `\n` at EOF is dropped).
    ///
    /// Errors: [`ReadError::TooLarge`] once more than [`MAX_LINE`] bytes arrived without a
    /// newline (exactly `MAX_LINE` bytes then `\n` is a valid line); [`ReadError::Io`] from
    /// the transport.
    ///
    /// Cancel safe: dropping the future loses no bytes (state lives in `self`), so it can
    /// be used in `tokio::select!`.
    pub async fn read_line(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        loop {
            if let Some(line) = self.take_line()? {
                return Ok(Some(line));
            }
            if self.eof {
                // Drop a partial last line.
                self.buf.clear();
                self.start = 0;
                self.end = 0;
                self.scanned = 0;
                return Ok(None);
            }
            let n = self.fill().await?;
            if n == 0 {
                self.eof = true;
            } else {
                self.end += n;
            }
        }
    }

    /// Read more bytes after `buf[..end]`, into the spare capacity (making room first). While nothing is pending and
    /// the read has to wait, the buffer is given back, so an idle connection holds none
    /// and one that carried a large line does not keep its large buffer (issue 10 §4); it
    /// is taken again, at [`INITIAL_BUFFER`], when bytes arrive. Cancel safe.
    async fn fill(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| {
            self.make_room();
            // Into the spare capacity, unzeroed (`BufMut` for `Vec` advances its length),
            // never past the window nor the cap.
            let mut room = self.buf.capacity().min(BUFFER_CAP) - self.end;
            let expect = self.start + self.last_len;
            if self.last_len > INITIAL_BUFFER && self.end < expect {
                room = room.min(expect - self.end);
            }
            let mut into = bytes::BufMut::limit(&mut self.buf, room);
            match tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut self.reader), cx, &mut into)
            {
                std::task::Poll::Ready(r) => std::task::Poll::Ready(r),
                std::task::Poll::Pending => {
                    if self.start == self.end {
                        self.buf = Vec::new();
                        self.start = 0;
                        self.end = 0;
                        self.scanned = 0;
                    }
                    std::task::Poll::Pending
                }
            }
        })
        .await
    }

    /// A complete line already in the buffer, without reading (for batching). `Ok(None)`
    /// when no complete line is buffered. Errors as [`LineReader::read_line`].
    pub fn buffered_line(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        self.take_line()
    }

    /// Cut the next complete line out of the buffer, if there is one.
    fn take_line(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        let from = self.start + self.scanned;
        match memchr::memchr(b'\n', &self.buf[from..self.end]) {
            Some(i) => {
                let nl = from + i;
                let len = nl - self.start;
                if len > MAX_LINE {
                    // Unreachable while the buffer is capped, kept as a guard.
                    return Err(ReadError::TooLarge);
                }
                self.scanned = 0;
                self.last_len = len + 1;
                if self.start == 0 && nl + 1 == self.end && 2 * nl >= self.buf.capacity() {
                    // The line is all the buffer holds and fills at least half of it: the
                    // buffer itself becomes the line (no copy of a large chunk line; the
                    // reader would give its buffer back at the next wait anyway).
                    let mut line = std::mem::take(&mut self.buf);
                    line.truncate(nl);
                    self.end = 0;
                    return Ok(Some(line));
                }
                let line = self.buf[self.start..nl].to_vec();
                self.start = nl + 1;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                    self.buf.clear();
                }
                Ok(Some(line))
            }
            None => {
                self.scanned = self.end - self.start;
                if self.scanned > MAX_LINE {
                    Err(ReadError::TooLarge)
                } else {
                    Ok(None)
                }
            }
        }
    }

    /// Ensure the buffer has spare capacity (`buf.len()` is always `end`; the capacity is
    /// the window). Only called when the pending bytes hold no newline and are at most
    /// `MAX_LINE` long, so the window can always take one more.
    fn make_room(&mut self) {
        if self.end < self.buf.capacity().min(BUFFER_CAP) {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.buf.truncate(self.end);
            self.start = 0;
            if self.end < self.buf.capacity().min(BUFFER_CAP) {
                return;
            }
        }
        let grown = if self.buf.capacity() == 0 && self.last_len > INITIAL_BUFFER {
            self.last_len
        } else {
            self.buf.capacity() * 2
        };
        let grown = grown.clamp(INITIAL_BUFFER, BUFFER_CAP);
        self.buf.reserve_exact(grown - self.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A reader that yields the given chunks (each split further if the caller's buffer is
    /// smaller), then EOF.
    struct Script {
        chunks: std::collections::VecDeque<Vec<u8>>,
    }

    fn chunked(chunks: Vec<Vec<u8>>) -> LineReader {
        LineReader::new(Box::new(Script {
            chunks: chunks.into(),
        }))
    }

    impl tokio::io::AsyncRead for Script {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            out: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if let Some(mut c) = self.chunks.pop_front() {
                let n = c.len().min(out.remaining());
                out.put_slice(&c[..n]);
                if n < c.len() {
                    let rest = c.split_off(n);
                    self.chunks.push_front(rest);
                }
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn exact_cap_is_accepted() {
        let mut line = vec![b'a'; MAX_LINE];
        line.push(b'\n');
        line.extend_from_slice(b"next\n");
        let mut r = chunked(vec![line]);
        let got = r.read_line().await.unwrap().unwrap();
        assert_eq!(got.len(), MAX_LINE);
        assert!(got.iter().all(|&b| b == b'a'));
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"next");
        assert!(r.read_line().await.unwrap().is_none());
    }

    /// Lines of one large size (a blob's chunks) arriving all at once: after the first two
    /// each gets a buffer of exactly its size and becomes the line (the `Vec` returned is
    /// that buffer: capacity = line + `\n`), so none is copied. A longer and a shorter
    /// line after them, and small ones, still come out whole.
    #[tokio::test]
    async fn lines_of_one_large_size_are_not_copied() {
        const L: usize = 100_000;
        let line = |c: u8, n: usize| {
            let mut l = vec![c; n];
            l.push(b'\n');
            l
        };
        let sizes = [L, L, L, L, L, 3 * L / 2, L / 2, 10, L, L];
        let stream: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| line(b'a' + i as u8, n))
            .collect();
        let mut r = chunked(vec![stream]);
        for (i, &n) in sizes.iter().enumerate() {
            let got = r.read_line().await.unwrap().unwrap();
            assert_eq!(got, line(b'a' + i as u8, n)[..n], "line {i}");
            if (2..5).contains(&i) {
                assert_eq!(got.capacity(), L + 1, "line {i} became its buffer");
            }
        }
        assert!(r.read_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn cap_plus_one_is_too_large_without_buffering_more() {
        let mut line = vec![b'a'; MAX_LINE + 1];
        line.push(b'\n');
        let mut r = chunked(vec![line.clone(), line]);
        assert!(matches!(r.read_line().await, Err(ReadError::TooLarge)));
        assert!(r.buf.len() <= MAX_LINE + 1);
        assert!(r.end - r.start <= MAX_LINE + 1);
        // Sticky.
        assert!(matches!(r.read_line().await, Err(ReadError::TooLarge)));
    }

    #[tokio::test]
    async fn endless_stream_without_newline_is_too_large() {
        let (mut w, rd) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let chunk = vec![b'x'; 4096];
            while w.write_all(&chunk).await.is_ok() {}
        });
        let mut r = LineReader::new(Box::new(rd));
        let res = tokio::time::timeout(std::time::Duration::from_secs(10), r.read_line())
            .await
            .expect("bounded");
        assert!(matches!(res, Err(ReadError::TooLarge)));
        assert!(r.buf.len() <= MAX_LINE + 1);
    }

    #[tokio::test]
    async fn carriage_return_is_kept() {
        let mut r = chunked(vec![b"{\"t\":\"hello\"}\r\n\r\n\n".to_vec()]);
        assert_eq!(
            r.read_line().await.unwrap().unwrap(),
            b"{\"t\":\"hello\"}\r"
        );
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"\r");
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"");
        assert!(r.read_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn many_lines_in_one_read_and_buffered_line() {
        let mut data = Vec::new();
        for i in 0..1000 {
            data.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        let mut r = chunked(vec![data]);
        assert!(r.buffered_line().unwrap().is_none(), "nothing read yet");
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"line 0");
        let mut n = 1;
        while let Some(l) = r.buffered_line().unwrap() {
            assert_eq!(l, format!("line {n}").as_bytes());
            n += 1;
        }
        // Whatever was not in the first read arrives by reading.
        while let Some(l) = r.read_line().await.unwrap() {
            assert_eq!(l, format!("line {n}").as_bytes());
            n += 1;
        }
        assert_eq!(n, 1000);
    }

    #[tokio::test]
    async fn line_split_across_reads() {
        let mut r = chunked(vec![
            b"ab".to_vec(),
            b"c".to_vec(),
            b"\nde".to_vec(),
            b"f\ng".to_vec(),
            b"h\n".to_vec(),
        ]);
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"abc");
        assert_eq!(r.buffered_line().unwrap(), None, "`de` is partial");
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"def");
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"gh");
        assert!(r.read_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn long_line_in_small_pieces_after_small_lines() {
        // Forces compaction: a short line consumed, then a near-cap line in 1000-byte reads.
        let mut chunks = vec![b"x\n".to_vec()];
        let big = vec![b'b'; MAX_LINE - 1];
        for c in big.chunks(1000) {
            chunks.push(c.to_vec());
        }
        chunks.push(b"\nz\n".to_vec());
        let mut r = chunked(chunks);
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"x");
        assert_eq!(r.read_line().await.unwrap().unwrap(), big);
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"z");
        assert!(r.buf.capacity() <= MAX_LINE + 1);
    }

    #[tokio::test]
    async fn a_large_line_alone_is_handed_over_and_reading_goes_on() {
        // Each large line arrives alone and fills the buffer: the buffer becomes the line.
        // Lines after it (alone, sharing a read, split across reads) still come out whole.
        let big = |b: u8, n: usize| vec![b; n];
        let mut first = big(b'a', 300_000);
        first.push(b'\n');
        let mut third = big(b'c', 200_000);
        third.extend_from_slice(b"\nd\n");
        let mut chunks = vec![first, b"s\n".to_vec(), third];
        let fourth = big(b'e', 500_000);
        for c in fourth.chunks(70_000) {
            chunks.push(c.to_vec());
        }
        chunks.push(b"\n".to_vec());
        let mut r = chunked(chunks);
        let line = r.read_line().await.unwrap().unwrap();
        assert_eq!(line, big(b'a', 300_000));
        assert_eq!((r.start, r.end, r.buf.len()), (0, 0, 0));
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"s");
        assert_eq!(r.read_line().await.unwrap().unwrap(), big(b'c', 200_000));
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"d");
        assert_eq!(r.read_line().await.unwrap().unwrap(), fourth);
        assert!(r.read_line().await.unwrap().is_none());
        assert!(r.buf.capacity() <= MAX_LINE + 1);
    }

    /// Issue 10 §4: a connection waiting for bytes holds no read buffer, even after a
    /// large line, and keeps a partial line while waiting for its end.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_reader_holds_no_buffer() {
        let (mut w, rd) = tokio::io::duplex(256 * 1024);
        let mut r = LineReader::new(Box::new(rd));
        let mut big = vec![b'b'; 100 * 1024];
        big.push(b'\n');
        w.write_all(&big).await.unwrap();
        assert_eq!(r.read_line().await.unwrap().unwrap().len(), 100 * 1024);
        // Nothing more to read: the read waits, and the buffer is gone.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), r.read_line());
        assert!(waiting.await.is_err(), "no line yet");
        assert_eq!(r.buf.capacity(), 0);
        // A partial line is kept while its end is awaited.
        w.write_all(b"par").await.unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), r.read_line());
        assert!(waiting.await.is_err(), "no newline yet");
        assert!(r.buf.capacity() >= 3);
        w.write_all(b"tial\nnext\n").await.unwrap();
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"partial");
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"next");
        drop(w);
        assert!(r.read_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn partial_line_at_eof_is_dropped() {
        let mut r = chunked(vec![b"one\ntwo".to_vec()]);
        assert_eq!(r.read_line().await.unwrap().unwrap(), b"one");
        assert!(r.read_line().await.unwrap().is_none());
        assert!(r.read_line().await.unwrap().is_none());
    }
}

/// The reader against a plain splitter over random streams: lines short and long (up to
/// past the cap), some without their `\n`, cut into random reads with waits between
/// them, each `read_line` future dropped at its first `Pending` (as `select!` does). The
/// events must match, and after every poll the buffer stays within its invariants.
#[cfg(test)]
mod split_model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;
    use std::future::Future;
    use std::task::{Context, Poll};

    /// Scripted reads; `None` is one `Pending` (it wakes itself).
    struct Steps(VecDeque<Option<Vec<u8>>>);

    impl tokio::io::AsyncRead for Steps {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut Context<'_>,
            out: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match self.0.pop_front() {
                Some(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Some(Some(mut c)) => {
                    let n = c.len().min(out.remaining());
                    out.put_slice(&c[..n]);
                    if n < c.len() {
                        let rest = c.split_off(n);
                        self.0.push_front(Some(rest));
                    }
                    Poll::Ready(Ok(()))
                }
                None => Poll::Ready(Ok(())),
            }
        }
    }

    #[derive(Debug, PartialEq)]
    enum Ev {
        Line(Vec<u8>),
        Eof,
        TooLarge,
    }

    /// What the reader must yield for `data`.
    fn split(mut rest: &[u8]) -> Vec<Ev> {
        let mut out = Vec::new();
        loop {
            match memchr::memchr(b'\n', rest) {
                Some(i) if i <= MAX_LINE => {
                    out.push(Ev::Line(rest[..i].to_vec()));
                    rest = &rest[i + 1..];
                }
                None if rest.len() <= MAX_LINE => {
                    out.push(Ev::Eof);
                    return out;
                }
                _ => {
                    out.push(Ev::TooLarge);
                    return out;
                }
            }
        }
    }

    fn read_all(data: &[u8], cuts: &[usize], waits: &[bool]) -> Vec<Ev> {
        let mut steps = VecDeque::new();
        let mut at = 0;
        for (k, &c) in cuts.iter().enumerate() {
            if at >= data.len() {
                break;
            }
            if waits[k % waits.len()] {
                steps.push_back(None);
            }
            let e = (at + c).min(data.len());
            steps.push_back(Some(data[at..e].to_vec()));
            at = e;
        }
        if at < data.len() {
            steps.push_back(Some(data[at..].to_vec()));
        }
        let mut r = LineReader::new(Box::new(Steps(steps)));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        for _ in 0..100_000 {
            let res = std::pin::pin!(r.read_line()).as_mut().poll(&mut cx);
            assert_eq!(r.buf.len(), r.end);
            assert!(r.start <= r.end);
            assert!(r.buf.capacity() <= BUFFER_CAP);
            match res {
                Poll::Pending => {
                    if r.start == r.end {
                        assert_eq!(r.buf.capacity(), 0, "a waiting reader holds a buffer");
                    }
                }
                Poll::Ready(Ok(Some(l))) => out.push(Ev::Line(l)),
                Poll::Ready(Ok(None)) => {
                    out.push(Ev::Eof);
                    return out;
                }
                Poll::Ready(Err(ReadError::TooLarge)) => {
                    out.push(Ev::TooLarge);
                    let again = std::pin::pin!(r.read_line()).as_mut().poll(&mut cx);
                    assert!(matches!(again, Poll::Ready(Err(ReadError::TooLarge))));
                    return out;
                }
                Poll::Ready(Err(e)) => panic!("{e}"),
            }
        }
        panic!("the reader did not finish");
    }

    fn a_line() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'\r'), Just(b'\n')], 0..40),
            2 => (4000usize..20_000).prop_map(|n| vec![b'b'; n]),
            1 => (MAX_LINE - 3..MAX_LINE + 3).prop_map(|n| vec![b'c'; n]),
            1 => (300_000usize..700_000).prop_map(|n| vec![b'd'; n]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn reads_what_a_plain_split_gives(
            lines in proptest::collection::vec(a_line(), 0..8),
            ended in proptest::collection::vec(proptest::bool::weighted(0.9), 8),
            cuts in proptest::collection::vec(prop_oneof![1usize..20, 1usize..10_000, 1usize..2_000_000], 1..400),
            waits in proptest::collection::vec(proptest::bool::ANY, 1..10),
        ) {
            let mut data = Vec::new();
            for (l, end) in lines.iter().zip(&ended) {
                data.extend_from_slice(l);
                if *end {
                    data.push(b'\n');
                }
            }
            prop_assert_eq!(read_all(&data, &cuts, &waits), split(&data));
        }
    }
}
