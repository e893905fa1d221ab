//! Durable state in sled. This module is the only code that names sled
//! (dependency-notes: keep the database behind a narrow API).
//!
//! Trees: outbox, log (in/out, read marks), received and received_runs (dedup index),
//! seen, threads, peers, addresses, meta. Writes are not durable until [`Store::flush`];
//! callers ack or report "queued" only after it returns (protocol-notes §Threads, acks,
//! resume).

//!
//! Layout (keys → values; records are `u32 header length ‖ header JSON ‖ line bytes`):
//! - `outbox`: peer (32 raw bytes) ‖ id → thread, kind, out-log seq, and the encoded line
//!   only for chunk lines (and records written before lines were stored once): any other
//!   line is the payload of its out log entry, and the record gives its length (`log_len`).
//! - `log`: seq (u64 big-endian) → direction, peer, id, thread, kind, at, read, acked, line.
//!   `log_acked`: seq → empty, an out entry the peer acknowledged (an ack writes this mark
//!   instead of rewriting the entry; `acked` in the entry itself is from older stores and
//!   error lines).
//! - The permanent dedup index (never pruned, see `received.rs`), in two forms:
//!   `received_runs`: peer ‖ first id → run record, the ids and log seqs of one batch's
//!   lines that each came above the largest id received from that peer (which is known
//!   from memory); `received`: peer ‖ id → log seq, for a new line at or below it, and for
//!   every line stored before store format 3.
//! - `seen`: peer ‖ th → largest content id received (byte-string order).
//! - `threads`: th ‖ peer → summary (see `threads.rs`; older stores keyed by th are re-keyed
//!   on open). `peers`: peer → record. `addresses`: peer ‖ address → record.
//! - `outbox_n`: peer → number of queued lines (u64 BE; absent when zero).
//! - `outbox_b`: peer → bytes of its queued outbox records and the log lines they point at
//!   (u64 BE; absent when zero), the per-peer quota's measure ([`Store::outbox_usage`]).
//! - `meta`: `last_id`, `log_seq`, `thread_n/` ‖ peer and `seen_n/` ‖ peer (threads and
//!   seen entries per peer, see `threads.rs`), and `x/<key>` for [`Store::meta_get`] / [`Store::meta_put`].
//! - `blobs_in`, `blobs_out`: peer ‖ ref → blob records (see `blobs.rs`).
//! - `art_ws`, `art_events`, `art_dedup`, `art_hold`, `art_snap`: artifact threads
//!   (see `artifacts.rs`).
//!
//! Every mutation runs under one writer lock and commits as one multi-tree transaction of
//! ours (`tx.rs`: readers see all of it or none, and an undo record written ahead of its
//! plain sled writes lets the next open roll back what a crash cut short), so a crash
//! leaves either all or none of an operation. `undo`: that record.
//!
//! Durability: a commit also records its writes in the redo journal (`journal`, a file in
//! the database directory); a flush appends them and syncs that one file, and sled's own
//! log is synced at checkpoints. A store opened after a crash first applies the journal's
//! records that sled lacks (see `journal.rs`).

use crate::wire::{Line, PeerKey};

mod artifacts;
mod blobs;
mod codec;
mod errs;
mod faults;
pub mod files;
mod forget;
mod gate;
mod grants;
mod group;
mod imp;
mod journal;
mod outbox;
mod peers;
mod received;
#[cfg(test)]
mod tests;
mod threads;
mod tree;
mod tx;
mod undo;

mod signing;
pub use artifacts::{ArtTx, InboundHook, WsRecord, WsRole};
pub use blobs::{InBlob, InBlobState, InStatus, OutBlob, OutBlobState, Stopped};
pub use errs::{ErrRecorded, ERR_SCAN_MAX, MAX_ERR_DETAIL};
pub use faults::{free_bytes, is_disk_full, StoreFaults, DISK_RESERVE};
pub use forget::Forgotten;
pub use grants::{GrantRecord, GrantRole};
pub use imp::{Store, STORE_FORMAT};
pub use journal::journal_lsns;
pub use threads::MAX_THREADS_PER_PEER;

/// Retention of outbox lines and log entries: 7 days, in milliseconds.
pub const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

