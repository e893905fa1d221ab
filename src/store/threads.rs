//! Threads keyed by (peer, th): a thread id is chosen by whoever opens the thread, so two
//! peers can use the same `th` and each has its own thread with us (protocol-notes
//! §Threads: dedup and `seen` are per peer, and so is everything else about a thread).
//!
//! Key of the `threads` tree: `th` bytes ‖ peer (32 raw bytes). `th` first, so every
//! peer's thread of one id is found with one prefix scan ([`Store::threads_named`]) and
//! the listing stays in thread-id order.
//!
//! Stores written before this layout keyed the tree by `th` alone (one record per id; a
//! second peer's lines in that id were logged but had no thread). [`Store::open`] re-keys
//! such a store once, in one transaction that also records the layout in meta
//! ([`META_THREADS_KEYED`]) and rebuilds, from the log, the threads that had no record.

use super::codec::{dec, enc, hex, peer_from_slice, unpack, LogRec, ThreadRec};
use super::imp::page_after;
use super::tx::{db_err, Tx, T};
use super::{Dir, LogEntry, Store, StoreError, ThreadInfo};
use crate::wire::PeerKey;
use serde_json::Value;

/// Meta key present once the `threads` tree is keyed by `th ‖ peer` (and the per-peer
/// thread counts below are kept).
pub(super) const META_THREADS_KEYED: &[u8] = b"threads_keyed";
/// Meta keys `thread_n/` ‖ peer (32 raw bytes) → number of threads with the peer (u64 BE).
const META_THREAD_N: &[u8] = b"thread_n/";

/// Threads one peer may open with us, by default (issue 8 §4: every per-peer table has a
/// bound). A line that would open one more is not stored and not acked; the session
/// answers `err busy` naming the bound. Threads we open are not refused.
pub const MAX_THREADS_PER_PEER: u64 = 10_000;

/// Meta keys `seen_n/` ‖ peer → number of `seen` entries of the peer (u64 BE).
const META_SEEN_N: &[u8] = b"seen_n/";

fn count_key(peer: &PeerKey) -> Vec<u8> {
    let mut k = META_THREAD_N.to_vec();
    k.extend_from_slice(peer.as_bytes());
    k
}

fn seen_count_key(peer: &PeerKey) -> Vec<u8> {
    let mut k = META_SEEN_N.to_vec();
    k.extend_from_slice(peer.as_bytes());
    k
}

/// Raise `seen[peer][th]` to `id` (byte order) in the write set. A new entry is counted;
/// when `bounded` and the peer has [`SEEN_PER_THREAD_BOUND`] × its thread bound entries
/// already, no new entry is made (a threaded chunk of a thread that never opened: the
/// sender then replays it after a reconnect, and the receiver ignores the replay).
/// Returns whether seen was raised.
pub(super) fn raise_seen(
    tx: &mut Tx<'_>,
    peer: &PeerKey,
    th: &str,
    id: &str,
    bound: Option<u64>,
) -> Result<bool, StoreError> {
    let skey = super::codec::pkey(peer, th.as_bytes());
    match tx.get(T::Seen, &skey)? {
        Some(old) if id.as_bytes() <= old.as_slice() => return Ok(false),
        Some(_) => {}
        None => {
            let ck = seen_count_key(peer);
            let n = match tx.get(T::Meta, &ck)? {
                Some(v) => super::codec::read_u64("meta", &v)?,
                None => 0,
            };
            if bound.is_some_and(|b| n >= b.saturating_mul(SEEN_PER_THREAD_BOUND)) {
                return Ok(false);
            }
            tx.put(T::Meta, ck, (n + 1).to_be_bytes().to_vec());
        }
    }
    tx.put(T::Seen, skey, id.as_bytes().to_vec());
    Ok(true)
}

/// `seen` entries of a peer are bounded at this many times its thread bound: entries of
/// its threads, and of thread ids only its blob chunks named.
pub const SEEN_PER_THREAD_BOUND: u64 = 2;

/// Drop the count of `peer`'s `seen` entries (they were removed).
pub(super) fn clear_seen_count(tx: &mut Tx<'_>, peer: &PeerKey) {
    tx.del(T::Meta, seen_count_key(peer));
}

/// Threads with `peer`, as counted in the write set.
pub(super) fn thread_count(tx: &Tx<'_>, peer: &PeerKey) -> Result<u64, StoreError> {
    match tx.get(T::Meta, &count_key(peer))? {
        Some(v) => super::codec::read_u64("meta", &v),
        None => Ok(0),
    }
}

