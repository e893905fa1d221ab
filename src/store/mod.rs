//! Durable state in sled. This module is the only code that names sled
//! (dependency-notes: keep the database behind a narrow API).
//!
//! Trees: outbox, log (in/out, read marks), received (dedup index), seen, threads, peers,
//! addresses, meta. Writes are not durable until [`Store::flush`]; callers ack or report
//! "queued" only after it returns (protocol-notes §Threads, acks, resume).

use crate::wire::{Line, PeerKey};
use std::collections::BTreeMap;
use std::path::Path;

/// Retention of outbox lines and log entries: 7 days, in milliseconds.
pub const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

/// A storage failure. The session answers `err internal` and closes without acking.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(String),
    #[error("corrupt record in {tree}: {detail}")]
    Corrupt { tree: &'static str, detail: String },
}

/// Builds a line once its id and ts are allocated (inside the enqueue transaction).
/// Arguments: id (26-char ULID), ts (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
pub type LineBuilder<'a> = &'a (dyn Fn(&str, &str) -> Line + Sync);

/// One queued outbound line.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    pub id: String,
    pub th: Option<String>,
    /// The line's `t`.
    pub kind: String,
    /// Encoded line without `\n`.
    pub line: Vec<u8>,
}

/// Result of [`Store::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Stored for the first time (log seq).
    New(u64),
    /// Already received from this peer: re-ack, no other effect.
    Duplicate,
}

/// Direction of a log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    In,
    Out,
}

/// A message-log entry (msg, state, and other content lines, both directions).
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    /// Local, strictly increasing sequence number (the tail cursor).
    pub seq: u64,
    pub dir: Dir,
    pub peer: PeerKey,
    pub id: String,
    pub th: Option<String>,
    pub kind: String,
    /// Encoded line without `\n` (as received for inbound).
    pub line: Vec<u8>,
    /// Local time stored, Unix ms.
    pub at_ms: u64,
    /// Inbound: read mark. Outbound: always true.
    pub read: bool,
    /// Outbound: acked by the peer. Inbound: always true.
    pub acked: bool,
}

/// A thread's summary.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadInfo {
    pub th: String,
    pub peer: PeerKey,
    pub subject: Option<String>,
    /// My state and note, their state and note.
    pub mine: Option<String>,
    pub my_note: Option<String>,
    pub theirs: Option<String>,
    pub their_note: Option<String>,
    /// Created, Unix ms.
    pub since_ms: u64,
    /// Last line either way, Unix ms.
    pub updated_ms: u64,
    /// Unread inbound entries.
    pub unread: u64,
}

/// A known peer.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerRecord {
    pub key: PeerKey,
    pub name: Option<String>,
    pub about: Option<String>,
    pub caps: Vec<String>,
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    /// Said bye: not redialed until new outbound traffic is queued.
    pub parked: bool,
}

/// Where an address came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddrSource {
    Connect,
    Hello,
    Introduce,
}

/// A dialable address of a peer with its history.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressRecord {
    pub peer: PeerKey,
    pub address: String,
    pub source: AddrSource,
    pub last_ok_ms: Option<u64>,
    pub last_err_ms: Option<u64>,
    pub last_err: Option<String>,
}

/// The node's database.
pub struct Store {}

