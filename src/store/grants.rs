//! Grant records (protocol-notes §Grants): grants we issued, grants issued to us (held),
//! and grants peers presented to us, keyed by their hash, plus revocations. Durable after
//! [`Store::flush`].
//!
//! - `grants`: hash → record (JSON).
//! - `grants_idx`: an index kept in the same transaction as the record, so that nothing
//!   scans every grant to answer one peer: `s` ‖ sub (32 bytes) ‖ hash, `i` ‖ iss ‖ hash,
//!   and `r` ‖ role ‖ stored_ms (u64 BE) ‖ hash (oldest first per role, for caps). Stores
//!   written before the index existed are indexed once, on first use.

use super::tx::db_err;
use super::{Store, StoreError};
use crate::wire::PeerKey;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

const TREE: &str = "grants";
const INDEX: &str = "grants_idx";
const REVOKED: &str = "grants_revoked";
/// Key in `grants_idx` that says the index covers every record.
const INDEX_BUILT: &[u8] = b"~built-v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantRole {
    /// We are its issuer.
    Issued,
    /// Its subject is us (someone granted us something); we present it.
    Held,
    /// A peer presented it to us (its subject is that peer).
    Presented,
}

/// A stored grant.
#[derive(Debug, Clone, PartialEq)]
pub struct GrantRecord {
    /// First 16 bytes of SHA-256 of the canonical grant, hex (see `crate::grant`).
    pub hash: String,
    pub role: GrantRole,
    /// The peer that sent it to us (held and presented grants).
    pub from: Option<PeerKey>,
    /// The grant object exactly as received or minted (its signature covers all of it).
    pub object: Map<String, Value>,
    /// When we stored it, Unix ms.
    pub stored_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct Rec {
    role: GrantRole,
    from: Option<String>,
    object: Map<String, Value>,
    stored_ms: u64,
}

impl GrantRole {
    fn byte(self) -> u8 {
        match self {
            GrantRole::Issued => b'I',
            GrantRole::Held => b'H',
            GrantRole::Presented => b'P',
        }
    }
}

/// The key bytes of field `field` (`iss` or `sub`) of a grant object, when it is a key.
fn key_of(object: &Map<String, Value>, field: &str) -> Option<[u8; 32]> {
    let s = object.get(field)?.as_str()?;
    PeerKey::parse(s).ok().map(|k| *k.as_bytes())
}

/// The index keys of one record (see the module doc).
fn index_keys(
    rec_hash: &str,
    role: GrantRole,
    stored_ms: u64,
    object: &Map<String, Value>,
) -> Vec<Vec<u8>> {
    let mut keys = Vec::with_capacity(3);
    for (tag, field) in [(b's', "sub"), (b'i', "iss")] {
        if let Some(k) = key_of(object, field) {
            let mut key = vec![tag];
            key.extend_from_slice(&k);
            key.extend_from_slice(rec_hash.as_bytes());
            keys.push(key);
        }
    }
    let mut key = vec![b'r', role.byte()];
    key.extend_from_slice(&stored_ms.to_be_bytes());
    key.extend_from_slice(rec_hash.as_bytes());
    keys.push(key);
    keys
}

fn corrupt(detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        tree: "grants",
        detail: detail.to_string(),
    }
}

fn tx_err(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => db_err(e),
    }
}

impl Store {
    /// Store (or replace) a grant record under its hash, with its index entries (one
    /// transaction).
    pub fn grant_put(&self, rec: &GrantRecord) -> Result<(), StoreError> {
        self.grant_index_ready()?;
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        let idx = self.db.open_tree(INDEX).map_err(db_err)?;
        let v = serde_json::to_vec(&Rec {
            role: rec.role,
            from: rec.from.map(|k| k.to_string()),
            object: rec.object.clone(),
            stored_ms: rec.stored_ms,
        })
        .map_err(corrupt)?;
        let new_keys = index_keys(&rec.hash, rec.role, rec.stored_ms, &rec.object);
        let gate = super::gate::transaction();
        let res = (&tree, &idx)
            .transaction(|(t, i)| {
                if let Some(old) = t.insert(rec.hash.as_bytes(), v.as_slice())? {
                    let old = decode(rec.hash.clone(), &old)
                        .map_err(ConflictableTransactionError::Abort)?;
                    for k in index_keys(&old.hash, old.role, old.stored_ms, &old.object) {
                        i.remove(k)?;
                    }
                }
                for k in &new_keys {
                    i.insert(k.as_slice(), &[])?;
                }
                Ok(())
            })
            .map_err(tx_err);
        drop(gate);
        // Written outside the store's transactions: durable through sled's flush.
        self.trees.journal.needs_full();
        res
    }

