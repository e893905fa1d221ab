//! Tests of the dedup index (`received.rs`).

use super::*;
use crate::identity::Identity;
use crate::store::Received;
use crate::wire::{Line, Msg, Part, TextPart};

fn key(n: u32) -> PeerKey {
    let mut seed = [0u8; 32];
    seed[..4].copy_from_slice(&n.to_be_bytes());
    Identity::from_seed(&seed).key()
}

/// A ULID-shaped id (26 bytes) that sorts by `n`.
fn uid(n: u32) -> String {
    format!("01J{n:023}")
}

fn in_msg(id: &str) -> (Line, Vec<u8>) {
    let l = Line::Msg(Msg {
        id: id.into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        th: "T".into(),
        re: None,
        subject: None,
        parts: vec![Part::Text(TextPart { text: "hi".into() })],
    });
    let raw = l.encode();
    (l, raw)
}

/// Receive the msgs `ids` from `p` in one batch.
fn receive(s: &Store, p: &PeerKey, ids: &[String]) -> Vec<Received> {
    let lines: Vec<(Line, Vec<u8>)> = ids.iter().map(|i| in_msg(i)).collect();
    let refs: Vec<(&Line, &[u8])> = lines.iter().map(|(l, r)| (l, r.as_slice())).collect();
    s.receive_batch(p, &refs).unwrap()
}

/// Whether the one msg `id` from `p` is stored as new.
fn is_new(s: &Store, p: &PeerKey, id: String) -> bool {
    matches!(receive(s, p, &[id])[..], [Received::New(_)])
}

/// Whether every msg of `ids` from `p`, received in one batch, is a duplicate.
fn all_duplicates(s: &Store, p: &PeerKey, ids: &[String]) -> bool {
    receive(s, p, ids).iter().all(|r| *r == Received::Duplicate)
}

/// Entries of tree `t` (its length).
fn count(s: &Store, t: T) -> usize {
    s.trees.t(t).iter().count()
}

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    (dir, s)
}

#[test]
fn runs_are_split_at_the_record_cap_and_hold_every_entry() {
    let ids: Vec<String> = (0..300).map(|n| uid(2 * n)).collect();
    let entries: Vec<(&[u8], u64)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_bytes(), 1000 + i as u64))
        .collect();
    let runs = encode_runs(&entries);
    // 36 bytes per entry: 113 to a record.
    assert_eq!(runs.len(), 3);
    let mut at = 0;
    for (first, rec) in &runs {
        assert!(rec.len() <= RUN_BYTES_MAX, "{}", rec.len());
        assert_eq!(*first, entries[at].0, "keyed by its first id");
        for e in run_entries(rec) {
            let (id, seq) = e.unwrap();
            assert_eq!((id, seq), entries[at]);
            at += 1;
        }
        assert_eq!(run_last(rec).unwrap(), entries[at - 1].0);
    }
    assert_eq!(at, entries.len());
    let (_, rec) = &runs[1];
    assert_eq!(run_find(rec, entries[200].0).unwrap(), Some(1200));
    // Ids between two entries, before the first and after the last are not in it.
    for n in [401, 2 * 113 - 2, 2 * 226 + 1] {
        assert_eq!(run_find(rec, uid(n).as_bytes()).unwrap(), None, "{n}");
    }
    // The longest id fits a record of its own.
    let long = vec![b'z'; crate::wire::parse::MAX_ID_LEN];
    let runs = encode_runs(&[(&long[..], 7)]);
    assert_eq!(runs.len(), 1);
    assert_eq!(run_find(&runs[0].1, &long).unwrap(), Some(7));
}

#[test]
fn a_run_record_that_does_not_decode_is_refused() {
    let entry = |id: &[u8], seq: u64| {
        let mut v = (id.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(id);
        v.extend_from_slice(&seq.to_be_bytes());
        v
    };
    let good = entry(b"01A", 1);
    let long = vec![b'a'; crate::wire::parse::MAX_ID_LEN + 1];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "empty run record"),
        ([good.clone(), vec![0]].concat(), "truncated length word"),
        (entry(b"", 1), "id of 0 bytes"),
        (entry(&long, 1), "id of 257 bytes"),
        (good[..4].to_vec(), "truncated id"),
        (good[..good.len() - 1].to_vec(), "truncated seq"),
        (
            [good.clone(), entry(b"01A", 2)].concat(),
            "ids not increasing",
        ),
        (
            [good.clone(), entry(b"00Z", 2)].concat(),
            "ids not increasing",
        ),
    ];
    for (rec, why) in cases {
        // Looked up past the damage, so the whole record is read.
        match run_find(&rec, b"zz") {
            Err(StoreError::Corrupt { tree, detail }) => {
                assert_eq!(tree, RUNS);
                assert_eq!(detail, why, "{rec:?}");
            }
            other => panic!("{why}: {other:?}"),
        }
        assert!(run_last(&rec).is_err(), "{why}");
    }
    assert_eq!(run_find(&good, b"01A").unwrap(), Some(1));
}

