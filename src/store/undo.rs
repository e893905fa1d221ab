//! The undo record of a commit (`Tx::commit`, `tx.rs`): what the store's open does with
//! one that a crash left behind. A commit writes its before-images under one key of the
//! tree `undo` before any of its writes and its LSN into `meta` after all of them, so a
//! crash that cut it short leaves an undo record whose LSN is the stored one plus one; the
//! open rolls that commit back from it before the journal's replay (`journal::open`).

use super::journal::{decode, keep, transact};
use super::tx::{db_err, Trees, T, UNDO_KEY};
use super::StoreError;
use std::path::Path;

/// Roll back what reached sled of a commit that a crash cut short (see
/// [`super::tx::Tx::commit`]): when the undo record's LSN is the stored one plus one, its
/// before-images are written back and the record removed, in one sled transaction.
/// Returns the LSN rolled back. An undo record that does not decode (sled keeps a value
/// whole, so only damage does that) is copied to `quarantine`, logged and left alone.
pub(super) fn roll_back(
    trees: &Trees,
    stored: u64,
    quarantine: &Path,
) -> Result<Option<u64>, StoreError> {
    let Some(u) = trees.raw(T::Undo).get(UNDO_KEY).map_err(db_err)? else {
        return Ok(None);
    };
    let (recs, stop) = decode(&u);
    let ([rec], None) = (recs.as_slice(), &stop) else {
        let kept = keep(&u, quarantine, "undo")
            .map(|p| format!("it was copied to {}", p.display()))
            .unwrap_or_else(|e| format!("copying it to the quarantine failed: {e}"));
        tracing::error!(
            "the store's undo record is damaged ({} records, {stop:?}); a commit cut short by a crash cannot be rolled back; {kept}",
            recs.len()
        );
        return Ok(None);
    };
    if rec.lsn != stored + 1 {
        return Ok(None);
    }
    let clear = (T::Undo as u8, UNDO_KEY, None);
    transact(trees, rec.entries.iter().copied().chain([clear]))?;
    Ok(Some(rec.lsn))
}

#[cfg(test)]
mod tests {
    use super::super::journal::tests::{copy_dir, opened, put};
    use super::super::journal::{encode, stored_lsn, FILE};
    use super::*;

    /// A crash image taken while a commit was cut short after its first write: the
    /// database as sled would persist it (sled's own flush of what was written so far)
    /// and the journal as its last sync left it (without the cut commit: never acked).
    /// Returns the image's directory and the LSN of the last whole commit.
    fn cut_commit(d: &Path) -> (std::path::PathBuf, u64) {
        use super::super::tx::{hooks, Tx};
        let dir = d.join("db");
        let image = d.join("crashed").join("db");
        let s = opened(&dir);
        put(&s, b"x/a", b"1");
        put(&s, b"x/b", b"1");
        s.flush_blocking().unwrap();
        let lsn = stored_lsn(&s.trees).unwrap();
        hooks::set_after_write(Some(Box::new(|n| n < 1)));
        let mut tx = Tx::new(&s.trees);
        tx.put(T::Meta, b"x/a".to_vec(), b"2".to_vec());
        tx.put(T::Meta, b"x/b".to_vec(), b"2".to_vec());
        tx.put(T::Meta, b"x/c".to_vec(), b"2".to_vec());
        let res = tx.commit();
        hooks::set_after_write(None);
        assert!(res.is_err());
        // What the crash left in sled: the first write, not the others, not the LSN.
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(s.meta_get("b").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn);
        s.db.flush().unwrap();
        copy_dir(&dir, &image);
        drop(s);
        (image, lsn)
    }

