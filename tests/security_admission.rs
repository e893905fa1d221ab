//! Admission, dial-back and introductions against hostile peers, over real sockets on
//! 127.0.0.1 (raw protocol lines written by hand, as in `tests/hostile.rs`).
//!
//! - A stranger refused by `--accept allowlist` that pipelines content behind its auth (one
//!   TCP write) leaves nothing: no thread, log line, blob file, grant, presence document or
//!   introduced peer. An admitted peer pipelining the same gets all of it stored.
//! - Strangers naming a dial-back address in their hello do not make the node dial it.
//! - Introductions are hints: they do not reorder a peer's addresses, do not shadow a known
//!   name, and are capped per introducer.

mod common;

use awp_node::canonical::sign_object;
use awp_node::control::Request;
use awp_node::identity::{auth_transcript, Identity};
use awp_node::net::{self, Address, DialOptions, TlsConfig};
use awp_node::wire::{self, b64, Line};
use common::*;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;

const TS: &str = "2026-01-01T00:00:00.000Z";

async fn start_with_config(name: &str, config: &str) -> TestNode {
    let home = TempDir::new().unwrap();
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    TestNode::start_in(home, name).await
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("an object"),
    }
}

fn signed(identity: &Identity, mut o: Map<String, Value>) -> Map<String, Value> {
    let sig = sign_object(identity, &o);
    o.insert("sig".into(), sig.into());
    o
}

