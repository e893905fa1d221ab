//! `awp presence` (known agents from presence documents) and `awp relay` (run a relay, or
//! show its counters).

use super::args::{RelayAction, RelayArgs};
use super::format::{clip, field, format_age, short_key, str_field, table, timestamp_ms};
use super::{client_failure, out, out_json, Ctx, Failure};
use crate::control::{self, Request};
use crate::node::ViaStatus;
use serde::Deserialize;
use serde_json::{Map, Value};

/// `awp presence [PEER]`.
pub async fn show(ctx: &Ctx, peer: Option<String>) -> Result<(), Failure> {
    if peer.is_some() {
        let body = ctx.call(&Request::Presence { peer }).await?;
        return if ctx.json {
            out_json(&Value::Object(body))
        } else {
            out(&document_text(&body))
        };
    }
    let mut agents = ctx
        .call_all(&Request::Presence { peer: None }, "agents")
        .await?;
    // Ours first, then the most recent (the node pages them in origin order).
    let own = |a: &Value| a.get("own").and_then(Value::as_bool) != Some(true);
    let ts = |a: &Value| field_ts(a);
    agents.sort_by(|a, b| own(a).cmp(&own(b)).then_with(|| ts(b).cmp(&ts(a))));
    if ctx.json {
        for a in &agents {
            out_json(a)?;
        }
        return Ok(());
    }
    if agents.is_empty() {
        return out("no presence documents yet (peers publish with `awp up --presence`)");
    }
    out(&presence_table(&agents, super::format::now_ms()))
}

/// A document's signed time in ms (0 when missing).
fn field_ts(a: &Value) -> i64 {
    a.as_object()
        .and_then(|o| field(o, &["ts"]))
        .and_then(timestamp_ms)
        .unwrap_or(0)
}

/// The `awp presence` table: NAME, KEY, HOST, HARNESS/MODEL, ACTIVE, WAITING, PEERS UP,
/// VIA, HOPS. Our own document shows `(self)` as VIA.
pub fn presence_table(agents: &[Value], now_ms: i64) -> String {
    let rows: Vec<Vec<String>> = agents
        .iter()
        .filter_map(Value::as_object)
        .map(|a| {
            let dash = |k: &str| clip(str_field(a, &[k]).unwrap_or("-"), 30);
            let hm = match (str_field(a, &["harness"]), str_field(a, &["model"])) {
                (None, None) => "-".to_string(),
                (h, m) => clip(&format!("{}/{}", h.unwrap_or("-"), m.unwrap_or("-")), 40),
            };
            let active = field(a, &["active"])
                .and_then(timestamp_ms)
                .map(|t| format_age((now_ms - t) / 1000))
                .unwrap_or_else(|| "-".into());
            let waiting = match a.get("waiting").and_then(Value::as_bool) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            };
            let peers = format!(
                "{}/{}",
                a.get("peers_up").and_then(Value::as_u64).unwrap_or(0),
                a.get("peers").and_then(Value::as_u64).unwrap_or(0)
            );
            let via = if a.get("own").and_then(Value::as_bool) == Some(true) {
                "(self)".to_string()
            } else {
                match (str_field(a, &["via_name"]), str_field(a, &["via"])) {
                    (Some(n), _) => clip(n, 30),
                    (None, Some(k)) => short_key(k),
                    _ => "-".into(),
                }
            };
            let hops = a
                .get("hops")
                .and_then(Value::as_u64)
                .map_or("-".into(), |h| h.to_string());
            vec![
                dash("name"),
                short_key(str_field(a, &["origin"]).unwrap_or("?")),
                dash("host"),
                hm,
                active,
                waiting.into(),
                peers,
                via,
                hops,
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "KEY",
            "HOST",
            "HARNESS/MODEL",
            "ACTIVE",
            "WAITING",
            "PEERS UP",
            "VIA",
            "HOPS",
        ],
        &rows,
    )
}

/// One document in full: a `signature:` line, where it came from, then the document
/// pretty-printed.
pub fn document_text(body: &Map<String, Value>) -> String {
    let verified = match body.get("verified").and_then(Value::as_bool) {
        Some(true) => "verified",
        _ => "DOES NOT VERIFY",
    };
    let from = if body.get("own").and_then(Value::as_bool) == Some(true) {
        "our own document".to_string()
    } else {
        format!(
            "via {} after {} hop(s)",
            str_field(body, &["via_name", "via"]).unwrap_or("?"),
            body.get("hops").and_then(Value::as_u64).unwrap_or(0)
        )
    };
    let doc = body.get("doc").cloned().unwrap_or(Value::Null);
    format!(
        "signature: {verified}\nfrom:      {from}\n{}",
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    )
}