#[test]
fn a_batch_of_new_lines_is_indexed_in_a_few_runs_and_replays_are_duplicates() {
    let (_d, s) = open();
    let p = key(1);
    let ids: Vec<String> = (0..300).map(|n| uid(10 + 2 * n)).collect();
    let got = receive(&s, &p, &ids);
    assert!(got.iter().all(|r| matches!(r, Received::New(_))), "{got:?}");
    assert_eq!(count(&s, T::ReceivedRuns), 3);
    assert_eq!(count(&s, T::Received), 0, "no single entry");
    // Each replayed line is found in its run, alone or in a batch.
    let again = receive(&s, &p, &ids);
    assert!(again.iter().all(|r| *r == Received::Duplicate), "{again:?}");
    for i in [0, 112, 113, 150, 299] {
        assert_eq!(receive(&s, &p, &ids[i..=i]), vec![Received::Duplicate]);
        let raw = in_msg(&ids[i]).1;
        assert_eq!(s.received_line(&p, &ids[i]).unwrap(), Some(raw));
    }
    // Another peer's identical ids are its own.
    let q = key(2);
    let got = receive(&s, &q, &ids[..5]);
    assert!(got.iter().all(|r| matches!(r, Received::New(_))), "{got:?}");
    assert_eq!(s.received_line(&q, &ids[200]).unwrap(), None);
}

#[test]
fn a_line_below_the_bound_gets_a_single_entry_and_everything_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    let run: Vec<String> = (0..20).map(|n| uid(100 + 2 * n)).collect();
    {
        let s = Store::open(dir.path()).unwrap();
        receive(&s, &p, &run);
        // Inside the run's span, before it, after it (then below the new bound): new
        // lines the run must not claim.
        let late = vec![uid(105), uid(50), uid(500), uid(499)];
        for id in &late {
            assert!(is_new(&s, &p, id.clone()), "{id}");
        }
        assert_eq!(count(&s, T::Received), 3, "105, 50 and 499 are single");
        assert_eq!(count(&s, T::ReceivedRuns), 2, "the first run and 500's");
        for id in run.iter().chain(&late) {
            assert!(all_duplicates(&s, &p, std::slice::from_ref(id)), "{id}");
        }
        s.flush_blocking().unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    let mut idx = DedupIndex::default();
    assert_eq!(idx.bound(&s.trees, &p).unwrap(), Some(uid(500).as_bytes()));
    let all: Vec<String> = run
        .iter()
        .cloned()
        .chain([uid(105), uid(50), uid(499)])
        .collect();
    assert!(all_duplicates(&s, &p, &all));
    assert!(is_new(&s, &p, uid(501)));
    assert!(is_new(&s, &p, uid(107)));
}

#[test]
fn the_single_entries_of_a_format_2_store_still_count() {
    let (_d, s) = open();
    let p = key(1);
    // What a format-2 build stored: one entry per line in `received`.
    for (i, n) in [10u32, 12, 14].iter().enumerate() {
        s.trees
            .raw(T::Received)
            .insert(pkey(&p, uid(*n).as_bytes()), &(i as u64 + 1).to_be_bytes())
            .unwrap();
    }
    let old: Vec<String> = [10, 12, 14].iter().map(|n| uid(*n)).collect();
    assert!(all_duplicates(&s, &p, &old));
    // A new line above them starts the first run.
    assert!(is_new(&s, &p, uid(16)));
    assert!(is_new(&s, &p, uid(11)));
    assert_eq!((count(&s, T::Received), count(&s, T::ReceivedRuns)), (4, 1));
}

