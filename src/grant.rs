//! Grants (protocol-notes §Grants, spec 10.2–10.4): signed capability objects
//! `{iss, sub, caps, exp, nonce, sig, aud?}`.
//!
//! - [`mint`] signs a new grant: 16-byte nonce, `exp` in whole seconds (RFC 3339 UTC).
//! - [`verify`] checks one grant object as received: shapes, keys (not weak), and the
//!   signature over the RFC 8785 canonical JSON without `sig` (unknown fields stay
//!   covered). Expiry is separate ([`Verified::expired_at`]) so that an expired grant with a
//!   good signature is reported as expired, not as forged.
//! - [`honored_caps`] applies this node's honoring rules: valid now, `aud` empty or us, and
//!   issued by us, by a trusted key, or by a holder of an `introduce` grant from us or a
//!   trusted key (then only the caps that introduce grant also lists, minus `introduce`; one
//!   level, no chains).
//! - [`grant_hash`] names a grant: the first 16 bytes of SHA-256 of its canonical form with
//!   `sig`, as lower-case hex.

use crate::canonical::{canonical_json, signing_bytes};
use crate::identity::Identity;
use crate::wire::{self, b64, Grant, PeerKey};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Nonce length of minted grants, in bytes.
pub const NONCE_LEN: usize = 16;
/// Most capabilities accepted in one grant.
pub const MAX_CAPS: usize = 64;
/// Longest capability name accepted, in bytes.
pub const MAX_CAP_LEN: usize = 64;
/// The capability that lets its holder introduce others (one level).
pub const INTRODUCE: &str = "introduce";

/// Capabilities this version acts on (README "Grants"): served requests (`exec`,
/// `fs:read`, `fs:write`), [`INTRODUCE`], and the artifact-thread caps
/// (`artifact:write`, `artifact:resolve`, `artifact:admin`, each also as `CAP@thr_…` for
/// one thread; see [`crate::artifact::caps`]).
pub const KNOWN_CAPS: [&str; 7] = [
    "exec",
    "fs:read",
    "fs:write",
    INTRODUCE,
    crate::artifact::caps::WRITE,
    crate::artifact::caps::RESOLVE,
    crate::artifact::caps::ADMIN,
];

/// Prefix marking a capability as deliberately custom (`custom:deploy` grants `deploy`).
pub const CUSTOM_PREFIX: &str = "custom:";

/// A capability as the user typed it, checked against [`KNOWN_CAPS`]: a known cap is
/// returned as is (an artifact cap may carry `@THREAD`, a thread id or unique prefix the
/// node resolves); `custom:NAME` gives `NAME`; any other name is accepted only when
/// `custom` is true. Errors say which name is unknown and what is known.
pub fn check_cap(cap: &str, custom: bool) -> Result<String, String> {
    if let Some(name) = cap.strip_prefix(CUSTOM_PREFIX) {
        if name.is_empty() {
            return Err(format!("{cap:?} names no capability"));
        }
        return Ok(name.to_string());
    }
    let (name, scope) = match cap.split_once('@') {
        Some((n, s)) => (n, Some(s)),
        None => (cap, None),
    };
    let artifact = [
        crate::artifact::caps::WRITE,
        crate::artifact::caps::RESOLVE,
        crate::artifact::caps::ADMIN,
    ];
    let known = match scope {
        None => KNOWN_CAPS.contains(&name),
        Some(th) => artifact.contains(&name) && !th.is_empty(),
    };
    if known || custom {
        return Ok(cap.to_string());
    }
    Err(match scope {
        Some(_) if KNOWN_CAPS.contains(&name) || artifact.contains(&name) => {
            format!("{cap:?}: only artifact caps take an @THREAD scope, and it must name a thread")
        }
        _ => format!(
            "unknown capability {cap:?} (known: {}, each artifact cap also as CAP@thr_…)",
            KNOWN_CAPS.join(", ")
        ),
    })
}

