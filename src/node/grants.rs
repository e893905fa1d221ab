//! Grants at the node (protocol-notes §Grants): storing what peers present, the honoring
//! rules applied with this node's trust list and revocations, admission under an
//! allowlist, and sending our issued grants after every resume.
//!
//! Cost bounds (a peer, or many keys of one attacker, must not make every handshake
//! slower): held grants are capped per issuer ([`MAX_HELD_PER_ISSUER`]) and in total
//! ([`MAX_HELD`]), presented grants per subject ([`MAX_PRESENTED_PER_SUB`]) and in total
//! ([`MAX_PRESENTED`]); lookups go through the store's index by `sub`, `iss` and role; and
//! each grant's signature is checked once ([`crate::grant::VerifyCache`]).

use super::Inner;
use crate::config::Accept;
use crate::grant::{self, GrantError, Policy, Verified};
use crate::store::{AddrSource, GrantRecord, GrantRole, Introduced};
use crate::wire::{self, Line, PeerKey};
use serde_json::json;
use std::sync::Arc;

/// Most grants taken from one auth or grant line.
pub const MAX_GRANTS_PER_LINE: usize = 32;

/// Most grants held (issued to us) per issuer; older ones are replaced.
pub const MAX_HELD_PER_ISSUER: usize = 16;

/// Most grants held (issued to us) in all, across issuers; the oldest held grant makes
/// room for a new one.
pub const MAX_HELD: usize = 256;

/// Most grants presented by (issued to) one peer that we keep; older ones are replaced.
pub const MAX_PRESENTED_PER_SUB: usize = 16;

/// Most presented grants kept in all, across peers; the oldest makes room.
pub const MAX_PRESENTED: usize = 1024;

/// Verify `obj` through the node's cache (one signature check per grant).
fn verify(
    inner: &Inner,
    obj: &serde_json::Map<String, serde_json::Value>,
) -> Result<Arc<Verified>, GrantError> {
    inner
        .grant_cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .verify(obj)
}

/// A stored grant record, verified through the cache (its signature is checked once
/// while it stays cached; `awp grants` lists pages of them).
pub(super) fn verify_stored(inner: &Inner, rec: &GrantRecord) -> Result<Arc<Verified>, GrantError> {
    inner
        .grant_cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .verify_named(&rec.hash, &rec.object)
}

/// Stored records that verify (records that no longer verify are skipped), through the
/// cache.
fn verified(inner: &Inner, recs: Vec<GrantRecord>) -> Vec<(GrantRecord, Arc<Verified>)> {
    recs.into_iter()
        .filter_map(|r| {
            let v = verify_stored(inner, &r).ok()?;
            Some((r, v))
        })
        .collect()
}

