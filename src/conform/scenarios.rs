//! The scenarios themselves. Shared ones take an open session (handshake done); solo ones
//! take a fresh connection and run their own opening.

use super::peer::{describe_errs, Collected, End, Peer};
use super::report::Check;
use crate::wire::{self, b64, Line};
use serde_json::{json, Map, Value};

/// Bytes of the too-large line: one over the cap.
const TOO_LARGE_LEN: usize = crate::wire::MAX_LINE + 1;

/// Err codes that must not close (§9.7), the last one unknown.
const NON_CLOSING: [&str; 5] = [
    "unsupported",
    "forbidden",
    "internal",
    "blob_refused",
    "some_future_code",
];

fn end_detail(p: &Peer<'_>, got: &Collected) -> String {
    got.end
        .as_ref()
        .map_or("not received".into(), |e| e.describe(p.timeout()))
}

fn is_ack_of(l: &Line, id: &str) -> bool {
    matches!(l, Line::Ack(a) if a.re == id)
}

fn acks_of<'a>(lines: &'a [Line], id: &str) -> Vec<&'a wire::Ack> {
    lines
        .iter()
        .filter_map(|l| match l {
            Line::Ack(a) if a.re == id => Some(a),
            _ => None,
        })
        .collect()
}

fn first_pong(lines: &[Line]) -> Option<&wire::Pong> {
    lines.iter().find_map(|l| match l {
        Line::Pong(p) => Some(p),
        _ => None,
    })
}

fn new_thread(p: &mut Peer<'_>) -> String {
    format!("thr_{}", p.new_id())
}

fn text_msg(p: &mut Peer<'_>, th: &str, subject: Option<&str>, text: &str) -> wire::Msg {
    wire::Msg {
        id: p.new_id(),
        ts: p.now_ts(),
        th: th.to_string(),
        re: None,
        subject: subject.map(str::to_string),
        parts: vec![wire::Part::Text(wire::TextPart { text: text.into() })],
    }
}

/// Send every line; a failed write becomes a failed check.
async fn send_all(p: &mut Peer<'_>, lines: &[Vec<u8>], checks: &mut Vec<Check>) -> bool {
    for l in lines {
        if let Err(e) = p.send(l).await {
            checks.push(Check::fail("send the scenario's lines", e));
            return false;
        }
    }
    true
}

/// A ping line and its id.
fn ping(p: &mut Peer<'_>) -> (String, Vec<u8>) {
    let id = p.new_id();
    let line = Line::Ping(wire::Ping {
        id: id.clone(),
        ts: p.now_ts(),
    })
    .encode();
    (id, line)
}

/// Check that a pong with re = `ping_id` is among `got`'s lines.
fn pong_check(p: &Peer<'_>, got: &Collected, ping_id: &str, what: &str) -> Check {
    let hit = got
        .lines
        .iter()
        .any(|l| matches!(l, Line::Pong(x) if x.re == ping_id));
    Check::new(what, hit, end_detail(p, got))
}

/// §9.4: ping → pong with re.
pub(crate) async fn ping_pong(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let (id, line) = ping(p);
    if !send_all(p, &[line], &mut checks).await {
        return checks;
    }
    let got = p.collect(p.timeout(), |ls| first_pong(ls).is_some()).await;
    match first_pong(&got.lines) {
        Some(pong) => {
            checks.push(Check::pass("a pong arrives"));
            checks.push(Check::new(
                "pong re = ping id",
                pong.re == id,
                format!("re is {:?}, ping id {id:?}", pong.re),
            ));
        }
        None => checks.push(Check::fail("a pong arrives", end_detail(p, &got))),
    }
    checks.push(got.no_err_check());
    checks
}