fn line(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

/// A raw peer that writes its auth and everything after it in one write.
struct Pipeliner {
    identity: Identity,
    reader: net::LineReader,
    writer: net::BoxWriter,
}

impl Pipeliner {
    async fn dial(addr: &str, identity: Identity) -> Pipeliner {
        let tls = TlsConfig::new(&identity).unwrap();
        let addr: Address = addr.parse().unwrap();
        let c = net::dial(&addr, &tls, &DialOptions::default())
            .await
            .expect("dial");
        Pipeliner {
            identity,
            reader: c.reader,
            writer: c.writer,
        }
    }

    fn key(&self) -> String {
        self.identity.key().to_string()
    }

    async fn read(&mut self) -> Option<Vec<u8>> {
        match tokio::time::timeout(Duration::from_secs(10), self.reader.read_line()).await {
            Ok(Ok(l)) => l,
            _ => None,
        }
    }

    /// Hello (with `addr`), read the node's hello; then auth followed by `after` in a
    /// single write. Returns the node's hello.
    async fn handshake_pipelined(&mut self, addr: Option<&str>, after: &[Vec<u8>]) -> wire::Hello {
        let mine = Line::Hello(wire::Hello {
            id: "01K00000000000000000000000".into(),
            ts: TS.into(),
            v: 0,
            key: self.key(),
            name: Some("pipeliner@test".into()),
            nonce: b64::encode_url(&[9u8; 32]),
            caps: vec![
                "presence".into(),
                "blob".into(),
                "grant".into(),
                "introduce".into(),
            ],
            about: None,
            addr: addr.map(str::to_string),
            shares: None,
        })
        .encode();
        self.writer.write_all(&mine).await.unwrap();
        self.writer.write_all(b"\n").await.unwrap();
        self.writer.flush().await.unwrap();
        let theirs = self.read().await.expect("node hello");
        let Ok(Line::Hello(h)) = wire::parse_line(&theirs) else {
            panic!("first line must be hello")
        };
        let sig = self.identity.sign(&auth_transcript(&mine, &theirs));
        let auth = Line::Auth(wire::Auth {
            id: "01K00000000000000000000001".into(),
            ts: TS.into(),
            sig: b64::encode_url(&sig),
            grants: vec![],
        });
        let mut buf = auth.encode();
        buf.push(b'\n');
        for l in after {
            buf.extend_from_slice(l);
            buf.push(b'\n');
        }
        self.writer.write_all(&buf).await.unwrap();
        self.writer.flush().await.unwrap();
        h
    }

    /// Lines from the node until EOF (at most 10 s of silence, at most 10,000 lines).
    async fn rest(&mut self) -> Vec<Line> {
        let mut out = Vec::new();
        while out.len() < 10_000 {
            match self.read().await {
                Some(l) => out.push(wire::parse_line(&l).expect("node sends valid lines")),
                None => break,
            }
        }
        out
    }
}

/// What a pipelining peer sends behind its auth: msg, state, chunk + blob msg, a grant it
/// issues to the node, an introduction, its presence document, an ack, a resume, a ping.
fn pipelined_content(
    me: &Identity,
    node_key: &str,
    th: &str,
    introduced: &Identity,
) -> Vec<Vec<u8>> {
    let now = wire::time::now_ms();
    let grant = signed(
        me,
        obj(
            json!({"iss": me.key().to_string(), "sub": node_key, "caps": ["exec"],
            "exp": "2099-01-01T00:00:00Z", "nonce": b64::encode_url(&[3u8; 16])}),
        ),
    );
    let doc = signed(
        me,
        obj(json!({"origin": me.key().to_string(), "seq": now,
            "ts": wire::time::format_ms(now), "name": "pipeliner@test"})),
    );
    let ik = introduced.key().to_string();
    vec![
        line(
            json!({"t":"msg","id":"01K00000000000000000000101","ts":TS,"th":th,
            "subject":"pipelined","parts":[{"k":"text","text":"stored?"}]}),
        ),
        line(
            json!({"t":"state","id":"01K00000000000000000000102","ts":TS,"th":th,"state":"working"}),
        ),
        line(
            json!({"t":"chunk","id":"01K00000000000000000000103","ts":TS,"th":th,"ref":"r1",
            "n":0,"last":true,"data":"aGk="}),
        ),
        line(
            json!({"t":"msg","id":"01K00000000000000000000104","ts":TS,"th":th,
            "parts":[{"k":"blob","ref":"r1","size":2,"name":"planted.txt","mime":"text/plain"}]}),
        ),
        line(json!({"t":"grant","id":"01K00000000000000000000105","ts":TS,"grant":grant})),
        line(
            json!({"t":"introduce","id":"01K00000000000000000000106","ts":TS,
            "peer":{"key":ik,"name":"carol-introduced","address":format!("tls:127.0.0.1:9#{ik}")}}),
        ),
        line(json!({"t":"presence","id":"01K00000000000000000000107","ts":TS,"doc":doc,"hops":0})),
        line(
            json!({"t":"ack","id":"01K00000000000000000000108","ts":TS,"th":th,
            "re":"01K00000000000000000000001"}),
        ),
        line(json!({"t":"resume","id":"01K00000000000000000000109","ts":TS,"seen":{}})),
        line(json!({"t":"ping","id":"01K00000000000000000000110","ts":TS})),
    ]
}

/// What the node holds from or about `peer` (and the peer it introduced).
#[derive(Debug, Default, PartialEq)]
struct Traces {
    threads: usize,
    log_lines: usize,
    blobs_listed: usize,
    blob_files: usize,
    grants: usize,
    presence: bool,
    peer_known: bool,
    introduced_known: bool,
}

fn count_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        n += if p.is_dir() { count_files(&p) } else { 1 };
    }
    n
}

