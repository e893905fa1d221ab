//! Relay circuits, node side (spec/relay-circuits.md; the protocol is in
//! [`crate::net::circuit`]):
//!
//! - `--via RELAY` (and config `via`): a standing connection to each relay, redialed with
//!   jittered exponential backoff; each offered circuit is joined on a fresh connection
//!   and run as an ordinary inbound connection (TLS inside, hello, auth, resume).
//! - Serving circuits (`awp relay`, or any node whose `[relay]` policy has
//!   `serve_circuits = true`): accepted sockets are routed by ALPN, circuit connections
//!   served by [`RelayCircuits`] under the `[relay]` policy.
//! - A peer known only by its presence document is dialed through the circuits the
//!   document lists ([`add_presence_candidates`]).
//! - Dialing a `relay:` address needs nothing here: `net::dial` handles it, so the dialer,
//!   reconnects, resume and the outbox work through a circuit unchanged.

use super::conn::{self, Dial};
use super::dialer::{jittered, next_backoff};
use super::Inner;
use crate::net::circuit::{self, RelayCircuits, Routed};
use crate::net::{self, Address};
use crate::store::{AddrSource, AddressRecord};
use crate::wire::PeerKey;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One `via` relay's standing connection, as the control socket reports it: an item of
/// the `via` array of `presence_status` (`awp relay status`), `status` and `address`
/// (`awp up`, `awp address`), `{"relay", "up", "observed"?, "error"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViaStatus {
    /// The relay's address, as configured (`tls:HOST:PORT#ed25519:KEY`).
    pub relay: String,
    /// The standing connection is up: the relay answered `circuit_ready`
    /// (spec/relay-circuits.md).
    pub up: bool,
    /// While up: our address as the relay saw it (`IP:PORT`), when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    /// While down: why the last attempt ended (absent before the first one ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ViaStatus {
    /// The standing connection to `relay` is up; the relay saw us at `observed`.
    pub fn up(relay: &Address, observed: Option<String>) -> ViaStatus {
        ViaStatus {
            relay: relay.to_string(),
            up: true,
            observed,
            error: None,
        }
    }

    /// The standing connection to `relay` is down, for the reason `error` (`None`: no
    /// attempt ended yet).
    pub fn down(relay: &Address, error: Option<String>) -> ViaStatus {
        ViaStatus {
            relay: relay.to_string(),
            up: false,
            observed: None,
            error,
        }
    }
}

/// Circuit state of a node.
pub(crate) struct Circuits {
    /// The relay side, when this node serves circuits.
    pub relay: Option<Arc<RelayCircuits>>,
    /// Standing connections by relay address: up, and our address as the relay saw it
    /// (or why it is down). A relay appears once its first attempt ended.
    pub vias: Mutex<HashMap<String, ViaStatus>>,
    /// Try the direct upgrade of circuits (on unless `NodeConfig::no_direct_upgrade`).
    pub upgrade: bool,
}

impl Circuits {
    /// Relay side only when `serve` (relay mode, or `serve_circuits`). Errors: a bad
    /// `[relay]` allowlist.
    pub fn new(
        serve: bool,
        upgrade: bool,
        tls: &net::TlsConfig,
        policy: circuit::Policy,
    ) -> Result<Circuits, String> {
        Ok(Circuits {
            relay: if serve {
                Some(RelayCircuits::new(tls, policy)?)
            } else {
                None
            },
            vias: Mutex::new(HashMap::new()),
            upgrade,
        })
    }

