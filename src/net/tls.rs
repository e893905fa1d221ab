//! rustls configuration for the TLS binding (spec/tls-binding.md): ring provider, TLS 1.3
//! only (RFC 8446), ALPN `awp/0`, mutual authentication with a self-signed X.509
//! certificate for the node's Ed25519 key (RFC 8410), no CA.
//!
//! Identity is the key, not the certificate: the verifiers take the Ed25519 key out of the
//! peer's certificate, refuse weak keys and keys other than the dialed pin, and check the
//! TLS 1.3 `CertificateVerify` signature with that key. Issuer, names, validity dates and
//! the certificate's own signature are not checked: a self-signed certificate proves
//! nothing beyond possession of the key, which `CertificateVerify` already proves. The
//! session then requires `hello.key` to equal the certificate key (the binding rule).
//!
//! Session resumption is disabled on both sides: a resumed handshake skips certificate
//! verification, and every server shares the SNI name, so a ticket from one peer could
//! otherwise stand in for a pinned check against another.

use super::NetError;
use crate::identity::Identity;
use crate::wire::PeerKey;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError,
    ServerConfig, SignatureScheme,
};
use std::sync::Arc;
use zeroize::Zeroizing;

/// ALPN protocol id, offered by the client and required on both sides.
pub const ALPN: &[u8] = b"awp/0";

/// The fixed SNI name sent by dialers and written as the certificate's DNS SAN. `.invalid`
/// (RFC 6761) never resolves, so it cannot collide with a real host's certificate.
pub const SERVER_NAME: &str = "awp.invalid";

/// The certificate's subject common name.
pub const CERT_COMMON_NAME: &str = "awp node";

/// Server and client configurations for one identity.
pub struct TlsConfig {
    key: PeerKey,
    provider: Arc<CryptoProvider>,
    server: Arc<ServerConfig>,
    /// Client config for unpinned dials (pinned dials build their own).
    client_unpinned: Arc<ClientConfig>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    key_pkcs8: Zeroizing<Vec<u8>>,
    key_pem: Zeroizing<String>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

fn tls_err(what: &str, e: impl std::fmt::Display) -> NetError {
    NetError::Tls(format!("{what}: {e}"))
}

/// Serial number derived from the key: the first 16 bytes of SHA-256(key), top bit clear
/// (RFC 5280 §4.1.2.2: positive, at most 20 bytes), never zero.
fn serial_for(key: &PeerKey) -> Vec<u8> {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let mut serial = digest[..16].to_vec();
    serial[0] &= 0x7f;
    serial[0] |= 0x40;
    serial
}

impl TlsConfig {
    /// Build both configs from `identity` (certificate generated in memory; validity
    /// 1975–4096, never checked by peers).
    ///
    /// Errors: [`NetError::Tls`] if the key cannot be loaded or the configs cannot be built
    /// (a bug or a broken identity, not a peer's fault).
    pub fn new(identity: &Identity) -> Result<TlsConfig, NetError> {
        let key = identity.key();
        let key_pkcs8 = Zeroizing::new(identity.pkcs8_der());
        let pkcs8 = PrivatePkcs8KeyDer::from(key_pkcs8.as_slice());
        let key_pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ED25519)
            .map_err(|e| tls_err("loading the identity key", e))?;
        if key_pair.public_key_raw() != key.as_bytes() {
            return Err(NetError::Tls(
                "identity key does not match its PKCS#8 encoding".into(),
            ));
        }
        let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .map_err(|e| tls_err("certificate parameters", e))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, CERT_COMMON_NAME);
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial_for(&key)));
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .self_signed(&key_pair)
            .map_err(|e| tls_err("self-signing the certificate", e))?;
        let cert_der = cert.der().clone();
        let cert_pem = cert.pem();
        let key_pem = Zeroizing::new(key_pair.serialize_pem());

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = server_config(&provider, &cert_der, &key_pkcs8)?;
        let client_unpinned = client_config(&provider, &cert_der, &key_pkcs8, None)?;
        Ok(TlsConfig {
            key,
            provider,
            server,
            client_unpinned,
            cert_der,
            cert_pem,
            key_pkcs8,
            key_pem,
        })
    }

    /// The key this configuration presents.
    pub fn key(&self) -> PeerKey {
        self.key
    }

    /// The server configuration (client certificate required, ALPN `awp/0`).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// A client configuration that accepts only a server certificate for `pin` (any
    /// non-weak Ed25519 key when `None`). Errors: [`NetError::Tls`] as in [`TlsConfig::new`].
    pub fn client_config(&self, pin: Option<PeerKey>) -> Result<Arc<ClientConfig>, NetError> {
        match pin {
            None => Ok(self.client_unpinned.clone()),
            Some(_) => client_config(&self.provider, &self.cert_der, &self.key_pkcs8, pin),
        }
    }

    /// The certificate, DER.
    pub fn certificate_der(&self) -> &[u8] {
        self.cert_der.as_ref()
    }

    /// The certificate, PEM (for `openssl s_client -cert`).
    pub fn certificate_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The private key as PKCS#8 PEM (for `openssl s_client -key`). Secret: write it only
    /// to a file readable by the owner.
    pub fn private_key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Ed25519 signature by this configuration's key over `msg` (the signed request line
    /// of a relay circuit, spec/relay-circuits.md). Errors: [`NetError::Tls`] if the key
    /// cannot be decoded (as in [`TlsConfig::new`]).
    pub(crate) fn sign(&self, msg: &[u8]) -> Result<[u8; 64], NetError> {
        use ed25519_dalek::pkcs8::DecodePrivateKey;
        use ed25519_dalek::Signer;
        let signing = ed25519_dalek::SigningKey::from_pkcs8_der(&self.key_pkcs8)
            .map_err(|e| tls_err("decoding the identity key", e))?;
        Ok(signing.sign(msg).to_bytes())
    }
}

