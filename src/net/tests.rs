//! Loopback tests for dialing, listening and the TLS binding. Every test binds
//! 127.0.0.1 port 0 (or a temporary Unix path) and is bounded by a timeout.

use super::*;
use crate::identity::Identity;
use std::future::Future;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BOUND: Duration = Duration::from_secs(10);

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("test step timed out")
}

fn identity(seed: u8) -> (Identity, TlsConfig) {
    let id = Identity::from_seed(&[seed; 32]);
    let tls = TlsConfig::new(&id).unwrap();
    (id, tls)
}

fn addr(s: &str) -> Address {
    s.parse().unwrap()
}

async fn tls_listener(tls: &TlsConfig) -> Listener {
    Listener::bind(&addr("tls:127.0.0.1:0"), tls, &DialOptions::default())
        .await
        .unwrap()
}

/// Accept one socket and run its handshake in a task.
fn accept_one(listener: Listener) -> tokio::task::JoinHandle<(Listener, Result<Conn, NetError>)> {
    tokio::spawn(async move {
        let incoming = listener.accept().await.unwrap();
        let res = incoming.handshake().await;
        (listener, res)
    })
}

async fn round_trip(a: &mut Conn, b: &mut Conn) {
    a.writer.write_all(b"{\"t\":\"ping\"}\r\n").await.unwrap();
    a.writer.flush().await.unwrap();
    assert_eq!(
        bounded(b.reader.read_line()).await.unwrap().unwrap(),
        b"{\"t\":\"ping\"}\r"
    );
    b.writer.write_all(b"pong\n").await.unwrap();
    b.writer.flush().await.unwrap();
    assert_eq!(
        bounded(a.reader.read_line()).await.unwrap().unwrap(),
        b"pong"
    );
}

#[tokio::test]
async fn tls_dial_and_accept_see_each_others_keys() {
    let (server_id, server_tls) = identity(1);
    let (client_id, client_tls) = identity(2);
    let listener = tls_listener(&server_tls).await;
    let target = listener.local_address();
    assert!(
        matches!(target, Address::Tls { ref host, port, pin: None } if host == "127.0.0.1" && port != 0)
    );
    let server = accept_one(listener);
    let mut client = bounded(dial(&target, &client_tls, &DialOptions::default()))
        .await
        .unwrap();
    let (_l, res) = bounded(server).await.unwrap();
    let mut server = res.unwrap();
    assert_eq!(client.transport, Transport::Tls);
    assert_eq!(server.transport, Transport::Tls);
    assert_eq!(client.peer_cert_key, Some(server_id.key()));
    assert_eq!(server.peer_cert_key, Some(client_id.key()));
    assert!(client.remote.starts_with("127.0.0.1:"));
    round_trip(&mut client, &mut server).await;
}

#[tokio::test]
async fn pinned_dial_to_the_right_key_works() {
    let (server_id, server_tls) = identity(1);
    let (_, client_tls) = identity(2);
    let listener = tls_listener(&server_tls).await;
    let target = listener.local_address().with_pin(server_id.key());
    let server = accept_one(listener);
    let mut client = bounded(dial(&target, &client_tls, &DialOptions::default()))
        .await
        .unwrap();
    let mut server = bounded(server).await.unwrap().1.unwrap();
    assert_eq!(client.peer_cert_key, Some(server_id.key()));
    round_trip(&mut client, &mut server).await;
}