/// Add `delta` to the count of threads with `peer` (removed at zero).
pub(super) fn add_threads(tx: &mut Tx<'_>, peer: &PeerKey, delta: i64) -> Result<(), StoreError> {
    let n = (thread_count(tx, peer)? as i64)
        .saturating_add(delta)
        .max(0) as u64;
    if n == 0 {
        tx.del(T::Meta, count_key(peer));
    } else {
        tx.put(T::Meta, count_key(peer), n.to_be_bytes().to_vec());
    }
    Ok(())
}

/// Key of a thread record: `th ‖ peer`.
pub(super) fn tkey(th: &str, peer: &PeerKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(th.len() + 32);
    k.extend_from_slice(th.as_bytes());
    k.extend_from_slice(peer.as_bytes());
    k
}

/// (th, peer) of a thread key.
fn split_tkey(k: &[u8]) -> Result<(String, PeerKey), StoreError> {
    let Some(cut) = k.len().checked_sub(32) else {
        return Err(super::codec::corrupt(
            "threads",
            "key shorter than a peer key",
        ));
    };
    let th = super::codec::utf8("threads", &k[..cut])?;
    Ok((th, peer_from_slice("threads", &k[cut..])?))
}

fn info(k: &[u8], v: &[u8]) -> Result<ThreadInfo, StoreError> {
    let (th, peer) = split_tkey(k)?;
    let t: ThreadRec = dec("threads", v)?;
    if t.peer != hex(peer.as_bytes()) {
        return Err(super::codec::corrupt(
            "threads",
            format!("thread {th:?}: key and record name different peers"),
        ));
    }
    Ok(ThreadInfo {
        th,
        peer,
        subject: t.subject,
        mine: t.mine,
        my_note: t.my_note,
        theirs: t.theirs,
        their_note: t.their_note,
        since_ms: t.since,
        updated_ms: t.updated,
        unread: t.unread,
        opened_by_us: t.ours,
    })
}

impl Store {
    /// Threads one peer may open with us from now on (default [`MAX_THREADS_PER_PEER`]).
    pub fn set_max_threads_per_peer(&self, n: u64) {
        self.max_threads
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The bound of [`Store::set_max_threads_per_peer`].
    pub fn max_threads_per_peer(&self) -> u64 {
        self.max_threads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of `seen` entries of `peer` (counted since threads were keyed by peer).
    pub fn seen_entries(&self, peer: &PeerKey) -> Result<u64, StoreError> {
        match Tx::new(&self.trees).get(T::Meta, &seen_count_key(peer))? {
            Some(v) => super::codec::read_u64("meta", &v),
            None => Ok(0),
        }
    }

    /// Number of threads with `peer` (ours and theirs).
    pub fn threads_with(&self, peer: &PeerKey) -> Result<u64, StoreError> {
        thread_count(&Tx::new(&self.trees), peer)
    }

    /// All threads, most recently updated first (ties by thread id, then peer key).
    pub fn threads(&self) -> Result<Vec<ThreadInfo>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::Threads).iter() {
            let (k, v) = kv.map_err(db_err)?;
            out.push(info(&k, &v)?);
        }
        out.sort_by(|a, b| {
            b.updated_ms
                .cmp(&a.updated_ms)
                .then(a.th.cmp(&b.th))
                .then(a.peer.cmp(&b.peer))
        });
        Ok(out)
    }

    /// Up to `limit` threads after the thread `after` = (th, peer) (from the first when
    /// None), in (thread id, peer key) byte order: one page of the `threads` listing, read
    /// without loading the others.
    pub fn threads_after(
        &self,
        after: Option<(&str, &PeerKey)>,
        limit: usize,
    ) -> Result<Vec<ThreadInfo>, StoreError> {
        let after = after.map(|(th, p)| tkey(th, p));
        page_after(self.trees.t(T::Threads), after.as_deref(), limit, info)
    }

    /// The thread `th` with `peer`.
    pub fn thread_with(&self, peer: &PeerKey, th: &str) -> Result<Option<ThreadInfo>, StoreError> {
        let k = tkey(th, peer);
        match self.trees.t(T::Threads).get(&k).map_err(db_err)? {
            Some(v) => Ok(Some(info(&k, &v)?)),
            None => Ok(None),
        }
    }

