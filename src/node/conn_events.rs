//! Events about received lines and acks, built only for subscribers that read them.
//!
//! Some of the node's own tasks subscribe to the event stream for its rhythm, not its
//! content (presence: "a line or an ack went by"; circuits: `peer_up` only). They subscribe
//! with [`Inner::subscribe_quiet`]. While every subscriber is quiet, a connection sends a
//! small [`QUIET_LINE`] / [`QUIET_ACK`] event instead of building the full `line` event
//! (the line as a JSON value, the peer key as text, a timestamp) or the `ack` event for
//! every received line and ack: that was a few percent of the node's CPU per line with
//! nobody listening.

use super::Inner;
use crate::control::Event;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::broadcast;

/// Event name sent in place of `line` while only quiet subscribers listen (no other field).
pub(crate) const QUIET_LINE: &str = "line_quiet";
/// Event name sent in place of `ack` while only quiet subscribers listen (no other field).
pub(crate) const QUIET_ACK: &str = "ack_quiet";

/// Count of quiet subscribers, shared with their receivers (decremented on drop).
#[derive(Default)]
pub(crate) struct QuietCount(Arc<AtomicUsize>);

/// A receiver of node events that does not read `line` or `ack` content; derefs to the
/// broadcast receiver.
pub(crate) struct QuietReceiver {
    rx: broadcast::Receiver<Event>,
    count: Arc<AtomicUsize>,
}

impl std::ops::Deref for QuietReceiver {
    type Target = broadcast::Receiver<Event>;
    fn deref(&self) -> &Self::Target {
        &self.rx
    }
}

impl std::ops::DerefMut for QuietReceiver {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.rx
    }
}

impl Drop for QuietReceiver {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl QuietCount {
    /// A quiet receiver of `tx`, counted until dropped.
    pub(crate) fn subscribe(&self, tx: &broadcast::Sender<Event>) -> QuietReceiver {
        let count = self.0.clone();
        count.fetch_add(1, Ordering::Relaxed);
        QuietReceiver {
            rx: tx.subscribe(),
            count,
        }
    }

    /// Whether a receiver of `tx` that is not quiet exists (one that subscribes during
    /// the call may get the quiet form of one event).
    pub(crate) fn content_listeners(&self, tx: &broadcast::Sender<Event>) -> bool {
        tx.receiver_count() > self.0.load(Ordering::Relaxed)
    }

    /// Send the event `full()` builds when a receiver that is not quiet exists, else the
    /// bare event named `quiet` when a quiet one does, else nothing (`full` not called).
    pub(crate) fn emit_lazy(
        &self,
        tx: &broadcast::Sender<Event>,
        quiet: &str,
        full: impl FnOnce() -> Value,
    ) {
        if self.content_listeners(tx) {
            if let Value::Object(m) = full() {
                let _ = tx.send(m);
            }
        } else if tx.receiver_count() > 0 {
            let mut m = Event::new();
            m.insert("event".into(), Value::String(quiet.into()));
            let _ = tx.send(m);
        }
    }
}

impl Inner {
    /// Subscribe to node events without needing the content of `line` and `ack` events:
    /// while only such subscribers listen, those come as [`QUIET_LINE`] and [`QUIET_ACK`].
    pub(crate) fn subscribe_quiet(&self) -> QuietReceiver {
        self.quiet_events.subscribe(&self.events)
    }

    /// [`QuietCount::emit_lazy`] on the node's events.
    pub(crate) fn emit_lazy(&self, quiet: &str, full: impl FnOnce() -> Value) {
        self.quiet_events.emit_lazy(&self.events, quiet, full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn full_events_are_built_only_for_a_content_subscriber() {
        let (tx, _) = broadcast::channel::<Event>(16);
        let quiet = QuietCount::default();
        let built = std::cell::Cell::new(0);
        let full = || {
            built.set(built.get() + 1);
            json!({"event": "line", "id": "x"})
        };
        // Nobody listens: nothing built, nothing sent.
        quiet.emit_lazy(&tx, QUIET_LINE, full);
        assert_eq!(built.get(), 0);
        // Only a quiet subscriber (presence): the bare event, the line never built.
        let mut q = quiet.subscribe(&tx);
        quiet.emit_lazy(&tx, QUIET_LINE, full);
        assert_eq!(built.get(), 0);
        let ev = q.try_recv().unwrap();
        assert_eq!(ev.get("event"), Some(&json!(QUIET_LINE)));
        assert_eq!(ev.len(), 1);
        // A tail/listen subscriber joins: the full event, to both.
        let mut t = tx.subscribe();
        quiet.emit_lazy(&tx, QUIET_LINE, full);
        assert_eq!(built.get(), 1);
        assert_eq!(t.try_recv().unwrap().get("id"), Some(&json!("x")));
        assert_eq!(q.try_recv().unwrap().get("event"), Some(&json!("line")));
        // The quiet one leaves: the content subscriber alone still gets full events.
        drop(q);
        assert!(quiet.content_listeners(&tx));
        quiet.emit_lazy(&tx, QUIET_LINE, full);
        assert_eq!(built.get(), 2);
        drop(t);
        assert!(!quiet.content_listeners(&tx));
    }
}