#[tokio::test]
async fn pinned_dial_to_a_wrong_key_fails_in_the_tls_handshake() {
    let (_, server_tls) = identity(1);
    let (_, client_tls) = identity(2);
    let (other, _) = identity(3);
    let listener = tls_listener(&server_tls).await;
    let target = listener.local_address().with_pin(other.key());
    let server = accept_one(listener);
    let err = bounded(dial(&target, &client_tls, &DialOptions::default()))
        .await
        .err()
        .expect("pinned dial to the wrong key must fail");
    match err {
        NetError::Tls(msg) => assert!(msg.contains("does not match the pinned"), "{msg}"),
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // The server saw the handshake abort too: no connection, no application bytes.
    assert!(bounded(server).await.unwrap().1.is_err());
}

/// A rustls client config trusting our server verifier, with custom client auth / ALPN.
fn raw_client(with_cert: Option<&TlsConfig>, alpn: Vec<Vec<u8>>) -> Arc<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(tls::test_server_verifier(None));
    let mut config = match with_cert {
        None => builder.with_no_client_auth(),
        Some(t) => builder
            .with_client_auth_cert(
                vec![t.certificate_der().to_vec().into()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(pkcs8_from_pem(t.private_key_pem()).into()),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn;
    Arc::new(config)
}

/// PKCS#8 DER from the PEM the config exports (base64 body between the markers).
fn pkcs8_from_pem(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let (_, server_tls) = identity(1);
    let listener = tls_listener(&server_tls).await;
    let port = match listener.local_address() {
        Address::Tls { port, .. } => port,
        _ => unreachable!(),
    };
    let server = accept_one(listener);
    let config = raw_client(None, vec![tls::ALPN.to_vec()]);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(config);
    // In TLS 1.3 the client may finish before the server rejects it; the server must fail.
    if let Ok(mut stream) = bounded(connector.connect(tls::server_name(), tcp)).await {
        let mut buf = [0u8; 16];
        assert!(!matches!(bounded(stream.read(&mut buf)).await, Ok(n) if n > 0));
    }
    let err = bounded(server)
        .await
        .unwrap()
        .1
        .err()
        .expect("server must refuse");
    assert!(matches!(err, NetError::Tls(_)), "{err:?}");
}

#[tokio::test]
async fn alpn_awp0_is_negotiated_and_required() {
    let (_, server_tls) = identity(1);
    let (_, client_tls) = identity(2);

    // Our client config offers awp/0 and the server selects it.
    let listener = tls_listener(&server_tls).await;
    let port = match listener.local_address() {
        Address::Tls { port, .. } => port,
        _ => unreachable!(),
    };
    let server = accept_one(listener);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client_tls.client_config(None).unwrap());
    let stream = bounded(connector.connect(tls::server_name(), tcp))
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"awp/0"[..]));
    let conn = bounded(server).await.unwrap().1.unwrap();
    assert!(conn.peer_cert_key.is_some());

    // A client offering no ALPN completes TLS but is refused by the server.
    let listener = tls_listener(&server_tls).await;
    let port = match listener.local_address() {
        Address::Tls { port, .. } => port,
        _ => unreachable!(),
    };
    let server = accept_one(listener);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(raw_client(Some(&client_tls), vec![]));
    let _stream = bounded(connector.connect(tls::server_name(), tcp)).await;
    match bounded(server).await.unwrap().1 {
        Err(NetError::Tls(msg)) => assert!(msg.contains("ALPN"), "{msg}"),
        other => panic!("expected an ALPN refusal, got {:?}", other.err()),
    }
}

/// A minimal TLS 1.2 ClientHello (no supported_versions extension).
fn tls12_client_hello() -> Vec<u8> {
    fn ext(out: &mut Vec<u8>, ty: u16, data: &[u8]) {
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(data);
    }
    let mut exts = Vec::new();
    let name = b"awp.invalid";
    let mut sni = Vec::new();
    sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sni.extend_from_slice(name);
    ext(&mut exts, 0x0000, &sni);
    ext(&mut exts, 0x000a, &[0x00, 0x02, 0x00, 0x1d]); // x25519
    ext(&mut exts, 0x000b, &[0x01, 0x00]); // uncompressed points
    ext(&mut exts, 0x000d, &[0x00, 0x04, 0x08, 0x07, 0x04, 0x03]); // ed25519, ecdsa p256
    ext(
        &mut exts,
        0x0010,
        &[0x00, 0x06, 0x05, b'a', b'w', b'p', b'/', b'0'],
    );

    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0x00, 0x04, 0xc0, 0x2b, 0xc0, 0x2f]); // ECDHE AES-GCM suites
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);

    let mut hs = vec![0x01];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[tokio::test]
