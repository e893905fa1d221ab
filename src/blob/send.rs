//! Reading a file for sending and building its lines (protocol-notes §Blobs, sender).

use super::{guess_mime, hex, CHUNK_SIZE};
use crate::wire::{self, BlobPart, Chunk, Line};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A byte range of a file opened once, read chunk by chunk as the chunk lines are built, so
/// a large blob is never held in memory whole (served fs-read results).
#[derive(Debug, Clone)]
pub struct FileSlice {
    /// The open file (opened by the caller, e.g. confined beneath a served root).
    pub file: Arc<std::fs::File>,
    /// First byte of the range.
    pub offset: u64,
    /// Length of the range, bytes: the blob's declared size.
    pub len: u64,
}

/// A file read for sending: its bytes and what the blob part declares.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// A fresh ref (a ULID), unique among our blobs.
    pub blob_ref: String,
    /// The file name (last path component), as declared in the blob part.
    pub name: String,
    /// Media type from the extension or the content ([`guess_mime`]).
    pub mime: String,
    /// The data (empty when `file` is set).
    pub data: Vec<u8>,
    /// Read the data from this file range instead of `data`. A file that shrinks under
    /// us yields short chunks; the receiver then sees less than the declared size.
    pub file: Option<FileSlice>,
    /// Lowercase hex SHA-256 of `data`.
    pub sha256: String,
    /// Where it was read from.
    pub source: PathBuf,
    /// Set by [`Outgoing::open`]: the data stays in `source` and is read from it when each
    /// chunk is written to the peer ([`super::stream`]); the chunk lines queued are stubs
    /// without data ([`Outgoing::chunk`]).
    pub stream: Option<Streamed>,
}

/// What a streamed blob's source file looked like when it was hashed: sending stops when
/// the file no longer matches ([`super::stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed {
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// Modification time of `m` in nanoseconds since the Unix epoch (saturating).
pub fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec())
}

/// Why a file cannot be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Missing, unreadable, or a directory.
    #[error("cannot read {path}: {detail}")]
    Unreadable { path: String, detail: String },
    /// Over the blob limit.
    #[error("{path} is {size} bytes, over the {limit}-byte blob limit")]
    TooLarge { path: String, size: u64, limit: u64 },
}

/// The SHA-256 still to compute of a file opened by [`Outgoing::open_unhashed`].
#[derive(Debug)]
pub struct Hashing {
    file: Arc<std::fs::File>,
    path: PathBuf,
    size: u64,
    mtime_ns: i64,
}

/// The digests of a file sent with `awp send -f`, from one pass over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    /// Lowercase hex SHA-256: what the node reports and records.
    pub sha256: String,
    /// Lowercase hex BLAKE3 (32 bytes): what the stream checks the chunks it reads against
    /// ([`super::stream`]); a cryptographic hash like SHA-256, about three times faster
    /// here (4.3 against 1.3 GB/s on one thread), so the sender's second pass over the
    /// file costs a third as much.
    pub blake3: String,
}

impl Hashing {
    /// [`Digests`] of the file's `size` bytes, read once through the handle opened with
    /// the blob. [`SendError::Unreadable`] when it cannot be read, is shorter than its
    /// size, or its size or modification time changed since it was opened (then the data
    /// sent may not be the data hashed).
    pub fn run(self) -> Result<Digests, SendError> {
        let mut sha = Sha256::new();
        let mut b3 = blake3::Hasher::new();
        read_file(&self.file, self.size, |b| {
            sha.update(b);
            b3.update(b);
        })
        .map_err(|e| unreadable(&self.path, e))?;
        let after = self
            .file
            .metadata()
            .map_err(|e| unreadable(&self.path, e))?;
        if after.len() != self.size || mtime_ns(&after) != self.mtime_ns {
            return Err(unreadable(&self.path, "the file changed while it was read"));
        }
        Ok(Digests {
            sha256: hex(&sha.finalize()),
            blake3: b3.finalize().to_hex().to_string(),
        })
    }
}

