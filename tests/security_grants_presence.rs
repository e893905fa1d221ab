//! Regression tests for held grants, presence and blob records (security review items
//! 10, 11, 12 and 16.5) that need a running node. The rules themselves are tested beside
//! their code: `node::grants::tests`, `presence::tests`, `store::blobs::tests`.

mod common;

use awp_node::canonical::sign_object;
use awp_node::control::Request;
use awp_node::identity::Identity;
use awp_node::wire::{self, Line};
use common::{eventually, Raw, TestNode};
use serde_json::{Map, Value};
use std::time::Duration;

/// A raw peer that says it speaks presence, handshaken with `node`.
async fn presence_peer(node: &TestNode, seed: u8) -> Raw {
    let mut raw = Raw::dial(&node.address(), seed).await;
    let hello = Line::Hello(wire::Hello {
        id: "01K00000000000000000000000".into(),
        ts: "2026-01-01T00:00:00.000Z".into(),
        v: 0,
        key: raw.identity.key().to_string(),
        name: Some(format!("p{seed}@test")),
        nonce: wire::b64::encode_url(&[seed; 32]),
        caps: vec!["presence".into()],
        about: None,
        addr: None,
        shares: None,
    })
    .encode();
    raw.handshake_with(hello).await;
    // The node counts the connection as up at our first line after auth.
    raw.write(br#"{"t":"resume","id":"01K00000000000000000000002","ts":"2026-01-01T00:00:00.000Z","seen":{}}"#)
        .await;
    raw
}

/// The text of field `doc` of a line, exactly as written.
/// The document `unsigned` (a JSON object, kept byte for byte) with `origin`'s signature
/// appended as `sig`, and a `presence` line carrying it (hops 0, id `id`, sent at `now_ms`).
fn presence_line(origin: &Identity, unsigned: &str, id: &str, now_ms: u64) -> (String, String) {
    let map: Map<String, Value> = serde_json::from_str(unsigned).unwrap();
    let sig = sign_object(origin, &map);
    let doc = format!(r#"{},"sig":"{sig}"}}"#, &unsigned[..unsigned.len() - 1]);
    let line = format!(
        r#"{{"t":"presence","id":"{id}","ts":"{}","doc":{doc},"hops":0}}"#,
        wire::time::format_ms(now_ms)
    );
    (doc, line)
}

fn raw_doc(line: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct DocOnly<'a> {
        #[serde(borrow)]
        doc: &'a serde_json::value::RawValue,
    }
    let text = std::str::from_utf8(line).unwrap();
    serde_json::from_str::<DocOnly>(text)
        .unwrap()
        .doc
        .get()
        .to_string()
}

/// Item 16.5: a presence document is forwarded as the bytes received. Re-serializing it
/// changed how numbers are written (`1e21` → `1e+21`, `0.000001` → `1e-6`, `100.50` →
/// `100.5`, `9007199254740993.0` → `9007199254740992.0`) and how it is spaced.
#[tokio::test]
async fn presence_documents_are_forwarded_byte_for_byte() {
    let node = TestNode::start("relay").await;
    let mut listener = presence_peer(&node, 31).await;
    // Wait until the node counts the listener as a presence peer.
    eventually(10, || async {
        let r = node.ctl(Request::PresenceStatus).await;
        (r.body["presence_peers"] == 1).then_some(())
    })
    .await;
    let mut sender = presence_peer(&node, 32).await;
    let origin = Identity::from_seed(&[33; 32]);
    let now = wire::time::now_ms();
    let unsigned = format!(
        r#"{{"origin":"{}", "seq":{now},"ts":"{}","name":"o@test","x-numbers":[1e21,0.000001,100.50,9007199254740993.0]}}"#,
        origin.key(),
        wire::time::format_ms(now)
    );
    let (doc, line) = presence_line(&origin, &unsigned, "01K00000000000000000000005", now);
    sender.write(line.as_bytes()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let forwarded = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no presence line reached the listener"
        );
        let l = listener.read().await.expect("a line");
        if wire::parse_line(&l).is_ok_and(|p| p.kind() == "presence") {
            break l;
        }
    };
    let got = raw_doc(&forwarded);
    assert_eq!(got, doc, "the document is forwarded unchanged");
    let parsed = wire::parse_line(&forwarded).unwrap();
    let Line::Presence(p) = parsed else {
        unreachable!()
    };
    assert_eq!(p.hops, 1);
}

/// Forwarding never queues more than a peer's ephemeral queue holds: once writes to a
/// presence peer that never reads back up, the node stops taking its queued lines, the
/// queue fills and further documents are counted as `forward_dropped`. (The connection
/// used to move every queued line into its unbounded control queue whether or not the
/// peer read, so a peer that never reads held every document forwarded to it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presence_peer_that_never_reads_misses_documents_instead_of_holding_them() {
    let node = TestNode::start("relay").await;
    // Presence peers that send documents and never read a byte.
    let mut peers = Vec::new();
    for seed in 0..8u8 {
        peers.push(presence_peer(&node, 60 + seed).await);
    }
    eventually(10, || async {
        let r = node.ctl(Request::PresenceStatus).await;
        (r.body["presence_peers"] == 8).then_some(())
    })
    .await;
    // Each forwards to the seven others: far more than a socket, a write batch and the
    // ephemeral queue of each hold, within each connection's presence burst.
    let pad = "p".repeat(16 * 1024);
    let dropped = || async {
        let status = node.ctl(Request::PresenceStatus).await.body;
        (status["forward_dropped"].as_u64() > Some(0), status)
    };
    for (i, peer) in peers.iter_mut().enumerate() {
        if dropped().await.0 {
            break;
        }
        for j in 0..110u8 {
            let mut seed = [0x5a; 32];
            (seed[0], seed[1]) = (i as u8, j);
            let origin = Identity::from_seed(&seed);
            let now = wire::time::now_ms();
            let unsigned = format!(
                r#"{{"origin":"{}","seq":{now},"ts":"{}","name":"o@test","x-pad":"{pad}"}}"#,
                origin.key(),
                wire::time::format_ms(now)
            );
            let id = format!("01K{:023}", i * 1000 + j as usize);
            let (_, line) = presence_line(&origin, &unsigned, &id, now);
            peer.write(line.as_bytes()).await;
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (dropped, status) = dropped().await;
        if dropped {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing dropped: {}",
            serde_json::to_string(&status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