async fn tls12_only_client_is_refused() {
    let (_, server_tls) = identity(1);
    let listener = tls_listener(&server_tls).await;
    let port = match listener.local_address() {
        Address::Tls { port, .. } => port,
        _ => unreachable!(),
    };
    let server = accept_one(listener);
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(&tls12_client_hello()).await.unwrap();
    let mut reply = Vec::new();
    let _ = bounded(tcp.read_to_end(&mut reply)).await;
    // The only answer is an alert record (content type 21), never a ServerHello (22).
    assert_eq!(reply.first(), Some(&0x15), "reply {reply:02x?}");
    // Fatal (2) protocol_version (70), RFC 8446 §6.
    assert_eq!(
        reply.get(5..7),
        Some(&[0x02, 0x46][..]),
        "reply {reply:02x?}"
    );
    let err = bounded(server)
        .await
        .unwrap()
        .1
        .err()
        .expect("server must refuse");
    assert!(matches!(err, NetError::Tls(_)), "{err:?}");
}

#[tokio::test]
async fn tcp_round_trips_a_line() {
    let (_, tls) = identity(1);
    let listener = Listener::bind(&addr("tcp:127.0.0.1:0"), &tls, &DialOptions::default())
        .await
        .unwrap();
    let target = listener.local_address();
    assert!(matches!(target, Address::Tcp { .. }));
    let server = accept_one(listener);
    let mut client = bounded(dial(&target, &tls, &DialOptions::default()))
        .await
        .unwrap();
    let mut server = bounded(server).await.unwrap().1.unwrap();
    assert_eq!(client.transport, Transport::Tcp);
    assert_eq!(server.transport, Transport::Tcp);
    assert_eq!(client.peer_cert_key, None);
    round_trip(&mut client, &mut server).await;
}

#[tokio::test]
async fn unix_round_trips_a_line_and_manages_the_socket_file() {
    use std::os::unix::fs::PermissionsExt;
    let (_, tls) = identity(1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.sock");
    let target = Address::Unix { path: path.clone() };

    // A stale socket file (its listener is gone) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());

    let listener = Listener::bind(&target, &tls, &DialOptions::default())
        .await
        .unwrap();
    assert_eq!(listener.local_address(), target);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let server = accept_one(listener);
    let mut client = bounded(dial(&target, &tls, &DialOptions::default()))
        .await
        .unwrap();
    let (listener, res) = bounded(server).await.unwrap();
    let mut server = res.unwrap();
    assert_eq!(client.transport, Transport::Unix);
    assert_eq!(server.transport, Transport::Unix);
    round_trip(&mut client, &mut server).await;

    // A live one is not replaced (the probe is an extra, empty connection to it).
    let second = Listener::bind(&target, &tls, &DialOptions::default()).await;
    assert!(
        matches!(&second, Err(NetError::Io(e)) if e.kind() == std::io::ErrorKind::AddrInUse),
        "{:?}",
        second.err()
    );
    assert!(path.exists());

    drop(listener);
    assert!(!path.exists(), "listener removes its socket file");

    // A regular file at the path is never deleted.
    std::fs::write(&path, b"data").unwrap();
    let res = Listener::bind(&target, &tls, &DialOptions::default()).await;
    assert!(matches!(&res, Err(NetError::Io(e)) if e.kind() == std::io::ErrorKind::AlreadyExists));
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
}

#[tokio::test]
async fn plaintext_to_public_addresses_is_refused_without_dialing() {
    let (_, tls) = identity(1);
    let opts = DialOptions::default();
    for a in [
        "tcp:203.0.113.7:7700",
        "tcp:[2001:db8::1]:7700",
        "tcp:[::ffff:8.8.8.8]:1",
    ] {
        let started = std::time::Instant::now();
        let res = tokio::time::timeout(Duration::from_secs(1), dial(&addr(a), &tls, &opts))
            .await
            .expect("refused at once, not after a connect attempt");
        assert!(matches!(res, Err(NetError::PlaintextRefused(_))), "{a}");
        assert!(started.elapsed() < Duration::from_millis(500));
    }
    // Binding everywhere in plaintext counts as public.
    let res = Listener::bind(&addr("tcp:0.0.0.0:0"), &tls, &opts).await;
    assert!(matches!(res, Err(NetError::PlaintextRefused(_))));
    // Unless allowed.
    let allow = DialOptions {
        allow_plaintext: true,
    };
    let l = Listener::bind(&addr("tcp:0.0.0.0:0"), &tls, &allow)
        .await
        .unwrap();
    assert!(matches!(l.local_address(), Address::Tcp { ref host, .. } if host == "0.0.0.0"));
    // TLS on every interface needs no permission.
    Listener::bind(&addr("tls:0.0.0.0:0"), &tls, &opts)
        .await
        .unwrap();
}

#[test]
fn private_ip_classification() {
    for ip in [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.0.5",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "::ffff:192.168.0.1",
    ] {
        assert!(is_private_ip(ip.parse().unwrap()), "{ip} is private");
    }
    for ip in [
        "0.0.0.0",
        "::",
        "8.8.8.8",
        "172.32.0.1",
        "172.15.255.255",
        "100.64.0.1",
        "192.169.0.1",
        "203.0.113.7",
        "2001:db8::1",
        "fec0::1",
        "::ffff:8.8.8.8",
    ] {
        assert!(!is_private_ip(ip.parse().unwrap()), "{ip} is public");
    }
}

#[tokio::test]
async fn slow_tls_client_does_not_block_other_accepts() {
    let (server_id, server_tls) = identity(1);
    let (client_id, client_tls) = identity(2);
    let listener = tls_listener(&server_tls).await;
    let target = listener.local_address();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let accept_loop = tokio::spawn(async move {
        loop {
            let incoming = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(incoming.handshake().await);
            });
        }
    });

    // Connects and sends half a record header, then stalls.
    let port = match &target {
        Address::Tls { port, .. } => *port,
        _ => unreachable!(),
    };
    let mut slow = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    slow.write_all(&[0x16, 0x03]).await.unwrap();

    let client = tokio::time::timeout(
        Duration::from_secs(3),
        dial(&target, &client_tls, &DialOptions::default()),
    )
    .await
    .expect("second client not blocked")
    .unwrap();
    assert_eq!(client.peer_cert_key, Some(server_id.key()));
    let served = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("second handshake finished")
        .unwrap()
        .unwrap();
    assert_eq!(served.peer_cert_key, Some(client_id.key()));
    drop(slow);
    accept_loop.abort();
}

