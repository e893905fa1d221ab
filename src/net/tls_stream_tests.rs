//! Tests of the unbuffered TLS stream against `tokio-rustls` (rustls' buffered connection)
//! on the other end, over 127.0.0.1 sockets; every step bounded by a timeout.

use super::*;
use crate::identity::Identity;
use crate::net::tls::{self, TlsConfig};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const BOUND: Duration = Duration::from_secs(20);

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("test step timed out")
}

fn tls_config(seed: u8) -> TlsConfig {
    TlsConfig::new(&Identity::from_seed(&[seed; 32])).unwrap()
}

async fn socket_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
    (a.unwrap(), b.unwrap().0)
}

/// Our server against a `tokio-rustls` client.
async fn ours_serving() -> (ServerTls, tokio_rustls::client::TlsStream<TcpStream>) {
    let (c, s) = socket_pair().await;
    let server = UnbufferedServerConnection::new(tls_config(1).server_config()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls_config(2).client_config(None).unwrap());
    let (ours, theirs) = bounded(async {
        tokio::join!(
            TlsStream::handshake(server, s),
            connector.connect(tls::server_name(), c)
        )
    })
    .await;
    (ours.unwrap(), theirs.unwrap())
}

/// Our client against a `tokio-rustls` server.
async fn ours_dialing() -> (ClientTls, tokio_rustls::server::TlsStream<TcpStream>) {
    let (c, s) = socket_pair().await;
    let client = UnbufferedClientConnection::new(
        tls_config(2).client_config(None).unwrap(),
        tls::server_name(),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls_config(1).server_config());
    let (ours, theirs) =
        bounded(async { tokio::join!(TlsStream::handshake(client, c), acceptor.accept(s)) }).await;
    (ours.unwrap(), theirs.unwrap())
}

/// Deterministic bytes that are not all alike (catches reordering and lost records).
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Send `data` from `w` while `r` reads it all back; returns what `r` read.
async fn transfer<W, R>(w: &mut W, r: &mut R, data: &[u8]) -> Vec<u8>
where
    W: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    let mut got = vec![0u8; data.len()];
    let (wr, rd) = bounded(async {
        tokio::join!(
            async {
                // Mixed write sizes: single bytes, a record and a bit, many records at once.
                let mut at = 0;
                for (i, size) in [1usize, 7, 16 * 1024 + 3, 300_000]
                    .iter()
                    .cycle()
                    .enumerate()
                {
                    if at == data.len() {
                        break;
                    }
                    let end = (at + size + i % 5).min(data.len());
                    w.write_all(&data[at..end]).await?;
                    at = end;
                }
                w.flush().await
            },
            r.read_exact(&mut got)
        )
    })
    .await;
    wr.unwrap();
    rd.unwrap();
    got
}

#[tokio::test]
async fn server_side_moves_megabytes_both_ways_with_buffered_rustls() {
    let (mut ours, mut theirs) = ours_serving().await;
    assert_eq!(ours.common().alpn_protocol(), Some(tls::ALPN));
    assert!(ours.common().peer_certificates().is_some());
    let up = pattern(3 << 20, 1);
    assert_eq!(transfer(&mut theirs, &mut ours, &up).await, up);
    let down = pattern(3 << 20, 2);
    assert_eq!(transfer(&mut ours, &mut theirs, &down).await, down);
}

#[tokio::test]
async fn client_side_moves_megabytes_both_ways_with_buffered_rustls() {
    let (mut ours, mut theirs) = ours_dialing().await;
    assert_eq!(ours.common().alpn_protocol(), Some(tls::ALPN));
    let up = pattern(3 << 20, 3);
    assert_eq!(transfer(&mut ours, &mut theirs, &up).await, up);
    let down = pattern(3 << 20, 4);
    assert_eq!(transfer(&mut theirs, &mut ours, &down).await, down);
}

#[tokio::test]
async fn an_idle_connection_holds_no_buffer() {
    let (mut ours, mut theirs) = ours_serving().await;
    assert_eq!(ours.buffered_capacity(), 0, "after the handshake");
    let data = pattern(200_000, 5);
    assert_eq!(transfer(&mut theirs, &mut ours, &data).await, data);
    assert_eq!(transfer(&mut ours, &mut theirs, &data).await, data);
    // A read that finds nothing leaves nothing allocated either.
    let mut b = [0u8; 1];
    let pending = tokio::time::timeout(Duration::from_millis(50), ours.read(&mut b)).await;
    assert!(pending.is_err(), "nothing was sent, the read must wait");
    assert_eq!(ours.buffered_capacity(), 0, "idle after traffic");
}

