//! Listings over the control socket: threads, peers and grants, a page at a time
//! ([`crate::control::Page`]), with what peers chose cut to size
//! ([`crate::control::shown`]), so that no listing outgrows a control line however many
//! or large the things listed are (security-local §Listings).

use super::server::{internal, Fail};
use super::Inner;
use crate::control::{shown, Page, MAX_SHOWN_ITEMS, PAGE_BYTES};
use crate::wire::{self, PeerKey};
use serde_json::{json, Value};

/// Collects one page of a listing: items offered in listing order, each with the cursor
/// that resumes after it.
pub(super) struct Pager {
    limit: usize,
    items: Vec<Value>,
    bytes: usize,
    last: Option<String>,
    next: Option<String>,
}

impl Pager {
    /// An empty page of at most `page.items()` items and [`PAGE_BYTES`] bytes.
    pub(super) fn new(page: &Page) -> Pager {
        Pager {
            limit: page.items(),
            items: Vec::new(),
            bytes: 0,
            last: None,
            next: None,
        }
    }

    /// How many items to fetch to fill the page and learn whether more follow.
    pub(super) fn fetch(&self) -> usize {
        self.limit + 1
    }

    /// Offer the next item. `false`: the page is full and the item was not taken; the
    /// response says `next` (the cursor of the last item taken) and the caller stops.
    pub(super) fn push(&mut self, cursor: String, item: Value) -> bool {
        let len = serde_json::to_vec(&item).map_or(0, |b| b.len()) + 1;
        if !self.items.is_empty()
            && (self.items.len() >= self.limit || self.bytes + len > PAGE_BYTES)
        {
            self.next = self.last.take();
            return false;
        }
        self.bytes += len;
        self.items.push(item);
        self.last = Some(cursor);
        true
    }

    /// `{KEY: [items], "next": CURSOR}` (`next` only when the page was full).
    pub(super) fn finish(self, key: &str) -> Value {
        let mut v = json!({ key: self.items });
        if let Some(n) = self.next {
            v["next"] = json!(n);
        }
        v
    }
}

fn shown_opt(s: &Option<String>) -> Option<String> {
    s.as_deref().map(shown)
}

/// The `threads` control request: a page of threads in (thread id, peer key) order. The
/// cursor is the last thread's `PEER/th` (peer key in full).
pub(super) fn threads(inner: &Inner, page: &Page) -> Result<Value, Fail> {
    let after = match page.cursor.as_deref() {
        None => None,
        Some(c) => {
            let bad = || Fail::new("bad_request", format!("bad threads cursor {:?}", shown(c)));
            let (p, th) = c.split_once('/').ok_or_else(bad)?;
            Some((th, PeerKey::parse(p).map_err(|_| bad())?))
        }
    };
    let mut out = Pager::new(page);
    let threads = inner
        .store
        .threads_after(after.as_ref().map(|(th, p)| (*th, p)), out.fetch())
        .map_err(internal)?;
    // Threads are many, their peers few: look each name up once a page.
    let mut names: std::collections::HashMap<PeerKey, Option<String>> = Default::default();
    for t in threads {
        let peer_name = names
            .entry(t.peer)
            .or_insert_with(|| inner.peer_name(&t.peer))
            .clone();
        let item = json!({
            "th": t.th,
            "peer": t.peer.to_string(),
            "peer_name": peer_name,
            "subject": shown_opt(&t.subject),
            "mine": shown_opt(&t.mine),
            "my_note": shown_opt(&t.my_note),
            "theirs": shown_opt(&t.theirs),
            "their_note": shown_opt(&t.their_note),
            "since": wire::time::format_ms(t.since_ms),
            "updated": wire::time::format_ms(t.updated_ms),
            "updated_ms": t.updated_ms,
            "unread": t.unread,
        });
        if !out.push(format!("{}/{}", t.peer, t.th), item) {
            break;
        }
    }
    Ok(out.finish("threads"))
}

/// The `peers` control request: a page of known peers in key order, each with at most
/// [`MAX_SHOWN_ITEMS`] caps and addresses (best first) and the totals.
pub(super) fn peers(inner: &Inner, page: &Page) -> Result<Value, Fail> {
    let store = &inner.store;
    let after = page
        .cursor
        .as_deref()
        .map(PeerKey::parse)
        .transpose()
        .map_err(|e| Fail::new("bad_request", format!("bad peers cursor: {e}")))?;
    let mut out = Pager::new(page);
    let peers = store
        .peers_after(after.as_ref(), out.fetch())
        .map_err(internal)?;
    for p in peers {
        let (up, remote) = {
            let conns = inner.conns.lock().unwrap_or_else(|p| p.into_inner());
            let c = conns.get(&p.key);
            (c.is_some_and(|c| c.up), c.map(|c| c.remote.clone()))
        };
        let all = store.addresses(&p.key).unwrap_or_default();
        let addrs_total = all.len();
        let best = all.first().map(|a| shown(&a.address));
        let addrs: Vec<Value> = all
            .into_iter()
            .take(MAX_SHOWN_ITEMS)
            .map(|a| {
                json!({
                    "address": shown(&a.address),
                    "source": a.source,
                    "last_ok": a.last_ok_ms.map(wire::time::format_ms),
                    "last_heard": a.last_heard_ms.map(wire::time::format_ms),
                    "last_err": shown_opt(&a.last_err),
                })
            })
            .collect();
        let caps: Vec<String> = p
            .caps
            .iter()
            .take(MAX_SHOWN_ITEMS)
            .map(|c| shown(c))
            .collect();
        let key = p.key.to_string();
        let item = json!({
            "key": key,
            "name": shown_opt(&p.name),
            "about": shown_opt(&p.about),
            "caps": caps,
            "caps_total": p.caps.len(),
            "fingerprint": p.key.fingerprint(),
            "first_seen": wire::time::format_ms(p.first_seen_ms),
            "last_seen": wire::time::format_ms(p.last_seen_ms),
            "last_seen_ms": p.last_seen_ms,
            "parked": p.parked,
            "parked_by": match (p.parked, p.parked_by_us) {
                (false, _) => None,
                (true, true) => Some("us"),
                (true, false) => Some("peer"),
            },
            "introduced_by": p.introduced_by.map(|k| k.to_string()),
            "connected": up,
            "remote": remote,
            "address": best,
            "outbox": store.outbox_len(&p.key).unwrap_or(0),
            "addresses": addrs,
            "addresses_total": addrs_total,
        });
        if !out.push(key, item) {
            break;
        }
    }
    Ok(out.finish("peers"))
}

