//! Presence over real TLS on 127.0.0.1: 12 nodes in a chain and in a ring. One end
//! publishes; its document reaches every node within the hop bound and never beyond, and
//! no node forwards an (origin, seq) more than once. Also relay mode: no outbox, a
//! connection limit.

mod common;

use awp_node::control::Request;
use awp_node::node::{DialTiming, NodeConfig, NodeHandle, PresenceTiming};
use common::{eventually, TestNode};
use serde_json::{Map, Value};
use std::time::Duration;
use tempfile::TempDir;

const N: usize = 12;

async fn start(name: &str, presence: bool, relay: bool, max_conns: Option<usize>) -> TestNode {
    let home = TempDir::new().unwrap();
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        presence,
        presence_timing: PresenceTiming {
            debounce: Duration::from_millis(50),
            heartbeat: Duration::from_secs(600),
            min_interval: Duration::from_millis(1100),
        },
        relay,
        max_connections: max_conns,
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}

/// Node 0 publishes; the others only relay.
async fn nodes() -> Vec<TestNode> {
    let mut v = Vec::new();
    for i in 0..N {
        v.push(start(&format!("n{i}"), i == 0, false, None).await);
    }
    v
}

async fn connect(from: &TestNode, to: &TestNode) {
    let r = from
        .ctl(Request::Connect {
            address: to.address(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "connect: {:?}", r.error);
}

async fn status(n: &TestNode) -> Map<String, Value> {
    let r = n.ctl(Request::PresenceStatus).await;
    assert!(r.ok, "{:?}", r.error);
    r.body
}

/// The document of `origin` held by `n`: (seq, hops, via), if any.
async fn held(n: &TestNode, origin: &str) -> Option<(u64, u64, String)> {
    let r = n.ctl(Request::Presence { peer: None }).await;
    assert!(r.ok, "{:?}", r.error);
    r.body["agents"].as_array()?.iter().find_map(|a| {
        (a["origin"] == origin && a["own"] == false).then(|| {
            (
                a["seq"].as_u64().unwrap(),
                a["hops"].as_u64().unwrap(),
                a["via"].as_str().unwrap().to_string(),
            )
        })
    })
}

fn u(m: &Map<String, Value>, k: &str) -> u64 {
    m[k].as_u64().unwrap_or_else(|| panic!("{k} in {m:?}"))
}

/// How long the origin's seq must stay the one every node holds before [`settle`] trusts
/// it: past the publisher's `min_interval` (1.1 s) plus its debounce, so that a publish the
/// last connection's change scheduled behind the interval has had its turn. (The checks
/// after settle still accept a later seq: a publish can always come later on a busy host.)
const QUIET: Duration = Duration::from_millis(1500);

/// Wait until the origin's latest seq is held by every node in `reach` and has stayed so
/// for [`QUIET`], and return it. On timeout, fail with what each node holds and counted.
async fn settle(nodes: &[TestNode], reach: &[usize]) -> u64 {
    let origin = nodes[0].key();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut since: Option<(u64, tokio::time::Instant)> = None;
    loop {
        let seq = status(&nodes[0]).await["own_seq"].as_u64();
        let mut missing = Vec::new();
        for &i in reach {
            let h = held(&nodes[i], &origin).await;
            if seq.is_none() || h.as_ref().map(|h| h.0) != seq {
                missing.push((i, h));
            }
        }
        let still = status(&nodes[0]).await["own_seq"].as_u64() == seq;
        match (seq, missing.is_empty() && still) {
            (Some(seq), true) => match since {
                Some((s, t)) if s == seq => {
                    if t.elapsed() >= QUIET {
                        return seq;
                    }
                }
                _ => since = Some((seq, tokio::time::Instant::now())),
            },
            _ => since = None,
        }
        if tokio::time::Instant::now() >= deadline {
            let mut report = format!("own_seq {seq:?}; not there: {missing:?}\n");
            for (i, n) in nodes.iter().enumerate() {
                report += &format!("node {i}: {:?}\n", status(n).await);
            }
            panic!("presence did not settle in 30 s\n{report}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each accepted (origin, seq) is forwarded at most once, to at most degree − 1 peers.
async fn forwarded_at_most_once(n: &TestNode, degree: u64) {
    let s = status(n).await;
    assert!(u(&s, "forwarded") <= u(&s, "accepted"), "{s:?}");
    assert!(
        u(&s, "forward_lines") <= u(&s, "forwarded") * (degree - 1),
        "{s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chain_reaches_the_hop_bound_and_stops() {
    let nodes = nodes().await;
    for i in 0..N - 1 {
        connect(&nodes[i], &nodes[i + 1]).await;
    }
    // Node k gets the document with hops k − 1 and forwards while hops + 1 < 8: nodes 1..=8
    // hold it, node 8 does not pass it on.
    let reach: Vec<usize> = (1..=8).collect();
    let seq = settle(&nodes, &reach).await;
    let origin = nodes[0].key();
    for &k in &reach {
        let (s, hops, via) = held(&nodes[k], &origin).await.unwrap();
        // A later publish may have gone out since settle (seqs only grow); the path is
        // the same for every seq.
        assert!(s >= seq, "node {k}: seq {s} < {seq}");
        assert_eq!(hops, k as u64 - 1, "node {k}");
        assert_eq!(via, nodes[k - 1].key(), "node {k}");
        let degree = if k == N - 1 { 1 } else { 2 };
        forwarded_at_most_once(&nodes[k], degree).await;
    }
    let last = status(&nodes[8]).await;
    assert_eq!(u(&last, "forwarded"), 0, "{last:?}");
    assert_eq!(u(&last, "forward_lines"), 0, "{last:?}");
    for (k, n) in nodes.iter().enumerate().skip(9) {
        assert_eq!(held(n, &origin).await, None, "node {k} is beyond the bound");
        assert_eq!(u(&status(n).await, "accepted"), 0);
    }
    // The document shows in full, with its signature checked, at the far end.
    let r = nodes[8]
        .ctl(Request::Presence {
            peer: Some(origin.clone()),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.body["verified"], true);
    assert_eq!(r.body["doc"]["name"], "n0");
    assert_eq!(r.body["doc"]["origin"], origin.as_str());
    for n in nodes {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ring_reaches_everyone_once() {
    let nodes = nodes().await;
    for i in 0..N {
        connect(&nodes[i], &nodes[(i + 1) % N]).await;
    }
    let reach: Vec<usize> = (1..N).collect();
    let seq = settle(&nodes, &reach).await;
    let origin = nodes[0].key();
    for (k, n) in nodes.iter().enumerate().skip(1) {
        let (s, hops, _) = held(n, &origin).await.unwrap();
        let distance = k.min(N - k) as u64;
        // A later publish may have gone out since settle (seqs only grow).
        assert!(s >= seq, "node {k}: seq {s} < {seq}");
        assert!(hops + 1 >= distance && hops < 8, "node {k}: hops {hops}");
        forwarded_at_most_once(n, 2).await;
    }
    // The origin never takes its own document back.
    let o = status(&nodes[0]).await;
    assert_eq!(u(&o, "accepted"), 0, "{o:?}");
    for n in nodes {
        n.stop().await;
    }
}

#[tokio::test]
async fn relay_refuses_to_queue_and_limits_connections() {
    let relay = start("relay", false, true, Some(1)).await;
    let a = start("a", true, false, None).await;
    let b = start("b", false, false, None).await;
    connect(&a, &relay).await;
    let r = relay
        .ctl(Request::Send {
            peer: Some(a.key()),
            th: None,
            subject: None,
            re: None,
            parts: vec![serde_json::json!({"k":"text","text":"hi"})],
            files: vec![],
            wait_ack_ms: None,
        })
        .await;
    assert!(!r.ok);
    assert!(r.error.unwrap().message.contains("relay"));
    // The second inbound connection is over the limit: closed at once.
    let refused = b
        .ctl(Request::Connect {
            address: relay.address(),
            timeout_ms: Some(5_000),
        })
        .await;
    assert!(!refused.ok);
    let s = status(&relay).await;
    assert_eq!(u(&s, "refused_connections"), 1, "{s:?}");
    assert_eq!(s["relay"], true);
    // a's document is held by the relay.
    eventually(10, || async { held(&relay, &a.key()).await }).await;
    for n in [relay, a, b] {
        n.stop().await;
    }
}

/// A hostile peer's presence lines are refused and counted; the node stays up, and a
/// valid document from the same peer is still taken.
#[tokio::test]
async fn hostile_presence_lines_are_counted_not_fatal() {
    use awp_node::canonical::sign_object;
    use awp_node::wire::{self, Line, PresenceMsg};
    let node = start("n", false, false, None).await;
    let mut raw = common::Raw::dial(&node.address(), 77).await;
    raw.handshake().await;
    let now = wire::time::now_ms();
    let me = raw.identity.key().to_string();
    let doc = |seq: u64, ts: u64| {
        let mut d = Map::new();
        d.insert("origin".into(), me.clone().into());
        d.insert("seq".into(), seq.into());
        d.insert("ts".into(), wire::time::format_ms(ts).into());
        d
    };
    let line = |d: Map<String, Value>, hops: u64| {
        Line::Presence(PresenceMsg {
            id: "01K00000000000000000000009".into(),
            ts: wire::time::format_ms(now),
            doc: d,
            hops,
            doc_raw: None,
        })
        .encode()
    };
    let mut forged = doc(1, now);
    forged.insert("sig".into(), wire::b64::encode_url(&[0u8; 64]).into());
    raw.write(&line(forged, 0)).await;
    let mut stale = doc(2, now - 11 * 60 * 1000);
    let sig = sign_object(&raw.identity, &stale);
    stale.insert("sig".into(), sig.into());
    raw.write(&line(stale, 0)).await;
    let mut good = doc(3, now);
    let sig = sign_object(&raw.identity, &good);
    good.insert("sig".into(), sig.into());
    raw.write(&line(good, 7)).await;
    let s = eventually(10, || async {
        let s = status(&node).await;
        (u(&s, "accepted") == 1 && u(&s, "dropped") == 2).then_some(s)
    })
    .await;
    assert_eq!(s["refused"]["bad_signature"], 1, "{s:?}");
    assert_eq!(s["refused"]["stale"], 1, "{s:?}");
    // hops 7 is the bound: held, not forwarded.
    assert_eq!(u(&s, "forwarded"), 0, "{s:?}");
    assert_eq!(
        held(&node, &raw.identity.key().to_string()).await,
        Some((3, 7, raw.identity.key().to_string()))
    );
    node.stop().await;
}

/// A relay in `home` listening on `listen` (a restart keeps its key and port).
async fn start_relay_at(home: TempDir, listen: &str) -> TestNode {
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec![listen.parse().unwrap()],
        name: Some("relay".into()),
        relay: true,
        ..Default::default()
    })
    .await
    .expect("relay starts");
    TestNode { home, handle }
}

/// A node that publishes presence, its redials paced in tenths of seconds (a relay in
/// these tests is down for a while).
async fn start_publisher(home: TempDir) -> TestNode {
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("a".into()),
        presence: true,
        presence_timing: PresenceTiming {
            debounce: Duration::from_millis(50),
            heartbeat: Duration::from_secs(600),
            min_interval: Duration::from_millis(300),
        },
        dial_timing: DialTiming {
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_millis(400),
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}

/// Whether `n` lists `peer` as connected, and its `parked_by`.
async fn peer_state(n: &TestNode, peer: &str) -> (bool, Value) {
    let r = n.ctl(Request::Peers).await;
    assert!(r.ok, "{:?}", r.error);
    let p = r.body["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["key"] == peer)
        .cloned()
        .unwrap_or_else(|| panic!("{peer} not in {:?}", r.body));
    (p["connected"] == true, p["parked_by"].clone())
}

/// A relay that restarts says `bye shutdown`, which parks it; a node that joined it with
/// `connect` and publishes presence takes its next publication as traffic for it and
/// redials, so its document is held by the restarted relay. A relay the user disconnected
/// (`awp disconnect`) stays parked through later publications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_node_rejoins_a_restarted_relay_but_not_a_disconnected_one() {
    let relay = start_relay_at(TempDir::new().unwrap(), "tls:127.0.0.1:0").await;
    // Its address without the key pin: the listen address of the restart.
    let address = relay.address();
    let listen = address.split('#').next().unwrap().to_string();
    let a = start_publisher(TempDir::new().unwrap()).await;
    connect(&a, &relay).await;
    eventually(10, || async { held(&relay, &a.key()).await }).await;
    let relay_key = relay.key();

    let home = relay.stop().await;
    eventually(10, || async {
        let (up, by) = peer_state(&a, &relay_key).await;
        (!up && by == "peer").then_some(())
    })
    .await;
    let relay = start_relay_at(home, &listen).await;
    // The peer_down is a change: a publishes within its debounce and min_interval, which
    // unparks the relay and dials it.
    eventually(20, || async { held(&relay, &a.key()).await }).await;
    let (up, by) = peer_state(&a, &relay_key).await;
    assert!(up && by.is_null(), "a rejoined: up {up}, parked_by {by}");

    // `awp disconnect`: parked by us; publications do not redial it. Its peer_down is a
    // change: a publishes again (the count goes up once the parked relays were looked at).
    let published = u(&status(&a).await, "published");
    let r = a
        .ctl(Request::Disconnect {
            peer: relay_key.clone(),
            reason: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    eventually(20, || async {
        (u(&status(&a).await, "published") > published).then_some(())
    })
    .await;
    let (up, by) = peer_state(&a, &relay_key).await;
    assert!(
        !up && by == "us",
        "still parked by us: up {up}, parked_by {by}"
    );
    for n in [relay, a] {
        n.stop().await;
    }
}

/// A publishing node that restarts (or loses its connection without a bye) dials the relay
/// it joined again: its presence document is work for it. A node that does not publish
/// has no such work and leaves the relay be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_node_rejoins_its_relay_after_its_own_restart() {
    let relay = start_relay_at(TempDir::new().unwrap(), "tls:127.0.0.1:0").await;
    let relay_key = relay.key();
    let a = start_publisher(TempDir::new().unwrap()).await;
    let quiet = start("quiet", false, false, None).await;
    connect(&a, &relay).await;
    connect(&quiet, &relay).await;
    eventually(10, || async { held(&relay, &a.key()).await }).await;

    let a = start_publisher(a.stop().await).await;
    let quiet = start_in_home(quiet.stop().await).await;
    // a is back on the relay (its new document may come within a second of the last one,
    // which the relay's rate limit refuses: the connection is what this checks).
    eventually(20, || async {
        let (up, by) = peer_state(&a, &relay_key).await;
        (up && by.is_null()).then_some(())
    })
    .await;
    // The quiet node published nothing since its restart and has no work for the relay.
    assert_eq!(u(&status(&quiet).await, "published"), 0);
    assert!(!peer_state(&quiet, &relay_key).await.0, "quiet stays off");
    for n in [relay, a, quiet] {
        n.stop().await;
    }
}

/// A node that does not publish, restarted in `home`.
async fn start_in_home(home: TempDir) -> TestNode {
    let handle = NodeHandle::start(NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some("quiet".into()),
        ..Default::default()
    })
    .await
    .expect("node starts");
    TestNode { home, handle }
}
