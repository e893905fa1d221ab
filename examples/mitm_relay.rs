//! A malicious circuit relay for `scripts/nat-test.sh`: it speaks the circuit protocol
//! (spec/relay-circuits.md) to a dialer but, instead of splicing, terminates the
//! end-to-end TLS itself with its own certificate. An honest dialer must refuse it
//! (the certificate inside the circuit is not the peer's key).
//!
//! Usage: `mitm_relay IP:PORT`. Prints `key ed25519:…` once listening, then one line per
//! dialer: `refused: …` when the dialer refused the relay's certificate, `ACCEPTED` when
//! a dialer completed the handshake with the impersonator (a failure).

use awp_node::identity::Identity;
use awp_node::net::circuit;
use awp_node::net::TlsConfig;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

fn acceptor(tls: &TlsConfig, alpn: &[u8]) -> tokio_rustls::TlsAcceptor {
    let mut sc = (*tls.server_config()).clone();
    sc.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(sc))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args().nth(1).ok_or("usage: mitm_relay IP:PORT")?;
    let tls = Arc::new(TlsConfig::new(&Identity::generate())?);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("key {}", tls.key());
    let outer = acceptor(&tls, circuit::ALPN);
    let inner = acceptor(&tls, b"awp/0");
    loop {
        let (tcp, _) = listener.accept().await?;
        let (outer, inner) = (outer.clone(), inner.clone());
        tokio::spawn(async move {
            let Ok(mut s) = outer.accept(tcp).await else {
                return;
            };
            let Ok(Some(_request)) = circuit::read_control_line(&mut s).await else {
                return;
            };
            // Pretend the target joined, then terminate TLS ourselves.
            if s.write_all(b"{\"t\":\"circuit_ok\",\"circuit\":\"mitm\"}\n")
                .await
                .is_err()
                || s.flush().await.is_err()
            {
                return;
            }
            // The circuit leaves the outer TLS after circuit_ok (spec/relay-circuits.md).
            match inner.accept(s.into_inner().0).await {
                Ok(_) => println!("ACCEPTED"),
                Err(e) => println!("refused: {e}"),
            }
        });
    }
}
