//! The `awp` binary: parse the command line, set up logging, run the command.

use awp_node::cli::{self, Command};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

fn main() {
    let cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => std::process::exit(code),
    };
    // The node logs at info by default; client commands only report problems.
    let default = match cli.command {
        Command::Daemon(_) | Command::Listen { .. } => "info",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    std::process::exit(cli::run(cli));
}