#[test]
fn an_id_a_run_cannot_hold_is_a_single_entry() {
    let dir = tempfile::tempdir().unwrap();
    let p = key(1);
    // Over the wire's cap: only a caller inside the process can store it.
    let long = format!("{}{}", uid(9), "x".repeat(crate::wire::parse::MAX_ID_LEN));
    {
        let s = Store::open(dir.path()).unwrap();
        receive(&s, &p, &[uid(1)]);
        assert!(is_new(&s, &p, long.clone()));
        assert_eq!((count(&s, T::Received), count(&s, T::ReceivedRuns)), (1, 1));
        assert!(all_duplicates(&s, &p, std::slice::from_ref(&long)));
        s.flush_blocking().unwrap();
    }
    // The bound is reloaded from it, and the peer's next lines are stored as ever.
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(
        receive(&s, &p, &[long, uid(1)]),
        vec![Received::Duplicate; 2]
    );
    assert!(is_new(&s, &p, uid(10)));
    assert_eq!(receive(&s, &p, &[uid(10)]), vec![Received::Duplicate]);
}

#[test]
fn a_lookup_inside_the_cached_run_still_finds_single_entries_and_misses() {
    let (_d, s) = open();
    let (p, q) = (key(1), key(2));
    let run: Vec<String> = (0..20).map(|n| uid(100 + 2 * n)).collect();
    receive(&s, &p, &run);
    receive(&s, &q, &run);
    assert!(
        is_new(&s, &p, uid(105)),
        "a single entry inside the run's span"
    );
    let (single, runs) = (s.trees.t(T::Received), s.trees.t(T::ReceivedRuns));
    let mut cache = RunCache::default();
    let look = |cache: &mut RunCache, peer: &PeerKey, n: u32| {
        received_seq_cached(single, runs, peer, uid(n).as_bytes(), cache).unwrap()
    };
    let first = look(&mut cache, &p, 100).expect("in the run");
    assert!(cache.spanning(&p, uid(120).as_bytes()).is_some());
    assert_eq!(
        look(&mut cache, &p, 102),
        Some(first + 1),
        "from the cached run"
    );
    assert!(
        look(&mut cache, &p, 105).is_some(),
        "the single entry, inside the span"
    );
    assert_eq!(
        look(&mut cache, &p, 107),
        None,
        "inside the span, in neither form"
    );
    // Another peer's lookup of the same id is not answered from p's run.
    assert!(cache.spanning(&q, uid(102).as_bytes()).is_none());
    assert!(look(&mut cache, &q, 102).is_some());
    assert_eq!(look(&mut cache, &q, 105), None);
    assert_eq!(look(&mut cache, &p, 99), None, "below the span");
    assert_eq!(
        look(&mut cache, &p, 139),
        None,
        "past its last id, past every run"
    );
    assert!(look(&mut cache, &p, 138).is_some());
}

#[test]
fn the_nearest_run_of_another_peer_is_not_searched() {
    let (_d, s) = open();
    let (a, b) = (key(1), key(2));
    let (low, high) = if a.as_bytes() < b.as_bytes() {
        (a, b)
    } else {
        (b, a)
    };
    // `low`'s run is the nearest key at or below any key of `high`.
    receive(&s, &low, &[uid(1), uid(2)]);
    let single = s.trees.t(T::Received);
    let runs = s.trees.t(T::ReceivedRuns);
    assert_eq!(
        received_seq(single, runs, &high, uid(2).as_bytes()).unwrap(),
        None
    );
    assert!(received_seq(single, runs, &low, uid(2).as_bytes())
        .unwrap()
        .is_some());
}

