//! Presence (extension): signed documents that say what an agent is doing, gossiped from
//! peer to peer (protocol-notes §Presence). This module holds the rules and no I/O: the
//! node feeds it received documents with the current time and acts on the answer
//! (forward, drop), in the manner of the session state machine.
//!
//! - [`PresenceTable::accept`]: the receive rules (size, shape, origin key, signature,
//!   time window, newest seq per origin, per-origin rate limit, per-connection byte and
//!   new-origin budgets, a per-connection share of the table, hop bound).
//! - Watermarks: the highest `seq` seen per origin outlives the origin's document (evicted
//!   or expired from the table), so an older document cannot come back (a rollback). The
//!   node persists them ([`PresenceTable::marks`], [`PresenceTable::restore_marks`]).
//! - Documents are kept and forwarded as the exact bytes received ([`Held::raw`]).
//! - Newer is decided by `seq`; a `ts` is believed at most [`BELIEVED_AHEAD_MS`] ahead of
//!   our clock for age and rate, so a fast clock cannot pin an old document.
//! - [`doc`]: building and signing our own document, and the `seq` rule.
//!
//! Time is always passed in as Unix milliseconds, so the rules are tested with a fake clock.

#[cfg(test)]
mod bounds_tests;
pub mod doc;
#[cfg(test)]
mod tests;

use crate::canonical::verify_object;
use crate::wire::{self, PeerKey};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Largest accepted document: its compact JSON encoding, in bytes (64 KiB).
pub const MAX_DOC_BYTES: usize = 64 * 1024;
/// A document whose `ts` is older than this (ms) is refused, and forgotten once held.
pub const MAX_AGE_MS: u64 = 10 * 60 * 1000;
/// A document whose `ts` is further than this (ms) in the future is refused.
pub const MAX_FUTURE_MS: u64 = 5 * 60 * 1000;
/// How far ahead of our clock (ms) a document's `ts` is believed when it decides the
/// document's age (expiry) and the origin's rate limit: a `ts` further ahead counts as our
/// arrival time plus this. Freshness is decided by `seq` (protocol-notes §Presence), so an
/// origin whose clock ran fast and was corrected is shown with its newer documents at once
/// (its seq still grows: `max(last + 1, now)`), instead of being held at its future `ts`
/// (a clock 4 minutes fast pinned its old document for minutes, issue 8 §4b). Room for the
/// skew of honest clocks, and no more: every second of it is a document an origin may
/// send ahead of the rate limit.
pub const BELIEVED_AHEAD_MS: u64 = 5_000;
/// A document is forwarded only while `hops + 1` stays below this.
pub const MAX_HOPS: u64 = 8;
/// Origins held at most (by default); beyond, the one with the oldest `ts` is evicted.
pub const MAX_ORIGINS: usize = 1000;
/// At most one document per origin is accepted per this many milliseconds of the
/// origin's signed time as believed ([`believed_ts`]): a newer document must have a
/// believed `ts` at least this much later than the held one's.
///
/// Why signed time and not arrival time: copies of one origin's documents reach a node
/// over several paths (forwarding, and the anti-entropy burst on every new connection),
/// so two documents signed seconds apart can arrive milliseconds apart; an arrival-time
/// limit would drop honest updates at random. Because a `ts` is believed at most
/// [`BELIEVED_AHEAD_MS`] ahead of our clock, an origin still cannot sustain more than one
/// accepted document per second; the most it can do is spend its 10-minute window (and
/// those 5 seconds) once.
pub const RATE_INTERVAL_MS: u64 = 1000;

/// Bytes of documents one peer (connection) may send at once: room for a full
/// anti-entropy greeting (2 MiB) and one more document. Refilled at
/// [`CONN_BYTES_PER_SEC`].
pub const CONN_BURST_BYTES: u64 = 2 * 1024 * 1024 + MAX_DOC_BYTES as u64;
/// Sustained bytes of documents per second from one peer (128 KiB/s: about a thousand
/// origins' 2 KiB heartbeats per 16 s).
pub const CONN_BYTES_PER_SEC: u64 = 128 * 1024;
/// Documents of origins not held (new to the table) one peer may bring at once.
pub const CONN_BURST_ORIGINS: u64 = 512;
/// Sustained new origins per second from one peer.
pub const CONN_ORIGINS_PER_SEC: u64 = 2;
/// Share of the table (percent of its origins) whose documents one peer may have brought
/// in as new origins: whatever one connection sends, the rest stays for the others
/// (issue 8 §4: one connection alone could fill the 1,000-origin table).
pub const CONN_SHARE_PERCENT: u64 = 75;
/// Watermarks kept at most (16 per held origin); beyond, the oldest by `ts` go.
pub const MAX_MARKS: usize = 16 * MAX_ORIGINS;

