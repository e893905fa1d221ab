//! `awp conform`: arguments and output.
//!
//! Text output: one aligned line per scenario (`  ok|FAIL|skip  NAME  §SECTION  WHAT`),
//! failed checks beneath, then `N passed, N failed, N skipped`. With `--json`: one object in
//! the reference runner's report shape, `{mode, addr, peer: {key, name, about, v, caps},
//! results: [{name, section, doc, status: "pass"|"fail"|"skip", reason, checks: [{ok, what,
//! detail}], lines}], passed, failed, skipped, duration}` (`duration` in nanoseconds; see
//! [`Report::to_json`]). Exit 1 when a scenario failed (or the run could not start), 2 for
//! usage errors, else 0.

use super::{run_connect, run_listen, select, Options, Report, SCENARIOS};
use crate::cli::args::parse_duration;
use crate::cli::{out, out_json, Ctx, Exit, Failure};
use crate::net::Address;
use clap::Args;
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

/// `awp conform`.
#[derive(Debug, Clone, Args)]
pub struct ConformArgs {
    /// The peer to test: tls:HOST:PORT[#ed25519:KEY], tcp:HOST:PORT or unix:/path.
    #[arg(value_name = "ADDRESS", conflicts_with = "listen")]
    pub address: Option<String>,
    /// Listen on ADDR instead and test the one peer that connects (solo scenarios skip).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// With --listen: run CMD (via `sh -c`) once bound, `{addr}` replaced by our address.
    #[arg(long, value_name = "CMD")]
    pub run: Option<String>,
    /// List the scenarios (name, section, what) and exit.
    #[arg(long)]
    pub list: bool,
    /// Run only these scenarios (repeatable, or comma separated).
    #[arg(long = "scenario", value_name = "NAME", value_delimiter = ',')]
    pub scenario: Vec<String>,
    /// Per-read timeout (peers ack only after fsync).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "5s")]
    pub timeout: Duration,
    /// Print every line sent (`>`) and received (`<`) to stderr.
    #[arg(long)]
    pub trace: bool,
    /// Allow plaintext tcp to and from public addresses.
    #[arg(long)]
    pub allow_plaintext: bool,
}

fn parse_address(s: &str) -> Result<Address, Failure> {
    s.parse::<Address>().map_err(|e| {
        Failure::usage(
            e.to_string(),
            "use tls:HOST:PORT[#ed25519:KEY], tcp:HOST:PORT or unix:/path",
        )
    })
}

fn list(ctx: &Ctx) -> Result<(), Failure> {
    if ctx.json {
        let all: Vec<_> = SCENARIOS
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "section": s.section,
                    "what": s.what,
                    "needs_cap": s.needs_cap,
                    "solo": s.solo,
                })
            })
            .collect();
        return out_json(&json!(all));
    }
    let w = SCENARIOS.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in &SCENARIOS {
        let sec = format!("§{}", s.section);
        out(&format!("{:<w$}  {sec:<5}  {}", s.name, s.what))?;
    }
    Ok(())
}

/// Start `sh -c CMD` with `{addr}` replaced; its stdout goes to our stderr so that our
/// stdout stays the report.
fn spawn_run(cmd: &str, addr: &str) -> Result<tokio::process::Child, String> {
    let cmd = cmd.replace("{addr}", addr);
    use std::os::fd::AsFd;
    let stdout = match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    };
    tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))
}

/// The address to hand to `--run`: loopback when there is one (the command runs here).
fn run_address(addrs: &[Address]) -> Option<&Address> {
    addrs
        .iter()
        .find(|a| a.ip().is_some_and(|ip| ip.is_loopback()))
        .or_else(|| addrs.first())
}

/// Run `awp conform`.
pub async fn run(ctx: &Ctx, args: ConformArgs) -> Result<(), Failure> {
    if args.list {
        return list(ctx);
    }
    let scenarios = select(&args.scenario).map_err(|bad| {
        Failure::usage(
            format!("no scenario named {bad:?}"),
            "list them with `awp conform --list`",
        )
    })?;
    if args.run.is_some() && args.listen.is_none() {
        return Err(Failure::usage(
            "--run needs --listen",
            "e.g. awp conform --listen tcp:127.0.0.1:0 --run 'CMD {addr}'",
        ));
    }
    if args.timeout.is_zero() {
        return Err(Failure::usage(
            "--timeout must be above zero",
            "e.g. --timeout 5s",
        ));
    }
    let opts = Options {
        scenarios,
        timeout: args.timeout,
        trace: args.trace,
        allow_plaintext: args.allow_plaintext,
    };
    let result = match (&args.address, &args.listen) {
        (Some(a), None) => {
            let addr = parse_address(a)?;
            run_connect(&addr, &opts).await
        }
        (None, Some(l)) => {
            let addr = parse_address(l)?;
            let mut child = None;
            let run_cmd = args.run.clone();
            let r = run_listen(&addr, &opts, |addrs| {
                for a in addrs {
                    eprintln!("awp conform: listening on {a}");
                }
                if let Some(cmd) = run_cmd {
                    let a = run_address(addrs).ok_or("no address to hand to --run")?;
                    child = Some(spawn_run(&cmd, &a.to_string())?);
                }
                Ok(())
            })
            .await;
            if let Some(mut c) = child {
                // The command's work is done once the run is over; do not leave it behind.
                if let Ok(None) = c.try_wait() {
                    let _ = c.start_kill();
                }
                let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
            }
            r
        }
        _ => {
            return Err(Failure::usage(
                "give the ADDRESS of a peer, or --listen ADDR",
                "see `awp conform --help`",
            ))
        }
    };
    let report = result.map_err(|e| {
        Failure::new(
            Exit::Failed,
            e.to_string(),
            "check the address and that the peer is up",
        )
    })?;
    print(ctx, &report)?;
    if report.success() {
        Ok(())
    } else {
        Err(Failure::silent(Exit::Failed))
    }
}

fn print(ctx: &Ctx, report: &Report) -> Result<(), Failure> {
    if ctx.json {
        return out_json(&report.to_json());
    }
    for line in report.render_text() {
        out(&line)?;
    }
    Ok(())
}
