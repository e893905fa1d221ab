//! `awp listen` and `awp daemon`: a node in this process until Ctrl-C, SIGTERM or a
//! shutdown request.

use super::args::NodeArgs;
use super::{format, out, out_json, Ctx, Exit, Failure};
use crate::net::Address;
use crate::node::{NodeConfig, NodeHandle, StartError};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast::error::RecvError;

/// What the foreground node prints on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Nothing (`awp daemon`; logs go to stderr).
    None,
    /// The listening event, then every event as one JSON line.
    Json,
    /// The same as human lines.
    Text,
    /// Only the listening event, as a human line (`awp relay`).
    Banner,
}

/// The node configuration from the command line; bad addresses are usage errors.
pub fn node_config(ctx: &Ctx, args: &NodeArgs) -> Result<NodeConfig, Failure> {
    let listen = args
        .listen
        .iter()
        .map(|a| {
            a.parse::<Address>().map_err(|e| {
                Failure::usage(
                    format!("bad --listen address: {e}"),
                    "use tls:HOST:PORT, tcp:HOST:PORT or unix:/path",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeConfig {
        home: ctx.home.clone(),
        listen,
        allow_plaintext: args.allow_plaintext,
        name: args.name.clone(),
        about: args.about.clone(),
        presence: args.presence,
        accept: args
            .accept
            .as_deref()
            .map(|a| a.parse())
            .transpose()
            .map_err(|e: crate::config::ConfigError| {
                Failure::usage(e.to_string(), "use --accept any or --accept allowlist")
            })?,
        serve: args.serve.clone(),
        root: args
            .root
            .as_ref()
            .map(|r| std::path::absolute(r).unwrap_or_else(|_| r.clone())),
        allow_hardlinks: args.allow_hardlinks,
        sandbox: args.sandbox,
        outbox_quota_bytes: args.outbox_quota_bytes,
        outbox_quota_lines: args.outbox_quota_lines,
        artifactr: args.artifactr.clone(),
        artifactr_public: args.artifactr_public,
        via: args
            .via
            .iter()
            .map(|a| {
                crate::config::via_addr(a).map_err(|e| {
                    Failure::usage(
                        format!("bad --via address: {e}"),
                        "use tls:HOST:PORT#ed25519:RELAYKEY",
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        no_sign: args.no_sign,
        ..Default::default()
    })
}

fn start_failure(ctx: &Ctx, e: StartError) -> Failure {
    match e {
        StartError::AlreadyRunning { .. } => Failure::new(
            Exit::Failed,
            e.to_string(),
            "stop it with `awp down`, or use another --home",
        ),
        StartError::NewerStore(_) => Failure::new(
            Exit::Failed,
            format!("the node could not start: {e}"),
            format!(
                "the home {} was used by a newer awp: run that version, or use another --home",
                ctx.home.display()
            ),
        ),
        StartError::Other(msg) => Failure::new(
            Exit::Failed,
            format!("the node could not start: {msg}"),
            format!(
                "run `awp doctor` to check the home {} (and check --listen)",
                ctx.home.display()
            ),
        ),
    }
}

fn emit(output: Output, ev: &crate::control::Event) -> Result<(), Failure> {
    match output {
        Output::None => Ok(()),
        Output::Banner if ev.get("event").and_then(Value::as_str) == Some("listening") => {
            match format::event_line(ev, format::now_ms()) {
                Some(line) => out(&line),
                None => Ok(()),
            }
        }
        Output::Banner => Ok(()),
        Output::Json => out_json(&Value::Object(ev.clone())),
        Output::Text => match format::event_line(ev, format::now_ms()) {
            Some(line) => out(&line),
            None => Ok(()),
        },
    }
}

/// Run the node in the foreground until it stops.
pub async fn run(ctx: &Ctx, args: &NodeArgs, output: Output) -> Result<(), Failure> {
    run_config(ctx, node_config(ctx, args)?, output).await
}

/// [`run`] with a prepared configuration (`awp relay`).
pub async fn run_config(ctx: &Ctx, config: NodeConfig, output: Output) -> Result<(), Failure> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| {
        Failure::new(
            Exit::Failed,
            format!("cannot handle SIGTERM: {e}"),
            "check system limits",
        )
    })?;
    let handle = NodeHandle::start(config)
        .await
        .map_err(|e| start_failure(ctx, e))?;
    // Subscribe before printing the listening event, so no event falls in between.
    let mut events = matches!(output, Output::Json | Output::Text).then(|| handle.subscribe());
    let listening = handle.listening_event();
    let listening_json = Value::Object(listening.clone()).to_string();
    tracing::info!(event = %listening_json, "node running");
    let mut result = emit(output, &listening);
    if result.is_err() {
        handle.shutdown();
    }
    let stopped = handle.stopped();
    tokio::pin!(stopped);
    let mut stopping = result.is_err();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = tokio::signal::ctrl_c(), if !stopping => {
                tracing::info!("interrupted, shutting down");
                stopping = true;
                handle.shutdown();
            }
            _ = sigterm.recv(), if !stopping => {
                tracing::info!("SIGTERM, shutting down");
                stopping = true;
                handle.shutdown();
            }
            ev = async { events.as_mut().expect("guarded").recv().await }, if events.is_some() => {
                match ev {
                    Ok(ev) => {
                        if let Err(f) = emit(output, &ev) {
                            // Nobody reads our output any more: stop the node.
                            result = Err(f);
                            events = None;
                            stopping = true;
                            handle.shutdown();
                        }
                    }
                    Err(RecvError::Lagged(n)) => tracing::warn!(missed = n, "event output fell behind; events skipped"),
                    Err(RecvError::Closed) => events = None,
                }
            }
        }
    }
    tracing::info!("node stopped");
    result
}