/// Verify and store grants that `from` presented (auth.grants or a grant line). Refused
/// grants (forged, weak keys, expired, for a third party) are logged and dropped, never
/// honored. Only what is useful is kept, so a stranger cannot fill the store: a presented
/// grant only when it is honored now (at most [`MAX_PRESENTED_PER_SUB`] per peer and
/// [`MAX_PRESENTED`] in all); a grant issued to us only when its issuer sent it (directly
/// or in an introduction), at most [`MAX_HELD_PER_ISSUER`] per issuer and [`MAX_HELD`] in
/// all.
pub(super) fn on_received(inner: &Inner, from: &PeerKey, grants: Vec<wire::Grant>) {
    let me = inner.identity.key();
    let now = wire::time::now_ms();
    for g in grants.into_iter().take(MAX_GRANTS_PER_LINE) {
        let obj = grant::object_of(&g);
        let v = match verify(inner, &obj) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(peer = %from, "refused a grant: {e}");
                continue;
            }
        };
        if v.expired_at(now) {
            let e = GrantError::Expired { exp: v.exp.clone() };
            tracing::warn!(peer = %from, hash = %v.hash, "refused a grant: {e}");
            continue;
        }
        let role = if v.sub == me {
            if v.iss != *from {
                tracing::warn!(peer = %from, hash = %v.hash, "refused a grant to us that its sender did not issue");
                continue;
            }
            GrantRole::Held
        } else if v.sub == *from {
            if v.iss == me {
                // One of ours coming back: we already hold it as issued.
                continue;
            }
            GrantRole::Presented
        } else {
            tracing::warn!(peer = %from, hash = %v.hash, "refused a grant whose subject is neither us nor the sender");
            continue;
        };
        if role == GrantRole::Presented {
            match honor(inner, &v, now) {
                Ok(caps) => tracing::info!(peer = %from, hash = %v.hash, ?caps, "grant honored"),
                Err(e) => {
                    tracing::warn!(peer = %from, hash = %v.hash, "grant not honored: {e}");
                    continue;
                }
            }
        }
        if inner.store.grant(&v.hash).ok().flatten().is_some() {
            // Already kept (peers present their grants at every handshake).
            continue;
        }
        if role == GrantRole::Held {
            tracing::info!(peer = %from, hash = %v.hash, caps = ?v.caps, "holding a grant issued to us");
            let mine = inner.store.grants_by_iss(&v.iss).unwrap_or_default();
            make_room(inner, mine, role, MAX_HELD_PER_ISSUER);
        } else {
            let theirs = inner.store.grants_by_sub(&v.sub).unwrap_or_default();
            make_room(inner, theirs, role, MAX_PRESENTED_PER_SUB);
        }
        let total = if role == GrantRole::Held {
            MAX_HELD
        } else {
            MAX_PRESENTED
        };
        let ages = inner.store.grant_ages(role).unwrap_or_default();
        evict_oldest(inner, ages, total);
        let rec = GrantRecord {
            hash: v.hash.clone(),
            role,
            from: Some(*from),
            object: v.object.clone(),
            stored_ms: now,
        };
        if let Err(e) = inner.store.grant_put(&rec) {
            tracing::warn!("storing a grant: {e}");
            continue;
        }
        inner.emit(json!({
            "event": "grant",
            "role": match role { GrantRole::Held => "held", _ => "presented" },
            "peer": from.to_string(),
            "peer_name": inner.peer_name(from),
            "hash": v.hash,
            "iss": v.iss.to_string(),
            "sub": v.sub.to_string(),
            "caps": v.caps,
            "exp": v.exp,
        }));
    }
}

/// Remove the oldest records of `role` among `recs` so that one more fits under `max`.
fn make_room(inner: &Inner, recs: Vec<GrantRecord>, role: GrantRole, max: usize) {
    let of_role: Vec<(u64, String)> = recs
        .into_iter()
        .filter(|r| r.role == role)
        .map(|r| (r.stored_ms, r.hash))
        .collect();
    evict_oldest(inner, of_role, max);
}

/// Remove the oldest of `ages` (`(stored_ms, hash)`) so that one more fits under `max`.
fn evict_oldest(inner: &Inner, mut ages: Vec<(u64, String)>, max: usize) {
    if ages.len() < max {
        return;
    }
    ages.sort();
    let excess = ages.len() + 1 - max;
    for (_, h) in ages.into_iter().take(excess) {
        let _ = inner.store.grant_remove(&h);
        inner
            .grant_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget(&h);
    }
}

/// The honoring rules with this node's trust list, revocations and stored introduce grants.
pub(super) fn honor(inner: &Inner, g: &Verified, now_ms: u64) -> Result<Vec<String>, GrantError> {
    // The introduce grants of an issuer: those whose subject is it (index lookup).
    let intros = |k: &PeerKey| -> Vec<Verified> {
        let recs = inner.store.grants_by_sub(k).unwrap_or_default();
        verified(inner, recs)
            .into_iter()
            .map(|(_, v)| (*v).clone())
            .collect()
    };
    let revoked = |h: &str| inner.store.grant_revoked(h).unwrap_or(true);
    let policy = Policy {
        me: inner.identity.key(),
        trust: &inner.settings.trust,
        revoked: &revoked,
        introduce_grants_of: &intros,
    };
    grant::honored_caps(g, &policy, now_ms)
}

/// The capabilities `peer` holds here now: the union over honored grants whose subject is
/// `peer`.
pub(crate) fn honored_caps(inner: &Inner, peer: &PeerKey) -> Vec<String> {
    let now = wire::time::now_ms();
    let recs = inner.store.grants_by_sub(peer).unwrap_or_default();
    let mut caps: Vec<String> = Vec::new();
    for (_, v) in verified(inner, recs) {
        if let Ok(cs) = honor(inner, &v, now) {
            for c in cs {
                if !caps.contains(&c) {
                    caps.push(c);
                }
            }
        }
    }
    caps
}

