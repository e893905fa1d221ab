//! Lines parsed before they reach the session, and a signing peer's signatures checked
//! there, in one batch per read (issue 13).
//!
//! The connection's reader task frames lines on one thread while the session stores the
//! previous ones on another. Parsing each line and checking its Ed25519 signature is most
//! of a signed line's cost, and neither depends on the session's state beyond two facts
//! fixed once the peer is authenticated: its key, and whether its hello announced
//! `signed-lines`. The reader learns them from a [`Signer`] slot the driver fills when the
//! session opens; each [`PreParsed`] line records the mode it was parsed in, and the
//! session uses the work only when that mode is the one it would have used itself
//! ([`super::Session::handle_preparsed`]); otherwise it parses the bytes again. The rules
//! applied are those of [`crate::wire::parse::parse_line`], [`crate::blob::fast`] and
//! `spec/signed-lines.md`, unchanged.

use crate::wire::{self, sig, FrameError, Line, PeerKey};

/// The authenticated peer's key, set by the connection driver once the session is open
/// and its peer announced `signed-lines` (never for a peer that does not sign). Lines the
/// reader frames after it is set are parsed with their signature checks.
pub type Signer = std::sync::Arc<std::sync::OnceLock<PeerKey>>;

/// A received line (without `\n`) and what parsing it gave.
#[derive(Debug)]
pub struct PreParsed {
    pub(super) raw: Vec<u8>,
    /// The key the signatures of this line were checked under: `Some` when it was parsed
    /// for a signing peer (what the session does once open with such a peer), `None` when
    /// parsed plainly.
    pub(super) signer: Option<PeerKey>,
    pub(super) parsed: Result<(Line, Option<SigCheck>), FrameError>,
}

impl PreParsed {
    /// The line's bytes as received.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The parsed line, or why it was refused (as [`crate::wire::parse_line`] gives).
    pub fn line(&self) -> Result<&Line, &FrameError> {
        self.parsed.as_ref().map(|(l, _)| l)
    }

    /// Whether the line's signature was checked here: `Some(true)` verified under the
    /// signer's key, `Some(false)` refused (not `sig`-bearing, malformed or a bad
    /// signature), `None` not checked (plain mode, a kind that is not signed, or after a
    /// refused line of the same batch).
    pub fn verified(&self) -> Option<bool> {
        match &self.parsed {
            Ok((_, Some(SigCheck::Done(r)))) => Some(r.is_ok()),
            Ok((_, Some(SigCheck::Ready(Err(_))))) => Some(false),
            _ => None,
        }
    }
}

/// The signature check of a line of a signed kind ([`sig::is_signed_kind`]).
#[derive(Debug)]
pub(super) enum SigCheck {
    /// Made ready, not checked (the session checks it, in its commit's batch).
    Ready(wire::parse::Prepared),
    /// Checked under the [`PreParsed::signer`] key: Ok, or why it was refused.
    Done(Result<(), sig::SigError>),
}

/// Parse `lines` in order as the session would: chunk lines by the fast path
/// ([`crate::blob::fast::parse_chunk`]), others strictly; with `signer`, lines of signed
/// kinds also get their signature checks, verified together ([`sig::verify_batch`]). The
/// first line whose signature fails is marked refused; the lines after it are left
/// unchecked (`SigCheck::Ready`): the session closes at the refused one.
///
/// Never panics on any input; each line is bounded by the reader's line cap.
pub fn preparse(lines: Vec<Vec<u8>>, signer: Option<&PeerKey>) -> Vec<PreParsed> {
    let mut out: Vec<PreParsed> = lines
        .into_iter()
        .map(|raw| {
            let parsed = match crate::blob::fast::parse_chunk(&raw) {
                Some(line) => Ok((line, None)),
                None if signer.is_some() => {
                    wire::parse::parse_line_prepared(&raw).map(|(l, p)| (l, p.map(SigCheck::Ready)))
                }
                None => wire::parse_line(&raw).map(|l| (l, None)),
            };
            PreParsed {
                raw,
                signer: signer.copied(),
                parsed,
            }
        })
        .collect();
    let Some(key) = signer else { return out };
    // Every line whose check was made ready, in order.
    let mut at = Vec::new();
    let mut ready = Vec::new();
    for (i, p) in out.iter_mut().enumerate() {
        if let Ok((_, check @ Some(SigCheck::Ready(Ok(_))))) = &mut p.parsed {
            if let Some(SigCheck::Ready(Ok(prepared))) = check.take() {
                at.push(i);
                ready.push(prepared);
            }
        }
    }
    let checked = match sig::verify_batch(key, &ready) {
        Ok(()) => ready.len(),
        Err((bad, e)) => {
            set(&mut out[at[bad]], SigCheck::Done(Err(e)));
            bad
        }
    };
    // Before the refused line (or all): verified. After it: given back unchecked.
    for (n, (i, prepared)) in at.into_iter().zip(ready).enumerate() {
        match n.cmp(&checked) {
            std::cmp::Ordering::Less => set(&mut out[i], SigCheck::Done(Ok(()))),
            std::cmp::Ordering::Equal => {}
            std::cmp::Ordering::Greater => set(&mut out[i], SigCheck::Ready(Ok(prepared))),
        }
    }
    out
}

