//! CPU cost of the durable receive path without the network (for `valgrind --tool=callgrind`
//! or `perf stat`): parse N msg lines of about 200 bytes from one peer, store them with
//! `Store::receive_batch` in batches of B lines, flush once per batch (group commit), and
//! encode one ack per line, the way a connection does. Then the same lines again, as a
//! peer's resume replays them after a lost connection: every one a duplicate, found in
//! the dedup index. Prints one JSON object `{n, batch, secs, per_sec, flushes,
//! replay_secs, replay_per_sec}`.
//!
//! Usage: `recv_profile DIR [N [B]]` (DIR must not exist; default N = 20000, B = 4096).

use awp_node::store::{Received, Store};
use awp_node::wire::{self, ids::IdGen, Line, Part, PeerKey, TextPart};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: recv_profile DIR [N [B]]");
        std::process::exit(2);
    };
    let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let b: usize = args
        .get(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
        .max(1);
    let store = Store::open(std::path::Path::new(dir)).expect("open store");
    let peer = awp_node::identity::Identity::generate().key();
    let mut ids = IdGen::new(None);
    let ts = wire::time::format_ms(wire::time::now_ms());
    let text = "x".repeat(100);
    let raw: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            Line::Msg(wire::Msg {
                id: ids.next_at(wire::time::now_ms()).to_string(),
                ts: ts.clone(),
                th: "thr_profile".into(),
                re: None,
                subject: None,
                parts: vec![Part::Text(TextPart { text: text.clone() })],
            })
            .encode()
        })
        .collect();
    let t0 = Instant::now();
    receive_all(&store, &peer, &raw, b, &ts, false);
    let secs = t0.elapsed().as_secs_f64();
    let flushes = store.flush_count();
    let t1 = Instant::now();
    receive_all(&store, &peer, &raw, b, &ts, true);
    let replay_secs = t1.elapsed().as_secs_f64();
    println!(
        "{{\"n\":{n},\"batch\":{b},\"secs\":{secs:.3},\"per_sec\":{:.0},\"flushes\":{flushes},\"replay_secs\":{replay_secs:.3},\"replay_per_sec\":{:.0}}}",
        n as f64 / secs,
        n as f64 / replay_secs,
    );
}

/// Store `raw` from `peer` in batches of `b` lines, flushing once per batch and encoding
/// one ack per line; with `replay`, every line must come back a duplicate.
fn receive_all(store: &Store, peer: &PeerKey, raw: &[Vec<u8>], b: usize, ts: &str, replay: bool) {
    let mut acks = Vec::new();
    for chunk in raw.chunks(b) {
        let lines: Vec<Line> = chunk
            .iter()
            .map(|r| wire::parse_line(r).expect("parse"))
            .collect();
        let refs: Vec<(&Line, &[u8])> = lines.iter().zip(chunk).map(|(l, r)| (l, &r[..])).collect();
        let res = store.receive_batch(peer, &refs).expect("receive");
        if replay {
            assert!(
                res.iter().all(|r| *r == Received::Duplicate),
                "a replayed line was not a duplicate"
            );
        }
        store.flush_blocking().expect("flush");
        acks.clear();
        for (_, l) in res.iter().zip(&lines) {
            let ack = Line::Ack(wire::Ack {
                id: store.next_control_id(),
                ts: ts.to_string(),
                th: l.th().unwrap_or_default().to_string(),
                re: l.id().unwrap_or_default().to_string(),
            });
            acks.extend_from_slice(&ack.encode());
            acks.push(b'\n');
        }
    }
}