/// Why a grant is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// A field is missing, of the wrong type, or out of bounds.
    #[error("malformed grant: {0}")]
    Malformed(String),
    /// `iss`, `sub` or `aud` is not a valid, non-weak Ed25519 key.
    #[error("grant {field} is not a usable key: {detail}")]
    BadKey { field: &'static str, detail: String },
    /// The signature does not verify under `iss` (forged or altered).
    #[error("grant signature does not verify under its issuer")]
    BadSignature,
    /// `now >= exp`.
    #[error("grant expired at {exp}")]
    Expired { exp: String },
    /// `aud` names another node.
    #[error("grant is for another audience ({aud})")]
    WrongAudience { aud: String },
    /// The issuer is not us, not trusted, and holds no introduce grant that covers it.
    #[error("grant issuer {iss} is not trusted here")]
    UntrustedIssuer { iss: String },
    /// Revoked by its issuer here.
    #[error("grant {hash} was revoked")]
    Revoked { hash: String },
}

/// A grant whose shape, keys and signature checked out (not yet checked for time or
/// policy).
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub iss: PeerKey,
    pub sub: PeerKey,
    pub aud: Option<PeerKey>,
    pub caps: Vec<String>,
    /// Expiry, Unix seconds.
    pub exp_s: i64,
    /// The `exp` text as received.
    pub exp: String,
    /// [`grant_hash`] of the object.
    pub hash: String,
    /// The object as received (for storing and re-sending unchanged).
    pub object: Map<String, Value>,
}

impl Verified {
    /// Expired when `now >= exp` (protocol-notes §Grants).
    pub fn expired_at(&self, now_ms: u64) -> bool {
        (now_ms / 1000) as i64 >= self.exp_s
    }

    /// The wire form of the object as received.
    pub fn to_wire(&self) -> Result<Grant, GrantError> {
        serde_json::from_value(Value::Object(self.object.clone()))
            .map_err(|e| GrantError::Malformed(e.to_string()))
    }
}

/// Mint a grant from `identity` to `sub` for `caps`, valid for `ttl_s` seconds from
/// `now_ms` (exp rounded down to a whole second), optionally only for audience `aud`.
pub fn mint(
    identity: &Identity,
    sub: &PeerKey,
    caps: &[String],
    ttl_s: u64,
    aud: Option<&PeerKey>,
    now_ms: u64,
) -> Grant {
    let mut nonce = [0u8; NONCE_LEN];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
    let exp_ms = (now_ms / 1000 + ttl_s) * 1000;
    let exp = format!("{}Z", &wire::time::format_ms(exp_ms)[..19]);
    let mut g = Grant {
        iss: identity.key().to_string(),
        sub: sub.to_string(),
        caps: caps.to_vec(),
        exp,
        nonce: b64::encode_url(&nonce),
        sig: String::new(),
        aud: aud.map(|a| a.to_string()),
        extra: Map::new(),
    };
    let obj = object_of(&g);
    g.sig = crate::canonical::sign_object(identity, &obj);
    g
}

/// The JSON object of a wire grant (known fields and unknown ones it carried).
pub fn object_of(g: &Grant) -> Map<String, Value> {
    match serde_json::to_value(g) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// The grant's name: first 16 bytes of SHA-256 of its canonical JSON with `sig`, hex.
///
/// `sig` is taken in its canonical encoding (unpadded base64url of the 64 bytes): decoders
/// accept other base64 forms, and `sig` is not covered by itself, so without this one grant
/// could be re-encoded into many hashes (and slip past a revocation).
pub fn grant_hash(obj: &Map<String, Value>) -> String {
    let mut obj = obj.clone();
    if let Some(Value::String(sig)) = obj.get("sig") {
        if let Ok(bytes) = b64::decode_any(sig) {
            obj.insert("sig".into(), Value::String(b64::encode_url(&bytes)));
        }
    }
    let bytes = canonical_json(&Value::Object(obj)).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn key_field(obj: &Map<String, Value>, field: &'static str) -> Result<Option<PeerKey>, GrantError> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => PeerKey::parse(s).map(Some).map_err(|e| GrantError::BadKey {
            field,
            detail: e.to_string(),
        }),
        Some(_) => Err(GrantError::Malformed(format!("`{field}` is not a string"))),
    }
}

