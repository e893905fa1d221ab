//! Our own presence document: what goes in it, the `seq` rule, and signing.
//!
//! A document says who we are and what we are doing — never message contents, notes,
//! files or addresses. It is signed over the canonical JSON without `sig`
//! ([`crate::canonical::sign_object`]) and must stay within [`super::MAX_DOC_BYTES`]:
//! long lists are cut (most recent first) until it fits.

use super::MAX_DOC_BYTES;
use crate::canonical::sign_object;
use crate::identity::Identity;
use crate::wire::{self, PeerKey};
use serde_json::{json, Map, Value};

/// `active` is rounded down to this many milliseconds (30 s), so that it does not give
/// away exact activity times and does not change with every line.
pub const ACTIVE_GRANULARITY_MS: u64 = 30_000;
/// Peers listed at most (most recently seen first).
pub const MAX_PEERS: usize = 64;
/// Threads listed at most (most recently updated first).
pub const MAX_THREADS: usize = 64;
/// Characters kept of free text fields (name, about, subject, states).
pub const MAX_TEXT: usize = 200;

/// The next seq after `last` (the largest seq ever used, if any) at `now_ms`:
/// `max(last + 1, now_ms)`. Never lower than or equal to a seq already used, even when
/// the clock steps back; tracks wall-clock ms otherwise, so a lost store restarts high.
pub fn next_seq(last: Option<u64>, now_ms: u64) -> u64 {
    match last {
        Some(l) => l.saturating_add(1).max(now_ms),
        None => now_ms,
    }
    .min(wire::MAX_SAFE_INT)
}

/// One of our peers, as listed in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    /// The peer's key.
    pub key: PeerKey,
    /// Its hello name.
    pub name: Option<String>,
    /// Connected (session up) right now.
    pub up: bool,
    /// Last round trip in ms, when measured.
    pub rtt_ms: Option<u64>,
}

/// One of our threads, as listed in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadEntry {
    /// Thread id.
    pub th: String,
    /// The other party.
    pub peer: PeerKey,
    /// Subject (the first msg's).
    pub subject: Option<String>,
    /// Our state.
    pub mine: Option<String>,
    /// Their state, as last heard.
    pub theirs: Option<String>,
    /// Last change, Unix ms.
    pub updated_ms: u64,
    /// Unread inbound lines.
    pub unread: u64,
}

/// Everything a document is built from (gathered by the node; no I/O here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DocInputs {
    /// hello name.
    pub name: Option<String>,
    /// hello about.
    pub about: Option<String>,
    /// Implementation version (the crate version).
    pub version: Option<String>,
    /// Agent harness (`AWP_HARNESS`).
    pub harness: Option<String>,
    /// Model (`AWP_MODEL`).
    pub model: Option<String>,
    /// Hostname.
    pub host: Option<String>,
    /// Last line sent or received, Unix ms.
    pub active_ms: Option<u64>,
    /// Our peers.
    pub peers: Vec<PeerEntry>,
    /// Our threads.
    pub threads: Vec<ThreadEntry>,
    /// Queued, unacked outbound lines.
    pub outbox: u64,
    /// Unread inbound lines.
    pub unread: u64,
    /// Our relay circuit addresses (spec/relay-circuits.md): they name the relay and our
    /// key, never our own network address. At most [`MAX_CIRCUITS`] are published.
    pub circuits: Vec<String>,
}

/// Circuit addresses published at most.
pub const MAX_CIRCUITS: usize = 8;
/// Longest circuit address published, in bytes (longer ones are left out).
pub const MAX_CIRCUIT_LEN: usize = 512;

/// `waiting`: true when our own state is `waiting` in any thread (we said we are
/// blocked on the other side). A documented simplification: unread lines do not matter.
pub fn waiting(threads: &[ThreadEntry]) -> bool {
    threads.iter().any(|t| t.mine.as_deref() == Some("waiting"))
}

fn clip(s: &str) -> String {
    s.chars().take(MAX_TEXT).collect()
}

