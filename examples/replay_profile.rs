//! Cost of a resume replay's store reads without the network (for `perf record` or
//! `valgrind --tool=callgrind`): the first run fills a new store's outbox with N signed msg
//! lines of about 320 bytes for one peer, queued as a node queues them (batches of 1,000,
//! one flush); each later run opens that store and fetches every queued line with
//! `Store::outbox_after` in batches of 512, as a connection's replay does, three passes.
//! The first pass after the open reads sled's pages from disk, as a node restarted
//! before its peer resumes does. Prints one JSON object per run.
//!
//! Usage: `replay_profile DIR [N]` (default N = 100000; N is used only when DIR is new).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use awp_node::identity::Identity;
use awp_node::store::{LineBuilder, Store};
use awp_node::wire::{self, Line, Part, TextPart};
use std::sync::Arc;
use std::time::Instant;

/// Lines per fetch, as `awp_node::session::REPLAY_BATCH`.
const BATCH: usize = awp_node::session::REPLAY_BATCH;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: replay_profile DIR [N]");
        std::process::exit(2);
    };
    let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let peer = Identity::from_seed(&[7; 32]).key();
    if !dir.exists() {
        let t = Instant::now();
        let store = Store::open(&dir).expect("open store");
        store.set_line_signer(Arc::new(Identity::from_seed(&[9; 32])));
        let text = "x".repeat(100);
        let b = |id: &str, ts: &str| {
            Line::Msg(wire::Msg {
                id: id.into(),
                ts: ts.into(),
                th: "thr_replay".into(),
                re: None,
                subject: None,
                parts: vec![Part::Text(TextPart { text: text.clone() })],
            })
        };
        let mut left = n;
        while left > 0 {
            let k = left.min(1000);
            let builders: Vec<LineBuilder<'_>> = vec![&b; k];
            store.enqueue(&peer, &builders).expect("enqueue");
            left -= k;
        }
        store.flush_blocking().expect("flush");
        println!(
            "{{\"filled\":{n},\"secs\":{:.3}}}",
            t.elapsed().as_secs_f64()
        );
        return;
    }
    let t = Instant::now();
    let store = Store::open(&dir).expect("open store");
    let open = t.elapsed().as_secs_f64();
    let mut passes = Vec::new();
    let mut lines = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let mut cursor: Option<String> = None;
        lines = 0;
        loop {
            let batch = store
                .outbox_after(&peer, cursor.as_deref(), BATCH)
                .expect("outbox");
            let Some(last) = batch.last() else { break };
            cursor = Some(last.id.clone());
            lines += batch.len();
        }
        passes.push(format!("{:.3}", t.elapsed().as_secs_f64()));
    }
    println!(
        "{{\"lines\":{lines},\"open_secs\":{open:.3},\"pass_secs\":[{}]}}",
        passes.join(",")
    );
}
