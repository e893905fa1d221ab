//! Relay circuits over loopback (spec/relay-circuits.md): two nodes exchange messages
//! through a relay they reach only by its circuit address, with TLS end to end; a relay
//! that terminates TLS itself is refused by both ends; a SIGKILLed relay loses nothing
//! (the dialer redials the circuit, resume replays); the relay's policy limits circuits.

mod common;

use awp_node::control::Request;
use awp_node::net::circuit;
use awp_node::net::{Address, TlsConfig};
use awp_node::node::{DialTiming, NodeConfig, NodeHandle};
use common::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn fast_dials() -> DialTiming {
    DialTiming {
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_millis(500),
        hello_grace: Duration::from_millis(200),
        ..Default::default()
    }
}

async fn start(name: &str, f: impl FnOnce(&mut NodeConfig)) -> TestNode {
    let home = TempDir::new().unwrap();
    let mut cfg = NodeConfig {
        home: home.path().to_path_buf(),
        listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
        name: Some(name.to_string()),
        dial_timing: fast_dials(),
        // These tests are about the circuit itself; the upgrade has its own test.
        no_direct_upgrade: true,
        ..Default::default()
    };
    f(&mut cfg);
    let handle = NodeHandle::start(cfg).await.expect("node starts");
    TestNode { home, handle }
}

