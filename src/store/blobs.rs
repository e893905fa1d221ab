//! Blob records (protocol-notes §Blobs): what we know about files received from peers and
//! files sent to them. The bytes themselves live in files under `$AWP_HOME/blobs/`
//! (see [`crate::blob`]); these trees hold the offsets, states and outcomes.
//!
//! - `blobs_in`: peer (32 raw bytes) ‖ ref → [`InBlobState`] (JSON).
//! - `blobs_in_pending`: peer ‖ ref → offset (u64 BE), for the pending records only, so
//!   that checking a peer's pending budget never reads its finished records.
//! - `blobs_in_refused`: peer ‖ updated_ms (u64 BE) ‖ ref → (), oldest first: refused
//!   records are kept at most [`MAX_REFUSED_IN_PER_PEER`] per peer.
//! - `blobs_out`: peer ‖ ref → [`OutBlobState`] (JSON).
//!
//! Both indexes change in the transaction that changes the record. A store written before
//! they existed is indexed once, on first use.

use super::codec::{dec, enc, pkey, read_u64, split_pkey, u64_be, unpack, utf8, OutRec, Payload};
use super::tx::{db_err, Tx, T};
use super::{Store, StoreError};
use crate::wire::{Line, PeerKey};
use serde::{Deserialize, Serialize};

/// Where an inbound blob stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InStatus {
    /// Data or the naming msg still missing.
    Pending,
    /// Every byte and the naming msg arrived; the file is at `path`.
    Complete,
    /// We answered `err blob_refused`; the partial data was dropped.
    Refused,
}

/// Everything recorded about one inbound blob (the value of `blobs_in`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InBlobState {
    /// Thread of its chunks (or of its naming msg when that came first).
    pub th: Option<String>,
    /// The chunk index expected next (chunks below it are replays).
    pub next_n: u64,
    /// Bytes durably written to the partial file (fsynced before this was recorded).
    pub offset: u64,
    /// The chunk marked `last` arrived: `offset` is the whole size.
    pub last_seen: bool,
    /// Declared by the naming msg's blob part: size in bytes, file name, media type.
    pub size: Option<u64>,
    pub name: Option<String>,
    pub mime: Option<String>,
    /// Id of the msg that named the blob.
    pub msg_id: Option<String>,
    pub status: InStatus,
    /// Final path (absolute) once complete.
    pub path: Option<String>,
    /// Lowercase hex SHA-256 of the data once complete.
    pub sha256: Option<String>,
    /// Why it was refused.
    pub reason: Option<String>,
    /// First seen and last change, Unix ms.
    pub started_ms: u64,
    pub updated_ms: u64,
}

impl InBlobState {
    /// A record for a ref seen for the first time at `now_ms`.
    pub fn new(th: Option<String>, now_ms: u64) -> InBlobState {
        InBlobState {
            th,
            next_n: 0,
            offset: 0,
            last_seen: false,
            size: None,
            name: None,
            mime: None,
            msg_id: None,
            status: InStatus::Pending,
            path: None,
            sha256: None,
            reason: None,
            started_ms: now_ms,
            updated_ms: now_ms,
        }
    }
}

/// An inbound blob with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct InBlob {
    pub peer: PeerKey,
    pub blob_ref: String,
    pub state: InBlobState,
}

/// Everything recorded about one blob we queued for a peer (the value of `blobs_out`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutBlobState {
    pub th: String,
    /// Id of the msg that names the blob (queued right after its chunks).
    pub msg_id: String,
    /// Ids of its chunk lines, in order (n = index).
    pub chunk_ids: Vec<String>,
    pub name: String,
    pub mime: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the data.
    pub sha256: String,
    /// The file it was read from.
    pub source: String,
    /// The peer answered `err blob_refused`, or the source file changed before every chunk
    /// was sent ([`Store::stop_changed_blob`]): its queued chunks were dropped.
    pub refused: bool,
    /// Queued at, Unix ms.
    pub at_ms: u64,
    /// Streamed blobs only (queued as chunk stubs without data, see
    /// [`crate::blob::stream`]): data bytes per chunk, so chunk `n` is the bytes
    /// `n × chunk_size ..` of `source`. None: the chunk lines carry their data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u64>,
    /// Streamed blobs only: the modification time of `source` when it was hashed,
    /// nanoseconds since the Unix epoch; a file whose time, size or SHA-256 differs is not
    /// sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime_ns: Option<i64>,
    /// Why this node stopped sending it (the source file changed), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Streamed blobs hashed after queueing (`crate::blob::pending`): lowercase hex
    /// BLAKE3 of the data, from the same pass as `sha256`; the stream checks the chunks it
    /// reads against it. None: check against `sha256` (records written before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
}

