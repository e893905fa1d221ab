//! Grants at the node (protocol-notes §Grants): storing what peers present, the honoring
//! rules applied with this node's trust list and revocations, admission under an
//! allowlist, and sending our issued grants after every resume.

use super::Inner;
use crate::config::Accept;
use crate::grant::{self, GrantError, Policy, Verified};
use crate::store::{AddrSource, GrantRecord, GrantRole, Introduced};
use crate::wire::{self, Line, PeerKey};

/// Most grants taken from one auth or grant line.
pub const MAX_GRANTS_PER_LINE: usize = 32;

/// Most grants held (issued to us) per issuer; older ones are replaced.
pub const MAX_HELD_PER_ISSUER: usize = 16;

/// Verify and store grants that `from` presented (auth.grants or a grant line). Refused
/// grants (forged, weak keys, expired, for a third party) are logged and dropped, never
/// honored. Only what is useful is kept, so a stranger cannot fill the store: a presented
/// grant only when it is honored now; a grant issued to us only when its issuer sent it
/// (directly or in an introduction), at most [`MAX_HELD_PER_ISSUER`] per issuer.
pub(super) fn on_received(inner: &Inner, from: &PeerKey, grants: Vec<wire::Grant>) {
    let me = inner.identity.key();
    let now = wire::time::now_ms();
    for g in grants.into_iter().take(MAX_GRANTS_PER_LINE) {
        let obj = grant::object_of(&g);
        let v = match grant::verify(&obj) {
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
        } else {
            make_room_for(inner, &v.iss, &v.hash);
            tracing::info!(peer = %from, hash = %v.hash, caps = ?v.caps, "holding a grant issued to us");
        }
        let rec = GrantRecord {
            hash: v.hash.clone(),
            role,
            from: Some(*from),
            object: v.object.clone(),
            stored_ms: now,
        };
        if let Err(e) = inner.store.grant_put(&rec) {
            tracing::warn!("storing a grant: {e}");
        }
    }
}

/// Drop the oldest held grants of `iss` so that one more fits under
/// [`MAX_HELD_PER_ISSUER`] (nothing when `incoming` is already held).
fn make_room_for(inner: &Inner, iss: &PeerKey, incoming: &str) {
    let mut held: Vec<(u64, String)> = verified_records(inner)
        .into_iter()
        .filter(|(r, v)| r.role == GrantRole::Held && v.iss == *iss)
        .map(|(r, _)| (r.stored_ms, r.hash))
        .collect();
    if held.iter().any(|(_, h)| h == incoming) {
        return;
    }
    held.sort();
    while held.len() >= MAX_HELD_PER_ISSUER {
        let (_, h) = held.remove(0);
        let _ = inner.store.grant_remove(&h);
    }
}

/// Every stored grant that verifies (records that no longer verify are skipped).
fn verified_records(inner: &Inner) -> Vec<(GrantRecord, Verified)> {
    inner
        .store
        .grants()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| grant::verify(&r.object).ok().map(|v| (r, v)))
        .collect()
}

/// The honoring rules with this node's trust list, revocations and stored introduce grants.
pub(super) fn honor(inner: &Inner, g: &Verified, now_ms: u64) -> Result<Vec<String>, GrantError> {
    honor_with(inner, &verified_records(inner), g, now_ms)
}

/// [`honor`] over records already verified (one pass over the store per operation).
fn honor_with(
    inner: &Inner,
    all: &[(GrantRecord, Verified)],
    g: &Verified,
    now_ms: u64,
) -> Result<Vec<String>, GrantError> {
    let intros = |k: &PeerKey| -> Vec<Verified> {
        all.iter()
            .filter(|(_, v)| v.sub == *k)
            .map(|(_, v)| v.clone())
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
    let all = verified_records(inner);
    let mut caps: Vec<String> = Vec::new();
    for (_, v) in all.iter().filter(|(_, v)| v.sub == *peer) {
        if let Ok(cs) = honor_with(inner, &all, v, now) {
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
    let all = verified_records(inner);
    let honored_now = presented.iter().take(MAX_GRANTS_PER_LINE).any(|g| {
        grant::verify(&grant::object_of(g))
            .ok()
            .filter(|v| v.sub == *peer)
            .is_some_and(|v| honor_with(inner, &all, &v, now).is_ok_and(|c| !c.is_empty()))
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
    for (rec, v) in verified_records(inner) {
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

/// Grants issued to us that we may present in `auth.grants`: valid now. The session keeps
/// only those meant for the peer (its `aud`, or issued by it) once the peer is known.
pub(crate) fn held_for_auth(inner: &Inner) -> Vec<wire::Grant> {
    let now = wire::time::now_ms();
    verified_records(inner)
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
            Ok(addr @ crate::net::Address::Tls { .. }) if addr.pin().is_none_or(|p| p == key) => {
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
        Ok(Introduced::Added) | Ok(Introduced::Again) => {}
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
