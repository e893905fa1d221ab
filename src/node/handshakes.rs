//! Slots for inbound handshakes (issue 8 §4b: handshake slots could be exhausted by idle
//! sockets from one address).
//!
//! An accepted socket takes one of [`MAX_HANDSHAKES`](super::MAX_HANDSHAKES) slots from
//! accept until the peer's auth is verified (or the connection ends). On top of that
//! total, each source may hold at most [`PER_SOURCE_SHARE`] slots at once, so one address
//! that opens sockets and sends nothing can take only its share, and a peer from another
//! address always finds a free slot (the 30 s handshake timeout and the first-byte timeout
//! of [`crate::net::FIRST_BYTE_TIMEOUT`] free the flooder's slots meanwhile).
//!
//! Sources ([`crate::net::Source`]): an IPv4 address; an IPv6 /64 (one host usually holds a
//! whole /64); for a Unix socket the connecting process id (from `SO_PEERCRED`; the socket
//! is the owner's only, so a pid is the finest unit there is), or one shared "unknown
//! Unix peer" source when the kernel gives no pid.

use crate::net::Source;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Handshake slots one source may hold at once.
pub const PER_SOURCE_SHARE: usize = 16;

/// The node's handshake slots: a total and a share per source.
pub struct HandshakeSlots {
    total: Arc<Semaphore>,
    share: usize,
    held: Arc<Mutex<HashMap<Source, usize>>>,
}

/// One held slot; dropping it frees the slot and the source's share.
#[derive(Debug)]
pub struct HandshakeSlot {
    _total: OwnedSemaphorePermit,
    source: Source,
    held: Arc<Mutex<HashMap<Source, usize>>>,
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSlot {
    /// Every slot of the node is taken.
    Full,
    /// This source holds its whole share.
    SourceShare,
}

impl HandshakeSlots {
    /// `total` slots, at most `share` per source (both at least 1).
    pub fn new(total: usize, share: usize) -> HandshakeSlots {
        HandshakeSlots {
            total: Arc::new(Semaphore::new(total.max(1))),
            share: share.max(1),
            held: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Take a slot for a socket from `source`, without waiting.
    pub fn try_acquire(&self, source: Source) -> Result<HandshakeSlot, NoSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.get(&source).copied().unwrap_or(0);
        if n >= self.share {
            return Err(NoSlot::SourceShare);
        }
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| NoSlot::Full)?;
        held.insert(source, n + 1);
        Ok(HandshakeSlot {
            _total: permit,
            source,
            held: self.held.clone(),
        })
    }

    /// Slots held now by `source`.
    pub fn held_by(&self, source: &Source) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(source).copied().unwrap_or(0)
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                // The map only holds sources with slots: at most the total slot count.
                held.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn ip(last: u8) -> Source {
        Source::of_ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    #[test]
    fn one_source_takes_only_its_share_and_others_still_get_in() {
        let slots = HandshakeSlots::new(8, 3);
        let flood: Vec<_> = (0..3).map(|_| slots.try_acquire(ip(1)).unwrap()).collect();
        assert_eq!(slots.try_acquire(ip(1)).err(), Some(NoSlot::SourceShare));
        let other = slots
            .try_acquire(ip(2))
            .expect("another source gets a slot");
        drop(flood);
        assert_eq!(slots.held_by(&ip(1)), 0);
        assert!(
            slots.held.lock().unwrap().len() == 1,
            "freed sources leave the map"
        );
        drop(other);
        assert!(slots.held.lock().unwrap().is_empty());
    }

    #[test]
    fn the_total_still_bounds_many_sources() {
        let slots = HandshakeSlots::new(4, 3);
        let held: Vec<_> = (1..=4).map(|i| slots.try_acquire(ip(i)).unwrap()).collect();
        assert_eq!(slots.try_acquire(ip(9)).err(), Some(NoSlot::Full));
        // A refusal for a full node leaves no count behind.
        assert_eq!(slots.held_by(&ip(9)), 0);
        drop(held);
        assert!(slots.try_acquire(ip(9)).is_ok());
    }
}
