//! Signed content lines (extension `signed-lines`, `spec/signed-lines.md`).
//!
//! A content line we send (`msg`, `state`, `grant`, `introduce`; never `chunk`) carries a
//! top-level `sig`: unpadded base64url of the Ed25519 signature (64 bytes) by the sender's
//! node key over the RFC 8785 canonical JSON of the line without `sig` — the same rule as
//! grant objects (protocol-notes §Grants). v0 peers ignore the unknown field; peers whose
//! hello `caps` list [`CAP`] must sign every content line and have them verified strictly.
//!
//! Verification always runs over the line as received (parsed strictly: duplicate keys
//! refused), so fields unknown to us stay covered.

use crate::canonical;
use crate::identity::Identity;
use crate::wire::{b64, parse, PeerKey};
use serde_json::{Map, Value};

/// The hello capability saying "every content line I send is signed, and I verify yours".
pub const CAP: &str = "signed-lines";

/// Most bytes the `sig` field adds to a line: `,"sig":"` (8) + 86 base64url chars + `"` (1).
/// Content lines we sign are capped at [`crate::wire::MAX_LINE`] minus this before signing,
/// so that the signed line always fits the 1 MiB cap.
pub const SIG_FIELD_LEN: usize = 95;

/// Line kinds that carry `sig` when signing is on (not `chunk`: blob data is covered by the
/// SHA-256 in the naming msg's part).
pub fn is_signed_kind(kind: &str) -> bool {
    matches!(kind, "msg" | "state" | "grant" | "introduce")
}

/// Why a line's signature was refused. All map to `err auth` on a connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SigError {
    /// Not UTF-8, not JSON, duplicate keys, or not an object.
    #[error("line is not a strict JSON object: {0}")]
    NotObject(String),
    /// No `sig` field.
    #[error("line has no sig")]
    Missing,
    /// `sig` is not a string.
    #[error("sig is not a string")]
    NotString,
    /// `sig` is not base64 or not 64 bytes.
    #[error("sig is not 64 bytes of base64")]
    Encoding,
    /// The signature does not verify (strict Ed25519) under the key.
    #[error("sig does not verify under the sender's key")]
    Bad,
}

fn object(raw: &[u8]) -> Result<Map<String, Value>, SigError> {
    let text = std::str::from_utf8(raw).map_err(|_| SigError::NotObject("invalid UTF-8".into()))?;
    match parse::strict_from_str(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(SigError::NotObject("not an object".into())),
        Err(e) => Err(SigError::NotObject(e.to_string())),
    }
}

/// Sign an encoded line of ours (compact JSON object without `\n`, as made by
/// [`crate::wire::Line::encode`]): returns the same bytes with `,"sig":"…"` inserted before
/// the closing `}`. Any `sig` already present is refused ([`SigError::NotObject`]) so a line
/// is never signed twice.
pub fn sign_encoded(identity: &Identity, encoded: &[u8]) -> Result<Vec<u8>, SigError> {
    let obj = object(encoded)?;
    if obj.contains_key("sig") {
        return Err(SigError::NotObject("already signed".into()));
    }
    let bytes = canonical::canonical_json(&Value::Object(obj))
        .map_err(|e| SigError::NotObject(e.to_string()))?;
    let sig = b64::encode_url(&identity.sign(&bytes));
    let end = encoded
        .iter()
        .rposition(|b| *b == b'}')
        .ok_or_else(|| SigError::NotObject("no closing brace".into()))?;
    let mut out = Vec::with_capacity(encoded.len() + SIG_FIELD_LEN);
    out.extend_from_slice(&encoded[..end]);
    // `{}` has no field before ours.
    if encoded[..end]
        .iter()
        .rev()
        .find(|b| !b.is_ascii_whitespace())
        != Some(&b'{')
    {
        out.push(b',');
    }
    out.extend_from_slice(b"\"sig\":\"");
    out.extend_from_slice(sig.as_bytes());
    out.extend_from_slice(b"\"}");
    Ok(out)
}

/// Verify the `sig` of a line exactly as received (without `\n`) against `key`: strict
/// JSON (duplicate keys refused), `sig` a string of 64 bytes in any base64 form, Ed25519
/// `verify_strict` over the canonical JSON of the object without `sig`.
pub fn verify_line(key: &PeerKey, raw: &[u8]) -> Result<(), SigError> {
    verify_object(key, &object(raw)?)
}

/// [`verify_line`] on an already strictly parsed object.
pub fn verify_object(key: &PeerKey, obj: &Map<String, Value>) -> Result<(), SigError> {
    prepare_object(obj)?.verify(key)
}