    /// `awp relay status` / `awp status` fields: `circuits` (relay side) and `via`.
    pub fn status(&self) -> Value {
        let vias: Vec<ViaStatus> = self
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

/// Our circuit addresses: one per `via` relay, after the direct ones (what the node is
/// configured to be reachable at; listed at start, before any relay has answered).
pub(super) fn addresses(inner: &Inner) -> Vec<Address> {
    let me = inner.identity.key();
    inner
        .settings
        .via
        .iter()
        .filter_map(|v| Address::circuit(v, me))
        .collect()
}

/// The circuit addresses to advertise in presence: one per `via` relay whose standing
/// connection is up now (the relay answered `circuit_ready`), in the order of
/// `settings.via`. A relay that is down, or that does not serve circuits, is left out: a
/// dialer would only fail on it. Presence republishes when one comes up or goes down
/// (node events `via_up`, `via_down`).
pub(super) fn live_addresses(inner: &Inner) -> Vec<Address> {
    let me = inner.identity.key();
    inner
        .settings
        .via
        .iter()
        .zip(via_report(inner))
        .filter(|(_, s)| s.up)
        .filter_map(|(v, _)| Address::circuit(v, me))
        .collect()
}

/// Our addresses as the control socket's `status` and `address` report them (`awp up`,
/// `awp address`): the direct ones, then the circuit address of each `via` relay whose
/// standing connection is up now ([`live_addresses`]). A via that is down is left out (a
/// dialer would only fail on it); [`via_report`] says which and why.
pub(super) fn reported_addresses(inner: &Inner) -> Vec<Address> {
    let mut out: Vec<Address> = inner
        .addresses()
        .into_iter()
        .filter(|a| !matches!(a, Address::Relay { .. }))
        .collect();
    out.extend(live_addresses(inner));
    out
}

/// Every configured `via` relay, in the order of `settings.via`: its standing
/// connection's state, or down without an `error` while its first attempt runs (the
/// `via` array of `status` and `address`).
pub(super) fn via_report(inner: &Inner) -> Vec<ViaStatus> {
    let vias = inner
        .circuits
        .vias
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    inner
        .settings
        .via
        .iter()
        .map(|v| {
            vias.get(&v.to_string())
                .cloned()
                .unwrap_or_else(|| ViaStatus::down(v, None))
        })
        .collect()
}

/// Start one standing connection per `via` relay, and the direct upgrade of circuits.
pub(super) fn start(inner: &Arc<Inner>) {
    for via in inner.settings.via.clone() {
        inner.tasks.spawn(standing(inner.clone(), via));
    }
    if inner.circuits.upgrade {
        inner.tasks.spawn(upgrades(inner.clone()));
    }
}

/// Watch connections come up; for each one through a circuit, try the direct upgrade.
async fn upgrades(inner: Arc<Inner>) {
    let mut events = inner.subscribe_quiet();
    loop {
        let ev = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            ev = events.recv() => ev,
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(_) => return,
        };
        if ev.get("event").and_then(Value::as_str) != Some("peer_up")
            || !ev
                .get("remote")
                .and_then(Value::as_str)
                .is_some_and(|r| r.starts_with("circuit via "))
        {
            continue;
        }
        let Some(peer) = ev
            .get("peer")
            .and_then(Value::as_str)
            .and_then(|k| crate::wire::PeerKey::parse(k).ok())
        else {
            continue;
        };
        let dialed = ev.get("dialed").and_then(Value::as_bool) == Some(true);
        if let Some(seen) = circuit::take_path(&inner.identity.key(), &peer) {
            inner
                .tasks
                .spawn(upgrade(inner.clone(), peer, dialed, seen));
        }
    }
}

/// Whether our connection to `peer` still runs through a circuit.
fn on_circuit(inner: &Inner, peer: &crate::wire::PeerKey) -> bool {
    inner
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(peer)
        .is_some_and(|c| c.remote.starts_with("circuit via "))
}

/// The direct upgrade (spec/relay-circuits.md §Direct upgrade): punch a direct TCP
/// connection between the addresses the relay observed, run a fresh TLS handshake on it
/// with the circuit's roles, and let it replace the circuit's connection (resume makes
/// the move lossless; the replaced circuit closes). On failure the circuit stays.
async fn upgrade(
    inner: Arc<Inner>,
    peer: crate::wire::PeerKey,
    dialed: bool,
    seen: circuit::Observed,
) {
    let Some(target) = seen.peer else { return };
    let tcp = tokio::select! {
        _ = inner.shutdown.cancelled() => return,
        t = circuit::punch(&seen) => t,
    };
    let Some(tcp) = tcp else {
        tracing::info!(%peer, %target, "direct upgrade failed: no direct connection; the circuit stays");
        inner.emit(json!({"event":"upgrade","peer":peer.to_string(),"ok":false,"address":target.to_string()}));
        return;
    };
    if !on_circuit(&inner, &peer) {
        return;
    }
    let deadline = tokio::time::Instant::now() + super::HANDSHAKE_TIMEOUT;
    let conn = match circuit::direct(tcp, &inner.tls, peer, dialed).await {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(%peer, %target, "direct upgrade failed: {e}; the circuit stays");
            return;
        }
    };
    tracing::info!(%peer, remote = %conn.remote, "direct upgrade: moving the session off the circuit");
    inner.emit(
        json!({"event":"upgrade","peer":peer.to_string(),"ok":true,"address":conn.remote.clone()}),
    );
    // The punched address is a NAT mapping, not a listener: not kept as the peer's address.
    let dial = if dialed {
        Dial::Punched { expected: peer }
    } else {
        Dial::Inbound(None)
    };
    conn::run(inner, conn, dial, deadline).await;
}

fn set_via(inner: &Inner, via: &Address, v: ViaStatus) {
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
        // Why this attempt ended, shown by `awp relay status` while down.
        let why = match listened {
            Ok(mut s) => {
                backoff = timing.backoff_min;
                let observed = s.observed.map(|a| a.to_string());
                tracing::info!(relay = %via, observed = ?observed, "standing connection to the relay is up");
                set_via(&inner, &via, ViaStatus::up(&via, observed.clone()));
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
                            break e.to_string();
                        }
                    }
                }
            }
            Err(e) => {
                tracing::info!(relay = %via, "standing connection to the relay failed: {e}");
                e.to_string()
            }
        };
        let was_up = inner
            .circuits
            .vias
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&via.to_string())
            .is_some_and(|s| s.up);
        set_via(&inner, &via, ViaStatus::down(&via, Some(why)));
        if was_up {
            inner.emit(json!({"event":"via_down","relay":via.to_string()}));
        }
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
    io: Box<circuit::OuterServer>,
    key: crate::wire::PeerKey,
    remote: String,
) {
    if let Some(r) = &inner.circuits.relay {
        r.serve(io, key, remote, inner.shutdown.clone()).await;
    }
}

