//! Results of a conformance run and their two renderings: aligned text lines and one JSON
//! object in the report shape of the reference runner (see [`Report::to_json`]).

use super::Scenario;
use serde_json::{json, Value};
use std::time::Duration;

/// One check of a scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked, e.g. `pong re = ping id`.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
    /// What was observed (why it failed, or a note); may be empty.
    pub detail: String,
    /// Stricter than the reference runner: when it does not hold it is a warning
    /// ([`Report::warnings`]), never a failure, so that a peer passing the reference
    /// passes ours.
    pub strict: bool,
}

impl Check {
    /// A check that held.
    pub fn pass(what: impl Into<String>) -> Check {
        Check {
            what: what.into(),
            ok: true,
            detail: String::new(),
            strict: false,
        }
    }

    /// A check that failed, with what was observed instead.
    pub fn fail(what: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            what: what.into(),
            ok: false,
            detail: detail.into(),
            strict: false,
        }
    }

    /// A check that held when `ok`, else failed with `detail`.
    pub fn new(what: impl Into<String>, ok: bool, detail: impl Into<String>) -> Check {
        let detail = if ok { String::new() } else { detail.into() };
        Check {
            what: what.into(),
            ok,
            detail,
            strict: false,
        }
    }

    /// Like [`Check::new`], for a rule the reference runner does not enforce (a SHOULD of
    /// protocol-notes, or a field the schema leaves optional): a warning when it does not
    /// hold.
    pub fn strict(what: impl Into<String>, ok: bool, detail: impl Into<String>) -> Check {
        Check {
            strict: true,
            ..Check::new(what, ok, detail)
        }
    }

    /// Whether this check failed the scenario (it did not hold and is not strict).
    pub fn failed(&self) -> bool {
        !self.ok && !self.strict
    }

    /// Whether this check is a warning (a strict check that did not hold).
    pub fn warning(&self) -> bool {
        !self.ok && self.strict
    }
}

/// How a scenario ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every check held.
    Pass,
    /// A check failed (or the scenario could not run: connect or handshake failed).
    Fail,
    /// Not run: the peer lacks a required capability, or the mode cannot run it.
    Skip,
}

impl Status {
    /// `pass`, `fail` or `skip` (the JSON form, as the reference runner writes it).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// The result of one scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Scenario name.
    pub name: &'static str,
    /// Protocol section.
    pub section: &'static str,
    /// What the scenario checks.
    pub what: &'static str,
    /// pass, fail or skip.
    pub status: Status,
    /// Why it was skipped, or the first failed check; `None` when ok.
    pub reason: Option<String>,
    /// The checks, in the order they were made (empty when skipped).
    pub checks: Vec<Check>,
    /// The lines sent (`> …`) and received (`< …`) during the scenario, each clipped.
    pub lines: Vec<String>,
}

impl Outcome {
    /// The outcome of a scenario that ran: pass when every check held (and there was at
    /// least one), strict ones aside, else fail with the first failed check as the reason.
    pub fn ran(s: &Scenario, checks: Vec<Check>) -> Outcome {
        let first_failed = checks.iter().find(|c| c.failed());
        let (status, reason) = match first_failed {
            Some(c) if c.detail.is_empty() => (Status::Fail, Some(c.what.clone())),
            Some(c) => (Status::Fail, Some(format!("{}: {}", c.what, c.detail))),
            None if checks.is_empty() => (Status::Fail, Some("no checks were made".into())),
            None => (Status::Pass, None),
        };
        Outcome {
            name: s.name,
            section: s.section,
            what: s.what,
            status,
            reason,
            checks,
            lines: Vec::new(),
        }
    }

    /// The same outcome with `lines` as its transcript.
    pub fn with_lines(mut self, lines: Vec<String>) -> Outcome {
        self.lines = lines;
        self
    }

    /// A skipped scenario.
    pub fn skipped(s: &Scenario, why: impl Into<String>) -> Outcome {
        Outcome {
            name: s.name,
            section: s.section,
            what: s.what,
            status: Status::Skip,
            reason: Some(why.into()),
            checks: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// `{name, section, doc, status: "pass"|"fail"|"skip", reason, checks: [{ok, what,
    /// detail}], lines: [string]}`: the result shape of the reference runner (`doc` is what
    /// the scenario checks; `detail` is ours). `reason` is `null` when passed. Warnings
    /// (strict checks that did not hold) are left out of `checks`: they are listed in the
    /// report's `warnings`.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "section": self.section,
            "doc": self.what,
            "status": self.status.as_str(),
            "reason": self.reason,
            "checks": self.checks.iter().filter(|c| !c.warning()).map(|c| json!({
                "ok": c.ok,
                "what": c.what,
                "detail": c.detail,
            })).collect::<Vec<_>>(),
            "lines": self.lines,
        })
    }
}

