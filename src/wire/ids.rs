//! Monotonic ULID ids (protocol-notes §Envelope): strictly increasing per sender, across
//! restarts (seeded from the largest id ever sent) and clock steps.

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
    /// The next id at wall clock `now_ms`: a fresh ULID for that millisecond, or
    /// `last + 1` when that would not be larger.
    pub fn next_at(&mut self, now_ms: u64) -> Ulid {
        todo!("{now_ms}")
    }
    /// Make sure later ids are larger than `id` (e.g. one observed from the future).
    pub fn observe(&mut self, id: Ulid) {
        todo!("{id}")
    }
    /// The last id handed out or observed.
    pub fn last(&self) -> Option<Ulid> {
        self.last
    }
}
