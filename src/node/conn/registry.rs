//! The node's table of live connections, as one connection sees it: registering an
//! authenticated connection as its peer's one connection (replacement and the
//! simultaneous-open tie break, protocol-notes §Threads, acks, resume), marking it up,
//! removing it, and recording what the peer's hello told about it.

use super::Handles;
use crate::net;
use crate::node::{ConnEntry, Inner, SIMULTANEOUS_OPEN};
use crate::store::AddrSource;
use crate::wire::{self, PeerKey};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Register the authenticated connection as the one for `key`. Returns false when a
/// simultaneous open is decided against it (then it closes without an err).
pub(super) async fn register(
    inner: &Arc<Inner>,
    key: PeerKey,
    conn_id: u64,
    dialed: bool,
    remote: &str,
    handles: &Handles,
    presence: bool,
) -> bool {
    let me = inner.identity.key();
    let old = {
        let mut conns = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = conns.get(&key) {
            if old.since.elapsed() < SIMULTANEOUS_OPEN && old.dialed != dialed {
                // Keep the connection dialed by the smaller key (raw bytes).
                let dialer_of_new = if dialed { me } else { key };
                if dialer_of_new != me.min(key) {
                    tracing::info!(peer = %key, "simultaneous open: keeping the other connection");
                    return false;
                }
            }
        }
        let entry = ConnEntry {
            conn_id,
            dialed,
            since: Instant::now(),
            up: false,
            remote: remote.to_string(),
            handles: handles.clone(),
            presence,
        };
        conns.insert(key, entry)
    };
    if let Some(old) = old {
        // Stop reading the old connection before processing the new one's resume.
        old.handles.stop();
        let _ = tokio::time::timeout(Duration::from_secs(3), old.handles.closed()).await;
    }
    true
}

pub(super) fn set_up(inner: &Inner, key: &PeerKey) {
    if let Some(c) = inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(key)
    {
        c.up = true;
    }
}

pub(super) fn unregister(inner: &Arc<Inner>, key: PeerKey, conn_id: u64, reason: &str) {
    let removed = {
        let mut conns = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
        if conns.get(&key).is_some_and(|c| c.conn_id == conn_id) {
            conns.remove(&key);
            true
        } else {
            false
        }
    };
    if removed {
        inner.emit(json!({
            "event": "peer_down",
            "peer": key.to_string(),
            "peer_name": inner.peer_name(&key),
            "reason": reason,
        }));
        crate::node::dialer::disconnected(inner, key);
    }
}

pub(super) fn on_authenticated(
    inner: &Inner,
    key: PeerKey,
    hello: &wire::Hello,
    dial_addr: Option<&(String, AddrSource)>,
) {
    let now = wire::time::now_ms();
    // Peers choose these texts: keep them short enough to list and show.
    let name = hello.name.as_deref().map(|n| crate::blob::cut(n, MAX_NAME));
    let about = hello
        .about
        .as_deref()
        .map(|a| crate::blob::cut(a, MAX_ABOUT));
    let caps: Vec<String> = hello
        .caps
        .iter()
        .take(MAX_CAPS)
        .map(|c| crate::blob::cut(c, MAX_NAME).to_string())
        .collect();
    if let Err(e) = inner.store.peer_seen(&key, name, about, &caps, now) {
        tracing::warn!("store peer {key}: {e}");
    }
    if let Some((addr, source)) = dial_addr {
        let _ = inner.store.add_address(&key, addr, *source);
    }
    // hello.addr: a hint for dialing back. Only a TLS address, pinned to the key that just
    // proved itself, is kept: a plaintext or unix address named by a stranger would make
    // this node connect wherever that stranger says.
    if let Some(a) = &hello.addr {
        match a.parse::<net::Address>() {
            Ok(addr @ (net::Address::Tls { .. } | net::Address::Relay { .. }))
                if addr.pin().is_none_or(|p| p == key) =>
            {
                let pinned = addr.with_pin(key).to_string();
                let _ = inner.store.add_address(&key, &pinned, AddrSource::Hello);
            }
            _ => {
                tracing::debug!(peer = %key, addr = %a, "ignoring hello.addr that is not a tls: address for this key")
            }
        }
    }
}

/// Longest peer name (and capability name) kept, in bytes.
pub(super) const MAX_NAME: usize = 256;
/// Longest peer `about` kept, in bytes.
const MAX_ABOUT: usize = 1024;
/// Most capabilities kept from a hello.
const MAX_CAPS: usize = 64;
