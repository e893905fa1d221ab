//! The pure part of the ACP bridge: how AWP msg parts become ACP prompt content, how ACP
//! `session/update`s become AWP progress, and how a peer's answer selects a permission
//! option. No I/O here; [`super::serve`] and [`super::agent`] do the moving.
//!
//! Rules (issue 11 §2): text/code/data parts → `text` content blocks, blob parts →
//! `resource_link`s to the received files; `agent_message_chunk` text is coalesced into at
//! most one progress msg per [`COALESCE_INTERVAL`] or per [`COALESCE_BYTES`];
//! `tool_call`/`tool_call_update` become one short line each; `plan` becomes a data part of
//! mime [`PLAN_MIME`]; the prompt's `stopReason` becomes the AWP state `done` (`end_turn`)
//! or `failed` (anything else) with a note.

use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Coalesced agent text is sent at most this often…
pub const COALESCE_INTERVAL: Duration = Duration::from_millis(500);
/// …unless this many bytes are waiting (then at once).
pub const COALESCE_BYTES: usize = 4096;
/// Mime of the data part that carries an ACP `plan` (its `entries` as the agent sent them).
pub const PLAN_MIME: &str = "application/vnd.acp.plan+json";
/// Mime of the data part that carries an ACP permission request to the peer
/// (`{toolCall, options:[{optionId, name, kind}]}`).
pub const PERMISSION_MIME: &str = "application/vnd.acp.permission+json";
/// Longest tool line sent, in characters (longer titles are cut with `…`).
pub const MAX_TOOL_LINE: usize = 200;
/// Largest text one prompt carries from one msg, in bytes (the wire caps a line at 1 MiB).
pub const MAX_PROMPT_TEXT: usize = 1024 * 1024;

/// Whether a msg part belongs to the node itself, never a prompt: a served request
/// (`application/vnd.awp.<cap>+json` data part: exec, fs:read, fs:write) or an artifact
/// thread's command, result or event (`application/vnd.artifactr.…`).
pub fn is_served_request(part: &Value) -> bool {
    part["k"] == "data"
        && part["mime"].as_str().is_some_and(|m| {
            (m.starts_with("application/vnd.awp.") && m.ends_with("+json"))
                || m.starts_with("application/vnd.artifactr.")
        })
}

/// The ACP prompt (`ContentBlock` JSON objects) for the parts of one AWP msg. `blob_path`
/// maps a blob part's `ref` to the received file (None: not complete; the link then names
/// the blob by `awp-blob:REF`). Unknown part kinds are skipped.
pub fn prompt_blocks(parts: &[Value], blob_path: impl Fn(&str) -> Option<String>) -> Vec<Value> {
    let mut out = Vec::new();
    for p in parts {
        match p["k"].as_str() {
            Some("text") => {
                if let Some(t) = p["text"].as_str() {
                    out.push(json!({"type": "text", "text": cut(t, MAX_PROMPT_TEXT)}));
                }
            }
            Some("code") => {
                if let Some(t) = p["text"].as_str() {
                    let lang = p["lang"].as_str().unwrap_or("");
                    let t = cut(t, MAX_PROMPT_TEXT);
                    out.push(json!({"type": "text", "text": format!("```{lang}\n{t}\n```")}));
                }
            }
            Some("data") => {
                let mime = p["mime"].as_str().unwrap_or("application/json");
                let text = cut(&p["data"].to_string(), MAX_PROMPT_TEXT).to_string();
                out.push(json!({"type": "text", "text": format!("data ({mime}):\n{text}")}));
            }
            Some("blob") => {
                let Some(r) = p["ref"].as_str() else { continue };
                let name = p["name"].as_str().unwrap_or(r);
                let uri = match blob_path(r) {
                    Some(path) => file_uri(&path),
                    None => format!("awp-blob:{r}"),
                };
                let mut link = json!({"type": "resource_link", "name": name, "uri": uri});
                if let Some(m) = p["mime"].as_str() {
                    link["mimeType"] = json!(m);
                }
                if let Some(s) = p["size"].as_u64() {
                    link["size"] = json!(s);
                }
                out.push(link);
            }
            _ => {}
        }
    }
    out
}