/// Why a received document was not accepted. Each variant is counted by the table.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The compact encoding of the document is over [`MAX_DOC_BYTES`].
    #[error("document of {0} bytes is over the 64 KiB limit")]
    TooLarge(usize),
    /// A required field is missing or a field has the wrong JSON type.
    #[error("malformed document: {0}")]
    Malformed(String),
    /// `origin` is not a usable key (bad encoding, not a point, or weak).
    #[error("bad origin key: {0}")]
    BadOrigin(wire::KeyError),
    /// `sig` does not verify under `origin` (strict Ed25519 over the canonical JSON).
    #[error("signature does not verify")]
    BadSignature,
    /// `ts` is more than [`MAX_AGE_MS`] in the past.
    #[error("document is older than 10 minutes")]
    Stale,
    /// `ts` is more than [`MAX_FUTURE_MS`] in the future.
    #[error("document is more than 5 minutes in the future")]
    Future,
    /// The document is ours, echoed back by a peer.
    #[error("our own document")]
    Own,
    /// `seq` is not above the seq we hold for this origin (a replay or a copy that took
    /// another path).
    #[error("seq {got} is not newer than the held {held}")]
    NotNewer { got: u64, held: u64 },
    /// The document's believed `ts` ([`believed_ts`]) is less than [`RATE_INTERVAL_MS`]
    /// after the held one's.
    #[error("origin over its rate limit (one document per second)")]
    RateLimited,
    /// The sending peer is over its byte budget ([`CONN_BURST_BYTES`],
    /// [`CONN_BYTES_PER_SEC`]).
    #[error("sender over its presence byte budget")]
    ConnBytes,
    /// The sending peer is over its budget of new origins ([`CONN_BURST_ORIGINS`],
    /// [`CONN_ORIGINS_PER_SEC`]).
    #[error("sender over its budget of new origins")]
    ConnOrigins,
    /// The sending peer brought in the origins of [`Limits::share_percent`] of the table
    /// already (held now); a new origin must come from someone else.
    #[error("sender already brought its share of the table's origins")]
    ConnShare,
}

impl Refusal {
    /// A short stable name for counters and logs: `too_large`, `malformed`, `bad_origin`,
    /// `bad_signature`, `stale`, `future`, `own`, `not_newer`, `rate_limited`,
    /// `conn_bytes`, `conn_origins`, `conn_share`.
    pub fn name(&self) -> &'static str {
        match self {
            Refusal::TooLarge(_) => "too_large",
            Refusal::Malformed(_) => "malformed",
            Refusal::BadOrigin(_) => "bad_origin",
            Refusal::BadSignature => "bad_signature",
            Refusal::Stale => "stale",
            Refusal::Future => "future",
            Refusal::Own => "own",
            Refusal::NotNewer { .. } => "not_newer",
            Refusal::RateLimited => "rate_limited",
            Refusal::ConnBytes => "conn_bytes",
            Refusal::ConnOrigins => "conn_origins",
            Refusal::ConnShare => "conn_share",
        }
    }
}

/// A document the table took in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The document's origin.
    pub origin: PeerKey,
    /// Its seq (now the highest held for the origin).
    pub seq: u64,
    /// `Some(hops + 1)`: forward the document unchanged with this hop count to every
    /// presence peer except the sender and the origin. `None`: the hop bound is reached
    /// (`hops + 1 >= MAX_HOPS`), keep it but do not forward.
    pub forward_to_hops: Option<u64>,
}

