//! The `awp` command line: argument grammar ([`args`]), human output ([`format`](mod@format)), the
//! client commands ([`commands`]) and the foreground node ([`foreground`]).
//!
//! [`run`] returns the process exit code (see [`Exit`]); every failure is reported as one
//! line on stderr: `awp: <what went wrong>; <what to do>`. Under `--json` the same failure
//! is also one JSON object on stdout, `{"error":{"code","message","hint"}}` (see
//! [`Failure::json`]), with the same exit code.

pub mod args;
pub mod artifacts;
pub mod blobs;
pub mod commands;
pub mod docs;
pub mod doctor;
pub mod foreground;
pub mod format;
pub mod grants;
pub mod peers;
pub mod presence;
pub mod transcript;

pub use args::{Cli, Command, NodeArgs};

use crate::control::{ClientError, ControlError};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Process exit codes (documented in `awp --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success.
    Ok = 0,
    /// 1: the operation failed (peer refused, connect failed, node error).
    Failed = 1,
    /// 2: usage error, bad input, or a wait timed out.
    Usage = 2,
    /// 3: no node running (every command that needs one; only `awp up` starts one).
    NoNode = 3,
}

impl Exit {
    /// The numeric exit code.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// A command failure: exit code plus the one-line report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Exit code.
    pub exit: Exit,
    /// What went wrong (empty: exit without a message).
    pub what: String,
    /// What to do about it.
    pub hint: String,
    /// A machine-readable code (`--json`): the node's error code, or one set with
    /// [`Failure::with_code`]; None means the default for the exit code ([`Failure::code`]).
    pub code: Option<String>,
}

impl Failure {
    /// A failure with a message and a hint.
    pub fn new(exit: Exit, what: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure {
            exit,
            what: what.into(),
            hint: hint.into(),
            code: None,
        }
    }
    /// The same failure with a machine-readable code.
    pub fn with_code(mut self, code: impl Into<String>) -> Failure {
        self.code = Some(code.into());
        self
    }
    /// The machine-readable code: the one set, else by exit code `usage` (2), `no_node`
    /// (3) or `failed` (1).
    pub fn code(&self) -> &str {
        match (&self.code, self.exit) {
            (Some(c), _) => c,
            (None, Exit::Usage) => "usage",
            (None, Exit::NoNode) => "no_node",
            (None, _) => "failed",
        }
    }
    /// The failure as printed on stdout under `--json`:
    /// `{"error":{"code":STR,"message":STR,"hint":STR}}` (`hint` may be empty), or `None`
    /// for a silent exit.
    pub fn json(&self) -> Option<serde_json::Value> {
        if self.what.is_empty() {
            return None;
        }
        Some(serde_json::json!({"error": {
            "code": self.code(),
            "message": self.what,
            "hint": self.hint,
        }}))
    }
    /// Usage / bad input (exit 2).
    pub fn usage(what: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure::new(Exit::Usage, what, hint)
    }
    /// Exit without printing anything (e.g. stdout closed by the reader).
    pub fn silent(exit: Exit) -> Failure {
        Failure {
            exit,
            what: String::new(),
            hint: String::new(),
            code: None,
        }
    }
    /// The stderr line, or `None` for a silent exit.
    pub fn message(&self) -> Option<String> {
        if self.what.is_empty() {
            return None;
        }
        // The node's messages may quote peer-chosen names: no raw control characters.
        let what: String = self.what.lines().collect::<Vec<_>>().join(" ");
        let what = format::printable(&what);
        Some(if self.hint.is_empty() {
            format!("awp: {what}")
        } else {
            format!("awp: {what}; {}", format::printable(&self.hint))
        })
    }
}

/// The exit code for a failed control request, by its error code: input the node could
/// not resolve is a usage error (2), everything else an operation failure (1).
pub fn exit_for_node_error(code: &str) -> Exit {
    match code {
        "bad_request" | "no_such_peer" | "ambiguous_peer" | "no_such_thread"
        | "ambiguous_thread" | "no_such_grant" | "ambiguous_grant" | "not_found" => Exit::Usage,
        _ => Exit::Failed,
    }
}

/// A failure for an `ok: false` response.
pub fn node_failure(err: &ControlError, home: &Path) -> Failure {
    // One hint per error: the node's own, else the usual one for the code.
    if let Some(hint) = &err.hint {
        return Failure::new(
            exit_for_node_error(&err.code),
            err.message.clone(),
            hint.clone(),
        )
        .with_code(err.code.clone());
    }
    let hint = match err.code.as_str() {
        "no_such_peer" => {
            "list known peers with `awp peers`, or dial one with `awp connect ADDRESS`".to_string()
        }
        "ambiguous_peer" => "give more characters of the key, or the full key".into(),
        "no_such_thread" => "list threads with `awp threads`".into(),
        "no_such_grant" => "list grants with `awp grants`".into(),
        "ambiguous_grant" => "give more characters of the hash".into(),
        "not_found" => "list artifact threads and artifacts with `awp artifact list`".into(),
        "connect_failed" => "check the address and that the peer's node is up".into(),
        "bad_request" => "check the arguments (`awp help`)".into(),
        "forbidden" => "run awp as the user that started the node".into(),
        _ => format!("see {}", home.join(crate::daemon::LOG_FILE).display()),
    };
    Failure::new(exit_for_node_error(&err.code), err.message.clone(), hint)
        .with_code(err.code.clone())
}

/// The hint of exit 3: the `awp up` that starts a node on `home`, with `--home` unless a
/// plain `awp up` (`AWP_HOME`, else `~/.awp`) would use that home anyway.
pub fn start_hint(home: &Path) -> String {
    let plain = std::env::var_os("AWP_HOME")
        .filter(|h| !h.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(crate::daemon::default_home)
        .and_then(|p| std::path::absolute(p).ok());
    if plain.as_deref() == Some(home) {
        return "start one with `awp up`".into();
    }
    let shown = home.display().to_string();
    let safe = shown
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+@:,=".contains(c));
    if safe {
        format!("start one with `awp --home {shown} up`")
    } else {
        format!(
            "start one with `awp --home '{}' up`",
            shown.replace('\'', "'\\''")
        )
    }
}

/// A failure for a control request that got no answer.
pub fn client_failure(err: &ClientError, home: &Path) -> Failure {
    let log = home.join(crate::daemon::LOG_FILE);
    match err {
        // Commands never start a node as a side effect (usability #2): exit 3, as `status`.
        ClientError::NotRunning { .. } => {
            Failure::new(Exit::NoNode, "no node running", start_hint(home)).with_code("no_node")
        }
        ClientError::Refused(e) => node_failure(e, home),
        other => Failure::new(
            Exit::Failed,
            other.to_string(),
            format!(
                "check the node with `awp status`; its log is {}",
                log.display()
            ),
        ),
    }
}

/// Parse the command line. Help and version are printed here (`Err(0)`); any other
/// problem is reported on one line (`Err(2)`).
pub fn parse<I, T>(args: I) -> Result<Cli, i32>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    use clap::Parser;
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // `--json` before a `--`: a grammar error is reported as JSON on stdout too.
    let json = args
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    Cli::try_parse_from(args).map_err(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                e.exit_code()
            }
            _ => {
                let f = clap_failure(&e);
                report(&f, json);
                Exit::Usage.code()
            }
        }
    })
}

/// A clap error as one line: `awp: <problem>; see `awp help``.
pub fn clap_error_line(e: &clap::Error) -> String {
    clap_failure(e).message().unwrap_or_default()
}

/// Print a failure: its line on stderr and, with `json`, its [`Failure::json`] object on
/// stdout.
pub fn report(f: &Failure, json: bool) {
    if let Some(m) = f.message() {
        eprintln!("{m}");
    }
    if json {
        if let Some(v) = f.json() {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{v}").and_then(|()| stdout.flush());
        }
    }
}

/// A clap error as a usage [`Failure`] (code `usage`).
fn clap_failure(e: &clap::Error) -> Failure {
    let text = e.render().to_string();
    // The first paragraph, e.g. "the following required arguments were not provided:" and
    // the indented list under it, joined into one line.
    let first: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let first = first.join(" ");
    let first = first.strip_prefix("error: ").unwrap_or(&first);
    let first = if first.is_empty() {
        "invalid arguments"
    } else {
        first
    };
    let mut hint = "see `awp --help`".to_string();
    for line in text.lines().map(str::trim) {
        if let Some(tip) = line.strip_prefix("tip: ") {
            hint = format!("{tip}, or see `awp --help`");
            break;
        }
    }
    Failure::usage(first, hint)
}

/// Run a parsed command; returns the exit code.
pub fn run(cli: Cli) -> i32 {
    let home = match crate::daemon::resolve_home(cli.home.clone()) {
        Ok(h) => h,
        Err(e) => {
            let f = Failure::usage(
                format!("cannot use the home directory: {e}"),
                "pass --home DIR or set AWP_HOME",
            );
            report(&f, cli.json);
            return f.exit.code();
        }
    };
    let ctx = Ctx {
        home,
        json: cli.json,
    };
    let multi_thread = matches!(
        cli.command,
        Command::Daemon(_) | Command::Listen { .. } | Command::Relay(_)
    );
    let runtime = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            let f = Failure::new(
                Exit::Failed,
                format!("cannot start the async runtime: {e}"),
                "check system limits",
            );
            report(&f, ctx.json);
            return f.exit.code();
        }
    };
    let result = runtime.block_on(commands::dispatch(&ctx, cli.command));
    // Do not wait without bound for what is left: a blocking read of stdin, or sled's
    // flush on drop of a store that the node flushed when it stopped (that flush has
    // been seen to wait forever when run from the runtime's teardown).
    runtime.shutdown_timeout(RUNTIME_TEARDOWN);
    match result {
        Ok(()) => Exit::Ok.code(),
        Err(f) => {
            report(&f, ctx.json);
            f.exit.code()
        }
    }
}

/// How long [`run`] waits, after the command, for the runtime's leftover tasks and
/// blocking threads before the process exits without them.
const RUNTIME_TEARDOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// What every command needs: the home and the output mode.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The resolved `$AWP_HOME`.
    pub home: PathBuf,
    /// `--json`.
    pub json: bool,
}

/// Write one line to stdout and flush. A closed stdout (`awp tail | head`) ends the
/// command quietly.
pub fn out(line: &str) -> Result<(), Failure> {
    // Human output may carry text a peer chose: keep newlines and tabs, escape every other
    // control character (terminal escape sequences).
    let line: String = line
        .split('\n')
        .map(|l| {
            l.split('\t')
                .map(format::printable)
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::silent(Exit::Ok)),
        Err(e) => Err(Failure::new(
            Exit::Failed,
            format!("cannot write output: {e}"),
            "check stdout",
        )),
    }
}

/// Write one JSON value as a line.
pub fn out_json(v: &serde_json::Value) -> Result<(), Failure> {
    // U+2028/U+2029 escaped: line splitters of other languages cut at them.
    out(&crate::wire::separators::escape_separators_str(
        v.to_string(),
    ))
}

#[cfg(test)]
mod tests;