#[tokio::test]
async fn shutdown_sends_close_notify_and_the_peer_sees_a_clean_end() {
    let (mut ours, mut theirs) = ours_serving().await;
    ours.write_all(b"last\n").await.unwrap();
    bounded(ours.shutdown()).await.unwrap();
    let mut got = Vec::new();
    bounded(theirs.read_to_end(&mut got)).await.unwrap();
    assert_eq!(got, b"last\n");
    assert!(
        ours.write_all(b"more").await.is_err(),
        "no writes after close_notify"
    );

    // And the other way round: their close_notify is a clean EOF here.
    let (mut ours, mut theirs) = ours_dialing().await;
    theirs.write_all(b"bye\n").await.unwrap();
    bounded(theirs.shutdown()).await.unwrap();
    let mut got = Vec::new();
    bounded(ours.read_to_end(&mut got)).await.unwrap();
    assert_eq!(got, b"bye\n");
}

#[tokio::test]
async fn eof_without_close_notify_is_unexpected_eof() {
    let (mut ours, theirs) = ours_serving().await;
    // Close the socket under the TLS layer: no close_notify.
    let (tcp, _) = theirs.into_inner();
    drop(tcp);
    let mut b = [0u8; 8];
    let err = bounded(ours.read(&mut b)).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

#[tokio::test]
async fn garbage_after_the_handshake_fails_the_read_and_alerts_the_peer() {
    let (mut ours, theirs) = ours_serving().await;
    let (mut tcp, _) = theirs.into_inner();
    // An application-data record whose 64 bytes are not a valid ciphertext.
    let mut record = vec![0x17, 0x03, 0x03, 0x00, 0x40];
    record.extend_from_slice(&[0xAB; 64]);
    tcp.write_all(&record).await.unwrap();
    let mut b = [0u8; 8];
    let err = bounded(ours.read(&mut b)).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    // Later calls fail the same way rather than touching rustls again.
    assert!(bounded(ours.read(&mut b)).await.is_err());
    assert!(bounded(ours.write_all(b"x")).await.is_err());
    // The peer got a fatal alert record (content type 21).
    let mut head = [0u8; 1];
    bounded(tcp.read_exact(&mut head)).await.unwrap();
    assert_eq!(
        head[0], 0x17,
        "TLS 1.3 hides the alert in an application-data record"
    );
}

#[tokio::test]
async fn a_client_hello_that_is_not_tls_fails_the_handshake() {
    let (mut c, s) = socket_pair().await;
    let server = UnbufferedServerConnection::new(tls_config(1).server_config()).unwrap();
    let hs = tokio::spawn(TlsStream::handshake(server, s));
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let err = bounded(hs).await.unwrap().err().expect("must fail");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some());
}