/// One held document.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The document as received, parsed (its signature covers unknown fields).
    pub doc: Map<String, Value>,
    /// The document's JSON text exactly as received: what is forwarded.
    pub raw: Arc<str>,
    /// The origin's key.
    pub origin: PeerKey,
    /// The origin's seq.
    pub seq: u64,
    /// The document's `ts`, Unix ms.
    pub ts_ms: u64,
    /// The hop count it arrived with.
    pub hops: u64,
    /// The peer we got it from.
    pub via: PeerKey,
    /// The peer whose document made the origin held (new to the table); it keeps the
    /// origin counted in its share ([`Limits::share_percent`]) while the origin is held.
    pub introduced_by: PeerKey,
    /// When we accepted it, Unix ms.
    pub received_ms: u64,
}

/// What the table has counted since it was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Documents accepted (newer than what was held, all checks passed).
    pub accepted: u64,
    /// Accepted documents that were to be forwarded (at most one per (origin, seq)).
    pub forwarded: u64,
    /// Refused documents, by [`Refusal::name`].
    pub refused: std::collections::BTreeMap<&'static str, u64>,
    /// Documents forgotten: expired after [`MAX_AGE_MS`] or evicted when full.
    pub expired: u64,
    /// Held documents evicted because the table was full.
    pub evicted: u64,
}

impl Counters {
    /// All refusals together.
    pub fn dropped(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// The highest `seq` seen of one origin and that document's believed `ts` (Unix ms: its
/// `ts`, at most [`BELIEVED_AHEAD_MS`] after its arrival; see [`believed_ts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub seq: u64,
    pub ts_ms: u64,
}

/// A document's `ts` as believed: `ts_ms`, but at most [`BELIEVED_AHEAD_MS`] after
/// `arrived_ms`, the time (Unix ms, our clock) it arrived.
pub fn believed_ts(ts_ms: u64, arrived_ms: u64) -> u64 {
    ts_ms.min(arrived_ms.saturating_add(BELIEVED_AHEAD_MS))
}

impl Held {
    /// Its `ts` as believed ([`believed_ts`] at its arrival): what its age is counted from.
    pub fn believed_ts_ms(&self) -> u64 {
        believed_ts(self.ts_ms, self.received_ms)
    }

    fn fresh_at(&self, now_ms: u64) -> bool {
        self.believed_ts_ms().saturating_add(MAX_AGE_MS) >= now_ms
    }
}

/// A token bucket: up to `cap` tokens, `per_sec` more each second.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: u64,
    last_ms: u64,
}

impl Bucket {
    fn full(cap: u64, now_ms: u64) -> Bucket {
        Bucket {
            tokens: cap,
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, cap: u64, per_sec: u64, now_ms: u64) {
        let add = now_ms.saturating_sub(self.last_ms).saturating_mul(per_sec) / 1000;
        if add > 0 {
            self.tokens = self.tokens.saturating_add(add).min(cap);
            self.last_ms = if self.tokens == cap {
                now_ms
            } else {
                self.last_ms + add * 1000 / per_sec
            };
        } else if now_ms < self.last_ms {
            self.last_ms = now_ms;
        }
    }

    fn take(&mut self, n: u64) -> bool {
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }
}

/// Per-peer budgets of a table (defaults: the `CONN_*` constants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of documents at once ([`CONN_BURST_BYTES`]).
    pub burst_bytes: u64,
    /// Bytes per second after the burst ([`CONN_BYTES_PER_SEC`]).
    pub bytes_per_sec: u64,
    /// New origins at once ([`CONN_BURST_ORIGINS`]).
    pub burst_origins: u64,
    /// New origins per second after the burst ([`CONN_ORIGINS_PER_SEC`]).
    pub origins_per_sec: u64,
    /// Percent of the table's origins one peer may have brought in and held
    /// ([`CONN_SHARE_PERCENT`]; at least one origin).
    pub share_percent: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            burst_bytes: CONN_BURST_BYTES,
            bytes_per_sec: CONN_BYTES_PER_SEC,
            burst_origins: CONN_BURST_ORIGINS,
            origins_per_sec: CONN_ORIGINS_PER_SEC,
            share_percent: CONN_SHARE_PERCENT,
        }
    }
}

/// What one sending peer may still bring.
#[derive(Debug, Clone)]
struct Budget {
    bytes: Bucket,
    origins: Bucket,
}

