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

/// The man page `awp(1)` in roff (clap_mangen): name, synopsis, description, options,
/// then every command (nested ones too) with its usage and what it does, the exit codes
/// and the version. One page: it names no `awp-COMMAND(1)` sub-pages (none are
/// installed); each command's own options are in `awp COMMAND --help`.
pub fn man_page() -> Result<Vec<u8>, std::io::Error> {
    let mut cmd = Cli::command();
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone());
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    man.render_options_section(&mut buf)?;
    buf.extend_from_slice(b".SH SUBCOMMANDS\n");
    buf.extend_from_slice(
        roff_text("Each command's options: awp COMMAND --help (or awp help COMMAND).").as_bytes(),
    );
    buf.push(b'\n');
    commands_section(&cmd, &mut buf);
    man.render_extra_section(&mut buf)?;
    man.render_version_section(&mut buf)?;
    Ok(buf)
}

/// Text as a roff line: backslashes and hyphens escaped, no leading control character.
fn roff_text(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with(['.', '\'']) {
        format!("\\&{t}")
    } else {
        t
    }
}

/// One `.TP` entry per command under `cmd` (depth first): its usage line in bold, then
/// its about text.
fn commands_section(cmd: &clap::Command, buf: &mut Vec<u8>) {
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let usage = sub.clone().render_usage().to_string();
        let usage = usage.trim().trim_start_matches("Usage:").trim();
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        buf.extend_from_slice(
            format!(".TP\n\\fB{}\\fR\n{}\n", roff_text(usage), roff_text(&about)).as_bytes(),
        );
        commands_section(sub, buf);
    }
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
