//! The transport side of a connection: reading lines in batches (in a reader task, or
//! in the connection's own task) and writing batches of lines from the connection's task.

use crate::net::{self, ReadError};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Batches buffered between the reader task and the session.
const READ_QUEUE: usize = 4;
/// A reader batch closes at this many bytes or [`READ_BATCH_LINES`] lines, so at most
/// `READ_QUEUE × (READ_BATCH_BYTES + MAX_LINE)` bytes wait in the queue.
const READ_BATCH_BYTES: usize = 256 * 1024;
/// Lines per reader batch.
const READ_BATCH_LINES: usize = 1024;
/// A reader batch of at least this many lines is parsed (and its signatures checked) on
/// a blocking thread rather than on the runtime's worker.
const OFFLOAD_LINES: usize = 32;
/// A reader batch of at least this many bytes (every batch closed by the byte bound
/// [`READ_BATCH_BYTES`], such as one blob chunk line: JSON scan, UTF-8 check and copy of
/// up to 1 MiB) is parsed on a blocking thread too, beside the commit of the last batch on
/// the runtime's worker.
const OFFLOAD_BYTES: usize = 256 * 1024;
/// What the reader task read in one go, in order.
pub(super) struct ReadBatch {
    /// Lines, parsed in the reader task (with their signatures checked once the session
    /// is open with a signing peer: [`crate::session::preparse`]).
    pub(super) lines: Vec<crate::session::PreParsed>,
    /// How the read side ended after them, if it did.
    pub(super) end: Option<ReadEnd>,
}

/// Where a connection's lines come from.
pub(super) enum ReadSide {
    /// A reader task reads and parses up to [`READ_QUEUE`] batches ahead: parsing and
    /// signature checks of the next batch run beside the storing of this one (a node).
    Task {
        rx: mpsc::Receiver<Box<ReadBatch>>,
        task: tokio::task::JoinHandle<()>,
    },
    /// The connection's task reads one batch at a time: one task per connection instead
    /// of two, and no channel (a relay, whose connections carry presence documents and
    /// control lines; issue 10, relay memory per connection).
    Inline {
        /// The reader, while no read runs (None once the read side ended).
        reader: Option<net::LineReader>,
        /// The read in progress: it owns the reader until it completes.
        reading: Option<Reading>,
    },
}

/// A read of one batch in progress ([`read_batch`]), handing the reader back with it.
type Reading = std::pin::Pin<
    Box<dyn std::future::Future<Output = (net::LineReader, Option<ReadBatch>)> + Send>,
>;

impl ReadSide {
    /// A reader task when `ahead` (see [`ReadSide::Task`]), else reading in line.
    pub(super) fn new(
        mut reader: net::LineReader,
        signer: &crate::session::Signer,
        ahead: bool,
    ) -> Self {
        if !ahead {
            return ReadSide::Inline {
                reader: Some(reader),
                reading: None,
            };
        }
        let signer = signer.clone();
        // Boxed batches: the channel allocates its first block of 32 slots up front, 32
        // pointers instead of 32 batches (about 1.5 KiB less per connection; issue 10).
        let (tx, rx) = mpsc::channel::<Box<ReadBatch>>(READ_QUEUE);
        let task = tokio::spawn(async move {
            while let Some(batch) = read_batch(&mut reader, &signer).await {
                let last = batch.end.is_some();
                if tx.send(Box::new(batch)).await.is_err() || last {
                    return;
                }
            }
        });
        ReadSide::Task { rx, task }
    }

    /// The next batch; None once the read side has ended (after the batch that said how)
    /// or the runtime is shutting down. Cancel safe: a read in progress is kept.
    pub(super) async fn recv(&mut self, signer: &crate::session::Signer) -> Option<Box<ReadBatch>> {
        match self {
            ReadSide::Task { rx, .. } => rx.recv().await,
            ReadSide::Inline { reader, reading } => {
                if reading.is_none() {
                    let mut r = reader.take()?;
                    let signer = signer.clone();
                    *reading = Some(Box::pin(async move {
                        let batch = read_batch(&mut r, &signer).await;
                        (r, batch)
                    }));
                }
                let (r, batch) = reading.as_mut()?.await;
                *reading = None;
                if batch.as_ref().is_some_and(|b| b.end.is_none()) {
                    *reader = Some(r);
                }
                batch.map(Box::new)
            }
        }
    }

    /// A batch already read, if one waits (only a reader task reads ahead).
    pub(super) fn try_recv(&mut self) -> Option<Box<ReadBatch>> {
        match self {
            ReadSide::Task { rx, .. } => rx.try_recv().ok(),
            ReadSide::Inline { .. } => None,
        }
    }

    /// Stop reading.
    pub(super) fn stop(self) {
        if let ReadSide::Task { task, .. } = self {
            task.abort();
        }
    }
}