#[test]
fn dedup_bound_is_the_largest_stored_id_and_survives_eviction() {
    let (_d, s) = open();
    let (p, q) = (key(1), key(2));
    for id in ["01B", "01A", "01C"] {
        s.trees
            .raw(T::Received)
            .insert(pkey(&p, id.as_bytes()), &[0u8; 8])
            .unwrap();
    }
    // q's key range sorts after p's or before: the reverse seek must stay inside p's
    // prefix in both trees.
    s.trees
        .raw(T::Received)
        .insert(pkey(&q, b"01Z"), &[0u8; 8])
        .unwrap();
    for (first, rec) in encode_runs(&[(b"01Y", 1), (b"01Z", 2)]) {
        s.trees
            .raw(T::ReceivedRuns)
            .insert(pkey(&q, first), rec)
            .unwrap();
    }
    let mut idx = DedupIndex::default();
    assert_eq!(idx.bound(&s.trees, &p).unwrap(), Some(&b"01C"[..]));
    assert_eq!(idx.bound(&s.trees, &key(3)).unwrap(), None);
    idx.raise(&p, b"01B");
    assert_eq!(
        idx.bound(&s.trees, &p).unwrap(),
        Some(&b"01C"[..]),
        "never lowered"
    );
    idx.raise(&p, b"01D");
    assert_eq!(idx.bound(&s.trees, &p).unwrap(), Some(&b"01D"[..]));
    // A run above the single entries: the bound is its last id, not its key.
    for (first, rec) in encode_runs(&[(b"01E", 3), (b"01F", 4)]) {
        s.trees
            .raw(T::ReceivedRuns)
            .insert(pkey(&p, first), rec)
            .unwrap();
    }
    assert_eq!(
        DedupIndex::default().bound(&s.trees, &p).unwrap(),
        Some(&b"01F"[..])
    );
    // More peers than the index keeps: p's entry is dropped at some point and reloaded
    // from disk (01F: the raise to 01D was never committed), never forgotten as empty.
    for n in 10..10 + DEDUP_PEERS as u32 + 2 {
        idx.raise(&key(n), b"01A");
    }
    assert!(idx.max.len() <= DEDUP_PEERS);
    let b = idx.bound(&s.trees, &p).unwrap().unwrap().to_vec();
    assert!(b == b"01F" || b == b"01D", "{b:?}");
    assert!(idx.max.len() <= DEDUP_PEERS);
}

/// A small xorshift generator: the model test below is the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
    /// 1 to 5 bytes over four letters: many ids are prefixes of others.
    fn id(&mut self) -> String {
        let len = 1 + self.below(5) as usize;
        (0..len).map(|_| self.letter()).collect()
    }
    fn letter(&mut self) -> char {
        b"01AB"[self.below(4) as usize] as char
    }
}

fn msg_in(id: &str, th: &str) -> (Line, Vec<u8>) {
    let (mut l, _) = in_msg(id);
    if let Line::Msg(m) = &mut l {
        m.th = th.into();
    }
    let raw = l.encode();
    (l, raw)
}

/// Batches from four peers against a set model of what each sent: ids at random (in
/// and out of order), replays of stored ids, increasing ids (the runs' case), a
/// thread cap that refuses some lines, commits that fail partway, reopens and
/// forgotten bounds. Every result and every lookup is the model's.
#[test]
fn the_dedup_index_answers_as_a_set_of_what_each_peer_sent() {
    use std::collections::{BTreeSet, HashMap, HashSet};
    const THREADS: u64 = 6;
    for seed in 1..=12u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.set_max_threads_per_peer(THREADS);
        let mut r = Rng(seed * 7919 + 1);
        let peers: Vec<PeerKey> = (0..4).map(key).collect();
        let mut sent: HashMap<PeerKey, BTreeSet<String>> = HashMap::new();
        let mut threads: HashMap<PeerKey, HashSet<String>> = HashMap::new();
        for round in 0..200 {
            let p = peers[r.below(4) as usize];
            let have = sent.entry(p).or_default().clone();
            let mode = r.below(4);
            let mut ids: Vec<String> = Vec::new();
            for _ in 0..1 + r.below(40) {
                let id = match mode {
                    0 => r.id(),
                    1 if !have.is_empty() => {
                        let at = r.below(have.len() as u64) as usize;
                        have.iter().nth(at).cloned().unwrap_or_default()
                    }
                    _ => {
                        // Above the last one: the last id with a letter or more added.
                        let base = ids.last().or(have.last()).cloned().unwrap_or_default();
                        let mut x = base.clone();
                        x.push(r.letter());
                        if r.below(3) == 0 {
                            x = format!("{base}{}", r.id());
                        }
                        if x.len() > 60 {
                            x = r.id();
                        }
                        x
                    }
                };
                ids.push(id);
            }
            let ths: Vec<String> = ids.iter().map(|_| format!("t{}", r.below(8))).collect();
            let lines: Vec<(Line, Vec<u8>)> =
                ids.iter().zip(&ths).map(|(i, t)| msg_in(i, t)).collect();
            let refs: Vec<(&Line, &[u8])> = lines.iter().map(|(l, r)| (l, r.as_slice())).collect();
            let fail = r.below(10) == 0;
            if fail {
                crate::store::tx::hooks::set_fail_at(Some(1 + r.below(5) as usize));
            }
            let got = s.receive_batch(&p, &refs);
            crate::store::tx::hooks::set_fail_at(None);
            // The model: None a duplicate, Some(true) new, Some(false) refused.
            let mut now = have.clone();
            let mut now_ths = threads.get(&p).cloned().unwrap_or_default();
            let mut want = Vec::new();
            for (id, th) in ids.iter().zip(&ths) {
                if now.contains(id) {
                    want.push(None);
                } else if !now_ths.contains(th) && now_ths.len() as u64 >= THREADS {
                    want.push(Some(false));
                } else {
                    now_ths.insert(th.clone());
                    now.insert(id.clone());
                    want.push(Some(true));
                }
            }
            let ctx = format!("seed {seed} round {round} ids {ids:?}");
            match got {
                Err(e) => assert!(fail, "{ctx}: {e}"),
                Ok(got) => {
                    let got: Vec<Option<bool>> = got
                        .iter()
                        .map(|x| match x {
                            Received::Duplicate => None,
                            Received::New(_) => Some(true),
                            Received::TooManyThreads => Some(false),
                        })
                        .collect();
                    assert_eq!(got, want, "{ctx}");
                    sent.insert(p, now);
                    threads.insert(p, now_ths);
                }
            }
            match r.below(30) {
                0 => {
                    s.flush_blocking().unwrap();
                    drop(s);
                    s = Store::open(dir.path()).unwrap();
                    s.set_max_threads_per_peer(THREADS);
                }
                1 => s.writer().forget_dedup_bounds(),
                _ => {}
            }
            if round % 25 == 0 {
                let (single, runs) = (s.trees.t(T::Received), s.trees.t(T::ReceivedRuns));
                for q in &peers {
                    let model = sent.get(q).cloned().unwrap_or_default();
                    for _ in 0..50 {
                        let id = r.id();
                        let found = received_seq(single, runs, q, id.as_bytes()).unwrap();
                        assert_eq!(found.is_some(), model.contains(&id), "{ctx}: {id}");
                    }
                    for id in &model {
                        let found = received_seq(single, runs, q, id.as_bytes()).unwrap();
                        assert!(found.is_some(), "{ctx}: {id}");
                    }
                }
            }
        }
        assert!(
            count(&s, T::ReceivedRuns) > 16,
            "runs span more than one leaf"
        );
    }
}