/// Circuit addresses of `peer` published in its presence document, if one is held
/// (spec/relay-circuits.md §Presence): the document's `circuits` entries (signed by
/// `peer` itself, at most [`crate::presence::doc::MAX_CIRCUITS`] of them looked at) that
/// parse as `relay:` addresses naming `peer`. Anything else in the list is ignored.
pub(super) fn presence_addresses(inner: &Inner, peer: &PeerKey) -> Vec<String> {
    let table = inner
        .presence
        .table
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let Some(held) = table.get(peer, crate::wire::time::now_ms()) else {
        return Vec::new();
    };
    let Some(list) = held.doc.get("circuits").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut found: Vec<String> = Vec::new();
    for entry in list.iter().take(crate::presence::doc::MAX_CIRCUITS) {
        let Some(text) = entry
            .as_str()
            .filter(|t| t.len() <= crate::presence::doc::MAX_CIRCUIT_LEN)
        else {
            continue;
        };
        if let Ok(addr @ Address::Relay { peer: to, .. }) = text.parse::<Address>() {
            let addr = addr.to_string();
            if to == *peer && !found.contains(&addr) {
                found.push(addr);
            }
        }
    }
    found
}

/// Add `peer`'s [`presence_addresses`] that `candidates` lack, as never-tried addresses
/// the peer announced itself (source `hello`): a node known only by its presence
/// document is dialed (by the dialer and `connect KEY`) through its circuits.
pub(super) fn add_presence_candidates(
    inner: &Inner,
    peer: &PeerKey,
    candidates: &mut Vec<AddressRecord>,
) {
    for address in presence_addresses(inner, peer) {
        if candidates.iter().any(|c| c.address == address) {
            continue;
        }
        candidates.push(AddressRecord {
            peer: *peer,
            address,
            source: AddrSource::Hello,
            last_ok_ms: None,
            last_err_ms: None,
            last_err: None,
            introduced_by: None,
            last_heard_ms: None,
        });
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
    // Worked: succeeded, and not failed since.
    let worked = |a: &AddressRecord| {
        a.last_ok_ms
            .is_some_and(|ok| a.last_err_ms.is_none_or(|err| ok >= err))
    };
    candidates.sort_by_key(|a| match (relay(a), worked(a)) {
        (false, true) => 0,
        (true, _) => 1,
        (false, false) => 2,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(address: &str, ok: Option<u64>) -> AddressRecord {
        AddressRecord {
            peer: crate::identity::Identity::from_seed(&[9; 32]).key(),
            address: address.into(),
            source: AddrSource::Connect,
            last_ok_ms: ok,
            last_err_ms: None,
            last_err: None,
            introduced_by: None,
            last_heard_ms: None,
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
        // A direct address that failed since it last worked goes after the circuit.
        let mut e = vec![
            rec("tls:10.0.0.2:1", Some(5)),
            rec("relay:tls:r:1#x/y", None),
        ];
        e[0].last_err_ms = Some(6);
        order(&mut e);
        assert_eq!(e[0].address, "relay:tls:r:1#x/y");
        // Without circuits nothing moves.
        let mut d = vec![rec("tls:10.0.0.1:1", None), rec("tls:10.0.0.2:1", Some(5))];
        order(&mut d);
        assert_eq!(d[0].address, "tls:10.0.0.1:1");
    }

    /// The `via` items keep the control socket's field names (an interface).
    #[test]
    fn via_status_json_keeps_its_field_names() {
        let key = crate::identity::Identity::from_seed(&[7; 32]).key();
        let relay: Address = format!("tls:127.0.0.1:1#{key}").parse().unwrap();
        let up = ViaStatus::up(&relay, Some("203.0.113.7:4000".into()));
        assert_eq!(
            serde_json::to_value(&up).unwrap(),
            json!({"relay": relay.to_string(), "up": true, "observed": "203.0.113.7:4000"})
        );
        let down = ViaStatus::down(&relay, Some("refused".into()));
        assert_eq!(
            serde_json::to_value(&down).unwrap(),
            json!({"relay": relay.to_string(), "up": false, "error": "refused"})
        );
        let back: ViaStatus = serde_json::from_value(json!({"relay": "r", "up": false})).unwrap();
        assert_eq!((back.up, back.error), (false, None));
        assert!(serde_json::from_value::<ViaStatus>(json!({"up": true})).is_err());
    }
}
