//! Grants, admission policy and introductions between nodes over TLS on 127.0.0.1.

mod common;

use awp_node::control::Request;
use awp_node::identity::Identity;
use awp_node::wire::{self, Line};
use common::*;
use serde_json::{json, Value};
use tempfile::TempDir;

async fn grants(n: &TestNode) -> Vec<Value> {
    let r = n.ctl(Request::Grants).await;
    assert!(r.ok, "{:?}", r.error);
    r.body["grants"].as_array().cloned().unwrap_or_default()
}

async fn grant(n: &TestNode, peer: &str, caps: &[&str], aud: Option<&str>) -> Value {
    let r = n
        .ctl(Request::Grant {
            peer: peer.into(),
            caps: caps.iter().map(|c| c.to_string()).collect(),
            ttl_s: 3600,
            aud: aud.map(str::to_string),
        })
        .await;
    assert!(r.ok, "grant failed: {:?}", r.error);
    Value::Object(r.body)
}

async fn start_with_config(name: &str, config: &str) -> TestNode {
    let home = TempDir::new().unwrap();
    std::fs::write(home.path().join("config.toml"), config).unwrap();
    TestNode::start_in(home, name).await
}

#[tokio::test]
async fn a_grant_reaches_its_subject_and_can_be_revoked() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    a.connect(&b).await;
    let g = grant(&a, "bob@test", &["exec", "fs:read"], None).await;
    let hash = g["hash"].as_str().unwrap().to_string();
    assert_eq!(hash.len(), 32);
    assert_eq!(g["grant"]["iss"], a.key());
    assert_eq!(g["grant"]["sub"], b.key());
    let held = eventually(10, || async {
        grants(&b)
            .await
            .into_iter()
            .find(|g| g["hash"] == hash.as_str())
    })
    .await;
    assert_eq!(held["role"], "held");
    assert_eq!(held["validity"], "valid");
    let issued = grants(&a).await;
    assert_eq!(issued[0]["role"], "issued");
    assert_eq!(issued[0]["honored_caps"], json!(["exec", "fs:read"]));
    let r = a.ctl(Request::Revoke { hash: hash.clone() }).await;
    assert!(r.ok);
    let issued = grants(&a).await;
    assert_eq!(issued[0]["validity"], "revoked");
    let r = a
        .ctl(Request::Revoke {
            hash: "00".repeat(16),
        })
        .await;
    assert_eq!(r.error.unwrap().code, "no_such_grant");
}

#[tokio::test]
async fn a_grant_minted_while_apart_goes_out_after_the_next_resume() {
    let a = TestNode::start("alice@test").await;
    let b = TestNode::start("bob@test").await;
    let g = grant(&a, &b.key(), &["exec"], None).await;
    assert_eq!(g["sent"], false);
    a.connect(&b).await;
    let hash = g["hash"].as_str().unwrap().to_string();
    eventually(10, || async {
        grants(&b)
            .await
            .into_iter()
            .find(|g| g["hash"] == hash.as_str())
    })
    .await;
}

