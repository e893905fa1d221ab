//! Cost of signed lines (spec/signed-lines.md): sign and verify per line, and
//! ed25519-dalek batch verification of a batch of received lines, with single verification
//! to find the bad one when a batch fails. Prints figures; run by `scripts/bench.sh`
//! (pipelined throughput with signing on is that script's phase 4: nodes sign by default).
//!
//! Environment: BENCH_SIG_N (lines, default 20000), BENCH_SIG_BATCH (default 256).

use awp_node::canonical;
use awp_node::identity::Identity;
use awp_node::wire::{b64, sig};
use serde_json::{json, Value};
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn per_line(what: &str, n: usize, t: std::time::Duration) {
    let us = t.as_secs_f64() * 1e6 / n as f64;
    println!("{what:<44} {us:>8.2} µs/line  {:>10.0} lines/s", 1e6 / us);
}

fn main() {
    let n = env_usize("BENCH_SIG_N", 20_000).max(1);
    let batch = env_usize("BENCH_SIG_BATCH", 256).max(1);
    let id = Identity::from_seed(&[5u8; 32]);
    let key = id.key();
    let lines: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            json!({"t":"msg","id":format!("01K{i:023}"),"ts":"2026-11-30T18:00:00.000Z",
                   "th":"thr_bench","parts":[{"k":"text","text":format!("line {i} of the bench, some text")}]})
            .to_string()
            .into_bytes()
        })
        .collect();
    println!("signed lines: {n} msg lines of ~{} bytes", lines[0].len());

    let t = Instant::now();
    let signed: Vec<Vec<u8>> = lines
        .iter()
        .map(|l| sig::sign_encoded(&id, l).expect("sign"))
        .collect();
    per_line("sign (parse, canonicalise, Ed25519)", n, t.elapsed());

    let t = Instant::now();
    for l in &signed {
        sig::verify_line(&key, l).expect("verify");
    }
    per_line(
        "verify_strict (parse, canonicalise, verify)",
        n,
        t.elapsed(),
    );

    // Prepare (parse + canonical bytes + sig) once, then compare the two verifications.
    let prepared: Vec<(Vec<u8>, ed25519_dalek::Signature)> = signed
        .iter()
        .map(|l| {
            let Value::Object(m) = serde_json::from_slice(l).unwrap() else {
                unreachable!()
            };
            let s = b64::decode_any(m["sig"].as_str().unwrap()).unwrap();
            let s = ed25519_dalek::Signature::from_slice(&s).unwrap();
            (canonical::signing_bytes(&m).unwrap(), s)
        })
        .collect();
    let vk = key.verifying_key();
    let t = Instant::now();
    for (m, s) in &prepared {
        vk.verify_strict(m, s).expect("verify");
    }
    per_line("verify_strict only (bytes prepared)", n, t.elapsed());

    let t = Instant::now();
    for chunk in prepared.chunks(batch) {
        let msgs: Vec<&[u8]> = chunk.iter().map(|(m, _)| m.as_slice()).collect();
        let sigs: Vec<_> = chunk.iter().map(|(_, s)| *s).collect();
        let keys = vec![vk; chunk.len()];
        ed25519_dalek::verify_batch(&msgs, &sigs, &keys).expect("batch verifies");
    }
    per_line(
        &format!("verify_batch of {batch} (bytes prepared)"),
        n,
        t.elapsed(),
    );

    // One bad line per batch: the batch fails, then single verification finds it.
    let mut bad = prepared.clone();
    for chunk in bad.chunks_mut(batch) {
        let last = chunk.len() - 1;
        chunk[last].0.push(b' ');
    }
    let t = Instant::now();
    let mut found = 0;
    for chunk in bad.chunks(batch) {
        let msgs: Vec<&[u8]> = chunk.iter().map(|(m, _)| m.as_slice()).collect();
        let sigs: Vec<_> = chunk.iter().map(|(_, s)| *s).collect();
        let keys = vec![vk; chunk.len()];
        if ed25519_dalek::verify_batch(&msgs, &sigs, &keys).is_err() {
            found += chunk
                .iter()
                .filter(|(m, s)| vk.verify_strict(m, s).is_err())
                .count();
        }
    }
    assert_eq!(found, n.div_ceil(batch));
    per_line(
        &format!("batch of {batch} failing, then singles find the bad one"),
        n,
        t.elapsed(),
    );
}
