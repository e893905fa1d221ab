//! Chunk lines and blob-naming msgs from one peer, in any order, through `BlobReceiver`
//! against one store and blob directory. Each input line is parsed as a wire line; chunks
//! and msgs are fed in. Nothing may panic; a stored or refused verdict never leaves a
//! complete blob whose file differs from what the store records.
//!
//! The store and the blob writes run without fsyncs (`shared::NoDurability`); store and
//! blob directory are replaced by fresh ones every `shared::FRESH_EVERY` inputs.
#![no_main]

#[path = "shared.rs"]
mod shared;

use awp_node::blob::{BlobReceiver, BlobSync};
use awp_node::store::Store;
use awp_node::wire::{parse_line, Line, PeerKey};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex, OnceLock};

const FROM: &str = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc";

struct Env {
    rx: BlobReceiver,
    store: Arc<Store>,
    inputs: u64,
    // Declared last: the directory goes after the database is closed.
    _dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("awp-fuzz-chunk-")
            .tempdir()
            .unwrap();
        let store = Arc::new(Store::open(&dir.path().join("db")).unwrap());
        store.set_faults(Some(Arc::new(shared::NoDurability)));
        // A small limit so size refusals are reachable.
        let rx = BlobReceiver::new(store.clone(), dir.path().join("blobs"), 1 << 20);
        Env {
            rx,
            store,
            inputs: 0,
            _dir: dir,
        }
    }
}

fn env() -> &'static Mutex<Env> {
    static ENV: OnceLock<Mutex<Env>> = OnceLock::new();
    ENV.get_or_init(|| Mutex::new(Env::new()))
}

fuzz_target!(|data: &[u8]| {
    let peer = PeerKey::parse(FROM).unwrap();
    let mut env = env().lock().unwrap_or_else(|p| p.into_inner());
    env.inputs += 1;
    if env.inputs % shared::FRESH_EVERY == 0 {
        let inputs = env.inputs;
        *env = Env::new();
        env.inputs = inputs;
    }
    // Chunks are taken without their fsync; every third line, the running sync (if any)
    // finishes and the next one begins, so chunks are also taken while a sync runs, as the
    // node's connection does (`BlobReceiver::begin_sync`).
    let mut running: Option<BlobSync> = None;
    for (i, raw) in data.split(|b| *b == b'\n').take(64).enumerate() {
        if let Ok(line) = parse_line(raw) {
            let verdicts = match &line {
                Line::Chunk(c) => env.rx.take_chunk(&peer, c).map(|v| vec![v]),
                Line::Msg(m) => env.rx.on_msg(&peer, m),
                _ => Ok(Vec::new()),
            };
            // Storage errors are possible (the store is real); refusals are verdicts.
            let _ = verdicts;
        }
        if i % 3 == 2 {
            finish(&mut env.rx, running.take());
            running = Some(env.rx.begin_sync());
        }
    }
    finish(&mut env.rx, running.take());
    let _ = env.rx.sync();
    // Completed blobs are moved after a flush; their files must hold what was recorded.
    let _ = env.store.flush_blocking();
    for done in env.rx.after_flush() {
        let rec = env.store.blob_in(&done.peer, &done.blob_ref).ok().flatten();
        if let Some(rec) = rec {
            if let (Some(path), Some(size)) = (rec.path, rec.size) {
                if let Ok(bytes) = std::fs::read(&path) {
                    assert_eq!(bytes.len() as u64, size, "a complete blob has its declared size");
                    let sha = awp_node::blob::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
                    assert_eq!(Some(sha), rec.sha256, "a complete blob has its recorded SHA-256");
                }
            }
        }
    }
});

/// Finish a sync begun by `BlobReceiver::begin_sync`: record on success, forget on failure.
fn finish(rx: &mut BlobReceiver, job: Option<BlobSync>) {
    let Some(job) = job else { return };
    match job.run() {
        Ok(()) => {
            let _ = rx.finish_sync();
        }
        Err(_) => rx.abort_sync(),
    }
}