/// Wait for an ack of `id` and check its th.
async fn expect_ack(
    p: &mut Peer<'_>,
    id: &str,
    th: &str,
    what: &str,
    checks: &mut Vec<Check>,
) -> Collected {
    let got = p
        .collect(p.timeout(), |ls| ls.iter().any(|l| is_ack_of(l, id)))
        .await;
    match acks_of(&got.lines, id).first() {
        Some(a) => {
            checks.push(Check::pass(format!("{what} is acked (re = its id)")));
            checks.push(Check::new(
                "ack th = the line's th",
                a.th == th,
                format!("ack th {:?}, sent th {th:?}", a.th),
            ));
        }
        None => {
            let others: Vec<&str> = got
                .lines
                .iter()
                .filter_map(|l| match l {
                    Line::Ack(a) => Some(a.re.as_str()),
                    _ => None,
                })
                .collect();
            let mut detail = end_detail(p, &got);
            if !others.is_empty() {
                detail.push_str(&format!(" (acks for other ids: {others:?})"));
            }
            checks.push(Check::fail(
                format!("{what} is acked (re = its id)"),
                detail,
            ));
        }
    }
    got
}

/// §9.2: msg → ack {th, re}.
pub(crate) async fn msg_ack(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let th = new_thread(p);
    let msg = text_msg(p, &th, Some("conform msg-ack"), "msg-ack: please ack this");
    let id = msg.id.clone();
    if !send_all(p, &[Line::Msg(msg).encode()], &mut checks).await {
        return checks;
    }
    let got = expect_ack(p, &id, &th, "the msg", &mut checks).await;
    checks.push(got.no_err_check());
    checks
}

/// §8.1: a state line in a thread (opened by a msg) → ack.
pub(crate) async fn state_ack(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let th = new_thread(p);
    let msg = text_msg(
        p,
        &th,
        Some("conform state-ack"),
        "state-ack: opens the thread",
    );
    let state = wire::State {
        id: p.new_id(),
        ts: p.now_ts(),
        th: th.clone(),
        re: None,
        state: "working".into(),
        note: Some("conform".into()),
    };
    let id = state.id.clone();
    let lines = [Line::Msg(msg).encode(), Line::State(state).encode()];
    if !send_all(p, &lines, &mut checks).await {
        return checks;
    }
    let got = expect_ack(p, &id, &th, "the state line", &mut checks).await;
    checks.push(got.no_err_check());
    checks
}

/// §9.2: the same msg twice → acked twice, same re, different ack ids.
pub(crate) async fn dedup(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let th = new_thread(p);
    let msg = Line::Msg(text_msg(p, &th, Some("conform dedup"), "dedup: sent twice")).encode();
    let id = match wire::parse_line(&msg) {
        Ok(l) => l.id().unwrap_or_default().to_string(),
        Err(_) => String::new(),
    };
    if !send_all(p, &[msg.clone(), msg], &mut checks).await {
        return checks;
    }
    let got = p
        .collect(p.timeout(), |ls| acks_of(ls, &id).len() >= 2)
        .await;
    let acks = acks_of(&got.lines, &id);
    checks.push(Check::new(
        "the first copy is acked",
        !acks.is_empty(),
        end_detail(p, &got),
    ));
    checks.push(Check::new(
        "the duplicate is acked again (same re)",
        acks.len() >= 2,
        format!("{} ack(s); {}", acks.len(), end_detail(p, &got)),
    ));
    if acks.len() >= 2 {
        // A re-ack is required (§9.2); fresh ack ids are ours, not the reference's.
        checks.push(Check::strict(
            "the two acks have different ids",
            acks[0].id != acks[1].id,
            format!("both acks have id {:?}", acks[0].id),
        ));
    }
    checks.push(got.no_err_check());
    checks
}

/// §5: an unknown type, then a ping → only a pong.
pub(crate) async fn unknown_type(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let frob = json!({"t": "frobnicate", "id": p.new_id(), "ts": p.now_ts(), "wobble": 3});
    let frob = serde_json::to_vec(&frob).unwrap_or_default();
    let (ping_id, ping_line) = ping(p);
    if !send_all(p, &[frob, ping_line], &mut checks).await {
        return checks;
    }
    let got = p.collect(p.timeout(), |ls| first_pong(ls).is_some()).await;
    checks.push(pong_check(
        p,
        &got,
        &ping_id,
        "a ping after the unknown type gets its pong (still open)",
    ));
    checks.push(got.no_err_check());
    checks
}