    /// Every thread whose id is `th` (one per peer that uses it), in peer key order.
    pub fn threads_named(&self, th: &str) -> Result<Vec<ThreadInfo>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::Threads).scan_prefix(th.as_bytes()) {
            let (k, v) = kv.map_err(db_err)?;
            if k.len() < 32 {
                return Err(super::codec::corrupt(
                    "threads",
                    "key shorter than a peer key",
                ));
            }
            // The prefix also matches longer ids ("a" matches "ab" ‖ peer).
            if k.len() == th.len() + 32 {
                out.push(info(&k, &v)?);
            }
        }
        Ok(out)
    }

    /// The thread `th` when exactly one peer uses that id; `None` when none or several do
    /// (then see [`Store::threads_named`] and [`Store::thread_with`]).
    pub fn thread(&self, th: &str) -> Result<Option<ThreadInfo>, StoreError> {
        let mut all = self.threads_named(th)?;
        Ok(if all.len() == 1 { all.pop() } else { None })
    }

    /// Log entries of the thread `th` with `peer` with seq > `after` (only unread inbound
    /// ones when `unread_only`), in seq order, at most `limit`. Scans the log from `after`.
    pub fn thread_log(
        &self,
        after: u64,
        peer: &PeerKey,
        th: &str,
        unread_only: bool,
        limit: usize,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let mut out = Vec::new();
        let mut after = after;
        // Other threads' entries are skipped; read in batches until `limit` are found.
        loop {
            let batch = self.log(after, Some(th), unread_only, 1024)?;
            let Some(last) = batch.last().map(|e| e.seq) else {
                return Ok(out);
            };
            for e in batch {
                if e.peer == *peer {
                    out.push(e);
                    if out.len() >= limit {
                        return Ok(out);
                    }
                }
            }
            after = last;
        }
    }

    /// Re-key a `threads` tree written before threads were keyed by peer (key = `th`) and
    /// rebuild, from the log, the threads of peers that used an id another peer had
    /// already; record the layout. One transaction; nothing to do when already done.
    /// Records that do not decode are left where they are (reading them reports them).
    pub(super) fn key_threads_by_peer(&self) -> Result<(), StoreError> {
        let meta = self.trees.t(T::Meta);
        if meta.get(META_THREADS_KEYED).map_err(db_err)?.is_some() {
            return Ok(());
        }
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        // The counts are made anew from the records.
        for prefix in [META_THREAD_N, META_SEEN_N] {
            for k in meta.scan_prefix(prefix).keys() {
                tx.del(T::Meta, k.map_err(db_err)?.to_vec());
            }
        }
        let mut seen_n: std::collections::BTreeMap<PeerKey, u64> = Default::default();
        for k in self.trees.t(T::Seen).iter().keys() {
            let k = k.map_err(db_err)?;
            if let Ok((p, _)) = super::codec::split_pkey("seen", &k) {
                *seen_n.entry(p).or_insert(0) += 1;
            }
        }
        for (p, n) in seen_n {
            tx.put(T::Meta, seen_count_key(&p), n.to_be_bytes().to_vec());
        }
        let mut moved = 0usize;
        for kv in self.trees.t(T::Threads).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let Ok(rec) = dec::<ThreadRec>("threads", &v) else {
                continue;
            };
            let (Ok(th), Ok(peer)) = (
                std::str::from_utf8(&k),
                super::codec::peer_from_hex("threads", &rec.peer),
            ) else {
                continue;
            };
            tx.del(T::Threads, k.to_vec());
            tx.put(T::Threads, tkey(th, &peer), v.to_vec());
            add_threads(&mut tx, &peer, 1)?;
            moved += 1;
        }
        let rebuilt = if moved > 0 {
            self.rebuild_missing_threads(&mut tx)?
        } else {
            0
        };
        tx.put(T::Meta, META_THREADS_KEYED, b"1".to_vec());
        tx.commit()?;
        if moved > 0 {
            tracing::info!(
                moved,
                rebuilt,
                "store: threads now keyed by (peer, thread id)"
            );
        }
        Ok(())
    }

    /// Thread records for (th, peer) pairs of the log that have none (a second peer's
    /// thread under the old layout), rebuilt from their log entries in order. Returns how
    /// many were made.
    fn rebuild_missing_threads(&self, tx: &mut Tx<'_>) -> Result<usize, StoreError> {
        let mut made: std::collections::BTreeMap<Vec<u8>, ThreadRec> = Default::default();
        for kv in self.trees.t(T::Log).iter() {
            let (_, v) = kv.map_err(db_err)?;
            let Ok((l, line)) = unpack::<LogRec>("log", &v) else {
                continue;
            };
            let Some(th) = l.th.as_deref() else {
                continue;
            };
            let Ok(peer) = super::codec::peer_from_hex("log", &l.peer) else {
                continue;
            };
            let key = tkey(th, &peer);
            if !made.contains_key(&key) && tx.get(T::Threads, &key)?.is_some() {
                continue;
            }
            let t = made.entry(key).or_insert_with(|| ThreadRec {
                peer: l.peer.clone(),
                subject: None,
                mine: None,
                my_note: None,
                theirs: None,
                their_note: None,
                since: l.at,
                updated: l.at,
                unread: 0,
                ours: l.dir == Dir::Out,
            });
            t.updated = t.updated.max(l.at);
            if l.dir == Dir::In && !l.read && l.kind != "chunk" {
                t.unread += 1;
            }
            let body: Value = line
                .get("log")
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(Value::Null);
            let text = |f: &str| body.get(f).and_then(Value::as_str).map(str::to_owned);
            match l.kind.as_str() {
                "msg" if t.subject.is_none() => t.subject = text("subject"),
                "state" if l.dir == Dir::In => {
                    t.theirs = text("state");
                    t.their_note = text("note");
                }
                "state" => {
                    t.mine = text("state");
                    t.my_note = text("note");
                }
                _ => {}
            }
        }
        let n = made.len();
        for (k, t) in made {
            if let Ok(peer) = super::codec::peer_from_hex("threads", &t.peer) {
                add_threads(tx, &peer, 1)?;
            }
            tx.put(T::Threads, k, enc(&t)?);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Line, Msg, Part, State, TextPart};

    fn key(n: u8) -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).expect("valid test key")
    }

    fn msg(th: &str, subject: Option<&str>, id: &str) -> Line {
        Line::Msg(Msg {
            id: id.into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: th.into(),
            re: None,
            subject: subject.map(Into::into),
            parts: vec![Part::Text(TextPart { text: "hi".into() })],
        })
    }

    /// sled lets go of its lock a moment after a handle is dropped: retry opens.
    fn retry<R, E: std::fmt::Debug>(mut f: impl FnMut() -> Result<R, E>) -> R {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match f() {
                Err(e)
                    if format!("{e:?}").contains("ock") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                r => return r.expect("open"),
            }
        }
    }

    /// A store of the layout before threads were keyed by peer: `threads` keyed by th, one
    /// record per id (the first peer's), and a second peer's lines in that id logged with
    /// no thread record. It opens, keeps the first thread, and rebuilds the second.
    #[test]
    fn an_old_layout_store_opens_with_both_peers_threads() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (key(1), key(2));
        {
            let s = Store::open(dir.path()).unwrap();
            let b = |id: &str, ts: &str| {
                let mut l = msg("T", Some("ours"), id);
                if let Line::Msg(m) = &mut l {
                    m.ts = ts.into();
                }
                l
            };
            s.enqueue(&first, &[&b]).unwrap();
            for (l, p) in [
                (
                    msg("T", Some("theirs"), "01HZZZZZZZZZZZZZZZZZZZZZZ1"),
                    second,
                ),
                (
                    Line::State(State {
                        id: "01HZZZZZZZZZZZZZZZZZZZZZZ2".into(),
                        ts: "2026-01-01T00:00:00.000Z".into(),
                        th: "T".into(),
                        re: None,
                        state: "working".into(),
                        note: Some("n".into()),
                    }),
                    second,
                ),
                (msg("T", None, "01HZZZZZZZZZZZZZZZZZZZZZZ3"), first),
            ] {
                s.receive(&p, &l, &l.encode()).unwrap();
            }
            s.flush_blocking().unwrap();
        }
        {
            // Rewrite to the old layout.
            let db = retry(|| sled::open(dir.path()));
            let t = db.open_tree("threads").unwrap();
            let first_rec = t.get(tkey("T", &first)).unwrap().unwrap();
            t.clear().unwrap();
            t.insert("T", first_rec).unwrap();
            db.open_tree("meta")
                .unwrap()
                .remove(META_THREADS_KEYED)
                .unwrap();
            db.flush().unwrap();
        }
        let s = retry(|| Store::open(dir.path()));
        let a = s.thread_with(&first, "T").unwrap().expect("first kept");
        assert_eq!(a.subject.as_deref(), Some("ours"));
        assert!(a.opened_by_us);
        assert_eq!(a.unread, 1);
        let b = s
            .thread_with(&second, "T")
            .unwrap()
            .expect("second rebuilt");
        assert_eq!(b.subject.as_deref(), Some("theirs"));
        assert_eq!(b.theirs.as_deref(), Some("working"));
        assert_eq!(b.their_note.as_deref(), Some("n"));
        assert_eq!(b.unread, 2);
        assert!(!b.opened_by_us);
        assert_eq!(s.threads().unwrap().len(), 2);
        // Counted per peer for the bound, and uncounted when a peer is forgotten.
        assert_eq!(s.threads_with(&first).unwrap(), 1);
        assert_eq!(s.threads_with(&second).unwrap(), 1);
        // Reading marks the right thread's count down.
        let seqs: Vec<u64> = s
            .thread_log(0, &second, "T", true, 10)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs.len(), 2);
        s.mark_read(&seqs).unwrap();
        assert_eq!(s.thread_with(&second, "T").unwrap().unwrap().unread, 0);
        assert_eq!(s.thread_with(&first, "T").unwrap().unwrap().unread, 1);
        drop(s);
        // Once keyed, opening again changes nothing.
        let s = retry(|| Store::open(dir.path()));
        assert_eq!(s.threads().unwrap().len(), 2);
        assert_eq!(s.threads_with(&second).unwrap(), 1);
        s.forget_peer(&second).unwrap();
        assert_eq!(s.threads_with(&second).unwrap(), 0);
        assert_eq!(s.threads_with(&first).unwrap(), 1);
        assert_eq!(s.thread("T").unwrap().unwrap().peer, first);
    }

    /// Issue 8 §4: the seen map is a per-peer table; chunks (even refused ones) raise
    /// seen[th] for thread ids that never open a thread, so it has a bound of its own.
    #[test]
    fn chunks_naming_new_thread_ids_cannot_grow_the_seen_map_without_bound() {
        use crate::store::InBlobState;
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.set_max_threads_per_peer(3);
        let (p, q) = (key(1), key(2));
        let l = msg("real", None, "01HZZZZZZZZZZZZZZZZZZZZZZ0");
        s.receive(&p, &l, &l.encode()).unwrap();
        for i in 0..20 {
            let st = InBlobState::new(Some(format!("t{i}")), 0);
            let id = format!("01HZZZZZZZZZZZZZZZZZZZZZ{i:02}");
            s.put_blob_in(&p, &format!("r{i}"), &st, Some((&format!("t{i}"), &id)))
                .unwrap();
        }
        // 2 × the thread bound.
        assert_eq!(s.seen(&p).unwrap().len(), 6);
        assert_eq!(s.seen_entries(&p).unwrap(), 6);
        // Entries that exist still rise; the peer's threads still count; others are free.
        let st = InBlobState::new(Some("real".into()), 0);
        s.put_blob_in(&p, "rr", &st, Some(("real", "01HZZZZZZZZZZZZZZZZZZZZZZZ")))
            .unwrap();
        assert_eq!(s.seen(&p).unwrap()["real"], "01HZZZZZZZZZZZZZZZZZZZZZZZ");
        let l = msg("real2", None, "01HZZZZZZZZZZZZZZZZZZZZZZ1");
        s.receive(&p, &l, &l.encode()).unwrap();
        assert!(s.seen(&p).unwrap().contains_key("real2"));
        s.put_blob_in(&q, "r", &st, Some(("x", "01HZZZZZZZZZZZZZZZZZZZZZZ1")))
            .unwrap();
        assert_eq!(s.seen(&q).unwrap().len(), 1);
        s.forget_peer(&p).unwrap();
        assert_eq!(s.seen_entries(&p).unwrap(), 0);
    }

    #[test]
    fn thread_ids_that_prefix_one_another_stay_apart() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let p = key(1);
        for (th, id) in [
            ("a", "01HZZZZZZZZZZZZZZZZZZZZZZ1"),
            ("ab", "01HZZZZZZZZZZZZZZZZZZZZZZ2"),
        ] {
            let l = msg(th, None, id);
            s.receive(&p, &l, &l.encode()).unwrap();
        }
        assert_eq!(s.threads_named("a").unwrap().len(), 1);
        assert_eq!(s.thread("ab").unwrap().unwrap().th, "ab");
        // Paging one at a time visits each thread once.
        let first = s.threads_after(None, 1).unwrap();
        let rest = s.threads_after(Some((&first[0].th, &p)), 10).unwrap();
        assert_eq!(rest.len(), 1);
        assert_ne!(first[0].th, rest[0].th);
    }
}
