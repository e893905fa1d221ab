//! Redialing peers (protocol-notes §Liveness and close): the side with unacked lines or
//! open threads for a peer redials with jittered exponential backoff from 1 s, doubling to
//! a 60 s cap, never giving up; new outbound traffic wakes it. Addresses learned only from
//! the peer's `hello.addr` are tried after a 15 s grace, so the original dialer goes first.

use super::conn::{self, Dial};
use super::Inner;
use crate::net::{self, Address};
use crate::store::AddrSource;
use crate::wire::PeerKey;
use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// First backoff step.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Backoff cap.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Grace before dialing an address known only from hello.addr.
pub const HELLO_ADDR_GRACE: Duration = Duration::from_secs(15);

/// The next backoff after `current`: doubled, capped at [`BACKOFF_MAX`].
pub fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(BACKOFF_MAX)
}

/// `base` with ±20 % jitter.
pub fn jittered(base: Duration) -> Duration {
    let f: f64 = rand::thread_rng().gen_range(0.8..1.2);
    base.mul_f64(f)
}

/// Thread states after which a thread no longer keeps a connection wanted.
const TERMINAL: &[&str] = &["done", "failed", "closed"];

/// Peers we should keep a connection to: queued lines, or open threads.
pub(super) fn wanted_peers(inner: &Inner) -> Vec<PeerKey> {
    let mut out = inner.store.outbox_peers().unwrap_or_default();
    if let Ok(threads) = inner.store.threads() {
        for t in threads {
            if is_open(t.mine.as_deref(), t.theirs.as_deref()) && !out.contains(&t.peer) {
                out.push(t.peer);
            }
        }
    }
    out
}

fn is_open(mine: Option<&str>, theirs: Option<&str>) -> bool {
    let term = |s: Option<&str>| s.is_some_and(|s| TERMINAL.contains(&s));
    !(term(mine) || term(theirs))
}

fn wants(inner: &Inner, peer: &PeerKey) -> bool {
    if inner
        .store
        .peer(peer)
        .ok()
        .flatten()
        .is_some_and(|p| p.parked)
    {
        return false;
    }
    if inner.store.outbox_len(peer).unwrap_or(0) > 0 {
        return true;
    }
    inner.store.threads().is_ok_and(|ts| {
        ts.iter()
            .any(|t| t.peer == *peer && is_open(t.mine.as_deref(), t.theirs.as_deref()))
    })
}

/// Make sure a dialer task runs for `peer`, and wake it.
pub(super) fn ensure(inner: &Arc<Inner>, peer: PeerKey) {
    if inner.shutdown.is_cancelled() {
        return;
    }
    let (notify, fresh) = {
        let mut d = inner.dialers.lock().unwrap_or_else(|p| p.into_inner());
        match d.get(&peer) {
            Some(n) => (n.clone(), false),
            None => {
                let n = Arc::new(Notify::new());
                d.insert(peer, n.clone());
                (n, true)
            }
        }
    };
    if fresh {
        inner.tasks.spawn(run(inner.clone(), peer, notify));
    } else {
        notify.notify_one();
    }
}

/// A connection to `peer` ended: wake its dialer (starting one if it is wanted).
pub(super) fn disconnected(inner: &Arc<Inner>, peer: PeerKey) {
    let n = inner
        .dialers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&peer)
        .cloned();
    match n {
        Some(n) => n.notify_one(),
        None if wants(inner, &peer) => ensure(inner, peer),
        None => {}
    }
}

async fn run(inner: Arc<Inner>, peer: PeerKey, wake: Arc<Notify>) {
    let mut backoff = BACKOFF_MIN;
    let mut last_down = Instant::now();
    loop {
        if inner.shutdown.is_cancelled() {
            return;
        }
        if inner.connected(&peer) || !wants(&inner, &peer) {
            // Wait for a disconnect or new traffic (or re-check once a minute).
            tokio::select! {
                _ = inner.shutdown.cancelled() => return,
                _ = wake.notified() => {}
                _ = tokio::time::sleep(BACKOFF_MAX) => {}
            }
            if !inner.connected(&peer) {
                last_down = Instant::now();
            }
            continue;
        }
        let candidates: Vec<_> = inner
            .store
            .addresses(&peer)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.source != AddrSource::Hello || last_down.elapsed() >= HELLO_ADDR_GRACE)
            .collect();
        let mut got_up = false;
        for rec in &candidates {
            if inner.connected(&peer) || inner.shutdown.is_cancelled() {
                break;
            }
            let addr: Address = match rec.address.parse() {
                Ok(a) => a,
                Err(_) => continue,
            };
            let addr = addr.with_pin(peer);
            let deadline = tokio::time::Instant::now() + super::HANDSHAKE_TIMEOUT;
            let dialed =
                tokio::time::timeout_at(deadline, net::dial(&addr, &inner.tls, &inner.dial_opts))
                    .await;
            match dialed {
                Ok(Ok(c)) => {
                    let outcome = conn::run(
                        inner.clone(),
                        c,
                        Dial::Outbound {
                            address: rec.address.clone(),
                            expected: Some(peer),
                            source: rec.source,
                        },
                        deadline,
                    )
                    .await;
                    last_down = Instant::now();
                    if outcome.up {
                        got_up = true;
                        break;
                    }
                    let _ = inner.store.address_result(
                        &peer,
                        &rec.address,
                        Err(&outcome.reason),
                        crate::wire::time::now_ms(),
                    );
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, address = %rec.address, "dial failed: {e}");
                    let _ = inner.store.address_result(
                        &peer,
                        &rec.address,
                        Err(&e.to_string()),
                        crate::wire::time::now_ms(),
                    );
                }
                Err(_) => {
                    let _ = inner.store.address_result(
                        &peer,
                        &rec.address,
                        Err("dial timed out"),
                        crate::wire::time::now_ms(),
                    );
                }
            }
        }
        if got_up {
            backoff = BACKOFF_MIN;
        }
        let pause = if candidates.is_empty() && !got_up {
            // Nothing dialable yet (e.g. within the hello.addr grace).
            HELLO_ADDR_GRACE
                .saturating_sub(last_down.elapsed())
                .max(BACKOFF_MIN)
        } else {
            jittered(backoff)
        };
        if !got_up {
            backoff = next_backoff(backoff);
        }
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = wake.notified() => {
                // New traffic: try again soon, from the first step.
                backoff = BACKOFF_MIN;
            }
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_1s_to_a_60s_cap() {
        let mut b = BACKOFF_MIN;
        let mut seen = vec![b];
        for _ in 0..8 {
            b = next_backoff(b);
            seen.push(b);
        }
        let secs: Vec<u64> = seen.iter().map(|d| d.as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn jitter_stays_within_20_percent() {
        for _ in 0..1000 {
            let j = jittered(Duration::from_secs(10));
            assert!(
                j >= Duration::from_secs(8) && j <= Duration::from_secs(12),
                "{j:?}"
            );
        }
    }

    #[test]
    fn threads_done_on_either_side_do_not_keep_a_connection() {
        assert!(is_open(None, None));
        assert!(is_open(Some("working"), Some("waiting")));
        assert!(!is_open(Some("done"), None));
        assert!(!is_open(None, Some("failed")));
        assert!(!is_open(Some("closed"), Some("open")));
    }
}