/// Admission after auth (protocol-notes §Handshake). Under `accept = "allowlist"` a key is
/// admitted if it is allowed, trusted, was dialed by us (now or before), or holds an
/// honored grant — stored, or `presented` in this handshake's auth (those are stored only
/// once the peer is admitted). Returns the refusal detail otherwise.
pub(super) fn admit(
    inner: &Inner,
    peer: &PeerKey,
    dialed: bool,
    presented: &[wire::Grant],
) -> Result<(), String> {
    let s = &inner.settings;
    if s.accept == Accept::Any || dialed || s.allow.contains(peer) || s.trust.contains(peer) {
        return Ok(());
    }
    let dialed_before = inner
        .store
        .addresses(peer)
        .unwrap_or_default()
        .iter()
        .any(|a| a.source == AddrSource::Connect && a.last_ok_ms.is_some());
    if dialed_before || !honored_caps(inner, peer).is_empty() {
        return Ok(());
    }
    let now = wire::time::now_ms();
    let honored_now = presented.iter().take(MAX_GRANTS_PER_LINE).any(|g| {
        verify(inner, &grant::object_of(g))
            .ok()
            .filter(|v| v.sub == *peer)
            .is_some_and(|v| honor(inner, &v, now).is_ok_and(|c| !c.is_empty()))
    });
    if honored_now {
        return Ok(());
    }
    Err("this node admits only allowed keys; ask its operator for a grant or an allow entry".into())
}

/// `grant` lines (encoded) for the valid grants we issued to `peer`, sent after every
/// resume (grant lines are not acked).
pub(super) fn issued_lines(inner: &Inner, peer: &PeerKey) -> Vec<Vec<u8>> {
    let now = wire::time::now_ms();
    let mut out = Vec::new();
    let recs = inner.store.grants_by_sub(peer).unwrap_or_default();
    for (rec, v) in verified(inner, recs) {
        if rec.role != GrantRole::Issued || v.sub != *peer || v.expired_at(now) {
            continue;
        }
        if inner.store.grant_revoked(&rec.hash).unwrap_or(true) {
            continue;
        }
        let Ok(g) = v.to_wire() else { continue };
        let line = Line::Grant(wire::GrantMsg {
            id: inner.store.next_control_id(),
            ts: wire::time::format_ms(now),
            grant: g,
        });
        out.push(line.encode());
    }
    out
}

/// Grants issued to us that we may present in `auth.grants`: valid now (at most
/// [`MAX_HELD`]). The session keeps only those meant for the peer (its `aud`, or issued by
/// it) once the peer is known.
pub(crate) fn held_for_auth(inner: &Inner) -> Vec<wire::Grant> {
    let now = wire::time::now_ms();
    let recs = inner
        .store
        .grants_by_role(GrantRole::Held)
        .unwrap_or_default();
    verified(inner, recs)
        .into_iter()
        .filter(|(r, v)| r.role == GrantRole::Held && !v.expired_at(now))
        .filter_map(|(_, v)| v.to_wire().ok())
        .collect()
}

/// Most distinct keys one peer may introduce to this node (their records, addresses and
/// grants); further introductions from it are dropped.
pub const MAX_INTRODUCED_PER_INTRODUCER: usize = 64;