/// §5: unknown top-level field and unknown part kind → acked, no err.
pub(crate) async fn unknown_field(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let th = new_thread(p);
    let id = p.new_id();
    let msg = json!({
        "t": "msg",
        "id": id,
        "ts": p.now_ts(),
        "th": th,
        "x-priority": "high",
        "subject": "conform unknown-field",
        "parts": [
            {"k": "text", "text": "unknown-field: ignore what you do not know"},
            {"k": "hologram"},
        ],
    });
    if let Err(e) = p.send_json(&msg).await {
        checks.push(Check::fail("send the msg", e));
        return checks;
    }
    let got = expect_ack(p, &id, &th, "the msg", &mut checks).await;
    checks.push(got.no_err_check());
    checks
}

/// §9.7: non-closing err codes (and an unknown one) → a ping after each gets its pong.
pub(crate) async fn err_nonclosing(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut errs_back = Vec::new();
    for code in NON_CLOSING {
        let mut err = json!({
            "t": "err",
            "id": p.new_id(),
            "ts": p.now_ts(),
            "code": code,
            "detail": "conform: this err must not close the connection",
        });
        if code == "blob_refused" {
            err["ref"] = json!("conform-blob");
        }
        let (ping_id, ping_line) = ping(p);
        let err = serde_json::to_vec(&err).unwrap_or_default();
        if !send_all(p, &[err, ping_line], &mut checks).await {
            return checks;
        }
        let got = p
            .collect(p.timeout(), |ls| {
                ls.iter()
                    .any(|l| matches!(l, Line::Pong(x) if x.re == ping_id))
            })
            .await;
        checks.push(pong_check(
            p,
            &got,
            &ping_id,
            &format!("still open after err {code} (a ping gets its pong)"),
        ));
        errs_back.extend(got.errs().into_iter().cloned());
        if p.closed {
            break;
        }
    }
    let refs: Vec<&wire::ErrLine> = errs_back.iter().collect();
    checks.push(Check::new(
        "no err from the peer",
        refs.is_empty(),
        format!("received {}", describe_errs(&refs)),
    ));
    checks
}

/// §9.3: a msg naming a blob, then its chunks (n from 0, last, std base64, th) → the msg
/// is acked, no err, still open.
pub(crate) async fn chunk(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let th = new_thread(p);
    let blob_ref = format!("conform-{}", p.new_id());
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut msg = text_msg(p, &th, Some("conform chunk"), "chunk: a small blob follows");
    msg.parts.push(wire::Part::Blob(wire::BlobPart {
        blob_ref: blob_ref.clone(),
        size: data.len() as u64,
        name: Some("conform.bin".into()),
        mime: Some("application/octet-stream".into()),
    }));
    let msg_id = msg.id.clone();
    let mut lines = vec![Line::Msg(msg).encode()];
    let pieces: Vec<&[u8]> = data.chunks(200).collect();
    for (n, piece) in pieces.iter().enumerate() {
        lines.push(
            Line::Chunk(wire::Chunk {
                id: p.new_id(),
                ts: p.now_ts(),
                th: Some(th.clone()),
                blob_ref: blob_ref.clone(),
                n: n as u64,
                last: n + 1 == pieces.len(),
                data: b64::encode_std(piece),
            })
            .encode(),
        );
    }
    let (ping_id, ping_line) = ping(p);
    lines.push(ping_line);
    if !send_all(p, &lines, &mut checks).await {
        return checks;
    }
    let got = p
        .collect(p.timeout(), |ls| {
            ls.iter().any(|l| is_ack_of(l, &msg_id))
                && ls
                    .iter()
                    .any(|l| matches!(l, Line::Pong(x) if x.re == ping_id))
        })
        .await;
    let acked = acks_of(&got.lines, &msg_id);
    checks.push(Check::new(
        "the msg naming the blob is acked",
        !acked.is_empty(),
        end_detail(p, &got),
    ));
    checks.push(pong_check(
        p,
        &got,
        &ping_id,
        "still open after the chunks (a ping gets its pong)",
    ));
    checks.push(got.no_err_check());
    checks
}