async fn traces(node: &TestNode, peer: &str, introduced: &str) -> Traces {
    let body = |r: awp_node::control::Response| {
        assert!(r.ok, "{:?}", r.error);
        Value::Object(r.body)
    };
    let threads = body(node.ctl(Request::Threads).await);
    let blobs = body(
        node.ctl(Request::Blobs {
            peer: None,
            blob_ref: None,
        })
        .await,
    );
    let grants = body(node.ctl(Request::Grants).await);
    let presence = body(node.ctl(Request::Presence { peer: None }).await);
    let peers = body(node.ctl(Request::Peers).await);
    let arr = |v: &Value, k: &str| v[k].as_array().cloned().unwrap_or_default();
    let by_peer = |v: &Value| v["peer"] == peer || v["key"] == peer;
    Traces {
        threads: arr(&threads, "threads")
            .iter()
            .filter(|t| by_peer(t))
            .count(),
        log_lines: node
            .inbound()
            .await
            .iter()
            .filter(|e| e["peer"] == peer)
            .count(),
        blobs_listed: arr(&blobs, "blobs").iter().filter(|b| by_peer(b)).count(),
        blob_files: count_files(&node.path().join("blobs")),
        grants: arr(&grants, "grants")
            .iter()
            .filter(|g| g["iss"] == peer || g["sub"] == peer)
            .count(),
        presence: arr(&presence, "agents").iter().any(|a| a["origin"] == peer),
        peer_known: arr(&peers, "peers").iter().any(|p| p["key"] == peer),
        introduced_known: arr(&peers, "peers").iter().any(|p| p["key"] == introduced),
    }
}

// ---------------------------------------------------------------------------------------
// 1. Admission bypass by pipelining.

#[tokio::test]
async fn a_refused_stranger_that_pipelines_leaves_nothing_behind() {
    let node = start_with_config("guarded@test", "accept = \"allowlist\"\n").await;
    let carol = Identity::from_seed(&[0x33; 32]);
    for i in 0..5u8 {
        let stranger = Identity::from_seed(&[0x60 + i; 32]);
        let key = stranger.key().to_string();
        let mut p = Pipeliner::dial(&node.address(), stranger).await;
        let content = pipelined_content(&p.identity, &node.key(), &format!("thr_s{i}"), &carol);
        p.handshake_pipelined(None, &content).await;
        let got = p.rest().await;
        let kinds: Vec<&str> = got.iter().map(|l| l.kind()).collect();
        assert!(
            matches!(got.last(), Some(Line::Err(e)) if e.code == "auth"),
            "stranger {i}: refused with err auth, got {kinds:?}"
        );
        assert!(
            !kinds
                .iter()
                .any(|k| ["ack", "resume", "pong", "grant", "presence"].contains(k)),
            "stranger {i}: nothing answered before the refusal: {kinds:?}"
        );
        let t = traces(&node, &key, &carol.key().to_string()).await;
        assert_eq!(t, Traces::default(), "stranger {i} left traces");
    }
}

