//! Looking up a received line by its sender and id (for telling a replay from a line that
//! reuses an id with other content).

use super::codec::{pkey, read_u64, unpack, LogRec, Payload};
use super::tx::{db_err, T};
use super::{Store, StoreError};
use crate::wire::PeerKey;

impl Store {
    /// The bytes (as received, without `\n`) of the content line `id` from `peer` that is
    /// on record, or None when no such line was received or its log entry was pruned.
    pub fn received_line(&self, peer: &PeerKey, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(seq) = self
            .trees
            .t(T::Received)
            .get(pkey(peer, id.as_bytes()))
            .map_err(db_err)?
        else {
            return Ok(None);
        };
        let seq = read_u64("received", &seq)?;
        let Some(v) = self
            .trees
            .t(T::Log)
            .get(super::codec::u64_be(seq))
            .map_err(db_err)?
        else {
            return Ok(None);
        };
        let (_, line): (LogRec, Payload) = unpack("log", &v)?;
        Ok(Some(line.get("log")?.to_vec()))
    }
}

/// Peers whose largest received id the dedup index keeps in memory. Past this many, one
/// entry is dropped for each new one (it is reloaded from disk when that peer sends again).
pub(super) const DEDUP_PEERS: usize = 4096;

/// The in-memory side of the permanent dedup index (`received`, protocol-notes §Threads):
/// per peer, an upper bound of the ids received from it (byte order), so that a line whose
/// id is above it is known new without a read of the `received` tree. Senders allocate ids
/// from one increasing generator, so every new line takes this path; a replay (id at or
/// below the bound) is checked on disk as before.
///
/// Invariant: an entry is never below the largest id of that peer in `received` (it is
/// raised before the lines are committed, so a failed commit leaves it too high, which
/// only costs a disk read). Entries are loaded on first use with one reverse seek of the
/// peer's key range (so opening a store reads nothing) and at most [`DEDUP_PEERS`] are kept.
#[derive(Default)]
pub(super) struct DedupIndex {
    max: std::collections::HashMap<PeerKey, Vec<u8>>,
}

impl DedupIndex {
    /// The bound for `peer` (None: nothing received from it), loaded from `received` when
    /// not in memory.
    pub(super) fn bound(
        &mut self,
        received: super::tree::Tr<'_>,
        peer: &PeerKey,
    ) -> Result<Option<&[u8]>, StoreError> {
        if !self.max.contains_key(peer) {
            let last = received
                .scan_prefix(peer.as_bytes())
                .keys()
                .next_back()
                .transpose()
                .map_err(db_err)?;
            let Some(k) = last else {
                return Ok(None);
            };
            self.insert(*peer, k[32..].to_vec());
        }
        Ok(self.max.get(peer).map(Vec::as_slice))
    }

    /// Raise `peer`'s bound to `id` (call before committing a line with that id).
    pub(super) fn raise(&mut self, peer: &PeerKey, id: &[u8]) {
        match self.max.get_mut(peer) {
            Some(m) if m.as_slice() >= id => {}
            Some(m) => {
                m.clear();
                m.extend_from_slice(id);
            }
            None => self.insert(*peer, id.to_vec()),
        }
    }

    /// Add an entry for `peer` (not in the index), dropping one first when
    /// [`DEDUP_PEERS`] are kept.
    fn insert(&mut self, peer: PeerKey, max: Vec<u8>) {
        if self.max.len() >= DEDUP_PEERS {
            if let Some(evict) = self.max.keys().next().copied() {
                self.max.remove(&evict);
            }
        }
        self.max.insert(peer, max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn key(n: u32) -> PeerKey {
        let mut seed = [0u8; 32];
        seed[..4].copy_from_slice(&n.to_be_bytes());
        Identity::from_seed(&seed).key()
    }

    #[test]
    fn dedup_bound_is_the_largest_stored_id_and_survives_eviction() {
        let dir = tempfile::TempDir::new().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let received = db.open_tree("received").unwrap();
        let (p, q) = (key(1), key(2));
        for id in ["01B", "01A", "01C"] {
            received.insert(pkey(&p, id.as_bytes()), &[0u8; 8]).unwrap();
        }
        // q's key range sorts after p's: the reverse seek must stay inside p's prefix.
        received.insert(pkey(&q, b"01Z"), &[0u8; 8]).unwrap();
        let lock = std::sync::RwLock::new(());
        let received = super::super::tree::Tr::new(&received, &lock);
        let mut idx = DedupIndex::default();
        assert_eq!(idx.bound(received, &p).unwrap(), Some(&b"01C"[..]));
        assert_eq!(idx.bound(received, &key(3)).unwrap(), None);
        idx.raise(&p, b"01B");
        assert_eq!(
            idx.bound(received, &p).unwrap(),
            Some(&b"01C"[..]),
            "never lowered"
        );
        idx.raise(&p, b"01D");
        assert_eq!(idx.bound(received, &p).unwrap(), Some(&b"01D"[..]));
        // More peers than the index keeps: p's entry is dropped at some point and reloaded
        // from disk (01C: the raise to 01D was never committed), never forgotten as empty.
        for n in 10..10 + DEDUP_PEERS as u32 + 2 {
            idx.raise(&key(n), b"01A");
        }
        assert!(idx.max.len() <= DEDUP_PEERS);
        let b = idx.bound(received, &p).unwrap().unwrap().to_vec();
        assert!(b == b"01C" || b == b"01D", "{b:?}");
        assert!(idx.max.len() <= DEDUP_PEERS);
    }
}