#[tokio::test]
async fn forged_and_expired_grants_are_refused_and_never_stored() {
    let b = TestNode::start("bob@test").await;
    let mut raw = Raw::dial(&b.address(), 31).await;
    raw.handshake().await;
    let issuer = Identity::from_seed(&[32; 32]);
    let me = raw.identity.key();
    // Expired (well-formed, good signature).
    let expired = awp_node::grant::mint(&issuer, &me, &["exec".into()], 1, None, 1_000_000_000_000);
    // Forged: caps changed after signing.
    let mut forged = awp_node::grant::mint(
        &issuer,
        &me,
        &["exec".into()],
        3600,
        None,
        wire::time::now_ms(),
    );
    forged.caps = vec!["admin".into()];
    for g in [expired, forged] {
        let line = Line::Grant(wire::GrantMsg {
            id: "01K00000000000000000000050".into(),
            ts: "2026-01-01T00:00:00Z".into(),
            grant: g,
        });
        raw.write(&line.encode()).await;
    }
    raw.write(br#"{"t":"ping","id":"p9","ts":"2026-01-01T00:00:00Z"}"#)
        .await;
    loop {
        match raw.read_line().await.expect("still open") {
            Line::Pong(p) => {
                assert_eq!(p.re, "p9");
                break;
            }
            Line::Err(e) => panic!("unexpected err {e:?}"),
            _ => {}
        }
    }
    assert!(grants(&b).await.is_empty(), "nothing stored");
}

#[tokio::test]
async fn allowlist_admits_allowed_dialed_and_granted_keys_only() {
    let a = TestNode::start("alice@test").await;
    let c = start_with_config(
        "carol@test",
        &format!("accept = \"allowlist\"\nallow = [\"{}\"]\n", a.key()),
    )
    .await;
    // A stranger is refused with err auth after the handshake.
    let mut raw = Raw::dial(&c.address(), 41).await;
    let hello = raw.hello(0);
    raw.write(&hello).await;
    let their = raw.read().await.unwrap();
    let sig = raw
        .identity
        .sign(&awp_node::identity::auth_transcript(&hello, &their));
    let auth = Line::Auth(wire::Auth {
        id: "01K00000000000000000000001".into(),
        ts: "2026-01-01T00:00:00Z".into(),
        sig: wire::b64::encode_url(&sig),
        grants: vec![],
    });
    raw.write(&auth.encode()).await;
    let mut kinds = vec![];
    let mut last = None;
    while let Some(l) = raw.read_line().await {
        kinds.push(l.kind().to_string());
        last = Some(l);
    }
    let Some(Line::Err(e)) = last else {
        panic!("expected err auth, got {kinds:?}")
    };
    assert_eq!(e.code, "auth");
    assert!(
        !kinds.contains(&"resume".to_string()),
        "no resume for a refused peer: {kinds:?}"
    );
    // The allowed key gets in.
    a.connect(&c).await;
    // A key holding a grant from carol gets in too.
    let holder = Identity::from_seed(&[42; 32]);
    grant(&c, &holder.key().to_string(), &["exec"], None).await;
    let mut raw = Raw::dial(&c.address(), 42).await;
    raw.handshake().await;
}

#[tokio::test]
async fn an_introduced_peer_honors_the_grant_only_through_a_trusted_introducer() {
    let a = TestNode::start("alice@test").await;
    let c = TestNode::start("carol@test").await;
    let b = start_with_config(
        "bob@test",
        &format!("accept = \"allowlist\"\nallow = [\"{}\"]\n", a.key()),
    )
    .await;
    a.connect(&b).await;
    a.connect(&c).await;
    // Bob trusts alice to introduce, for exec.
    grant(&b, "alice@test", &["introduce", "exec"], None).await;
    // Alice introduces bob to carol, with exec and fs:write (bob will cut it to exec).
    let r = a
        .ctl(Request::Introduce {
            to: "carol@test".into(),
            peer: "bob@test".into(),
            caps: vec!["exec".into(), "fs:write".into()],
            ttl_s: 3600,
            th: None,
        })
        .await;
    assert!(r.ok, "{:?}", r.error);
    // Carol learns bob's address and holds the grant, then connects by name.
    eventually(10, || async {
        grants(&c)
            .await
            .into_iter()
            .find(|g| g["role"] == "held" && g["aud"] == b.key().as_str())
    })
    .await;
    let r = c
        .ctl(Request::Connect {
            address: "bob@test".into(),
            timeout_ms: Some(10_000),
        })
        .await;
    assert!(
        r.ok,
        "carol connects to bob by name (admitted through the grant): {:?}",
        r.error
    );
    let presented = eventually(10, || async {
        grants(&b)
            .await
            .into_iter()
            .find(|g| g["role"] == "presented" && g["sub"] == c.key().as_str())
    })
    .await;
    assert_eq!(presented["validity"], "valid");
    assert_eq!(
        presented["honored_caps"],
        json!(["exec"]),
        "attenuated to what bob trusted alice with"
    );
}