#[test]
fn dialable_addresses_pin_and_order() {
    let (id, _) = identity(1);
    let key = id.key();

    let specific = addr("tls:192.168.1.5:7700");
    assert_eq!(
        dialable_addresses(&specific, &key),
        vec![specific.with_pin(key)]
    );
    let name = addr("tls:node.example:7700");
    assert_eq!(dialable_addresses(&name, &key), vec![name.with_pin(key)]);
    let unix = addr("unix:/tmp/x.sock");
    assert_eq!(dialable_addresses(&unix, &key), vec![unix.clone()]);

    let all = dialable_addresses(&addr("tls:0.0.0.0:7700"), &key);
    assert!(!all.is_empty());
    for a in &all {
        assert_eq!(a.pin(), Some(key));
        let ip = a.ip().unwrap();
        assert!(ip.is_ipv4() && !ip.is_unspecified(), "{a}");
        assert!(matches!(a, Address::Tls { port: 7700, .. }));
    }
    let last = all.last().unwrap().ip().unwrap();
    assert!(last.is_loopback(), "loopback last: {all:?}");
    let first_loopback = all
        .iter()
        .position(|a| a.ip().unwrap().is_loopback())
        .unwrap();
    assert!(all[first_loopback..]
        .iter()
        .all(|a| a.ip().unwrap().is_loopback()));

    let tcp = dialable_addresses(&addr("tcp:[::]:9"), &key);
    assert!(tcp
        .iter()
        .all(|a| matches!(a, Address::Tcp { port: 9, .. })));
    assert!(tcp.last().unwrap().ip().unwrap().is_loopback());
}

#[tokio::test]
async fn garbage_instead_of_a_client_hello_fails_the_handshake() {
    let (_, server_tls) = identity(1);
    let listener = tls_listener(&server_tls).await;
    let port = match listener.local_address() {
        Address::Tls { port, .. } => port,
        _ => unreachable!(),
    };
    let server = accept_one(listener);
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"{\"t\":\"hello\",\"v\":0}\n").await.unwrap();
    let err = bounded(server).await.unwrap().1.err().expect("not TLS");
    assert!(matches!(err, NetError::Tls(_)), "{err:?}");
}