/// What [`Store::stop_changed_blob`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    /// Ids of the lines removed from the outbox (chunks of the msg's blobs, and the msg).
    pub dropped: Vec<String>,
    /// The refusal stored in the msg's thread (an unread `err blob_refused` entry whose
    /// `re` is the msg), when the msg was still queued.
    pub entry: Option<super::LogEntry>,
}

/// The form in which a chunk line is kept in the out log: without its data (the data is
/// in the outbox until sent, or in the source file of a streamed blob), with
/// `"x_len"`: the number of data bytes it carried. Other lines are kept as they are.
/// `bytes` is the encoded line as [`Line::encode`] makes it (`data` last).
pub(super) fn log_form<'b>(kind: &str, bytes: &'b [u8]) -> std::borrow::Cow<'b, [u8]> {
    const FIELD: &[u8] = b",\"data\":\"";
    if kind != "chunk" || !bytes.ends_with(b"\"}") {
        return bytes.into();
    }
    let Some(at) = bytes.windows(FIELD.len()).rposition(|w| w == FIELD) else {
        return bytes.into();
    };
    let data = &bytes[at + FIELD.len()..bytes.len() - 2];
    if data.is_empty() || data.contains(&b'"') {
        return bytes.into();
    }
    let pad = data.iter().rev().take_while(|&&b| b == b'=').count();
    let len = (data.len() / 4 * 3 + (data.len() % 4).saturating_sub(1)).saturating_sub(pad);
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(format!(",\"data\":\"\",\"x_len\":{len}}}").as_bytes());
    out.into()
}

/// An outbound blob with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct OutBlob {
    pub peer: PeerKey,
    pub blob_ref: String,
    pub state: OutBlobState,
}

fn rkey(peer: &PeerKey, blob_ref: &str) -> Vec<u8> {
    pkey(peer, blob_ref.as_bytes())
}

/// Refused inbound records kept per peer; the oldest go first. A refused record only makes
/// chunks still in flight for that ref be ignored quietly; once it is gone, such a chunk is
/// refused again (one more `err blob_refused`), nothing worse.
pub const MAX_REFUSED_IN_PER_PEER: usize = 256;

/// Meta key that says the inbound indexes cover every record.
const IN_INDEX_BUILT: &[u8] = b"blobs_in_index/v1";

fn refused_key(peer: &PeerKey, updated_ms: u64, blob_ref: &str) -> Vec<u8> {
    let mut k = pkey(peer, &u64_be(updated_ms));
    k.extend_from_slice(blob_ref.as_bytes());
    k
}

/// Index writes for `state` of `peer`/`blob_ref` replacing `old`.
fn index_in(
    tx: &mut Tx<'_>,
    peer: &PeerKey,
    blob_ref: &str,
    old: Option<&InBlobState>,
    state: &InBlobState,
) {
    let key = rkey(peer, blob_ref);
    if let Some(o) = old {
        match o.status {
            InStatus::Pending => tx.del(T::BlobsInPending, key.clone()),
            InStatus::Refused => {
                tx.del(T::BlobsInRefused, refused_key(peer, o.updated_ms, blob_ref))
            }
            InStatus::Complete => {}
        }
    }
    match state.status {
        InStatus::Pending => tx.put(T::BlobsInPending, key, u64_be(state.offset).to_vec()),
        InStatus::Refused => tx.put(
            T::BlobsInRefused,
            refused_key(peer, state.updated_ms, blob_ref),
            Vec::new(),
        ),
        InStatus::Complete => {}
    }
}