fn addresses(n: &TestNode) -> Vec<String> {
    n.handle.listening_event()["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The node's circuit address (there is exactly one per `via`).
fn circuit_address(n: &TestNode) -> String {
    let found: Vec<String> = addresses(n)
        .into_iter()
        .filter(|a| a.starts_with("relay:"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

async fn relay_status(home: &std::path::Path) -> Value {
    let r = ctl(home, Request::PresenceStatus).await;
    assert!(r.ok, "{:?}", r.error);
    Value::Object(r.body)
}

/// Wait until the standing connection of `n` to its relay is up.
async fn via_up(n: &TestNode) {
    eventually(10, || async {
        let s = relay_status(n.home.path()).await;
        s["via"]
            .as_array()
            .and_then(|v| v.first())
            .and_then(|v| v["up"].as_bool())
            .filter(|up| *up)
    })
    .await;
}

async fn inbound_texts(n: &TestNode) -> Vec<String> {
    n.inbound()
        .await
        .iter()
        .filter_map(|e| e["line"]["parts"][0]["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_flow_through_a_circuit_with_tls_end_to_end() {
    let relay = start("relay@test", |c| c.relay = true).await;
    let via: Address = relay.address().parse().unwrap();
    let bob = start("bob@test", |c| c.via = vec![via.clone()]).await;
    let alice = start("alice@test", |_| {}).await;
    let bob_circuit = circuit_address(&bob);
    assert_eq!(
        bob_circuit,
        Address::circuit(&via, bob.handle.key())
            .unwrap()
            .to_string()
    );
    via_up(&bob).await;

    let r = alice
        .ctl(Request::Connect {
            address: bob_circuit.clone(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "connect through the circuit: {:?}", r.error);
    assert_eq!(
        r.body["peer"].as_str(),
        Some(bob.key().as_str()),
        "{:?}",
        r.body
    );

    let first = alice
        .send(Some(&bob.key()), None, "hello through the relay")
        .await;
    let th = first["th"].as_str().unwrap().to_string();
    alice.send(None, Some(&th), "second").await;
    eventually(10, || async {
        let t = inbound_texts(&bob).await;
        (t.len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        inbound_texts(&bob).await,
        ["hello through the relay", "second"]
    );
    // And back.
    bob.send(None, Some(&th), "reply").await;
    eventually(10, || async {
        inbound_texts(&alice)
            .await
            .contains(&"reply".to_string())
            .then_some(())
    })
    .await;

    // The relay shows the circuit and the bytes it carried (ciphertext only).
    let s = relay_status(relay.home.path()).await;
    let c = &s["circuits"];
    assert_eq!(c["listeners"], 1, "{s}");
    let live = c["circuits"].as_array().unwrap();
    assert_eq!(live.len(), 1, "{s}");
    assert_eq!(live[0]["from"].as_str(), Some(alice.key().as_str()));
    assert_eq!(live[0]["to"].as_str(), Some(bob.key().as_str()));
    assert!(live[0]["up"].as_u64().unwrap() > 0 && live[0]["down"].as_u64().unwrap() > 0);
    assert!(c["bytes"].as_u64().unwrap() > 0);
}

/// A TLS server for a fake relay: the given identity's certificate, offering `alpn`.
fn acceptor(tls: &TlsConfig, alpn: &[u8]) -> tokio_rustls::TlsAcceptor {
    let mut sc = (*tls.server_config()).clone();
    sc.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(sc))
}

async fn read_obj<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> serde_json::Map<String, Value> {
    let line = tokio::time::timeout(Duration::from_secs(10), circuit::read_control_line(r))
        .await
        .expect("a line in time")
        .unwrap()
        .expect("a line");
    match serde_json::from_slice(&line).unwrap() {
        Value::Object(m) => m,
        other => panic!("{other}"),
    }
}

async fn write_json<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, v: Value) {
    let mut b = serde_json::to_vec(&v).unwrap();
    b.push(b'\n');
    w.write_all(&b).await.unwrap();
    w.flush().await.unwrap();
}

/// A relay that follows the circuit protocol but then terminates TLS itself on both
/// sides (a man in the middle with its own certificate). Alice's dial must fail inside
/// the end-to-end handshake, and Bob must drop the circuit before saying anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_terminates_tls_is_detected_by_both_ends() {
    let mal_id = awp_node::identity::Identity::generate();
    let mal_tls = TlsConfig::new(&mal_id).unwrap();
    let mal_key = mal_tls.key();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let via: Address = format!("tls:127.0.0.1:{port}#{mal_key}").parse().unwrap();

    let bob = start("bob@test", |c| c.via = vec![via.clone()]).await;
    let alice = start("alice@test", |_| {}).await;
    let outer = acceptor(&mal_tls, circuit::ALPN);

    // Bob's standing connection.
    let (tcp, _) = listener.accept().await.unwrap();
    let mut standing = outer.accept(tcp).await.unwrap();
    let listen = read_obj(&mut standing).await;
    assert_eq!(listen["t"], "circuit_listen");
    write_json(&mut standing, serde_json::json!({"t":"circuit_ready"})).await;

    // Alice dials Bob's circuit address through this relay.
    let bob_circuit = Address::circuit(&via, bob.handle.key())
        .unwrap()
        .to_string();
    let alice_home = alice.path();
    let dial = tokio::spawn(async move {
        ctl(
            &alice_home,
            Request::Connect {
                address: bob_circuit,
                timeout_ms: Some(15_000),
            },
        )
        .await
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let mut from_alice = outer.accept(tcp).await.unwrap();
    let req = read_obj(&mut from_alice).await;
    assert_eq!(req["t"], "circuit_connect");
    // Forward Alice's genuine signed request to Bob, and let Bob join.
    write_json(
        &mut standing,
        serde_json::json!({"t":"circuit_offer","circuit":"c1","req":Value::Object(req)}),
    )
    .await;
    let (tcp, _) = listener.accept().await.unwrap();
    let mut from_bob = outer.accept(tcp).await.unwrap();
    let join = read_obj(&mut from_bob).await;
    assert_eq!(join["t"], "circuit_join");
    assert_eq!(join["circuit"], "c1");
    write_json(
        &mut from_alice,
        serde_json::json!({"t":"circuit_ok","circuit":"c1"}),
    )
    .await;
    write_json(
        &mut from_bob,
        serde_json::json!({"t":"circuit_ok","circuit":"c1"}),
    )
    .await;

    // After circuit_ok both connections leave the outer TLS (spec/relay-circuits.md
    // §Splicing); terminate the end-to-end TLS towards both with the relay's own certificate.
    let from_alice = from_alice.into_inner().0;
    let from_bob = from_bob.into_inner().0;
    let to_alice = tokio::spawn({
        let inner = acceptor(&mal_tls, b"awp/0");
        async move { inner.accept(from_alice).await.map(|_| ()) }
    });
    let connector = tokio_rustls::TlsConnector::from(mal_tls.client_config(None).unwrap());
    let to_bob = connector
        .connect(
            rustls::pki_types::ServerName::try_from("awp.invalid").unwrap(),
            from_bob,
        )
        .await;
    // Bob completes TLS (any client key is acceptable at that layer) but then sees that
    // the key is not the requester's and closes without a byte of AWP.
    if let Ok(mut s) = to_bob {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("bob closes in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "bob spoke to the impersonator: {:?}", &buf[..n]);
    }
    // Alice refuses the relay's certificate inside the circuit.
    let r = dial.await.unwrap();
    assert!(!r.ok, "alice connected through a TLS-terminating relay");
    let err = r.error.map(|e| e.message).unwrap_or_default();
    // The refusal names the key the impostor presented (not the pinned one).
    assert!(err.contains("not the pinned"), "{err}");
    assert!(to_alice.await.unwrap().is_err());
    assert!(inbound_texts(&bob).await.is_empty());
}

/// The relay is SIGKILLed while Alice keeps sending through a circuit to Bob: the
/// standing connection and the circuit come back when the relay does, and every message
/// arrives exactly once (the outbox and resume work through the circuit unchanged).
async fn connected(from: &TestNode, to: &TestNode) -> bool {
    let r = from.ctl(Request::Status).await;
    r.body["connections"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["peer"].as_str() == Some(to.key().as_str()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_relay_loses_no_message() {
    const N: usize = 30;
    let relay_home = TempDir::new().unwrap();
    let port = free_port();
    let spawn_relay = || {
        use std::process::{Command, Stdio};
        Command::new(env!("CARGO_BIN_EXE_awp"))
            .args(["relay", "--home"])
            .arg(relay_home.path())
            .args(["--listen", &format!("tls:127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn awp relay")
    };
    let mut relay = spawn_relay();
    let status = wait_ready(relay_home.path()).await;
    let relay_key = status["key"].as_str().unwrap().to_string();
    let via: Address = format!("tls:127.0.0.1:{port}#{relay_key}").parse().unwrap();
    let bob = start("bob@test", |c| c.via = vec![via.clone()]).await;
    let alice = start("alice@test", |_| {}).await;
    via_up(&bob).await;
    let r = alice
        .ctl(Request::Connect {
            address: circuit_address(&bob),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);

    let first = alice.send(Some(&bob.key()), None, "m0").await;
    let th = first["th"].as_str().unwrap().to_string();
    for i in 1..N {
        alice.send(None, Some(&th), &format!("m{i}")).await;
        if i == N / 3 {
            // Some of the first third acked through the first circuit, then the kill.
            eventually(10, || async {
                (!inbound_texts(&bob).await.is_empty()).then_some(())
            })
            .await;
            relay.kill().unwrap();
            relay.wait().unwrap();
            // Both ends notice: Alice's connection to Bob is gone.
            eventually(10, || async {
                (!connected(&alice, &bob).await).then_some(())
            })
            .await;
        }
        if i == 2 * N / 3 {
            relay = spawn_relay();
            wait_ready(relay_home.path()).await;
        }
    }
    let want: HashSet<String> = (0..N).map(|i| format!("m{i}")).collect();
    eventually(40, || async {
        let got: HashSet<String> = inbound_texts(&bob).await.into_iter().collect();
        (got == want).then_some(())
    })
    .await;
    let texts = inbound_texts(&bob).await;
    assert_eq!(texts.len(), N, "each message exactly once: {texts:?}");
    assert!(connected(&alice, &bob).await, "the circuit is back");
    // Nothing is left queued at Alice: everything was acked through the new circuit.
    eventually(10, || async {
        let r = alice.ctl(Request::Status).await;
        (r.body["outbox"].as_u64() == Some(0)).then_some(())
    })
    .await;
    relay.kill().unwrap();
    relay.wait().unwrap();
}

/// The relay's policy: only allowed keys (both ends), at most N circuits per key, idle
/// circuits closed; `relay status` counts refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_policy_limits_who_and_how_many() {
    let alice_home = TempDir::new().unwrap();
    let dave_home = TempDir::new().unwrap();
    let bob_home = TempDir::new().unwrap();
    // Keys are made on first start: make them now to write the allowlist.
    let key_of = |home: &TempDir| {
        awp_node::identity::Identity::load_or_create(home.path())
            .unwrap()
            .key()
            .to_string()
    };
    let allow = vec![key_of(&alice_home), key_of(&dave_home), key_of(&bob_home)];
    let relay = start("relay@test", |c| {
        c.relay = true;
        c.circuit_policy = Some(circuit::Policy {
            allow,
            max_circuits_per_key: 1,
            circuit_idle_secs: 1,
            ..Default::default()
        });
    })
    .await;
    let via: Address = relay.address().parse().unwrap();
    let start_in = |home: TempDir, name: &'static str, via: Vec<Address>| async move {
        let handle = NodeHandle::start(NodeConfig {
            home: home.path().to_path_buf(),
            listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
            name: Some(name.into()),
            dial_timing: fast_dials(),
            via,
            no_direct_upgrade: true,
            ..Default::default()
        })
        .await
        .unwrap();
        TestNode { home, handle }
    };
    let bob = start_in(bob_home, "bob@test", vec![via.clone()]).await;
    let alice = start_in(alice_home, "alice@test", vec![]).await;
    let dave = start_in(dave_home, "dave@test", vec![]).await;
    let carol = start("carol@test", |_| {}).await;
    via_up(&bob).await;
    let dial = |n: &TestNode| {
        let home = n.path();
        let address = circuit_address(&bob);
        async move {
            ctl(
                &home,
                Request::Connect {
                    address,
                    timeout_ms: Some(10_000),
                },
            )
            .await
        }
    };
    // Carol is not on the allowlist.
    let r = dial(&carol).await;
    assert!(!r.ok);
    let err = r.error.unwrap().message;
    assert!(err.contains("forbidden"), "{err}");
    // Alice is; her circuit is Bob's one circuit.
    let r = dial(&alice).await;
    assert!(r.ok, "{:?}", r.error);
    // Dave is allowed too, but Bob is at his limit of one circuit.
    let r = dial(&dave).await;
    assert!(!r.ok);
    let err = r.error.unwrap().message;
    assert!(err.contains("busy"), "{err}");
    let s = relay_status(relay.home.path()).await;
    assert_eq!(s["circuits"]["refused"], 2, "{s}");
    assert_eq!(
        s["circuits"]["circuits"].as_array().unwrap().len(),
        1,
        "{s}"
    );
    // Nothing moves on Alice's circuit: after a second of silence the relay closes it.
    eventually(10, || async {
        let s = relay_status(relay.home.path()).await;
        s["circuits"]["circuits"]
            .as_array()
            .is_some_and(|c| c.is_empty())
            .then_some(())
    })
    .await;
    // Its slot is free again: Dave gets through now.
    let r = dial(&dave).await;
    assert!(r.ok, "{:?}", r.error);
}

/// Over an established circuit both ends learn each other's address from the relay and
/// connect directly; the session moves to the direct connection (nothing lost) and the
/// circuit closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_is_upgraded_to_a_direct_connection() {
    let relay = start("relay@test", |c| c.relay = true).await;
    let via: Address = relay.address().parse().unwrap();
    let bob = start("bob@test", |c| {
        c.via = vec![via.clone()];
        c.no_direct_upgrade = false;
    })
    .await;
    let alice = start("alice@test", |c| c.no_direct_upgrade = false).await;
    via_up(&bob).await;
    let mut events = alice.handle.subscribe();
    let r = alice
        .ctl(Request::Connect {
            address: circuit_address(&bob),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    let first = alice.send(Some(&bob.key()), None, "m0").await;
    let th = first["th"].as_str().unwrap().to_string();
    // The upgrade is announced.
    let ev = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let ev = events.recv().await.unwrap();
            if ev.get("event").and_then(Value::as_str) == Some("upgrade") {
                return ev;
            }
        }
    })
    .await
    .expect("an upgrade event");
    assert_eq!(ev["ok"], true, "{ev:?}");
    for i in 1..10 {
        alice.send(None, Some(&th), &format!("m{i}")).await;
    }
    eventually(20, || async {
        (inbound_texts(&bob).await.len() == 10).then_some(())
    })
    .await;
    let texts = inbound_texts(&bob).await;
    let want: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(texts, want);
    // Alice's connection to Bob is direct now, and the relay carries no circuit.
    eventually(10, || async {
        let r = alice.ctl(Request::Status).await;
        let conns = r.body["connections"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conns
            .iter()
            .any(|c| {
                c["peer"].as_str() == Some(bob.key().as_str())
                    && !c["remote"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("circuit via")
            })
            .then_some(())
    })
    .await;
    eventually(10, || async {
        let s = relay_status(relay.home.path()).await;
        s["circuits"]["circuits"]
            .as_array()
            .is_some_and(|c| c.is_empty())
            .then_some(())
    })
    .await; // The punched address is a NAT mapping of Bob's circuit socket, not a listener: Alice
            // keeps only Bob's circuit and his announced listener.
    let bob_key = awp_node::wire::PeerKey::parse(&bob.key()).unwrap();
    let listener: Address = bob.address().parse().unwrap();
    for rec in alice.handle.store().addresses(&bob_key).unwrap() {
        let a: Address = rec.address.parse().unwrap();
        assert!(
            matches!(a, Address::Relay { .. }) || a == listener,
            "alice keeps {} for bob (listener {listener})",
            rec.address
        );
    }
}

fn quick_presence() -> awp_node::node::PresenceTiming {
    awp_node::node::PresenceTiming {
        debounce: Duration::from_millis(50),
        heartbeat: Duration::from_secs(600),
        min_interval: Duration::from_millis(1100),
    }
}

/// Whether `n` holds a presence document of `origin` listing a circuit address.
async fn holds_circuits_of(n: &TestNode, origin: &str) -> bool {
    let r = n
        .ctl(Request::Presence {
            peer: Some(origin.to_string()),
        })
        .await;
    r.ok && Value::Object(r.body).to_string().contains("relay:tls:")
}

/// The remote of `from`'s connection to `to`, if any.
async fn remote_of(from: &TestNode, to: &TestNode) -> Option<String> {
    let r = from.ctl(Request::Status).await;
    r.body["connections"].as_array()?.iter().find_map(|c| {
        (c["peer"].as_str() == Some(to.key().as_str()))
            .then(|| c["remote"].as_str().unwrap_or("").to_string())
    })
}

/// Issue 14: a node that knows a peer only by the presence document it relayed (no
/// address stored, never connected) reaches it through the circuit the document lists,
/// both by sending (the dialer) and by `connect KEY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_known_only_by_its_presence_document_is_reached_through_its_circuit() {
    let relay = start("relay@test", |c| {
        c.relay = true;
        c.presence_timing = quick_presence();
    })
    .await;
    let via: Address = relay.address().parse().unwrap();
    let bob = start("bob@test", |c| {
        c.via = vec![via.clone()];
        c.presence = true;
        c.presence_timing = quick_presence();
    })
    .await;
    let alice = start("alice@test", |c| c.presence_timing = quick_presence()).await;
    let carol = start("carol@test", |c| c.presence_timing = quick_presence()).await;
    via_up(&bob).await;
    // Everyone talks to the relay only; Bob's document reaches Alice and Carol through it.
    for n in [&bob, &alice, &carol] {
        n.connect(&relay).await;
    }
    for n in [&alice, &carol] {
        eventually(10, || async {
            holds_circuits_of(n, &bob.key()).await.then_some(())
        })
        .await;
    }

    // Alice sends to Bob's key: the dialer finds the circuit in the document.
    alice
        .send(Some(&bob.key()), None, "found by presence")
        .await;
    eventually(15, || async {
        inbound_texts(&bob)
            .await
            .contains(&"found by presence".to_string())
            .then_some(())
    })
    .await;
    let remote = remote_of(&alice, &bob).await.unwrap_or_default();
    assert!(remote.starts_with("circuit via "), "{remote}");

    // Carol connects by key alone.
    let r = carol
        .ctl(Request::Connect {
            address: bob.key(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(
        r.ok,
        "connect KEY through the presence circuit: {:?}",
        r.error
    );
    assert!(
        r.body["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("relay:")),
        "{:?}",
        r.body
    );
    let remote = remote_of(&carol, &bob).await.unwrap_or_default();
    assert!(remote.starts_with("circuit via "), "{remote}");
}

/// Issue 14: relays are nodes. A plain node refuses circuit connections (its listener
/// offers only `awp/0`) unless its `[relay]` policy sets `serve_circuits`; then it serves
/// them like `awp relay`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_node_serves_circuits_only_when_its_policy_allows() {
    let plain = start("plain@test", |_| {}).await;
    let probe = TlsConfig::new(&awp_node::identity::Identity::generate()).unwrap();
    let err = circuit::listen(&plain.address().parse().unwrap(), &probe)
        .await
        .err()
        .expect("a plain node is no circuit relay");
    assert!(
        err.to_string().contains("does not serve circuits")
            && err.to_string().contains("serve_circuits = true"),
        "the refusal says what is wrong and how to change it: {err}"
    );

    let serving = start("serving@test", |c| {
        c.circuit_policy = Some(circuit::Policy {
            serve_circuits: true,
            ..Default::default()
        })
    })
    .await;
    let via: Address = serving.address().parse().unwrap();
    let bob = start("bob@test", |c| c.via = vec![via.clone()]).await;
    let alice = start("alice@test", |_| {}).await;
    via_up(&bob).await;
    let r = alice
        .ctl(Request::Connect {
            address: circuit_address(&bob),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(
        r.ok,
        "connect through a plain node's circuit: {:?}",
        r.error
    );
    alice
        .send(Some(&bob.key()), None, "through a plain node")
        .await;
    eventually(10, || async {
        inbound_texts(&bob)
            .await
            .contains(&"through a plain node".to_string())
            .then_some(())
    })
    .await;
    let s = relay_status(serving.home.path()).await;
    assert!(s["circuits"]["opened"].as_u64() >= Some(1), "{s}");
    // It is still an ordinary node: it keeps an outbox and takes sends.
    let r = serving.ctl(Request::Status).await;
    assert!(r.ok);
}

/// The circuit addresses in the presence document `n` holds for `origin` (its own included).
async fn circuits_in_presence(n: &TestNode, origin: &str) -> Option<Vec<String>> {
    let r = n
        .ctl(Request::Presence {
            peer: Some(origin.to_string()),
        })
        .await;
    if !r.ok {
        return None;
    }
    let text = Value::Object(r.body).to_string();
    // Every `relay:` address in the answer (the document's `circuits`).
    let found: Vec<String> = text
        .split('"')
        .filter(|s| s.starts_with("relay:"))
        .map(str::to_string)
        .collect();
    Some(found)
}

/// Issue 14: a node advertises in presence only the circuits of relays whose standing
/// connection is up. A `via` that serves no circuits (a plain node) is left out, while a
/// serving relay configured beside it is listed once its standing connection is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_lists_only_the_circuits_of_relays_that_serve_them() {
    let plain = start("plain@test", |_| {}).await;
    let relay = start("relay@test", |c| c.relay = true).await;
    let plain_via: Address = plain.address().parse().unwrap();
    let relay_via: Address = relay.address().parse().unwrap();
    let bob = start("bob@test", |c| {
        c.via = vec![plain_via.clone(), relay_via.clone()];
        c.presence = true;
        c.presence_timing = quick_presence();
    })
    .await;
    // Both are configured addresses (listed at start, before any relay answered).
    let configured = addresses(&bob);
    assert_eq!(
        configured
            .iter()
            .filter(|a| a.starts_with("relay:"))
            .count(),
        2,
        "{configured:?}"
    );
    let serving = Address::circuit(&relay_via, bob.key().parse().unwrap())
        .unwrap()
        .to_string();
    let refused = Address::circuit(&plain_via, bob.key().parse().unwrap())
        .unwrap()
        .to_string();
    let listed = eventually(10, || async {
        circuits_in_presence(&bob, &bob.key())
            .await
            .filter(|c| c.contains(&serving))
    })
    .await;
    assert!(!listed.contains(&refused), "{listed:?}");
    assert_eq!(listed, vec![serving.clone()]);
    // The plain node's entry says it is down, and why (`awp relay status` prints it).
    let down = eventually(10, || async {
        let s = relay_status(bob.home.path()).await;
        s["via"]
            .as_array()?
            .iter()
            .find(|v| v["relay"].as_str() == Some(plain_via.to_string().as_str()))
            .filter(|v| v.get("error").is_some())
            .cloned()
    })
    .await;
    assert_eq!(down["up"], json!(false), "{down}");
    assert!(
        down["error"]
            .as_str()
            .is_some_and(|e| e.contains("does not serve circuits")),
        "{down}"
    );

    // The serving relay stops: its circuit leaves the next document.
    relay.handle.shutdown();
    drop(relay);
    eventually(10, || async {
        circuits_in_presence(&bob, &bob.key())
            .await
            .filter(|c| c.is_empty())
    })
    .await;
}

/// Copy `from` to `to` until EOF, flipping the last byte of every chunk read once
/// `tamper` is set.
async fn copy_maybe_tampering(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    tamper: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..100_000 {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if tamper.load(std::sync::atomic::Ordering::SeqCst) {
            buf[n - 1] ^= 1;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The relay sees only the end-to-end TLS after `circuit_ok` and cannot forge content: a
/// relay that follows the protocol and splices honestly delivers Alice's first text;
/// once it flips bits in what it copies from Alice, the circuit breaks and her next text
/// reaches Bob neither altered nor at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_alters_spliced_bytes_breaks_the_circuit_not_the_content() {
    let mal_tls = TlsConfig::new(&awp_node::identity::Identity::generate()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let via: Address = format!("tls:127.0.0.1:{port}#{}", mal_tls.key())
        .parse()
        .unwrap();
    let bob = start("bob@test", |c| c.via = vec![via.clone()]).await;
    let alice = start("alice@test", |_| {}).await;
    let outer = acceptor(&mal_tls, circuit::ALPN);
    let (tcp, _) = listener.accept().await.unwrap();
    let mut standing = outer.accept(tcp).await.unwrap();
    assert_eq!(read_obj(&mut standing).await["t"], "circuit_listen");
    write_json(&mut standing, serde_json::json!({"t":"circuit_ready"})).await;

    let bob_circuit = Address::circuit(&via, bob.handle.key())
        .unwrap()
        .to_string();
    let alice_home = alice.path();
    let dial = tokio::spawn(async move {
        ctl(
            &alice_home,
            Request::Connect {
                address: bob_circuit,
                timeout_ms: Some(10_000),
            },
        )
        .await
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let mut from_alice = outer.accept(tcp).await.unwrap();
    let req = read_obj(&mut from_alice).await;
    write_json(
        &mut standing,
        serde_json::json!({"t":"circuit_offer","circuit":"c1","req":Value::Object(req)}),
    )
    .await;
    let (tcp, _) = listener.accept().await.unwrap();
    let mut from_bob = outer.accept(tcp).await.unwrap();
    assert_eq!(read_obj(&mut from_bob).await["t"], "circuit_join");
    for s in [&mut from_alice, &mut from_bob] {
        write_json(s, serde_json::json!({"t":"circuit_ok","circuit":"c1"})).await;
    }
    let tamper = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ar, aw) = from_alice.into_inner().0.into_split();
    let (br, bw) = from_bob.into_inner().0.into_split();
    tokio::spawn(copy_maybe_tampering(ar, bw, tamper.clone()));
    tokio::spawn(copy_maybe_tampering(
        br,
        aw,
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    ));

    let r = dial.await.unwrap();
    assert!(r.ok, "an honest splice works: {:?}", r.error);
    let first = alice.send(Some(&bob.key()), None, "spliced as sent").await;
    eventually(10, || async {
        (!inbound_texts(&bob).await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(inbound_texts(&bob).await, ["spliced as sent"]);

    tamper.store(true, std::sync::atomic::Ordering::SeqCst);
    let th = first["th"].as_str().unwrap().to_string();
    alice.send(None, Some(&th), "exactly these words").await;
    // Bob's end-to-end TLS refuses the altered record and the circuit closes.
    eventually(10, || async {
        (!connected(&alice, &bob).await).then_some(())
    })
    .await;
    assert_eq!(inbound_texts(&bob).await, ["spliced as sent"]);
    drop(standing);
}