impl Outgoing {
    /// Read `path` (at most `limit` bytes; a larger file is [`SendError::TooLarge`] before
    /// anything is read), hash it and allocate a ref.
    pub fn read(path: &Path, limit: u64) -> Result<Outgoing, SendError> {
        let (f, meta) = open_within(path, limit)?;
        // Read at most limit + 1 bytes: the file may grow while we read it.
        let mut data = Vec::with_capacity(meta.len() as usize);
        f.take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| unreadable(path, e))?;
        if data.len() as u64 > limit {
            return Err(SendError::TooLarge {
                path: path.display().to_string(),
                size: data.len() as u64,
                limit,
            });
        }
        let name = file_name(path);
        let mime = guess_mime(&name, &data[..data.len().min(512)]);
        Ok(Outgoing {
            blob_ref: ulid::Ulid::generate().to_string(),
            name,
            mime,
            sha256: hex(&Sha256::digest(&data)),
            data,
            file: None,
            source: path.to_path_buf(),
            stream: None,
        })
    }

    /// Hash `path` by streaming it (at most `limit` bytes; a larger file is
    /// [`SendError::TooLarge`] before anything is read) and allocate a ref, without keeping
    /// its bytes: the chunks are read from the file when they are sent ([`super::stream`]),
    /// so a queued blob costs no space in the store. A file that changes while it is hashed
    /// (size or modification time) is [`SendError::Unreadable`].
    pub fn open(path: &Path, limit: u64) -> Result<Outgoing, SendError> {
        let (mut o, hashing) = Outgoing::open_unhashed(path, limit)?;
        o.sha256 = hashing.run()?.sha256;
        Ok(o)
    }

    /// [`Outgoing::open`] without the hash: `sha256` is empty, and [`Hashing::run`] (on
    /// the same open file) computes it. The node queues the chunks first and hashes while
    /// they are sent (`awp send -f`, see [`super::pending`]): a large file's SHA-256 no
    /// longer comes before its first byte goes out. Reads the first 512 bytes for the
    /// media type. Errors as [`Outgoing::open`], except a change while hashing, which
    /// [`Hashing::run`] reports.
    pub fn open_unhashed(path: &Path, limit: u64) -> Result<(Outgoing, Hashing), SendError> {
        let (f, meta) = open_within(path, limit)?;
        let mut head = vec![0u8; meta.len().min(512) as usize];
        let mut got = 0;
        while got < head.len() {
            match f.read_at(&mut head[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(unreadable(path, e)),
            }
        }
        head.truncate(got);
        let name = file_name(path);
        let f = Arc::new(f);
        let streamed = Streamed {
            mtime_ns: mtime_ns(&meta),
        };
        let o = Outgoing {
            blob_ref: ulid::Ulid::generate().to_string(),
            mime: guess_mime(&name, &head),
            name,
            sha256: String::new(),
            data: Vec::new(),
            file: Some(FileSlice {
                file: f.clone(),
                offset: 0,
                len: meta.len(),
            }),
            source: path.to_path_buf(),
            stream: Some(streamed),
        };
        let hashing = Hashing {
            file: f,
            path: path.to_path_buf(),
            size: meta.len(),
            mtime_ns: streamed.mtime_ns,
        };
        Ok((o, hashing))
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        match &self.file {
            Some(f) => f.len,
            None => self.data.len() as u64,
        }
    }

    /// Number of chunk lines: one per [`CHUNK_SIZE`] bytes, and one for an empty file.
    pub fn chunk_count(&self) -> usize {
        (self.size() as usize).div_ceil(CHUNK_SIZE).max(1)
    }

    /// Chunk `n` (from 0) of this blob in thread `th`, with the given id and ts: data in
    /// standard padded base64, `last` on the final one. For a streamed blob
    /// ([`Outgoing::open`]) the data is empty: the line is a stub that
    /// [`super::stream::fill`] completes when the line is written to the peer.
    pub fn chunk(&self, n: usize, th: &str, id: &str, ts: &str) -> Line {
        let size = self.size() as usize;
        let start = (n * CHUNK_SIZE).min(size);
        let end = ((n + 1) * CHUNK_SIZE).min(size);
        let bytes = match &self.file {
            _ if self.stream.is_some() => std::borrow::Cow::Borrowed(&[][..]),
            Some(f) => std::borrow::Cow::Owned(read_range(f, start as u64, end - start)),
            None => std::borrow::Cow::Borrowed(&self.data[start..end]),
        };
        Line::Chunk(Chunk {
            id: id.into(),
            ts: ts.into(),
            th: Some(th.into()),
            blob_ref: self.blob_ref.clone(),
            n: n as u64,
            last: n + 1 == self.chunk_count(),
            data: wire::b64::encode_std(&bytes),
        })
    }

    /// The msg part naming this blob.
    pub fn part(&self) -> wire::Part {
        wire::Part::Blob(BlobPart {
            blob_ref: self.blob_ref.clone(),
            size: self.size(),
            name: Some(self.name.clone()),
            mime: Some(self.mime.clone()),
        })
    }
}