/// A storage failure. The session answers `err internal` and closes without acking.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(String),
    #[error("corrupt record in {tree}: {detail}")]
    Corrupt { tree: &'static str, detail: String },
    /// Another process (or another `Store` in this process) holds the database.
    #[error("database {dir} is locked by another process (one node per home)")]
    Locked { dir: String },
    /// An encoded line is over [`crate::wire::MAX_LINE`] bytes; nothing was queued.
    #[error("line of {len} bytes is over the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    /// A builder returned a line that cannot be queued as asked (wrong or missing id).
    #[error("bad line: {0}")]
    BadLine(String),
    /// Fewer than the write needs plus [`DISK_RESERVE`] bytes are free on the file system
    /// of the database (`free`: bytes free; `home`: the node's home, the database's parent
    /// directory). Nothing was written; see [`Store::check_space`].
    #[error("disk full: {free} bytes free in {home}")]
    DiskFull { free: u64, home: String },
    /// The database in `dir` was written by a newer build: its format number `found` is
    /// above `supported` ([`STORE_FORMAT`]). Refused before the store's trees are opened:
    /// the files are left as found, apart from sled's own recovery at open and the
    /// quarantine of crash leftovers ([`Store::open_in`]).
    #[error("database {dir} has store format {found}, newer than this build reads ({supported}): run the newer awp, or move the home aside")]
    NewerFormat {
        dir: String,
        found: u64,
        supported: u64,
    },
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
    /// Sequence number of its out log entry.
    pub seq: u64,
}

/// Result of [`Store::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Stored for the first time (log seq, ≥ 1). `New(0)`: not a content line (ack, ping,
    /// grant, unthreaded chunk/introduce, …): stored nowhere and not deduplicated.
    New(u64),
    /// Already received from this peer: re-ack, no other effect.
    Duplicate,
    /// Not stored: it would open a thread beyond the peer's bound
    /// ([`Store::set_max_threads_per_peer`], default [`MAX_THREADS_PER_PEER`]). Not acked.
    TooManyThreads,
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
    /// We sent its first line (a thread a peer opened does not make us redial that peer;
    /// see `node::dialer`).
    pub opened_by_us: bool,
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
    /// The park came from our side (`awp disconnect`), not from the peer's own `bye`: only
    /// a send or `awp connect` clears it (a presence heartbeat does not; see
    /// `node::presence`). False when not parked.
    pub parked_by_us: bool,
    /// Known only from an introduction by this peer: its name is the introducer's claim
    /// and never shadows a peer that proved its key (see [`Store::introduce`]). None once
    /// the peer completed a handshake with us.
    pub introduced_by: Option<PeerKey>,
}

/// What [`Store::introduce`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Introduced {
    /// Recorded (a new peer record and/or a new address hint).
    Added,
    /// This introducer already introduced this key: nothing changed.
    Again,
    /// The introducer is at its quota of introduced keys: nothing stored.
    OverQuota,
}

/// How [`Store::set_parked`] changes a peer's parked mark (protocol-notes §bye: a peer
/// that said bye is not redialed until new outbound traffic is queued for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Park {
    /// New outbound traffic or a handshake: clear the mark.
    Clear,
    /// The peer said bye. A peer already parked by us stays parked by us (its bye is the
    /// reply to ours).
    PeerBye,
    /// We closed the connection (`awp disconnect`).
    ByUs,
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
    /// The peer that introduced this address (source `introduce` only).
    pub introduced_by: Option<PeerKey>,
    /// When the peer last announced it in an authenticated hello, or the user last gave it
    /// to `connect` (ms).
    pub last_heard_ms: Option<u64>,
}

impl AddressRecord {
    /// When this address was last known good (ms): the later of its last successful dial
    /// and its last announcement by the peer itself (or by the user). None for a hint that
    /// never worked.
    pub fn fresh_ms(&self) -> Option<u64> {
        self.last_ok_ms.max(self.last_heard_ms)
    }

    /// Whether its last dial failed after it was last known good.
    pub fn failing(&self) -> bool {
        self.last_err_ms.is_some() && self.last_err_ms > self.fresh_ms()
    }
}

/// Most addresses kept per peer; adding one more drops the stalest (see
/// [`Store::addresses`] for the order).
pub const MAX_PEER_ADDRESSES: usize = 8;
