//! The node's Ed25519 identity: `$AWP_HOME/identity.json`
//! `{"key":"ed25519:…","seed":"<base64url 32 bytes>"}`, mode 0600, written atomically,
//! created on first start; a key that does not match its seed is an error.

use crate::wire::{b64, PeerKey};
use std::io::Write;
use std::path::Path;
use zeroize::Zeroizing;

/// Context string of the auth transcript (§7.2).
pub const AUTH_CONTEXT: &[u8] = b"awp-auth-v0";

/// File name of the identity inside the node's home directory.
pub const IDENTITY_FILE: &str = "identity.json";

/// Why the identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid identity file: {detail}")]
    Malformed { path: String, detail: String },
    #[error("{path}: key {key} does not match its seed")]
    Mismatch { path: String, key: String },
}

/// A signing identity.
pub struct Identity {
    signing: ed25519_dalek::SigningKey,
    key: PeerKey,
}

impl std::fmt::Debug for Identity {
    /// Shows the public key only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("key", &self.key).finish()
    }
}

/// On-disk form of identity.json.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityFile {
    key: String,
    seed: String,
}

impl Drop for IdentityFile {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.seed);
    }
}

impl Identity {
    /// From a 32-byte seed (the RFC 8032 private key).
    ///
    /// # Panics
    /// Only if the seed yields a small-order public key, which does not happen for an
    /// honestly derived Ed25519 key (the scalar is clamped to a multiple of 8).
    pub fn from_seed(seed: &[u8; 32]) -> Identity {
        let signing = ed25519_dalek::SigningKey::from_bytes(seed);
        let key = PeerKey::from_bytes(signing.verifying_key().as_bytes())
            .expect("an Ed25519 key derived from a seed is a valid, non-weak point");
        Identity { signing, key }
    }

    /// Fresh random identity from the operating system's random source.
    pub fn generate() -> Identity {
        let mut seed = Zeroizing::new([0u8; 32]);
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, seed.as_mut());
        Identity::from_seed(&seed)
    }

    /// Load `home/identity.json`, or create it (with a fresh key, mode 0600, written to a
    /// temporary file, fsynced, renamed into place, directory fsynced) when absent. `home`
    /// is created if missing.
    ///
    /// Errors: [`IdentityError::Io`] on file system failures, [`IdentityError::Malformed`]
    /// when the file is not `{"key","seed"}` with a 32-byte base64 seed and a parseable key,
    /// [`IdentityError::Mismatch`] when the key is not the seed's.
    pub fn load_or_create(home: &Path) -> Result<Identity, IdentityError> {
        let path = home.join(IDENTITY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => Identity::from_file_bytes(&Zeroizing::new(bytes), &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = Identity::generate();
                id.write_file(home)?;
                Ok(id)
            }
            Err(source) => Err(io_err(&path, source)),
        }
    }

    /// Load an identity file (the format of `identity.json`) from any path.
    pub fn load(path: &Path) -> Result<Identity, IdentityError> {
        let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| io_err(path, e))?);
        Identity::from_file_bytes(&bytes, path)
    }

    fn from_file_bytes(bytes: &[u8], path: &Path) -> Result<Identity, IdentityError> {
        let malformed = |detail: String| IdentityError::Malformed {
            path: path.display().to_string(),
            detail,
        };
        let file: IdentityFile =
            serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
        let seed = Zeroizing::new(
            b64::decode_any(&file.seed).map_err(|_| malformed("seed is not base64".into()))?,
        );
        let seed: &[u8; 32] = seed
            .as_slice()
            .try_into()
            .map_err(|_| malformed(format!("seed must be 32 bytes, got {}", seed.len())))?;
        let key = PeerKey::parse(&file.key).map_err(|e| malformed(format!("key: {e}")))?;
        let id = Identity::from_seed(seed);
        if id.key != key {
            return Err(IdentityError::Mismatch {
                path: path.display().to_string(),
                key: file.key.clone(),
            });
        }
        Ok(id)
    }

    /// The identity file's JSON text (with a trailing newline). Holds the secret seed.
    pub fn to_file_json(&self) -> Zeroizing<String> {
        let file = IdentityFile {
            key: self.key.to_string(),
            seed: b64::encode_url(self.signing.as_bytes()),
        };
        let mut s = Zeroizing::new(serde_json::to_string(&file).expect("strings serialise"));
        s.push('\n');
        s
    }

    /// Write `home/identity.json` atomically with mode 0600 (temp file, fsync, rename,
    /// fsync of the directory), replacing any existing file.
    pub fn write_file(&self, home: &Path) -> Result<(), IdentityError> {
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(home)
                .map_err(|e| io_err(home, e))?;
        }
        let path = home.join(IDENTITY_FILE);
        let tmp = home.join(format!(".{IDENTITY_FILE}.tmp"));
        let json = self.to_file_json();
        let write = || -> std::io::Result<()> {
            let _ = std::fs::remove_file(&tmp);
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp)?;
            f.write_all(json.as_bytes())?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, &path)?;
            #[cfg(unix)]
            std::fs::File::open(home)?.sync_all()?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(&path, e)
        })
    }

    /// Our public key.
    pub fn key(&self) -> PeerKey {
        self.key
    }

    /// Ed25519 signature (64 bytes, RFC 8032, deterministic) over `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        self.signing.sign(msg).to_bytes()
    }

    /// PKCS#8 v1 DER of the private key (RFC 8410, 48 bytes, no embedded public key; for
    /// rustls / rcgen). Holds the secret: the caller should zeroize it after use.
    pub fn pkcs8_der(&self) -> Vec<u8> {
        use ed25519_dalek::pkcs8::{EncodePrivateKey, KeypairBytes};
        // v1 (no embedded public key): what rustls and rcgen load with ring.
        let bytes = KeypairBytes {
            secret_key: self.signing.to_bytes(),
            public_key: None,
        };
        bytes
            .to_pkcs8_der()
            .expect("PKCS#8 encoding of an Ed25519 key cannot fail")
            .as_bytes()
            .to_vec()
    }
}

