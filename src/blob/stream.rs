//! Streamed blobs, sender side (issue 10 §3): the chunk lines of a file sent with
//! `awp send -f` are queued as stubs (`"data":""`); the blob record (`blobs_out`: source
//! path, size, SHA-256, modification time, chunk size) says where their data is, and
//! [`fill`] reads it from the source file when the line is written to the peer. The data
//! is thus on disk once (the user's file), not in the outbox and the out log.
//!
//! The file must still be the one that was hashed at `send` (a hash that may still be
//! running while the first chunks go out, see [`super::pending`]: the comparison waits for
//! it): before and after every chunk its size and modification time are compared with the
//! record, and its SHA-256 is checked again — over the chunks as they are read when sending starts at chunk 0 (so
//! before the last chunk, and thus the msg naming the blob, goes out), or over the whole
//! file when a later chunk is the first this process sends. When anything differs
//! the blob is stopped ([`crate::store::Store::stop_changed_blob`]): the chunks still
//! queued and the msg naming the blob leave the outbox and an `err blob_refused` about the
//! msg is stored in its thread, so the receiver never sees the msg of a blob whose data is
//! not the declared one, and the sender reads why.

use super::send::mtime_ns;
use crate::store::{LogEntry, OutBlobState, OutboxEntry, Store};
use crate::wire::{self, PeerKey};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, OnceLock};

/// Longest outbox chunk line that can be a stub (stubs carry no data; a full line is
/// written as it is).
const STUB_MAX: usize = 4096;

/// Source files kept open (and known to hash right) at most, process-wide.
const OPEN_MAX: usize = 64;

/// What to write for one outbox entry.
#[derive(Debug)]
pub enum Fill {
    /// Write this line.
    Line(Vec<u8>),
    /// The entry's blob was stopped: nothing to write; these ids left the outbox (drop them
    /// from any batch fetched earlier), and `entry` is the refusal stored in the thread.
    Stopped {
        dropped: Vec<String>,
        entry: Option<LogEntry>,
    },
    /// The store could not be read or written: the session fails as on any storage error
    /// (nothing written for this entry, which stays queued).
    Failed(crate::store::StoreError),
}

/// The line to write for outbox entry `e` of `peer`: the entry's own line, or for a chunk
/// stub of a streamed blob the chunk with its data read from the source file (see the
/// module doc).
pub fn fill(store: &Store, peer: &PeerKey, e: OutboxEntry) -> Fill {
    if e.kind != "chunk" || e.line.len() > STUB_MAX {
        return Fill::Line(e.line);
    }
    let Some(stub) = parse_stub(&e.line) else {
        return Fill::Line(e.line);
    };
    let record = match store.blob_out(peer, &stub.blob_ref) {
        Ok(Some(r)) => r,
        // Not a streamed blob we know (an empty file's one chunk, a line queued before
        // streaming existed): as stored.
        Ok(None) => return Fill::Line(e.line),
        Err(err) => return Fill::Failed(err),
    };
    let Some(chunk_size) = record.chunk_size else {
        return Fill::Line(e.line);
    };
    if record.refused {
        // Stopped meanwhile (by the node when hashing it after queueing failed): nothing
        // of it goes out any more, and a batch fetched before must not send its msg.
        forget(peer, &stub.blob_ref);
        let mut dropped = record.chunk_ids.clone();
        dropped.push(record.msg_id.clone());
        return Fill::Stopped {
            dropped,
            entry: None,
        };
    }
    // The digests the file must have: recorded, or still being computed (the node queues
    // a file before it hashes it, see `super::pending`).
    let expected = || -> Result<Want, String> {
        if !record.sha256.is_empty() {
            return Ok(Want::of(&record));
        }
        if let Some(outcome) = super::pending::wait(peer, &stub.blob_ref) {
            return outcome
                .map(|d| Want {
                    sha256: d.sha256,
                    blake3: Some(d.blake3),
                })
                .map_err(|e| format!("hashing it after it was queued: {e}"));
        }
        match store.blob_out(peer, &stub.blob_ref) {
            Ok(Some(r)) if !r.sha256.is_empty() => Ok(Want::of(&r)),
            Ok(_) => Err(NEVER_HASHED.into()),
            Err(err) => Err(format!("reading its record: {err}")),
        }
    };
    match read_chunk(peer, &stub.blob_ref, &record, chunk_size, stub.n, &expected) {
        Ok(data) => {
            let line = splice(&e.line, &data);
            give_back(data);
            Fill::Line(line)
        }
        Err(why) => {
            forget(peer, &stub.blob_ref);
            let what = if why == NEVER_HASHED {
                format!(
                    "the node stopped while it hashed {} after queueing it, so what goes out \
                     cannot be checked",
                    record.source
                )
            } else {
                format!("{} changed after it was queued ({why})", record.source)
            };
            let detail = format!(
                "not sent by this node: {what}; nothing more of it goes out, send the file again"
            );
            tracing::warn!(%peer, blob_ref = %stub.blob_ref, "{detail}");
            match store.stop_changed_blob(peer, &stub.blob_ref, &e.id, &detail) {
                Ok(s) => Fill::Stopped {
                    dropped: s.dropped,
                    entry: s.entry,
                },
                Err(err) => Fill::Failed(err),
            }
        }
    }
}