/// The receive side of presence: the newest document per origin, with the rules of
/// protocol-notes §Presence. Our own key is refused as an origin (our document is kept
/// by the publisher, not here).
#[derive(Debug)]
pub struct PresenceTable {
    me: PeerKey,
    max_origins: usize,
    held: HashMap<PeerKey, Held>,
    /// Highest seq per origin, also for origins no longer held (see [`Mark`]).
    marks: HashMap<PeerKey, Mark>,
    /// A mark changed since [`PresenceTable::take_marks_changed`].
    marks_changed: bool,
    /// Budgets of the peers documents came from.
    budgets: HashMap<PeerKey, Budget>,
    /// Held origins per peer that brought them in ([`Held::introduced_by`]).
    introduced: HashMap<PeerKey, usize>,
    limits: Limits,
    counters: Counters,
}

/// The fields every document must carry, read from the map as received.
struct Head {
    origin: PeerKey,
    seq: u64,
    ts_ms: u64,
}

impl PresenceTable {
    /// An empty table for the node whose key is `me`, holding up to [`MAX_ORIGINS`].
    pub fn new(me: PeerKey) -> PresenceTable {
        PresenceTable::with_max_origins(me, MAX_ORIGINS)
    }

    /// An empty table holding documents of at most `max_origins` (≥ 1) origins.
    pub fn with_max_origins(me: PeerKey, max_origins: usize) -> PresenceTable {
        PresenceTable::with_limits(me, max_origins, Limits::default())
    }