#[tokio::test]
async fn a_peer_that_hangs_up_mid_handshake_is_unexpected_eof() {
    let (mut c, s) = socket_pair().await;
    let server = UnbufferedServerConnection::new(tls_config(1).server_config()).unwrap();
    let hs = tokio::spawn(TlsStream::handshake(server, s));
    // The first 3 bytes of a record header, then hang up.
    c.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    drop(c);
    let err = bounded(hs).await.unwrap().err().expect("must fail");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

#[tokio::test]
async fn bytes_waiting_beyond_the_cap_are_refused() {
    let (ours, _theirs) = ours_serving().await;
    let mut ours = ours;
    ours.engine.incoming = vec![0; MAX_INCOMING];
    let mut cx = Context::from_waker(Waker::noop());
    match ours.poll_fill(&mut cx) {
        Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Sticky: the stream stays failed.
    assert!(ours.step(Want::Nothing, None).is_err());
}

#[tokio::test]
async fn records_cut_at_every_size_still_decrypt() {
    // A relay in the middle passes the client's bytes on in pieces of 1..=97 bytes, so
    // records and handshake messages reach our server cut at every possible point.
    let (client_tcp, relay_a) = socket_pair().await;
    let (relay_b, server_tcp) = socket_pair().await;
    let relay = tokio::spawn(async move {
        let (mut ar, mut aw) = relay_a.into_split();
        let (mut br, mut bw) = relay_b.into_split();
        let up = async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut piece = 1usize;
            loop {
                let n = ar.read(&mut buf).await?;
                if n == 0 {
                    return bw.shutdown().await;
                }
                let mut at = 0;
                while at < n {
                    let end = (at + piece).min(n);
                    bw.write_all(&buf[at..end]).await?;
                    bw.flush().await?;
                    tokio::task::yield_now().await;
                    at = end;
                    piece = piece % 97 + 1;
                }
            }
        };
        let down = async move { tokio::io::copy(&mut br, &mut aw).await.map(|_| ()) };
        let (a, b) = tokio::join!(up, down);
        a.and(b)
    });
    let server = UnbufferedServerConnection::new(tls_config(1).server_config()).unwrap();
    let connector = tokio_rustls::TlsConnector::from(tls_config(2).client_config(None).unwrap());
    let (ours, theirs) = bounded(async {
        tokio::join!(
            TlsStream::handshake(server, server_tcp),
            connector.connect(tls::server_name(), client_tcp)
        )
    })
    .await;
    let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
    let data = pattern(100_000, 6);
    assert_eq!(transfer(&mut theirs, &mut ours, &data).await, data);
    bounded(theirs.shutdown()).await.unwrap();
    let mut rest = Vec::new();
    bounded(ours.read_to_end(&mut rest)).await.unwrap();
    assert!(rest.is_empty());
    relay.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_halves_in_two_tasks_move_data_both_ways_at_once() {
    // The node's shape: a reader task and a writer task on the two halves of one stream,
    // while the peer does the same. Neither direction may wait on the other.
    let (ours, theirs) = ours_serving().await;
    let (mut our_r, mut our_w) = tokio::io::split(ours);
    let (mut their_r, mut their_w) = tokio::io::split(theirs);
    let up = pattern(4 << 20, 7);
    let down = pattern(4 << 20, 8);
    let (up2, down2) = (up.clone(), down.clone());
    let tasks = [
        tokio::spawn(async move {
            their_w.write_all(&up2).await.unwrap();
            their_w.flush().await.unwrap();
        }),
        tokio::spawn(async move {
            our_w.write_all(&down2).await.unwrap();
            our_w.flush().await.unwrap();
        }),
    ];
    let read_up = tokio::spawn(async move {
        let mut got = vec![0u8; 4 << 20];
        our_r.read_exact(&mut got).await.unwrap();
        got
    });
    let read_down = tokio::spawn(async move {
        let mut got = vec![0u8; 4 << 20];
        their_r.read_exact(&mut got).await.unwrap();
        got
    });
    for t in tasks {
        bounded(t).await.unwrap();
    }
    assert_eq!(bounded(read_up).await.unwrap(), up);
    assert_eq!(bounded(read_down).await.unwrap(), down);
}

/// A client and a server [`Engine`] with the handshake done in memory.
fn engine_pair() -> (
    Engine<UnbufferedClientConnection>,
    Engine<UnbufferedServerConnection>,
) {
    let mut client = Engine::new(
        UnbufferedClientConnection::new(
            tls_config(2).client_config(None).unwrap(),
            tls::server_name(),
        )
        .unwrap(),
    );
    let mut server =
        Engine::new(UnbufferedServerConnection::new(tls_config(1).server_config()).unwrap());
    for _ in 0..10 {
        let c_done = client.process().unwrap();
        server.feed(&client.take_out()).unwrap();
        let s_done = server.process().unwrap();
        client.feed(&server.take_out()).unwrap();
        if c_done && s_done {
            return (client, server);
        }
    }
    panic!("the in-memory handshake did not finish in 10 rounds");
}

#[test]
fn engines_handshake_and_exchange_data_in_memory() {
    let (mut client, mut server) = engine_pair();
    client.send(b"hello\n").unwrap();
    server.feed(&client.take_out()).unwrap();
    server.process().unwrap();
    assert_eq!(server.take_plain(), b"hello\n");
    assert_eq!(
        server.buffered_capacity(),
        0,
        "everything read: no buffer kept"
    );
    server.send(&pattern(100_000, 9)).unwrap();
    // Delivered one byte at a time: records cut everywhere.
    let out = server.take_out();
    let mut got = Vec::new();
    for b in out.chunks(1) {
        client.feed(b).unwrap();
        client.process().unwrap();
        got.extend(client.take_plain());
    }
    assert_eq!(got, pattern(100_000, 9));
}

#[test]
fn an_engine_refuses_input_beyond_the_cap_and_stays_failed() {
    let mut server =
        Engine::new(UnbufferedServerConnection::new(tls_config(1).server_config()).unwrap());
    // A handshake record header announcing more than a record may hold is refused by
    // rustls; bytes that never make a record are refused by the cap.
    let err = server.feed(&vec![0x16; MAX_INCOMING + 1]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(server.process().is_err(), "sticky");
}

#[test]
fn an_engine_refuses_sending_before_the_handshake() {
    let mut client = Engine::new(
        UnbufferedClientConnection::new(
            tls_config(2).client_config(None).unwrap(),
            tls::server_name(),
        )
        .unwrap(),
    );
    let err = client.send(b"early").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotConnected, "{err}");
}

#[test]
fn an_oversized_record_header_fails_the_engine_without_panicking() {
    let (mut client, _server) = engine_pair();
    // Application data record claiming 0xffff bytes: over the TLS 1.3 limit.
    client.feed(&[0x17, 0x03, 0x03, 0xff, 0xff]).unwrap();
    let err = client.process().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    // A fatal alert is queued for the peer.
    assert!(!client.take_out().is_empty());
    assert!(client.process().is_err());
}

#[tokio::test]
async fn thousands_of_one_byte_records_in_one_read_are_all_delivered() {
    // Buffered rustls sends a record per write: 2,000 writes of one byte arrive before
    // the first read, so one socket read holds well over a thousand records.
    let (mut ours, mut theirs) = ours_serving().await;
    for i in 0..2000u32 {
        theirs.write_all(&[i as u8]).await.unwrap();
    }
    theirs.flush().await.unwrap();
    // Let them all arrive before the first read (the property holds either way).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut got = vec![0u8; 2000];
    bounded(ours.read_exact(&mut got)).await.unwrap();
    assert!(got.iter().enumerate().all(|(i, b)| *b == i as u8));

    let (mut ours, mut theirs) = ours_dialing().await;
    for _ in 0..1500u32 {
        theirs.write_all(b"x\n").await.unwrap();
    }
    theirs.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut got = vec![0u8; 3000];
    bounded(ours.read_exact(&mut got)).await.unwrap();
    assert_eq!(got, b"x\n".repeat(1500));
}

#[tokio::test]
async fn a_peer_that_sends_one_byte_and_goes_quiet_pins_only_that_byte() {
    let (mut ours, theirs) = ours_serving().await;
    let (mut tcp, _) = theirs.into_inner();
    tcp.write_all(&[0x17]).await.unwrap();
    let mut b = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_millis(100), ours.read(&mut b)).await;
    assert!(r.is_err(), "half a header: the read waits");
    assert!(
        ours.buffered_capacity() <= 64,
        "holds {} bytes for one",
        ours.buffered_capacity()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_updates_from_the_peer_while_the_halves_echo() {
    let (ours, mut theirs) = ours_serving().await;
    let (mut our_r, mut our_w) = tokio::io::split(ours);
    let echo = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let n = our_r.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            our_w.write_all(&buf[..n]).await?;
            our_w.flush().await?;
        }
        our_w.shutdown().await
    });
    for round in 0..20usize {
        theirs.get_mut().1.refresh_traffic_keys().unwrap();
        let msg = pattern(1000 + round * 997, round as u32);
        theirs.write_all(&msg).await.unwrap();
        theirs.flush().await.unwrap();
        let mut back = vec![0; msg.len()];
        bounded(theirs.read_exact(&mut back)).await.unwrap();
        assert_eq!(back, msg, "round {round}");
    }
    theirs.shutdown().await.unwrap();
    let mut rest = Vec::new();
    bounded(theirs.read_to_end(&mut rest)).await.unwrap();
    bounded(echo).await.unwrap().unwrap();
}

#[tokio::test]
async fn writes_to_a_peer_that_never_reads_stop_at_the_high_water_mark() {
    // Slack for one call's records beyond the mark, doubled by the Vec's growth.
    let bound = 2 * (OUT_HIGH_WATER + 4 * MAX_FRAGMENT + 4 * RECORD_OVERHEAD);
    let (mut ours, _theirs) = ours_serving().await;
    let chunk = vec![7u8; 1000];
    let mut written = 0usize;
    while tokio::time::timeout(Duration::from_millis(200), ours.write_all(&chunk))
        .await
        .is_ok()
    {
        written += chunk.len();
        assert!(written < 64 << 20, "the writes never blocked");
    }
    assert!(
        ours.buffered_capacity() <= bound,
        "{}",
        ours.buffered_capacity()
    );

    // One write of 16 MiB: the stream takes a few records per call, not the whole.
    let (mut ours, _theirs) = ours_serving().await;
    let big = vec![7u8; 16 << 20];
    let r = tokio::time::timeout(Duration::from_millis(300), ours.write_all(&big)).await;
    assert!(r.is_err(), "the peer reads nothing: the write must wait");
    assert!(
        ours.buffered_capacity() <= bound,
        "{}",
        ours.buffered_capacity()
    );
}
