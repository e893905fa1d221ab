//! `cargo bench --bench grants`: what held grants cost a node, measured in-process over TLS
//! on 127.0.0.1 (issue #10: 2,400 held grants made every handshake 0.15 s slower and took
//! 213 s to store).
//!
//! 1. `BENCH_GRANT_ISSUERS` issuers (default 150) each connect once and present
//!    `BENCH_GRANTS_PER_ISSUER` grants (default 16, at most 32) issued to the node in
//!    their `auth`; the node keeps them (within its caps). Printed: total and per-issuer
//!    time, and how many grants the node holds afterwards.
//! 2. `BENCH_HANDSHAKE_N` (default 20) fresh keys connect: handshake p50 / max (the node
//!    offers its held grants and judges admission at each).
//!
//! Everything stays in a temporary home; each phase is bounded by `BENCH_PHASE_LIMIT_S`
//! (default 600). A phase that cannot run fails the run (exit code 1).

use anyhow::{anyhow, bail, Result};
use awp_node::identity::{auth_transcript, Identity};
use awp_node::net::{self, Address, BoxWriter, DialOptions, LineReader, TlsConfig};
use awp_node::node::{NodeConfig, NodeHandle};
use awp_node::store::{GrantRole, Store};
use awp_node::wire::{self, Line, PeerKey};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

fn env_n(k: &str, default: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Client {
    reader: LineReader,
    writer: BoxWriter,
}

impl Client {
    async fn dial(addr: &Address, identity: &Identity) -> Result<Client> {
        let tls = TlsConfig::new(identity)?;
        let c = net::dial(addr, &tls, &DialOptions::default()).await?;
        Ok(Client {
            reader: c.reader,
            writer: c.writer,
        })
    }

    async fn write(&mut self, line: &[u8]) -> Result<()> {
        self.writer.write_all(line).await?;
        self.writer.write_all(b"\n").await?;
        self.writer.flush().await?;
        Ok(())
    }

    async fn read(&mut self) -> Result<Vec<u8>> {
        tokio::time::timeout(Duration::from_secs(30), self.reader.read_line())
            .await
            .map_err(|_| anyhow!("no line from the node within 30 s"))??
            .ok_or_else(|| anyhow!("the node closed the connection"))
    }

    /// hello, auth (with `grants`), until the node's resume; then our resume.
    async fn handshake(&mut self, identity: &Identity, grants: Vec<wire::Grant>) -> Result<()> {
        let ts = wire::time::format_ms(wire::time::now_ms());
        let mut nonce = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
        let mine = Line::Hello(wire::Hello {
            id: "01K00000000000000000000000".into(),
            ts: ts.clone(),
            v: 0,
            key: identity.key().to_string(),
            name: Some("bench@127.0.0.1".into()),
            nonce: wire::b64::encode_url(&nonce),
            caps: vec![],
            about: None,
            addr: None,
            shares: None,
        })
        .encode();
        self.write(&mine).await?;
        let theirs = self.read().await?;
        if !matches!(wire::parse_line(&theirs), Ok(Line::Hello(_))) {
            bail!("first line from the node is not hello");
        }
        let sig = identity.sign(&auth_transcript(&mine, &theirs));
        let auth = Line::Auth(wire::Auth {
            id: "01K00000000000000000000001".into(),
            ts: ts.clone(),
            sig: wire::b64::encode_url(&sig),
            grants,
        });
        self.write(&auth.encode()).await?;
        for want in ["auth", "resume"] {
            let l = wire::parse_line(&self.read().await?).map_err(|e| anyhow!("{e}"))?;
            if l.kind() != want {
                bail!("expected {want} from the node, got {}", l.kind());
            }
        }
        let resume = format!(
            r#"{{"t":"resume","id":"01K00000000000000000000002","ts":"{ts}","seen":{{}}}}"#
        );
        self.write(resume.as_bytes()).await
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn run() -> Result<()> {
    let issuers = env_n("BENCH_GRANT_ISSUERS", 150);
    let per = env_n("BENCH_GRANTS_PER_ISSUER", 16).min(32);
    let hs_n = env_n("BENCH_HANDSHAKE_N", 20).max(1);
    let limit = Duration::from_secs(env_n("BENCH_PHASE_LIMIT_S", 600) as u64);
    let home = tempfile::TempDir::new()?;
    let node = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse()?],
        name: Some("grants-bench".into()),
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow!("node start: {e}"))?;
    let addr: Address = node.listening_event()["address"]
        .as_str()
        .ok_or_else(|| anyhow!("no address"))?
        .parse()
        .map_err(|e| anyhow!("{e}"))?;
    let me: PeerKey = node.key();
    let now = wire::time::now_ms();

    // 1. Issuers present grants issued to the node.
    let t0 = Instant::now();
    let mut conns = Vec::new();
    for i in 0..issuers {
        if t0.elapsed() > limit {
            bail!("phase 1 over its time limit after {i} issuers");
        }
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
        let iss = Identity::from_seed(&seed);
        let grants = (0..per)
            .map(|_| awp_node::grant::mint(&iss, &me, &["exec".into()], 3600, None, now))
            .collect();
        let mut c = Client::dial(&addr, &iss).await?;
        c.handshake(&iss, grants).await?;
        conns.push(c);
        if conns.len() >= 32 {
            conns.clear();
        }
    }
    drop(conns);
    let store_time = t0.elapsed();
    println!(
        "store {} grants from {issuers} issuers: {:.2} s ({:.1} ms per issuer handshake)",
        issuers * per,
        store_time.as_secs_f64(),
        store_time.as_secs_f64() * 1000.0 / issuers.max(1) as f64
    );

    // 2. Fresh keys connect.
    let t1 = Instant::now();
    let mut times = Vec::new();
    for i in 0..hs_n {
        if t1.elapsed() > limit {
            bail!("phase 2 over its time limit after {i} handshakes");
        }
        let id = Identity::from_seed(&[200u8.wrapping_add(i as u8); 32]);
        let t = Instant::now();
        let mut c = Client::dial(&addr, &id).await?;
        c.handshake(&id, vec![]).await?;
        times.push(t.elapsed());
    }
    let max = *times.iter().max().unwrap_or(&Duration::ZERO);
    println!(
        "handshake with {} grants stored: p50 {:.1} ms, max {:.1} ms ({hs_n} runs)",
        issuers * per,
        p50(times).as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );
    node.shutdown();
    node.stopped().await;
    drop(node);
    let store = Store::open(home.path().join("db").as_path());
    match store {
        Ok(s) => {
            let held = s
                .grants()?
                .iter()
                .filter(|r| r.role == GrantRole::Held)
                .count();
            println!("grants held afterwards: {held}");
        }
        Err(e) => println!("(store not reopened: {e})"),
    }
    Ok(())
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    if let Err(e) = rt.block_on(run()) {
        eprintln!("grants bench failed: {e:#}");
        std::process::exit(1);
    }
}