/// The grant object of the grant scenario: {iss: us, sub: peer, caps `[exec]`, exp now+1h
/// (whole seconds), nonce 16 random bytes, sig over its canonical JSON without sig}.
pub(crate) fn grant_object(p: &Peer<'_>, sub: &str) -> Map<String, Value> {
    let exp = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let exp = exp
        .replace_nanosecond(0)
        .unwrap_or(exp)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut g = Map::new();
    g.insert("iss".into(), json!(p.identity().key().to_string()));
    g.insert("sub".into(), json!(sub));
    g.insert("caps".into(), json!(["exec"]));
    g.insert("exp".into(), json!(exp));
    g.insert(
        "nonce".into(),
        json!(b64::encode_url(&rand::random::<[u8; 16]>())),
    );
    let sig = crate::canonical::sign_object(p.identity(), &g);
    g.insert("sig".into(), json!(sig));
    g
}

/// §10.3: a grant line with a valid grant → no err, still open.
pub(crate) async fn grant(p: &mut Peer<'_>) -> Vec<Check> {
    let mut checks = Vec::new();
    let sub = p
        .hello
        .as_ref()
        .map(|h| h.hello.key.clone())
        .unwrap_or_default();
    let g = grant_object(p, &sub);
    let line = json!({"t": "grant", "id": p.new_id(), "ts": p.now_ts(), "grant": g});
    let line = serde_json::to_vec(&line).unwrap_or_default();
    let (ping_id, ping_line) = ping(p);
    if !send_all(p, &[line, ping_line], &mut checks).await {
        return checks;
    }
    let got = p
        .collect(p.timeout(), |ls| {
            ls.iter()
                .any(|l| matches!(l, Line::Pong(x) if x.re == ping_id))
        })
        .await;
    checks.push(pong_check(
        p,
        &got,
        &ping_id,
        "still open after the grant (a ping gets its pong)",
    ));
    checks.push(got.no_err_check());
    checks
}

/// Checks on what followed a line that must be refused with a closing `err <code>`.
fn closing_err_checks(p: &Peer<'_>, got: &Collected, code: &str, forbid: &str) -> Vec<Check> {
    let errs = got.errs();
    let mut checks = vec![Check::new(
        format!("err {code} arrives"),
        errs.iter().any(|e| e.code == code),
        if errs.is_empty() {
            end_detail(p, got)
        } else {
            format!("received {}", describe_errs(&errs))
        },
    )];
    if !forbid.is_empty() {
        let bad = got.lines.iter().find(|l| l.kind() == forbid);
        checks.push(Check::new(
            format!("no {forbid} is sent"),
            bad.is_none(),
            format!("received a {forbid} line"),
        ));
    }
    checks.push(Check::new(
        "the peer closes the connection",
        got.end == Some(End::Closed),
        end_detail(p, got),
    ));
    checks
}