/// An `introduce` from `from` (protocol-notes §Grants, 10.4): remember the introduced
/// peer's name and its `tls:` address (pinned to its key; source `introduce`) so that
/// `awp connect <name>` works, and hold the grant (sub = us, aud = the introduced peer) to
/// present when we connect to it.
///
/// Anyone admitted may introduce, so what an introduction says is a hint scoped to its
/// introducer (see [`crate::store::Store::introduce`]): it never changes the record of a
/// known peer, its name never shadows a peer that proved its key (`resolve_peer`), its
/// address sorts after every address that worked, and each introducer is held to
/// [`MAX_INTRODUCED_PER_INTRODUCER`] keys.
pub(super) fn on_introduce(inner: &Inner, from: &PeerKey, i: wire::Introduce) {
    let Ok(key) = PeerKey::parse(&i.peer.key) else {
        tracing::warn!(peer = %from, "introduce with an unusable key");
        return;
    };
    if key == inner.identity.key() || key == *from {
        return;
    }
    let name = i.peer.name.as_deref().map(|n| crate::blob::cut(n, 256));
    let address = i
        .peer
        .address
        .as_deref()
        .and_then(|a| match a.parse::<crate::net::Address>() {
            Ok(addr @ (crate::net::Address::Tls { .. } | crate::net::Address::Relay { .. }))
                if addr.pin().is_none_or(|p| p == key) =>
            {
                Some(addr.with_pin(key).to_string())
            }
            _ => {
                tracing::debug!(peer = %from, "ignoring an introduced address that is not tls: for that key");
                None
            }
        });
    let outcome = inner.store.introduce(
        from,
        &key,
        name,
        address.as_deref(),
        MAX_INTRODUCED_PER_INTRODUCER,
        wire::time::now_ms(),
    );
    match outcome {
        Ok(Introduced::Added) => inner.emit(json!({
            "event": "introduced",
            "by": from.to_string(),
            "by_name": inner.peer_name(from),
            "peer": key.to_string(),
            "peer_name": name.map(crate::control::shown),
            "address": address,
            "th": i.th,
            "grant": i.grant.is_some(),
        })),
        Ok(Introduced::Again) => {}
        Ok(Introduced::OverQuota) => {
            tracing::warn!(introducer = %from, peer = %key, max = MAX_INTRODUCED_PER_INTRODUCER, "introduction dropped: the introducer is at its quota");
            return;
        }
        Err(e) => {
            tracing::warn!(introducer = %from, "storing an introduction: {e}");
            return;
        }
    }
    if let Some(g) = i.grant {
        on_received(inner, from, vec![g]);
    }
    tracing::info!(introducer = %from, peer = %key, name = ?name, "introduced");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::node::{NodeConfig, NodeHandle};

    async fn node(home: &std::path::Path) -> NodeHandle {
        NodeHandle::start(NodeConfig {
            home: home.to_path_buf(),
            listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
            name: Some("grants@test".into()),
            ..Default::default()
        })
        .await
        .expect("node starts")
    }

    fn held(inner: &Inner) -> usize {
        inner
            .store
            .grants()
            .unwrap()
            .iter()
            .filter(|r| r.role == GrantRole::Held)
            .count()
    }

    /// Issue #10: 17 issuers × 16 grants each used to be held in full (no cap across
    /// issuers), and storing each re-verified every stored grant (quadratic).
    #[tokio::test]
    async fn held_grants_are_capped_across_issuers_and_verified_once() {
        let dir = tempfile::TempDir::new().unwrap();
        let h = node(dir.path()).await;
        let inner = h.inner.clone();
        let me = inner.identity.key();
        let now = wire::time::now_ms();
        let issuers = MAX_HELD / MAX_HELD_PER_ISSUER + 1;
        let mut sent = 0u64;
        for i in 0..issuers {
            let iss = Identity::from_seed(&[100 + i as u8; 32]);
            let grants: Vec<wire::Grant> = (0..MAX_HELD_PER_ISSUER)
                .map(|_| grant::mint(&iss, &me, &["exec".into()], 3600, None, now))
                .collect();
            sent += grants.len() as u64;
            on_received(&inner, &iss.key(), grants);
        }
        assert!(sent as usize > MAX_HELD);
        assert_eq!(held(&inner), MAX_HELD, "the total cap holds across issuers");
        let cache = || inner.grant_cache.lock().unwrap().verifications();
        // One signature check per grant received, not one per stored grant per insert.
        assert_eq!(cache(), sent, "each grant verified once");
        // A handshake's worth of work re-verifies nothing.
        let before = cache();
        assert_eq!(held_for_auth(&inner).len(), MAX_HELD);
        let stranger = Identity::from_seed(&[9; 32]).key();
        assert!(honored_caps(&inner, &stranger).is_empty());
        assert!(issued_lines(&inner, &stranger).is_empty());
        assert_eq!(cache(), before, "cached verifications are reused");
        h.shutdown();
        h.stopped().await;
    }
}
