//! Signing of queued content lines (`spec/signed-lines.md`): when the node signs, every
//! `msg`, `state`, `grant` and `introduce` line is signed as it is queued, so the outbox
//! and the out log hold the signed bytes (replays resend them unchanged and an export
//! can prove them later).

use super::{Store, StoreError};
use crate::identity::Identity;
use crate::wire::{self, sig};
use std::sync::Arc;

impl Store {
    /// Sign content lines queued from now on with `identity` (once; later calls are ignored
    /// and return false).
    pub fn set_line_signer(&self, identity: Arc<Identity>) -> bool {
        self.signer.set(identity).is_ok()
    }

    /// Whether queued content lines are signed (the node then announces `signed-lines`).
    pub fn signs_lines(&self) -> bool {
        self.signer.get().is_some()
    }

    /// Sign an encoded line of kind `kind` when signing is on and the kind is signed;
    /// otherwise return it unchanged.
    ///
    /// Line cap: a signed kind is refused with [`StoreError::TooLarge`] (max =
    /// [`wire::MAX_LINE`] − [`sig::SIG_FIELD_LEN`]) when the unsigned line leaves no room for
    /// `sig`, so the signed line never passes the 1 MiB cap. With `--no-sign` the whole
    /// cap is available.
    pub(super) fn sign_if_on(&self, kind: &str, encoded: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let Some(identity) = self.signer.get() else {
            return Ok(encoded);
        };
        if !sig::is_signed_kind(kind) {
            return Ok(encoded);
        }
        let max = wire::MAX_LINE - sig::SIG_FIELD_LEN;
        if encoded.len() > max {
            return Err(StoreError::TooLarge {
                len: encoded.len(),
                max,
            });
        }
        sig::sign_encoded(identity, &encoded).map_err(|e| StoreError::BadLine(e.to_string()))
    }
}