/// §7.1: hello v 1 → exactly err version after the peer's hello, close, no auth.
pub(crate) async fn version(p: &mut Peer<'_>) -> Vec<Check> {
    let mine = p.our_hello(1);
    let mut checks = Vec::new();
    if !send_all(p, &[mine], &mut checks).await {
        return checks;
    }
    let got = p.collect_until_close(p.timeout()).await;
    let after: Vec<&Line> = got
        .lines
        .iter()
        .skip_while(|l| matches!(l, Line::Hello(_)))
        .collect();
    let exactly = matches!(after.as_slice(), [Line::Err(e)] if e.code == "version");
    checks.extend(closing_err_checks(p, &got, "version", "auth"));
    checks.push(Check::new(
        "exactly one line after the peer's hello",
        exactly,
        format!(
            "received after the hello: [{}]",
            after
                .iter()
                .map(|l| l.kind())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ));
    checks
}

/// §7.2: auth with one bit flipped → err auth, close, no resume.
pub(crate) async fn auth_bad_sig(p: &mut Peer<'_>) -> Vec<Check> {
    let (mine, mut checks) = p.exchange_hellos(0).await;
    if p.hello.is_none() {
        return checks;
    }
    // Only the hello's presence matters here; its own checks belong to `handshake`.
    checks.retain(|c| c.what.starts_with("the peer's first line"));
    let auth = p.our_auth(&mine, true);
    if !send_all(p, &[auth], &mut checks).await {
        return checks;
    }
    let got = p.collect_until_close(p.timeout()).await;
    checks.extend(closing_err_checks(p, &got, "auth", "resume"));
    checks
}

/// Run the handshake for a solo scenario; on failure, the checks say why.
async fn open(p: &mut Peer<'_>) -> Result<(), Vec<Check>> {
    let (checks, open) = p.handshake().await;
    if open {
        Ok(())
    } else {
        let mut failed: Vec<Check> = checks.into_iter().filter(Check::failed).collect();
        if failed.is_empty() {
            failed.push(Check::fail("handshake", "the connection closed"));
        }
        for c in &mut failed {
            c.what = format!("handshake: {}", c.what);
        }
        Err(failed)
    }
}

/// §9.7: `this is not json` → err bad_frame, close.
pub(crate) async fn bad_frame(p: &mut Peer<'_>) -> Vec<Check> {
    if let Err(checks) = open(p).await {
        return checks;
    }
    let mut checks = Vec::new();
    if !send_all(p, &[b"this is not json".to_vec()], &mut checks).await {
        return checks;
    }
    let got = p.collect_until_close(p.timeout()).await;
    checks.extend(closing_err_checks(p, &got, "bad_frame", ""));
    checks
}

/// §9.7: a line of 1,048,577 bytes → err too_large, close.
pub(crate) async fn too_large(p: &mut Peer<'_>) -> Vec<Check> {
    if let Err(checks) = open(p).await {
        return checks;
    }
    let mut big = vec![b'x'; TOO_LARGE_LEN];
    big.push(b'\n');
    let got = p.send_raw_and_collect(&big, p.timeout()).await;
    closing_err_checks(p, &got, "too_large", "")
}

/// §9.6: bye → bye back with re = ours, nothing after it, close.
pub(crate) async fn bye(p: &mut Peer<'_>) -> Vec<Check> {
    if let Err(checks) = open(p).await {
        return checks;
    }
    let mut checks = Vec::new();
    let id = p.new_id();
    let line = Line::Bye(wire::Bye {
        id: id.clone(),
        ts: p.now_ts(),
        re: None,
        reason: Some("done".into()),
    });
    if !send_all(p, &[line.encode()], &mut checks).await {
        return checks;
    }
    let got = p.collect_until_close(p.timeout()).await;
    let pos = got.lines.iter().position(|l| matches!(l, Line::Bye(_)));
    match pos.map(|i| &got.lines[i]) {
        Some(Line::Bye(b)) => {
            checks.push(Check::pass("a bye comes back"));
            // protocol-notes asks for re = ours; the schema leaves re optional and the
            // reference runner accepts a bye without it.
            checks.push(Check::strict(
                "its re = our bye's id",
                b.re.as_deref() == Some(id.as_str()),
                match &b.re {
                    Some(re) => format!("re is {re:?}, our bye id {id:?}"),
                    None => "the bye carries no re".into(),
                },
            ));
        }
        _ => checks.push(Check::fail("a bye comes back", end_detail(p, &got))),
    }
    if let Some(i) = pos {
        let after: Vec<&str> = got.lines[i + 1..].iter().map(|l| l.kind()).collect();
        checks.push(Check::new(
            "nothing after the peer's bye",
            after.is_empty(),
            format!("received {after:?}"),
        ));
    }
    checks.push(Check::new(
        "the peer closes the connection",
        got.end == Some(End::Closed),
        end_detail(p, &got),
    ));
    checks.push(got.no_err_check());
    checks
}