/// Read one batch: the next line (waiting for it), then what is buffered and what the
/// transport has without waiting, up to [`READ_BATCH_BYTES`] or [`READ_BATCH_LINES`];
/// parsed, with signatures checked once the peer signs ([`crate::session::preparse`]).
/// None when the runtime is shutting down.
async fn read_batch(
    reader: &mut net::LineReader,
    signer: &crate::session::Signer,
) -> Option<ReadBatch> {
    let first = reader.read_line().await;
    let mut lines = Vec::new();
    let mut bytes = 0;
    let mut item = first;
    let end = loop {
        let it = match item {
            Ok(Some(l)) => {
                bytes += l.len();
                lines.push(l);
                None
            }
            Ok(None) => Some(ReadEnd::Eof),
            Err(ReadError::Io(e)) => Some(ReadEnd::Cut(cut_detail(&e))),
            Err(ReadError::TooLarge) => Some(ReadEnd::TooLarge),
        };
        if it.is_some() || bytes >= READ_BATCH_BYTES || lines.len() >= READ_BATCH_LINES {
            break it;
        }
        // What is buffered, then what the transport has without waiting: a busy
        // connection's batches grow to the batch bound (fewer hand-offs, larger signature
        // batches); an idle one's end at what arrived.
        item = match reader.buffered_line() {
            Ok(Some(l)) => Ok(Some(l)),
            Ok(None) => match futures_util::FutureExt::now_or_never(reader.read_line()) {
                Some(r) => r,
                None => break None,
            },
            Err(e) => Err(e),
        };
    };
    let signer = signer.get().copied();
    let parsed = if lines.len() >= OFFLOAD_LINES || bytes >= OFFLOAD_BYTES {
        // Milliseconds of work: on a blocking thread, so that the session's task (woken on
        // this worker by the last send) is not held behind it.
        let task =
            tokio::task::spawn_blocking(move || crate::session::preparse(lines, signer.as_ref()));
        match task.await {
            Ok(p) => p,
            // A panic in the parsers is a bug: not hidden.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => return None,
        }
    } else {
        crate::session::preparse(lines, signer.as_ref())
    };
    Some(ReadBatch { lines: parsed, end })
}

/// How the read side of a connection ended.
pub(super) enum ReadEnd {
    /// A line over the size cap.
    TooLarge,
    /// Clean end: EOF (on TLS, after the peer's close_notify).
    Eof,
    /// Unclean end: truncated TLS, reset or another read error.
    Cut(String),
}

/// How an unclean end of the read side is logged.
fn cut_detail(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        "stream truncated (no TLS close_notify)".into()
    } else {
        e.to_string()
    }
}

/// A write of one batch in progress. It owns the connection's writer until it completes,
/// then hands it back (the batch's buffer is dropped: an idle connection holds none).
/// The writer is None only when a write task ended without returning it (it panicked).
pub(super) type Write = std::pin::Pin<
    Box<dyn std::future::Future<Output = (Option<net::BoxWriter>, std::io::Result<()>)> + Send>,
>;

/// A batch of at least this many bytes is written by a task of its own
/// ([`start_write`]) when the runtime has worker threads to spare.
const SPAWN_WRITE_BYTES: usize = 256 * 1024;

/// Write `buf` (whole `\n`-terminated lines) and flush (TLS sends its records). A large
/// batch (blob chunks, a replay) is written by a task of its own, so that its encryption
/// and socket writes run on another worker while the connection's task prepares the next
/// batch (reading chunk data from a file, hashing and encoding it: issue 10, blob
/// throughput); a small one is polled in the connection's task (no task per write).
pub(super) fn start_write(mut writer: net::BoxWriter, buf: Vec<u8>) -> Write {
    let big = buf.len() >= SPAWN_WRITE_BYTES;
    let write = async move {
        let res = async {
            writer.write_all(&buf).await?;
            writer.flush().await
        }
        .await;
        (writer, res)
    };
    if big && crate::par::on_multi_thread_runtime() {
        let mut task = AbortOnDrop(tokio::spawn(write));
        return Box::pin(async move {
            match (&mut task.0).await {
                Ok((w, res)) => (Some(w), res),
                Err(e) => (None, Err(std::io::Error::other(e))),
            }
        });
    }
    Box::pin(async move {
        let (w, res) = write.await;
        (Some(w), res)
    })
}
/// A write task that is stopped when the connection drops its [`Write`] (a connection
/// that ends, or a node that stops, leaves no write running on its own).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running write's result; never ready when none runs.
pub(super) async fn in_write(
    writing: &mut Option<Write>,
) -> (Option<net::BoxWriter>, std::io::Result<()>) {
    match writing {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// At the end of a connection whose writes have not failed: complete the running write,
/// write `pending` (the closing err or bye), then shut the writer down (TLS close_notify,
/// then the transport's write side). Stops at the first error: there is no one left to
/// tell.
pub(super) async fn finish_writes(
    writing: Option<Write>,
    writer: Option<net::BoxWriter>,
    pending: Vec<u8>,
) {
    let mut writer = match (writing, writer) {
        (Some(w), _) => match w.await {
            (Some(w), Ok(())) => w,
            _ => return,
        },
        (None, Some(w)) => w,
        (None, None) => return,
    };
    if !pending.is_empty() {
        let res = async {
            writer.write_all(&pending).await?;
            writer.flush().await
        }
        .await;
        if res.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Bytes per write batch.
pub(super) const WRITE_BATCH: usize = 256 * 1024;

/// Take lines from the session into `pending` (each with its `\n`) until it holds
/// [`WRITE_BATCH`] bytes or the session has nothing more to send now.
pub(super) fn fill_pending(session: &mut crate::session::Session, pending: &mut Vec<u8>) {
    while pending.len() < WRITE_BATCH {
        match session.poll_transmit() {
            Some(l) => push_line(pending, l),
            None => break,
        }
    }
}

/// Lines at least this long (bytes) are not copied into an empty write batch: the line's
/// own buffer becomes the batch (a 1 MiB chunk line copied, then copied again as the batch
/// grew for its `\n`, was two of the sender's passes over the data).
const MOVE_LINE: usize = 64 * 1024;

/// Append `line` and its `\n` to the write batch `pending`.
pub(super) fn push_line(pending: &mut Vec<u8>, mut line: Vec<u8>) {
    if pending.is_empty() && line.len() >= MOVE_LINE {
        line.push(b'\n');
        *pending = line;
        return;
    }
    pending.reserve(line.len() + 1);
    pending.extend_from_slice(&line);
    pending.push(b'\n');
}
