//! Hostile input, table-driven: every row of `tests/fixtures/hostile/*.txt` is one line (or
//! a few) a peer sends to a running node, with the answer the node must give and whether it
//! must then close. The format is described at the top of the fixture file.
//!
//! One node serves the whole table; each row gets a fresh TLS connection with a fresh key,
//! is driven to its phase, sends its input and checks what comes back. Failures are
//! collected over all rows and reported together, each with the row's name.

mod common;

use awp_node::canonical::sign_object;
use awp_node::control::Request;
use awp_node::grant;
use awp_node::identity::{auth_transcript, Identity};
use awp_node::net::{self, Address, DialOptions, TlsConfig};
use awp_node::wire::{self, b64, Line};
use common::TestNode;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The weak key of vectors.md §5: the identity point.
const WEAK_KEY: &str = "ed25519:AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const TS: &str = "2026-01-01T00:00:00.000Z";
const HELLO_ID: &str = "01K00000000000000000000000";
const AUTH_ID: &str = "01K00000000000000000000001";
/// How long a row waits for an answer, for EOF, or for a probe's pong.
const WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    BeforeHello,
    AfterHello,
    AfterHandshake,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Close {
    Closes,
    StaysOpen,
}

#[derive(Debug, Clone)]
enum Input {
    Literal(Vec<u8>),
    Gen(String),
}

/// One expected line from the node.
#[derive(Debug, Clone)]
struct Expect {
    kind: String,
    code: Option<String>,
    /// None: not checked; Some(None): must be absent; Some(Some(x)): must be x.
    re: Option<Option<String>>,
    detail: Option<String>,
}

#[derive(Debug, Clone)]
struct Row {
    name: String,
    phase: Phase,
    tls_node_key: bool,
    inputs: Vec<Input>,
    expect: Vec<Expect>,
    expect_nothing: bool,
    close: Close,
    delivered: Vec<(String, usize)>,
    presence: Option<String>,
}

// ---------------------------------------------------------------------------------------
// The fixture format.

fn parse_expect(v: &str) -> Result<Expect, String> {
    let mut words = v.split(' ');
    let kind = words.next().unwrap_or_default().to_string();
    let mut e = Expect {
        kind,
        code: None,
        re: None,
        detail: None,
    };
    let rest: Vec<&str> = words.collect();
    let mut i = 0;
    while i < rest.len() {
        let w = rest[i];
        if let Some(re) = w.strip_prefix("re=") {
            e.re = Some((re != "-").then(|| re.to_string()));
        } else if let Some(d) = w.strip_prefix("detail~") {
            // The detail substring runs to the end of the value.
            let mut d = d.to_string();
            for more in &rest[i + 1..] {
                d.push(' ');
                d.push_str(more);
            }
            e.detail = Some(d);
            break;
        } else if e.kind == "err" && e.code.is_none() {
            e.code = Some(w.to_string());
        } else {
            return Err(format!("unknown word `{w}` in expect `{v}`"));
        }
        i += 1;
    }
    if e.kind == "err" && e.code.is_none() {
        return Err(format!("expect `{v}`: err needs a code"));
    }
    Ok(e)
}

fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !s.len().is_multiple_of(2) {
        return Err("odd hex length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

fn parse_rows(text: &str) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}", n + 1);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            if rows.iter().any(|r| r.name == name) {
                return Err(at(format!("duplicate row name {name}")));
            }
            rows.push(Row {
                name: name.to_string(),
                phase: Phase::AfterHandshake,
                tls_node_key: false,
                inputs: vec![],
                expect: vec![],
                expect_nothing: false,
                close: Close::Closes,
                delivered: vec![],
                presence: None,
            });
            continue;
        }
        let Some(row) = rows.last_mut() else {
            return Err(at("a key before the first [row]".into()));
        };
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| at(format!("not `key = value`: {line}")))?;
        let value = value.strip_prefix(' ').unwrap_or(value);
        match key.trim() {
            "phase" => {
                row.phase = match value {
                    "before-hello" => Phase::BeforeHello,
                    "after-hello" => Phase::AfterHello,
                    "after-handshake" => Phase::AfterHandshake,
                    other => return Err(at(format!("unknown phase {other}"))),
                }
            }
            "tls" if value == "node" => row.tls_node_key = true,
            "send" => row.inputs.push(Input::Literal(value.as_bytes().to_vec())),
            "hex" => row
                .inputs
                .push(Input::Literal(decode_hex(value).map_err(at)?)),
            "gen" => row.inputs.push(Input::Gen(value.to_string())),
            "expect" if value == "nothing" => row.expect_nothing = true,
            "expect" => row.expect.push(parse_expect(value).map_err(at)?),
            "close" => {
                row.close = match value {
                    "closes" => Close::Closes,
                    "stays-open" => Close::StaysOpen,
                    other => return Err(at(format!("unknown close {other}"))),
                }
            }
            "delivered" => {
                let (th, count) = value
                    .split_once(' ')
                    .ok_or_else(|| at("delivered = TH N".into()))?;
                let count = count.parse().map_err(|_| at("delivered count".into()))?;
                row.delivered.push((th.to_string(), count));
            }
            "presence" => row.presence = Some(value.to_string()),
            other => return Err(at(format!("unknown key {other}"))),
        }
    }
    for r in &rows {
        if r.inputs.is_empty() {
            return Err(format!("row {} sends nothing", r.name));
        }
        if r.expect.is_empty() != r.expect_nothing {
            return Err(format!(
                "row {}: give either `expect = nothing` or expected lines",
                r.name
            ));
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// A raw connection to the node.

struct Conn {
    me: Identity,
    reader: net::LineReader,
    writer: net::BoxWriter,
    node_hello: Vec<u8>,
    my_hello: Option<Vec<u8>>,
    /// Every id the node sent on this connection (they must all differ).
    ids: Vec<String>,
}

enum Got {
    Line(Box<Line>),
    Closed,
    Timeout,
}

impl Conn {
    async fn open(node: &TestNode, tls_identity: Identity) -> Result<Conn, String> {
        let tls = TlsConfig::new(&tls_identity).map_err(|e| e.to_string())?;
        let addr: Address = node.address().parse().map_err(|e| format!("{e:?}"))?;
        let c = net::dial(&addr, &tls, &DialOptions::default())
            .await
            .map_err(|e| format!("dial: {e}"))?;
        let mut conn = Conn {
            me: tls_identity,
            reader: c.reader,
            writer: c.writer,
            node_hello: vec![],
            my_hello: None,
            ids: vec![],
        };
        // The node writes its hello at once, without waiting for ours.
        conn.node_hello = conn.expect_raw("hello").await?;
        Ok(conn)
    }

    /// Write bytes; a write error is not fatal here (the node may close while we write).
    async fn write_all(&mut self, bytes: &[u8]) -> bool {
        self.writer.write_all(bytes).await.is_ok() && self.writer.flush().await.is_ok()
    }

    async fn write_line(&mut self, line: &[u8]) -> bool {
        let mut buf = line.to_vec();
        buf.push(b'\n');
        self.write_all(&buf).await
    }

    async fn next_raw(&mut self) -> Result<Option<Vec<u8>>, ()> {
        match tokio::time::timeout(WAIT, self.reader.read_line()).await {
            Ok(Ok(Some(l))) => Ok(Some(l)),
            Ok(Ok(None)) | Ok(Err(_)) => Ok(None),
            Err(_) => Err(()),
        }
    }

    /// The next line from the node (parsed), EOF, or a timeout.
    async fn next(&mut self) -> Result<Got, String> {
        match self.next_raw().await {
            Ok(Some(raw)) => {
                let line = wire::parse_line(&raw).map_err(|e| {
                    format!(
                        "the node sent a line we cannot parse ({e}): {}",
                        String::from_utf8_lossy(&raw)
                    )
                })?;
                if let Some(id) = line.id() {
                    if self.ids.iter().any(|i| i == id) {
                        return Err(format!("the node reused id {id} on one connection"));
                    }
                    self.ids.push(id.to_string());
                }
                Ok(Got::Line(Box::new(line)))
            }
            Ok(None) => Ok(Got::Closed),
            Err(()) => Ok(Got::Timeout),
        }
    }

    async fn expect_raw(&mut self, kind: &str) -> Result<Vec<u8>, String> {
        match self.next_raw().await {
            Ok(Some(raw)) => match wire::parse_line(&raw) {
                Ok(l) if l.kind() == kind => {
                    if let Some(id) = l.id() {
                        self.ids.push(id.to_string());
                    }
                    Ok(raw)
                }
                Ok(l) => Err(format!("setup: expected {kind}, got {}", describe(&l))),
                Err(e) => Err(format!(
                    "setup: expected {kind}, got an unparsable line: {e}"
                )),
            },
            Ok(None) => Err(format!("setup: closed while waiting for {kind}")),
            Err(()) => Err(format!("setup: no {kind} within {WAIT:?}")),
        }
    }

    fn hello_with(&self, v: u64, key: &str) -> Vec<u8> {
        Line::Hello(wire::Hello {
            id: HELLO_ID.into(),
            ts: TS.into(),
            v,
            key: key.to_string(),
            name: Some("hostile@test".into()),
            nonce: b64::encode_url(&[7u8; 32]),
            caps: vec![],
            about: None,
            addr: None,
            shares: None,
        })
        .encode()
    }

    fn auth_line(sig: &[u8], grants: Vec<wire::Grant>) -> Vec<u8> {
        Line::Auth(wire::Auth {
            id: AUTH_ID.into(),
            ts: TS.into(),
            sig: b64::encode_url(sig),
            grants,
        })
        .encode()
    }

    /// The correct signature over our transcript.
    fn auth_sig(&self) -> [u8; 64] {
        let mine = self.my_hello.as_deref().unwrap_or_default();
        self.me.sign(&auth_transcript(mine, &self.node_hello))
    }

    async fn send_hello(&mut self) -> Result<(), String> {
        let hello = self.hello_with(0, &self.me.key().to_string());
        self.write_line(&hello).await;
        self.my_hello = Some(hello);
        self.expect_raw("auth").await.map(drop)
    }

    async fn send_auth(&mut self) -> Result<(), String> {
        let auth = Conn::auth_line(&self.auth_sig(), vec![]);
        self.write_line(&auth).await;
        self.expect_raw("resume").await.map(drop)
    }
}

fn describe(l: &Line) -> String {
    match l {
        Line::Err(e) => format!(
            "err {} (re={:?}, detail={:?})",
            e.code,
            e.re,
            e.detail.as_deref().unwrap_or("")
        ),
        Line::Ack(a) => format!("ack re={}", a.re),
        Line::Pong(p) => format!("pong re={}", p.re),
        Line::Bye(b) => format!("bye re={:?}", b.re),
        other => other.kind().to_string(),
    }
}

fn line_re(l: &Line) -> Option<String> {
    match l {
        Line::Err(e) => e.re.clone(),
        Line::Ack(a) => Some(a.re.clone()),
        Line::Pong(p) => Some(p.re.clone()),
        Line::Bye(b) => b.re.clone(),
        _ => None,
    }
}

fn matches(e: &Expect, l: &Line) -> bool {
    if l.kind() != e.kind {
        return false;
    }
    if let (Some(code), Line::Err(err)) = (&e.code, l) {
        if &err.code != code {
            return false;
        }
    }
    if let Some(re) = &e.re {
        if &line_re(l) != re {
            return false;
        }
    }
    if let Some(d) = &e.detail {
        let detail = match l {
            Line::Err(err) => err.detail.clone().unwrap_or_default(),
            _ => String::new(),
        };
        if !detail.contains(d.as_str()) {
            return false;
        }
    }
    true
}

// ---------------------------------------------------------------------------------------
// Generated lines.

fn now_ms() -> u64 {
    wire::time::now_ms()
}

/// A signature that non-strict verification accepts for every message under the identity
/// point: R = identity (encoded 1, 0, …), s = 0.
fn weak_key_signature() -> String {
    let mut sig = [0u8; 64];
    sig[0] = 1;
    b64::encode_url(&sig)
}

fn grant_line(grant: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"t":"grant","id":"g1","ts":TS,"grant":grant})).unwrap()
}

