//! Grant records (protocol-notes §Grants): grants we issued, grants issued to us (held),
//! and grants peers presented to us, keyed by their hash, plus revocations. Single-tree
//! writes; durable after [`Store::flush`].

use super::tx::db_err;
use super::{Store, StoreError};
use crate::wire::PeerKey;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

const TREE: &str = "grants";
const REVOKED: &str = "grants_revoked";

/// How a grant relates to this node.
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

impl Store {
    /// Store (or replace) a grant record under its hash.
    pub fn grant_put(&self, rec: &GrantRecord) -> Result<(), StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        let v = serde_json::to_vec(&Rec {
            role: rec.role,
            from: rec.from.map(|k| k.to_string()),
            object: rec.object.clone(),
            stored_ms: rec.stored_ms,
        })
        .map_err(|e| StoreError::Corrupt {
            tree: "grants",
            detail: e.to_string(),
        })?;
        tree.insert(rec.hash.as_bytes(), v).map_err(db_err)?;
        Ok(())
    }

    /// One grant by hash.
    pub fn grant(&self, hash: &str) -> Result<Option<GrantRecord>, StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        match tree.get(hash.as_bytes()).map_err(db_err)? {
            Some(v) => Ok(Some(decode(hash.to_string(), &v)?)),
            None => Ok(None),
        }
    }

    /// Every stored grant, in hash order.
    pub fn grants(&self) -> Result<Vec<GrantRecord>, StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        let mut out = Vec::new();
        for kv in tree.iter() {
            let (k, v) = kv.map_err(db_err)?;
            let hash = String::from_utf8(k.to_vec()).map_err(|e| StoreError::Corrupt {
                tree: "grants",
                detail: e.to_string(),
            })?;
            out.push(decode(hash, &v)?);
        }
        Ok(out)
    }

    /// Up to `limit` stored grants with hash > `after` (from the first when None), in hash
    /// order: one page of the `grants` listing.
    pub fn grants_after(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<GrantRecord>, StoreError> {
        use std::ops::Bound;
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        let start = match after {
            Some(a) => Bound::Excluded(a.as_bytes().to_vec()),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for kv in tree
            .range::<Vec<u8>, _>((start, Bound::Unbounded))
            .take(limit)
        {
            let (k, v) = kv.map_err(db_err)?;
            let hash = String::from_utf8(k.to_vec()).map_err(|e| StoreError::Corrupt {
                tree: "grants",
                detail: e.to_string(),
            })?;
            out.push(decode(hash, &v)?);
        }
        Ok(out)
    }

    /// Remove a grant record. Returns whether it existed.
    pub fn grant_remove(&self, hash: &str) -> Result<bool, StoreError> {
        let tree = self.db.open_tree(TREE).map_err(db_err)?;
        Ok(tree.remove(hash.as_bytes()).map_err(db_err)?.is_some())
    }

    /// Mark a grant hash revoked here (it is never honored again).
    pub fn grant_revoke(&self, hash: &str, now_ms: u64) -> Result<(), StoreError> {
        let tree = self.db.open_tree(REVOKED).map_err(db_err)?;
        tree.insert(hash.as_bytes(), &now_ms.to_be_bytes())
            .map_err(db_err)?;
        Ok(())
    }

    /// Whether a grant hash was revoked here.
    pub fn grant_revoked(&self, hash: &str) -> Result<bool, StoreError> {
        let tree = self.db.open_tree(REVOKED).map_err(db_err)?;
        tree.contains_key(hash.as_bytes()).map_err(db_err)
    }
}

fn decode(hash: String, v: &[u8]) -> Result<GrantRecord, StoreError> {
    let r: Rec = serde_json::from_slice(v).map_err(|e| StoreError::Corrupt {
        tree: "grants",
        detail: e.to_string(),
    })?;
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
}
