//! Store crash check (used by `scripts/soak.sh --store`).
//!
//! `store_crash write DIR TASKS`: open the store in DIR and write hard from TASKS concurrent
//! tasks until killed (or for at most 120 s), after printing `open` on stderr: each task queues batches of msgs for one peer
//! in its own thread, receives batches of msgs from another peer, and acks some of its
//! queued msgs. After each `flush` returns it prints one line per record it made durable
//! (`E id` queued, `A id` acked, `R id` received) and, before an ack starts, `a id` (the ack
//! may or may not survive a kill before its flush). Lines are written whole and flushed.
//!
//! `store_crash check DIR RECORDS`: open the store (it must open) and check it against the
//! printed records (complete lines only): every `E` and `R` id is in the message log, every
//! `E` id never named by an `a` line is still in the outbox, every `A` id is out of the
//! outbox and acked in the log, the outbox counter equals the outbox's length, no id
//! is logged twice, and every received line in the log is in the dedup index. Prints one JSON object of counts; exits 1 naming what is wrong. The
//! store's log (what its open repaired) goes to stderr.

use awp_node::identity::Identity;
use awp_node::store::{Dir, LineBuilder, Store};
use awp_node::wire::{ids::IdGen, time, Line, Msg, Part, PeerKey, TextPart};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The peer the writer queues for, and the peer it receives from.
fn peers() -> (PeerKey, PeerKey) {
    (
        Identity::from_seed(&[0x51; 32]).key(),
        Identity::from_seed(&[0x52; 32]).key(),
    )
}

/// Longest a writer runs when nobody kills it.
const WRITE_LIMIT: Duration = Duration::from_secs(120);

fn msg(id: &str, ts: &str, th: &str, text: String) -> Line {
    Line::Msg(Msg {
        id: id.into(),
        ts: ts.into(),
        th: th.into(),
        re: None,
        subject: None,
        parts: vec![Part::Text(TextPart { text })],
    })
}

/// Print `lines` as one write, then flush: a kill leaves at most one partial last line.
fn emit(out: &Mutex<std::io::Stdout>, lines: &str) {
    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
    o.write_all(lines.as_bytes()).expect("stdout");
    o.flush().expect("stdout");
}