fn presence_line(doc: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"t":"presence","id":"pr1","ts":TS,"doc":doc,"hops":0})).unwrap()
}

fn signed(identity: &Identity, mut obj: Map<String, Value>) -> Map<String, Value> {
    let sig = sign_object(identity, &obj);
    obj.insert("sig".into(), sig.into());
    obj
}

fn presence_doc(origin: &str) -> Map<String, Value> {
    let now = now_ms();
    match json!({
        "origin": origin,
        "seq": now,
        "ts": wire::time::format_ms(now),
        "name": "hostile@test",
        "about": "a presence document from the hostile table",
    }) {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

/// Expand one `gen` input into lines. May change the connection's idea of our hello.
fn generate(spec: &str, c: &mut Conn, node: &NodeInfo) -> Result<Vec<Vec<u8>>, String> {
    let mut parts = spec.split(':');
    let what = parts.next().unwrap_or_default();
    let args: Vec<&str> = parts.collect();
    let arg = |i: usize| -> Result<&str, String> {
        args.get(i)
            .copied()
            .ok_or_else(|| format!("gen {spec}: missing argument {i}"))
    };
    let me = c.me.key().to_string();
    Ok(match (what, args.first().copied()) {
        ("repeat", _) => {
            let byte = arg(0)?.as_bytes().first().copied().unwrap_or(b'x');
            let n: usize = arg(1)?.parse().map_err(|_| "repeat count")?;
            vec![vec![byte; n]]
        }
        ("msg-of-size", _) => {
            let n: usize = arg(0)?.parse().map_err(|_| "msg size")?;
            let (id, th) = (arg(1)?, arg(2)?);
            let head = format!(
                r#"{{"t":"msg","id":"{id}","ts":"{TS}","th":"{th}","parts":[{{"k":"text","text":""#
            );
            let tail = r#""}]}"#;
            let fill = n
                .checked_sub(head.len() + tail.len())
                .ok_or("msg size too small")?;
            vec![format!("{head}{}{tail}", "a".repeat(fill)).into_bytes()]
        }
        ("deep", _) => {
            // A ping whose extra field nests arrays so that the line is `n` levels deep
            // (the line's own object is level 1).
            let n: usize = arg(0)?.parse().map_err(|_| "depth")?;
            let id = arg(1)?;
            let arrays = n.checked_sub(1).ok_or("depth must be at least 1")?;
            vec![format!(
                r#"{{"t":"ping","id":"{id}","ts":"{TS}","x":{}{}}}"#,
                "[".repeat(arrays),
                "]".repeat(arrays)
            )
            .into_bytes()]
        }
        ("hello", Some("v1")) => vec![c.hello_with(1, &me)],
        ("hello", Some("weak-key")) => vec![c.hello_with(0, WEAK_KEY)],
        ("hello", Some("own-key")) => vec![c.hello_with(0, &node.key)],
        ("hello", Some("cert-mismatch")) => {
            let other = Identity::generate();
            vec![c.hello_with(0, &other.key().to_string())]
        }
        ("handshake", Some("cr")) => {
            // A hello ending in `\r` (kept by the framing) and an auth over those exact
            // bytes: the handshake must succeed.
            let mut hello = c.hello_with(0, &me);
            hello.push(b'\r');
            c.my_hello = Some(hello.clone());
            let auth = Conn::auth_line(&c.auth_sig(), vec![]);
            vec![hello, auth]
        }
        ("auth", Some("flip-bit")) => {
            let mut sig = c.auth_sig();
            sig[10] ^= 0x04;
            vec![Conn::auth_line(&sig, vec![])]
        }
        ("auth", Some("swapped")) => {
            // Signed over the node's transcript (its hello first) instead of ours.
            let mine = c.my_hello.clone().unwrap_or_default();
            let sig = c.me.sign(&auth_transcript(&c.node_hello, &mine));
            vec![Conn::auth_line(&sig, vec![])]
        }
        ("auth", Some("forged-grant")) => {
            let g: wire::Grant = serde_json::from_value(forged_grant(&c.me, &node.key))
                .map_err(|e| e.to_string())?;
            vec![Conn::auth_line(&c.auth_sig(), vec![g])]
        }
        ("grant", Some("expired")) => {
            // Issued by the node's own key would need its seed; an expired grant from us to
            // us with a good signature is still refused as expired, never an err.
            let g = grant::mint(
                &c.me,
                &c.me.key(),
                &["exec".into()],
                60,
                None,
                now_ms() - 86_400_000,
            );
            vec![grant_line(serde_json::to_value(g).unwrap())]
        }
        ("grant", Some("forged")) => vec![grant_line(forged_grant(&c.me, &node.key))],
        ("grant", Some("weak-issuer")) => vec![grant_line(json!({
            "iss": WEAK_KEY, "sub": me, "caps": ["admin"], "exp": "2099-01-01T00:00:00Z",
            "nonce": "AAAAAAAAAAAAAAAAAAAAAA", "sig": weak_key_signature(),
        }))],
        ("presence", Some("valid")) => {
            vec![presence_line(Value::Object(signed(
                &c.me,
                presence_doc(&me),
            )))]
        }
        ("presence", Some("forged")) => {
            let mut doc = signed(&c.me, presence_doc(&me));
            doc.insert("name".into(), "someone else".into());
            vec![presence_line(Value::Object(doc))]
        }
        ("presence", Some("weak-origin")) => {
            let mut doc = presence_doc(WEAK_KEY);
            doc.insert("sig".into(), weak_key_signature().into());
            vec![presence_line(Value::Object(doc))]
        }
        _ => return Err(format!("unknown generator {spec}")),
    })
}

/// A grant that claims the node as issuer and gives us `admin`, signed with our key.
fn forged_grant(me: &Identity, node_key: &str) -> Value {
    let obj = match json!({
        "iss": node_key, "sub": me.key().to_string(), "caps": ["admin", "exec"],
        "exp": "2099-01-01T00:00:00Z", "nonce": "AAAAAAAAAAAAAAAAAAAAAA",
    }) {
        Value::Object(m) => m,
        _ => unreachable!(),
    };
    Value::Object(signed(me, obj))
}

// ---------------------------------------------------------------------------------------
// Running a row.

struct NodeInfo {
    key: String,
    /// The node's own identity (for rows that present it in TLS).
    identity_path: std::path::PathBuf,
}

async fn presence_counters(node: &TestNode) -> Value {
    let r = node.ctl(Request::PresenceStatus).await;
    assert!(r.ok, "presence status: {:?}", r.error);
    Value::Object(r.body)
}

fn counter(status: &Value, which: &str) -> u64 {
    match which.strip_prefix("refused:") {
        Some(reason) => status["refused"][reason].as_u64().unwrap_or(0),
        None => status[which].as_u64().unwrap_or(0),
    }
}

async fn delivered(node: &TestNode, th: &str, peer: &str) -> usize {
    let r = node
        .ctl(Request::Read {
            th: Some(th.to_string()),
            mark: false,
        })
        .await;
    // Nothing delivered yet: the thread does not exist.
    if r.error.as_ref().is_some_and(|e| e.code == "no_such_thread") {
        return 0;
    }
    assert!(r.ok, "read: {:?}", r.error);
    r.body["entries"]
        .as_array()
        .map(|es| {
            es.iter()
                .filter(|e| e["peer"] == peer && e["t"] == "msg")
                .count()
        })
        .unwrap_or(0)
}

async fn run_row(node: &TestNode, info: &NodeInfo, row: &Row) -> Result<(), String> {
    let identity = if row.tls_node_key {
        Identity::load_or_create(&info.identity_path).map_err(|e| e.to_string())?
    } else {
        Identity::generate()
    };
    let peer = identity.key().to_string();
    let mut c = Conn::open(node, identity).await?;
    if row.phase != Phase::BeforeHello {
        c.send_hello().await?;
    }
    if row.phase == Phase::AfterHandshake {
        c.send_auth().await?;
    }
    let before = match &row.presence {
        Some(which) => Some(counter(&presence_counters(node).await, which)),
        None => None,
    };

    let mut out = Vec::new();
    for input in &row.inputs {
        let lines = match input {
            Input::Literal(l) => vec![l.clone()],
            Input::Gen(spec) => generate(spec, &mut c, info)?,
        };
        for l in lines {
            out.extend_from_slice(&l);
            out.push(b'\n');
        }
    }
    c.write_all(&out).await;

    let mut answers: Vec<Line> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    match row.close {
        Close::Closes => {
            // Everything up to EOF is the answer.
            let mut closed = false;
            for _ in 0..64 {
                match c.next().await? {
                    Got::Line(l) => answers.push(*l),
                    Got::Closed => {
                        closed = true;
                        break;
                    }
                    Got::Timeout => break,
                }
            }
            if !closed {
                problems.push(format!("the connection did not close within {WAIT:?}"));
            }
        }
        Close::StaysOpen => {
            // Two probes, one after the other: the second is read by the node only after
            // it finished (and flushed) the batch that held the row's input, so every
            // answer to the input comes before the second pong.
            for probe in ["probe-1", "probe-2"] {
                let ping = format!(r#"{{"t":"ping","id":"{probe}","ts":"{TS}"}}"#);
                if !c.write_line(ping.as_bytes()).await {
                    problems.push(format!("writing {probe} failed: the connection closed"));
                    break;
                }
                let mut ponged = false;
                for _ in 0..64 {
                    match c.next().await? {
                        Got::Line(l) if matches!(&*l, Line::Pong(p) if p.re == probe) => {
                            ponged = true;
                            break;
                        }
                        Got::Line(l) => answers.push(*l),
                        Got::Closed => {
                            problems.push(format!("the connection closed (before {probe}'s pong)"));
                            break;
                        }
                        Got::Timeout => {
                            problems.push(format!("no pong for {probe} within {WAIT:?}"));
                            break;
                        }
                    }
                }
                if !ponged {
                    break;
                }
            }
        }
    }

    // Match the answers against the expectations as a multiset.
    let mut unmatched: Vec<&Line> = answers.iter().collect();
    for e in &row.expect {
        match unmatched.iter().position(|l| matches(e, l)) {
            Some(i) => {
                unmatched.remove(i);
            }
            None => problems.push(format!("missing answer {e:?}")),
        }
    }
    if !unmatched.is_empty() {
        let extra: Vec<String> = unmatched.iter().map(|l| describe(l)).collect();
        problems.push(format!("unexpected answers: {extra:?}"));
    }
    if !problems.is_empty() {
        let got: Vec<String> = answers.iter().map(describe).collect();
        problems.push(format!("all answers: {got:?}"));
    }

    for (th, want) in &row.delivered {
        let got = delivered(node, th, &peer).await;
        if got != *want {
            problems.push(format!(
                "thread {th}: {got} msg(s) delivered, expected {want}"
            ));
        }
    }
    if let (Some(which), Some(before)) = (&row.presence, before) {
        let after = counter(&presence_counters(node).await, which);
        if after != before + 1 {
            problems.push(format!(
                "presence counter {which} went from {before} to {after}, expected +1"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn load_rows() -> Vec<Row> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        rows.extend(parse_rows(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_lines_get_the_right_answer() {
    let rows = load_rows();
    assert!(rows.len() >= 40, "the table lost rows: {}", rows.len());
    let node = TestNode::start("target@hostile").await;
    let info = NodeInfo {
        key: node.key(),
        identity_path: node.path(),
    };
    let mut failures = Vec::new();
    for row in &rows {
        let r = tokio::time::timeout(Duration::from_secs(30), run_row(&node, &info, row)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("[{}] {e}", row.name)),
            Err(_) => failures.push(format!("[{}] row did not finish within 30 s", row.name)),
        }
    }
    // The node survived all of it: a fresh peer still completes a handshake.
    let mut c = Conn::open(&node, Identity::generate())
        .await
        .expect("node still accepts");
    c.send_hello().await.expect("hello after the table");
    c.send_auth().await.expect("auth after the table");
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

#[test]
fn the_fixture_parser_refuses_what_it_does_not_know() {
    assert!(parse_rows("[a]\nphase = sideways\nsend = x\nexpect = nothing\n").is_err());
    assert!(parse_rows("[a]\nsend = x\n").is_err(), "no expectation");
    assert!(
        parse_rows("[a]\nsend = x\nexpect = err\n").is_err(),
        "err without code"
    );
    assert!(
        parse_rows("[a]\nsend = x\nexpect = nothing\n[a]\nsend = y\nexpect = nothing\n").is_err()
    );
    let rows = parse_rows("[a]\nsend =\nexpect = err bad_frame re=-\nclose = closes\n").unwrap();
    let Input::Literal(l) = &rows[0].inputs[0] else {
        panic!("literal")
    };
    assert!(l.is_empty(), "`send =` is the empty line");
    assert_eq!(rows[0].expect[0].re, Some(None));
}