impl Store {
    /// The record of inbound blob `blob_ref` from `peer`, if any.
    pub fn blob_in(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
    ) -> Result<Option<InBlobState>, StoreError> {
        match self
            .trees
            .t(T::BlobsIn)
            .get(rkey(peer, blob_ref))
            .map_err(db_err)?
        {
            Some(v) => Ok(Some(dec("blobs_in", &v)?)),
            None => Ok(None),
        }
    }

    /// Record `state` for inbound blob `blob_ref` from `peer` and, when `seen` is
    /// `(th, id)`, raise `seen[peer][th]` to `id` (byte order) — ONE transaction, so the
    /// offset of a chunk and the fact that the chunk was received become durable together
    /// (protocol-notes §Blobs: a replay after a crash never duplicates bytes). Not durable
    /// until [`Store::flush`].
    pub fn put_blob_in(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
        state: &InBlobState,
        seen: Option<(&str, &str)>,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        self.blobs_in_index_ready()?;
        let mut tx = Tx::new(&self.trees);
        let key = rkey(peer, blob_ref);
        let old = match tx.get(T::BlobsIn, &key)? {
            Some(v) => Some(dec::<InBlobState>("blobs_in", &v)?),
            None => None,
        };
        tx.put(T::BlobsIn, key, enc(state)?);
        index_in(&mut tx, peer, blob_ref, old.as_ref(), state);
        if state.status == InStatus::Refused
            && old.as_ref().map(|o| o.status) != Some(InStatus::Refused)
        {
            // Make room: the oldest refused records of this peer beyond the cap go.
            let mine = self.trees.t(T::BlobsInRefused).scan_prefix(peer.as_bytes());
            let keys: Vec<sled::IVec> = mine.keys().collect::<Result<_, _>>().map_err(db_err)?;
            let excess = (keys.len() + 1).saturating_sub(MAX_REFUSED_IN_PER_PEER);
            for k in keys.into_iter().take(excess) {
                let r = k.get(40..).unwrap_or_default();
                if r == blob_ref.as_bytes() {
                    continue;
                }
                tx.del(T::BlobsInRefused, k.to_vec());
                tx.del(T::BlobsIn, pkey(peer, r));
            }
        }
        if let Some((th, id)) = seen {
            // Bounded per peer: chunks may name thread ids that never open a thread.
            let bound = Some(self.max_threads_per_peer());
            super::threads::raise_seen(&mut tx, peer, th, id, bound)?;
        }
        tx.commit()
    }

