//! Storing what a connection received: the commit of a batch of lines (with its blob data
//! and the peer's acks) in one transaction, its split form for a driver that fsyncs blob
//! data off its own task, and the release of acks and events once the store flush made
//! the batch durable (see the durability contract in the module above).

use super::*;

/// Where [`Session::take_blobs`] keeps the refusals of the chunks it takes.
enum Refusals {
    /// With the acks of the commit being made.
    HeldAcks,
    /// Apart, for the next commit (chunks taken while a flight runs:
    /// [`Session::prewrite_blobs`]).
    Prewrite,
}

impl Session {
    /// Store the lines received since the last call in one transaction (not yet durable).
    /// Duplicates (by peer and id, also within the batch) are re-acked without effect. The
    /// driver then runs [`Store::flush`] and calls [`Session::flushed`] (or
    /// [`Session::flush_failed`]). Lines that arrived before a closing error are still
    /// stored, but not acked.
    ///
    /// Acks received since the last call go into the same transaction, and signed lines
    /// of a signing peer are verified here, in one batch: the first line whose signature
    /// fails is refused with `err auth` (closing) as if it had been checked on arrival:
    /// the lines before it are stored (not acked: the session is closed), it and the
    /// lines after it are not.
    pub fn commit(&mut self) {
        if let Some(job) = self.commit_start() {
            let res = job.run();
            self.commit_synced(res);
        }
    }

    /// [`Session::commit`] for a driver that runs the fsync of blob data off its own task:
    /// the blob data of the lines received since the last call is written, and when there
    /// is any, the returned [`crate::blob::BlobSync`] must be run (it blocks) and its
    /// result given to [`Session::commit_synced`], which records the blobs and stores the
    /// other lines; then the store flush follows as after [`Session::commit`]. With `None`
    /// the commit is complete. Until [`Session::commit_synced`], lines may be fed and
    /// [`Session::prewrite_blobs`] called, but not this again.
    pub fn commit_start(&mut self) -> Option<crate::blob::BlobSync> {
        if self.storage_failed {
            return None;
        }
        self.pending_bytes = 0;
        // Refusals of chunks taken early go out with this commit's acks.
        self.held_acks.append(&mut self.prewrite_errs);
        let unsynced = self
            .blobs
            .as_ref()
            .is_some_and(crate::blob::BlobReceiver::has_unsynced);
        if self.pending_rx.is_empty() && !unsynced {
            self.apply_acks();
            return None;
        }
        let mut batch = std::mem::take(&mut self.pending_rx);
        let sigs = std::mem::take(&mut self.pending_sigs);
        let sig_at = std::mem::take(&mut self.pending_sig_at);
        let peer = self.peer?;
        if !sigs.is_empty() {
            if let Err((bad, e)) = wire::sig::verify_batch(&peer, &sigs) {
                let at = sig_at[bad];
                let (line, _) = &batch[at];
                let (kind, id) = (line.kind().to_string(), line.id().map(str::to_string));
                batch.truncate(at);
                if self.phase != Phase::Closed {
                    self.close_with(code::AUTH, id, &format!("{kind} line: {e}"));
                }
            }
        }
        if let Some(mut blobs) = self.blobs.take() {
            // Blob data first: its records go in before the msgs that name the blobs, so a
            // msg is never acked ahead of chunk data that arrived before it.
            let res = self.take_blobs(&mut blobs, &peer, &batch, Refusals::HeldAcks);
            let job = res.map(|()| blobs.has_unsynced().then(|| blobs.begin_sync()));
            self.blobs = Some(blobs);
            batch.retain(|(l, _)| !matches!(l, Line::Chunk(_)));
            match job {
                Err(e) => {
                    self.fail_storage(None, &e.into_store_error());
                    return None;
                }
                Ok(Some(job)) => {
                    // The other lines wait for the blob records (`commit_synced`).
                    self.after_sync = Some(batch);
                    self.sync_mark = self.held_acks.len();
                    return Some(job);
                }
                Ok(None) => {}
            }
        }
        self.commit_lines(peer, batch);
        None
    }

    /// The second half of [`Session::commit_start`], with the result of its
    /// [`crate::blob::BlobSync::run`]: on success the blobs are recorded and the commit's
    /// other lines stored; a failure fails the session as any storage error does (`err
    /// internal`, nothing acked).
    pub fn commit_synced(&mut self, res: Result<(), crate::blob::BlobError>) {
        let batch = self.after_sync.take().unwrap_or_default();
        // Held while the fsync ran (pongs): after this commit's acks.
        let later = self
            .held_acks
            .split_off(self.sync_mark.min(self.held_acks.len()));
        let Some(mut blobs) = self.blobs.take() else {
            return;
        };
        let res = res.and_then(|()| blobs.finish_sync());
        if res.is_err() {
            blobs.abort_sync();
        }
        self.blobs = Some(blobs);
        if let Err(e) = res {
            self.fail_storage(None, &e.into_store_error());
            return;
        }
        match self.peer {
            Some(peer) if !batch.is_empty() => self.commit_lines(peer, batch),
            _ => self.apply_acks(),
        }
        if self.phase != Phase::Closed {
            self.held_acks.extend(later);
        }
    }