    /// An empty table holding documents of at most `max_origins` (≥ 1) origins, with
    /// per-peer budgets `limits` (rates ≥ 1).
    pub fn with_limits(me: PeerKey, max_origins: usize, limits: Limits) -> PresenceTable {
        let limits = Limits {
            bytes_per_sec: limits.bytes_per_sec.max(1),
            origins_per_sec: limits.origins_per_sec.max(1),
            ..limits
        };
        PresenceTable {
            limits,
            me,
            max_origins: max_origins.max(1),
            held: HashMap::new(),
            marks: HashMap::new(),
            marks_changed: false,
            budgets: HashMap::new(),
            introduced: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// Take in `doc` (as received), which arrived from peer `from` with hop count `hops`,
    /// at `now_ms` (Unix ms). Checks, cheapest first: encoded size ≤ [`MAX_DOC_BYTES`];
    /// shape (`origin`, `seq`, `ts`, `sig` present and typed, optional fields typed as in
    /// the schema); origin key parses and is not weak; not our own origin; `ts` within
    /// [`MAX_AGE_MS`] past / [`MAX_FUTURE_MS`] future; seq above the held seq (newer is
    /// by seq only); believed `ts` ([`believed_ts`]) at least [`RATE_INTERVAL_MS`] after
    /// the held one's; then the signature
    /// (strict Ed25519 over the canonical JSON without `sig`).
    ///
    /// On success the document replaces the held one; see [`Accepted::forward_to_hops`].
    /// Every outcome is counted in [`PresenceTable::counters`].
    pub fn accept(
        &mut self,
        doc: Map<String, Value>,
        hops: u64,
        from: PeerKey,
        now_ms: u64,
    ) -> Result<Accepted, Refusal> {
        self.accept_raw(doc, None, hops, from, now_ms)
    }

    /// [`PresenceTable::accept`] for a document whose exact JSON text is `raw` (the text
    /// `doc` was parsed from; `None`: its compact encoding). That text is what
    /// [`Held::raw`] keeps and what is forwarded; both it and the compact encoding must be
    /// within [`MAX_DOC_BYTES`].
    ///
    /// Besides the rules of [`PresenceTable::accept`]: the document's seq must be above the
    /// origin's watermark even when its document is no longer held; each sending peer
    /// pays the document's size from its byte budget, and one token of its new-origin
    /// budget when the origin is not held (both before the signature check, so forgeries
    /// count).
    pub fn accept_raw(
        &mut self,
        doc: Map<String, Value>,
        raw: Option<String>,
        hops: u64,
        from: PeerKey,
        now_ms: u64,
    ) -> Result<Accepted, Refusal> {
        let r = self.check_and_insert(doc, raw, hops, from, now_ms);
        match &r {
            Ok(a) => {
                self.counters.accepted += 1;
                if a.forward_to_hops.is_some() {
                    self.counters.forwarded += 1;
                }
            }
            Err(e) => *self.counters.refused.entry(e.name()).or_insert(0) += 1,
        }
        r
    }

    fn check_and_insert(
        &mut self,
        doc: Map<String, Value>,
        raw: Option<String>,
        hops: u64,
        from: PeerKey,
        now_ms: u64,
    ) -> Result<Accepted, Refusal> {
        let compact = encoded_len(&doc);
        let size = raw.as_ref().map_or(compact, |r| r.len().max(compact));
        if size > MAX_DOC_BYTES {
            return Err(Refusal::TooLarge(size));
        }
        let head = read_head(&doc)?;
        if head.origin == self.me {
            return Err(Refusal::Own);
        }
        if head.ts_ms.saturating_add(MAX_AGE_MS) < now_ms {
            return Err(Refusal::Stale);
        }
        if head.ts_ms > now_ms.saturating_add(MAX_FUTURE_MS) {
            return Err(Refusal::Future);
        }
        // Newer is by seq alone; the rate limit compares believed times, so a `ts` that
        // was ahead of our clock does not hold back the documents after it.
        let believed = believed_ts(head.ts_ms, now_ms);
        if let Some(m) = self.marks.get(&head.origin) {
            if head.seq <= m.seq {
                return Err(Refusal::NotNewer {
                    got: head.seq,
                    held: m.seq,
                });
            }
            if believed < m.ts_ms.saturating_add(RATE_INTERVAL_MS) {
                return Err(Refusal::RateLimited);
            }
        }
        let new_origin = !self.held.contains_key(&head.origin);
        if new_origin && self.introduced.get(&from).copied().unwrap_or(0) >= self.share() {
            return Err(Refusal::ConnShare);
        }
        self.spend(&from, size as u64, new_origin, now_ms)?;
        if !verify_object(&head.origin, &doc) {
            return Err(Refusal::BadSignature);
        }
        let raw: Arc<str> = match raw {
            Some(r) => r.into(),
            None => serde_json::to_string(&doc).unwrap_or_default().into(),
        };
        if !self.held.contains_key(&head.origin) && self.held.len() >= self.max_origins {
            self.expire(now_ms);
            if self.held.len() >= self.max_origins {
                self.evict_oldest();
            }
        }
        self.set_mark(head.origin, head.seq, believed, now_ms);
        let introduced_by = match self.held.get(&head.origin) {
            Some(h) => h.introduced_by,
            None => {
                *self.introduced.entry(from).or_insert(0) += 1;
                from
            }
        };
        self.held.insert(
            head.origin,
            Held {
                doc,
                raw,
                origin: head.origin,
                seq: head.seq,
                ts_ms: head.ts_ms,
                hops,
                via: from,
                introduced_by,
                received_ms: now_ms,
            },
        );
        let next = hops.saturating_add(1);
        Ok(Accepted {
            origin: head.origin,
            seq: head.seq,
            forward_to_hops: (next < MAX_HOPS).then_some(next),
        })
    }

    /// Origins one peer may have brought in and held ([`Limits::share_percent`]).
    fn share(&self) -> usize {
        ((self.max_origins as u64).saturating_mul(self.limits.share_percent) / 100).max(1) as usize
    }

    /// Forget that `h`'s introducer holds a place for it (it left the table).
    fn uncount(introduced: &mut HashMap<PeerKey, usize>, h: &Held) {
        if let Some(n) = introduced.get_mut(&h.introduced_by) {
            *n -= 1;
            if *n == 0 {
                introduced.remove(&h.introduced_by);
            }
        }
    }

    /// Charge `from` `bytes` (and one new origin when `new_origin`), or refuse.
    fn spend(
        &mut self,
        from: &PeerKey,
        bytes: u64,
        new_origin: bool,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let l = self.limits;
        let b = self.budgets.entry(*from).or_insert_with(|| Budget {
            bytes: Bucket::full(l.burst_bytes, now_ms),
            origins: Bucket::full(l.burst_origins, now_ms),
        });
        b.bytes.refill(l.burst_bytes, l.bytes_per_sec, now_ms);
        b.origins.refill(l.burst_origins, l.origins_per_sec, now_ms);
        if b.bytes.tokens < bytes {
            return Err(Refusal::ConnBytes);
        }
        if new_origin && !b.origins.take(1) {
            return Err(Refusal::ConnOrigins);
        }
        b.bytes.take(bytes);
        Ok(())
    }

    fn set_mark(&mut self, origin: PeerKey, seq: u64, ts_ms: u64, now_ms: u64) {
        if !self.marks.contains_key(&origin) && self.marks.len() >= MAX_MARKS {
            self.expire_marks(now_ms);
            if self.marks.len() >= MAX_MARKS {
                // The mark least likely to matter: the oldest document's.
                if let Some(k) = self
                    .marks
                    .iter()
                    .min_by_key(|(_, m)| m.ts_ms)
                    .map(|(k, _)| *k)
                {
                    self.marks.remove(&k);
                }
            }
        }
        self.marks.insert(origin, Mark { seq, ts_ms });
        self.marks_changed = true;
    }

    /// Forget marks whose document is past [`MAX_AGE_MS`]: every document at or below
    /// such a seq is refused as stale anyway.
    fn expire_marks(&mut self, now_ms: u64) {
        let before = self.marks.len();
        self.marks
            .retain(|_, m| m.ts_ms.saturating_add(MAX_AGE_MS) >= now_ms);
        if self.marks.len() != before {
            self.marks_changed = true;
        }
    }

    /// Every watermark: origin, highest seq seen and its document's `ts`.
    pub fn marks(&self) -> Vec<(PeerKey, Mark)> {
        self.marks.iter().map(|(k, m)| (*k, *m)).collect()
    }

    /// Whether a watermark changed since the last call (then: persist [`Self::marks`]).
    pub fn take_marks_changed(&mut self) -> bool {
        std::mem::take(&mut self.marks_changed)
    }

    /// Take back persisted watermarks (keeping the higher seq where one is held), those
    /// still fresh at `now_ms`, up to [`MAX_MARKS`].
    pub fn restore_marks(&mut self, marks: impl IntoIterator<Item = (PeerKey, Mark)>, now_ms: u64) {
        for (k, m) in marks {
            if m.ts_ms.saturating_add(MAX_AGE_MS) < now_ms || k == self.me {
                continue;
            }
            if !self.marks.contains_key(&k) && self.marks.len() >= MAX_MARKS {
                break;
            }
            let e = self.marks.entry(k).or_insert(m);
            if m.seq > e.seq {
                *e = m;
            }
        }
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .held
            .values()
            .min_by_key(|h| (h.believed_ts_ms(), h.received_ms))
            .map(|h| h.origin);
        if let Some(k) = oldest {
            if let Some(h) = self.held.remove(&k) {
                Self::uncount(&mut self.introduced, &h);
            }
            self.counters.evicted += 1;
            self.counters.expired += 1;
        }
    }

    /// Forget documents whose believed `ts` ([`Held::believed_ts_ms`]) is more than
    /// [`MAX_AGE_MS`] before `now_ms`. Returns how many were dropped.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let before = self.held.len();
        let introduced = &mut self.introduced;
        self.held.retain(|_, h| {
            let keep = h.fresh_at(now_ms);
            if !keep {
                Self::uncount(introduced, h);
            }
            keep
        });
        let n = before - self.held.len();
        self.counters.expired += n as u64;
        self.expire_marks(now_ms);
        // A peer whose budgets are full again needs no entry.
        let l = self.limits;
        self.budgets.retain(|_, b| {
            b.bytes.refill(l.burst_bytes, l.bytes_per_sec, now_ms);
            b.origins.refill(l.burst_origins, l.origins_per_sec, now_ms);
            b.bytes.tokens < l.burst_bytes || b.origins.tokens < l.burst_origins
        });
        n
    }

    /// The held document of `origin`, if fresh at `now_ms` (by its believed `ts`).
    pub fn get(&self, origin: &PeerKey, now_ms: u64) -> Option<&Held> {
        self.held.get(origin).filter(|h| h.fresh_at(now_ms))
    }

    /// Every held document that is fresh at `now_ms` (by its believed `ts`), newest `ts`
    /// first.
    pub fn fresh(&self, now_ms: u64) -> Vec<&Held> {
        let mut v: Vec<&Held> = self.held.values().filter(|h| h.fresh_at(now_ms)).collect();
        v.sort_by(|a, b| b.ts_ms.cmp(&a.ts_ms).then(a.origin.cmp(&b.origin)));
        v
    }

    /// Number of documents held (fresh or not yet expired).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no document is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// What has been counted so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// Bytes of one watermark in [`encode_marks`]: key (32) ‖ seq (u64 BE) ‖ ts ms (u64 BE).
pub const MARK_BYTES: usize = 48;

/// Watermarks as bytes, for the store ([`MARK_BYTES`] each).
pub fn encode_marks(marks: &[(PeerKey, Mark)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(marks.len() * MARK_BYTES);
    for (k, m) in marks {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&m.seq.to_be_bytes());
        out.extend_from_slice(&m.ts_ms.to_be_bytes());
    }
    out
}

/// Watermarks back from [`encode_marks`] bytes; entries whose key is not a usable key are
/// skipped, as is a short tail.
pub fn decode_marks(bytes: &[u8]) -> Vec<(PeerKey, Mark)> {
    bytes
        .chunks_exact(MARK_BYTES)
        .filter_map(|c| {
            let key: [u8; 32] = c[..32].try_into().ok()?;
            let seq = u64::from_be_bytes(c[32..40].try_into().ok()?);
            let ts_ms = u64::from_be_bytes(c[40..48].try_into().ok()?);
            Some((PeerKey::from_bytes(&key).ok()?, Mark { seq, ts_ms }))
        })
        .collect()
}

/// A `presence` line `{t, id, ts, doc, hops}` whose `doc` is `raw_doc` byte for byte (a
/// document's text as received, or our own document's encoding), except that raw U+2028 /
/// U+2029 are escaped (see [`crate::wire::separators`]). `None` when `raw_doc` is
/// not one JSON value.
pub fn encode_line(id: &str, ts: &str, raw_doc: &str, hops: u64) -> Option<Vec<u8>> {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        t: &'a str,
        id: &'a str,
        ts: &'a str,
        doc: &'a serde_json::value::RawValue,
        hops: u64,
    }
    let doc: &serde_json::value::RawValue = serde_json::from_str(raw_doc).ok()?;
    serde_json::to_vec(&Line {
        t: "presence",
        id,
        ts,
        doc,
        hops,
    })
    .ok()
    // The same document value; only U+2028/U+2029 are escaped (signatures are over JCS).
    .map(crate::wire::escape_separators)
}

/// Length of the compact JSON encoding of `doc`, in bytes.
pub fn encoded_len(doc: &Map<String, Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a Map to a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, doc);
    c.0
}