fn str_field<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<&'a str, GrantError> {
    match obj.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(GrantError::Malformed(format!("`{field}` is not a string"))),
        None => Err(GrantError::Malformed(format!("missing `{field}`"))),
    }
}

/// Verify a grant object as received: required fields and their types, keys parse and are
/// not weak, `caps` a list of at most [`MAX_CAPS`] short strings, `exp` RFC 3339, `nonce`
/// base64, and the signature (strict Ed25519 under `iss`) over the canonical JSON without
/// `sig`. Time and policy are checked by [`honored_caps`].
pub fn verify(obj: &Map<String, Value>) -> Result<Verified, GrantError> {
    let iss =
        key_field(obj, "iss")?.ok_or_else(|| GrantError::Malformed("missing `iss`".into()))?;
    let sub =
        key_field(obj, "sub")?.ok_or_else(|| GrantError::Malformed("missing `sub`".into()))?;
    let aud = key_field(obj, "aud")?;
    let caps = match obj.get("caps") {
        Some(Value::Array(a)) if a.len() <= MAX_CAPS => a
            .iter()
            .map(|c| match c {
                Value::String(s) if !s.is_empty() && s.len() <= MAX_CAP_LEN => Ok(s.clone()),
                _ => Err(GrantError::Malformed(
                    "`caps` must hold short strings".into(),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => {
            return Err(GrantError::Malformed(format!("more than {MAX_CAPS} caps")))
        }
        Some(_) => return Err(GrantError::Malformed("`caps` is not a list".into())),
        None => return Err(GrantError::Malformed("missing `caps`".into())),
    };
    let exp = str_field(obj, "exp")?.to_string();
    let exp_ns =
        wire::time::parse_rfc3339(&exp).map_err(|e| GrantError::Malformed(e.to_string()))?;
    let nonce = str_field(obj, "nonce")?;
    if b64::decode_any(nonce).map(|n| n.is_empty()).unwrap_or(true) {
        return Err(GrantError::Malformed("`nonce` is not base64".into()));
    }
    let sig = str_field(obj, "sig")?;
    let bytes = signing_bytes(obj).map_err(|e| GrantError::Malformed(e.to_string()))?;
    if !iss.verify_b64(&bytes, sig) {
        return Err(GrantError::BadSignature);
    }
    Ok(Verified {
        iss,
        sub,
        aud,
        caps,
        exp_s: (exp_ns.div_euclid(1_000_000_000)) as i64,
        exp,
        hash: grant_hash(obj),
        object: obj.clone(),
    })
}

/// Grants already verified, by [`grant_hash`], so that each grant's signature is checked
/// once rather than at every handshake and served request. A hit also requires the very
/// same object (the hash is a 128-bit name, not a proof). Bounded: at most `cap` entries;
/// beyond, an arbitrary entry makes room (it is verified again when next needed).
#[derive(Debug)]
pub struct VerifyCache {
    entries: std::collections::HashMap<String, std::sync::Arc<Verified>>,
    cap: usize,
    verifications: u64,
}

impl VerifyCache {
    /// Entries kept by [`VerifyCache::default`].
    pub const DEFAULT_CAP: usize = 4096;

    /// An empty cache of at most `cap` (≥ 1) grants.
    pub fn new(cap: usize) -> VerifyCache {
        VerifyCache {
            entries: std::collections::HashMap::new(),
            cap: cap.max(1),
            verifications: 0,
        }
    }

    /// [`verify`] `obj`, or the earlier result for the same object. Refusals are not kept
    /// (a forged grant costs its sender a signature check each time, as before).
    pub fn verify(
        &mut self,
        obj: &Map<String, Value>,
    ) -> Result<std::sync::Arc<Verified>, GrantError> {
        self.verify_named(&grant_hash(obj), obj)
    }

    /// Like [`VerifyCache::verify`] for a stored grant whose [`grant_hash`] is known
    /// (`hash`, as stored), skipping the canonical encoding on a hit.
    pub fn verify_named(
        &mut self,
        hash: &str,
        obj: &Map<String, Value>,
    ) -> Result<std::sync::Arc<Verified>, GrantError> {
        if let Some(v) = self.entries.get(hash) {
            if v.object == *obj {
                return Ok(v.clone());
            }
        }
        self.verifications += 1;
        let v = std::sync::Arc::new(verify(obj)?);
        if self.entries.len() >= self.cap {
            if let Some(k) = self.entries.keys().next().cloned() {
                self.entries.remove(&k);
            }
        }
        self.entries.insert(v.hash.clone(), v.clone());
        Ok(v)
    }

    /// Drop the entry of `hash` (its record was removed).
    pub fn forget(&mut self, hash: &str) {
        self.entries.remove(hash);
    }

    /// Signature checks done so far (cache misses), for tests and status.
    pub fn verifications(&self) -> u64 {
        self.verifications
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Default for VerifyCache {
    fn default() -> Self {
        VerifyCache::new(VerifyCache::DEFAULT_CAP)
    }
}

/// The honoring context of this node.
pub struct Policy<'a> {
    /// Our key.
    pub me: PeerKey,
    /// Keys configured as trusted issuers.
    pub trust: &'a [PeerKey],
    /// Revoked grant hashes.
    pub revoked: &'a dyn Fn(&str) -> bool,
    /// Valid `introduce` grants held by a key: every verified grant with sub = that key
    /// that we know of (the function need not filter; [`honored_caps`] checks them).
    pub introduce_grants_of: &'a dyn Fn(&PeerKey) -> Vec<Verified>,
}

/// The capabilities `g` gives its subject here, now; or why it gives none
/// (protocol-notes §Grants).
pub fn honored_caps(
    g: &Verified,
    policy: &Policy<'_>,
    now_ms: u64,
) -> Result<Vec<String>, GrantError> {
    if (policy.revoked)(&g.hash) {
        return Err(GrantError::Revoked {
            hash: g.hash.clone(),
        });
    }
    if g.expired_at(now_ms) {
        return Err(GrantError::Expired { exp: g.exp.clone() });
    }
    if let Some(aud) = g.aud {
        if aud != policy.me {
            return Err(GrantError::WrongAudience {
                aud: aud.to_string(),
            });
        }
    }
    let root = |k: &PeerKey| *k == policy.me || policy.trust.contains(k);
    if root(&g.iss) {
        return Ok(g.caps.clone());
    }
    // One level of introduction: iss holds a valid introduce grant from a root issuer.
    let mut allowed: Vec<String> = Vec::new();
    for intro in (policy.introduce_grants_of)(&g.iss) {
        let usable = intro.sub == g.iss
            && root(&intro.iss)
            && !intro.expired_at(now_ms)
            && !(policy.revoked)(&intro.hash)
            && intro.aud.is_none_or(|a| a == policy.me || a == g.iss)
            && intro.caps.iter().any(|c| c == INTRODUCE);
        if usable {
            for c in &intro.caps {
                if c != INTRODUCE && g.caps.contains(c) && !allowed.contains(c) {
                    allowed.push(c.clone());
                }
            }
        }
    }
    if allowed.is_empty() {
        return Err(GrantError::UntrustedIssuer {
            iss: g.iss.to_string(),
        });
    }
    Ok(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Identity {
        Identity::from_seed(&[n; 32])
    }
    const NOW: u64 = 1_790_000_000_000;

    fn verified(g: &Grant) -> Verified {
        verify(&object_of(g)).unwrap()
    }

    fn policy<'a>(
        me: PeerKey,
        trust: &'a [PeerKey],
        intros: &'a dyn Fn(&PeerKey) -> Vec<Verified>,
    ) -> Policy<'a> {
        Policy {
            me,
            trust,
            revoked: &|_| false,
            introduce_grants_of: intros,
        }
    }

    #[test]
    fn minted_grant_verifies_and_has_whole_second_expiry() {
        let (a, b) = (id(1), id(2));
        let g = mint(&a, &b.key(), &["exec".into()], 3600, None, NOW + 999);
        assert!(g.exp.ends_with(":20Z") || g.exp.ends_with('Z'));
        assert_eq!(g.exp.len(), "2026-09-21T12:53:20Z".len(), "{}", g.exp);
        assert_eq!(b64::decode_any(&g.nonce).unwrap().len(), NONCE_LEN);
        let v = verified(&g);
        assert_eq!(v.exp_s as u64, NOW / 1000 + 3600);
        assert_eq!(v.hash.len(), 32);
    }

    #[test]
    fn the_hash_does_not_depend_on_how_sig_is_encoded() {
        let (a, b) = (id(1), id(2));
        let g = mint(&a, &b.key(), &["exec".into()], 3600, None, NOW);
        let obj = object_of(&g);
        let h = grant_hash(&obj);
        let raw = b64::decode_any(&g.sig).unwrap();
        for other in [
            format!("{}==", g.sig),
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &raw),
        ] {
            let mut o = obj.clone();
            o.insert("sig".into(), Value::String(other));
            assert!(verify(&o).is_ok(), "other encodings still verify");
            assert_eq!(grant_hash(&o), h, "…and name the same grant");
        }
    }

    #[test]
    fn altered_caps_fail_the_signature() {
        let (a, b) = (id(1), id(2));
        let g = mint(&a, &b.key(), &["exec".into()], 3600, None, NOW);
        let mut obj = object_of(&g);
        obj.insert("caps".into(), serde_json::json!(["admin"]));
        assert_eq!(verify(&obj).unwrap_err(), GrantError::BadSignature);
    }

    #[test]
    fn unknown_fields_are_covered_by_the_signature() {
        let (a, b) = (id(1), id(2));
        let mut obj = serde_json::json!({
            "iss": a.key().to_string(), "sub": b.key().to_string(), "caps": ["exec"],
            "exp": "2099-01-01T00:00:00Z", "nonce": "AAAAAAAAAAAAAAAAAAAAAA", "ext": {"why": "ci"}
        });
        let m = obj.as_object_mut().unwrap();
        let sig = crate::canonical::sign_object(&a, m);
        m.insert("sig".into(), sig.into());
        assert!(verify(m).is_ok());
        m.insert("ext".into(), serde_json::json!({"why": "prod"}));
        assert_eq!(verify(m).unwrap_err(), GrantError::BadSignature);
    }

    #[test]
    fn weak_or_malformed_keys_are_refused() {
        let (a, b) = (id(1), id(2));
        let g = mint(&a, &b.key(), &["exec".into()], 3600, None, NOW);
        let mut obj = object_of(&g);
        obj.insert(
            "iss".into(),
            "ed25519:AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
        );
        assert!(matches!(
            verify(&obj),
            Err(GrantError::BadKey { field: "iss", .. })
        ));
        let mut obj = object_of(&g);
        obj.remove("sub");
        assert!(matches!(verify(&obj), Err(GrantError::Malformed(_))));
        let mut obj = object_of(&g);
        obj.insert("caps".into(), serde_json::json!("exec"));
        assert!(matches!(verify(&obj), Err(GrantError::Malformed(_))));
        let mut obj = object_of(&g);
        obj.insert("exp".into(), "tomorrow".into());
        assert!(matches!(verify(&obj), Err(GrantError::Malformed(_))));
    }

    #[test]
    fn honoring_rules() {
        let (me, t, x, peer) = (id(1), id(2), id(3), id(4));
        let none = |_: &PeerKey| Vec::new();
        let trust = [t.key()];
        let p = policy(me.key(), &trust, &none);
        // Ours: honored.
        let g = verified(&mint(&me, &peer.key(), &["exec".into()], 60, None, NOW));
        assert_eq!(honored_caps(&g, &p, NOW).unwrap(), ["exec"]);
        // Expired exactly at exp.
        assert!(matches!(
            honored_caps(&g, &p, NOW - NOW % 1000 + 60_000),
            Err(GrantError::Expired { .. })
        ));
        // Trusted issuer: honored; untrusted: refused.
        let g = verified(&mint(&t, &peer.key(), &["fs:read".into()], 60, None, NOW));
        assert_eq!(honored_caps(&g, &p, NOW).unwrap(), ["fs:read"]);
        let g = verified(&mint(&x, &peer.key(), &["fs:read".into()], 60, None, NOW));
        assert!(matches!(
            honored_caps(&g, &p, NOW),
            Err(GrantError::UntrustedIssuer { .. })
        ));
        // Audience: only us.
        let g = verified(&mint(
            &me,
            &peer.key(),
            &["exec".into()],
            60,
            Some(&x.key()),
            NOW,
        ));
        assert!(matches!(
            honored_caps(&g, &p, NOW),
            Err(GrantError::WrongAudience { .. })
        ));
        let g = verified(&mint(
            &me,
            &peer.key(),
            &["exec".into()],
            60,
            Some(&me.key()),
            NOW,
        ));
        assert!(honored_caps(&g, &p, NOW).is_ok());
        // Revoked.
        let revoked = |h: &str| h == g.hash;
        let p2 = Policy {
            revoked: &revoked,
            ..policy(me.key(), &trust, &none)
        };
        assert!(matches!(
            honored_caps(&g, &p2, NOW),
            Err(GrantError::Revoked { .. })
        ));
    }

    #[test]
    fn introduction_is_one_level_and_attenuated() {
        let (me, x, y, peer) = (id(1), id(3), id(5), id(4));
        // We gave x `introduce` + exec; x grants peer exec + fs:write.
        let intro = verified(&mint(
            &me,
            &x.key(),
            &["introduce".into(), "exec".into()],
            60,
            None,
            NOW,
        ));
        let intros = move |k: &PeerKey| {
            if *k == intro.sub {
                vec![intro.clone()]
            } else {
                vec![]
            }
        };
        let p = policy(me.key(), &[], &intros);
        let g = verified(&mint(
            &x,
            &peer.key(),
            &["exec".into(), "fs:write".into(), "introduce".into()],
            60,
            None,
            NOW,
        ));
        assert_eq!(
            honored_caps(&g, &p, NOW).unwrap(),
            ["exec"],
            "only caps the introduce grant lists, never introduce"
        );
        // y got introduce from x (not a root): no chains.
        let chained = verified(&mint(
            &x,
            &y.key(),
            &["introduce".into(), "exec".into()],
            60,
            None,
            NOW,
        ));
        let intros2 = move |k: &PeerKey| {
            if *k == chained.sub {
                vec![chained.clone()]
            } else {
                vec![]
            }
        };
        let p2 = policy(me.key(), &[], &intros2);
        let g = verified(&mint(&y, &peer.key(), &["exec".into()], 60, None, NOW));
        assert!(matches!(
            honored_caps(&g, &p2, NOW),
            Err(GrantError::UntrustedIssuer { .. })
        ));
    }

    #[test]
    fn unknown_caps_need_custom() {
        for known in KNOWN_CAPS {
            assert_eq!(check_cap(known, false).as_deref(), Ok(known));
        }
        assert_eq!(
            check_cap("artifact:write@thr_01K", false).as_deref(),
            Ok("artifact:write@thr_01K")
        );
        for bad in [
            "nonsense-cap",
            "exec@thr_1",
            "artifact:write@",
            "Exec",
            "admin",
        ] {
            assert!(check_cap(bad, false).is_err(), "{bad}");
        }
        assert_eq!(
            check_cap("nonsense-cap", true).as_deref(),
            Ok("nonsense-cap")
        );
        assert_eq!(check_cap("custom:deploy", false).as_deref(), Ok("deploy"));
        assert!(check_cap("custom:", false).is_err());
    }
}