async fn write(dir: &Path, tasks: usize) -> Result<(), String> {
    let store = Arc::new(Store::open(dir).map_err(|e| format!("open: {e}"))?);
    eprintln!("open");
    let (to, from) = peers();
    let out = Arc::new(Mutex::new(std::io::stdout()));
    // Inbound ids: unique across runs (a fresh millisecond each run) and tasks.
    let in_ids = Arc::new(Mutex::new(IdGen::new(None)));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (store, out, in_ids) = (store.clone(), out.clone(), in_ids.clone());
        handles.push(tokio::spawn(async move {
            let th = format!("thr_w{task}");
            let mut unacked: std::collections::VecDeque<String> = Default::default();
            let mut round = 0u64;
            while started.elapsed() < WRITE_LIMIT {
                round += 1;
                // Mostly small batches; every 16th is large enough that its commit writes
                // on two threads (`Tx::commit`: 256 writes or more).
                let batch = if round.is_multiple_of(16) {
                    200
                } else {
                    1 + (round % 8) as usize
                };
                // Queue a batch for `to`.
                let text =
                    |i: usize| format!("task {task} round {round} line {i} {}", "x".repeat(200));
                let texts: Vec<String> = (0..batch).map(text).collect();
                let queued = {
                    let builders: Vec<_> = texts
                        .iter()
                        .map(|t| |id: &str, ts: &str| msg(id, ts, &th, t.clone()))
                        .collect();
                    let refs: Vec<LineBuilder<'_>> = builders.iter().map(|b| b as _).collect();
                    store
                        .enqueue(&to, &refs)
                        .map_err(|e| format!("enqueue: {e}"))?
                };
                store.flush().await.map_err(|e| format!("flush: {e}"))?;
                let mut lines = String::new();
                for e in queued {
                    lines.push_str(&format!("E {}\n", e.id));
                    unacked.push_back(e.id);
                }
                emit(&out, &lines);
                // Receive a batch from `from`.
                let now = time::now_ms();
                let ts = time::format_ms(now);
                let inbound: Vec<(Line, Vec<u8>)> = (0..batch)
                    .map(|i| {
                        let id = in_ids.lock().unwrap().next_at(now).to_string();
                        let l = msg(&id, &ts, &format!("thr_in{task}"), text(i));
                        let raw = l.encode();
                        (l, raw)
                    })
                    .collect();
                let pairs: Vec<(&Line, &[u8])> =
                    inbound.iter().map(|(l, r)| (l, r.as_slice())).collect();
                store
                    .receive_batch(&from, &pairs)
                    .map_err(|e| format!("receive: {e}"))?;
                store.flush().await.map_err(|e| format!("flush: {e}"))?;
                let lines: String = inbound
                    .iter()
                    .map(|(l, _)| format!("R {}\n", l.id().unwrap_or_default()))
                    .collect();
                emit(&out, &lines);
                // Ack the oldest queued msg every other round (the outbox keeps growing).
                if round.is_multiple_of(2) {
                    if let Some(id) = unacked.pop_front() {
                        emit(&out, &format!("a {id}\n"));
                        store.ack(&to, &th, &id).map_err(|e| format!("ack: {e}"))?;
                        store.flush().await.map_err(|e| format!("flush: {e}"))?;
                        emit(&out, &format!("A {id}\n"));
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| format!("task: {e}"))??;
    }
    Ok(())
}

/// Everything wrong with the store in `dir` against `records`; the counts on success.
fn check(dir: &Path, records: &Path) -> Result<serde_json::Value, Vec<String>> {
    let store = Store::open(dir).map_err(|e| vec![format!("the store does not open: {e}")])?;
    let text = std::fs::read_to_string(records)
        .map_err(|e| vec![format!("{}: {e}", records.display())])?;
    let (mut queued, mut acking, mut acked, mut received) =
        (vec![], HashSet::new(), vec![], vec![]);
    // Only complete lines: a kill may cut the last one.
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    for line in complete.lines() {
        match line.split_once(' ') {
            Some(("E", id)) => queued.push(id),
            Some(("a", id)) => {
                acking.insert(id);
            }
            Some(("A", id)) => acked.push(id),
            Some(("R", id)) => received.push(id),
            _ => return Err(vec![format!("unreadable record line {line:?}")]),
        }
    }
    let (to, from) = peers();
    let db = |e: awp_node::store::StoreError| vec![format!("reading the store: {e}")];
    let log = store.log(0, None, false, usize::MAX).map_err(db)?;
    let outbox = store.outbox_after(&to, None, usize::MAX).map_err(db)?;
    let outbox_len = store.outbox_len(&to).map_err(db)?;
    let mut out_log: HashMap<&str, bool> = HashMap::new();
    let mut in_log: HashSet<&str> = HashSet::new();
    let mut problems = Vec::new();
    for e in &log {
        let fresh = match e.dir {
            Dir::Out if e.peer == to => out_log.insert(&e.id, e.acked).is_none(),
            Dir::In if e.peer == from => in_log.insert(&e.id),
            _ => true,
        };
        if !fresh {
            problems.push(format!("{} logged twice", e.id));
        }
    }
    let in_outbox: HashSet<&str> = outbox.iter().map(|e| e.id.as_str()).collect();
    for id in &queued {
        if !out_log.contains_key(id) {
            problems.push(format!("queued {id} (flushed) is not in the log"));
        }
        if !acking.contains(id) && !in_outbox.contains(id) {
            problems.push(format!(
                "queued {id} (flushed, never acked) is not in the outbox"
            ));
        }
    }
    for id in &acked {
        if in_outbox.contains(id) {
            problems.push(format!("acked {id} (flushed) is still in the outbox"));
        }
        if out_log.get(id) != Some(&true) {
            problems.push(format!(
                "acked {id} (flushed) is not marked acked in the log"
            ));
        }
    }
    for id in &received {
        if !in_log.contains(id) {
            problems.push(format!("received {id} (flushed) is not in the log"));
        }
    }
    // The dedup index commits with the log: every inbound entry that survived (flushed or
    // not) is found in it, so a replay of that line would be a duplicate.
    for id in &in_log {
        match store.received_line(&from, id) {
            Ok(Some(_)) => {}
            Ok(None) => problems.push(format!(
                "received {id} is logged but not in the dedup index"
            )),
            Err(e) => problems.push(format!("the dedup index for {id}: {e}")),
        }
    }
    if outbox_len != outbox.len() as u64 {
        problems.push(format!(
            "the outbox counter says {outbox_len}, the outbox holds {}",
            outbox.len()
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(serde_json::json!({
        "records": queued.len() + acked.len() + received.len(),
        "enqueued": queued.len(),
        "acked": acked.len(),
        "received": received.len(),
        "log": log.len(),
        "outbox": outbox.len(),
    }))
}

fn usage() -> ! {
    eprintln!("usage: store_crash write DIR TASKS | store_crash check DIR RECORDS");
    std::process::exit(2);
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", dir, tasks] => {
            let tasks: usize = tasks.parse().unwrap_or_else(|_| usage());
            if let Err(e) = write(Path::new(dir), tasks.clamp(1, 64)).await {
                eprintln!("store_crash write: {e}");
                std::process::exit(1);
            }
        }
        ["check", dir, records] => {
            // The open's repairs (a rolled-back commit, journal records applied) go to
            // stderr, where `scripts/soak.py` counts them.
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .init();
            match check(Path::new(dir), Path::new(records)) {
                Ok(counts) => println!("{counts}"),
                Err(problems) => {
                    let n = problems.len();
                    for p in problems.iter().take(20) {
                        println!("{p}");
                    }
                    if n > 20 {
                        println!("… {} more", n - 20);
                    }
                    std::process::exit(1);
                }
            }
        }
        _ => usage(),
    }
}
