//! The outbox: lines queued for a peer until its ack (protocol-notes §Outbox), with their
//! out log entries, the acks that retire them, and the pages a resume replays.

use super::codec::{
    corrupt, dec, enc, hex, pack, payload_only, pkey, read_u64, split_pkey, u64_be, unpack, utf8,
    LogRec, OutRec, Payload, PeerRec, ThreadRec,
};
use super::imp::{acked_kind, Store, META_LAST_ID, META_LOG_SEQ, META_OUTBOX_B};
use super::threads::{add_threads, tkey};
use super::tx::{db_err, Trees, Tx, T};
use super::{Dir, LineBuilder, OutboxEntry, StoreError};
use crate::wire::ids::IdGen;
use crate::wire::{self, Line, PeerKey};
use std::collections::{BTreeMap, HashMap, HashSet};

impl Store {
    /// Allocate ids and queue `builders`' lines for `peer` in ONE transaction (outbox, out
    /// log, thread subject/my state, last id). Ids strictly increase in call order.
    ///
    /// Each builder gets (id, ts) with ts = now as `YYYY-MM-DDTHH:MM:SS.mmmZ` and must return
    /// a line carrying that id ([`StoreError::BadLine`] otherwise). A line whose encoding is
    /// over [`wire::MAX_LINE`] fails the whole call with [`StoreError::TooLarge`]; nothing is
    /// queued and no id is consumed. Also clears the peer's parked mark (new outbound
    /// traffic, protocol-notes §Liveness). Not durable until [`Store::flush`].
    /// [`StoreError::DiskFull`] (nothing queued) while free space is under the reserve
    /// ([`Store::check_space`]).
    pub fn enqueue(
        &self,
        peer: &PeerKey,
        builders: &[LineBuilder<'_>],
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        self.check_space(0)?;
        let mut w = self.writer();
        let mut ids = w.ids.clone();
        let mut seq = w.log_seq;
        let now = wire::time::now_ms();
        let mut tx = Tx::new(&self.trees);
        let out = self.enqueue_in(&mut tx, &mut ids, &mut seq, now, peer, builders)?;
        if out.is_empty() {
            return Ok(out);
        }
        tx.commit()?;
        w.ids = ids;
        w.log_seq = seq;
        Ok(out)
    }

    /// The body of [`Store::enqueue`] on a caller's write set: allocates ids from `ids`
    /// and log seqs from `seq` (the caller stores both back into the writer after its
    /// commit) and records `last_id` / `log_seq` in meta.
    pub(super) fn enqueue_in(
        &self,
        tx: &mut Tx<'_>,
        ids: &mut IdGen,
        seq: &mut u64,
        now: u64,
        peer: &PeerKey,
        builders: &[LineBuilder<'_>],
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let ts = wire::time::format_ms(now);
        let mut out = Vec::with_capacity(builders.len());
        let mut queued_bytes = 0u64;
        let peer_hex = hex(peer.as_bytes());
        for b in builders {
            let id = ids.next_at(now).to_string();
            let line = b(&id, &ts);
            if line.id() != Some(id.as_str()) {
                return Err(StoreError::BadLine(format!(
                    "builder returned id {:?}, expected {id}",
                    line.id()
                )));
            }
            let bytes = self.sign_if_on(line.kind(), line.encode())?;
            if bytes.len() > wire::MAX_LINE {
                return Err(StoreError::TooLarge {
                    len: bytes.len(),
                    max: wire::MAX_LINE,
                });
            }
            let th = line.th().map(str::to_owned);
            let kind = line.kind().to_owned();
            *seq += 1;
            // Chunk data is kept once: in the outbox (or the source file), not in the log.
            // Every other line is kept once too: in the log, which the outbox points at.
            let logged = super::blobs::log_form(&kind, &bytes);
            let once = kind != "chunk" && matches!(logged, std::borrow::Cow::Borrowed(_));
            let orec = OutRec {
                th: th.clone(),
                kind: kind.clone(),
                seq: *seq,
                log_len: once.then_some(bytes.len() as u64),
            };
            let packed = pack(&orec, if once { &[] } else { &bytes })?;
            queued_bytes += orec.queued_len(packed.len()) as u64;
            tx.put(T::Outbox, pkey(peer, id.as_bytes()), packed);
            let lrec = LogRec {
                dir: Dir::Out,
                peer: peer_hex.clone(),
                id: id.clone(),
                th: th.clone(),
                kind: kind.clone(),
                at: now,
                read: true,
                acked: false,
            };
            tx.put_new(T::Log, u64_be(*seq), pack(&lrec, &logged)?);
            if let Some(th) = &th {
                if tx.get(T::Threads, &tkey(th, peer))?.is_none() {
                    add_threads(tx, peer, 1)?;
                }
                let mut t = self.thread_for_update(tx, th, peer, now, true)?;
                t.updated = t.updated.max(now);
                match &line {
                    Line::Msg(m) if t.subject.is_none() => t.subject = m.subject.clone(),
                    Line::State(s) => {
                        t.mine = Some(s.state.clone());
                        t.my_note = s.note.clone();
                    }
                    _ => {}
                }
                tx.put(T::Threads, tkey(th, peer), enc(&t)?);
            }
            out.push(OutboxEntry {
                id,
                th,
                kind,
                line: bytes,
                seq: *seq,
            });
        }
        if out.is_empty() {
            return Ok(out);
        }
        self.adjust_count(tx, peer, out.len() as i64)?;
        self.adjust_bytes(tx, peer, queued_bytes as i64)?;
        let pk = peer.as_bytes().to_vec();
        if let Some(v) = tx.get(T::Peers, &pk)? {
            let mut p: PeerRec = dec("peers", &v)?;
            if p.parked {
                p.parked = false;
                p.parked_by_us = false;
                tx.put(T::Peers, pk, enc(&p)?);
            }
        }
        if let Some(last) = ids.last() {
            tx.put(T::Meta, META_LAST_ID, last.to_string().into_bytes());
        }
        tx.put(T::Meta, META_LOG_SEQ, u64_be(*seq).to_vec());
        Ok(out)
    }

    /// The thread record to update (existing, or a new one with `peer` at `now`, opened by
    /// us when `ours`).
    pub(super) fn thread_for_update(
        &self,
        tx: &Tx<'_>,
        th: &str,
        peer: &PeerKey,
        now: u64,
        ours: bool,
    ) -> Result<ThreadRec, StoreError> {
        Ok(match tx.get(T::Threads, &tkey(th, peer))? {
            Some(v) => dec("threads", &v)?,
            None => ThreadRec {
                peer: hex(peer.as_bytes()),
                subject: None,
                mine: None,
                my_note: None,
                theirs: None,
                their_note: None,
                since: now,
                updated: now,
                unread: 0,
                ours,
            },
        })
    }

    pub(super) fn adjust_count(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        delta: i64,
    ) -> Result<(), StoreError> {
        adjust_counter(tx, T::OutboxN, "outbox_n", peer, delta)
    }

    /// Add `delta` to the bytes queued for `peer` (the `outbox_b` counter, floored at 0).
    pub(super) fn adjust_bytes(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        delta: i64,
    ) -> Result<(), StoreError> {
        if delta == 0 {
            return Ok(());
        }
        adjust_counter(tx, T::OutboxB, "outbox_b", peer, delta)
    }

    /// What is queued for `peer`: (lines, bytes of their stored records). O(1): both are
    /// counters kept in the transactions that queue and retire lines.
    pub fn outbox_usage(&self, peer: &PeerKey) -> Result<(u64, u64), StoreError> {
        let bytes = match self
            .trees
            .t(T::OutboxB)
            .get(peer.as_bytes())
            .map_err(db_err)?
        {
            Some(v) => read_u64("outbox_b", &v)?,
            None => 0,
        };
        Ok((self.outbox_len(peer)?, bytes))
    }

    /// Rebuild the `outbox_b` counters from the outbox once, for a database written before
    /// they existed (marked done in meta).
    pub(super) fn count_outbox_bytes(&self) -> Result<(), StoreError> {
        let meta = self.trees.t(T::Meta);
        if meta.get(META_OUTBOX_B).map_err(db_err)?.is_some() {
            return Ok(());
        }
        let _w = self.writer();
        let mut per_peer: BTreeMap<PeerKey, i64> = BTreeMap::new();
        for kv in self.trees.t(T::Outbox).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (peer, _) = split_pkey("outbox", &k)?;
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            *per_peer.entry(peer).or_default() += rec.queued_len(v.len()) as i64;
        }
        let mut tx = Tx::new(&self.trees);
        for (peer, n) in per_peer {
            tx.del(T::OutboxB, peer.as_bytes().to_vec());
            self.adjust_bytes(&mut tx, &peer, n)?;
        }
        tx.put(T::Meta, META_OUTBOX_B, b"1".to_vec());
        tx.commit()
    }

    /// Up to `limit` outbox lines for `peer` with id > `after` (all when None), in id order
    /// (which is enqueue order). Fewer than `limit` only when no more are queued.
    ///
    /// Most lines are stored once, in their out log entry, so each record costs a second
    /// read: one range scan of the log when the batch's entries are dense (`LogRun`), a
    /// lookup each otherwise; from `PARALLEL_RESOLVE` records up (a replay's batches) that
    /// work runs on two threads, each over half of the records (a resume after a restart
    /// reads sled's pages from disk, and that was most of a replay's time; issue 10).
    pub fn outbox_after(
        &self,
        peer: &PeerKey,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        use std::ops::Bound;
        let prefix = pkey(peer, b"");
        let mut start = match after {
            Some(a) => Bound::Excluded(pkey(peer, a.as_bytes())),
            None => Bound::Included(prefix.clone()),
        };
        let mut out = Vec::new();
        // A record whose line left the log after the scan read it resolves to nothing (see
        // `outbox_entry`): the scan then goes on after it until `limit` lines are found.
        while out.len() < limit {
            let want = limit - out.len();
            let mut raw: Vec<(sled::IVec, sled::IVec)> = Vec::new();
            for kv in self
                .trees
                .t(T::Outbox)
                .range::<Vec<u8>, _>((start.clone(), Bound::Unbounded))
            {
                if raw.len() >= want {
                    break;
                }
                let (k, v) = kv.map_err(db_err)?;
                if !k.starts_with(&prefix) {
                    break;
                }
                raw.push((k, v));
            }
            let Some((last, _)) = raw.last() else {
                break;
            };
            start = Bound::Excluded(last.to_vec());
            let ended = raw.len() < want;
            out.extend(resolve_outbox(&self.trees, &raw)?);
            if ended {
                break;
            }
        }
        Ok(out)
    }

    /// Whether line `id` is queued for `peer` (in its outbox: not yet acked, pruned or
    /// dropped). One key lookup. Errors: sled's.
    pub fn outbox_has(&self, peer: &PeerKey, id: &str) -> Result<bool, StoreError> {
        self.trees
            .t(T::Outbox)
            .contains_key(pkey(peer, id.as_bytes()))
            .map_err(db_err)
    }

    /// Number of queued lines for `peer` (a counter kept with the outbox; O(1)).
    pub fn outbox_len(&self, peer: &PeerKey) -> Result<u64, StoreError> {
        match self
            .trees
            .t(T::OutboxN)
            .get(peer.as_bytes())
            .map_err(db_err)?
        {
            Some(v) => read_u64("outbox_n", &v),
            None => Ok(0),
        }
    }

    /// Peers with at least one queued line, in raw key order.
    pub fn outbox_peers(&self) -> Result<Vec<PeerKey>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::OutboxN).iter() {
            let (k, _) = kv.map_err(db_err)?;
            out.push(super::codec::peer_from_slice("outbox_n", &k)?);
        }
        Ok(out)
    }

    /// Remove outbox lines (known to be delivered) and mark their out log entries acked.
    /// `lines`: (outbox key, out-log seq, queued length: [`OutRec::queued_len`]).
    pub(super) fn retire(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        lines: &[(Vec<u8>, u64, usize)],
    ) -> Result<(), StoreError> {
        let bytes: usize = lines.iter().map(|l| l.2).sum();
        self.adjust_bytes(tx, peer, -(bytes as i64))?;
        for (key, seq, _) in lines {
            tx.del(T::Outbox, key.clone());
            // The mark, not a rewrite of the entry (which holds the whole line).
            tx.put(T::LogAcked, u64_be(*seq).to_vec(), Vec::new());
        }
        self.adjust_count(tx, peer, -(lines.len() as i64))
    }

    /// On the peer's resume: drop lines with id <= `seen[th]` for each listed thread (ids
    /// compared as byte strings) and mark their out log entries acked. Threads not listed are
    /// untouched. Returns how many were dropped. One transaction.
    pub fn drop_seen(
        &self,
        peer: &PeerKey,
        seen: &BTreeMap<String, String>,
    ) -> Result<usize, StoreError> {
        let Some(max) = seen.values().max() else {
            return Ok(0);
        };
        let _w = self.writer();
        let prefix = pkey(peer, b"");
        let end = pkey(peer, max.as_bytes());
        let mut drop = Vec::new();
        for kv in self.trees.t(T::Outbox).range(prefix.clone()..=end) {
            let (k, v) = kv.map_err(db_err)?;
            let id = &k[32..];
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            let Some(th) = &rec.th else { continue };
            if let Some(s) = seen.get(th) {
                if id <= s.as_bytes() {
                    drop.push((k.to_vec(), rec.seq, rec.queued_len(v.len())));
                }
            }
        }
        if drop.is_empty() {
            return Ok(0);
        }
        let mut tx = Tx::new(&self.trees);
        self.retire(&mut tx, peer, &drop)?;
        tx.commit()?;
        Ok(drop.len())
    }

    /// An ack from `peer` for `re`: remove it from the outbox, mark the out log entry acked,
    /// and (cumulative ack) when it is an individually acked kind (msg, state, mirror,
    /// private) also remove earlier lines of the same thread whose kind is never acked on its
    /// own (chunk, introduce). The thread is taken from the stored line; `th` is the ack's
    /// and only used when nothing is stored. Returns true when `re` was in the outbox (false
    /// for an unknown or already retired id, which changes nothing). One transaction; see
    /// [`Store::receive_batch_acks`] for many acks at once.
    pub fn ack(&self, peer: &PeerKey, th: &str, re: &str) -> Result<bool, StoreError> {
        let (_, found) = self.receive_batch_acks(peer, &[], &[(th, re)])?;
        Ok(found.first().copied().unwrap_or(false))
    }

    /// The acks `acks` (each `(th, re)` as in [`Store::ack`], in arrival order) applied in
    /// `tx`: every line they name and the earlier unacked-kind lines of their threads are
    /// retired once, however many acks of the batch cover them. One scan of the peer's
    /// outbox up to the largest acked key, not one per ack. Returns, per ack, whether `re`
    /// was in the outbox (a repeated `re` in the batch: false the second time).
    pub(super) fn ack_in(
        &self,
        tx: &mut Tx<'_>,
        peer: &PeerKey,
        acks: &[(&str, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut found = Vec::with_capacity(acks.len());
        let mut retire: Vec<(Vec<u8>, u64, usize)> = Vec::new();
        let mut retired: HashSet<Vec<u8>> = HashSet::new();
        // Per thread: the largest outbox key of an individually acked line acked here.
        let mut upto: HashMap<String, Vec<u8>> = HashMap::new();
        for (th, re) in acks {
            let key = pkey(peer, re.as_bytes());
            if retired.contains(&key) {
                found.push(false);
                continue;
            }
            let Some(v) = tx.get(T::Outbox, &key)? else {
                found.push(false);
                continue;
            };
            let (rec, _): (OutRec, Payload) = unpack("outbox", &v)?;
            if acked_kind(&rec.kind) {
                let th = rec.th.clone().unwrap_or_else(|| th.to_string());
                match upto.get_mut(&th) {
                    Some(m) if *m >= key => {}
                    Some(m) => *m = key.clone(),
                    None => {
                        upto.insert(th, key.clone());
                    }
                }
            }
            retire.push((key.clone(), rec.seq, rec.queued_len(v.len())));
            retired.insert(key);
            found.push(true);
        }
        if let Some(end) = upto.values().max().cloned() {
            let prefix = pkey(peer, b"");
            for kv in self.trees.t(T::Outbox).range(prefix..end) {
                let (k, v) = kv.map_err(db_err)?;
                if retired.contains(k.as_ref()) {
                    continue;
                }
                let (r, _): (OutRec, Payload) = unpack("outbox", &v)?;
                if acked_kind(&r.kind) {
                    continue;
                }
                let covered =
                    r.th.as_deref()
                        .and_then(|t| upto.get(t))
                        .is_some_and(|m| k.as_ref() < m.as_slice());
                if covered {
                    retire.push((k.to_vec(), r.seq, r.queued_len(v.len())));
                    retired.insert(k.to_vec());
                }
            }
        }
        if !retire.is_empty() {
            self.retire(tx, peer, &retire)?;
        }
        Ok(found)
    }
}

/// Add `delta` to `peer`'s u64 counter in `tree` (named `name` in errors), floored at 0;
/// a counter of 0 is removed. Errors: a stored value that is not 8 bytes, or sled's.
fn adjust_counter(
    tx: &mut Tx<'_>,
    tree: T,
    name: &'static str,
    peer: &PeerKey,
    delta: i64,
) -> Result<(), StoreError> {
    let k = peer.as_bytes().to_vec();
    let cur = match tx.get(tree, &k)? {
        Some(v) => read_u64(name, &v)?,
        None => 0,
    };
    let new = (cur as i64).saturating_add(delta).max(0) as u64;
    if new == 0 {
        tx.del(tree, k);
    } else {
        tx.put(tree, k, u64_be(new).to_vec());
    }
    Ok(())
}

/// Outbox records from which [`Store::outbox_after`] resolves their lines on two threads.
pub(super) const PARALLEL_RESOLVE: usize = 128;

/// The entries of outbox records `raw` (key, value; in order), skipping those whose line
/// left the log meanwhile ([`outbox_entry`]); split over two threads from
/// [`PARALLEL_RESOLVE`] records up when the process may use two cores ([`crate::par::halves`]).
fn resolve_outbox(
    trees: &Trees,
    raw: &[(sled::IVec, sled::IVec)],
) -> Result<Vec<OutboxEntry>, StoreError> {
    let one = |part: &[(sled::IVec, sled::IVec)]| -> Result<Vec<OutboxEntry>, StoreError> {
        let recs = part
            .iter()
            .map(|(k, v)| {
                let id = k
                    .get(32..)
                    .ok_or_else(|| corrupt("outbox", "key shorter than a peer key"))?;
                unpack::<OutRec>("outbox", v).map(|(rec, line)| (&k[..], id, rec, line))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let log = LogRun::read(
            trees,
            recs.iter()
                .filter_map(|(_, _, r, _)| r.log_len.map(|_| r.seq)),
        )?;
        let mut out = Vec::with_capacity(part.len());
        for (k, id, rec, line) in recs {
            if let Some(e) = outbox_entry(trees, &log, k, id, rec, line)? {
                out.push(e);
            }
        }
        Ok(out)
    };
    match crate::par::halves(raw, PARALLEL_RESOLVE, one) {
        crate::par::Split::Whole(r) => r,
        crate::par::Split::Halves { first, second, .. } => {
            let mut out = first?;
            out.extend(second?);
            Ok(out)
        }
    }
}

/// An outbox record (key `k`, the key's id part `id`, the record's header and payload) as
/// an entry, with its line: its own payload, or (a line stored once, [`OutRec::log_len`])
/// the payload of its out log entry, from `log` when the batch read it ahead. The key's peer part is not
/// decoded: callers scan one peer's prefix, and decoding a key (an Ed25519 point
/// decompression) per line was most of the cost of a resume replay. None when the log entry is
/// missing because the record left the outbox after the caller read it (a prune or forget
/// removes both in one transaction while a scan runs without the writer lock); a missing
/// entry of a record still queued, or one of another length, is [`StoreError::Corrupt`].
fn outbox_entry(
    trees: &Trees,
    log: &LogRun,
    k: &[u8],
    id: &[u8],
    rec: OutRec,
    line: Payload<'_>,
) -> Result<Option<OutboxEntry>, StoreError> {
    let line = match rec.log_len {
        None => line.get("outbox")?.into_owned(),
        Some(len) => {
            let Some(lv) = log.get(trees, rec.seq)? else {
                if !trees.t(T::Outbox).contains_key(k).map_err(db_err)? {
                    return Ok(None);
                }
                return Err(corrupt(
                    "outbox",
                    format!("line {} is not in the log", rec.seq),
                ));
            };
            // Only the line is needed: its record's header is not parsed.
            let line = payload_only("log", &lv)?.get("log")?.into_owned();
            if line.len() as u64 != len {
                return Err(corrupt(
                    "outbox",
                    format!("log entry {} is not the queued line", rec.seq),
                ));
            }
            line
        }
    };
    Ok(Some(OutboxEntry {
        id: utf8("outbox", id)?,
        th: rec.th,
        kind: rec.kind,
        line,
        seq: rec.seq,
    }))
}

/// Out log entries read ahead for one batch of outbox records: when the seqs of its lines
/// stored once span fewer than [`LogRun::DENSE`] times their number (a peer's queued lines
/// are logged in order, with other peers' lines between them), one range scan of the log
/// from the first to the last reads them, where a lookup per line walks the tree from
/// its root each time. Only the wanted entries are kept; the scan stops once the others
/// it passed over add up to [`LogRun::SKIP_MAX`] bytes (large lines of other peers), and
/// what it did not reach is looked up. Other batches read nothing ahead.
pub(super) struct LogRun {
    /// `(seq, value)` of wanted entries, in seq order, as the scan found them.
    entries: Vec<(u64, sled::IVec)>,
}

impl LogRun {
    /// How many log entries a scan may pass per line it needs.
    const DENSE: u64 = 2;
    /// Bytes of entries not wanted that a scan may pass over before it stops.
    const SKIP_MAX: usize = 1024 * 1024;

    /// Read ahead the log entries `seqs` (in any order) when they are dense. Errors: sled's,
    /// or a log key that is not 8 bytes ([`StoreError::Corrupt`]).
    pub(super) fn read(
        trees: &Trees,
        seqs: impl Iterator<Item = u64>,
    ) -> Result<LogRun, StoreError> {
        let mut want: Vec<u64> = seqs.collect();
        want.sort_unstable();
        want.dedup();
        let mut entries = Vec::new();
        let (Some(&lo), Some(&hi)) = (want.first(), want.last()) else {
            return Ok(LogRun { entries });
        };
        let n = want.len() as u64;
        if n < 2 || hi - lo >= n.saturating_mul(Self::DENSE) {
            return Ok(LogRun { entries });
        }
        entries.reserve(want.len());
        let mut next = want.iter().copied().peekable();
        let mut skipped = 0usize;
        for kv in trees.t(T::Log).range(u64_be(lo)..=u64_be(hi)) {
            let (k, v) = kv.map_err(db_err)?;
            let seq = read_u64("log", &k)?;
            // Wanted seqs the scan has passed were not in the log: looked up later.
            while next.next_if(|&w| w < seq).is_some() {}
            if next.next_if_eq(&seq).is_some() {
                entries.push((seq, v));
            } else {
                skipped += v.len();
                if skipped >= Self::SKIP_MAX {
                    break;
                }
            }
            if next.peek().is_none() {
                break;
            }
        }
        Ok(LogRun { entries })
    }

    /// How many log entries the scan kept (0: none, lookups only).
    #[cfg(test)]
    pub(super) fn read_ahead(&self) -> usize {
        self.entries.len()
    }

    /// The log entry `seq`: from the scan when it kept it, else looked up (an entry the
    /// scan did not reach, or one written after it).
    fn get(&self, trees: &Trees, seq: u64) -> Result<Option<sled::IVec>, StoreError> {
        match self.entries.binary_search_by_key(&seq, |(s, _)| *s) {
            Ok(i) => Ok(Some(self.entries[i].1.clone())),
            Err(_) => trees.t(T::Log).get(u64_be(seq)).map_err(db_err),
        }
    }
}
