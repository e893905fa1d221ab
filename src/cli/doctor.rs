//! `awp doctor [--fix] [--json]`: see [`crate::doctor`].

use super::{out, out_json, Ctx, Exit, Failure};
use crate::doctor::{self, Level, Report};

/// Exit codes of `awp doctor` (shown by `awp doctor --help`).
pub const AFTER_HELP: &str = "\
Exit codes:
  0  nothing wrong (notes only), or everything wrong was fixed by --fix
  1  problems remain: each is printed with the command that fixes it
  2  usage error, or --fix could not run (e.g. a node started meanwhile)

--json prints one object: {home, running, pid?, ok, findings: [{check, level (ok|note|problem),
path?, what, fix?, fixable}], fixed: [..]}.";

/// Run the checks (and the safe fixes with `fix`), print the report.
pub fn run(ctx: &Ctx, fix: bool) -> Result<(), Failure> {
    let mut report = doctor::check(&ctx.home);
    if fix {
        // The store's own log lines (e.g. the node's "moved … to quarantine" warning)
        // repeat what the report says: the output is the report alone.
        let quiet = tracing::subscriber::NoSubscriber::default();
        report = tracing::subscriber::with_default(quiet, || doctor::fix(&ctx.home, &report))
            .map_err(|e| Failure::usage(e.to_string(), ""))?;
    }
    if ctx.json {
        let v = serde_json::to_value(&report).map_err(|e| {
            Failure::new(Exit::Failed, format!("cannot encode the report: {e}"), "")
        })?;
        out_json(&v)?;
    } else {
        out(&render(&report, fix))?;
    }
    if report.ok {
        Ok(())
    } else {
        Err(Failure::silent(Exit::Failed))
    }
}

/// The human report: one line per finding (`ok`, `note`, `PROBLEM`), each fix indented
/// under it, then what `--fix` did and a summary.
pub fn render(r: &Report, fixing: bool) -> String {
    let mut lines = vec![format!(
        "home {} ({})",
        r.home.display(),
        if r.running {
            match r.pid {
                Some(p) => format!("node running, pid {p}"),
                None => "node running".into(),
            }
        } else {
            "node stopped".into()
        }
    )];
    for d in &r.fixed {
        lines.push(format!("fixed    {d}"));
    }
    for f in &r.findings {
        let tag = match f.level {
            Level::Ok => "ok      ",
            Level::Note => "note    ",
            Level::Problem => "PROBLEM ",
        };
        let path = f
            .path
            .as_ref()
            .map(|p| format!(" {}:", p.display()))
            .unwrap_or_default();
        lines.push(format!("{tag} {}:{path} {}", f.check, f.what));
        if f.level != Level::Ok {
            if let Some(fix) = &f.fix {
                lines.push(format!("         fix: {fix}"));
            }
        }
    }
    let n = r.problems();
    lines.push(if n == 0 {
        "no problems found".into()
    } else {
        let fixable = r
            .findings
            .iter()
            .filter(|f| f.level == Level::Problem && f.fixable)
            .count();
        if fixable > 0 && !fixing {
            format!("{n} problem(s); `awp doctor --fix` fixes {fixable} of them")
        } else {
            format!("{n} problem(s); apply the fixes shown above")
        }
    });
    lines.join("\n")
}
