//! Running the selected scenarios over connections we dial ([`run_connect`]) or over the
//! one connection we accept ([`run_listen`]).

use super::peer::{Peer, Shared};
use super::report::{Check, Mode, Outcome, PeerInfo, Report};
use super::schema::{LineSchema, SchemaError};
use super::{scenarios, Scenario, SCENARIOS};
use crate::identity::Identity;
use crate::net::{self, Address, DialOptions, Listener, NetError, TlsConfig};
use std::time::Duration;

/// How long [`run_listen`] waits for the inbound connection.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// Scenarios to run, in run order (see [`super::select`]).
    pub scenarios: Vec<&'static Scenario>,
    /// Per-read timeout (also bounds each write). Peers ack only after fsync: allow a few
    /// seconds.
    pub timeout: Duration,
    /// Print every line sent (`> …`) and received (`< …`) to stderr.
    pub trace: bool,
    /// Allow plaintext `tcp:` to public addresses (loopback and private need no flag).
    pub allow_plaintext: bool,
}

impl Default for Options {
    /// All scenarios, 5 s timeout, no trace.
    fn default() -> Options {
        Options {
            scenarios: SCENARIOS.iter().collect(),
            timeout: Duration::from_secs(5),
            trace: false,
            allow_plaintext: false,
        }
    }
}

/// A run that could not produce a report.
#[derive(Debug, thiserror::Error)]
pub enum ConformError {
    /// The built-in schema did not compile (a bug).
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// Our TLS configuration could not be built.
    #[error("TLS setup: {0}")]
    Tls(NetError),
    /// `--listen`: the address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        source: NetError,
    },
    /// `--listen`: no usable inbound connection (timeout, accept or TLS failure).
    #[error("no inbound connection: {0}")]
    Accept(String),
    /// `--listen`: the bound callback failed (e.g. `--run` could not be started).
    #[error("{0}")]
    Bound(String),
}

fn shared(opts: &Options) -> Result<Shared, ConformError> {
    Ok(Shared {
        timeout: opts.timeout,
        trace: opts.trace,
        schema: LineSchema::new()?,
    })
}

/// A fresh random key and its TLS configuration. Every connection gets its own key: a
/// peer keeps one connection per key, so a second connection with the same key would
/// replace (close) the shared session.
fn fresh_key() -> Result<(Identity, TlsConfig), ConformError> {
    let identity = Identity::generate();
    let tls = TlsConfig::new(&identity).map_err(ConformError::Tls)?;
    Ok((identity, tls))
}

/// Run a shared-session scenario on an open session.
async fn run_shared(s: &Scenario, p: &mut Peer<'_>) -> Vec<Check> {
    match s.name {
        "ping" => scenarios::ping_pong(p).await,
        "msg-ack" => scenarios::msg_ack(p).await,
        "state-ack" => scenarios::state_ack(p).await,
        "dedup" => scenarios::dedup(p).await,
        "unknown-type" => scenarios::unknown_type(p).await,
        "unknown-field" => scenarios::unknown_field(p).await,
        "err-nonclosing" => scenarios::err_nonclosing(p).await,
        "chunk" => scenarios::chunk(p).await,
        "grant" => scenarios::grant(p).await,
        other => vec![Check::fail(
            "run",
            format!("{other} is not a shared scenario"),
        )],
    }
}

/// Run a solo scenario on a fresh connection.
async fn run_solo(s: &Scenario, p: &mut Peer<'_>) -> Vec<Check> {
    match s.name {
        "version" => scenarios::version(p).await,
        "auth-bad-sig" => scenarios::auth_bad_sig(p).await,
        "bad-frame" => scenarios::bad_frame(p).await,
        "too-large" => scenarios::too_large(p).await,
        "bye" => scenarios::bye(p).await,
        other => vec![Check::fail(
            "run",
            format!("{other} is not a solo scenario"),
        )],
    }
}