/// Why a streamed blob cannot be checked: its record has no SHA-256 and no hash of it is in
/// progress (the node stopped while it hashed the file after queueing it).
const NEVER_HASHED: &str = "its SHA-256 was never recorded";

/// The fields of a chunk stub that [`fill`] needs.
struct Stub {
    blob_ref: String,
    n: u64,
}

/// A chunk line with empty data, as [`wire::Line::encode`] makes it (`data` last).
fn parse_stub(line: &[u8]) -> Option<Stub> {
    if !line.ends_with(br#","data":""}"#) {
        return None;
    }
    match wire::parse_line(line) {
        Ok(wire::Line::Chunk(c)) if c.data.is_empty() => Some(Stub {
            blob_ref: c.blob_ref,
            n: c.n,
        }),
        _ => None,
    }
}

thread_local! {
    /// The buffer chunks are read into, kept by the thread between chunks (at most one
    /// chunk, 1 MiB, per thread that streams), so it is not zeroed again for every chunk.
    static CHUNK_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of `len` bytes: the thread's kept buffer (bytes past its last length are
/// zeroed) or a new one. Its prefix may hold an earlier chunk's bytes: the caller must
/// overwrite all `len` of them (`read_exact_at`, which fails otherwise, and then the
/// buffer is dropped, not given back).
fn take_buf(len: usize) -> Vec<u8> {
    let mut buf = CHUNK_BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.resize(len, 0);
    buf
}

/// Keep `buf` for the thread's next [`take_buf`] (which took the kept one).
fn give_back(buf: Vec<u8>) {
    CHUNK_BUF.with(|b| *b.borrow_mut() = buf);
}

/// `stub` (ending `"data":""}`) with `data` as standard padded base64 in its data field.
fn splice(stub: &[u8], data: &[u8]) -> Vec<u8> {
    let head = &stub[..stub.len() - 2];
    // One byte more for the `\n` the connection appends (no reallocation of a 1 MiB line).
    let mut out = Vec::with_capacity(head.len() + data.len().div_ceil(3) * 4 + 3);
    out.extend_from_slice(head);
    wire::b64::encode_std_append(data, &mut out);
    out.extend_from_slice(b"\"}");
    out
}

/// An open source file being sent.
struct Open {
    file: Arc<File>,
    /// The hash of chunks `0..next` as they were read, when the blob was opened at chunk 0
    /// (None: the whole file was hashed when it was opened).
    running: Option<(Running, u64)>,
}

/// A hash over a streamed blob's data as it is read: BLAKE3 when the record has that
/// digest or will have it (queued before it was hashed, see `super::pending`), else
/// SHA-256 (records written before BLAKE3 was recorded).
enum Running {
    Blake3(Box<blake3::Hasher>),
    Sha256(Sha256),
}

impl Running {
    fn for_record(r: &OutBlobState) -> Running {
        if r.blake3.is_some() || r.sha256.is_empty() {
            Running::Blake3(Box::default())
        } else {
            Running::Sha256(Sha256::new())
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            Running::Blake3(h) => {
                h.update(data);
            }
            Running::Sha256(h) => h.update(data),
        }
    }

    /// Compare the hash of everything given to [`Running::update`] with `want`.
    fn check(self, want: &Want) -> Result<(), String> {
        match self {
            Running::Sha256(h) => {
                let got = super::hex(&h.finalize());
                if got != want.sha256 {
                    return Err(format!("SHA-256 {got}, queued as {}", want.sha256));
                }
            }
            Running::Blake3(h) => {
                let got = h.finalize().to_hex().to_string();
                match &want.blake3 {
                    Some(w) if *w == got => {}
                    Some(w) => return Err(format!("BLAKE3 {got}, hashed at send as {w}")),
                    None => return Err("no BLAKE3 was recorded for it".into()),
                }
            }
        }
        Ok(())
    }
}

/// The digests a streamed blob's file must have (lowercase hex).
struct Want {
    sha256: String,
    blake3: Option<String>,
}

impl Want {
    fn of(r: &OutBlobState) -> Want {
        Want {
            sha256: r.sha256.clone(),
            blake3: r.blake3.clone(),
        }
    }
}

type Key = (PeerKey, String);

fn open_files() -> std::sync::MutexGuard<'static, HashMap<Key, Open>> {
    static OPEN: OnceLock<Mutex<HashMap<Key, Open>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn forget(peer: &PeerKey, blob_ref: &str) {
    open_files().remove(&(*peer, blob_ref.to_string()));
}

/// The digests a streamed blob's file must have, or why there are none; asked only when
/// they are compared (it may wait for a hash still running).
type Expected<'a> = &'a dyn Fn() -> Result<Want, String>;

/// Hash the whole source file and compare with the expected digest.
fn check_hash(f: &File, r: &OutBlobState, expected: Expected<'_>) -> Result<(), String> {
    let mut h = Running::for_record(r);
    super::send::read_file(f, r.size, |b| h.update(b)).map_err(|e| format!("reading it: {e}"))?;
    h.check(&expected()?)
}

/// Whether `f` still has the size and modification time of the record.
fn same(f: &File, r: &OutBlobState) -> Result<(), String> {
    let m = f.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    if m.len() != r.size {
        return Err(format!("{} bytes, queued as {}", m.len(), r.size));
    }
    if Some(mtime_ns(&m)) != r.mtime_ns {
        return Err("its modification time differs".into());
    }
    Ok(())
}

/// The data of chunk `n`, read from the source file, which must still match the record:
/// its size and modification time before and after every read, and its digest (BLAKE3,
/// or SHA-256 for records without one; `expected`, asked only when it is compared) — over
/// the chunks as they are read when sending starts at chunk 0 (checked when the last
/// chunk is read, so before the msg naming the blob can go out), else over the whole
/// file when it is opened to resume later chunks.
fn read_chunk(
    peer: &PeerKey,
    blob_ref: &str,
    r: &OutBlobState,
    chunk_size: u64,
    n: u64,
    expected: Expected<'_>,
) -> Result<Vec<u8>, String> {
    let start = n.saturating_mul(chunk_size).min(r.size);
    let end = start.saturating_add(chunk_size).min(r.size);
    let key = (*peer, blob_ref.to_string());
    let cached = open_files()
        .get(&key)
        .map(|o| (o.file.clone(), o.running.as_ref().map(|(_, next)| *next)));
    let (f, running_next) = match cached {
        Some(c) => c,
        None => {
            let f = File::open(&r.source).map_err(|e| format!("cannot open it: {e}"))?;
            same(&f, r)?;
            let running = if n == 0 {
                Some((Running::for_record(r), 0))
            } else {
                check_hash(&f, r, expected)?;
                None
            };
            let f = Arc::new(f);
            let next = running.as_ref().map(|(_, next)| *next);
            let mut open = open_files();
            if open.len() >= OPEN_MAX {
                if let Some(k) = open.keys().next().cloned() {
                    open.remove(&k);
                }
            }
            open.insert(
                key.clone(),
                Open {
                    file: f.clone(),
                    running,
                },
            );
            (f, next)
        }
    };
    same(&f, r)?;
    let mut buf = take_buf((end - start) as usize);
    f.read_exact_at(&mut buf, start)
        .map_err(|e| format!("reading it: {e}"))?;
    same(&f, r)?;
    let last = end == r.size;
    match running_next {
        Some(next) if next == n => {
            let mut open = open_files();
            if let Some(o) = open.get_mut(&key) {
                if let Some((h, next)) = o.running.as_mut() {
                    h.update(&buf);
                    *next += 1;
                }
                if last {
                    if let Some((h, _)) = o.running.take() {
                        // Not under the table's lock: this may wait for the queue-time
                        // hash.
                        drop(open);
                        h.check(&expected()?)?;
                    }
                }
            }
        }
        Some(_) => {
            // Out of order (a resend after a reconnect): hash the whole file once instead.
            check_hash(&f, r, expected)?;
            if let Some(o) = open_files().get_mut(&key) {
                o.running = None;
            }
        }
        None => {}
    }
    if last {
        // The last chunk: the file is not needed any more.
        forget(peer, blob_ref);
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_puts_base64_data_into_a_stub() {
        let stub = wire::Line::Chunk(wire::Chunk {
            id: "01K0000000000000000000000A".into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: Some("t".into()),
            blob_ref: "r".into(),
            n: 3,
            last: false,
            data: String::new(),
        })
        .encode();
        let s = parse_stub(&stub).expect("a stub");
        assert_eq!((s.blob_ref.as_str(), s.n), ("r", 3));
        for data in [&b""[..], b"a", b"ab", b"abc", &[0xfb, 0xff, 0x00, 7]] {
            let full = splice(&stub, data);
            let wire::Line::Chunk(c) = wire::parse_line(&full).unwrap() else {
                panic!("not a chunk")
            };
            assert_eq!(wire::b64::decode_any(&c.data).unwrap(), data);
            assert_eq!(c.data, wire::b64::encode_std(data));
        }
        // A line with data is not a stub.
        assert!(parse_stub(&splice(&stub, b"x")).is_none());
    }

    fn queue(store: &Store, peer: &PeerKey, o: &super::super::Outgoing) -> Vec<OutboxEntry> {
        let th = "thr_s";
        let chunks: Vec<_> = (0..o.chunk_count())
            .map(|n| move |id: &str, ts: &str| o.chunk(n, th, id, ts))
            .collect();
        let msg = |id: &str, ts: &str| {
            wire::Line::Msg(wire::Msg {
                id: id.into(),
                ts: ts.into(),
                th: th.into(),
                re: None,
                subject: None,
                parts: vec![o.part()],
            })
        };
        let mut builders: Vec<crate::store::LineBuilder<'_>> = chunks
            .iter()
            .map(|b| b as crate::store::LineBuilder<'_>)
            .collect();
        builders.push(&msg);
        let st = OutBlobState {
            th: String::new(),
            msg_id: String::new(),
            chunk_ids: vec![],
            name: o.name.clone(),
            mime: o.mime.clone(),
            size: o.size(),
            sha256: o.sha256.clone(),
            source: o.source.display().to_string(),
            refused: false,
            at_ms: 0,
            chunk_size: Some(crate::blob::CHUNK_SIZE as u64),
            mtime_ns: o.stream.map(|s| s.mtime_ns),
            reason: None,
            blake3: None,
        };
        store
            .enqueue_with_blobs(
                peer,
                &builders,
                vec![(o.blob_ref.clone(), o.chunk_count(), st)],
            )
            .unwrap()
    }

    fn data_of(f: Fill) -> Vec<u8> {
        let Fill::Line(l) = f else {
            panic!("not a line: {f:?}")
        };
        let wire::Line::Chunk(c) = wire::parse_line(&l).unwrap() else {
            panic!("not a chunk")
        };
        wire::b64::decode_any(&c.data).unwrap()
    }

    /// The outbox holds stubs; each is filled from the file when written. A file that
    /// changes between two chunks stops the blob: its queued chunks and its msg leave the
    /// outbox, the record says why, and the thread gets the refusal about the msg.
    #[test]
    fn stubs_are_filled_from_the_file_until_it_changes() {
        use crate::blob::CHUNK_SIZE;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let peer = crate::identity::Identity::from_seed(&[3; 32]).key();
        let path = dir.path().join("f.bin");
        let data: Vec<u8> = (0..2 * CHUNK_SIZE + 5).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let o = super::super::Outgoing::open(&path, 1 << 30).unwrap();
        let e = queue(&store, &peer, &o);
        assert_eq!(e.len(), 4);
        assert!(
            e[..3].iter().all(|x| x.line.len() < STUB_MAX),
            "stubs queued"
        );
        // The out log keeps each chunk without data: offset and length (the SHA-256 is
        // the record's).
        let logged = store.log(0, None, false, 10).unwrap();
        let c1: serde_json::Value = serde_json::from_slice(&logged[1].line).unwrap();
        assert_eq!(c1["data"], "");
        assert_eq!(c1["x_off"], CHUNK_SIZE as u64);
        assert_eq!(c1["x_len"], CHUNK_SIZE as u64);
        assert!(c1.get("x_sha256").is_none());
        let c2: serde_json::Value = serde_json::from_slice(&logged[2].line).unwrap();
        assert_eq!(c2["x_len"], 5);
        assert_eq!(
            data_of(fill(&store, &peer, e[0].clone())),
            &data[..CHUNK_SIZE]
        );
        // The msg is written as it is.
        let Fill::Line(m) = fill(&store, &peer, e[3].clone()) else {
            panic!()
        };
        assert_eq!(m, e[3].line);
        // Same size, new content and modification time.
        let mut other = data.clone();
        other[CHUNK_SIZE + 1] ^= 1;
        std::fs::write(&path, &other).unwrap();
        let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(t)
            .unwrap();
        let Fill::Stopped { dropped, entry } = fill(&store, &peer, e[1].clone()) else {
            panic!("a changed file was sent")
        };
        let ids: Vec<String> = e.iter().map(|x| x.id.clone()).collect();
        assert_eq!(dropped, ids);
        assert_eq!(store.outbox_len(&peer).unwrap(), 0);
        let rec = store.blob_out(&peer, &o.blob_ref).unwrap().unwrap();
        assert!(rec.refused);
        assert!(rec.reason.unwrap().contains("modification time"));
        let entry = entry.expect("refusal stored in the thread");
        let wire::Line::Err(err) = wire::parse_line(&entry.line).unwrap() else {
            panic!()
        };
        assert_eq!(err.code, "blob_refused");
        assert_eq!(err.re.as_deref(), Some(e[3].id.as_str()));
        assert_eq!(entry.th.as_deref(), Some("thr_s"));
        // Content changed with the size and modification time put back: the SHA-256 of
        // the chunks read is checked at the last one, before the msg can go out.
        std::fs::write(&path, &data).unwrap();
        let o = super::super::Outgoing::open(&path, 1 << 30).unwrap();
        let e = queue(&store, &peer, &o);
        assert_eq!(
            data_of(fill(&store, &peer, e[0].clone())),
            &data[..CHUNK_SIZE]
        );
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::write(&path, &other).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        assert_eq!(
            data_of(fill(&store, &peer, e[1].clone())),
            &other[CHUNK_SIZE..2 * CHUNK_SIZE]
        );
        let Fill::Stopped { dropped, .. } = fill(&store, &peer, e[2].clone()) else {
            panic!("the last chunk of a changed file was sent")
        };
        assert!(dropped.contains(&e[3].id), "the msg stays unsent");
        // A shorter file is caught by its size as well (a fresh blob, first chunk).
        std::fs::write(&path, &data).unwrap();
        let o = super::super::Outgoing::open(&path, 1 << 30).unwrap();
        let e = queue(&store, &peer, &o);
        std::fs::write(&path, &data[..10]).unwrap();
        assert!(matches!(
            fill(&store, &peer, e[0].clone()),
            Fill::Stopped { .. }
        ));
    }

    /// A temporary directory, a store in it and a peer key from `seed`.
    fn setup(seed: u8) -> (tempfile::TempDir, Store, PeerKey) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        let peer = crate::identity::Identity::from_seed(&[seed; 32]).key();
        (dir, store, peer)
    }

    /// A blob queued before its SHA-256 is known (`awp send -f`): its chunks go out while
    /// the hash runs, and the last one waits for the hash and checks against it.
    #[test]
    fn the_last_chunk_waits_for_a_hash_still_running_and_checks_against_it() {
        use crate::blob::CHUNK_SIZE;
        let (dir, store, peer) = setup(4);
        let path = dir.path().join("g.bin");
        let data: Vec<u8> = (0..CHUNK_SIZE + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let (o, hashing) = super::super::Outgoing::open_unhashed(&path, 1 << 30).unwrap();
        assert!(o.sha256.is_empty());
        super::super::pending::begin(&peer, &o.blob_ref);
        let e = queue(&store, &peer, &o);
        // Chunk 0 goes out without the hash.
        assert_eq!(
            data_of(fill(&store, &peer, e[0].clone())),
            &data[..CHUNK_SIZE]
        );
        // The last chunk blocks until the hash is recorded and published.
        let (store, peer2) = (std::sync::Arc::new(store), peer);
        let s2 = store.clone();
        let last = e[1].clone();
        let sender = std::thread::spawn(move || fill(&s2, &peer2, last));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !sender.is_finished(),
            "the last chunk went out before the hash"
        );
        let digests = hashing.run().unwrap();
        assert!(store
            .set_blob_out_digests(&peer, &o.blob_ref, &digests)
            .unwrap());
        super::super::pending::finish(&peer, &o.blob_ref, Ok(digests.clone()));
        assert_eq!(data_of(sender.join().unwrap()), &data[CHUNK_SIZE..]);
        let rec = store.blob_out(&peer, &o.blob_ref).unwrap().unwrap();
        assert_eq!(rec.sha256, crate::blob::hex(&Sha256::digest(&data)));
        assert_eq!(
            rec.blake3.as_deref(),
            Some(blake3::hash(&data).to_hex().as_str())
        );
        assert_eq!(rec.sha256, digests.sha256);
        // Recorded once: a second hash does not replace it.
        let other = crate::blob::Digests {
            sha256: "00".into(),
            blake3: "00".into(),
        };
        assert!(!store
            .set_blob_out_digests(&peer, &o.blob_ref, &other)
            .unwrap());
        // A wrong digest published (what a file changed under the hash would give) stops
        // the blob at its last chunk, msg included.
        let (o, _) = super::super::Outgoing::open_unhashed(&path, 1 << 30).unwrap();
        super::super::pending::begin(&peer, &o.blob_ref);
        let e = queue(&store, &peer, &o);
        assert_eq!(data_of(fill(&store, &peer, e[0].clone())).len(), CHUNK_SIZE);
        let wrong = crate::blob::Digests {
            sha256: digests.sha256.clone(),
            blake3: "0".repeat(64),
        };
        assert!(store
            .set_blob_out_digests(&peer, &o.blob_ref, &wrong)
            .unwrap());
        super::super::pending::finish(&peer, &o.blob_ref, Ok(wrong));
        let Fill::Stopped { dropped, .. } = fill(&store, &peer, e[1].clone()) else {
            panic!("the last chunk went out against a different hash")
        };
        assert!(dropped.contains(&e[2].id));
        let rec = store.blob_out(&peer, &o.blob_ref).unwrap().unwrap();
        assert!(rec.reason.unwrap().contains("BLAKE3"));
        // Hashed and recorded, then the content changed with size and modification time
        // put back: the BLAKE3 of the chunks read catches it at the last one, and a
        // first chunk after 0 (a resume) checks the whole file against it.
        for first in [0usize, 1] {
            std::fs::write(&path, &data).unwrap();
            let (o, hashing) = super::super::Outgoing::open_unhashed(&path, 1 << 30).unwrap();
            let e = queue(&store, &peer, &o);
            let d = hashing.run().unwrap();
            assert!(store.set_blob_out_digests(&peer, &o.blob_ref, &d).unwrap());
            let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
            let mut changed = data.clone();
            changed[CHUNK_SIZE + 2] ^= 0x40;
            std::fs::write(&path, &changed).unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(mtime).unwrap();
            drop(f);
            if first == 0 {
                assert_eq!(data_of(fill(&store, &peer, e[0].clone())).len(), CHUNK_SIZE);
            }
            let Fill::Stopped { dropped, .. } = fill(&store, &peer, e[1].clone()) else {
                panic!("changed content went out (first chunk sent: {first})")
            };
            assert!(dropped.contains(&e[2].id));
        }
    }

    /// No hash in this process and none recorded: the node stopped while it hashed the
    /// file after queueing it. The blob is stopped at the check, never sent unchecked.
    #[test]
    fn a_blob_whose_hash_was_never_recorded_is_stopped_at_its_check() {
        use crate::blob::CHUNK_SIZE;
        let (dir, store, peer) = setup(5);
        let path = dir.path().join("h.bin");
        std::fs::write(&path, vec![9u8; CHUNK_SIZE + 3]).unwrap();
        let (o, _) = super::super::Outgoing::open_unhashed(&path, 1 << 30).unwrap();
        let e = queue(&store, &peer, &o);
        // Resumed at chunk 1 (a later chunk first: the whole file is checked).
        let Fill::Stopped { dropped, entry } = fill(&store, &peer, e[1].clone()) else {
            panic!("sent without a hash to check")
        };
        assert!(dropped.contains(&e[2].id), "the msg stays unsent");
        assert!(entry.is_some(), "the refusal is stored in the thread");
        let rec = store.blob_out(&peer, &o.blob_ref).unwrap().unwrap();
        assert!(rec.refused);
        let reason = rec.reason.unwrap();
        assert!(reason.contains("stopped while it hashed"), "{reason}");
        assert!(!reason.contains("changed"), "{reason}");
        // A blob refused meanwhile (by the node, when its hash failed): every line of it
        // leaves a batch fetched before, the msg too.
        let (o, _) = super::super::Outgoing::open_unhashed(&path, 1 << 30).unwrap();
        let e = queue(&store, &peer, &o);
        store
            .stop_changed_blob(&peer, &o.blob_ref, "", "the file changed while it was read")
            .unwrap();
        let Fill::Stopped { dropped, entry } = fill(&store, &peer, e[0].clone()) else {
            panic!("a refused blob was sent")
        };
        let ids: Vec<String> = e.iter().map(|x| x.id.clone()).collect();
        assert_eq!(dropped, ids);
        assert!(entry.is_none(), "the refusal was stored once, by the stop");
    }
}