fn read_head(doc: &Map<String, Value>) -> Result<Head, Refusal> {
    let origin = match doc.get("origin") {
        Some(Value::String(s)) => PeerKey::parse(s).map_err(Refusal::BadOrigin)?,
        Some(_) => return Err(Refusal::Malformed("`origin` must be a string".into())),
        None => return Err(Refusal::Malformed("`origin` is missing".into())),
    };
    let seq = match doc.get("seq") {
        Some(v) => v
            .as_u64()
            .filter(|s| *s <= wire::MAX_SAFE_INT)
            .ok_or_else(|| Refusal::Malformed("`seq` must be an integer ≥ 0".into()))?,
        None => return Err(Refusal::Malformed("`seq` is missing".into())),
    };
    let ts_ms = match doc.get("ts") {
        Some(Value::String(s)) => {
            let ns = wire::time::parse_rfc3339(s)
                .map_err(|_| Refusal::Malformed("`ts` is not RFC 3339".into()))?;
            u64::try_from(ns.div_euclid(1_000_000))
                .map_err(|_| Refusal::Malformed("`ts` is before 1970".into()))?
        }
        Some(_) => return Err(Refusal::Malformed("`ts` must be a string".into())),
        None => return Err(Refusal::Malformed("`ts` is missing".into())),
    };
    if !matches!(doc.get("sig"), Some(Value::String(_))) {
        return Err(Refusal::Malformed("`sig` must be a string".into()));
    }
    // The optional fields must have their schema types, so that what we show is sane.
    serde_json::from_value::<wire::Presence>(Value::Object(doc.clone()))
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(Head { origin, seq, ts_ms })
}