/// The outcome of a shared scenario on `session` (skip when a cap is missing), with the
/// lines exchanged.
async fn shared_outcome(s: &'static Scenario, p: &mut Peer<'_>) -> Outcome {
    if let Some(cap) = s.needs_cap {
        if !p.caps().iter().any(|c| c == cap) {
            return Outcome::skipped(s, format!("the peer's hello caps do not list `{cap}`"));
        }
    }
    let mut checks = run_shared(s, p).await;
    checks.extend(p.take_violations());
    Outcome::ran(s, checks).with_lines(p.take_lines())
}

/// Fill `report.peer` from `p`'s hello, unless an earlier hello already did.
fn note_peer(report: &mut Report, p: &Peer<'_>) {
    if report.peer.is_some() {
        return;
    }
    if let Some(h) = &p.hello {
        report.peer = Some(PeerInfo {
            key: h.hello.key.clone(),
            name: h.hello.name.clone(),
            about: h.hello.about.clone(),
            v: h.hello.v,
            caps: h.hello.caps.clone(),
        });
    }
}

/// Why a session could not be used, from the handshake's checks.
fn handshake_reason(checks: &[Check]) -> String {
    match checks.iter().find(|c| c.failed()) {
        Some(c) if c.detail.is_empty() => format!("handshake failed: {}", c.what),
        Some(c) => format!("handshake failed: {}: {}", c.what, c.detail),
        None => "handshake failed: the connection closed".into(),
    }
}

/// Dial `addr` with a fresh key.
async fn dial<'s>(
    addr: &Address,
    dial_opts: &DialOptions,
    shared: &'s Shared,
) -> Result<Peer<'s>, String> {
    let (identity, tls) = fresh_key().map_err(|e| e.to_string())?;
    match net::dial(addr, &tls, dial_opts).await {
        Ok(conn) => Ok(Peer::new(conn, shared, identity)),
        Err(e) => Err(e.to_string()),
    }
}

/// Dial and run the handshake: the session when it opened, the handshake's checks
/// (schema violations included) and the lines exchanged. Notes the peer in `report`.
async fn open_session<'s>(
    addr: &Address,
    dial_opts: &DialOptions,
    shared: &'s Shared,
    report: &mut Report,
) -> (Option<Peer<'s>>, Vec<Check>, Vec<String>) {
    let mut p = match dial(addr, dial_opts, shared).await {
        Ok(p) => p,
        Err(e) => return (None, vec![Check::fail("connect", e)], Vec::new()),
    };
    let (mut checks, open) = p.handshake().await;
    checks.extend(p.take_violations());
    note_peer(report, &p);
    let lines = p.take_lines();
    (open.then_some(p), checks, lines)
}

/// Dial `addr` and run `opts.scenarios`, with a fresh random key per connection: a
/// connection of its own for each solo scenario, one shared session for the rest (redialed when the peer closed
/// it). A scenario that cannot connect or complete its handshake fails; one whose cap the
/// peer's hello does not list is skipped. Errors only when the run cannot start
/// ([`ConformError::Schema`], [`ConformError::Tls`]).
pub async fn run_connect(addr: &Address, opts: &Options) -> Result<Report, ConformError> {
    let started = std::time::Instant::now();
    let shared = shared(opts)?;
    let dial_opts = DialOptions {
        allow_plaintext: opts.allow_plaintext,
    };
    let mut report = Report {
        mode: Mode::Connect,
        addr: addr.to_string(),
        ..Report::default()
    };
    let mut session: Option<Peer<'_>> = None;
    for &s in &opts.scenarios {
        if s.solo {
            let outcome = match dial(addr, &dial_opts, &shared).await {
                Ok(mut p) => {
                    let mut checks = run_solo(s, &mut p).await;
                    checks.extend(p.take_violations());
                    note_peer(&mut report, &p);
                    Outcome::ran(s, checks).with_lines(p.take_lines())
                }
                Err(e) => Outcome::ran(s, vec![Check::fail("connect", e)]),
            };
            report.results.push(outcome);
            continue;
        }
        if s.name == "handshake" {
            let (p, checks, lines) = open_session(addr, &dial_opts, &shared, &mut report).await;
            session = p;
            report
                .results
                .push(Outcome::ran(s, checks).with_lines(lines));
            continue;
        }
        let mut opening = Vec::new();
        let mut opening_lines = Vec::new();
        if session.as_ref().is_none_or(|p| p.closed) {
            let (p, checks, lines) = open_session(addr, &dial_opts, &shared, &mut report).await;
            if p.is_none() {
                let check = Check::fail("open a session", handshake_reason(&checks));
                report
                    .results
                    .push(Outcome::ran(s, vec![check]).with_lines(lines));
                continue;
            }
            opening_lines = lines;
            session = p;
            // What went wrong while opening (e.g. a schema violation) belongs to the
            // scenario that needed the session.
            opening = checks
                .into_iter()
                .filter(|c| !c.ok)
                .map(|c| Check {
                    what: format!("opening the session: {}", c.what),
                    ..c
                })
                .collect();
        }
        if let Some(p) = session.as_mut() {
            let mut outcome = shared_outcome(s, p).await;
            if !opening.is_empty() {
                opening.append(&mut outcome.checks);
                let lines = std::mem::take(&mut outcome.lines);
                outcome = Outcome::ran(s, opening).with_lines(lines);
            }
            if !opening_lines.is_empty() {
                opening_lines.append(&mut outcome.lines);
                outcome.lines = opening_lines;
            }
            report.results.push(outcome);
        }
    }
    report.duration = started.elapsed();
    Ok(report)
}