/// A commit with run and single entries cut after each of its writes (as a crash
/// would) and the crash image reopened: what was flushed before is still a duplicate,
/// what the cut commit held is new again, then a duplicate once stored.
#[test]
fn a_cut_commit_of_runs_and_single_entries_rolls_back_whole() {
    use crate::store::tx::hooks;
    for k in 1..40usize {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("db");
        let image = d.path().join("crashed").join("db");
        let p = key(1);
        let s = Store::open(&dir).unwrap();
        let first: Vec<String> = (0..150).map(|n| uid(10 + 2 * n)).collect();
        receive(&s, &p, &first);
        let low: Vec<String> = (0..5).map(|n| uid(11 + 2 * n)).collect();
        receive(&s, &p, &low);
        s.flush_blocking().unwrap();
        // 150 lines above the bound (two runs) and 5 below it (single entries).
        let second: Vec<String> = (0..150)
            .map(|n| uid(1000 + 2 * n))
            .chain((0..5).map(|n| uid(21 + 2 * n)))
            .collect();
        hooks::set_after_write(Some(Box::new(move |n| n < k)));
        let lines: Vec<(Line, Vec<u8>)> = second.iter().map(|i| in_msg(i)).collect();
        let refs: Vec<(&Line, &[u8])> = lines.iter().map(|(l, r)| (l, r.as_slice())).collect();
        let cut = s.receive_batch(&p, &refs).is_err();
        hooks::set_after_write(None);
        // The commit holds far more than 39 writes: every k cuts it.
        assert!(cut, "k {k}: the commit was not cut");
        s.db.flush().unwrap();
        crate::store::journal::tests::copy_dir(&dir, &image);
        drop(s);
        let s = Store::open(&image).unwrap();
        let before: Vec<String> = first.iter().chain(&low).cloned().collect();
        let got = receive(&s, &p, &before);
        assert!(
            got.iter().all(|r| *r == Received::Duplicate),
            "k {k}: {got:?}"
        );
        let got = receive(&s, &p, &second);
        assert!(
            got.iter().all(|r| matches!(r, Received::New(_))),
            "k {k}: {got:?}"
        );
        let got = receive(&s, &p, &second);
        assert!(
            got.iter().all(|r| *r == Received::Duplicate),
            "k {k}: {got:?}"
        );
    }
}