/// TLS 1.3 only (RFC 8446); the provider is built without TLS 1.2 as well.
static PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn protocol_versions() -> &'static [&'static rustls::SupportedProtocolVersion] {
    PROTOCOL_VERSIONS
}

fn server_config(
    provider: &Arc<CryptoProvider>,
    cert: &CertificateDer<'static>,
    pkcs8: &[u8],
) -> Result<Arc<ServerConfig>, NetError> {
    let verifier = Arc::new(PeerCertVerifier {
        algorithms: provider.signature_verification_algorithms,
        pin: None,
    });
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(protocol_versions())
        .map_err(|e| tls_err("server protocol versions", e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![cert.clone()],
            PrivateKeyDer::Pkcs8(pkcs8.to_vec().into()),
        )
        .map_err(|e| tls_err("server certificate", e))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

fn client_config(
    provider: &Arc<CryptoProvider>,
    cert: &CertificateDer<'static>,
    pkcs8: &[u8],
    pin: Option<PeerKey>,
) -> Result<Arc<ClientConfig>, NetError> {
    let verifier = Arc::new(PeerCertVerifier {
        algorithms: provider.signature_verification_algorithms,
        pin,
    });
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(protocol_versions())
        .map_err(|e| tls_err("client protocol versions", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(
            vec![cert.clone()],
            PrivateKeyDer::Pkcs8(pkcs8.to_vec().into()),
        )
        .map_err(|e| tls_err("client certificate", e))?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// The SNI name as rustls wants it.
pub(crate) fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("constant is a valid DNS name")
}

/// Why a certificate's key was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertKeyError {
    /// Not a parseable DER X.509 certificate (or trailing bytes after it).
    #[error("certificate is not valid DER X.509")]
    BadEncoding,
    /// SPKI algorithm is not id-Ed25519 (1.3.101.112) with absent parameters (RFC 8410 §3).
    #[error("certificate key is not Ed25519")]
    NotEd25519,
    /// Ed25519 SPKI whose key is not 32 bytes (RFC 8410 §4).
    #[error("Ed25519 key must be 32 bytes, got {0}")]
    Length(usize),
    /// Invalid point or weak (small-order) key.
    #[error("certificate key refused: {0}")]
    Key(#[from] crate::wire::KeyError),
    /// The key is valid but not the pinned one.
    #[error("certificate key {got} does not match the pinned {want}")]
    PinMismatch { got: PeerKey, want: PeerKey },
}

/// The Ed25519 key of a DER certificate (SPKI OID 1.3.101.112, 32 bytes, RFC 8410), checked
/// not weak. Never panics on peer input.
pub fn certificate_key(der: &[u8]) -> Result<PeerKey, CertKeyError> {
    let (rest, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| CertKeyError::BadEncoding)?;
    if !rest.is_empty() {
        return Err(CertKeyError::BadEncoding);
    }
    let spki = cert.public_key();
    if spki.algorithm.algorithm != x509_parser::oid_registry::OID_SIG_ED25519
        || spki.algorithm.parameters.is_some()
    {
        return Err(CertKeyError::NotEd25519);
    }
    let bits = &spki.subject_public_key;
    let raw: &[u8] = bits.data.as_ref();
    let bytes: [u8; 32] = raw
        .try_into()
        .map_err(|_| CertKeyError::Length(raw.len()))?;
    Ok(PeerKey::from_bytes(&bytes)?)
}

impl From<CertKeyError> for rustls::Error {
    fn from(e: CertKeyError) -> rustls::Error {
        let ce = match e {
            CertKeyError::BadEncoding => CertificateError::BadEncoding,
            other => CertificateError::Other(OtherError(Arc::new(other))),
        };
        rustls::Error::InvalidCertificate(ce)
    }
}

/// Verifies the peer's certificate on either side: Ed25519 key, not weak, equal to `pin`
/// when set; TLS 1.3 Ed25519 handshake signatures only.
#[derive(Debug)]
struct PeerCertVerifier {
    algorithms: WebPkiSupportedAlgorithms,
    pin: Option<PeerKey>,
}

impl PeerCertVerifier {
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let key = certificate_key(end_entity.as_ref())?;
        match self.pin {
            Some(want) if want != key => Err(CertKeyError::PinMismatch { got: key, want }.into()),
            _ => Ok(()),
        }
    }

    fn tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme != SignatureScheme::ED25519 {
            return Err(rustls::Error::PeerIncompatible(
                rustls::PeerIncompatible::NoSignatureSchemesInCommon,
            ));
        }
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn tls12_refused() -> rustls::Error {
        rustls::Error::General("TLS 1.2 handshake signatures are refused: TLS 1.3 only".into())
    }
}

impl ServerCertVerifier for PeerCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(Self::tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

impl ClientCertVerifier for PeerCertVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(Self::tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

/// For tests elsewhere in `net`: a verifier usable in hand-built client configs.
#[cfg(test)]
pub(crate) fn test_server_verifier(pin: Option<PeerKey>) -> Arc<dyn ServerCertVerifier> {
    Arc::new(PeerCertVerifier {
        algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        pin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_carries_the_identity_key() {
        let id = Identity::from_seed(&[1u8; 32]);
        let tls = TlsConfig::new(&id).unwrap();
        assert_eq!(certificate_key(tls.certificate_der()).unwrap(), id.key());
        let (_, cert) = x509_parser::parse_x509_certificate(tls.certificate_der()).unwrap();
        let cn = cert.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), CERT_COMMON_NAME);
        assert_eq!(cert.raw_serial(), serial_for(&id.key()).as_slice());
        assert!(tls
            .certificate_pem()
            .starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(tls
            .private_key_pem()
            .starts_with("-----BEGIN PRIVATE KEY-----"));
        // Deterministic: same seed, same certificate.
        let again = TlsConfig::new(&Identity::from_seed(&[1u8; 32])).unwrap();
        assert_eq!(again.certificate_der(), tls.certificate_der());
    }

    #[test]
    fn certificate_key_refuses_garbage_and_other_algorithms() {
        assert_eq!(certificate_key(b""), Err(CertKeyError::BadEncoding));
        assert_eq!(
            certificate_key(&[0x30, 0x03, 1, 2, 3]),
            Err(CertKeyError::BadEncoding)
        );
        let id = Identity::from_seed(&[1u8; 32]);
        let tls = TlsConfig::new(&id).unwrap();
        let mut trailing = tls.certificate_der().to_vec();
        trailing.push(0);
        assert_eq!(certificate_key(&trailing), Err(CertKeyError::BadEncoding));

        let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .unwrap()
            .self_signed(&p256)
            .unwrap();
        assert_eq!(certificate_key(cert.der()), Err(CertKeyError::NotEd25519));
    }

    #[test]
    fn certificate_key_refuses_a_weak_key() {
        // Same certificate with its SPKI key replaced by the identity point (small order).
        // The certificate's own signature is not checked, so only the key check can refuse.
        let id = Identity::from_seed(&[1u8; 32]);
        let tls = TlsConfig::new(&id).unwrap();
        let der = tls.certificate_der().to_vec();
        let key = id.key();
        let at = der
            .windows(32)
            .position(|w| w == key.as_bytes())
            .expect("key bytes in the certificate");
        let mut weak = der.clone();
        weak[at..at + 32].copy_from_slice(&[0u8; 32]);
        weak[at] = 1;
        assert_eq!(
            certificate_key(&weak),
            Err(CertKeyError::Key(crate::wire::KeyError::Weak))
        );
    }

    #[test]
    fn pin_mismatch_is_refused_by_the_verifier() {
        let a = Identity::from_seed(&[1u8; 32]);
        let b = Identity::from_seed(&[2u8; 32]);
        let tls = TlsConfig::new(&a).unwrap();
        let der = CertificateDer::from(tls.certificate_der().to_vec());
        let right = PeerCertVerifier {
            algorithms: tls.provider.signature_verification_algorithms,
            pin: Some(a.key()),
        };
        assert!(right.check(&der).is_ok());
        let wrong = PeerCertVerifier {
            algorithms: tls.provider.signature_verification_algorithms,
            pin: Some(b.key()),
        };
        match wrong.check(&der) {
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(e))) => {
                let msg = e.0.to_string();
                assert!(msg.contains("does not match the pinned"), "{msg}");
            }
            other => panic!("expected a pin refusal, got {other:?}"),
        }
    }
}
