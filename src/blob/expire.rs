//! Unfinished inbound blobs expire (issue 8 §4): a blob whose chunks stopped coming holds
//! its partial file and its share of the sender's pending budget
//! ([`super::MAX_PENDING_PER_PEER`] blobs, [`super::PENDING_LIMITS_PER_PEER`] × the limit
//! in bytes) only until it has had no new data for [`UNFINISHED_MAX_AGE_MS`]. Then its
//! partial file is deleted and its record refused (reason: expired), which frees the budget
//! for the peer's other blobs; chunks of it still in flight are ignored, and a naming msg
//! that comes after is stored without the blob, as for any refused blob.

use super::receive::{BlobError, BlobReceiver, Verdict};
use crate::store::InStatus;
use crate::wire::PeerKey;

/// How long an unfinished inbound blob is kept without new data: 24 hours, in ms.
pub const UNFINISHED_MAX_AGE_MS: u64 = 24 * 3600 * 1000;

impl BlobReceiver {
    /// Expire the unfinished blobs (status pending) whose last change is at least `max_age_ms`
    /// before `now_ms` (Unix ms), except those of the peers in `skip` (connected peers: their
    /// own session may be writing the blob right now). Returns how many expired.
    ///
    /// Errors: the store, or deleting a partial file (other than it being gone already).
    pub fn expire_unfinished(
        &mut self,
        now_ms: u64,
        max_age_ms: u64,
        skip: &[PeerKey],
    ) -> Result<usize, BlobError> {
        let mut n = 0;
        for (peer, blob_ref) in self.store().pending_blob_refs()? {
            if skip.contains(&peer) {
                continue;
            }
            let Some(st) = self.store().blob_in(&peer, &blob_ref)? else {
                continue;
            };
            if st.status != InStatus::Pending || st.updated_ms.saturating_add(max_age_ms) > now_ms {
                continue;
            }
            let hours = max_age_ms / 3_600_000;
            let detail = format!("expired: unfinished, no data for {hours} h");
            tracing::info!(%peer, blob_ref = %crate::control::shown(&blob_ref), offset = st.offset, "inbound blob {detail}");
            let verdict = Verdict::Refuse {
                blob_ref: None,
                re: String::new(),
                detail,
            };
            self.refuse_record(&peer, &blob_ref, st, verdict)?;
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{InBlobState, Store};
    use crate::wire::{self, Chunk};
    use std::sync::Arc;

    fn key(n: u8) -> PeerKey {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
        PeerKey::from_bytes(&sk.verifying_key().to_bytes()).unwrap()
    }

    fn chunk(id: &str, r: &str, data: &[u8]) -> Chunk {
        Chunk {
            id: id.into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: Some("thr_1".into()),
            blob_ref: r.into(),
            n: 0,
            last: false,
            data: wire::b64::encode_std(data),
        }
    }

    #[test]
    fn an_unfinished_blob_expires_after_a_day_and_frees_the_peers_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
        let root = dir.path().join("blobs");
        // Limit 1000 bytes: the peer's partial data may total 2000.
        let mut rx = BlobReceiver::new(store.clone(), root.clone(), 1000);
        let (p, other) = (key(1), key(2));
        for (i, r) in ["a", "b"].iter().enumerate() {
            let v = rx
                .on_chunk(
                    &p,
                    &chunk(&format!("01K000000000000000000000A{i}"), r, &[7; 1000]),
                )
                .unwrap();
            assert_eq!(v, Verdict::Stored);
        }
        rx.on_chunk(&other, &chunk("01K000000000000000000000B0", "c", &[1; 10]))
            .unwrap();
        // The budget is spent: a third blob's data is refused.
        let v = rx
            .on_chunk(&p, &chunk("01K000000000000000000000A2", "x", &[7; 10]))
            .unwrap();
        assert!(matches!(v, Verdict::Refuse { .. }), "{v:?}");
        let partial = super::super::partial_path(&super::super::peer_dir(&root, &p), "a");
        assert!(partial.exists());

        let t0 = store.blob_in(&p, "a").unwrap().unwrap().updated_ms;
        // Not yet a day: nothing goes.
        let day = UNFINISHED_MAX_AGE_MS;
        assert_eq!(
            rx.expire_unfinished(t0 + day - 60_000, day, &[]).unwrap(),
            0
        );
        // A connected peer's blobs wait.
        assert_eq!(
            rx.expire_unfinished(t0 + day + 60_000, day, &[p, other])
                .unwrap(),
            0
        );
        assert_eq!(
            rx.expire_unfinished(t0 + day + 60_000, day, &[other])
                .unwrap(),
            2
        );
        let st: InBlobState = store.blob_in(&p, "a").unwrap().unwrap();
        assert_eq!(st.status, InStatus::Refused);
        assert!(st.reason.unwrap().starts_with("expired"));
        assert!(!partial.exists());
        assert_eq!(store.pending_blobs_in(&p).unwrap(), (0, 0));
        assert_eq!(store.pending_blobs_in(&other).unwrap().0, 1);
        // The budget is back.
        let v = rx
            .on_chunk(&p, &chunk("01K000000000000000000000A3", "y", &[7; 1000]))
            .unwrap();
        assert_eq!(v, Verdict::Stored);
    }
}
