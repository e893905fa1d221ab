//! `awp completions SHELL` and `awp man`: generated from the clap definitions of
//! [`super::args::Cli`], so they always list the commands and flags this binary has.

use super::args::Cli;
use super::{Exit, Failure};
use clap::CommandFactory;
use std::io::Write;

/// Write `bytes` to stdout as they are (no escaping: these are scripts and roff, not peer
/// text). A closed stdout ends the command quietly.
fn write_raw(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::silent(Exit::Ok)),
        Err(e) => Err(Failure::new(
            Exit::Failed,
            format!("cannot write output: {e}"),
            "check stdout",
        )),
    }
}

/// The completion script for `shell` (clap_complete), for the command named `awp`.
pub fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "awp", &mut buf);
    buf
}

/// The man page `awp(1)` in roff (clap_mangen): name, synopsis, options, subcommands.
pub fn man_page() -> Result<Vec<u8>, std::io::Error> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut buf)?;
    Ok(buf)
}

/// `awp completions SHELL`.
pub fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    write_raw(&completion_script(shell))
}

/// `awp man`.
pub fn man() -> Result<(), Failure> {
    let page = man_page().map_err(|e| {
        Failure::new(
            Exit::Failed,
            format!("cannot render the man page: {e}"),
            "report this as a bug",
        )
    })?;
    write_raw(&page)
}
