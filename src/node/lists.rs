//! Listings over the control socket: threads, peers and grants.

use super::server::{internal, Fail};
use super::Inner;
use crate::wire::{self, PeerKey};
use serde_json::{json, Value};

/// The `threads` control request.
pub(super) fn threads(inner: &Inner) -> Result<Value, Fail> {
    let store = &inner.store;
    let threads = store.threads().map_err(internal)?;
    let list: Vec<Value> = threads
        .into_iter()
        .map(|t| {
            json!({
                "th": t.th,
                "peer": t.peer.to_string(),
                "peer_name": inner.peer_name(&t.peer),
                "subject": t.subject,
                "mine": t.mine,
                "my_note": t.my_note,
                "theirs": t.theirs,
                "their_note": t.their_note,
                "since": wire::time::format_ms(t.since_ms),
                "updated": wire::time::format_ms(t.updated_ms),
                "updated_ms": t.updated_ms,
                "unread": t.unread,
            })
        })
        .collect();
    Ok(json!({ "threads": list }))
}

/// The `peers` control request.
pub(super) fn peers(inner: &Inner) -> Result<Value, Fail> {
    let store = &inner.store;
    let peers = store.peers().map_err(internal)?;
    let conns = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
    let list: Vec<Value> = peers
        .into_iter()
        .map(|p| {
            let c = conns.get(&p.key);
            let addrs: Vec<Value> = store
                .addresses(&p.key)
                .unwrap_or_default()
                .into_iter()
                .map(|a| json!({"address": a.address, "source": a.source, "last_ok": a.last_ok_ms.map(wire::time::format_ms), "last_err": a.last_err}))
                .collect();
            json!({
                "key": p.key.to_string(),
                "name": p.name,
                "about": p.about,
                "caps": p.caps,
                "fingerprint": p.key.fingerprint(),
                "first_seen": wire::time::format_ms(p.first_seen_ms),
                "last_seen": wire::time::format_ms(p.last_seen_ms),
                "last_seen_ms": p.last_seen_ms,
                "parked": p.parked,
                "connected": c.is_some_and(|c| c.up),
                "remote": c.map(|c| c.remote.clone()),
                "address": store.addresses(&p.key).ok().and_then(|a| a.into_iter().next()).map(|a| a.address),
                "outbox": store.outbox_len(&p.key).unwrap_or(0),
                "addresses": addrs,
            })
        })
        .collect();
    Ok(json!({ "peers": list }))
}

/// The `grants` control request.
pub(super) fn grants(inner: &Inner) -> Result<Value, Fail> {
    Ok(json!({ "grants": grants_list(inner)? }))
}

fn grants_list(inner: &Inner) -> Result<Vec<Value>, Fail> {
    let now = wire::time::now_ms();
    let me = inner.identity.key();
    let mut out = Vec::new();
    for rec in inner.store.grants().map_err(internal)? {
        let revoked = inner.store.grant_revoked(&rec.hash).unwrap_or(false);
        let (validity, caps_now, v) = match crate::grant::verify(&rec.object) {
            Err(e) => (format!("invalid: {e}"), Vec::new(), None),
            Ok(v) => {
                let verdict = match rec.role {
                    // Held grants are judged by the node they are presented to.
                    crate::store::GrantRole::Held if v.expired_at(now) => "expired".to_string(),
                    crate::store::GrantRole::Held if revoked => "revoked".to_string(),
                    crate::store::GrantRole::Held => "valid".to_string(),
                    _ => match super::grants::honor(inner, &v, now) {
                        Ok(_) => "valid".to_string(),
                        Err(crate::grant::GrantError::Expired { .. }) => "expired".to_string(),
                        Err(crate::grant::GrantError::Revoked { .. }) => "revoked".to_string(),
                        Err(e) => format!("not honored: {e}"),
                    },
                };
                let caps = if verdict == "valid" && rec.role != crate::store::GrantRole::Held {
                    super::grants::honor(inner, &v, now).unwrap_or_default()
                } else {
                    Vec::new()
                };
                (verdict, caps, Some(v))
            }
        };
        let name = |k: &PeerKey| {
            if *k == me {
                Some("(this node)".to_string())
            } else {
                inner.peer_name(k)
            }
        };
        out.push(json!({
            "hash": rec.hash,
            "role": rec.role,
            "iss": v.as_ref().map(|v| v.iss.to_string()),
            "iss_name": v.as_ref().and_then(|v| name(&v.iss)),
            "sub": v.as_ref().map(|v| v.sub.to_string()),
            "sub_name": v.as_ref().and_then(|v| name(&v.sub)),
            "aud": v.as_ref().and_then(|v| v.aud.map(|a| a.to_string())),
            "caps": v.as_ref().map(|v| v.caps.clone()).unwrap_or_default(),
            "honored_caps": caps_now,
            "exp": v.as_ref().map(|v| v.exp.clone()),
            "from": rec.from.map(|k| k.to_string()),
            "validity": validity,
            "revoked": revoked,
        }));
    }
    Ok(out)
}
