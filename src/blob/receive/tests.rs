//! BlobReceiver with a real store in a temp dir and explicit inputs: no sockets.

use super::*;
use crate::blob::CHUNK_SIZE;
use crate::wire::{BlobPart, TextPart};
use std::io::Write;
use tempfile::TempDir;

struct T {
    _dir: TempDir,
    root: PathBuf,
    store: Arc<Store>,
    rx: BlobReceiver,
    peer: PeerKey,
    ids: u32,
}

fn key(n: u8) -> PeerKey {
    let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
    PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
}

fn setup(limit: u64) -> T {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
    let root = dir.path().join("blobs");
    T {
        rx: BlobReceiver::new(store.clone(), root.clone(), limit),
        _dir: dir,
        root,
        store,
        peer: key(9),
        ids: 0,
    }
}

impl T {
    fn id(&mut self) -> String {
        self.ids += 1;
        format!("01K0000000000000000000{:04}", self.ids)
    }
    fn chunk(&mut self, r: &str, n: u64, last: bool, data: &[u8]) -> Verdict {
        let c = self.chunk_line(r, n, last, &wire::b64::encode_std(data));
        self.rx.on_chunk(&self.peer, &c).unwrap()
    }
    fn chunk_line(&mut self, r: &str, n: u64, last: bool, data: &str) -> Chunk {
        Chunk {
            id: self.id(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: Some("thr_1".into()),
            blob_ref: r.into(),
            n,
            last,
            data: data.into(),
        }
    }
    fn msg(&mut self, r: &str, size: u64, name: &str) -> Vec<Verdict> {
        let m = Msg {
            id: self.id(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: "thr_1".into(),
            re: None,
            subject: None,
            parts: vec![
                Part::Text(TextPart {
                    text: "file".into(),
                }),
                Part::Blob(BlobPart {
                    blob_ref: r.into(),
                    size,
                    name: Some(name.into()),
                    mime: Some("application/octet-stream".into()),
                }),
            ],
        };
        self.rx.on_msg(&self.peer, &m).unwrap()
    }
    fn state(&self, r: &str) -> InBlobState {
        self.store.blob_in(&self.peer, r).unwrap().expect("record")
    }
    fn done(&mut self) -> Vec<Completed> {
        self.store.flush_blocking().unwrap();
        self.rx.after_flush()
    }
    fn partial(&self, r: &str) -> PathBuf {
        partial_path(&peer_dir(&self.root, &self.peer), r)
    }
}

fn refused(v: &Verdict) -> bool {
    matches!(v, Verdict::Refuse { .. })
}

fn sha_hex(b: &[u8]) -> String {
    crate::blob::hex(&Sha256::digest(b))
}

#[test]
fn chunks_in_order_then_msg_complete_with_sha_and_seen() {
    let mut t = setup(1 << 20);
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(t.chunk("r1", 0, false, &data[..400]), Verdict::Stored);
    assert_eq!(t.chunk("r1", 1, true, &data[400..]), Verdict::Stored);
    assert_eq!(t.state("r1").status, InStatus::Pending);
    assert!(t.done().is_empty(), "not complete before its msg");
    assert_eq!(t.msg("r1", 1000, "data.bin"), vec![Verdict::Stored]);
    let done = t.done();
    assert_eq!(done.len(), 1);
    let c = &done[0];
    assert_eq!(c.sha256, sha_hex(&data));
    assert_eq!(std::fs::read(&c.path).unwrap(), data);
    assert_eq!(c.path, peer_dir(&t.root, &t.peer).join("data.bin"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&c.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "received files are private");
    assert!(!t.partial("r1").exists());
    let st = t.state("r1");
    assert_eq!(st.status, InStatus::Complete);
    assert_eq!(st.sha256.as_deref(), Some(sha_hex(&data).as_str()));
    // seen covers the chunks (resume then skips them).
    assert_eq!(
        t.store.seen(&t.peer).unwrap()["thr_1"],
        "01K00000000000000000000002"
    );
}

#[test]
fn chunks_after_the_msg_also_complete() {
    let mut t = setup(1 << 20);
    assert_eq!(t.msg("r1", 6, "a.txt"), vec![Verdict::Stored]);
    assert_eq!(t.chunk("r1", 0, false, b"abc"), Verdict::Stored);
    assert!(t.done().is_empty());
    assert_eq!(t.chunk("r1", 1, true, b"def"), Verdict::Stored);
    let done = t.done();
    assert_eq!(std::fs::read(&done[0].path).unwrap(), b"abcdef");
    // A replayed msg changes nothing.
    assert_eq!(t.msg("r1", 6, "a.txt"), vec![Verdict::Stored]);
    assert!(t.done().is_empty());
}

#[test]
fn replay_below_expected_is_ignored_without_duplicating_bytes() {
    let mut t = setup(1 << 20);
    t.chunk("r1", 0, false, b"abc");
    assert_eq!(t.chunk("r1", 0, false, b"abc"), Verdict::Replay);
    assert_eq!(t.state("r1").offset, 3);
    t.chunk("r1", 1, true, b"d");
    t.msg("r1", 4, "x");
    assert_eq!(std::fs::read(&t.done()[0].path).unwrap(), b"abcd");
    assert_eq!(t.chunk("r1", 1, true, b"d"), Verdict::Replay);
}

#[test]
fn gap_is_refused_and_the_partial_dropped() {
    let mut t = setup(1 << 20);
    t.chunk("r1", 0, false, b"abc");
    assert!(t.partial("r1").exists());
    let v = t.chunk("r1", 2, false, b"xyz");
    let Verdict::Refuse {
        blob_ref, detail, ..
    } = &v
    else {
        panic!("{v:?}")
    };
    assert_eq!(blob_ref.as_deref(), Some("r1"));
    assert!(detail.contains("where 1 was next"), "{detail}");
    assert!(!t.partial("r1").exists());
    assert_eq!(t.state("r1").status, InStatus::Refused);
    // Later chunks of a refused blob are ignored silently (no second err).
    assert_eq!(t.chunk("r1", 1, false, b"d"), Verdict::Stored);
    assert!(!t.partial("r1").exists());
    assert_eq!(t.msg("r1", 4, "x"), vec![Verdict::Stored]);
    assert!(t.done().is_empty());
}

#[test]
fn bad_base64_is_refused() {
    let mut t = setup(1 << 20);
    let c = t.chunk_line("r1", 0, true, "not base64!");
    let v = t.rx.on_chunk(&t.peer, &c).unwrap();
    assert!(
        matches!(&v, Verdict::Refuse { re, .. } if *re == c.id),
        "{v:?}"
    );
}

#[test]
fn over_the_limit_is_refused_by_data_and_by_declaration() {
    let mut t = setup(10);
    t.chunk("r1", 0, false, b"123456");
    assert!(refused(&t.chunk("r1", 1, true, b"78901")));
    assert_eq!(t.state("r1").status, InStatus::Refused);
    let v = t.msg("r2", 11, "big");
    assert!(refused(&v[0]), "{v:?}");
    // Exactly the limit is fine.
    t.chunk("r3", 0, true, b"0123456789");
    t.msg("r3", 10, "ok");
    assert_eq!(t.done().len(), 1);
}

#[test]
fn over_the_declared_size_or_short_is_refused() {
    let mut t = setup(1 << 20);
    t.msg("r1", 4, "x");
    assert!(refused(&t.chunk("r1", 0, false, b"12345")));
    t.msg("r2", 4, "y");
    assert!(refused(&t.chunk("r2", 0, true, b"123")), "last chunk short");
    // Data first, then a msg declaring less than arrived.
    t.chunk("r3", 0, false, b"12345");
    assert!(refused(&t.msg("r3", 4, "z")[0]));
}

#[test]
fn chunk_after_last_is_refused() {
    let mut t = setup(1 << 20);
    t.chunk("r1", 0, true, b"ab");
    assert!(refused(&t.chunk("r1", 1, false, b"c")));
}

#[test]
fn empty_file_is_one_empty_last_chunk() {
    let mut t = setup(1 << 20);
    assert_eq!(t.chunk("r1", 0, true, b""), Verdict::Stored);
    t.msg("r1", 0, "empty.txt");
    let done = t.done();
    assert_eq!(done[0].size, 0);
    assert_eq!(std::fs::read(&done[0].path).unwrap(), b"");
    assert_eq!(done[0].sha256, sha_hex(b""));
}

#[test]
fn hostile_names_land_inside_the_peer_directory() {
    let mut t = setup(1 << 20);
    for (i, name) in ["../../etc/passwd", "/etc/passwd", "..", "a\nb"]
        .iter()
        .enumerate()
    {
        let r = format!("r{i}");
        t.chunk(&r, 0, true, b"x");
        t.msg(&r, 1, name);
    }
    let done = t.done();
    let dir = peer_dir(&t.root, &t.peer);
    let names: Vec<String> = done
        .iter()
        .map(|c| {
            assert_eq!(c.path.parent().unwrap(), dir);
            c.path.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    assert_eq!(names, ["passwd", "passwd (1)", "blob", "ab"]);
}

#[test]
fn bad_refs_and_too_many_pending_blobs_are_refused() {
    let mut t = setup(1 << 20);
    assert!(refused(&t.chunk("", 0, false, b"a")));
    assert!(refused(&t.chunk(
        &"r".repeat(MAX_REF_LEN + 1),
        0,
        false,
        b"a"
    )));
    for i in 0..MAX_PENDING_PER_PEER {
        assert_eq!(t.chunk(&format!("p{i}"), 0, false, b"a"), Verdict::Stored);
    }
    assert!(refused(&t.chunk("one-more", 0, false, b"a")));
    assert!(refused(&t.msg("and-another", 1, "x")[0]));
}

#[test]
fn crash_leftovers_past_the_recorded_offset_are_truncated() {
    let mut t = setup(1 << 20);
    t.chunk("r1", 0, false, b"abc");
    // A crash after writing chunk 1 but before its offset was recorded leaves extra bytes.
    let p = t.partial("r1");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"GARBAGE")
        .unwrap();
    // A new receiver (restart) gets chunk 1 replayed: written at offset 3, not appended.
    let mut rx = BlobReceiver::new(t.store.clone(), t.root.clone(), 1 << 20);
    let c = t.chunk_line("r1", 1, true, &wire::b64::encode_std(b"de"));
    assert_eq!(rx.on_chunk(&t.peer, &c).unwrap(), Verdict::Stored);
    assert_eq!(std::fs::read(&p).unwrap(), b"abcde");
    t.rx = rx;
    t.msg("r1", 5, "f");
    assert_eq!(std::fs::read(&t.done()[0].path).unwrap(), b"abcde");
}

#[test]
fn recover_finishes_an_interrupted_move() {
    let mut t = setup(1 << 20);
    t.chunk("r1", 0, true, b"hello");
    t.msg("r1", 5, "h.txt");
    t.store.flush_blocking().unwrap();
    // Crash before after_flush: the record is complete, the data still partial.
    let st = t.state("r1");
    assert_eq!(st.status, InStatus::Complete);
    let path = PathBuf::from(st.path.unwrap());
    assert!(!path.exists());
    let rx = BlobReceiver::new(t.store.clone(), t.root.clone(), 1 << 20);
    assert_eq!(rx.recover().unwrap(), 1);
    assert_eq!(std::fs::read(&path).unwrap(), b"hello");
    assert!(!t.partial("r1").exists());
}

#[test]
fn large_blob_in_full_chunks() {
    let mut t = setup(1 << 30);
    let data: Vec<u8> = (0..CHUNK_SIZE * 3 + 5)
        .map(|i| (i * 31 % 256) as u8)
        .collect();
    let pieces: Vec<&[u8]> = data.chunks(CHUNK_SIZE).collect();
    t.msg("big", data.len() as u64, "big.bin");
    for (n, p) in pieces.iter().enumerate() {
        assert_eq!(
            t.chunk("big", n as u64, n + 1 == pieces.len(), p),
            Verdict::Stored
        );
    }
    let done = t.done();
    assert_eq!(done[0].sha256, sha_hex(&data));
}

#[test]
fn partial_data_per_peer_stays_within_its_budget() {
    let mut t = setup(10);
    // Two unfinished blobs fill the budget (2 x the limit).
    assert_eq!(t.chunk("a", 0, false, b"0123456789"), Verdict::Stored);
    assert_eq!(t.chunk("b", 0, false, b"012345678"), Verdict::Stored);
    assert!(refused(&t.chunk("c", 0, false, b"01")));
    // Finishing one frees its share.
    t.chunk("a", 1, true, b"");
    t.msg("a", 10, "a");
    assert_eq!(t.done().len(), 1);
    assert_eq!(t.chunk("d", 0, false, b"01"), Verdict::Stored);
}

/// Reports `free` bytes free (0: the real figure) to the store.
struct Free(std::sync::atomic::AtomicU64);

impl crate::store::StoreFaults for Free {
    fn free_bytes(&self, real: u64) -> u64 {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => real,
            n => n,
        }
    }
}

#[test]
fn blobs_that_do_not_fit_on_the_disk_are_refused_not_half_written() {
    use crate::store::DISK_RESERVE;
    use std::sync::atomic::Ordering;
    let mut t = setup(1 << 20);
    let free = Arc::new(Free(Default::default()));
    t.store.set_faults(Some(free.clone()));
    // Room for 4 more bytes: a chunk of 3 is written, the next of 3 is refused and the
    // partial file deleted.
    free.0.store(DISK_RESERVE + 4, Ordering::Relaxed);
    assert_eq!(t.chunk("r1", 0, false, b"abc"), Verdict::Stored);
    assert!(t.partial("r1").exists());
    free.0.store(DISK_RESERVE + 2, Ordering::Relaxed);
    let v = t.chunk("r1", 1, true, b"def");
    let Verdict::Refuse { detail, .. } = &v else {
        panic!("{v:?}")
    };
    assert!(detail.contains("disk is full"), "{detail}");
    assert!(!detail.contains('/'), "no local path to the peer: {detail}");
    assert!(!t.partial("r1").exists());
    assert_eq!(t.state("r1").status, InStatus::Refused);
    // A declared size that does not fit is refused before any data arrives.
    let v = t.msg("r2", 3, "big");
    assert!(refused(&v[0]), "{v:?}");
    assert_eq!(t.state("r2").status, InStatus::Refused);
    // Space freed: a new blob is taken in whole.
    free.0.store(0, Ordering::Relaxed);
    t.chunk("r3", 0, true, b"xyz");
    t.msg("r3", 3, "ok");
    let done = t.done();
    assert_eq!(done.len(), 1);
    assert_eq!(std::fs::read(&done[0].path).unwrap(), b"xyz");
}

/// The fuzzing harnesses' no-durability mode ([`crate::store::StoreFaults::durable`]).
struct NoSync;
impl crate::store::StoreFaults for NoSync {
    fn durable(&self) -> bool {
        false
    }
}

#[test]
fn without_durability_blobs_are_written_and_placed_the_same() {
    let mut t = setup(1 << 20);
    t.store.set_faults(Some(Arc::new(NoSync)));
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(t.chunk("r1", 0, false, &data[..400]), Verdict::Stored);
    assert_eq!(t.chunk("r1", 1, true, &data[400..]), Verdict::Stored);
    assert_eq!(t.msg("r1", 1000, "data.bin"), vec![Verdict::Stored]);
    let done = t.done();
    assert_eq!(done.len(), 1);
    assert_eq!(std::fs::read(&done[0].path).unwrap(), data);
    assert!(!t.partial("r1").exists());
    assert_eq!(t.state("r1").status, InStatus::Complete);
}

/// Chunks of one batch are written, then fsynced and recorded together by `sync`: before
/// it nothing is recorded (a crash replays from the recorded offset), and the per-peer
/// budget already counts what the batch wrote.
#[test]
fn a_batch_of_chunks_is_recorded_only_after_sync() {
    let mut t = setup(8);
    let c0 = t.chunk_line("r1", 0, false, &wire::b64::encode_std(b"abc"));
    let c1 = t.chunk_line("r1", 1, false, &wire::b64::encode_std(b"de"));
    assert_eq!(t.rx.take_chunk(&t.peer, &c0).unwrap(), Verdict::Stored);
    assert_eq!(t.rx.take_chunk(&t.peer, &c1).unwrap(), Verdict::Stored);
    assert!(t.store.blob_in(&t.peer, "r1").unwrap().is_none());
    assert_eq!(std::fs::read(t.partial("r1")).unwrap(), b"abcde");
    // A replay inside the batch is seen as one.
    assert_eq!(t.rx.take_chunk(&t.peer, &c1).unwrap(), Verdict::Replay);
    t.rx.sync().unwrap();
    let st = t.state("r1");
    assert_eq!((st.offset, st.next_n), (5, 2));
    // The limit (8 bytes, budget 16) counts the unsynced bytes of a batch too.
    let c2 = t.chunk_line("r1", 2, false, &wire::b64::encode_std(b"fgh"));
    assert_eq!(t.rx.take_chunk(&t.peer, &c2).unwrap(), Verdict::Stored);
    let c3 = t.chunk_line("r1", 3, false, &wire::b64::encode_std(b"i"));
    assert!(matches!(
        t.rx.take_chunk(&t.peer, &c3).unwrap(),
        Verdict::Refuse { .. }
    ));
    t.rx.sync().unwrap();
    assert_eq!(t.state("r1").status, InStatus::Refused);
    assert!(!t.partial("r1").exists());
}

/// Take `data` as chunk `n` of `r` without syncing.
fn take(t: &mut T, r: &str, n: u64, last: bool, data: &[u8]) -> Verdict {
    let c = t.chunk_line(r, n, last, &wire::b64::encode_std(data));
    t.rx.take_chunk(&t.peer, &c).unwrap()
}

#[test]
fn chunks_taken_while_a_sync_runs_are_recorded_by_the_next_sync_only() {
    let mut t = setup(1 << 20);
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(take(&mut t, "r1", 0, false, &data[..1000]), Verdict::Stored);
    let job = t.rx.begin_sync();
    assert_eq!(job.len(), 1);
    assert!(!t.rx.has_unsynced());
    // The next batch's chunks see the state being synced: n 1 is next, n 0 a replay, n 2
    // a gap would be refused (not tried here: it drops the blob).
    assert_eq!(take(&mut t, "r1", 0, false, &data[..1000]), Verdict::Replay);
    assert_eq!(
        take(&mut t, "r1", 1, false, &data[1000..2000]),
        Verdict::Stored
    );
    assert!(t.rx.has_unsynced());
    assert!(
        t.store.blob_in(&t.peer, "r1").unwrap().is_none(),
        "nothing recorded before the fsync ran"
    );
    job.run().unwrap();
    t.rx.finish_sync().unwrap();
    // Recorded: the synced offset, not the one written after.
    let st = t.state("r1");
    assert_eq!((st.offset, st.next_n), (1000, 1));
    // The pending budget counts each byte once (synced 1000 recorded, 1000 unsynced).
    assert_eq!(t.rx.pending(&t.peer).unwrap(), (1, 2000));
    assert_eq!(take(&mut t, "r1", 2, true, &data[2000..]), Verdict::Stored);
    t.rx.sync().unwrap();
    let st = t.state("r1");
    assert_eq!((st.offset, st.next_n, st.last_seen), (3000, 3, true));
    assert_eq!(t.msg("r1", 3000, "f.bin"), vec![Verdict::Stored]);
    let done = t.done();
    assert_eq!(done.len(), 1);
    assert_eq!(std::fs::read(&done[0].path).unwrap(), data);
    assert_eq!(done[0].sha256, sha_hex(&data));
}

#[test]
fn a_refusal_while_a_sync_runs_is_not_overwritten_by_it() {
    let mut t = setup(1 << 20);
    assert_eq!(take(&mut t, "r1", 0, false, b"abc"), Verdict::Stored);
    let job = t.rx.begin_sync();
    // A gap while chunk 0 is being synced: the blob is refused and its partial dropped.
    assert!(refused(&take(&mut t, "r1", 5, false, b"x")));
    assert!(!t.partial("r1").exists());
    job.run().unwrap();
    t.rx.finish_sync().unwrap();
    assert_eq!(t.state("r1").status, InStatus::Refused);
    assert!(!t.partial("r1").exists());
    // Its later chunks are ignored.
    assert_eq!(take(&mut t, "r1", 1, false, b"d"), Verdict::Stored);
    assert!(!t.rx.has_unsynced());
}

#[test]
fn a_failed_sync_records_nothing_and_the_blob_resumes_from_its_record() {
    let mut t = setup(1 << 20);
    assert_eq!(t.chunk("r1", 0, false, b"abc"), Verdict::Stored);
    assert_eq!(take(&mut t, "r1", 1, false, b"def"), Verdict::Stored);
    let _job = t.rx.begin_sync();
    assert_eq!(take(&mut t, "r1", 2, false, b"ghi"), Verdict::Stored);
    // The fsync failed: nothing is recorded, neither what it held nor what came after.
    t.rx.abort_sync();
    assert!(!t.rx.has_unsynced());
    t.rx.sync().unwrap();
    let st = t.state("r1");
    assert_eq!((st.offset, st.next_n), (3, 1));
    let mut u = BlobReceiver::new(t.store.clone(), t.root.clone(), 1 << 20);
    std::mem::swap(&mut t.rx, &mut u);
    // The peer sends again from chunk 1: written at the recorded offset, the rest cut.
    assert_eq!(t.chunk("r1", 1, true, b"DEF"), Verdict::Stored);
    assert_eq!(std::fs::read(t.partial("r1")).unwrap(), b"abcDEF");
    assert_eq!(t.msg("r1", 6, "g.bin"), vec![Verdict::Stored]);
    let done = t.done();
    assert_eq!(done[0].sha256, sha_hex(b"abcDEF"));
}

#[test]
fn a_chunk_past_the_last_while_its_sync_runs_is_a_replay_as_after_an_inline_sync() {
    let mut t = setup(1 << 20);
    assert_eq!(t.msg("r1", 3, "f.bin"), vec![Verdict::Stored]);
    assert_eq!(take(&mut t, "r1", 0, true, b"abc"), Verdict::Stored);
    let job = t.rx.begin_sync();
    let v = take(&mut t, "r1", 1, false, b"x");
    job.run().unwrap();
    t.rx.finish_sync().unwrap();
    let st = t.state("r1");
    assert_eq!(
        st.status,
        InStatus::Complete,
        "verdict {v:?}; reason {:?}",
        st.reason
    );
}

#[test]
fn a_refusal_by_another_receiver_while_a_sync_runs_stands() {
    let mut t = setup(1 << 20);
    assert_eq!(take(&mut t, "r1", 0, false, b"abc"), Verdict::Stored);
    let job = t.rx.begin_sync();
    // The same peer's other connection (its own receiver on the same store and root).
    let mut other = BlobReceiver::new(t.store.clone(), t.root.clone(), 1 << 20);
    let c = t.chunk_line("r1", 5, false, &wire::b64::encode_std(b"x"));
    assert!(refused(&other.take_chunk(&t.peer, &c).unwrap()));
    assert_eq!(t.state("r1").status, InStatus::Refused);
    job.run().unwrap();
    t.rx.finish_sync().unwrap();
    let st = t.state("r1");
    assert_eq!(
        st.status,
        InStatus::Refused,
        "offset {} recorded, partial exists: {}",
        st.offset,
        t.partial("r1").exists()
    );
}

#[test]
fn a_sync_is_not_recorded_when_another_receiver_cut_the_file_back_meanwhile() {
    let mut t = setup(1 << 20);
    assert_eq!(t.chunk("r1", 0, false, b"abc"), Verdict::Stored);
    assert_eq!(take(&mut t, "r1", 1, false, b"def"), Verdict::Stored);
    let job = t.rx.begin_sync();
    // A newer connection of the peer resumes the blob from its record (3 bytes): its
    // receiver cuts the partial file back to that offset and writes from there.
    let mut other = BlobReceiver::new(t.store.clone(), t.root.clone(), 1 << 20);
    let c = t.chunk_line("r1", 1, false, &wire::b64::encode_std(b"d"));
    assert_eq!(other.take_chunk(&t.peer, &c).unwrap(), Verdict::Stored);
    job.run().unwrap();
    t.rx.finish_sync().unwrap();
    // 6 bytes are not on disk any more: the record stays at 3 (the other receiver's
    // sync records its own 4).
    assert_eq!(t.state("r1").offset, 3);
    other.sync().unwrap();
    assert_eq!(t.state("r1").offset, 4);
    assert_eq!(std::fs::read(t.partial("r1")).unwrap(), b"abcd");
}