fn set(p: &mut PreParsed, check: SigCheck) {
    if let Ok((_, slot)) = &mut p.parsed {
        *slot = Some(check);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn id() -> Identity {
        Identity::from_seed(&[3u8; 32])
    }

    fn msg(i: usize) -> Vec<u8> {
        format!(
            r#"{{"t":"msg","id":"01JAAAAAAAAAAAAAAAAAAAA{i:03}","ts":"2026-12-01T10:00:00.000Z","th":"t1","parts":[{{"k":"text","text":"line {i}"}}]}}"#
        )
        .into_bytes()
    }

    fn signed(i: usize) -> Vec<u8> {
        sig::sign_encoded(&id(), &msg(i)).unwrap()
    }

    fn checks(out: &[PreParsed]) -> Vec<&'static str> {
        out.iter()
            .map(|p| match &p.parsed {
                Err(_) => "bad line",
                Ok((_, None)) => "none",
                Ok((_, Some(SigCheck::Ready(Ok(_))))) => "ready",
                Ok((_, Some(SigCheck::Ready(Err(_))))) => "ready refused",
                Ok((_, Some(SigCheck::Done(Ok(()))))) => "verified",
                Ok((_, Some(SigCheck::Done(Err(_))))) => "refused",
            })
            .collect()
    }

    #[test]
    fn plain_mode_parses_without_checks() {
        let out = preparse(vec![msg(1), signed(2), b"{oops".to_vec()], None);
        assert_eq!(checks(&out), ["none", "none", "bad line"]);
        assert!(out.iter().all(|p| p.signer.is_none()));
        assert_eq!(out[0].raw(), msg(1).as_slice());
    }

    #[test]
    fn signing_mode_verifies_and_marks_the_first_bad_line() {
        let key = id().key();
        let ack = br#"{"t":"ack","id":"01JAAAAAAAAAAAAAAAAAAAAAAA","ts":"2026-12-01T10:00:00.000Z","th":"t1","re":"x"}"#;
        let out = preparse(vec![signed(1), ack.to_vec(), signed(2)], Some(&key));
        assert_eq!(checks(&out), ["verified", "none", "verified"]);
        assert_eq!(out[0].signer, Some(key));

        // A tampered line, a good one after it, an unsigned one: refused, then unchecked.
        let mut tampered = signed(3);
        let at = tampered.iter().position(|b| *b == b'3').unwrap();
        tampered[at] = b'4';
        let out = preparse(
            vec![signed(1), tampered, signed(5), msg(6), b"[1]".to_vec()],
            Some(&key),
        );
        assert_eq!(
            checks(&out),
            ["verified", "refused", "ready", "ready refused", "bad line"]
        );

        // Under another key, the first signed line is refused.
        let other = Identity::from_seed(&[4u8; 32]).key();
        let out = preparse(vec![signed(1), signed(2)], Some(&other));
        assert_eq!(checks(&out), ["refused", "ready"]);
    }

    #[test]
    fn many_lines_are_checked_in_one_batch_across_threads() {
        let key = id().key();
        let n = sig::PARALLEL_MIN * 2 + 3;
        let mut lines: Vec<Vec<u8>> = (0..n).map(signed).collect();
        let out = preparse(lines.clone(), Some(&key));
        assert!(checks(&out).iter().all(|c| *c == "verified"));
        lines[n - 2] = sig::sign_encoded(&Identity::from_seed(&[8u8; 32]), &msg(900)).unwrap();
        let out = preparse(lines, Some(&key));
        let c = checks(&out);
        assert!(c[..n - 2].iter().all(|c| *c == "verified"));
        assert_eq!(&c[n - 2..], ["refused", "ready"]);
    }
}
