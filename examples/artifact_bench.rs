//! Driver of `scripts/bench-artifact.sh`: talks to two running nodes over their control
//! sockets.
//!
//! - `artifact_bench edits GUEST_HOME TH ARTIFACT N`: the guest (holding
//!   `artifact:write`) queues N edit commands (text edits `[i]` → `[i+1]`, base versions
//!   1+i.. so each applies on top of the previous), [`CHUNK`] per control request (one
//!   transaction each; the guest packs them up to 256 per command msg), so that the host
//!   works on the first ones while the guest queues the rest, as a client streaming
//!   commands would; the host applies each and answers each msg with a durable reply. Measures from the first
//!   request until the guest's replica holds version N+1 (every result and event back).
//!   Also prints the time the client itself took to build the frames (`build_s`) and the
//!   time until the last chunk was queued (`queue_s`).
//! - `artifact_bench host-edits HOST_HOME TH ARTIFACT N`: the host applies N edits of its
//!   own in one transaction (prefill for the catch-up measurement).
//! - `artifact_bench catchup GUEST_HOME TH SEQ HOST_ADDRESS`: the guest dials the host and
//!   waits until its replica reaches event SEQ; prints the time from the dial.
//!
//! Prints one line of JSON per measurement.

use awp_node::control::{self, Request};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Commands per control request of `edits` (one store transaction and flush each).
const CHUNK: usize = 1000;

async fn art(home: &Path, action: &str, args: Value) -> Value {
    let sock = awp_node::daemon::socket_path(home);
    let r = control::request_with_timeout(
        &sock,
        &Request::Artifact {
            action: action.into(),
            args,
        },
        Duration::from_secs(600),
    )
    .await
    .expect("control request");
    assert!(r.ok, "{action}: {:?}", r.error);
    Value::Object(r.body)
}

fn edits(th: &str, id: &str, from: u64, n: u64) -> Vec<Value> {
    (from..from + n)
        .map(|i| {
            json!({"type": "command", "command_id": format!("bench-{i}"), "command": {
                "type": "edit_artifact", "artifact_id": id, "base_version": i + 1, "thread_id": th,
                "patch": {"kind": "text_edits", "edits": [{"old": format!("[{i}]"), "new": format!("[{}]", i + 1)}]}
            }})
        })
        .collect()
}

/// The workspace's head seq (a store read; no engine state is built).
async fn head(home: &Path, th: &str) -> u64 {
    let r = art(
        home,
        "log",
        json!({"th": th, "after": u64::MAX / 2, "limit": 1}),
    )
    .await;
    r["head_seq"].as_u64().unwrap_or(0)
}

async fn wait_head(home: &Path, th: &str, want: u64, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if head(home, th).await >= want {
            return Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

#[tokio::main]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage =
        "usage: artifact_bench edits|host-edits HOME TH ARTIFACT N | catchup HOME TH SEQ ADDRESS";
    let mode = a.get(1).expect(usage).as_str();
    let home = PathBuf::from(a.get(2).expect(usage));
    let th = a.get(3).expect(usage).clone();
    match mode {
        "edits" | "host-edits" => {
            let id = a.get(4).expect(usage).clone();
            let n: u64 = a.get(5).expect(usage).parse().expect("N");
            let start = head(&home, &th).await;
            let r = art(&home, "show", json!({"th": th, "artifact": id})).await;
            let from = r["version"].as_u64().unwrap_or(1) - 1;
            let tb = Instant::now();
            let all = edits(&th, &id, from, n);
            let built = tb.elapsed();
            let t0 = Instant::now();
            for chunk in all.chunks(CHUNK) {
                art(&home, "commands", json!({"th": th, "commands": chunk})).await;
            }
            let queued = t0.elapsed();
            let want = start + n;
            match wait_head(&home, &th, want, Duration::from_secs(300)).await {
                Some(_) => {
                    let s = t0.elapsed().as_secs_f64();
                    println!(
                        "{}",
                        json!({"bench": mode, "edits": n, "seconds": s, "edits_per_s": n as f64 / s, "queue_s": queued.as_secs_f64(), "build_s": built.as_secs_f64()})
                    );
                }
                None => {
                    eprintln!(
                        "{mode}: head {} of {want} after 300 s",
                        head(&home, &th).await
                    );
                    std::process::exit(1);
                }
            }
        }
        "catchup" => {
            let want: u64 = a.get(4).expect(usage).parse().expect("SEQ");
            let addr = a.get(5).expect(usage).clone();
            // Events the replica already had before the dial (a restarted node may redial
            // its peers by itself; then part of the catch-up happened before t0).
            let before = head(&home, &th).await;
            let t0 = Instant::now();
            let sock = awp_node::daemon::socket_path(&home);
            let r = control::request_with_timeout(
                &sock,
                &Request::Connect {
                    address: addr,
                    timeout_ms: Some(10_000),
                },
                Duration::from_secs(20),
            )
            .await
            .expect("connect");
            assert!(r.ok, "connect: {:?}", r.error);
            match wait_head(&home, &th, want, Duration::from_secs(120)).await {
                Some(_) => {
                    let d = t0.elapsed();
                    println!(
                        "{}",
                        json!({"bench": "catchup", "seq": want, "head_before_dial": before, "seconds": d.as_secs_f64()})
                    );
                }
                None => {
                    eprintln!(
                        "catchup: head {} of {want} after 120 s",
                        head(&home, &th).await
                    );
                    std::process::exit(1);
                }
            }
        }
        _ => panic!("{usage}"),
    }
}