/// `awp relay [--listen ADDR]… [--max-connections N]` and `awp relay status`.
pub async fn relay(ctx: &Ctx, args: &RelayArgs) -> Result<(), Failure> {
    match args.action {
        Some(RelayAction::Status) => relay_status(ctx).await,
        None => {
            let mut config = super::foreground::node_config(ctx, &args.node)?;
            config.relay = true;
            config.max_connections = Some(args.max_connections);
            let output = if ctx.json {
                super::foreground::Output::Json
            } else {
                super::foreground::Output::Banner
            };
            super::foreground::run_config(ctx, config, output).await
        }
    }
}

async fn relay_status(ctx: &Ctx) -> Result<(), Failure> {
    let resp = control::request(&ctx.socket(), &Request::PresenceStatus)
        .await
        .map_err(|e| client_failure(&e, &ctx.home))?;
    let body = ctx.body(resp)?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    let n = |k: &str| body.get(k).map_or("-".into(), Value::to_string);
    let mut lines = vec![
        format!(
            "mode:        {}",
            if body.get("relay").and_then(Value::as_bool) == Some(true) {
                "relay"
            } else {
                "node"
            }
        ),
        format!(
            "connected:   {} sessions; {} standing by for circuits (--via); {} presence peers; limit {}; {} refused",
            n("connections"),
            body.get("circuits")
                .and_then(|c| c.get("listeners"))
                .map_or("0".into(), Value::to_string),
            n("presence_peers"),
            n("max_connections"),
            n("refused_connections")
        ),
        format!(
            "documents:   {} held, {} accepted, {} expired",
            n("documents"),
            n("accepted"),
            n("expired")
        ),
        format!(
            "forwarded:   {} documents in {} lines ({} lines dropped: peer queue full)",
            n("forwarded"),
            n("forward_lines"),
            n("forward_dropped")
        ),
        format!("dropped:     {}", n("dropped")),
    ];
    if let Some(Value::Object(r)) = body.get("refused") {
        for (reason, count) in r {
            lines.push(format!("  {reason}: {count}"));
        }
    }
    lines.extend(circuit_lines(&body));
    out(&lines.join("\n"))
}

/// How long `awp up` waits for the first attempt of each `via` relay's standing
/// connection to end, so that a relay that answers at once has its circuit address
/// printed (polling `status` every [`VIA_POLL`]).
pub const VIA_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// How often `awp up` asks while it waits for the `via` relays ([`VIA_WAIT`]).
pub const VIA_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// `status` (the body `status` answered) asked again until no `via` relay is still at
/// its first attempt (up, or down with an `error`), for at most [`VIA_WAIT`].
///
/// Errors: the node stopped answering (as any request).
pub(crate) async fn settle_vias(
    ctx: &Ctx,
    mut status: Map<String, Value>,
) -> Result<Map<String, Value>, Failure> {
    let deadline = tokio::time::Instant::now() + VIA_WAIT;
    while vias(&status).iter().any(|v| !v.up && v.error.is_none())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(VIA_POLL).await;
        status = ctx.call(&Request::Status).await?;
    }
    Ok(status)
}

/// One line for stderr per `via` relay of `body` (`status`, `address`) that is not up:
/// its circuit address is not among the addresses (issue 14).
pub(crate) fn via_notes(body: &Map<String, Value>) -> Vec<String> {
    vias(body)
        .into_iter()
        .filter(|v| !v.up)
        .map(|v| match v.error {
            Some(e) => format!(
                "via {} is down ({e}): its circuit address is left out until it is up",
                v.relay
            ),
            None => format!(
                "via {} is not up yet: its circuit address is left out until it is up",
                v.relay
            ),
        })
        .collect()
}

/// The `via` array of a control-socket body ([`ViaStatus`] items; one that is no such
/// item is skipped).
pub(crate) fn vias(body: &serde_json::Map<String, Value>) -> Vec<ViaStatus> {
    body.get("via")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| ViaStatus::deserialize(v).ok())
        .collect()
}