    /// Take in, while a commit's flush runs, the chunks at the head of the lines received
    /// since (issue 10 §2, overlap): their data is decoded, checked and written now, and
    /// made durable and recorded by the next commit, so that writing one batch's blob data
    /// overlaps the fsync of the last. Does nothing for a closed session, or while lines
    /// with signatures wait for their check (their data must not be written before it).
    pub fn prewrite_blobs(&mut self) {
        if self.phase == Phase::Closed || !self.pending_sigs.is_empty() {
            return;
        }
        let Some(peer) = self.peer else { return };
        let n = self
            .pending_rx
            .iter()
            .take_while(|(l, _)| matches!(l, Line::Chunk(_)))
            .count();
        if n == 0 {
            return;
        }
        let Some(mut blobs) = self.blobs.take() else {
            return;
        };
        let chunks: Vec<(Line, Vec<u8>)> = self.pending_rx.drain(..n).collect();
        // Their refusals wait apart: they go out with the acks of the commit that takes
        // these chunks' sync, not with the running flush's.
        let res = self.take_blobs(&mut blobs, &peer, &chunks, Refusals::Prewrite);
        self.blobs = Some(blobs);
        if let Err(e) = res {
            self.fail_storage(None, &e.into_store_error());
        }
    }

    /// Store the non-chunk lines of a commit (and the acks received) in one transaction,
    /// holding their acks for the flush.
    fn commit_lines(&mut self, peer: PeerKey, batch: Vec<(Line, Vec<u8>)>) {
        if batch.is_empty() {
            self.apply_acks();
            return;
        }
        let refs: Vec<(&Line, &[u8])> = batch.iter().map(|(l, r)| (l, r.as_slice())).collect();
        let acks = std::mem::take(&mut self.pending_acks);
        let ack_refs: Vec<(&str, &str)> = acks
            .iter()
            .map(|a| (a.th.as_str(), a.re.as_str()))
            .collect();
        let results = match self.store.receive_batch_acks(&peer, &refs, &ack_refs) {
            Ok((r, _)) => r,
            Err(e) => {
                self.fail_storage(None, &e);
                return;
            }
        };
        drop(refs);
        self.acked(acks);
        let closed = self.phase == Phase::Closed;
        // One timestamp for the acks of a batch (they go out together).
        let ts = now_ts();
        for ((line, raw), received) in batch.into_iter().zip(results) {
            let (Some(id), Some(th)) = (line.id(), line.th()) else {
                continue;
            };
            if received == Received::TooManyThreads {
                // Not stored, so not acked: refused, naming the bound (the sender keeps it).
                let max = self.store.max_threads_per_peer();
                tracing::info!(%peer, %id, "refusing a line that opens thread {th:?}: over {max} threads");
                if !closed {
                    let err = Line::Err(wire::ErrLine {
                        id: self.store.next_control_id(),
                        ts: now_ts(),
                        th: Some(th.to_string()),
                        re: Some(id.to_string()),
                        code: code::BUSY.into(),
                        detail: Some(format!(
                            "you have {max} threads with this node, the most it keeps per peer; no new thread"
                        )),
                        blob_ref: None,
                    });
                    self.held_acks.push(err.encode());
                }
                continue;
            }
            if received == Received::Duplicate {
                self.warn_if_changed(&peer, id, &raw);
            }
            if !closed {
                let ack = wire::Ack {
                    id: self.store.next_control_id(),
                    ts: ts.clone(),
                    th: th.to_string(),
                    re: id.to_string(),
                };
                self.held_acks.push(ack.encode_line());
            }
            if let Received::New(seq) = received {
                if seq > 0 {
                    self.held_events.push(SessionEvent::Received { seq, line });
                }
            }
        }
    }

    /// Apply the acks received since the last call in one store transaction (no flush
    /// needed: they retire our own lines, which the peer holds) and report them as
    /// [`SessionEvent::Acked`]. The driver need not call it: [`Session::commit`] and
    /// [`Session::poll_event`] do.
    pub fn apply_acks(&mut self) {
        if self.pending_acks.is_empty() {
            return;
        }
        let Some(peer) = self.peer else { return };
        let acks = std::mem::take(&mut self.pending_acks);
        let refs: Vec<(&str, &str)> = acks
            .iter()
            .map(|a| (a.th.as_str(), a.re.as_str()))
            .collect();
        if let Err(e) = self.store.receive_batch_acks(&peer, &[], &refs) {
            let id = acks.into_iter().next().map(|a| a.id);
            self.fail_storage(id, &e);
            return;
        }
        self.acked(acks);
    }

