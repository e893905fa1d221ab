//! Looking up a received line by its sender and id (for telling a replay from a line that
//! reuses an id with other content).

use super::codec::{pkey, read_u64, unpack, LogRec, Payload};
use super::tx::{db_err, T};
use super::{Store, StoreError};
use crate::wire::PeerKey;

impl Store {
    /// The bytes (as received, without `\n`) of the content line `id` from `peer` that is
    /// on record, or None when no such line was received or its log entry was pruned.
    pub fn received_line(&self, peer: &PeerKey, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(seq) = self
            .trees
            .t(T::Received)
            .get(pkey(peer, id.as_bytes()))
            .map_err(db_err)?
        else {
            return Ok(None);
        };
        let seq = read_u64("received", &seq)?;
        let Some(v) = self
            .trees
            .t(T::Log)
            .get(super::codec::u64_be(seq))
            .map_err(db_err)?
        else {
            return Ok(None);
        };
        let (_, line): (LogRec, Payload) = unpack("log", &v)?;
        Ok(Some(line.get("log")?.to_vec()))
    }
}