/// The circuit part of `awp relay status` (spec/relay-circuits.md): the relay's circuits
/// with their bytes, and this node's standing connections (`via`).
fn circuit_lines(body: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(Value::Object(c)) = body.get("circuits") {
        let n = |k: &str| c.get(k).map_or("-".into(), Value::to_string);
        let live = c.get("circuits").and_then(Value::as_array);
        lines.push(format!(
            "circuits:    {} open, {} listeners, {} pending, {} opened, {} refused, {} bytes",
            live.map_or(0, Vec::len),
            n("listeners"),
            n("pending"),
            n("opened"),
            n("refused"),
            n("bytes")
        ));
        for x in live.into_iter().flatten() {
            let s = |k: &str| x.get(k).and_then(Value::as_str).unwrap_or("-");
            let u = |k: &str| x.get(k).and_then(Value::as_u64).unwrap_or(0);
            lines.push(format!(
                "  {} {} -> {} {}s up {} B down {} B",
                s("id"),
                s("from"),
                s("to"),
                u("age_secs"),
                u("up"),
                u("down")
            ));
        }
    }
    for v in vias(body) {
        lines.push(format!(
            "via:         {} {}{}",
            v.relay,
            if v.up { "up" } else { "down" },
            v.observed
                .map(|o| format!(" (seen as {o})"))
                .or_else(|| v.error.map(|e| format!(": {e}")))
                .unwrap_or_default()
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn relay_status_says_why_a_via_is_down() {
        let body = json!({"via": [
            {"relay": "tls:a:1#ed25519:R", "up": true, "observed": "203.0.113.7:4000"},
            {"relay": "tls:b:2#ed25519:S", "up": false, "error": "b:2 does not serve circuits"},
            {"relay": "tls:c:3#ed25519:T", "up": false},
        ]});
        let lines = circuit_lines(body.as_object().unwrap());
        assert_eq!(
            lines,
            [
                "via:         tls:a:1#ed25519:R up (seen as 203.0.113.7:4000)",
                "via:         tls:b:2#ed25519:S down: b:2 does not serve circuits",
                "via:         tls:c:3#ed25519:T down",
            ]
        );
    }

    #[test]
    fn table_shows_self_via_and_hops() {
        let agents = vec![
            json!({"origin": "ed25519:AAAAAAAAAAAA", "name": "me", "own": true, "peers_up": 1, "peers": 2, "waiting": false}),
            json!({"origin": "ed25519:BBBBBBBBBBBB", "name": "bob", "host": "ci", "harness": "codex",
                   "active": "2026-01-01T00:00:00Z", "waiting": true, "via": "ed25519:CCCCCCCCCC",
                   "hops": 3, "own": false}),
        ];
        let now = 1_767_225_660_000; // one minute after `active`
        let t = presence_table(&agents, now);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME"));
        assert!(lines[1].contains("(self)") && lines[1].contains("1/2"));
        assert!(lines[2].contains("codex/-") && lines[2].contains("1m ago"));
        assert!(lines[2].contains("CCCCCCCC") && lines[2].trim_end().ends_with('3'));
        assert!(lines[2].contains("yes"));
    }

    #[test]
    fn relay_and_presence_arguments_parse() {
        use crate::cli::args::{Cli, Command};
        use clap::Parser;
        let cli = Cli::try_parse_from(["awp", "relay", "status"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Relay(RelayArgs {
                action: Some(RelayAction::Status),
                ..
            })
        ));
        let cli = Cli::try_parse_from([
            "awp",
            "relay",
            "--listen",
            "tls:0.0.0.0:7700",
            "--max-connections",
            "10",
        ])
        .unwrap();
        let Command::Relay(r) = cli.command else {
            panic!()
        };
        assert_eq!((r.action.is_none(), r.max_connections), (true, 10));
        assert_eq!(r.node.listen, ["tls:0.0.0.0:7700"]);
        let cli = Cli::try_parse_from(["awp", "relay"]).unwrap();
        let Command::Relay(r) = cli.command else {
            panic!()
        };
        assert_eq!(r.max_connections, crate::node::DEFAULT_MAX_CONNECTIONS);
        let cli = Cli::try_parse_from(["awp", "up", "--presence"]).unwrap();
        let Command::Up(n) = cli.command else {
            panic!()
        };
        assert!(n.presence);
        let cli = Cli::try_parse_from(["awp", "presence", "-abc"]).unwrap();
        assert!(matches!(cli.command, Command::Presence { peer: Some(p) } if p == "-abc"));
    }

    #[test]
    fn document_text_says_whether_it_verified() {
        let b = json!({"verified": false, "via": "k", "hops": 2, "doc": {"seq": 1}});
        let Value::Object(b) = b else { unreachable!() };
        let t = document_text(&b);
        assert!(t.starts_with("signature: DOES NOT VERIFY"));
        assert!(t.contains("after 2 hop(s)"));
    }
}