    /// Events for applied acks.
    fn acked(&mut self, acks: Vec<wire::Ack>) {
        for a in acks {
            self.events
                .push_back(SessionEvent::Acked { th: a.th, re: a.re });
        }
    }

    /// A duplicate (by peer and id) is re-acked and the first copy kept (protocol-notes
    /// §Threads, acks, resume). When its content differs from that copy (as JSON values:
    /// a replay of the same line is not news), say so at warn, at most once per peer per
    /// [`CHANGED_DUPLICATE_WARN_EVERY`] (issue 8 §4b).
    fn warn_if_changed(&self, peer: &PeerKey, id: &str, raw: &[u8]) {
        let Ok(Some(first)) = self.store.received_line(peer, id) else {
            return;
        };
        if first == raw {
            return;
        }
        let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
        if parse(&first).is_some_and(|a| Some(a) == parse(raw)) {
            return;
        }
        if changed_duplicate_warn_due(peer, Instant::now()) {
            tracing::warn!(
                %peer,
                id,
                "a line reuses the id of an earlier line with other content: acked, the first \
                 copy kept (further ones from this peer are not logged for a minute)"
            );
        }
    }

    /// Feed the chunks and blob-naming msgs of a batch to the blob receiver, in arrival
    /// order; refusals become `err blob_refused` lines, kept where `to` says (none once the
    /// session is closed). The data is written, not yet durable: the caller syncs it
    /// ([`crate::blob::BlobReceiver::sync`] or its halves) before the acks.
    fn take_blobs(
        &mut self,
        blobs: &mut crate::blob::BlobReceiver,
        peer: &PeerKey,
        batch: &[(Line, Vec<u8>)],
        to: Refusals,
    ) -> Result<(), crate::blob::BlobError> {
        use crate::blob::Verdict;
        for (line, _) in batch {
            let verdicts = match line {
                Line::Chunk(c) => vec![blobs.take_chunk(peer, c)?],
                Line::Msg(m) if m.parts.iter().any(|p| matches!(p, wire::Part::Blob(_))) => {
                    blobs.on_msg(peer, m)?
                }
                _ => continue,
            };
            for v in verdicts {
                let Verdict::Refuse {
                    blob_ref,
                    re,
                    detail,
                } = v
                else {
                    continue;
                };
                tracing::info!(%peer, ?blob_ref, %detail, "refusing a blob");
                if self.phase == Phase::Closed {
                    continue;
                }
                let err = Line::Err(wire::ErrLine {
                    id: self.store.next_control_id(),
                    ts: now_ts(),
                    th: line.th().map(str::to_string),
                    re: Some(re),
                    code: code::BLOB_REFUSED.into(),
                    detail: Some(detail),
                    blob_ref,
                });
                match to {
                    Refusals::HeldAcks => self.held_acks.push(err.encode()),
                    Refusals::Prewrite => self.prewrite_errs.push(err.encode()),
                }
            }
        }
        Ok(())
    }

    /// The driver ran [`Store::flush`] successfully: release held acks and events. Lines
    /// fed since the last [`Session::commit`] (while the flush ran) still want theirs.
    pub fn flushed(&mut self) {
        // Chunks taken early ([`Session::prewrite_blobs`]) still want their sync, and
        // their refusals still want to go out.
        let unsynced = self
            .blobs
            .as_ref()
            .is_some_and(crate::blob::BlobReceiver::has_unsynced);
        self.needs_flush = !self.storage_failed
            && (!self.pending_rx.is_empty() || unsynced || !self.prewrite_errs.is_empty());
        if self.phase == Phase::Closed {
            // Nothing goes out after a closing err or bye; what was stored is still news.
            self.held_acks.clear();
        } else {
            self.control.extend(self.held_acks.drain(..));
        }
        self.events.extend(self.held_events.drain(..));
        if let Some(b) = self.blobs.as_mut() {
            for done in b.after_flush() {
                self.events.push_back(SessionEvent::BlobReceived(done));
            }
        }
    }

    /// The flush failed: nothing held may be acked. Sends `err internal` and closes.
    pub fn flush_failed(&mut self, err: &StoreError) {
        self.needs_flush = false;
        self.held_acks.clear();
        self.held_events.clear();
        self.fail_storage(None, err);
    }
}