/// Bind `addr`, call `on_bound` with the addresses a peer can dial (TLS ones pinned to
/// our fresh key; for an unspecified host, one per interface with loopback last), accept
/// ONE inbound connection within [`ACCEPT_TIMEOUT`], run the handshake and the shared
/// scenarios on it. Solo scenarios are skipped (they need a connection of their own).
///
/// Errors: [`ConformError::Bind`], [`ConformError::Bound`] (from `on_bound`),
/// [`ConformError::Accept`] (timeout, accept or TLS failure), and those of setup.
pub async fn run_listen<F>(
    addr: &Address,
    opts: &Options,
    on_bound: F,
) -> Result<Report, ConformError>
where
    F: FnOnce(&[Address]) -> Result<(), String>,
{
    let started = std::time::Instant::now();
    let shared = shared(opts)?;
    let (identity, tls) = fresh_key()?;
    let dial_opts = DialOptions {
        allow_plaintext: opts.allow_plaintext,
    };
    let listener = Listener::bind(addr, &tls, &dial_opts)
        .await
        .map_err(|source| ConformError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener.local_address();
    let addresses = net::dialable_addresses(&bound, &tls.key());
    on_bound(&addresses).map_err(ConformError::Bound)?;
    let conn = tokio::time::timeout(ACCEPT_TIMEOUT, async {
        let incoming = listener.accept().await.map_err(|e| e.to_string())?;
        incoming.handshake().await.map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| {
        ConformError::Accept(format!(
            "nothing connected within {}",
            humantime::format_duration(ACCEPT_TIMEOUT)
        ))
    })?
    .map_err(ConformError::Accept)?;
    drop(listener);
    let mut p = Peer::new(conn, &shared, identity);
    let (mut hs_checks, open) = p.handshake().await;
    hs_checks.extend(p.take_violations());
    let hs_lines = p.take_lines();
    let mut report = Report {
        mode: Mode::Listen,
        addr: bound.to_string(),
        ..Report::default()
    };
    note_peer(&mut report, &p);
    for &s in &opts.scenarios {
        if s.solo {
            report.results.push(Outcome::skipped(
                s,
                "needs a connection of its own; --listen accepts one",
            ));
        } else if s.name == "handshake" {
            report
                .results
                .push(Outcome::ran(s, hs_checks.clone()).with_lines(hs_lines.clone()));
        } else if !open {
            let check = Check::fail("open a session", handshake_reason(&hs_checks));
            report.results.push(Outcome::ran(s, vec![check]));
        } else if p.closed {
            let check = Check::fail(
                "open a session",
                "the peer closed the connection earlier; --listen accepts one",
            );
            report.results.push(Outcome::ran(s, vec![check]));
        } else {
            report.results.push(shared_outcome(s, &mut p).await);
        }
    }
    report.duration = started.elapsed();
    Ok(report)
}
