//! One sled tree read through the store's commit lock.
//!
//! A commit ([`super::tx::Tx::commit`]) applies its writes to sled as plain inserts and
//! removals, one key after another, while it holds the write side of [`Trees::visible`]
//! (`tx.rs`). Every read here takes the read side for one step (a point read, or one item
//! of a scan), so a read sees all of a commit or none of it, as sled's own transactions
//! showed them before. A scan is not a snapshot: commits may land between two of its items,
//! which was true of sled's scans too.
//!
//! The lock is only ever taken outside sled's calls and never while this thread holds it
//! already (a commit reads its before-images from the raw trees, not through this), so it
//! adds no cycle with sled's own locks.
//!
//! [`Trees::visible`]: super::tx::Trees

use sled::IVec;
use std::ops::RangeBounds;
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

fn read(l: &RwLock<()>) -> RwLockReadGuard<'_, ()> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// A tree and the commit lock it is read through (see the module doc).
#[derive(Clone, Copy)]
pub(crate) struct Tr<'a> {
    tree: &'a sled::Tree,
    lock: &'a RwLock<()>,
}

impl<'a> Tr<'a> {
    /// `tree` read through `lock` (the store's `Trees::visible`).
    pub(crate) fn new(tree: &'a sled::Tree, lock: &'a RwLock<()>) -> Tr<'a> {
        Tr { tree, lock }
    }

    /// The value of `key`, if any (sled's `Tree::get`).
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        let _g = read(self.lock);
        self.tree.get(key)
    }

    /// Whether `key` has a value (sled's `Tree::contains_key`).
    pub(crate) fn contains_key(&self, key: impl AsRef<[u8]>) -> sled::Result<bool> {
        let _g = read(self.lock);
        self.tree.contains_key(key)
    }

    /// Every entry in key order.
    pub(crate) fn iter(&self) -> Iter<'a> {
        Iter {
            inner: self.tree.iter(),
            lock: self.lock,
        }
    }

    /// The entries whose keys are in `range`, in key order.
    pub(crate) fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter<'a> {
        Iter {
            inner: self.tree.range(range),
            lock: self.lock,
        }
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub(crate) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Iter<'a> {
        Iter {
            inner: self.tree.scan_prefix(prefix),
            lock: self.lock,
        }
    }

    /// A single-key write outside [`super::tx::Tx`] (the caller then asks the journal
    /// for a checkpoint, see `journal.rs`). Returns the previous value.
    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<IVec>,
    ) -> sled::Result<Option<IVec>> {
        self.tree.insert(key, value)
    }

    /// A single-key removal outside [`super::tx::Tx`]. Returns the previous value.
    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        self.tree.remove(key)
    }
}

/// A scan of a [`Tr`]: each item is read under the commit lock's read side.
pub(crate) struct Iter<'a> {
    inner: sled::Iter,
    lock: &'a RwLock<()>,
}

impl<'a> Iter<'a> {
    /// The keys alone.
    pub(crate) fn keys(self) -> impl DoubleEndedIterator<Item = sled::Result<IVec>> + 'a {
        self.map(|r| r.map(|(k, _)| k))
    }
}

impl Iterator for Iter<'_> {
    type Item = sled::Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        let _g = read(self.lock);
        self.inner.next()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let _g = read(self.lock);
        self.inner.next_back()
    }
}
