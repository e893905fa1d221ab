//! The `serve-agent` and `acp` verbs: arguments and their runs.

use crate::cli::args::parse_duration;
use crate::cli::{Ctx, Exit, Failure};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// `awp serve-agent --acp [--root DIR] -- CMD ARGS…`.
#[derive(Debug, Args)]
pub struct ServeAgentArgs {
    /// The agent speaks the Agent Client Protocol on its stdin/stdout (the only protocol
    /// served so far; required).
    #[arg(long, required = true)]
    pub acp: bool,
    /// The directory the agent's sessions run in (`cwd` of `session/new`); its
    /// `fs/read_text_file` and `fs/write_text_file` are confined to it (default: the
    /// current directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Longest one prompt may run before its thread is `failed` (e.g. 30m).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "30m")]
    pub prompt_timeout: Duration,
    /// The agent command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `awp acp --peer PEER`.
#[derive(Debug, Args)]
pub struct AcpArgs {
    /// The peer that serves an agent (`awp serve-agent --acp` there): its key, a key
    /// prefix (4+ characters) or its name.
    #[arg(long, value_name = "PEER", allow_hyphen_values = true)]
    pub peer: String,
    /// Longest one prompt may wait for the peer's `done` or `failed` (e.g. 30m).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "30m")]
    pub prompt_timeout: Duration,
    /// Longest one prompt waits for the peer's first progress or state in its thread;
    /// then the prompt ends with an error saying the peer answered nothing (a peer that
    /// serves an agent answers `working` at once).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "60s")]
    pub answer_timeout: Duration,
}

/// Run `awp serve-agent` until interrupted or the node goes away (exit 1, or 3 when no
/// node runs at start, or 2 when another serve-agent serves this node home).
pub async fn serve_agent(ctx: &Ctx, args: ServeAgentArgs) -> Result<(), Failure> {
    let root = match args.root {
        Some(r) => r,
        None => std::env::current_dir()
            .map_err(|e| Failure::usage(format!("no current directory: {e}"), "pass --root DIR"))?,
    };
    let root = std::path::absolute(&root).unwrap_or(root);
    if !root.is_dir() {
        return Err(Failure::usage(
            format!("{} is not a directory", root.display()),
            "pass --root DIR",
        ));
    }
    let socket = crate::daemon::socket_path(&ctx.home);
    check_node(ctx, &socket).await?;
    // Held until we return: a second serve-agent for this home exits 2.
    let _lock = super::lock::lock(&ctx.home)?;
    let cfg = super::serve::ServeConfig {
        socket,
        root,
        cmd: args.cmd,
        prompt_timeout: args.prompt_timeout,
    };
    super::serve::run(cfg)
        .await
        .map_err(|e| Failure::new(Exit::Failed, e, "check the node with `awp status`"))
}

/// Run `awp acp` until the editor closes stdin. A `--peer` the node does not know ends
/// it before serving (exit 2): the editor's agent configuration is wrong, and an agent
/// process that exits at once with the reason on stderr shows that where editors show
/// agent failures (their agent log), instead of failing each prompt later.
pub async fn acp(ctx: &Ctx, args: AcpArgs) -> Result<(), Failure> {
    let socket = crate::daemon::socket_path(&ctx.home);
    check_node(ctx, &socket).await?;
    check_peer(ctx, &socket, &args.peer).await?;
    super::agent::run(super::agent::AgentConfig {
        socket,
        peer: args.peer,
        prompt_timeout: args.prompt_timeout,
        answer_timeout: args.answer_timeout,
    })
    .await
    .map_err(|e| Failure::new(Exit::Failed, e, "check the node with `awp status`"))
}

/// Exit 2 when the node resolves no single peer from `peer` (the node's rule of every
/// peer argument, applied by a subscription filtered on it).
async fn check_peer(ctx: &Ctx, socket: &std::path::Path, peer: &str) -> Result<(), Failure> {
    let req = crate::control::Request::Subscribe {
        th: None,
        peer: Some(peer.to_string()),
        from_seq: None,
    };
    match crate::control::subscribe(socket, &req).await {
        Ok(_) => Ok(()),
        Err(crate::control::ClientError::Refused(e)) => Err(Failure::usage(
            e.message,
            "`awp peers` lists the known peers; `awp connect` adds one",
        )),
        Err(e) => Err(crate::cli::client_failure(&e, &ctx.home)),
    }
}

/// Exit 3 when no node answers (the usual failures of [`crate::cli::client_failure`]).
async fn check_node(ctx: &Ctx, socket: &std::path::Path) -> Result<(), Failure> {
    let resp = crate::control::request(socket, &crate::control::Request::Status)
        .await
        .map_err(|e| crate::cli::client_failure(&e, &ctx.home))?;
    match resp.error {
        Some(e) if !resp.ok => Err(crate::cli::node_failure(&e, &ctx.home)),
        _ => Ok(()),
    }
}