fn io_err(path: &Path, source: std::io::Error) -> IdentityError {
    IdentityError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The bytes signed by auth: `"awp-auth-v0" || 0x00 || my_hello || 0x00 || peer_hello`,
/// hello lines exactly as sent/received without the newline (§7.2).
pub fn auth_transcript(my_hello: &[u8], peer_hello: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(AUTH_CONTEXT.len() + 2 + my_hello.len() + peer_hello.len());
    t.extend_from_slice(AUTH_CONTEXT);
    t.push(0);
    t.extend_from_slice(my_hello);
    t.push(0);
    t.extend_from_slice(peer_hello);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_then_loads_the_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let a = Identity::load_or_create(&home).unwrap();
        let b = Identity::load_or_create(&home).unwrap();
        assert_eq!(a.key(), b.key());
        assert!(!home.join(".identity.json.tmp").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(home.join(IDENTITY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn mismatched_key_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let a = Identity::from_seed(&[1u8; 32]);
        let b = Identity::from_seed(&[2u8; 32]);
        let json = a
            .to_file_json()
            .replace(&a.key().to_string(), &b.key().to_string());
        std::fs::write(dir.path().join(IDENTITY_FILE), json).unwrap();
        let err = Identity::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, IdentityError::Mismatch { .. }), "{err}");
    }

    #[test]
    fn malformed_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [
            "",
            "{}",
            r#"{"key":"ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg","seed":"AAAA"}"#,
            r#"{"key":"nope","seed":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"}"#,
        ] {
            std::fs::write(dir.path().join(IDENTITY_FILE), bad).unwrap();
            let err = Identity::load_or_create(dir.path()).unwrap_err();
            assert!(
                matches!(err, IdentityError::Malformed { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn pkcs8_der_is_the_rfc8410_form() {
        let id = Identity::from_seed(&[9u8; 32]);
        let der = id.pkcs8_der();
        assert_eq!(der.len(), 48);
        assert_eq!(&der[der.len() - 32..], &[9u8; 32]);
        use ed25519_dalek::pkcs8::DecodePrivateKey;
        let back = ed25519_dalek::SigningKey::from_pkcs8_der(&der).unwrap();
        assert_eq!(back.verifying_key().as_bytes(), id.key().as_bytes());
    }

    #[test]
    fn debug_does_not_show_the_seed() {
        let id = Identity::from_seed(&[3u8; 32]);
        let dbg = format!("{id:?}");
        assert!(dbg.contains("ed25519:"));
        assert!(!dbg.contains(&b64::encode_url(&[3u8; 32])));
    }
}