/// `connect` (we dialed the peer) or `listen` (the peer dialed us).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// `awp conform ADDRESS`.
    #[default]
    Connect,
    /// `awp conform --listen ADDR`.
    Listen,
}

impl Mode {
    /// `connect` or `listen` (the JSON form).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Connect => "connect",
            Mode::Listen => "listen",
        }
    }
}

/// The peer under test, from the first hello it sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its key, `ed25519:…`, as sent.
    pub key: String,
    /// Its hello `name`, if any.
    pub name: Option<String>,
    /// Its hello `about`, if any.
    pub about: Option<String>,
    /// Its protocol version.
    pub v: u64,
    /// Its hello `caps`.
    pub caps: Vec<String>,
}

/// All outcomes of a run, in run order, and what the run was against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// How the run reached the peer.
    pub mode: Mode,
    /// The address dialed (connect) or bound (listen).
    pub addr: String,
    /// The peer, once one of its hellos arrived.
    pub peer: Option<PeerInfo>,
    /// One outcome per selected scenario.
    pub results: Vec<Outcome>,
    /// Wall time of the whole run.
    pub duration: Duration,
}

impl Report {
    /// How many scenarios have `status`.
    pub fn count(&self, status: Status) -> usize {
        self.results.iter().filter(|r| r.status == status).count()
    }

    /// Whether no scenario failed (skips do not fail a run).
    pub fn success(&self) -> bool {
        self.count(Status::Fail) == 0
    }

    /// The outcome of scenario `name`, if it was selected.
    pub fn get(&self, name: &str) -> Option<&Outcome> {
        self.results.iter().find(|r| r.name == name)
    }

    /// Every warning, in run order: the scenario's name and the strict check that did
    /// not hold.
    pub fn warnings(&self) -> Vec<(&'static str, &Check)> {
        self.results
            .iter()
            .flat_map(|r| r.checks.iter().filter(|c| c.warning()).map(|c| (r.name, c)))
            .collect()
    }

    /// The closing line: `N passed, N failed, N skipped`, then `, N warnings` when there
    /// are any.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} passed, {} failed, {} skipped",
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::Skip)
        );
        match self.warnings().len() {
            0 => {}
            1 => s.push_str(", 1 warning"),
            n => s.push_str(&format!(", {n} warnings")),
        }
        s
    }

    /// Text lines: `  ok|FAIL|skip  <name>  §<section>  <what>` aligned in columns; under
    /// a failed scenario its failed checks, under a skipped one the reason (indented);
    /// then one `  warn  <name>: <check>: <detail>` line per warning; then
    /// [`Report::summary`].
    pub fn render_text(&self) -> Vec<String> {
        let name_w = self.results.iter().map(|r| r.name.len()).max().unwrap_or(0);
        let sec_w = self
            .results
            .iter()
            .map(|r| r.section.len() + 1)
            .max()
            .unwrap_or(0);
        let mut out = Vec::new();
        for r in &self.results {
            let tag = match r.status {
                Status::Pass => "ok",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            out.push(format!(
                "  {tag:<4}  {:<name_w$}  {:<sec_w$}  {}",
                r.name,
                format!("§{}", r.section),
                r.what
            ));
            match r.status {
                Status::Fail => {
                    for c in r.checks.iter().filter(|c| c.failed()) {
                        if c.detail.is_empty() {
                            out.push(format!("          - {}", c.what));
                        } else {
                            out.push(format!("          - {}: {}", c.what, one_line(&c.detail)));
                        }
                    }
                    if !r.checks.iter().any(Check::failed) {
                        if let Some(reason) = &r.reason {
                            out.push(format!("          - {}", one_line(reason)));
                        }
                    }
                }
                Status::Skip => {
                    if let Some(reason) = &r.reason {
                        out.push(format!("          ({})", one_line(reason)));
                    }
                }
                Status::Pass => {}
            }
        }
        for (name, c) in self.warnings() {
            if c.detail.is_empty() {
                out.push(format!("  warn  {name}: {}", c.what));
            } else {
                out.push(format!(
                    "  warn  {name}: {}: {}",
                    c.what,
                    one_line(&c.detail)
                ));
            }
        }
        out.push(self.summary());
        out
    }

    /// The reference runner's report shape: `{mode: "connect"|"listen", addr, peer: {key,
    /// name, about, v, caps} (null when no hello arrived), results: [Outcome::to_json…],
    /// passed, failed, skipped, duration}` with `duration` in nanoseconds (an integer);
    /// plus our `warnings: [{name, what, detail}]` (see [`Report::warnings`]).
    pub fn to_json(&self) -> Value {
        let peer = self.peer.as_ref().map(|p| {
            json!({
                "key": p.key,
                "name": p.name,
                "about": p.about,
                "v": p.v,
                "caps": p.caps,
            })
        });
        json!({
            "mode": self.mode.as_str(),
            "addr": self.addr,
            "peer": peer,
            "results": self.results.iter().map(Outcome::to_json).collect::<Vec<_>>(),
            "passed": self.count(Status::Pass),
            "failed": self.count(Status::Fail),
            "skipped": self.count(Status::Skip),
            "duration": u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX),
            "warnings": self.warnings().iter().map(|(name, c)| json!({
                "name": name,
                "what": c.what,
                "detail": c.detail,
            })).collect::<Vec<_>>(),
        })
    }
}

