//! Relay circuits, node side (spec/relay-circuits.md; the protocol is in
//! [`crate::net::circuit`]):
//!
//! - `--via RELAY` (and config `via`): a standing connection to each relay, redialed with
//!   jittered exponential backoff; each offered circuit is joined on a fresh connection
//!   and run as an ordinary inbound connection (TLS inside, hello, auth, resume).
//! - Relay mode (`awp relay`): accepted sockets are routed by ALPN, circuit connections
//!   served by [`RelayCircuits`] under the `[relay]` policy.
//! - Dialing a `relay:` address needs nothing here: `net::dial` handles it, so the dialer,
//!   reconnects, resume and the outbox work through a circuit unchanged.

use super::conn::{self, Dial};
use super::dialer::{jittered, next_backoff};
use super::Inner;
use crate::net::circuit::{self, RelayCircuits, Routed};
use crate::net::{self, Address};
use crate::store::AddressRecord;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Circuit state of a node.
pub(crate) struct Circuits {
    /// The relay side, when this node runs as a relay.
    pub relay: Option<Arc<RelayCircuits>>,
    /// Standing connections by relay address: up, and our address as the relay saw it.
    pub vias: Mutex<HashMap<String, Value>>,
}

impl Circuits {
    /// Relay side only in relay mode. Errors: a bad `[relay]` allowlist.
    pub fn new(
        relay: bool,
        tls: &net::TlsConfig,
        policy: circuit::Policy,
    ) -> Result<Circuits, String> {
        Ok(Circuits {
            relay: if relay {
                Some(RelayCircuits::new(tls, policy)?)
            } else {
                None
            },
            vias: Mutex::new(HashMap::new()),
        })
    }

    /// `awp relay status` / `awp status` fields: `circuits` (relay side) and `via`.
    pub fn status(&self) -> Value {
        let vias: Vec<Value> = self
            .vias
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        json!({
            "circuits": self.relay.as_ref().map(|r| r.status()),
            "via": vias,
        })
    }
}

/// Our circuit addresses: one per `via` relay, after the direct ones.
pub(super) fn addresses(inner: &Inner) -> Vec<Address> {
    let me = inner.identity.key();
    inner
        .settings
        .via
        .iter()
        .filter_map(|v| Address::circuit(v, me))
        .collect()
}

/// Start one standing connection per `via` relay.
pub(super) fn start(inner: &Arc<Inner>) {
    for via in inner.settings.via.clone() {
        inner.tasks.spawn(standing(inner.clone(), via));
    }
}

fn set_via(inner: &Inner, via: &Address, v: Value) {
    inner
        .circuits
        .vias
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(via.to_string(), v);
}

/// Keep a standing connection to `via`, joining the circuits offered on it.
async fn standing(inner: Arc<Inner>, via: Address) {
    let timing = inner.dial_timing;
    let mut backoff = timing.backoff_min;
    loop {
        let listened = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            r = circuit::listen(&via, &inner.tls) => r,
        };
        match listened {
            Ok(mut s) => {
                backoff = timing.backoff_min;
                let observed = s.observed.map(|a| a.to_string());
                tracing::info!(relay = %via, observed = ?observed, "standing connection to the relay is up");
                set_via(
                    &inner,
                    &via,
                    json!({"relay": via.to_string(), "up": true, "observed": observed}),
                );
                inner.emit(json!({"event":"via_up","relay":via.to_string(),"observed":observed}));
                loop {
                    let offer = tokio::select! {
                        _ = inner.shutdown.cancelled() => return,
                        o = s.next_offer() => o,
                    };
                    match offer {
                        Ok(o) => {
                            inner.tasks.spawn(join(inner.clone(), via.clone(), o));
                        }
                        Err(e) => {
                            tracing::info!(relay = %via, "standing connection to the relay ended: {e}");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::info!(relay = %via, "standing connection to the relay failed: {e}"),
        }
        set_via(&inner, &via, json!({"relay": via.to_string(), "up": false}));
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = tokio::time::sleep(jittered(backoff)) => {}
        }
        backoff = next_backoff(backoff).min(timing.backoff_max);
    }
}

/// Join an offered circuit and run it as an inbound connection (it takes a connection
/// slot like an accepted socket; none free: the offer is dropped).
async fn join(inner: Arc<Inner>, via: Address, offer: circuit::Offer) {
    let Ok(_permit) = inner.conn_limit.clone().try_acquire_owned() else {
        tracing::warn!(relay = %via, from = %offer.from, "connection limit reached: circuit offer dropped");
        return;
    };
    let deadline = tokio::time::Instant::now() + super::HANDSHAKE_TIMEOUT;
    match tokio::time::timeout_at(deadline, circuit::join(&via, &inner.tls, &offer)).await {
        Ok(Ok((c, _observed))) => {
            tracing::info!(relay = %via, from = %offer.from, "circuit joined");
            conn::run(inner, c, Dial::Inbound(None), deadline).await;
        }
        Ok(Err(e)) => tracing::info!(relay = %via, from = %offer.from, "circuit join failed: {e}"),
        Err(_) => tracing::info!(relay = %via, from = %offer.from, "circuit join timed out"),
    }
}

/// The transport handshake of an accepted socket: routed by ALPN in relay mode.
pub(super) async fn accept(inner: &Inner, inc: net::Incoming) -> Result<Routed, net::NetError> {
    match &inner.circuits.relay {
        Some(r) => r.accept(inc).await,
        None => inc.handshake().await.map(Routed::Awp),
    }
}

/// Serve a circuit connection accepted by this relay.
pub(super) async fn serve(
    inner: &Inner,
    io: circuit::BoxIo,
    key: crate::wire::PeerKey,
    remote: String,
) {
    if let Some(r) = &inner.circuits.relay {
        r.serve(io, key, remote, inner.shutdown.clone()).await;
    }
}

/// Dial order when circuits are among a peer's addresses (spec/relay-circuits.md
/// §Preference): direct addresses that worked, then circuits, then direct addresses that
/// never worked; stable otherwise. Without circuits the order is left alone.
pub(super) fn order(candidates: &mut [AddressRecord]) {
    let relay = |a: &AddressRecord| a.address.starts_with("relay:");
    if !candidates.iter().any(relay) {
        return;
    }
    candidates.sort_by_key(|a| match (relay(a), a.last_ok_ms.is_some()) {
        (false, true) => 0,
        (true, _) => 1,
        (false, false) => 2,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::AddrSource;

    fn rec(address: &str, ok: Option<u64>) -> AddressRecord {
        AddressRecord {
            peer: crate::identity::Identity::from_seed(&[9; 32]).key(),
            address: address.into(),
            source: AddrSource::Connect,
            last_ok_ms: ok,
            last_err_ms: None,
            last_err: None,
            introduced_by: None,
        }
    }

    #[test]
    fn a_direct_address_that_worked_goes_before_a_circuit() {
        let mut c = vec![
            rec("tls:10.0.0.1:1", None),
            rec("relay:tls:r:1#x/y", None),
            rec("tls:10.0.0.2:1", Some(5)),
        ];
        order(&mut c);
        let got: Vec<&str> = c.iter().map(|a| a.address.as_str()).collect();
        assert_eq!(
            got,
            ["tls:10.0.0.2:1", "relay:tls:r:1#x/y", "tls:10.0.0.1:1"]
        );
        // Without circuits nothing moves.
        let mut d = vec![rec("tls:10.0.0.1:1", None), rec("tls:10.0.0.2:1", Some(5))];
        order(&mut d);
        assert_eq!(d[0].address, "tls:10.0.0.1:1");
    }
}
