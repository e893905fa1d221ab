//! Monotonic ULID ids (protocol-notes §Envelope): strictly increasing per sender, across
//! restarts (seeded from the largest id ever sent) and clock steps.

use rand::Rng;
use ulid::Ulid;

/// Monotonic id generator. Not thread-safe by itself; the store holds it under its
/// enqueue lock so id order equals outbox order.
#[derive(Debug, Clone)]
pub struct IdGen {
    last: Option<Ulid>,
}

impl IdGen {
    /// Start after `last` (the largest id ever sent, if any).
    pub fn new(last: Option<Ulid>) -> IdGen {
        IdGen { last }
    }

    /// The next id at wall clock `now_ms` (Unix milliseconds): a fresh ULID for that
    /// millisecond with an 80-bit random part, or `last + 1` when that would not be larger
    /// (same millisecond, or the clock stepped back). When `last`'s random part is
    /// exhausted, a fresh ULID at `last`'s millisecond + 1. Never panics; the result is
    /// strictly larger than every id handed out or observed before (up to the ULID maximum,
    /// where it stays at [`Ulid::max`]).
    pub fn next_at(&mut self, now_ms: u64) -> Ulid {
        // A ULID timestamp has 48 bits.
        let now_ms = now_ms.min((1u64 << Ulid::TIME_BITS) - 1);
        let fresh = Ulid::from_parts(now_ms, random_part());
        let next = match self.last {
            Some(last) if fresh <= last => match last.increment() {
                Ok(next) => next,
                Err(_) => {
                    let ms = last.timestamp_ms().saturating_add(1);
                    if ms >= 1u64 << Ulid::TIME_BITS {
                        Ulid::max()
                    } else {
                        Ulid::from_parts(ms, random_part())
                    }
                }
            },
            _ => fresh,
        };
        self.last = Some(next);
        next
    }

    /// Make sure later ids are larger than `id` (e.g. one observed from the future).
    pub fn observe(&mut self, id: Ulid) {
        if self.last.is_none_or(|last| id > last) {
            self.last = Some(id);
        }
    }

    /// The last id handed out or observed.
    pub fn last(&self) -> Option<Ulid> {
        self.last
    }
}

/// A random 80-bit ULID random part. The top bit is left clear so that about 2^79
/// increments fit in one millisecond before the overflow path is needed.
fn random_part() -> u128 {
    let r: u128 = rand::thread_rng().gen();
    r & ((1u128 << (Ulid::RAND_BITS - 1)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increment_overflow_moves_to_next_millisecond() {
        let full = Ulid::from_parts(1000, (1u128 << Ulid::RAND_BITS) - 1);
        let mut g = IdGen::new(Some(full));
        let next = g.next_at(1000);
        assert!(next > full);
        assert_eq!(next.timestamp_ms(), 1001);
    }

    #[test]
    fn fresh_clock_gives_that_millisecond() {
        let mut g = IdGen::new(None);
        let a = g.next_at(5000);
        assert_eq!(a.timestamp_ms(), 5000);
        let b = g.next_at(6000);
        assert_eq!(b.timestamp_ms(), 6000);
        assert!(b > a);
    }

    #[test]
    fn observe_ignores_smaller_ids() {
        let big = Ulid::from_parts(9000, 5);
        let mut g = IdGen::new(Some(big));
        g.observe(Ulid::from_parts(10, 0));
        assert_eq!(g.last(), Some(big));
    }

    #[test]
    fn maximum_does_not_panic() {
        let mut g = IdGen::new(Some(Ulid::max()));
        assert_eq!(g.next_at(u64::MAX), Ulid::max());
    }
}
