//! Presence (extension): signed documents that say what an agent is doing, gossiped from
//! peer to peer (protocol-notes §Presence). This module holds the rules and no I/O: the
//! node feeds it received documents with the current time and acts on the answer
//! (forward, drop), in the manner of the session state machine.
//!
//! - [`PresenceTable::accept`]: the receive rules (size, shape, origin key, signature,
//!   time window, newest seq per origin, per-origin rate limit, hop bound).
//! - [`doc`]: building and signing our own document, and the `seq` rule.
//!
//! Time is always passed in as Unix milliseconds, so the rules are tested with a fake clock.

pub mod doc;
#[cfg(test)]
mod tests;

use crate::canonical::verify_object;
use crate::wire::{self, PeerKey};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Largest accepted document: its compact JSON encoding, in bytes (64 KiB).
pub const MAX_DOC_BYTES: usize = 64 * 1024;
/// A document whose `ts` is older than this (ms) is refused, and forgotten once held.
pub const MAX_AGE_MS: u64 = 10 * 60 * 1000;
/// A document whose `ts` is further than this (ms) in the future is refused.
pub const MAX_FUTURE_MS: u64 = 5 * 60 * 1000;
/// A document is forwarded only while `hops + 1` stays below this.
pub const MAX_HOPS: u64 = 8;
/// Origins held at most (by default); beyond, the one with the oldest `ts` is evicted.
pub const MAX_ORIGINS: usize = 1000;
/// At most one document per origin is accepted per this many milliseconds of the
/// origin's signed time: a newer document must have a `ts` at least this much later than
/// the held one.
///
/// Why signed time and not arrival time: copies of one origin's documents reach a node
/// over several paths (forwarding, and the anti-entropy burst on every new connection),
/// so two documents signed seconds apart can arrive milliseconds apart; an arrival-time
/// limit would drop honest updates at random. Because `ts` must stay within
/// [`MAX_FUTURE_MS`] of our clock, an origin still cannot sustain more than one accepted
/// document per second; the most it can do is spend its 15-minute window once.
pub const RATE_INTERVAL_MS: u64 = 1000;

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
    /// The document's `ts` is less than [`RATE_INTERVAL_MS`] after the held one's.
    #[error("origin over its rate limit (one document per second)")]
    RateLimited,
}

impl Refusal {
    /// A short stable name for counters and logs: `too_large`, `malformed`, `bad_origin`,
    /// `bad_signature`, `stale`, `future`, `own`, `not_newer`, `rate_limited`.
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
    /// The document exactly as received (its signature covers unknown fields).
    pub doc: Map<String, Value>,
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

/// The receive side of presence: the newest document per origin, with the rules of
/// protocol-notes §Presence. Our own key is refused as an origin (our document is kept
/// by the publisher, not here).
#[derive(Debug)]
pub struct PresenceTable {
    me: PeerKey,
    max_origins: usize,
    held: HashMap<PeerKey, Held>,
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
        PresenceTable {
            me,
            max_origins: max_origins.max(1),
            held: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// Take in `doc` (as received), which arrived from peer `from` with hop count `hops`,
    /// at `now_ms` (Unix ms). Checks, cheapest first: encoded size ≤ [`MAX_DOC_BYTES`];
    /// shape (`origin`, `seq`, `ts`, `sig` present and typed, optional fields typed as in
    /// the schema); origin key parses and is not weak; not our own origin; `ts` within
    /// [`MAX_AGE_MS`] past / [`MAX_FUTURE_MS`] future; seq above the held seq; `ts`
    /// at least [`RATE_INTERVAL_MS`] after the held one's; then the signature
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
        let r = self.check_and_insert(doc, hops, from, now_ms);
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
        hops: u64,
        from: PeerKey,
        now_ms: u64,
    ) -> Result<Accepted, Refusal> {
        let size = encoded_len(&doc);
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
        if let Some(h) = self.held.get(&head.origin) {
            if head.seq <= h.seq {
                return Err(Refusal::NotNewer {
                    got: head.seq,
                    held: h.seq,
                });
            }
            if head.ts_ms < h.ts_ms.saturating_add(RATE_INTERVAL_MS) {
                return Err(Refusal::RateLimited);
            }
        }
        if !verify_object(&head.origin, &doc) {
            return Err(Refusal::BadSignature);
        }
        if !self.held.contains_key(&head.origin) && self.held.len() >= self.max_origins {
            self.expire(now_ms);
            if self.held.len() >= self.max_origins {
                self.evict_oldest();
            }
        }
        self.held.insert(
            head.origin,
            Held {
                doc,
                origin: head.origin,
                seq: head.seq,
                ts_ms: head.ts_ms,
                hops,
                via: from,
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

    fn evict_oldest(&mut self) {
        let oldest = self
            .held
            .values()
            .min_by_key(|h| (h.ts_ms, h.received_ms))
            .map(|h| h.origin);
        if let Some(k) = oldest {
            self.held.remove(&k);
            self.counters.evicted += 1;
            self.counters.expired += 1;
        }
    }

    /// Forget documents whose `ts` is more than [`MAX_AGE_MS`] before `now_ms`. Returns
    /// how many were dropped.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let before = self.held.len();
        self.held
            .retain(|_, h| h.ts_ms.saturating_add(MAX_AGE_MS) >= now_ms);
        let n = before - self.held.len();
        self.counters.expired += n as u64;
        n
    }

    /// The held document of `origin`, if fresh at `now_ms`.
    pub fn get(&self, origin: &PeerKey, now_ms: u64) -> Option<&Held> {
        self.held
            .get(origin)
            .filter(|h| h.ts_ms.saturating_add(MAX_AGE_MS) >= now_ms)
    }

    /// Every held document that is fresh at `now_ms`, newest `ts` first.
    pub fn fresh(&self, now_ms: u64) -> Vec<&Held> {
        let mut v: Vec<&Held> = self
            .held
            .values()
            .filter(|h| h.ts_ms.saturating_add(MAX_AGE_MS) >= now_ms)
            .collect();
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
