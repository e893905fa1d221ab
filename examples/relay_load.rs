//! Load generator for a presence relay (used by `scripts/bench-relay.sh`).
//!
//! Opens N raw AWP-over-TLS clients to one relay, each with its own key and `presence` in
//! its hello caps, answers pings, and measures:
//! - the relay's resident memory per connection (VmRSS delta / N, from /proc);
//! - the time from client 0 writing a new signed document until all N − 1 others hold it.
//!
//! Usage: `relay_load ADDRESS CLIENTS RELAY_PID [ROUNDS [RELAY_HOME]]`. Prints one JSON
//! object; with RELAY_HOME, it includes the relay's presence status taken while all
//! clients are still connected.

use awp_node::identity::{auth_transcript, Identity};
use awp_node::net::{self, Address, DialOptions, TlsConfig};
use awp_node::presence::doc::{build_signed, DocInputs};
use awp_node::wire::{self, Line};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify, Semaphore};

/// Dials in flight at once: below the relay's handshake slots per source address (16,
/// `node::handshakes`), since every client dials from 127.0.0.1 and a slot is freed only
/// once the relay has verified the client's auth.
const DIAL_CONCURRENCY: usize = 8;

fn identity(i: usize) -> Identity {
    let mut seed = [0x5au8; 32];
    seed[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Identity::from_seed(&seed)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// What the readers look for: the (origin, seq) of the round in progress.
#[derive(Default)]
struct Target {
    want: Mutex<Option<(String, u64)>>,
    got: AtomicUsize,
    done: Notify,
}

/// A fresh id for a line we write (ids are unique per sender).
fn ids() -> String {
    static GEN: Mutex<Option<wire::ids::IdGen>> = Mutex::new(None);
    let mut g = GEN.lock().unwrap();
    g.get_or_insert_with(|| wire::ids::IdGen::new(None))
        .next_at(wire::time::now_ms())
        .to_string()
}

async fn write(w: &mut net::BoxWriter, mut l: Vec<u8>) -> std::io::Result<()> {
    l.push(b'\n');
    w.write_all(&l).await?;
    w.flush().await
}

struct Client {
    tx: mpsc::Sender<Vec<u8>>,
}

async fn connect(
    i: usize,
    addr: Address,
    target: Arc<Target>,
    expect: usize,
) -> Result<Client, String> {
    let id = identity(i);
    let tls = TlsConfig::new(&id).map_err(|e| e.to_string())?;
    let c = net::dial(&addr, &tls, &DialOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let (mut reader, mut writer) = (c.reader, c.writer);
    let hello = Line::Hello(wire::Hello {
        id: ids(),
        ts: wire::time::format_ms(wire::time::now_ms()),
        v: 0,
        key: id.key().to_string(),
        name: Some(format!("load{i}@bench")),
        nonce: wire::b64::encode_url(&rand::random::<[u8; 32]>()),
        caps: vec!["presence".into()],
        about: None,
        addr: None,
        shares: None,
    })
    .encode();
    write(&mut writer, hello.clone())
        .await
        .map_err(|e| e.to_string())?;
    let their = reader
        .read_line()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("closed before hello")?;
    let sig = id.sign(&auth_transcript(&hello, &their));
    let auth = Line::Auth(wire::Auth {
        id: ids(),
        ts: wire::time::format_ms(wire::time::now_ms()),
        sig: wire::b64::encode_url(&sig),
        grants: vec![],
    });
    write(&mut writer, auth.encode())
        .await
        .map_err(|e| e.to_string())?;
    let resume = Line::Resume(wire::Resume {
        id: ids(),
        ts: wire::time::format_ms(wire::time::now_ms()),
        seen: Default::default(),
    });
    write(&mut writer, resume.encode())
        .await
        .map_err(|e| e.to_string())?;
    // Writer task: lines from the reader (pongs) and from the benchmark (documents).
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        while let Some(l) = rx.recv().await {
            if write(&mut writer, l).await.is_err() {
                return;
            }
        }
    });
    let pong_tx = tx.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = reader.read_line().await {
            match wire::parse_line(&l) {
                Ok(Line::Ping(p)) => {
                    let pong = Line::Pong(wire::Pong {
                        id: ids(),
                        ts: wire::time::format_ms(wire::time::now_ms()),
                        re: p.id,
                    });
                    let _ = pong_tx.send(pong.encode()).await;
                }
                Ok(Line::Presence(p)) => {
                    let want = target.want.lock().unwrap().clone();
                    let origin = p.doc.get("origin").and_then(|v| v.as_str());
                    let seq = p.doc.get("seq").and_then(|v| v.as_u64());
                    if let Some((o, s)) = want {
                        if origin == Some(o.as_str())
                            && seq == Some(s)
                            && target.got.fetch_add(1, Ordering::SeqCst) + 1 == expect
                        {
                            target.done.notify_one();
                        }
                    }
                }
                Ok(Line::Err(e)) => eprintln!("client {i}: relay sent err {}", e.code),
                _ => {}
            }
        }
    });
    Ok(Client { tx })
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: relay_load ADDRESS CLIENTS RELAY_PID [ROUNDS]");
        std::process::exit(2);
    }
    let addr: Address = args[1].parse().expect("address");
    let n: usize = args[2].parse().expect("clients");
    let pid: u32 = args[3].parse().expect("relay pid");
    let rounds: usize = args.get(4).and_then(|r| r.parse().ok()).unwrap_or(5);
    let relay_home = args.get(5).map(std::path::PathBuf::from);
    let target = Arc::new(Target::default());

    let rss_before = rss_kib(pid);
    let started = Instant::now();
    let sem = Arc::new(Semaphore::new(DIAL_CONCURRENCY));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (addr, target, sem) = (addr.clone(), target.clone(), sem.clone());
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await;
            connect(i, addr, target, n - 1).await
        }));
    }
    let mut clients = Vec::new();
    let mut failed = 0usize;
    for t in tasks {
        match t.await.expect("task") {
            Ok(c) => clients.push(c),
            Err(e) => {
                // The first few reasons; then only the count (a relay that is not there
                // would print one line per client).
                if failed < 5 {
                    eprintln!("connect failed: {e}");
                }
                failed += 1;
            }
        }
    }
    if failed > 0 {
        eprintln!("{failed} of {n} clients could not connect");
    }
    if clients.len() < 2 {
        eprintln!(
            "relay_load: {} client(s) connected; at least 2 are needed (is the relay at {addr}?)",
            clients.len()
        );
        std::process::exit(1);
    }
    let connect_s = started.elapsed().as_secs_f64();
    // Let the relay finish its side of the sessions (Up, anti-entropy) before measuring.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_kib(pid);
    let connected = clients.len();

    let publisher = identity(0);
    let mut times_ms = Vec::new();
    for round in 0..rounds {
        let now = wire::time::now_ms();
        let doc = build_signed(
            &publisher,
            &DocInputs {
                name: Some("load0@bench".into()),
                version: Some(env!("CARGO_PKG_VERSION").into()),
                ..Default::default()
            },
            now,
            now,
        );
        *target.want.lock().unwrap() = Some((publisher.key().to_string(), now));
        target.got.store(0, Ordering::SeqCst);
        let line = Line::Presence(wire::PresenceMsg {
            id: ids(),
            ts: wire::time::format_ms(now),
            doc,
            hops: 0,
            doc_raw: None,
        })
        .encode();
        let t0 = Instant::now();
        let done = target.done.notified();
        clients[0].tx.send(line).await.expect("client 0 alive");
        match tokio::time::timeout(Duration::from_secs(30), done).await {
            Ok(()) => times_ms.push(t0.elapsed().as_secs_f64() * 1000.0),
            Err(_) => eprintln!(
                "round {round}: only {} of {} clients got the document in 30 s",
                target.got.load(Ordering::SeqCst),
                connected - 1
            ),
        }
        // Receivers accept one document per origin per second of signed time.
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    let per_conn_kib = if connected > 0 {
        rss_after.saturating_sub(rss_before) as f64 / connected as f64
    } else {
        0.0
    };
    let relay_status = match &relay_home {
        Some(h) => awp_node::control::request(
            &awp_node::daemon::socket_path(h),
            &awp_node::control::Request::PresenceStatus,
        )
        .await
        .map(|r| serde_json::Value::Object(r.body))
        .unwrap_or_default(),
        None => serde_json::Value::Null,
    };
    let mut sorted = times_ms.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{}",
        json!({
            "clients": n,
            "connected": connected,
            "connect_s": (connect_s * 100.0).round() / 100.0,
            "relay_rss_before_kib": rss_before,
            "relay_rss_after_kib": rss_after,
            "relay_kib_per_connection": (per_conn_kib * 10.0).round() / 10.0,
            "fanout_ms": times_ms.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>(),
            "fanout_median_ms": sorted.get(sorted.len() / 2).map(|t| (t * 10.0).round() / 10.0),
            "relay_status": relay_status,
        })
    );
    drop(clients);
}