/// `s` on one line (newlines as spaces).
fn one_line(s: &str) -> String {
    s.lines().collect::<Vec<_>>().join(" ")
}

/// The first `max` bytes of `s` on a char boundary, with `… (N bytes)` when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::SCENARIOS;

    #[test]
    fn status_from_checks() {
        let s = &SCENARIOS[0];
        assert_eq!(Outcome::ran(s, vec![Check::pass("a")]).status, Status::Pass);
        let o = Outcome::ran(s, vec![Check::pass("a"), Check::fail("b", "why")]);
        assert_eq!(o.status, Status::Fail);
        assert_eq!(o.reason.as_deref(), Some("b: why"));
        assert_eq!(Outcome::ran(s, vec![]).status, Status::Fail);
    }

    #[test]
    fn text_is_aligned_and_summarised() {
        let r = Report {
            results: vec![
                Outcome::ran(&SCENARIOS[0], vec![Check::pass("a")]),
                Outcome::ran(&SCENARIOS[6], vec![Check::fail("ack arrives", "none")]),
                Outcome::skipped(&SCENARIOS[12], "no blob cap"),
            ],
            ..Report::default()
        };
        let lines = r.render_text();
        assert!(lines[0].starts_with("  ok    handshake  "));
        assert!(lines[1].starts_with("  FAIL  msg-ack    "));
        assert_eq!(lines[2], "          - ack arrives: none");
        assert!(lines[3].starts_with("  skip  chunk      "));
        assert_eq!(lines.last().unwrap(), "1 passed, 1 failed, 1 skipped");
        // The section column starts at the same offset on every scenario line.
        let col = |l: &str| l.find('§').unwrap();
        assert_eq!(col(&lines[0]), col(&lines[1]));
        assert_eq!(col(&lines[0]), col(&lines[3]));
    }

    #[test]
    fn a_strict_check_that_fails_is_a_warning_not_a_failure() {
        let s = &SCENARIOS[14];
        let o = Outcome::ran(
            s,
            vec![Check::pass("a"), Check::strict("re = ours", false, "no re")],
        );
        assert_eq!(o.status, Status::Pass);
        assert_eq!(o.reason, None);
        let r = Report {
            results: vec![o],
            ..Report::default()
        };
        assert_eq!(r.warnings().len(), 1);
        assert!(r.success());
        assert_eq!(r.summary(), "1 passed, 0 failed, 0 skipped, 1 warning");
        let v = r.to_json();
        assert_eq!(v["warnings"][0]["what"], "re = ours");
        assert_eq!(v["results"][0]["checks"].as_array().unwrap().len(), 1);
        // A strict check never rescues a scenario whose other checks failed.
        let o = Outcome::ran(
            s,
            vec![Check::strict("x", false, ""), Check::fail("b", "why")],
        );
        assert_eq!(o.reason.as_deref(), Some("b: why"));
    }

    #[test]
    fn clip_cuts_on_char_boundary() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("aéb", 2), "a… (4 bytes)");
    }
}
