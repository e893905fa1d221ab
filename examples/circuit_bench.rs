//! Circuit benchmark (used by `scripts/bench-circuit.sh`): a direct TLS connection against
//! a relay circuit (the end-to-end TLS copied between two sockets by a running `awp
//! relay`, spec/relay-circuits.md §Splicing) on loopback.
//!
//! Measures, for each path: throughput (lines of 16 KiB one way, acknowledged once at the
//! end) and round-trip time of small lines (median and p99), in ROUNDS rounds that
//! alternate the two paths (so a busy neighbour on a shared machine slows both alike);
//! the figures are the medians over the rounds. Also the relay's CPU time (user + system,
//! from /proc) per GiB carried by the circuit, which the load of other processes changes
//! far less than a rate; then opens idle circuits and reports the relay's resident memory
//! per circuit (VmRSS delta / circuits, from /proc).
//!
//! Usage: `circuit_bench RELAY_ADDR RELAY_PID [MIB [CIRCUITS [ROUNDS]]]` where RELAY_ADDR
//! is the relay's pinned `tls:` address (ROUNDS default 3). Prints one JSON object.

use awp_node::identity::Identity;
use awp_node::net::{self, circuit, Address, Conn, DialOptions, TlsConfig};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const LINE: usize = 16 * 1024;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// The far end: for each connection, answer `p` lines at once (latency), count other
/// lines and answer `done` to `end`.
async fn serve(mut c: Conn) {
    let mut n = 0u64;
    while let Ok(Some(line)) = c.reader.read_line().await {
        match line.first() {
            Some(b'p') => {
                if c.writer.write_all(b"p\n").await.is_err() || c.writer.flush().await.is_err() {
                    return;
                }
            }
            Some(b'e') => {
                let _ = c.writer.write_all(format!("done {n}\n").as_bytes()).await;
                let _ = c.writer.flush().await;
            }
            _ => n += line.len() as u64 + 1,
        }
    }
}

/// CPU time (user + system) of process `pid` so far, in seconds (0 if unknown).
fn cpu_s(pid: u32) -> f64 {
    // SAFETY: sysconf takes an integer and returns one.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which is in parentheses): utime is the 12th,
            // stime the 13th.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .map_or(0.0, |t| t / tick)
}

/// The median of `v` (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

async fn measure(c: &mut Conn, bytes: usize) -> serde_json::Value {
    // Round trips.
    let mut rtts = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        c.writer.write_all(b"p\n").await.unwrap();
        c.writer.flush().await.unwrap();
        c.reader.read_line().await.unwrap().unwrap();
        rtts.push(t.elapsed());
    }
    rtts.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    // Throughput.
    let mut line = vec![b'x'; LINE - 1];
    line.push(b'\n');
    let lines = bytes / LINE;
    let t = Instant::now();
    for _ in 0..lines {
        c.writer.write_all(&line).await.unwrap();
    }
    c.writer.write_all(b"e\n").await.unwrap();
    c.writer.flush().await.unwrap();
    let done = c.reader.read_line().await.unwrap().unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(done.starts_with(b"done"));
    json!({
        "rtt_us_p50": us(rtts[rtts.len() / 2]),
        "rtt_us_p99": us(rtts[rtts.len() * 99 / 100]),
        "mib_per_s": (lines * LINE) as f64 / secs / (1024.0 * 1024.0),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let relay: Address = args.get(1).ok_or("RELAY_ADDR")?.parse()?;
    let relay_pid: u32 = args.get(2).ok_or("RELAY_PID")?.parse()?;
    let mib: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(256);
    let circuits: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let rounds: usize = args
        .get(5)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(3)
        .max(1);

    let target = Arc::new(TlsConfig::new(&Identity::generate())?);
    let dialer = TlsConfig::new(&Identity::generate())?;

    // Direct: a TLS listener on loopback.
    let listener = net::Listener::bind(
        &"tls:127.0.0.1:0".parse()?,
        &target,
        &DialOptions::default(),
    )
    .await?;
    let direct_addr = listener.local_address().with_pin(target.key());
    tokio::spawn(async move {
        while let Ok(inc) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(c) = inc.handshake().await {
                    serve(c).await;
                }
            });
        }
    });
    // Through the relay: a standing connection, joining every offer.
    let mut standing = circuit::listen(&relay, &target).await?;
    {
        let (relay, target) = (relay.clone(), target.clone());
        tokio::spawn(async move {
            while let Ok(offer) = standing.next_offer().await {
                let (relay, target) = (relay.clone(), target.clone());
                tokio::spawn(async move {
                    if let Ok((c, _)) = circuit::join(&relay, &target, &offer).await {
                        serve(c).await;
                    }
                });
            }
        });
    }
    let circuit_addr = Address::circuit(&relay, target.key()).ok_or("relay address")?;

    let bytes = mib * 1024 * 1024;
    let mut direct_conn = net::dial(&direct_addr, &dialer, &DialOptions::default()).await?;
    let mut circuit_conn = net::dial(&circuit_addr, &dialer, &DialOptions::default()).await?;
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    let mut relay_cpu = 0.0;
    for _ in 0..rounds {
        direct.push(measure(&mut direct_conn, bytes).await);
        let cpu0 = cpu_s(relay_pid);
        through.push(measure(&mut circuit_conn, bytes).await);
        relay_cpu += cpu_s(relay_pid) - cpu0;
    }
    let med = |runs: &[serde_json::Value], k: &str| {
        median(runs.iter().filter_map(|r| r[k].as_f64()).collect())
    };
    let summary = |runs: &[serde_json::Value]| {
        json!({
            "rtt_us_p50": med(runs, "rtt_us_p50"),
            "rtt_us_p99": med(runs, "rtt_us_p99"),
            "mib_per_s": med(runs, "mib_per_s"),
            "rounds": runs,
        })
    };
    let ratios: Vec<f64> = direct
        .iter()
        .zip(&through)
        .map(|(d, t)| {
            t["mib_per_s"].as_f64().unwrap_or(0.0) / d["mib_per_s"].as_f64().unwrap_or(1.0)
        })
        .collect();
    let added: Vec<f64> = direct
        .iter()
        .zip(&through)
        .map(|(d, t)| {
            t["rtt_us_p50"].as_f64().unwrap_or(0.0) - d["rtt_us_p50"].as_f64().unwrap_or(0.0)
        })
        .collect();
    let carried_gib = (rounds * (bytes / LINE) * LINE) as f64 / (1024.0 * 1024.0 * 1024.0);
    let (direct, through) = (summary(&direct), summary(&through));

    // Relay memory per idle circuit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(relay_pid);
    let mut held = Vec::new();
    for _ in 0..circuits {
        held.push(net::dial(&circuit_addr, &dialer, &DialOptions::default()).await?);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_kib(relay_pid);
    println!(
        "{}",
        json!({
            "direct": direct,
            "circuit": through,
            "throughput_ratio": median(ratios.clone()),
            "throughput_ratios": ratios,
            "added_rtt_us_p50": median(added.clone()),
            "added_rtt_us_p50_rounds": added,
            "relay_cpu_s_per_gib": relay_cpu / carried_gib.max(f64::MIN_POSITIVE),
            "circuits": held.len(),
            "relay_kib_per_circuit": after.saturating_sub(before) as f64 / held.len().max(1) as f64,
        })
    );
    Ok(())
}