/// `file://` URI of an absolute path (bytes outside unreserved characters and `/`
/// percent-encoded).
pub fn file_uri(path: &str) -> String {
    let mut s = String::from("file://");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

/// What one `session/update` (its `update` object, as JSON) asks of the AWP side.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Agent text to coalesce.
    Text(String),
    /// One short progress line (tool calls).
    Line(String),
    /// A data part (plans): `(mime, data)`.
    Data(&'static str, Value),
    /// Nothing for the peer.
    None,
}

/// Map one `session/update` object (`{"sessionUpdate": KIND, …}`).
pub fn progress_of(update: &Value) -> Progress {
    match update["sessionUpdate"].as_str() {
        Some("agent_message_chunk") => match content_text(&update["content"]) {
            Some(t) => Progress::Text(t),
            None => Progress::None,
        },
        Some("tool_call") | Some("tool_call_update") => {
            let title = update["title"].as_str().unwrap_or("");
            let id = update["toolCallId"].as_str().unwrap_or("?");
            let mut line = String::from("tool");
            if let Some(kind) = update["kind"].as_str() {
                line.push_str(&format!(" [{kind}]"));
            }
            if title.is_empty() {
                line.push_str(&format!(" {id}"));
            } else {
                line.push_str(&format!(" {title}"));
            }
            if let Some(status) = update["status"].as_str() {
                line.push_str(&format!(": {status}"));
            }
            let line: String = if line.chars().count() > MAX_TOOL_LINE {
                let mut l: String = line.chars().take(MAX_TOOL_LINE - 1).collect();
                l.push('…');
                l
            } else {
                line
            };
            Progress::Line(line)
        }
        Some("plan") => Progress::Data(PLAN_MIME, json!({"entries": update["entries"]})),
        _ => Progress::None,
    }
}

/// The text of a `ContentBlock` (text blocks only; a resource link as its URI).
pub fn content_text(block: &Value) -> Option<String> {
    match block["type"].as_str() {
        Some("text") => block["text"].as_str().map(str::to_string),
        Some("resource_link") => block["uri"].as_str().map(|u| format!("<{u}>")),
        _ => None,
    }
}

/// The AWP state and note for a prompt's `stopReason`: `done` for `end_turn`, else
/// `failed` with the reason as the note.
pub fn stop_state(stop_reason: &str) -> (&'static str, String) {
    match stop_reason {
        "end_turn" => ("done", "end_turn".into()),
        other => ("failed", format!("the agent stopped: {other}")),
    }
}

/// Agent text waiting to go to the peer: at most one msg per [`COALESCE_INTERVAL`], or at
/// once when [`COALESCE_BYTES`] are waiting.
#[derive(Debug)]
pub struct Coalescer {
    buf: String,
    last: Option<Instant>,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    /// Empty, with nothing sent yet.
    pub fn new() -> Coalescer {
        Coalescer {
            buf: String::new(),
            last: None,
        }
    }
    /// Add `text` at `now`; returns the text to send now, if the rule says so.
    pub fn push(&mut self, text: &str, now: Instant) -> Option<String> {
        self.buf.push_str(text);
        self.poll(now)
    }
    /// The text to send at `now` (called on a timer), if any is due.
    pub fn poll(&mut self, now: Instant) -> Option<String> {
        if self.buf.is_empty() {
            return None;
        }
        let due = self.buf.len() >= COALESCE_BYTES
            || self
                .last
                .is_none_or(|l| now.duration_since(l) >= COALESCE_INTERVAL);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(self.take_chunk())
    }
    /// Everything waiting (end of a turn), if any.
    pub fn flush(&mut self, now: Instant) -> Option<String> {
        if self.buf.is_empty() {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.buf))
    }
    /// Whether text is waiting.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    fn take_chunk(&mut self) -> String {
        // A very long burst goes out in msgs of a bounded size.
        const MAX_MSG: usize = 256 * 1024;
        if self.buf.len() <= MAX_MSG {
            return std::mem::take(&mut self.buf);
        }
        let head = cut(&self.buf, MAX_MSG).len();
        let rest = self.buf.split_off(head);
        std::mem::replace(&mut self.buf, rest)
    }
}