impl Store {
    /// Open (or create) the database in `dir`. Fails at once if another process holds it.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        todo!("{dir:?}")
    }
    /// Make every write so far durable. Concurrent callers share one fsync (group commit).
    pub async fn flush(&self) -> Result<(), StoreError> {
        todo!()
    }
    /// Allocate ids and queue `builders`' lines for `peer` in ONE transaction (outbox, out
    /// log, thread subject/my state, last id). Ids strictly increase in call order.
    pub fn enqueue(
        &self,
        peer: &PeerKey,
        builders: &[LineBuilder<'_>],
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        todo!("{peer:?}{}", builders.len())
    }
    /// Up to `limit` outbox lines for `peer` with id > `after` (all when None), in id order.
    pub fn outbox_after(
        &self,
        peer: &PeerKey,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        todo!("{peer:?}{after:?}{limit}")
    }
    /// Number of queued lines for `peer`.
    pub fn outbox_len(&self, peer: &PeerKey) -> Result<u64, StoreError> {
        todo!("{peer:?}")
    }
    /// Peers with at least one queued line.
    pub fn outbox_peers(&self) -> Result<Vec<PeerKey>, StoreError> {
        todo!()
    }
    /// On the peer's resume: drop lines with id <= seen[th] for each listed thread.
    /// Returns how many were dropped.
    pub fn drop_seen(
        &self,
        peer: &PeerKey,
        seen: &BTreeMap<String, String>,
    ) -> Result<usize, StoreError> {
        todo!("{peer:?}{seen:?}")
    }
    /// An ack from `peer` for `re` in `th`: remove it from the outbox, mark the out log
    /// entry acked, and (cumulative ack) remove earlier never-acked lines of that thread
    /// (chunk, introduce). Returns true when `re` was in the outbox.
    pub fn ack(&self, peer: &PeerKey, th: &str, re: &str) -> Result<bool, StoreError> {
        todo!("{peer:?}{th}{re}")
    }
    /// Store an inbound content line (msg, state, mirror, private, threaded chunk/introduce)
    /// from `peer`: dedup by (peer, id) permanently; when new, log it (unread), raise
    /// seen[peer][th] and update the thread — one transaction.
    pub fn receive(&self, peer: &PeerKey, line: &Line, raw: &[u8]) -> Result<Received, StoreError> {
        todo!("{peer:?}{line:?}{raw:?}")
    }
    /// seen for `peer`: thread → largest content id received (our resume).
    pub fn seen(&self, peer: &PeerKey) -> Result<BTreeMap<String, String>, StoreError> {
        todo!("{peer:?}")
    }
    /// All threads, most recently updated first.
    pub fn threads(&self) -> Result<Vec<ThreadInfo>, StoreError> {
        todo!()
    }
    /// One thread.
    pub fn thread(&self, th: &str) -> Result<Option<ThreadInfo>, StoreError> {
        todo!("{th}")
    }
    /// Log entries with seq > `after`, optionally of one thread / only unread inbound, in
    /// seq order, at most `limit`.
    pub fn log(
        &self,
        after: u64,
        th: Option<&str>,
        unread_only: bool,
        limit: usize,
    ) -> Result<Vec<LogEntry>, StoreError> {
        todo!("{after}{th:?}{unread_only}{limit}")
    }
    /// Mark inbound entries read by seq. Returns how many changed.
    pub fn mark_read(&self, seqs: &[u64]) -> Result<usize, StoreError> {
        todo!("{seqs:?}")
    }
    /// Record a peer seen in a handshake (upsert name, about, caps, last seen; clears parked).
    pub fn peer_seen(
        &self,
        key: &PeerKey,
        name: Option<&str>,
        about: Option<&str>,
        caps: &[String],
        now_ms: u64,
    ) -> Result<(), StoreError> {
        todo!("{key:?}{name:?}{about:?}{caps:?}{now_ms}")
    }
    /// One peer.
    pub fn peer(&self, key: &PeerKey) -> Result<Option<PeerRecord>, StoreError> {
        todo!("{key:?}")
    }
    /// All known peers.
    pub fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        todo!()
    }
    /// Set or clear the parked mark (bye received / new traffic queued).
    pub fn set_parked(&self, key: &PeerKey, parked: bool) -> Result<(), StoreError> {
        todo!("{key:?}{parked}")
    }
    /// Remember an address for `peer` (keeps the first source unless upgraded to connect).
    pub fn add_address(
        &self,
        peer: &PeerKey,
        address: &str,
        source: AddrSource,
    ) -> Result<(), StoreError> {
        todo!("{peer:?}{address}{source:?}")
    }
    /// Record a dial result for an address.
    pub fn address_result(
        &self,
        peer: &PeerKey,
        address: &str,
        result: Result<(), &str>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        todo!("{peer:?}{address}{result:?}{now_ms}")
    }
    /// Known addresses of `peer`, best first (connect, last ok most recent).
    pub fn addresses(&self, peer: &PeerKey) -> Result<Vec<AddressRecord>, StoreError> {
        todo!("{peer:?}")
    }
    /// Drop outbox lines and log entries older than [`RETENTION_MS`] at `now_ms`.
    pub fn prune(&self, now_ms: u64) -> Result<usize, StoreError> {
        todo!("{now_ms}")
    }
    /// Largest id ever allocated.
    pub fn last_id(&self) -> Result<Option<String>, StoreError> {
        todo!()
    }
    /// A fresh id for a control line (hello, auth, resume, ack, ping, pong, bye, err) from
    /// the same monotonic generator as queued lines; not persisted by itself.
    pub fn next_control_id(&self) -> String {
        todo!()
    }
}
