//! Shared by the store-backed targets (`session_lines`, `chunk_handling`,
//! `control_lines`): the no-durability mode and when to start over with a fresh store.

use awp_node::store::StoreFaults;

/// Installed on a harness's store with `Store::set_faults`: flushes and blob writes skip
/// their fsyncs (`StoreFaults::durable`). Durability is not
/// under test in these targets (the store's own tests and the crash tests cover it), and an
/// fsync per input would cap them far below 10 million executions. Nothing else changes:
/// every transaction, record and file is written and read as in the node.
pub struct NoDurability;

impl StoreFaults for NoDurability {
    fn durable(&self) -> bool {
        false
    }
}

/// A store (and its temp directory) is replaced after this many inputs (`control_lines`
/// replaces its whole node more often, see its `NODE_INPUTS`): what earlier
/// inputs stored stays for a while, as in a long-lived node, but a run of ten million
/// inputs neither fills the disk nor slows down on an ever larger database. Opening a sled
/// store (or starting a node) takes milliseconds, little against the inputs in between.
#[allow(dead_code)]
pub const FRESH_EVERY: u64 = 20_000;
