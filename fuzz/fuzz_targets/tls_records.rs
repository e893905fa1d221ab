//! Hostile bytes into the unbuffered TLS engine (`net::tls_stream::Engine`), three ways
//! chosen by the first byte: as the first flight a server receives, as records a client
//! receives after a completed handshake, and as a one-byte corruption of a real
//! handshake's client flight (position and mask from the next three bytes). The rest is
//! fed in pieces whose sizes come from the input too. Nothing may panic; once the engine
//! fails it stays failed; it never holds more than its cap of waiting bytes.
#![no_main]

use awp_node::identity::Identity;
use awp_node::net::tls_stream::{client_engine, server_engine, MAX_INCOMING};
use awp_node::net::TlsConfig;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn configs() -> &'static (TlsConfig, TlsConfig) {
    static C: OnceLock<(TlsConfig, TlsConfig)> = OnceLock::new();
    C.get_or_init(|| {
        let s = TlsConfig::new(&Identity::from_seed(&[1; 32])).unwrap();
        let c = TlsConfig::new(&Identity::from_seed(&[2; 32])).unwrap();
        (s, c)
    })
}

/// Feed `data` in pieces (sizes cycling through `sizes`), processing after each; stop at
/// the first error, and check it is sticky.
fn feed<C: awp_node::net::tls_stream::Side>(
    e: &mut awp_node::net::tls_stream::Engine<C>,
    data: &[u8],
    sizes: &[u8],
) {
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let n = usize::from(sizes.get(i % sizes.len().max(1)).copied().unwrap_or(255)).max(1);
        let end = (at + n).min(data.len());
        i += 1;
        if e.feed(&data[at..end]).is_err() {
            assert!(e.process().is_err(), "a refusal is sticky");
            return;
        }
        at = end;
        match e.process() {
            Ok(_) => {
                let _ = e.take_plain();
                let _ = e.take_out();
            }
            Err(_) => {
                let _ = e.take_out();
                assert!(e.process().is_err(), "a failure is sticky");
                return;
            }
        }
        assert!(e.buffered_capacity() <= 2 * MAX_INCOMING + 64 * 1024);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (server_tls, client_tls) = configs();
    let (sizes, body) = rest.split_at(rest.len().min(8));
    match mode % 3 {
        0 => {
            let mut server = server_engine(server_tls).unwrap();
            feed(&mut server, body, sizes);
        }
        1 => {
            // A completed handshake in memory, then hostile records to the client.
            let mut client = client_engine(client_tls).unwrap();
            let mut server = server_engine(server_tls).unwrap();
            for _ in 0..10 {
                let c = client.process().unwrap();
                server.feed(&client.take_out()).unwrap();
                let s = server.process().unwrap();
                client.feed(&server.take_out()).unwrap();
                if c && s {
                    break;
                }
            }
            feed(&mut client, body, sizes);
        }
        _ => {
            // A real handshake with one byte of the client's flights flipped.
            let [a, b, mask, ..] = *body else {
                return;
            };
            let pos = usize::from(u16::from_le_bytes([a, b]));
            let mask = mask.max(1);
            let mut client = client_engine(client_tls).unwrap();
            let mut server = server_engine(server_tls).unwrap();
            let mut sent = 0usize;
            for _ in 0..10 {
                if client.process().is_err() {
                    return;
                }
                let mut out = client.take_out();
                if pos >= sent && pos < sent + out.len() {
                    out[pos - sent] ^= mask;
                }
                sent += out.len();
                feed(&mut server, &out, sizes);
                let back = server.take_out();
                if client.feed(&back).is_err() {
                    return;
                }
            }
        }
    }
});