    /// One grant by hash.
    pub fn grant(&self, hash: &str) -> Result<Option<GrantRecord>, StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        match tree.get(hash.as_bytes()).map_err(db_err)? {
            Some(v) => Ok(Some(decode(hash.to_string(), &v)?)),
            None => Ok(None),
        }
    }

    /// The stored grants whose hash starts with `prefix` (as given: hashes are lower-case
    /// hex), in hash order: only those records are read and decoded (resolving a hash
    /// prefix given to `awp grant revoke`/`show` used to decode every grant).
    pub fn grants_with_prefix(&self, prefix: &str) -> Result<Vec<GrantRecord>, StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        let mut out = Vec::new();
        for kv in tree.scan_prefix(prefix.as_bytes()) {
            let (k, v) = kv.map_err(db_err)?;
            let hash = String::from_utf8(k.to_vec()).map_err(corrupt)?;
            out.push(decode(hash, &v)?);
        }
        Ok(out)
    }

    /// Every stored grant, in hash order.
    pub fn grants(&self) -> Result<Vec<GrantRecord>, StoreError> {
        self.grants_with_prefix("")
    }

    /// Up to `limit` stored grants with hash > `after` (from the first when None), in hash
    /// order: one page of the `grants` listing.
    pub fn grants_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<GrantRecord>, StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        super::imp::page_after(
            super::tree::Tr::new(&tree, &self.trees.visible),
            after.map(str::as_bytes),
            limit,
            |k, v| {
                let hash = String::from_utf8(k.to_vec()).map_err(|e| StoreError::Corrupt {
                    tree: "grants",
                    detail: e.to_string(),
                })?;
                decode(hash, v)
            },
        )
    }

    /// Grants whose `sub` is `sub` (any role), in hash order. Reads only those records.
    pub fn grants_by_sub(&self, sub: &PeerKey) -> Result<Vec<GrantRecord>, StoreError> {
        self.grants_by_key(b's', sub)
    }

    /// Grants whose `iss` is `iss` (any role), in hash order. Reads only those records.
    pub fn grants_by_iss(&self, iss: &PeerKey) -> Result<Vec<GrantRecord>, StoreError> {
        self.grants_by_key(b'i', iss)
    }

    /// Grants of one role, oldest `stored_ms` first. Reads only those records.
    pub fn grants_by_role(&self, role: GrantRole) -> Result<Vec<GrantRecord>, StoreError> {
        self.grant_index_ready()?;
        let idx = self.db.open_tree(INDEX).map_err(db_err)?;
        let prefix = [b'r', role.byte()];
        let mut out = Vec::new();
        for kv in idx.scan_prefix(prefix) {
            let (k, _) = kv.map_err(db_err)?;
            let hash = k
                .get(prefix.len() + 8..)
                .ok_or_else(|| corrupt("short role index key"))?;
            let hash = std::str::from_utf8(hash).map_err(corrupt)?;
            if let Some(r) = self.grant(hash)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// `(stored_ms, hash)` of every grant of one role, oldest first, read from the index
    /// alone (no record is decoded).
    pub fn grant_ages(&self, role: GrantRole) -> Result<Vec<(u64, String)>, StoreError> {
        self.grant_index_ready()?;
        let idx = self.db.open_tree(INDEX).map_err(db_err)?;
        let prefix = [b'r', role.byte()];
        let mut out = Vec::new();
        for kv in idx.scan_prefix(prefix) {
            let (k, _) = kv.map_err(db_err)?;
            let (ms, hash) = k[prefix.len()..]
                .split_at_checked(8)
                .ok_or_else(|| corrupt("short role index key"))?;
            let ms = u64::from_be_bytes(ms.try_into().map_err(corrupt)?);
            out.push((ms, std::str::from_utf8(hash).map_err(corrupt)?.to_string()));
        }
        Ok(out)
    }

    fn grants_by_key(&self, tag: u8, key: &PeerKey) -> Result<Vec<GrantRecord>, StoreError> {
        self.grant_index_ready()?;
        let idx = self.db.open_tree(INDEX).map_err(db_err)?;
        let mut prefix = vec![tag];
        prefix.extend_from_slice(key.as_bytes());
        let mut out = Vec::new();
        for kv in idx.scan_prefix(&prefix) {
            let (k, _) = kv.map_err(db_err)?;
            let hash = std::str::from_utf8(&k[prefix.len()..]).map_err(corrupt)?;
            if let Some(r) = self.grant(hash)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Index every record once when the index was never built (a store written before
    /// it existed).
    fn grant_index_ready(&self) -> Result<(), StoreError> {
        let idx = self.db.open_tree(INDEX).map_err(db_err)?;
        if idx.contains_key(INDEX_BUILT).map_err(db_err)? {
            return Ok(());
        }
        self.trees.journal.needs_full();
        for rec in self.grants()? {
            for k in index_keys(&rec.hash, rec.role, rec.stored_ms, &rec.object) {
                idx.insert(k, &[]).map_err(db_err)?;
            }
        }
        let r = idx.insert(INDEX_BUILT, &[]).map_err(db_err);
        self.trees.journal.needs_full();
        r.map(|_| ())
    }

    /// Remove a grant record and its index entries. Returns whether it existed.
    pub fn grant_remove(&self, hash: &str) -> Result<bool, StoreError> {
        self.grant_index_ready()?;
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        let idx = self.db.open_tree(INDEX).map_err(db_err)?;
        let gate = super::gate::transaction();
        let res = (&tree, &idx)
            .transaction(|(t, i)| {
                let Some(old) = t.remove(hash.as_bytes())? else {
                    return Ok(false);
                };
                let old =
                    decode(hash.to_string(), &old).map_err(ConflictableTransactionError::Abort)?;
                for k in index_keys(&old.hash, old.role, old.stored_ms, &old.object) {
                    i.remove(k)?;
                }
                Ok(true)
            })
            .map_err(tx_err);
        drop(gate);
        self.trees.journal.needs_full();
        res
    }

    /// Mark a grant hash revoked here (it is never honored again).
    pub fn grant_revoke(&self, hash: &str, now_ms: u64) -> Result<(), StoreError> {
        let tree = self.db.open_tree(REVOKED).map_err(db_err)?;
        let r = tree
            .insert(hash.as_bytes(), &now_ms.to_be_bytes())
            .map_err(db_err);
        self.trees.journal.needs_full();
        r.map(|_| ())
    }

    /// Whether a grant hash was revoked here.
    pub fn grant_revoked(&self, hash: &str) -> Result<bool, StoreError> {
        let tree = self.db.open_tree(REVOKED).map_err(db_err)?;
        tree.contains_key(hash.as_bytes()).map_err(db_err)
    }
}

fn decode(hash: String, v: &[u8]) -> Result<GrantRecord, StoreError> {
    let r: Rec = serde_json::from_slice(v).map_err(corrupt)?;
    let from = match r.from {
        Some(s) => Some(PeerKey::parse(&s).map_err(|e| StoreError::Corrupt {
            tree: "grants",
            detail: e.to_string(),
        })?),
        None => None,
    };
    Ok(GrantRecord {
        hash,
        role: r.role,
        from,
        object: r.object,
        stored_ms: r.stored_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_list_remove_and_revoke() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let from = crate::identity::Identity::from_seed(&[3; 32]).key();
        let mut obj = Map::new();
        obj.insert("caps".into(), serde_json::json!(["exec"]));
        let rec = GrantRecord {
            hash: "ab".repeat(16),
            role: GrantRole::Presented,
            from: Some(from),
            object: obj,
            stored_ms: 5,
        };
        s.grant_put(&rec).unwrap();
        assert_eq!(s.grants().unwrap(), vec![rec.clone()]);
        assert_eq!(s.grant(&rec.hash).unwrap(), Some(rec.clone()));
        assert!(!s.grant_revoked(&rec.hash).unwrap());
        s.grant_revoke(&rec.hash, 9).unwrap();
        assert!(s.grant_revoked(&rec.hash).unwrap());
        assert!(s.grant_remove(&rec.hash).unwrap());
        assert!(s.grants().unwrap().is_empty());
    }

    /// A hash prefix reads only the grants it matches, in hash order.
    #[test]
    fn grants_with_prefix_reads_only_the_matching_ones() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let rec = |hash: String| GrantRecord {
            hash,
            role: GrantRole::Issued,
            from: None,
            object: Map::new(),
            stored_ms: 1,
        };
        for h in ["ab12", "ab34", "abff", "ac00", "0ab1"] {
            s.grant_put(&rec(h.repeat(16))).unwrap();
        }
        let hashes = |p: &str| -> Vec<String> {
            s.grants_with_prefix(p)
                .unwrap()
                .into_iter()
                .map(|r| r.hash)
                .collect()
        };
        assert_eq!(
            hashes("ab"),
            vec!["ab12".repeat(16), "ab34".repeat(16), "abff".repeat(16)]
        );
        assert_eq!(hashes("ab3"), vec!["ab34".repeat(16)]);
        assert!(hashes("ad").is_empty());
        assert_eq!(hashes("").len(), 5);
    }

    #[test]
    fn index_by_sub_iss_and_role() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (a, b, c) = (
            crate::identity::Identity::from_seed(&[1; 32]),
            crate::identity::Identity::from_seed(&[2; 32]),
            crate::identity::Identity::from_seed(&[3; 32]),
        );
        let rec = |iss: &crate::identity::Identity, sub: PeerKey, role, ms| {
            let g = crate::grant::mint(iss, &sub, &["exec".into()], 60, None, 1_790_000_000_000);
            let object = crate::grant::object_of(&g);
            GrantRecord {
                hash: crate::grant::grant_hash(&object),
                role,
                from: None,
                object,
                stored_ms: ms,
            }
        };
        let r1 = rec(&a, b.key(), GrantRole::Held, 20);
        let r2 = rec(&a, c.key(), GrantRole::Held, 10);
        let r3 = rec(&c, b.key(), GrantRole::Presented, 5);
        for r in [&r1, &r2, &r3] {
            s.grant_put(r).unwrap();
        }
        let hashes = |v: Vec<GrantRecord>| v.into_iter().map(|r| r.hash).collect::<Vec<_>>();
        let mut by_b = hashes(s.grants_by_sub(&b.key()).unwrap());
        by_b.sort();
        let mut want = vec![r1.hash.clone(), r3.hash.clone()];
        want.sort();
        assert_eq!(by_b, want);
        assert_eq!(s.grants_by_iss(&c.key()).unwrap(), vec![r3.clone()]);
        assert_eq!(
            hashes(s.grants_by_role(GrantRole::Held).unwrap()),
            vec![r2.hash.clone(), r1.hash.clone()],
            "oldest first"
        );
        assert_eq!(
            s.grant_ages(GrantRole::Held).unwrap(),
            vec![(10, r2.hash.clone()), (20, r1.hash.clone())]
        );
        // Replacing a record moves its index entries; removing drops them.
        let mut r2b = r2.clone();
        r2b.stored_ms = 30;
        s.grant_put(&r2b).unwrap();
        assert_eq!(
            s.grant_ages(GrantRole::Held).unwrap()[1],
            (30, r2.hash.clone())
        );
        assert!(s.grant_remove(&r1.hash).unwrap());
        assert_eq!(s.grants_by_sub(&b.key()).unwrap(), vec![r3.clone()]);
        assert_eq!(s.grant_ages(GrantRole::Held).unwrap().len(), 1);
        // A store without the index (written before it existed) is indexed on first use.
        let idx = s.db.open_tree(INDEX).unwrap();
        idx.clear().unwrap();
        assert_eq!(s.grants_by_iss(&c.key()).unwrap(), vec![r3]);
    }
}