/// The option a peer's answer selects among a permission request's `options`
/// (`[{optionId, name, kind}]`): `allow`/`yes` → the first `allow_once` (else
/// `allow_always`) option, `deny`/`no` → the first `reject_once` (else `reject_always`),
/// anything else must equal an `optionId`. Case and surrounding space are ignored for the
/// words; None when nothing matches.
pub fn answer_option(answer: &str, options: &[Value]) -> Option<String> {
    let a = answer.trim();
    let by_kinds = |kinds: &[&str]| {
        kinds.iter().find_map(|k| {
            options
                .iter()
                .find(|o| o["kind"] == *k)
                .and_then(|o| o["optionId"].as_str().map(str::to_string))
        })
    };
    match a.to_ascii_lowercase().as_str() {
        "allow" | "yes" | "y" => return by_kinds(&["allow_once", "allow_always"]),
        "deny" | "no" | "n" => return by_kinds(&["reject_once", "reject_always"]),
        _ => {}
    }
    options
        .iter()
        .find(|o| o["optionId"] == a)
        .and_then(|o| o["optionId"].as_str().map(str::to_string))
}

/// The grant a tool call needs to be approved without asking: `fs:write` for `edit`,
/// `delete` and `move`, `exec` for `execute`; None for other kinds (always asked).
pub fn cap_for_tool_kind(kind: Option<&str>) -> Option<&'static str> {
    match kind? {
        "edit" | "delete" | "move" => Some("fs:write"),
        "execute" => Some("exec"),
        _ => None,
    }
}

/// The option to pick without asking, when the peer holds the grant the tool call's kind
/// needs (`caps`: the peer's honored capabilities here): the first allow option.
pub fn auto_approval(tool_call: &Value, options: &[Value], caps: &[String]) -> Option<String> {
    let need = cap_for_tool_kind(tool_call["kind"].as_str())?;
    if !caps.iter().any(|c| c == need) {
        return None;
    }
    answer_option("allow", options)
}