#[tokio::test]
async fn an_admitted_peer_that_pipelines_the_same_gets_it_all_stored() {
    let friend = Identity::from_seed(&[0x42; 32]);
    let node = start_with_config(
        "guarded@test",
        &format!("accept = \"allowlist\"\nallow = [\"{}\"]\n", friend.key()),
    )
    .await;
    let carol = Identity::from_seed(&[0x34; 32]);
    let key = friend.key().to_string();
    let mut p = Pipeliner::dial(&node.address(), friend).await;
    let content = pipelined_content(&p.identity, &node.key(), "thr_friend", &carol);
    p.handshake_pipelined(None, &content).await;
    // The node answers: its resume, acks of msg, state and blob msg, and the pong.
    let mut kinds = Vec::new();
    for _ in 0..50 {
        let Some(l) = p.read().await else { break };
        let l = wire::parse_line(&l).unwrap();
        kinds.push(l.kind().to_string());
        if kinds.iter().filter(|k| *k == "ack").count() == 3 && kinds.contains(&"pong".into()) {
            break;
        }
    }
    assert_eq!(kinds[0], "auth", "{kinds:?}");
    assert_eq!(kinds[1], "resume", "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "ack").count(), 3, "{kinds:?}");
    let t = eventually(10, || async {
        let t = traces(&node, &key, &carol.key().to_string()).await;
        (t.presence && t.blob_files == 1 && t.introduced_known).then_some(t)
    })
    .await;
    assert_eq!(
        t,
        Traces {
            threads: 1,
            log_lines: 3,
            blobs_listed: 1,
            blob_files: 1,
            grants: 1,
            presence: true,
            peer_known: true,
            introduced_known: true,
        }
    );
}

// ---------------------------------------------------------------------------------------
// 7. Dial-back amplification.

/// A node whose dialer runs on short delays (so a test sees many rounds in a second).
async fn start_fast_dialer(name: &str, per_destination: usize) -> TestNode {
    let home = TempDir::new().unwrap();
    let handle = awp_node::node::NodeHandle::start(awp_node::node::NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        dial_timing: awp_node::node::DialTiming {
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
            hello_grace: Duration::from_millis(20),
            per_destination,
            destination_window: Duration::from_secs(600),
        },
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}

/// A TCP listener that counts connections and drops them (every TLS dial to it fails).
async fn counting_listener() -> (
    u16,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    (port, n, task)
}

/// `count` strangers, each naming `tls:127.0.0.1:port` as its dial-back address, open a
/// thread with one msg (acked), then disconnect. Returns their keys.
async fn strangers_open_threads(node: &TestNode, port: u16, count: u8, seed: u8) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..count {
        let id = Identity::from_seed(&[seed + i; 32]);
        keys.push(id.key().to_string());
        let mut p = Pipeliner::dial(&node.address(), id).await;
        let msg = line(json!({"t":"msg","id":"01K00000000000000000000101","ts":TS,
            "th":format!("thr_dial_{seed}_{i}"),"subject":"call me","parts":[]}));
        p.handshake_pipelined(Some(&format!("tls:127.0.0.1:{port}")), &[msg])
            .await;
        for _ in 0..20 {
            match p.read().await.map(|l| wire::parse_line(&l).unwrap()) {
                Some(Line::Ack(_)) => break,
                Some(_) => continue,
                None => panic!("stranger {i}: no ack"),
            }
        }
    }
    // Gone from the node's side too, so what follows starts with no connection to them.
    eventually(10, || async {
        let all = peers(node).await;
        keys.iter()
            .all(|k| {
                all.iter()
                    .any(|p| p["key"] == k.as_str() && p["connected"] == false)
            })
            .then_some(())
    })
    .await;
    keys
}

/// Watch `n` for `ms` milliseconds of real time (bounded), returning the final count.
async fn settle_count(n: &std::sync::atomic::AtomicUsize, ms: u64) -> usize {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    n.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn strangers_hello_addr_is_not_dialed_for_threads_they_opened() {
    let node = start_fast_dialer("target@test", 1000).await;
    let (port, n, task) = counting_listener().await;
    strangers_open_threads(&node, port, 10, 0x70).await;
    // 50 hello-grace periods and many backoff rounds: the old dialer redialed every one.
    let dials = settle_count(&n, 1000).await;
    assert_eq!(dials, 0, "no dial back for threads strangers opened");
    task.abort();
}

#[tokio::test]
async fn dials_to_one_address_are_rate_limited_across_peers() {
    let node = start_fast_dialer("target@test", 4).await;
    let (port, n, task) = counting_listener().await;
    let keys = strangers_open_threads(&node, port, 10, 0x80).await;
    // Now we do have something to say to each: a reply queued for all ten.
    for k in &keys {
        node.send(Some(k), None, "reply").await;
    }
    let dials = settle_count(&n, 1000).await;
    assert!(
        (1..=4).contains(&dials),
        "ten peers naming one address: at most 4 dials to it per window, got {dials}"
    );
    task.abort();
}

#[tokio::test]
async fn a_peer_that_never_answers_is_given_up_after_bounded_failures() {
    let node = start_fast_dialer("target@test", 1000).await;
    let (port, n, task) = counting_listener().await;
    let keys = strangers_open_threads(&node, port, 1, 0x90).await;
    node.send(Some(&keys[0]), None, "reply").await;
    let max = awp_node::node::MAX_DIAL_FAILURES as usize;
    eventually(10, || async {
        (n.load(std::sync::atomic::Ordering::SeqCst) >= max).then_some(())
    })
    .await;
    // Backoff is 10-20 ms here: another second would be dozens of rounds without a bound.
    let dials = settle_count(&n, 1000).await;
    assert_eq!(dials, max, "dialing stops after {max} failed rounds");
    // New traffic wakes it again (bounded again).
    node.send(Some(&keys[0]), None, "another reply").await;
    eventually(10, || async {
        (n.load(std::sync::atomic::Ordering::SeqCst) >= 2 * max).then_some(())
    })
    .await;
    assert_eq!(settle_count(&n, 1000).await, 2 * max);
    task.abort();
}

// ---------------------------------------------------------------------------------------
// 8. Introductions from anyone.

/// Lines from `p` until its pong (so every line before the ping was handled), bounded.
async fn until_pong(p: &mut Pipeliner) {
    for _ in 0..1000 {
        match p.read().await.map(|l| wire::parse_line(&l).unwrap()) {
            Some(Line::Pong(_)) => return,
            Some(_) => continue,
            None => panic!("no pong"),
        }
    }
    panic!("no pong within 1000 lines");
}

fn introduce_line(n: u32, key: &str, name: &str, address: Option<&str>) -> Vec<u8> {
    let mut peer = json!({"key": key, "name": name});
    if let Some(a) = address {
        peer["address"] = json!(a);
    }
    line(json!({"t":"introduce","id":format!("01K0000000000000000000{n:04}"),"ts":TS,"peer":peer}))
}

async fn peers(node: &TestNode) -> Vec<Value> {
    let r = node.ctl(Request::Peers).await;
    assert!(r.ok, "{:?}", r.error);
    r.body["peers"].as_array().cloned().unwrap_or_default()
}

/// Two nodes, `node` knowing `real` (which dialed it, named `realpeer@test`), and a
/// stranger that sent `node` the introductions `lines` (then a ping, answered).
struct IntroScene {
    node: TestNode,
    real: TestNode,
    stranger_key: String,
}

async fn stranger_introduces(lines: impl FnOnce(&str) -> Vec<Vec<u8>>) -> IntroScene {
    let (node, real) = two_known_nodes().await;
    stranger_introduces_to(node, real, lines).await
}

async fn two_known_nodes() -> (TestNode, TestNode) {
    let node = TestNode::start("node@test").await;
    let real = TestNode::start("realpeer@test").await;
    // The real peer dials us: we know it, with the address its hello gave.
    real.connect(&node).await;
    (node, real)
}

async fn stranger_introduces_to(
    node: TestNode,
    real: TestNode,
    lines: impl FnOnce(&str) -> Vec<Vec<u8>>,
) -> IntroScene {
    let stranger = Identity::from_seed(&[0xA1; 32]);
    let stranger_key = stranger.key().to_string();
    let mut p = Pipeliner::dial(&node.address(), stranger).await;
    let mut lines = lines(&real.key());
    lines.push(line(
        json!({"t":"ping","id":"01K00000000000000000009999","ts":TS}),
    ));
    p.handshake_pipelined(None, &lines).await;
    until_pong(&mut p).await;
    IntroScene {
        node,
        real,
        stranger_key,
    }
}

#[tokio::test]
async fn an_introduced_address_never_goes_ahead_of_one_that_worked() {
    let (node, real) = two_known_nodes().await;
    // A trap whose address sorts before the real one as text (the old tie break), so the
    // order cannot come out right by chance (bounded tries).
    let real_port = real
        .address()
        .split(':')
        .nth(2)
        .unwrap()
        .split('#')
        .next()
        .unwrap()
        .to_string();
    let mut trap = None;
    for _ in 0..100 {
        let t = counting_listener().await;
        if t.0.to_string() < real_port {
            trap = Some(t);
            break;
        }
        t.2.abort();
    }
    let Some((trap_port, trap, task)) = trap else {
        eprintln!("skipped: no free port sorting before {real_port}");
        return;
    };
    let s = stranger_introduces_to(node, real, |real_key| {
        // A false address for the real peer (pinned to its key, so it passes the checks).
        vec![introduce_line(
            1,
            real_key,
            "realpeer@test",
            Some(&format!("tls:127.0.0.1:{trap_port}#{real_key}")),
        )]
    })
    .await;
    let real_key = s.real.key();
    // `connect <key>` dials its best known address: the one the peer gave, not the hint.
    let r = s
        .node
        .ctl(Request::Connect {
            address: real_key.clone(),
            timeout_ms: Some(10_000),
        })
        .await;
    // It may end as a simultaneous open (the real peer is connected): either way the
    // address dialed is named.
    let dialed = match (&r.ok, &r.error) {
        (true, _) => r.body["address"].as_str().unwrap().to_string(),
        (false, Some(e)) => e.message.clone(),
        (false, None) => panic!("no error"),
    };
    assert!(
        dialed.starts_with(&s.real.address()),
        "dialed {dialed}, the real peer is at {}",
        s.real.address()
    );
    assert_eq!(
        trap.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the introduced address was dialed"
    );
    let all = peers(&s.node).await;
    let rec = all.iter().find(|p| p["key"] == real_key.as_str()).unwrap();
    assert_eq!(rec["name"], "realpeer@test");
    assert!(rec["introduced_by"].is_null(), "{rec}");
    let addrs = rec["addresses"].as_array().unwrap();
    assert_eq!(addrs.len(), 2, "{rec}");
    assert_eq!(
        addrs[1]["source"], "introduce",
        "the hint comes last: {rec}"
    );
    task.abort();
}

#[tokio::test]
async fn an_introduced_name_never_shadows_a_known_peer() {
    let fake = Identity::from_seed(&[0xA0; 32]).key().to_string();
    let s = stranger_introduces(|_| vec![introduce_line(2, &fake, "realpeer@test", None)]).await;
    let real_key = s.real.key();
    for name in ["realpeer", "realpeer@test"] {
        let r = s
            .node
            .ctl(Request::Send {
                peer: Some(name.into()),
                th: None,
                subject: None,
                re: None,
                parts: vec![json!({"k":"text","text":"to the real one"})],
                files: vec![],
                wait_ack_ms: None,
            })
            .await;
        assert!(r.ok, "send {name}: {:?}", r.error);
        assert_eq!(r.body["peer"], real_key.as_str(), "{name}: {:?}", r.body);
    }
    // The planted key is kept as the stranger's hint, reachable by its full key only.
    let all = peers(&s.node).await;
    let planted = all.iter().find(|p| p["key"] == fake.as_str()).unwrap();
    assert_eq!(planted["introduced_by"], s.stranger_key.as_str());
}

#[tokio::test]
async fn introductions_are_capped_per_introducer() {
    let flood: Vec<String> = (0..200u32)
        .map(|i| {
            let mut seed = [0xB0u8; 32];
            seed[..4].copy_from_slice(&i.to_be_bytes());
            Identity::from_seed(&seed).key().to_string()
        })
        .collect();
    let lines: Vec<Vec<u8>> = flood
        .iter()
        .enumerate()
        .map(|(i, k)| {
            introduce_line(
                10 + i as u32,
                k,
                &format!("flood{i}@x"),
                Some("tls:127.0.0.1:9"),
            )
        })
        .collect();
    let s = stranger_introduces(|_| lines).await;
    let max = awp_node::node::MAX_INTRODUCED_PER_INTRODUCER;
    let all = peers(&s.node).await;
    let flooded = all
        .iter()
        .filter(|p| flood.iter().any(|k| p["key"] == k.as_str()))
        .count();
    assert_eq!(flooded, max, "the flood stops at the quota");
    assert!(max < flood.len());
}