    /// A commit large enough to be written on two threads ([`super::super::tx`]'s
    /// `PARALLEL_MIN`), cut short on the caller's thread after its first write while the
    /// second thread wrote its whole part: the crash image holds writes of both parts,
    /// and the open rolls every one of them back.
    #[test]
    fn a_commit_written_on_two_threads_and_cut_short_is_rolled_back() {
        use super::super::tx::hooks;
        use super::super::tx::tests::{key, two_tree_commit};
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let image = d.path().join("crashed").join("db");
        let s = opened(&dir);
        let tx = two_tree_commit(&s.trees);
        s.flush_blocking().unwrap();
        let lsn = stored_lsn(&s.trees).unwrap();
        hooks::set_after_write(Some(Box::new(|n| n < 1)));
        let res = tx.commit();
        hooks::set_after_write(None);
        assert!(res.is_err());
        let log = |s: &crate::store::Store, i| s.trees.t(T::Log).get(key(i)).unwrap();
        let outbox = |s: &crate::store::Store, i| s.trees.t(T::Outbox).get(key(i)).unwrap();
        let twos = (0..300)
            .filter(|&i| log(&s, i).as_deref() == Some(&b"2"[..]))
            .count()
            + (0..300).filter(|&i| outbox(&s, i).is_some()).count();
        if crate::par::cores() >= 2 {
            // The caller's one write and the other thread's 300.
            assert_eq!(twos, 301);
        } else {
            assert_eq!(twos, 1);
        }
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn);
        s.db.flush().unwrap();
        copy_dir(&dir, &image);
        drop(s);
        let s = crate::store::Store::open(&image).unwrap();
        for i in 0..300 {
            assert_eq!(log(&s, i).as_deref(), Some(&b"1"[..]), "log {i}");
            assert_eq!(outbox(&s, i), None, "outbox {i}");
        }
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn);
        assert_eq!(s.trees.t(T::Undo).get(UNDO_KEY).unwrap(), None);
    }

    /// The part of a commit that reached sled before a crash, never acked, is rolled
    /// back at the next open (without the undo record, `x/a` would stay "2" beside a
    /// `x/b` of "1": half a commit).
    #[test]
    fn a_commit_cut_short_by_a_crash_is_rolled_back() {
        let d = tempfile::TempDir::new().unwrap();
        let (image, lsn) = cut_commit(d.path());
        let s = crate::store::Store::open(&image).unwrap();
        for k in ["a", "b"] {
            assert_eq!(s.meta_get(k).unwrap().as_deref(), Some(&b"1"[..]), "{k}");
        }
        assert_eq!(s.meta_get("c").unwrap(), None);
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn);
        assert_eq!(s.trees.t(T::Undo).get(UNDO_KEY).unwrap(), None);
        // The store goes on: the next commit takes the LSN the cut one had.
        put(&s, b"x/d", b"1");
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn + 1);
        drop(s);
        let s = crate::store::Store::open(&image).unwrap();
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(s.meta_get("d").unwrap().as_deref(), Some(&b"1"[..]));
    }

    /// A commit cut short in sled whose journal record was synced (a crash of sled's
    /// side after the flush) is rolled back, then redone whole from the journal.
    #[test]
    fn a_cut_commit_that_the_journal_holds_is_redone_whole() {
        let d = tempfile::TempDir::new().unwrap();
        let (image, lsn) = cut_commit(d.path());
        let mut data = Vec::new();
        let meta = T::Meta as u8;
        encode(
            &mut data,
            lsn + 1,
            [
                (meta, &b"x/a"[..], Some(&b"2"[..])),
                (meta, &b"x/b"[..], Some(&b"2"[..])),
                (meta, &b"x/c"[..], Some(&b"2"[..])),
            ]
            .into_iter(),
        );
        std::fs::write(image.join(FILE), &data).unwrap();
        let s = crate::store::Store::open(&image).unwrap();
        for k in ["a", "b", "c"] {
            assert_eq!(s.meta_get(k).unwrap().as_deref(), Some(&b"2"[..]), "{k}");
        }
        assert_eq!(stored_lsn(&s.trees).unwrap(), lsn + 1);
    }

    /// An undo record of a commit that completed (its LSN is the stored one) is left
    /// alone: a reopen keeps what was committed.
    #[test]
    fn the_undo_record_of_a_whole_commit_changes_nothing() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        let s = opened(&dir);
        put(&s, b"x/a", b"1");
        put(&s, b"x/a", b"2");
        let lsn = stored_lsn(&s.trees).unwrap();
        let undo = s.trees.t(T::Undo).get(UNDO_KEY).unwrap().unwrap();
        let (recs, stop) = decode(&undo);
        assert_eq!(stop, None);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].lsn, lsn);
        assert_eq!(
            recs[0].entries,
            vec![(T::Meta as u8, &b"x/a"[..], Some(&b"1"[..]))]
        );
        s.db.flush().unwrap();
        let image = d.path().join("image").join("db");
        copy_dir(&dir, &image);
        drop(s);
        let s = crate::store::Store::open(&image).unwrap();
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"2"[..]));
    }

    /// A damaged undo record is copied to the quarantine and logged; the store opens.
    #[test]
    fn a_damaged_undo_record_is_kept_and_the_store_opens() {
        let d = tempfile::TempDir::new().unwrap();
        let dir = d.path().join("db");
        {
            let s = opened(&dir);
            put(&s, b"x/a", b"1");
            s.trees
                .raw(T::Undo)
                .insert(UNDO_KEY, &b"not a record"[..])
                .unwrap();
            s.meta_put("b", b"1").unwrap();
            s.flush_blocking().unwrap();
        }
        let s = crate::store::Store::open(&dir).unwrap();
        assert_eq!(s.meta_get("a").unwrap().as_deref(), Some(&b"1"[..]));
        let kept: Vec<_> = std::fs::read_dir(d.path().join(super::super::files::QUARANTINE_DIR))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with("-undo"))
            .collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(std::fs::read(kept[0].path()).unwrap(), b"not a record");
    }
}