/// Build and sign our document with `seq` at `now_ms`. The result has `origin`, `seq`,
/// `ts`, the fields of `inputs` that are set, and `sig`; at most [`MAX_PEERS`] peers and
/// [`MAX_THREADS`] threads (the most recent), fewer when needed to stay within
/// [`MAX_DOC_BYTES`].
pub fn build_signed(
    identity: &Identity,
    inputs: &DocInputs,
    seq: u64,
    now_ms: u64,
) -> Map<String, Value> {
    let mut peers = inputs.peers.clone();
    peers.truncate(MAX_PEERS);
    let mut threads = inputs.threads.clone();
    threads.sort_by_key(|t| std::cmp::Reverse(t.updated_ms));
    threads.truncate(MAX_THREADS);
    loop {
        let doc = sign(identity, inputs, &peers, &threads, seq, now_ms);
        if super::encoded_len(&doc) <= MAX_DOC_BYTES || (peers.is_empty() && threads.is_empty()) {
            return doc;
        }
        if threads.len() >= peers.len() {
            threads.truncate(threads.len() / 2);
        } else {
            peers.truncate(peers.len() / 2);
        }
    }
}

fn sign(
    identity: &Identity,
    inputs: &DocInputs,
    peers: &[PeerEntry],
    threads: &[ThreadEntry],
    seq: u64,
    now_ms: u64,
) -> Map<String, Value> {
    let mut d = Map::new();
    d.insert("origin".into(), json!(identity.key().to_string()));
    d.insert("seq".into(), json!(seq));
    d.insert("ts".into(), json!(wire::time::format_ms(now_ms)));
    let texts = [
        ("name", &inputs.name),
        ("about", &inputs.about),
        ("version", &inputs.version),
        ("harness", &inputs.harness),
        ("model", &inputs.model),
        ("host", &inputs.host),
    ];
    for (k, v) in texts {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            d.insert(k.into(), json!(clip(v)));
        }
    }
    if let Some(a) = inputs.active_ms {
        let rounded = a - a % ACTIVE_GRANULARITY_MS;
        d.insert("active".into(), json!(wire::time::format_ms(rounded)));
    }
    d.insert("waiting".into(), json!(waiting(&inputs.threads)));
    let circuits: Vec<&String> = inputs
        .circuits
        .iter()
        .filter(|c| c.len() <= MAX_CIRCUIT_LEN)
        .take(MAX_CIRCUITS)
        .collect();
    if !circuits.is_empty() {
        d.insert("circuits".into(), json!(circuits));
    }
    let peers: Vec<Value> = peers
        .iter()
        .map(|p| {
            let mut m = Map::new();
            m.insert("key".into(), json!(p.key.to_string()));
            if let Some(n) = &p.name {
                m.insert("name".into(), json!(clip(n)));
            }
            m.insert("up".into(), json!(p.up));
            if let Some(r) = p.rtt_ms {
                m.insert("rtt".into(), json!(r.min(wire::MAX_SAFE_INT)));
            }
            Value::Object(m)
        })
        .collect();
    d.insert("peers".into(), Value::Array(peers));
    let threads: Vec<Value> = threads
        .iter()
        .map(|t| {
            let mut m = Map::new();
            m.insert("th".into(), json!(clip(&t.th)));
            m.insert("peer".into(), json!(t.peer.to_string()));
            for (k, v) in [
                ("subject", &t.subject),
                ("mine", &t.mine),
                ("theirs", &t.theirs),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), json!(clip(v)));
                }
            }
            m.insert("updated".into(), json!(wire::time::format_ms(t.updated_ms)));
            m.insert("unread".into(), json!(t.unread.min(wire::MAX_SAFE_INT)));
            Value::Object(m)
        })
        .collect();
    d.insert("threads".into(), Value::Array(threads));
    d.insert(
        "outbox".into(),
        json!(inputs.outbox.min(wire::MAX_SAFE_INT)),
    );
    d.insert(
        "unread".into(),
        json!(inputs.unread.min(wire::MAX_SAFE_INT)),
    );
    let sig = sign_object(identity, &d);
    d.insert("sig".into(), json!(sig));
    d
}