/// The `grants` control request: a page of grants in hash order.
pub(super) fn grants(inner: &Inner, page: &Page) -> Result<Value, Fail> {
    let now = wire::time::now_ms();
    let me = inner.identity.key();
    let mut out = Pager::new(page);
    let recs = inner
        .store
        .grants_after(page.cursor.as_deref(), out.fetch())
        .map_err(internal)?;
    for rec in recs {
        let revoked = inner.store.grant_revoked(&rec.hash).unwrap_or(false);
        let (validity, caps_now, v) = match super::grants::verify_stored(inner, &rec) {
            Err(e) => (format!("invalid: {e}"), Vec::new(), None),
            Ok(v) => {
                let (verdict, caps) = match rec.role {
                    // Held grants are judged by the node they are presented to.
                    crate::store::GrantRole::Held if v.expired_at(now) => {
                        ("expired".to_string(), Vec::new())
                    }
                    crate::store::GrantRole::Held if revoked => ("revoked".to_string(), Vec::new()),
                    crate::store::GrantRole::Held => ("valid".to_string(), Vec::new()),
                    _ => match super::grants::honor(inner, &v, now) {
                        Ok(caps) => ("valid".to_string(), caps),
                        Err(crate::grant::GrantError::Expired { .. }) => {
                            ("expired".to_string(), Vec::new())
                        }
                        Err(crate::grant::GrantError::Revoked { .. }) => {
                            ("revoked".to_string(), Vec::new())
                        }
                        Err(e) => (format!("not honored: {e}"), Vec::new()),
                    },
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
        let cursor = rec.hash.clone();
        let item = json!({
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
            "validity": shown(&validity),
            "revoked": revoked,
        });
        if !out.push(cursor, item) {
            break;
        }
    }
    Ok(out.finish("grants"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(limit: Option<usize>) -> Page {
        Page {
            cursor: None,
            limit,
        }
    }

    #[test]
    fn a_page_stops_at_its_item_limit_and_names_the_last_cursor() {
        let mut p = Pager::new(&page(Some(2)));
        assert_eq!(p.fetch(), 3);
        assert!(p.push("a".into(), json!(1)));
        assert!(p.push("b".into(), json!(2)));
        assert!(!p.push("c".into(), json!(3)));
        assert_eq!(p.finish("xs"), json!({"xs": [1, 2], "next": "b"}));
        // All fitted: no next.
        let mut p = Pager::new(&page(Some(2)));
        assert!(p.push("a".into(), json!(1)));
        assert_eq!(p.finish("xs"), json!({"xs": [1]}));
    }

    #[test]
    fn a_page_stops_at_its_byte_budget_but_holds_at_least_one_item() {
        let big = "x".repeat(PAGE_BYTES / 2);
        let mut p = Pager::new(&page(None));
        assert!(p.push("a".into(), json!(big)));
        assert!(!p.push("b".into(), json!(big)), "over 1 MiB");
        let v = p.finish("xs");
        assert_eq!(v["xs"].as_array().unwrap().len(), 1);
        assert_eq!(v["next"], "a");
        // One item over the budget still goes out alone (items are bounded by `shown`).
        let huge = "x".repeat(PAGE_BYTES + 1);
        let mut p = Pager::new(&page(None));
        assert!(p.push("a".into(), json!(huge)));
        assert!(!p.push("b".into(), json!(1)));
        assert!(serde_json::to_vec(&p.finish("xs")).unwrap().len() > PAGE_BYTES);
    }

    #[test]
    fn a_page_of_capped_items_stays_under_the_control_line() {
        // The largest thread item a peer can cause: every text field at the cap, of the
        // widest characters once escaped in JSON.
        let field = shown(&"\u{1}".repeat(1 << 20));
        let item = json!({"subject": field, "mine": field, "my_note": field,
            "theirs": field, "their_note": field, "peer_name": field, "th": "t".repeat(256)});
        let mut p = Pager::new(&page(None));
        let mut n = 0;
        while p.push(format!("{n:08}"), item.clone()) {
            n += 1;
        }
        let line = serde_json::to_vec(&p.finish("threads")).unwrap();
        assert!(line.len() <= PAGE_BYTES + 16 * 1024, "{}", line.len());
        assert!(line.len() < crate::control::MAX_CONTROL_LINE);
    }
}
