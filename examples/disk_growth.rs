//! Disk growth of the store over a long run (used by `scripts/bench-disk.sh`).
//!
//! Replays the store traffic of N msg lines of about SIZE bytes between two nodes, the way
//! the node drives the store: the sender queues each line (outbox + out log) and retires
//! it when acked; the receiver stores it (log, dedup index, seen, thread), flushing every
//! 64 lines like a group commit. Nothing is pruned: every line is within retention.
//!
//! Text: `text` (default) is prose-like words with a random base64 token in every fourth
//! place (ids, hashes); `random` is base64 of random bytes only (like blob chunks), the
//! least compressible a line gets.
//!
//! Usage: `disk_growth DIR N [SIZE [text|random]]` (DIR must not exist). Prints one JSON
//! object per quarter of the run and one at the end:
//! `{n, line_bytes, sender:{stored, data, disk, ratio}, receiver:{…}}` — bytes; `data` =
//! what the store holds with lines at full length, `stored` = as stored (compressed),
//! `disk` = allocated blocks of the database directory, `ratio` = disk / data.

use awp_node::store::{LineBuilder, Store};
use awp_node::wire::{self, Line, Part, PeerKey, TextPart};
use serde_json::json;
use std::path::Path;

const FLUSH_EVERY: usize = 64;
/// Lines per thread (the sender opens a new thread now and then).
const PER_THREAD: usize = 500;

const WORDS: &[&str] = &[
    "the", "agent", "node", "message", "thread", "reply", "peer", "queue", "review", "build",
    "test", "failed", "passed", "because", "with", "from", "into", "after", "before", "please",
    "check", "file", "line", "error", "config", "value", "result", "request", "response", "update",
    "status", "done", "open", "close", "start", "stop", "branch", "commit", "merge", "change",
    "patch", "issue", "report", "data", "store", "disk", "ratio", "growth", "time", "and", "or",
    "not", "is", "was", "will", "can", "should", "must", "this", "that", "it", "we", "you", "they",
    "a", "an", "of", "to", "in", "on", "for", "at", "by", "as", "be",
];

/// xorshift64*: deterministic filler.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn filler(rng: &mut Rng, len: usize, random: bool) -> String {
    use base64::Engine;
    let b64 = |rng: &mut Rng, n: usize| {
        let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    };
    if random {
        let mut s = b64(rng, len * 3 / 4 + 3);
        s.truncate(len);
        return s;
    }
    let mut s = String::with_capacity(len + 32);
    let mut i = 0;
    while s.len() < len {
        if i % 4 == 3 {
            s.push_str(&b64(rng, 12));
        } else {
            s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
        }
        s.push(' ');
        i += 1;
    }
    s.truncate(len);
    s
}

fn key(n: u8) -> PeerKey {
    let sk = ed25519_dalek::SigningKey::from_bytes(&[n; 32]);
    PeerKey::from_bytes(&sk.verifying_key().to_bytes()).expect("valid key")
}

fn msg(id: &str, ts: &str, th: &str, text: &str) -> Line {
    Line::Msg(wire::Msg {
        id: id.into(),
        ts: ts.into(),
        th: th.into(),
        re: None,
        subject: Some("bench".into()),
        parts: vec![Part::Text(TextPart { text: text.into() })],
    })
}

fn usage(dir: &Path, s: &Store) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let (stored, data) = s.data_bytes()?;
    let disk = awp_node::store::files::disk_bytes(dir);
    Ok(json!({
        "stored": stored,
        "data": data,
        "disk": disk,
        "ratio": (disk as f64 / data.max(1) as f64 * 100.0).round() / 100.0,
    }))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, n) = match args.as_slice() {
        [d, n, ..] => (d.clone(), n.parse::<usize>()?),
        _ => return Err("usage: disk_growth DIR N [SIZE [text|random]]".into()),
    };
    let size: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(1500);
    let random = match args.get(3).map(String::as_str) {
        None | Some("text") => false,
        Some("random") => true,
        Some(other) => return Err(format!("unknown text kind {other}").into()),
    };
    let root = Path::new(&dir);
    if root.exists() {
        return Err(format!("{dir} exists").into());
    }
    std::fs::create_dir_all(root)?;
    let (sdir, rdir) = (root.join("sender/db"), root.join("receiver/db"));
    let (alice, bob) = (key(1), key(2));
    let sender = Store::open(&sdir)?;
    let receiver = Store::open(&rdir)?;
    let ts0 = wire::time::format_ms(wire::time::now_ms());
    let base = msg("01K00000000000000000000000", &ts0, "thr_00000000", "")
        .encode()
        .len();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut line_bytes = 0u64;
    let mut pending: Vec<(String, String)> = Vec::new();
    for i in 0..n {
        let th = format!("thr_{:08}", i / PER_THREAD);
        let text = filler(&mut rng, size.saturating_sub(base).max(1), random);
        let b = |id: &str, ts: &str| msg(id, ts, &th, &text);
        let builders: [LineBuilder<'_>; 1] = [&b];
        let e = sender.enqueue(&bob, &builders)?.pop().expect("one line");
        let line = wire::parse_line(&e.line)?;
        receiver.receive(&alice, &line, &e.line)?;
        line_bytes += e.line.len() as u64;
        pending.push((th, e.id));
        if pending.len() == FLUSH_EVERY || i + 1 == n {
            receiver.flush_blocking()?;
            // The receiver acks what is durable; the sender retires it.
            for (th, id) in pending.drain(..) {
                sender.ack(&bob, &th, &id)?;
            }
            sender.flush_blocking()?;
        }
        if (i + 1) % (n / 4).max(1) == 0 || i + 1 == n {
            let v = json!({
                "n": i + 1,
                "line_bytes": line_bytes,
                "text": if random { "random" } else { "text" },
                "sender": usage(&sdir, &sender)?,
                "receiver": usage(&rdir, &receiver)?,
            });
            println!("{v}");
        }
    }
    Ok(())
}