/// The question sent to the peer for a permission request: one line naming the tool call
/// and how to answer.
pub fn permission_question(tool_call: &Value, options: &[Value]) -> String {
    let title = tool_call["title"]
        .as_str()
        .or(tool_call["toolCallId"].as_str())
        .unwrap_or("a tool call");
    let kind = tool_call["kind"].as_str().unwrap_or("other");
    let ids: Vec<&str> = options
        .iter()
        .filter_map(|o| o["optionId"].as_str())
        .collect();
    format!(
        "The agent asks permission for {} [{kind}]. Reply `allow`, `deny` or one of: {}",
        cut(title, MAX_TOOL_LINE),
        ids.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_become_prompt_blocks() {
        let parts = vec![
            json!({"k": "text", "text": "hi"}),
            json!({"k": "code", "text": "fn x() {}", "lang": "rust"}),
            json!({"k": "data", "data": {"a": 1}, "mime": "application/json"}),
            json!({"k": "blob", "ref": "r1", "name": "a b.txt", "size": 3, "mime": "text/plain"}),
            json!({"k": "blob", "ref": "r2", "name": "late"}),
            json!({"k": "weird"}),
        ];
        let blocks = prompt_blocks(&parts, |r| (r == "r1").then(|| "/h/in/a b.txt".to_string()));
        assert_eq!(blocks.len(), 5);
        assert_eq!(blocks[0], json!({"type": "text", "text": "hi"}));
        assert_eq!(blocks[1]["text"], "```rust\nfn x() {}\n```");
        assert_eq!(blocks[2]["text"], "data (application/json):\n{\"a\":1}");
        assert_eq!(blocks[3]["type"], "resource_link");
        assert_eq!(blocks[3]["uri"], "file:///h/in/a%20b.txt");
        assert_eq!(blocks[3]["size"], 3);
        assert_eq!(blocks[4]["uri"], "awp-blob:r2");
    }

    #[test]
    fn prompt_text_is_capped_at_a_char_boundary() {
        let long = format!("{}é", "x".repeat(MAX_PROMPT_TEXT - 1));
        let blocks = prompt_blocks(&[json!({"k": "text", "text": long})], |_| None);
        assert_eq!(
            blocks[0]["text"].as_str().unwrap().len(),
            MAX_PROMPT_TEXT - 1
        );
        let blocks = prompt_blocks(
            &[json!({"k": "text"}), json!({"k": "blob", "name": "no ref"})],
            |_| None,
        );
        assert!(blocks.is_empty(), "{blocks:?}");
    }

    #[test]
    fn served_requests_are_not_prompts() {
        assert!(is_served_request(
            &json!({"k": "data", "mime": "application/vnd.awp.exec+json", "data": {}})
        ));
        assert!(is_served_request(
            &json!({"k": "data", "mime": crate::artifact::MIME_COMMAND, "data": {}})
        ));
        assert!(!is_served_request(
            &json!({"k": "data", "mime": "application/json", "data": {}})
        ));
        assert!(!is_served_request(
            &json!({"k": "text", "text": "application/vnd.awp.exec+json"})
        ));
    }

    #[test]
    fn coalescer_sends_at_most_one_msg_per_interval_or_per_4k() {
        let t0 = Instant::now();
        let mut c = Coalescer::new();
        assert_eq!(c.push("a", t0).as_deref(), Some("a"));
        assert_eq!(c.push("b", t0 + Duration::from_millis(100)), None);
        assert_eq!(c.push("c", t0 + Duration::from_millis(499)), None);
        assert_eq!(
            c.poll(t0 + Duration::from_millis(500)).as_deref(),
            Some("bc")
        );
        assert_eq!(c.poll(t0 + Duration::from_millis(2000)), None);
        // 4 KiB waiting goes at once, even inside the interval.
        let big = "x".repeat(COALESCE_BYTES);
        assert_eq!(c.push(&big, t0 + Duration::from_millis(501)), Some(big));
        assert_eq!(c.push("tail", t0 + Duration::from_millis(502)), None);
        assert_eq!(
            c.flush(t0 + Duration::from_millis(503)).as_deref(),
            Some("tail")
        );
        assert!(c.is_empty());
        assert_eq!(c.flush(t0 + Duration::from_millis(504)), None);
    }

    #[test]
    fn updates_become_progress() {
        let chunk = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hel"}});
        assert_eq!(progress_of(&chunk), Progress::Text("hel".into()));
        let tool = json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit a.rs", "kind": "edit", "status": "pending"});
        assert_eq!(
            progress_of(&tool),
            Progress::Line("tool [edit] Edit a.rs: pending".into())
        );
        let upd =
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"});
        assert_eq!(
            progress_of(&upd),
            Progress::Line("tool t1: completed".into())
        );
        let long =
            json!({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x".repeat(5000)});
        match progress_of(&long) {
            Progress::Line(l) => assert_eq!(l.chars().count(), MAX_TOOL_LINE),
            other => panic!("{other:?}"),
        }
        let plan = json!({"sessionUpdate": "plan", "entries": [{"content": "a", "priority": "high", "status": "pending"}]});
        assert_eq!(
            progress_of(&plan),
            Progress::Data(
                PLAN_MIME,
                json!({"entries": [{"content": "a", "priority": "high", "status": "pending"}]})
            )
        );
        assert_eq!(
            progress_of(&json!({"sessionUpdate": "usage_update"})),
            Progress::None
        );
    }

    #[test]
    fn stop_reasons_map_to_states() {
        assert_eq!(stop_state("end_turn").0, "done");
        for r in ["refusal", "max_tokens", "max_turn_requests", "cancelled"] {
            let (s, note) = stop_state(r);
            assert_eq!(s, "failed");
            assert!(note.contains(r), "{note}");
        }
    }

    fn options() -> Vec<Value> {
        vec![
            json!({"optionId": "ok1", "name": "Allow", "kind": "allow_once"}),
            json!({"optionId": "always", "name": "Always", "kind": "allow_always"}),
            json!({"optionId": "no1", "name": "Reject", "kind": "reject_once"}),
        ]
    }

    #[test]
    fn answers_select_options() {
        let o = options();
        assert_eq!(answer_option(" Allow ", &o).as_deref(), Some("ok1"));
        assert_eq!(answer_option("deny", &o).as_deref(), Some("no1"));
        assert_eq!(answer_option("always", &o).as_deref(), Some("always"));
        assert_eq!(answer_option("maybe", &o), None);
        assert_eq!(answer_option("deny", &o[..2]), None);
    }

    #[test]
    fn auto_approval_needs_the_matching_grant() {
        let o = options();
        let edit = json!({"toolCallId": "t", "kind": "edit"});
        let exec = json!({"toolCallId": "t", "kind": "execute"});
        let read = json!({"toolCallId": "t", "kind": "read"});
        let w = vec!["fs:write".to_string()];
        let x = vec!["exec".to_string()];
        assert_eq!(auto_approval(&edit, &o, &w).as_deref(), Some("ok1"));
        assert_eq!(auto_approval(&edit, &o, &x), None);
        assert_eq!(auto_approval(&exec, &o, &x).as_deref(), Some("ok1"));
        assert_eq!(auto_approval(&exec, &o, &w), None);
        assert_eq!(
            auto_approval(&read, &o, &[w[0].clone(), x[0].clone()]),
            None
        );
        assert!(permission_question(&edit, &o).contains("ok1, always, no1"));
    }
}