    /// Every inbound blob record, by peer then ref.
    pub fn blobs_in(&self) -> Result<Vec<InBlob>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::BlobsIn).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (peer, r) = split_pkey("blobs_in", &k)?;
            out.push(InBlob {
                peer,
                blob_ref: utf8("blobs_in", &r)?,
                state: dec("blobs_in", &v)?,
            });
        }
        Ok(out)
    }

    /// Inbound blobs from `peer` that are still pending: how many, and the bytes their
    /// partial files hold.
    ///
    /// Reads the pending index only: the cost does not grow with the peer's finished or
    /// refused records.
    pub fn pending_blobs_in(&self, peer: &PeerKey) -> Result<(usize, u64), StoreError> {
        if !self.blobs_in_indexed()? {
            let _w = self.writer();
            self.blobs_in_index_ready()?;
        }
        let (mut n, mut bytes) = (0, 0u64);
        for kv in self.trees.t(T::BlobsInPending).scan_prefix(peer.as_bytes()) {
            let (_, v) = kv.map_err(db_err)?;
            n += 1;
            bytes = bytes.saturating_add(read_u64("blobs_in_pending", &v)?);
        }
        Ok((n, bytes))
    }

    /// Every inbound blob still pending, as (peer, ref), by peer then ref (from the pending
    /// index: finished and refused records are not read).
    pub fn pending_blob_refs(&self) -> Result<Vec<(PeerKey, String)>, StoreError> {
        if !self.blobs_in_indexed()? {
            let _w = self.writer();
            self.blobs_in_index_ready()?;
        }
        let mut out = Vec::new();
        for kv in self.trees.t(T::BlobsInPending).iter() {
            let (k, _) = kv.map_err(db_err)?;
            let (peer, r) = split_pkey("blobs_in_pending", &k)?;
            out.push((peer, utf8("blobs_in_pending", &r)?));
        }
        Ok(out)
    }

    fn blobs_in_indexed(&self) -> Result<bool, StoreError> {
        self.trees
            .t(T::Meta)
            .contains_key(IN_INDEX_BUILT)
            .map_err(db_err)
    }

    /// Build the inbound indexes from every record, once (caller holds the writer lock).
    fn blobs_in_index_ready(&self) -> Result<(), StoreError> {
        if self.blobs_in_indexed()? {
            return Ok(());
        }
        let mut tx = Tx::new(&self.trees);
        for kv in self.trees.t(T::BlobsIn).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (peer, r) = split_pkey("blobs_in", &k)?;
            let state: InBlobState = dec("blobs_in", &v)?;
            index_in(&mut tx, &peer, &utf8("blobs_in", &r)?, None, &state);
        }
        tx.put(T::Meta, IN_INDEX_BUILT.to_vec(), Vec::new());
        tx.commit()
    }

    /// Record an outbound blob (after its lines were queued with [`Store::enqueue`]).
    pub fn put_blob_out(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
        state: &OutBlobState,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        tx.put(T::BlobsOut, rkey(peer, blob_ref), enc(state)?);
        tx.commit()
    }

    /// Record the digests of outbound blob `blob_ref` to `peer`, computed after it was
    /// queued (`crate::blob::pending`): `sha256` and `blake3`. Only a record whose
    /// `sha256` is still empty and that is not refused takes them; no record (queueing
    /// failed) or any other record is left as it is. Returns whether they were recorded.
    /// Not durable until [`Store::flush`].
    pub fn set_blob_out_digests(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
        digests: &crate::blob::Digests,
    ) -> Result<bool, StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let key = rkey(peer, blob_ref);
        let Some(v) = tx.get(T::BlobsOut, &key)? else {
            return Ok(false);
        };
        let mut st: OutBlobState = dec("blobs_out", &v)?;
        if !st.sha256.is_empty() || st.refused {
            return Ok(false);
        }
        st.sha256 = digests.sha256.clone();
        st.blake3 = Some(digests.blake3.clone());
        tx.put(T::BlobsOut, key, enc(&st)?);
        tx.commit()?;
        Ok(true)
    }

    /// [`Store::enqueue`] of chunk lines and the msg naming their blobs, and the records of
    /// those blobs, in ONE transaction: a crash never leaves chunk stubs without the record
    /// that says where their data is. `blobs`: (ref, number of chunk lines, record); the
    /// builders queue every blob's chunks in that order, then the msg, last. Each record's
    /// `chunk_ids`, `msg_id` and `th` are filled in from the queued lines. Errors as
    /// [`Store::enqueue`]; not durable until [`Store::flush`].
    pub fn enqueue_with_blobs(
        &self,
        peer: &PeerKey,
        builders: &[super::LineBuilder<'_>],
        blobs: Vec<(String, usize, OutBlobState)>,
    ) -> Result<Vec<super::OutboxEntry>, StoreError> {
        self.check_space(0)?;
        let mut w = self.writer();
        let mut ids = w.ids_clone();
        let mut seq = w.log_seq_value();
        let now = crate::wire::time::now_ms();
        let mut tx = Tx::new(&self.trees);
        let out = self.enqueue_in(&mut tx, &mut ids, &mut seq, now, peer, builders)?;
        let Some(msg) = out.last() else {
            return Ok(out);
        };
        let mut at = 0;
        for (blob_ref, n, mut st) in blobs {
            let chunks = out.get(at..at + n).unwrap_or_default();
            at += n;
            st.chunk_ids = chunks.iter().map(|e| e.id.clone()).collect();
            st.msg_id = msg.id.clone();
            st.th = msg.th.clone().unwrap_or_default();
            if let Some(size) = st.chunk_size {
                // Out log: each stub says which bytes of the blob it stands for (the
                // blob's SHA-256 is in its record only: `send -f` queues the file before
                // it is hashed, see `crate::blob::pending`).
                for (i, e) in chunks.iter().enumerate() {
                    let off = (i as u64).saturating_mul(size).min(st.size);
                    let len = size.min(st.size - off);
                    let Some(stub) = e.line.strip_suffix(b"}") else {
                        continue;
                    };
                    let mut line = stub.to_vec();
                    line.extend_from_slice(
                        format!(",\"x_off\":{off},\"x_len\":{len}}}").as_bytes(),
                    );
                    let key = u64_be(e.seq);
                    if let Some(v) = tx.get(T::Log, &key)? {
                        let (rec, _): (super::codec::LogRec, Payload) = unpack("log", &v)?;
                        tx.put(T::Log, key.to_vec(), super::codec::pack(&rec, &line)?);
                    }
                }
            }
            tx.put(T::BlobsOut, rkey(peer, &blob_ref), enc(&st)?);
        }
        tx.commit()?;
        w.set_after_commit(ids, seq);
        Ok(out)
    }

    /// The source file of streamed blob `blob_ref` to `peer` changed before all of it was
    /// sent (see [`crate::blob::stream`]): stop sending it, in ONE transaction. Every blob
    /// named by the same msg is marked refused with `detail` as its reason, their chunk
    /// lines still queued and the msg itself leave the outbox (their out log entries stay,
    /// not acked), and when the msg was still queued an `err blob_refused` whose `re` is
    /// the msg is stored unread in its thread (from this node: its id is one of ours), so
    /// `read`, `tail` and `wait` show why the file never arrives. Without a record, only
    /// `chunk_id` leaves the outbox. Not durable until [`Store::flush`].
    pub fn stop_changed_blob(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
        chunk_id: &str,
        detail: &str,
    ) -> Result<Stopped, StoreError> {
        let mut w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let record: Option<OutBlobState> = match tx.get(T::BlobsOut, &rkey(peer, blob_ref))? {
            Some(v) => Some(dec("blobs_out", &v)?),
            None => None,
        };
        let mut ids_to_drop: Vec<String> = Vec::new();
        let mut refs: Vec<(String, OutBlobState)> = Vec::new();
        match &record {
            None => ids_to_drop.push(chunk_id.to_string()),
            Some(r) => {
                // Every blob of the same msg: without the msg none of them can complete.
                for kv in self.trees.t(T::BlobsOut).scan_prefix(peer.as_bytes()) {
                    let (k, v) = kv.map_err(db_err)?;
                    let other = super::codec::after_pkey("blobs_out", &k)?;
                    let st: OutBlobState = dec("blobs_out", &v)?;
                    if st.msg_id == r.msg_id {
                        refs.push((utf8("blobs_out", other)?, st));
                    }
                }
                for (_, st) in &refs {
                    ids_to_drop.extend(st.chunk_ids.iter().cloned());
                }
                ids_to_drop.push(r.msg_id.clone());
            }
        }
        let mut dropped = Vec::new();
        let mut bytes = 0usize;
        let mut msg_queued = false;
        let msg_id = refs.first().map(|(_, st)| st.msg_id.clone());
        for id in ids_to_drop {
            let k = pkey(peer, id.as_bytes());
            if let Some(v) = tx.get(T::Outbox, &k)? {
                bytes += queued_len(&v)?;
                tx.del(T::Outbox, k);
                msg_queued |= msg_id.as_deref() == Some(id.as_str());
                dropped.push(id);
            }
        }
        if !dropped.is_empty() {
            self.adjust_count(&mut tx, peer, -(dropped.len() as i64))?;
            self.adjust_bytes(&mut tx, peer, -(bytes as i64))?;
        }
        for (r, mut st) in refs {
            if !st.refused {
                st.refused = true;
                st.reason = Some(detail.to_string());
                tx.put(T::BlobsOut, rkey(peer, &r), enc(&st)?);
            }
        }
        let mut ids = w.ids_clone();
        let mut seq = w.log_seq_value();
        let mut entry = None;
        if let (true, Some(msg_id)) = (msg_queued, msg_id) {
            let now = crate::wire::time::now_ms();
            let th = record.map(|st| st.th).unwrap_or_default();
            let id = ids.next_at(now).to_string();
            let line = Line::Err(crate::wire::ErrLine {
                id: id.clone(),
                ts: crate::wire::time::format_ms(now),
                th: Some(th.clone()),
                re: Some(msg_id),
                code: crate::wire::code::BLOB_REFUSED.into(),
                detail: Some(crate::blob::cut(detail, super::MAX_ERR_DETAIL).to_string()),
                blob_ref: Some(blob_ref.to_string()),
            })
            .encode();
            seq += 1;
            entry = Some(super::errs::put_err_entry(
                &mut tx, peer, seq, id, th, line, now,
            )?);
        }
        tx.commit()?;
        w.set_after_commit(ids, seq);
        Ok(Stopped { dropped, entry })
    }

    /// The record of outbound blob `blob_ref` for `peer`, if any.
    pub fn blob_out(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
    ) -> Result<Option<OutBlobState>, StoreError> {
        match self
            .trees
            .t(T::BlobsOut)
            .get(rkey(peer, blob_ref))
            .map_err(db_err)?
        {
            Some(v) => Ok(Some(dec("blobs_out", &v)?)),
            None => Ok(None),
        }
    }

    /// Every outbound blob record, by peer then ref.
    pub fn blobs_out(&self) -> Result<Vec<OutBlob>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::BlobsOut).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let (peer, r) = split_pkey("blobs_out", &k)?;
            out.push(OutBlob {
                peer,
                blob_ref: utf8("blobs_out", &r)?,
                state: dec("blobs_out", &v)?,
            });
        }
        Ok(out)
    }

    /// How many of `ids` (the chunk ids of one blob, in queue order) have left the outbox
    /// for `peer` — retired by the peer's ack or resume, or dropped. Chunks of a blob leave
    /// as a prefix (resume drops ids up to `seen`, a cumulative ack drops all of them), so
    /// this is a binary search.
    pub fn chunks_retired(&self, peer: &PeerKey, ids: &[String]) -> Result<usize, StoreError> {
        let (mut lo, mut hi) = (0usize, ids.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.outbox_has(peer, &ids[mid])? {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    }

    /// The peer refused blob `blob_ref` (`err blob_refused`): remove its chunk lines still
    /// queued for `peer` and mark the outbound record refused — one transaction. The chunk
    /// ids come from the record; without a record (not ours), the peer's queued chunk
    /// lines are scanned for the ref. The out log entries stay as they are (not acked).
    /// Returns the ids of the lines removed. Not durable until [`Store::flush`].
    pub fn drop_blob_chunks(
        &self,
        peer: &PeerKey,
        blob_ref: &str,
    ) -> Result<Vec<String>, StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let key = rkey(peer, blob_ref);
        let record: Option<OutBlobState> = match tx.get(T::BlobsOut, &key)? {
            Some(v) => Some(dec("blobs_out", &v)?),
            None => None,
        };
        let mut drop: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0usize;
        match &record {
            Some(r) => {
                for id in &r.chunk_ids {
                    let k = pkey(peer, id.as_bytes());
                    if let Some(v) = tx.get(T::Outbox, &k)? {
                        bytes += queued_len(&v)?;
                        drop.push(k);
                    }
                }
            }
            None => {
                for kv in self.trees.t(T::Outbox).scan_prefix(peer.as_bytes()) {
                    let (k, v) = kv.map_err(db_err)?;
                    let (rec, line): (OutRec, Payload) = unpack("outbox", &v)?;
                    if rec.kind != "chunk" {
                        continue;
                    }
                    if let Ok(Line::Chunk(c)) = crate::wire::parse_line(&line.get("outbox")?) {
                        if c.blob_ref == blob_ref {
                            bytes += rec.queued_len(v.len());
                            drop.push(k.to_vec());
                        }
                    }
                }
            }
        }
        for k in &drop {
            tx.del(T::Outbox, k.clone());
        }
        if !drop.is_empty() {
            self.adjust_count(&mut tx, peer, -(drop.len() as i64))?;
            self.adjust_bytes(&mut tx, peer, -(bytes as i64))?;
        }
        if let Some(mut r) = record {
            if !r.refused {
                r.refused = true;
                tx.put(T::BlobsOut, key, enc(&r)?);
            }
        }
        tx.commit()?;
        drop.into_iter().map(|k| utf8("outbox", &k[32..])).collect()
    }
}