/// [`SendError::Unreadable`] for `path`.
fn unreadable(path: &Path, detail: impl std::fmt::Display) -> SendError {
    SendError::Unreadable {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// `path` opened for reading with its metadata, when it is a regular file of at most
/// `limit` bytes ([`SendError::TooLarge`] otherwise, before anything is read).
fn open_within(path: &Path, limit: u64) -> Result<(std::fs::File, std::fs::Metadata), SendError> {
    let f = std::fs::File::open(path).map_err(|e| unreadable(path, e))?;
    let meta = f.metadata().map_err(|e| unreadable(path, e))?;
    if !meta.is_file() {
        return Err(unreadable(path, "not a regular file"));
    }
    if meta.len() > limit {
        return Err(SendError::TooLarge {
            path: path.display().to_string(),
            size: meta.len(),
            limit,
        });
    }
    Ok((f, meta))
}

/// The name a blob of `path` declares: its file name (lossy UTF-8), else `blob`.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "blob".into())
}

/// Read the first `len` bytes of `f` in pieces of up to 1 MiB, in order, handing each to
/// `visit`. A file shorter than `len` is an error (`UnexpectedEof`).
pub(crate) fn read_file(
    f: &std::fs::File,
    len: u64,
    mut visit: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; (len as usize).clamp(1, 1 << 20)];
    let mut at = 0u64;
    while at < len {
        let want = buf.len().min((len - at) as usize);
        let n = match f.read_at(&mut buf[..want], at) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than its size",
            ));
        }
        visit(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// Up to `len` bytes of `f` from `f.offset + at` (fewer at end of file or on an error).
fn read_range(f: &FileSlice, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match f.file.read_at(&mut buf[got..], f.offset + at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf.truncate(got);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data.bin");
        std::fs::write(&p, bytes).unwrap();
        (d, p)
    }

    #[test]
    fn chunks_cover_the_file_in_order() {
        let data: Vec<u8> = (0..(CHUNK_SIZE * 2 + 10)).map(|i| i as u8).collect();
        let (_d, p) = file(&data);
        let o = Outgoing::read(&p, 1 << 30).unwrap();
        assert_eq!(o.chunk_count(), 3);
        let mut back = Vec::new();
        for n in 0..3 {
            let Line::Chunk(c) = o.chunk(n, "th1", "id", "ts") else {
                panic!()
            };
            assert_eq!(c.n, n as u64);
            assert_eq!(c.last, n == 2);
            assert_eq!(c.th.as_deref(), Some("th1"));
            back.extend(wire::b64::decode_any(&c.data).unwrap());
            assert!(Line::Chunk(c).encode().len() < wire::MAX_LINE);
        }
        assert_eq!(back, data);
        assert_eq!(o.name, "data.bin");
    }

    #[test]
    fn a_file_slice_is_read_chunk_by_chunk() {
        let data: Vec<u8> = (0..(CHUNK_SIZE + 100)).map(|i| (i % 251) as u8).collect();
        let (_d, p) = file(&data);
        let o = Outgoing {
            data: Vec::new(),
            file: Some(FileSlice {
                file: Arc::new(std::fs::File::open(&p).unwrap()),
                offset: 50,
                len: CHUNK_SIZE as u64 + 10,
            }),
            ..Outgoing::read(&p, 1 << 30).unwrap()
        };
        assert_eq!(o.chunk_count(), 2);
        let mut back = Vec::new();
        for n in 0..2 {
            let Line::Chunk(c) = o.chunk(n, "t", "i", "s") else {
                panic!()
            };
            back.extend(wire::b64::decode_any(&c.data).unwrap());
        }
        assert_eq!(back, &data[50..50 + CHUNK_SIZE + 10]);
    }

    #[test]
    fn empty_file_is_one_empty_last_chunk() {
        let (_d, p) = file(b"");
        let o = Outgoing::read(&p, 10).unwrap();
        assert_eq!(o.chunk_count(), 1);
        let Line::Chunk(c) = o.chunk(0, "t", "i", "s") else {
            panic!()
        };
        assert!(c.last);
        assert_eq!(c.data, "");
    }

    #[test]
    fn over_the_limit_and_missing_files_are_refused() {
        let (_d, p) = file(&[1u8; 11]);
        assert!(matches!(
            Outgoing::read(&p, 10),
            Err(SendError::TooLarge { size: 11, .. })
        ));
        assert!(Outgoing::read(&p, 11).is_ok());
        assert!(matches!(
            Outgoing::read(Path::new("/nonexistent/x"), 10),
            Err(SendError::Unreadable { .. })
        ));
        assert!(matches!(
            Outgoing::read(Path::new("/"), 10),
            Err(SendError::Unreadable { .. })
        ));
    }
}
