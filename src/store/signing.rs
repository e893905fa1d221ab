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

    /// An outbox line about to be sent: when signing is on and it is a content line without
    /// `sig` (queued before signing was on: by an older version of the node, or while the
    /// node ran with `--no-sign`), return it signed, so that a peer that requires signed
    /// lines does not refuse it with `err auth` on every replay. The stored copy is left as
    /// queued. Lines that are already signed, of other kinds, or too large to take `sig`
    /// (logged) are returned unchanged.
    pub fn sign_unsigned(&self, line: Vec<u8>) -> Vec<u8> {
        let Some(identity) = self.signer.get() else {
            return line;
        };
        // Fast path: our signed lines end with `,"sig":"<86 base64url>"}` (a nested `sig`
        // would be followed by more closing brackets; inside strings quotes are escaped).
        let tail = SIG_FIELD_TAIL;
        if line.len() >= tail
            && line.ends_with(b"\"}")
            && line[line.len() - tail..].starts_with(b",\"sig\":\"")
        {
            return line;
        }
        let kind = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&line)
            .ok()
            .and_then(|m| {
                (!m.contains_key("sig"))
                    .then(|| m.get("t").and_then(|t| t.as_str()).map(str::to_string))
                    .flatten()
            });
        let Some(kind) = kind.filter(|k| sig::is_signed_kind(k)) else {
            return line;
        };
        if line.len() > wire::MAX_LINE - sig::SIG_FIELD_LEN {
            tracing::warn!(
                kind,
                len = line.len(),
                "an unsigned queued line is too large to sign; sent as queued"
            );
            return line;
        }
        match sig::sign_encoded(identity, &line) {
            Ok(signed) => signed,
            Err(e) => {
                tracing::warn!(kind, "an unsigned queued line could not be signed: {e}");
                line
            }
        }
    }
}

/// Length of the `sig` field as we append it, with the closing brace:
/// `,"sig":"` (8) + 86 base64url characters + `"}` (2).
const SIG_FIELD_TAIL: usize = 8 + 86 + 2;

#[cfg(test)]
mod tests {
    use crate::identity::Identity;
    use crate::store::{Store, StoreError};
    use crate::wire::{self, sig, Line, Msg, Part, TextPart};
    use std::sync::Arc;

    fn msg_of_len(target: usize, id: &str, ts: &str) -> Line {
        let make = |text: String| {
            Line::Msg(Msg {
                id: id.into(),
                ts: ts.into(),
                th: "t".into(),
                re: None,
                subject: None,
                parts: vec![Part::Text(TextPart { text })],
            })
        };
        let base = make(String::new()).encode().len();
        make("x".repeat(target - base))
    }

    #[test]
    fn signed_line_never_passes_the_cap_and_no_sign_keeps_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let p = Identity::from_seed(&[2; 32]).key();
        let id = Arc::new(Identity::from_seed(&[1; 32]));
        // Unsigned: exactly 1 MiB is queued as is.
        let full = |i: &str, t: &str| msg_of_len(wire::MAX_LINE, i, t);
        let e = s.enqueue(&p, &[&full]).unwrap();
        assert_eq!(e[0].line.len(), wire::MAX_LINE);
        assert!(s.set_line_signer(id.clone()));
        assert!(s.signs_lines());
        // Signed: room for sig is kept, the largest allowed line signs to at most 1 MiB.
        let err = s.enqueue(&p, &[&full]).unwrap_err();
        assert!(
            matches!(err, StoreError::TooLarge { max, .. } if max == wire::MAX_LINE - sig::SIG_FIELD_LEN),
            "{err:?}"
        );
        let edge = |i: &str, t: &str| msg_of_len(wire::MAX_LINE - sig::SIG_FIELD_LEN, i, t);
        let e = s.enqueue(&p, &[&edge]).unwrap();
        assert!(e[0].line.len() <= wire::MAX_LINE);
        assert_eq!(sig::verify_line(&id.key(), &e[0].line), Ok(()));
        // The outbox holds the signed bytes.
        let out = s.outbox_after(&p, None, 10).unwrap();
        assert_eq!(out[1].line, e[0].line);
    }

    #[test]
    fn lines_queued_before_signing_are_signed_when_sent_and_signed_ones_pass_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let p = Identity::from_seed(&[2; 32]).key();
        let id = Arc::new(Identity::from_seed(&[1; 32]));
        // Queued while signing was off (an older node, or --no-sign).
        let small = |i: &str, t: &str| msg_of_len(300, i, t);
        let old = s.enqueue(&p, &[&small]).unwrap().remove(0).line;
        assert!(sig::verify_line(&id.key(), &old).is_err());
        // Signing off: sent as queued.
        assert_eq!(s.sign_unsigned(old.clone()), old);
        assert!(s.set_line_signer(id.clone()));
        let sent = s.sign_unsigned(old.clone());
        sig::verify_line(&id.key(), &sent).unwrap();
        assert!(sent.starts_with(&old[..old.len() - 1]));
        // Queued signed: unchanged, byte for byte.
        let new = s.enqueue(&p, &[&small]).unwrap().remove(0).line;
        sig::verify_line(&id.key(), &new).unwrap();
        assert_eq!(s.sign_unsigned(new.clone()), new);
        // Not a signed kind: unchanged.
        let chunk = br#"{"t":"chunk","id":"01J00000000000000000000000","ts":"2026-01-01T00:00:00Z","ref":"r","seq":0,"data":""}"#.to_vec();
        assert_eq!(s.sign_unsigned(chunk.clone()), chunk);
    }
}