/// The queued bytes an outbox record `v` stands for ([`OutRec::queued_len`]).
fn queued_len(v: &[u8]) -> Result<usize, StoreError> {
    let (rec, _): (OutRec, Payload) = unpack("outbox", v)?;
    Ok(rec.queued_len(v.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Chunk, Msg, Part, TextPart};

    fn key(n: u8) -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
    }

    fn chunk(r: &str, n: u64, id: &str, ts: &str) -> Line {
        Line::Chunk(Chunk {
            id: id.into(),
            ts: ts.into(),
            th: Some("th".into()),
            blob_ref: r.into(),
            n,
            last: false,
            data: "AA==".into(),
        })
    }

    #[test]
    fn refused_blob_chunks_leave_the_outbox_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let p = key(1);
        let a0 = |id: &str, ts: &str| chunk("a", 0, id, ts);
        let a1 = |id: &str, ts: &str| chunk("a", 1, id, ts);
        let b0 = |id: &str, ts: &str| chunk("b", 0, id, ts);
        let m = |id: &str, ts: &str| {
            Line::Msg(Msg {
                id: id.into(),
                ts: ts.into(),
                th: "th".into(),
                re: None,
                subject: None,
                parts: vec![Part::Text(TextPart { text: "x".into() })],
            })
        };
        let e = s.enqueue(&p, &[&a0, &b0, &a1, &m]).unwrap();
        let st = OutBlobState {
            th: "th".into(),
            msg_id: e[3].id.clone(),
            chunk_ids: vec![e[0].id.clone(), e[2].id.clone()],
            name: "a".into(),
            mime: "x/y".into(),
            size: 2,
            sha256: String::new(),
            source: "/a".into(),
            refused: false,
            at_ms: 0,
            chunk_size: None,
            mtime_ns: None,
            reason: None,
            blake3: None,
        };
        s.put_blob_out(&p, "a", &st).unwrap();
        assert_eq!(s.chunks_retired(&p, &st.chunk_ids).unwrap(), 0);
        let dropped = s.drop_blob_chunks(&p, "a").unwrap();
        assert_eq!(dropped, vec![e[0].id.clone(), e[2].id.clone()]);
        assert!(s.blob_out(&p, "a").unwrap().unwrap().refused);
        assert_eq!(s.outbox_len(&p).unwrap(), 2);
        // Without a record the outbox is scanned for the ref.
        assert_eq!(s.drop_blob_chunks(&p, "b").unwrap(), vec![e[1].id.clone()]);
        assert_eq!(s.outbox_len(&p).unwrap(), 1);
        assert!(s.outbox_has(&p, &e[3].id).unwrap());
        assert!(s.drop_blob_chunks(&p, "nothing").unwrap().is_empty());
    }

    /// Issue 8 §4: a chunk line with data is kept once — in the outbox until sent — and
    /// the out log holds it without data, with its byte count.
    #[test]
    fn the_out_log_keeps_chunk_lines_without_data() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let p = key(1);
        let c = |id: &str, ts: &str| chunk("a", 0, id, ts);
        let e = s.enqueue(&p, &[&c]).unwrap();
        assert!(e[0].line.ends_with(br#""data":"AA=="}"#));
        let queued = s.outbox_after(&p, None, 10).unwrap();
        assert_eq!(queued[0].line, e[0].line, "the outbox keeps the data");
        let logged = s.log(0, None, false, 10).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&logged[0].line).unwrap();
        assert_eq!(v["data"], "");
        assert_eq!(v["x_len"], 1);
        assert_eq!(v["ref"], "a");
        // Lengths from base64 with and without padding.
        for (data, len) in [("AAAA", 3), ("AAA=", 2), ("AA==", 1), ("", 0)] {
            let line = format!(r#"{{"t":"chunk","id":"i","ts":"t","data":"{data}"}}"#);
            let f = log_form("chunk", line.as_bytes());
            let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
            assert_eq!(v["data"], "");
            if len > 0 {
                assert_eq!(v["x_len"], len, "{data}");
            }
        }
        assert_eq!(&*log_form("msg", b"{\"x\"}"), b"{\"x\"}");
    }

    #[test]
    fn chunks_retired_counts_the_prefix_gone_from_the_outbox() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let p = key(1);
        let c = |id: &str, ts: &str| chunk("a", 0, id, ts);
        let e = s.enqueue(&p, &[&c, &c, &c]).unwrap();
        let ids: Vec<String> = e.iter().map(|x| x.id.clone()).collect();
        let mut seen = std::collections::BTreeMap::new();
        seen.insert("th".to_string(), ids[1].clone());
        s.drop_seen(&p, &seen).unwrap();
        assert_eq!(s.chunks_retired(&p, &ids).unwrap(), 2);
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;

    fn record(status: InStatus, offset: u64, at_ms: u64) -> InBlobState {
        let mut st = InBlobState::new(None, at_ms);
        st.status = status;
        st.offset = offset;
        st
    }

    fn kept(s: &Store, peer: &PeerKey) -> Vec<InBlob> {
        s.blobs_in()
            .unwrap()
            .into_iter()
            .filter(|b| b.peer == *peer)
            .collect()
    }

    /// Issue #12: refused records grew without bound per peer, and every new ref read all
    /// of them to count the pending ones. Now the oldest refused records go beyond the cap,
    /// and the pending count reads the pending index only.
    #[test]
    fn refused_records_are_bounded_per_peer_and_pending_is_indexed() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let peer = crate::identity::Identity::from_seed(&[4; 32]).key();
        let other = crate::identity::Identity::from_seed(&[5; 32]).key();
        s.put_blob_in(&peer, "p1", &record(InStatus::Pending, 10, 1), None)
            .unwrap();
        s.put_blob_in(&other, "r", &record(InStatus::Refused, 0, 1), None)
            .unwrap();
        let n = MAX_REFUSED_IN_PER_PEER + 40;
        for i in 0..n {
            let r = format!("r{i:05}");
            s.put_blob_in(
                &peer,
                &r,
                &record(InStatus::Refused, 0, 100 + i as u64),
                None,
            )
            .unwrap();
        }
        s.put_blob_in(&peer, "p2", &record(InStatus::Pending, 5, 2), None)
            .unwrap();
        let mine = kept(&s, &peer);
        let refused: Vec<_> = mine
            .iter()
            .filter(|b| b.state.status == InStatus::Refused)
            .collect();
        assert_eq!(
            refused.len(),
            MAX_REFUSED_IN_PER_PEER,
            "refused records are capped"
        );
        // The oldest went: the newest are kept.
        assert!(refused.iter().all(|b| b.blob_ref.as_str() >= "r00040"));
        assert_eq!(kept(&s, &other).len(), 1, "another peer's records stay");
        assert_eq!(s.pending_blobs_in(&peer).unwrap(), (2, 15));
        // The pending index holds the pending records only.
        let idx = s
            .trees
            .t(T::BlobsInPending)
            .scan_prefix(peer.as_bytes())
            .count();
        assert_eq!(idx, 2);
        // A pending record that completes or is refused leaves the pending index.
        s.put_blob_in(&peer, "p1", &record(InStatus::Complete, 10, 3), None)
            .unwrap();
        assert_eq!(s.pending_blobs_in(&peer).unwrap(), (1, 5));
    }

    /// A store written before the indexes existed is indexed on first use.
    #[test]
    fn old_stores_are_indexed_once() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let peer = crate::identity::Identity::from_seed(&[4; 32]).key();
        assert_eq!(s.pending_blobs_in(&peer).unwrap(), (0, 0));
        s.trees
            .t(T::BlobsIn)
            .insert(
                rkey(&peer, "old"),
                enc(&record(InStatus::Pending, 7, 1)).unwrap(),
            )
            .unwrap();
        assert_eq!(
            s.pending_blobs_in(&peer).unwrap(),
            (0, 0),
            "flag set: no rebuild"
        );
        s.trees.t(T::Meta).remove(IN_INDEX_BUILT).unwrap();
        assert_eq!(s.pending_blobs_in(&peer).unwrap(), (1, 7));
    }
}