/// A received line's signature check made ready: the canonical bytes it signs and its
/// signature, decoded. Made by [`prepare_line`]; checked alone ([`Prepared::verify`]) or
/// many at once ([`verify_batch`]).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// RFC 8785 canonical JSON of the line without `sig`.
    bytes: Vec<u8>,
    sig: ed25519_dalek::Signature,
}

impl Prepared {
    /// Strict single verification (`verify_strict`), as [`verify_line`] does.
    pub fn verify(&self, key: &PeerKey) -> Result<(), SigError> {
        key.verifying_key()
            .verify_strict(&self.bytes, &self.sig)
            .map_err(|_| SigError::Bad)
    }
}

/// Everything [`verify_line`] checks except the Ed25519 equation: strict JSON object, `sig`
/// present, a string, 64 bytes in any base64 form. Errors as [`verify_line`]'s.
pub fn prepare_line(raw: &[u8]) -> Result<Prepared, SigError> {
    prepare_object(&object(raw)?)
}

pub(crate) fn prepare_object(obj: &Map<String, Value>) -> Result<Prepared, SigError> {
    let sig = match obj.get("sig") {
        None => return Err(SigError::Missing),
        Some(Value::String(s)) => s,
        Some(_) => return Err(SigError::NotString),
    };
    let sig = b64::decode_any(sig).map_err(|_| SigError::Encoding)?;
    let sig = ed25519_dalek::Signature::from_slice(&sig).map_err(|_| SigError::Encoding)?;
    let bytes = canonical::signing_bytes(obj).map_err(|e| SigError::NotObject(e.to_string()))?;
    Ok(Prepared { bytes, sig })
}

/// Most signatures checked by one `ed25519_dalek::verify_batch` call in [`verify_batch`].
pub const BATCH_MAX: usize = 256;

/// Verify many prepared lines of one sender `key` (issue 13): ed25519-dalek's batch
/// verification per [`BATCH_MAX`] lines, and when a batch fails, strict single verification
/// of its lines in order to find the first bad one. Returns Ok, or the index (into
/// `lines`) of the first line that fails [`Prepared::verify`] with its error.
///
/// From [`PARALLEL_MIN`] lines on, and where the machine has more than one core, the
/// lines are split in two halves checked at once on two threads (the calling one and a
/// scoped one); the result is the same as checking them in order.
///
/// A batch is accepted only when every signature's `R` is a canonical encoding of a point
/// that is not of small order and the key is not weak (what `verify_strict` checks besides
/// the equation); otherwise its lines are verified singly. The batch equation is
/// cofactorless with random coefficients, so an honest signature passes both ways; only
/// the key's owner can make one that passes the batch and fails `verify_strict` (an `R`
/// with a torsion component), which forges nothing.
pub fn verify_batch(key: &PeerKey, lines: &[Prepared]) -> Result<(), (usize, SigError)> {
    match crate::par::halves(lines, PARALLEL_MIN, |part| verify_in_order(key, part)) {
        crate::par::Split::Whole(r) => r,
        crate::par::Split::Halves { first, second, mid } => {
            first?;
            second.map_err(|(i, e)| (mid + i, e))
        }
    }
}

/// Fewest lines [`verify_batch`] splits over two threads (below it, a thread's start
/// costs more than half the work saves: each half is at least 64 lines, about 1 ms).
pub const PARALLEL_MIN: usize = 128;

/// [`verify_batch`] on one thread.
fn verify_in_order(key: &PeerKey, lines: &[Prepared]) -> Result<(), (usize, SigError)> {
    let vk = key.verifying_key();
    let keys = vec![vk; lines.len().min(BATCH_MAX)];
    for (n, chunk) in lines.chunks(BATCH_MAX).enumerate() {
        let base = n * BATCH_MAX;
        let batch_ok =
            chunk.len() > 1 && !vk.is_weak() && chunk.iter().all(|p| r_is_sound(&p.sig)) && {
                let msgs: Vec<&[u8]> = chunk.iter().map(|p| p.bytes.as_slice()).collect();
                let sigs: Vec<ed25519_dalek::Signature> = chunk.iter().map(|p| p.sig).collect();
                ed25519_dalek::verify_batch(&msgs, &sigs, &keys[..chunk.len()]).is_ok()
            };
        if batch_ok {
            continue;
        }
        for (i, p) in chunk.iter().enumerate() {
            p.verify(key).map_err(|e| (base + i, e))?;
        }
    }
    Ok(())
}

