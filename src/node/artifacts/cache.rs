//! The in-memory workspaces of a node: a least-recently-used cache bounded by count and by
//! estimated bytes. A workspace that is not here is rebuilt from the store (snapshot + the
//! events after it), so eviction costs a reload, never data.
//!
//! The byte size of a workspace is an estimate: the JSON size of the snapshot it was
//! rebuilt from plus the JSON size of every event applied since (the state grows with the
//! events that build it). Measuring the state itself would mean serialising it per
//! command, which is what the cache is there to avoid.

use crate::artifact::Workspace;
use std::collections::HashMap;

/// Most workspaces kept in memory per node.
pub(crate) const MAX_CACHED: usize = 64;
/// Most estimated bytes of workspaces kept in memory per node (64 MiB). One workspace
/// bigger than this is not kept at all (it is rebuilt for each use).
pub(crate) const MAX_CACHED_BYTES: usize = 64 << 20;

struct Entry {
    ws: Workspace,
    bytes: usize,
    used: u64,
}

/// Workspaces by thread id, least recently used evicted first.
pub(crate) struct WsCache {
    map: HashMap<String, Entry>,
    bytes: usize,
    tick: u64,
    max_count: usize,
    max_bytes: usize,
}

impl WsCache {
    /// An empty cache holding at most `max_count` workspaces and `max_bytes` bytes.
    pub(crate) fn new(max_count: usize, max_bytes: usize) -> WsCache {
        WsCache {
            map: HashMap::new(),
            bytes: 0,
            tick: 0,
            max_count,
            max_bytes,
        }
    }

    /// Take the workspace of `th` out (it is put back with [`WsCache::put`] after use):
    /// the workspace and its estimated bytes.
    pub(crate) fn take(&mut self, th: &str) -> Option<(Workspace, usize)> {
        let e = self.map.remove(th)?;
        self.bytes -= e.bytes;
        Some((e.ws, e.bytes))
    }

    /// Keep `ws` (estimated `bytes`) as the most recently used, evicting the least
    /// recently used ones until both bounds hold.
    pub(crate) fn put(&mut self, ws: Workspace, bytes: usize) {
        let th = ws.state.workspace_id.clone();
        if let Some(old) = self.map.remove(&th) {
            self.bytes -= old.bytes;
        }
        if bytes > self.max_bytes || self.max_count == 0 {
            return;
        }
        while !self.map.is_empty()
            && (self.map.len() >= self.max_count || self.bytes + bytes > self.max_bytes)
        {
            // At most `max_count` entries: a scan is cheap and needs no second index.
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.map.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
        self.tick += 1;
        self.bytes += bytes;
        self.map.insert(
            th,
            Entry {
                ws,
                bytes,
                used: self.tick,
            },
        );
    }

    /// Workspaces cached now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Estimated bytes cached now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether `th` is cached.
    #[cfg(test)]
    pub(crate) fn contains(&self, th: &str) -> bool {
        self.map.contains_key(th)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(th: &str) -> Workspace {
        Workspace::new(th)
    }

    #[test]
    fn least_recently_used_goes_first_when_the_count_is_full() {
        let mut c = WsCache::new(3, 1 << 20);
        for th in ["a", "b", "c"] {
            c.put(ws(th), 10);
        }
        // Use "a" again: "b" is now the least recently used.
        let (a, n) = c.take("a").unwrap();
        c.put(a, n);
        c.put(ws("d"), 10);
        assert_eq!(c.len(), 3);
        assert!(!c.contains("b"), "the least recently used is evicted");
        for th in ["a", "c", "d"] {
            assert!(c.contains(th), "{th} stays");
        }
        assert_eq!(c.bytes(), 30);
    }

    #[test]
    fn bytes_are_bounded_and_an_oversized_workspace_is_not_kept() {
        let mut c = WsCache::new(100, 100);
        c.put(ws("a"), 40);
        c.put(ws("b"), 40);
        c.put(ws("c"), 40);
        assert!(!c.contains("a"), "evicted for bytes");
        assert_eq!((c.len(), c.bytes()), (2, 80));
        c.put(ws("huge"), 101);
        assert!(!c.contains("huge"));
        assert_eq!((c.len(), c.bytes()), (2, 80), "nothing evicted for it");
        // Replacing an entry counts its bytes once.
        c.put(ws("b"), 50);
        assert_eq!((c.len(), c.bytes()), (2, 90));
        assert_eq!(c.take("b").map(|(_, n)| n), Some(50));
        assert_eq!((c.len(), c.bytes()), (1, 40));
        assert!(c.take("b").is_none());
    }

    #[test]
    fn many_workspaces_stay_within_both_bounds() {
        let mut c = WsCache::new(MAX_CACHED, MAX_CACHED_BYTES);
        for i in 0..(MAX_CACHED * 4) {
            c.put(ws(&format!("thr_{i}")), MAX_CACHED_BYTES / 50);
            assert!(c.len() <= MAX_CACHED);
            assert!(c.bytes() <= MAX_CACHED_BYTES);
        }
        assert_eq!(c.len(), 50, "the byte bound is the tighter one here");
        assert!(c.contains(&format!("thr_{}", MAX_CACHED * 4 - 1)));
    }
}