/// The signature's `R` is what `verify_strict` could accept: a canonical encoding (y below
/// p = 2^255 − 19, RFC 8032 §5.1.3) that does not name a point of small order. Decided on
/// the 32 bytes alone, without a point decompression or compression (two field
/// exponentiations per signature, about a third of a batch's cost): a non-canonical y is
/// one of the 19 values p..2^255 − 1, and the points of small order are the eight torsion
/// points, compared with the sign bit cleared so that an x = 0 point written with the sign
/// bit set (not canonical, and of small order) is refused too. An `R` that names no point
/// at all passes here and fails the batch equation, and the single check then refuses it.
fn r_is_sound(sig: &ed25519_dalek::Signature) -> bool {
    let mut y = *sig.r_bytes();
    y[31] &= 0x7f;
    let non_canonical = y[0] >= 0xed && y[1..31].iter().all(|b| *b == 0xff) && y[31] == 0x7f;
    !non_canonical && !small_order_ys().contains(&y)
}

/// The encodings of the eight torsion points with the sign bit cleared (four distinct
/// values: a point and its negation differ only in the sign bit).
fn small_order_ys() -> &'static [[u8; 32]; 8] {
    static YS: std::sync::OnceLock<[[u8; 32]; 8]> = std::sync::OnceLock::new();
    YS.get_or_init(|| {
        curve25519_dalek::constants::EIGHT_TORSION.map(|p| {
            let mut y = p.compress().to_bytes();
            y[31] &= 0x7f;
            y
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity::from_seed(&[9u8; 32])
    }
    const LINE: &[u8] =
        br#"{"t":"msg","id":"01JAAAAAAAAAAAAAAAAAAAAAAA","ts":"2026-11-30T18:00:00.000Z","th":"t1","parts":[{"text":"hi <&>"}]}"#;

    #[test]
    fn sign_then_verify_keeps_the_original_bytes_as_prefix() {
        let signed = sign_encoded(&id(), LINE).unwrap();
        assert_eq!(&signed[..LINE.len() - 1], &LINE[..LINE.len() - 1]);
        assert!(signed.len() <= LINE.len() + SIG_FIELD_LEN);
        assert_eq!(verify_line(&id().key(), &signed), Ok(()));
        // Field order does not matter: the canonical form covers it.
        let v: Value = serde_json::from_slice(&signed).unwrap();
        let mut m = v.as_object().unwrap().clone();
        m.sort_keys();
        let reordered = serde_json::to_vec(&m).unwrap();
        assert_eq!(verify_line(&id().key(), &reordered), Ok(()));
    }

    #[test]
    fn refuses_a_second_signature() {
        let signed = sign_encoded(&id(), LINE).unwrap();
        assert!(sign_encoded(&id(), &signed).is_err());
    }

    #[test]
    fn tampered_field_is_bad() {
        let signed = sign_encoded(&id(), LINE).unwrap();
        let s = String::from_utf8(signed)
            .unwrap()
            .replace("hi <&>", "hi <&?");
        assert_eq!(verify_line(&id().key(), s.as_bytes()), Err(SigError::Bad));
        let s = s.replace("\"th\":\"t1\"", "\"th\":\"t2\"");
        assert_eq!(verify_line(&id().key(), s.as_bytes()), Err(SigError::Bad));
    }

    #[test]
    fn added_unknown_field_is_bad() {
        let signed = String::from_utf8(sign_encoded(&id(), LINE).unwrap()).unwrap();
        let s = signed.replacen("{", "{\"x\":1,", 1);
        assert_eq!(verify_line(&id().key(), s.as_bytes()), Err(SigError::Bad));
    }

    #[test]
    fn other_key_is_bad() {
        let signed = sign_encoded(&id(), LINE).unwrap();
        let other = Identity::from_seed(&[10u8; 32]).key();
        assert_eq!(verify_line(&other, &signed), Err(SigError::Bad));
    }

    #[test]
    fn missing_non_string_and_short_sig_are_refused() {
        let k = id().key();
        assert_eq!(verify_line(&k, LINE), Err(SigError::Missing));
        let s = br#"{"t":"msg","sig":5}"#;
        assert_eq!(verify_line(&k, s), Err(SigError::NotString));
        let s = br#"{"t":"msg","sig":"AAAA"}"#;
        assert_eq!(verify_line(&k, s), Err(SigError::Encoding));
        let s = br#"{"t":"msg","sig":"!!"}"#;
        assert_eq!(verify_line(&k, s), Err(SigError::Encoding));
    }

    #[test]
    fn duplicate_keys_and_non_objects_are_refused() {
        let k = id().key();
        let signed = String::from_utf8(sign_encoded(&id(), LINE).unwrap()).unwrap();
        // A duplicate `th` after the signed one: serde_json alone would keep the last.
        let dup = signed.replacen("\"th\":\"t1\"", "\"th\":\"t1\",\"th\":\"t1\"", 1);
        assert!(matches!(
            verify_line(&k, dup.as_bytes()),
            Err(SigError::NotObject(_))
        ));
        assert!(matches!(
            verify_line(&k, b"[1]"),
            Err(SigError::NotObject(_))
        ));
        assert!(matches!(
            verify_line(&k, b"\xff{}"),
            Err(SigError::NotObject(_))
        ));
    }

    #[test]
    fn standard_base64_sig_is_accepted() {
        let signed = String::from_utf8(sign_encoded(&id(), LINE).unwrap()).unwrap();
        let v: Value = serde_json::from_str(&signed).unwrap();
        let sig = v["sig"].as_str().unwrap();
        let raw = b64::decode_any(sig).unwrap();
        let std = b64::encode_std(&raw);
        let s = signed.replace(sig, &std);
        assert_eq!(verify_line(&id().key(), s.as_bytes()), Ok(()));
    }

    #[test]
    fn signed_kinds() {
        for k in ["msg", "state", "grant", "introduce"] {
            assert!(is_signed_kind(k));
        }
        for k in ["chunk", "ack", "hello", "auth", "resume", "ping", "err"] {
            assert!(!is_signed_kind(k));
        }
    }

    fn prepared(n: usize, signer: &Identity) -> Vec<Prepared> {
        (0..n)
            .map(|i| {
                let l = String::from_utf8(LINE.to_vec())
                    .unwrap()
                    .replace("hi <&>", &format!("line {i}"));
                prepare_line(&sign_encoded(signer, l.as_bytes()).unwrap()).unwrap()
            })
            .collect()
    }

    #[test]
    fn batch_verifies_good_lines_and_names_the_first_bad_one() {
        let k = id().key();
        let n = BATCH_MAX + 10;
        let good = prepared(n, &id());
        assert!(verify_batch(&k, &good).is_ok());
        assert!(verify_batch(&k, &[]).is_ok());
        assert!(verify_batch(&k, &good[..1]).is_ok());
        // A bad line in the second chunk, another later: the first is named.
        let mut bad = good.clone();
        bad[BATCH_MAX + 2].bytes.push(b' ');
        bad[BATCH_MAX + 7].bytes.push(b' ');
        assert_eq!(verify_batch(&k, &bad), Err((BATCH_MAX + 2, SigError::Bad)));
        // In the first chunk: its index.
        let mut bad = good.clone();
        bad[3] = prepared(1, &Identity::from_seed(&[10u8; 32])).remove(0);
        assert_eq!(verify_batch(&k, &bad), Err((3, SigError::Bad)));
        // Another sender's key: the first line.
        let other = Identity::from_seed(&[10u8; 32]).key();
        assert_eq!(verify_batch(&other, &good), Err((0, SigError::Bad)));
        // Split over two threads (n ≥ PARALLEL_MIN): a bad line in each half names the one
        // in the first; one only in the second half is named by its index in `lines`.
        assert!(n >= PARALLEL_MIN);
        let mut bad = good.clone();
        bad[n - 1].bytes.push(b' ');
        bad[n / 2 - 1].bytes.push(b' ');
        assert_eq!(verify_batch(&k, &bad), Err((n / 2 - 1, SigError::Bad)));
        assert_eq!(verify_in_order(&k, &bad), Err((n / 2 - 1, SigError::Bad)));
        let mut bad = good.clone();
        bad[n / 2].bytes.push(b' ');
        assert_eq!(verify_batch(&k, &bad), Err((n / 2, SigError::Bad)));
        assert_eq!(verify_in_order(&k, &bad), Err((n / 2, SigError::Bad)));
    }

    #[test]
    fn batch_refuses_what_verify_strict_refuses_for_r() {
        let k = id().key();
        let good = prepared(4, &id());
        // R of small order (the identity point, 1 ‖ 0…) and R not canonically encoded
        // (y = p, which reads as 0): refused as by single strict verification.
        let mut identity_r = [0u8; 64];
        identity_r[0] = 1;
        let mut non_canonical = [0xffu8; 64];
        non_canonical[0] = 0xed;
        non_canonical[31] = 0x7f;
        non_canonical[32..].fill(0);
        for r in [identity_r, non_canonical] {
            let mut lines = good.clone();
            lines[1].sig = ed25519_dalek::Signature::from_bytes(&r);
            assert!(!r_is_sound(&lines[1].sig));
            assert_eq!(verify_batch(&k, &lines), Err((1, SigError::Bad)));
        }
        assert!(good.iter().all(|p| r_is_sound(&p.sig)));
    }

    /// What the old check did: decompress, refuse small order, compress back and compare.
    fn r_is_sound_by_decompression(sig: &ed25519_dalek::Signature) -> Option<bool> {
        let r = curve25519_dalek::edwards::CompressedEdwardsY(*sig.r_bytes());
        r.decompress()
            .map(|p| !p.is_small_order() && p.compress() == r)
    }

    #[test]
    fn r_check_on_bytes_agrees_with_decompression_on_every_edge() {
        use curve25519_dalek::constants::EIGHT_TORSION;
        let mut rs: Vec<[u8; 32]> = Vec::new();
        // Every torsion point, with and without the sign bit; every non-canonical y, both signs.
        for p in EIGHT_TORSION {
            let b = p.compress().to_bytes();
            rs.push(b);
            let mut f = b;
            f[31] ^= 0x80;
            rs.push(f);
        }
        for low in 0xed..=0xffu8 {
            let mut y = [0xffu8; 32];
            y[0] = low;
            y[31] = 0x7f;
            rs.push(y);
            y[31] = 0xff;
            rs.push(y);
        }
        // The R of honest signatures, and byte patterns around the bounds.
        for p in prepared(8, &id()) {
            rs.push(*p.sig.r_bytes());
        }
        let mut y = [0xffu8; 32];
        y[0] = 0xec;
        y[31] = 0x7f;
        rs.push(y);
        for seed in 0u8..200 {
            rs.push(spread_bytes(seed));
        }
        let mut decodable = 0;
        for r in rs {
            let mut s = [0u8; 64];
            s[..32].copy_from_slice(&r);
            let sig = ed25519_dalek::Signature::from_bytes(&s);
            match r_is_sound_by_decompression(&sig) {
                // Decodable: the byte check must give the same answer.
                Some(old) => {
                    decodable += 1;
                    assert_eq!(r_is_sound(&sig), old, "R {r:02x?}");
                }
                // Not a point: the batch equation fails and singles refuse it, so the byte
                // check may pass it; it must not be a torsion encoding.
                None => assert!(!small_order_ys().contains(&{
                    let mut y = r;
                    y[31] &= 0x7f;
                    y
                })),
            }
        }
        assert!(decodable > 40, "{decodable} decodable R values tried");
    }

    /// Spread-out 32-byte values (SHA-512 of a counter, first half).
    fn spread_bytes(seed: u8) -> [u8; 32] {
        use sha2::Digest;
        let h = sha2::Sha512::digest([seed]);
        let mut out = [0u8; 32];
        out.copy_from_slice(&h[..32]);
        out
    }

    #[test]
    fn one_parse_gives_the_line_and_the_same_check_as_prepare_line() {
        use crate::wire::parse::parse_line_prepared;
        let k = id().key();
        // A msg as the parser takes it (parts with `k`).
        let plain = br#"{"t":"msg","id":"01JAAAAAAAAAAAAAAAAAAAAAAA","ts":"2026-11-30T18:00:00.000Z","th":"t1","parts":[{"k":"text","text":"hi"}]}"#;
        let signed = sign_encoded(&id(), plain).unwrap();
        let (line, p) = parse_line_prepared(&signed).unwrap();
        assert_eq!(line.kind(), "msg");
        let p = p.expect("msg is a signed kind").unwrap();
        let q = prepare_line(&signed).unwrap();
        assert_eq!((&p.bytes, p.sig), (&q.bytes, q.sig));
        assert_eq!(p.verify(&k), Ok(()));
        // Unsigned msg: the same refusal as verify_line's; other kinds: nothing made.
        let (_, p) = parse_line_prepared(plain).unwrap();
        assert_eq!(p.unwrap().unwrap_err(), SigError::Missing);
        let ack = br#"{"t":"ack","id":"a1","ts":"2026-11-30T18:00:00.000Z","th":"t1","re":"x"}"#;
        assert!(parse_line_prepared(ack).unwrap().1.is_none());
        // Parse errors stay frame errors.
        assert!(parse_line_prepared(b"{").is_err());
    }
}
