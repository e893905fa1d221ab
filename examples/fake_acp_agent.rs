//! A scripted ACP agent for the tests of `awp serve-agent --acp` and `awp acp`
//! (tests/acp.rs): newline-delimited JSON-RPC on stdin/stdout, no model.
//!
//! The first text block of a prompt picks what it does:
//! - `crash`: exits at once (status 3), mid-prompt.
//! - `flood`: writes 10 000 lines `y` (no JSON), then hangs without answering (10 min
//!   at most), like `yes` run as an agent.
//! - `wait`: answers nothing until `session/cancel` for its session, then `cancelled`
//!   (other sessions are served meanwhile).
//! - `perm` / `perm-exec`: asks `session/request_permission` for an `edit` / `execute` tool
//!   call (options `ok` allow_once, `no` reject_once), then says `permission: ID` (or
//!   `permission: cancelled`) and ends the turn.
//! - `read PATH` / `write PATH TEXT`: calls `fs/read_text_file` / `fs/write_text_file` and
//!   says `read: CONTENT`, `wrote` or `fs error: MESSAGE`.
//! - `burst N`: N text chunks `<0>`, `<1>`, … back to back, then `end_turn`.
//! - `refuse`: ends with `refusal`.
//! - anything else: a plan, a tool call and its update, then `echo: TEXT` in three chunks,
//!   one `link: URI` per resource link, and `end_turn`.
//!
//! With `FAKE_ACP_LOG=FILE` it appends `start` to FILE when it starts.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, Write};

struct Io {
    rx: std::sync::mpsc::Receiver<Value>,
    deferred: VecDeque<Value>,
    next_id: u64,
}

fn send(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn respond(id: &Value, result: Value) {
    send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
}

fn update(session: &str, update: Value) {
    send(
        &json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}}),
    );
}

fn say(session: &str, text: &str) {
    update(
        session,
        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
    );
}

impl Io {
    fn recv(&mut self) -> Value {
        match self.rx.recv() {
            Ok(v) => v,
            Err(_) => std::process::exit(0),
        }
    }
    /// Send a request and wait for its response; other messages wait for later.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == id {
                return m;
            }
            self.deferred.push_back(m);
        }
    }
}

fn main() {
    if let Ok(log) = std::env::var("FAKE_ACP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "start");
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Value>(&line) {
                Ok(v) => {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
                Err(e) => eprintln!("fake agent: bad line: {e}"),
            }
        }
    });
    let mut io = Io {
        rx,
        deferred: VecDeque::new(),
        next_id: 0,
    };
    let mut sessions = 0u64;
    // Prompts waiting for their session's cancel: session id → request id.
    let mut waiting: std::collections::HashMap<String, Value> = Default::default();
    loop {
        let m = match io.deferred.pop_front() {
            Some(m) => m,
            None => io.recv(),
        };
        let id = m["id"].clone();
        match m["method"].as_str() {
            Some("initialize") => respond(
                &id,
                json!({"protocolVersion": 1, "agentCapabilities": {}, "authMethods": [],
                       "agentInfo": {"name": "fake-acp-agent", "version": "0"}}),
            ),
            Some("session/new") => {
                sessions += 1;
                respond(&id, json!({"sessionId": format!("s{sessions}")}));
            }
            Some("session/prompt") => {
                let session = m["params"]["sessionId"].as_str().unwrap_or("").to_string();
                let blocks = m["params"]["prompt"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let text = blocks
                    .iter()
                    .find(|b| b["type"] == "text")
                    .and_then(|b| b["text"].as_str())
                    .unwrap_or("")
                    .to_string();
                if text == "wait" {
                    say(&session, "waiting for cancel");
                    waiting.insert(session, id);
                    continue;
                }
                let stop = prompt(&mut io, &session, &text, &blocks);
                respond(&id, json!({"stopReason": stop}));
            }
            Some("session/cancel") => {
                let session = m["params"]["sessionId"].as_str().unwrap_or("");
                if let Some(id) = waiting.remove(session) {
                    respond(&id, json!({"stopReason": "cancelled"}));
                }
            }
            Some(_) if !id.is_null() => send(
                &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}),
            ),
            _ => {}
        }
    }
}

fn prompt(io: &mut Io, session: &str, text: &str, blocks: &[Value]) -> &'static str {
    let words: Vec<&str> = text.splitn(3, ' ').collect();
    match words[0] {
        "crash" => std::process::exit(3),
        "flood" => {
            let mut out = std::io::stdout().lock();
            for _ in 0..10_000 {
                if writeln!(out, "y").is_err() {
                    break;
                }
            }
            let _ = out.flush();
            drop(out);
            std::thread::sleep(std::time::Duration::from_secs(600));
            std::process::exit(0)
        }
        "burst" => {
            // `burst N`: N text chunks back to back, then end_turn.
            let n: usize = words.get(1).and_then(|w| w.parse().ok()).unwrap_or(0);
            for i in 0..n.min(100_000) {
                say(session, &format!("<{i}>"));
            }
            "end_turn"
        }
        "refuse" => "refusal",
        "perm" | "perm-exec" => {
            let kind = if words[0] == "perm" {
                "edit"
            } else {
                "execute"
            };
            let r = io.call(
                "session/request_permission",
                json!({"sessionId": session,
                       "toolCall": {"toolCallId": "t1", "title": "Change notes.txt", "kind": kind},
                       "options": [
                           {"optionId": "ok", "name": "Allow", "kind": "allow_once"},
                           {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}),
            );
            let outcome = &r["result"]["outcome"];
            let said = match outcome["outcome"].as_str() {
                Some("selected") => outcome["optionId"].as_str().unwrap_or("?").to_string(),
                _ => "cancelled".to_string(),
            };
            say(session, &format!("permission: {said}"));
            "end_turn"
        }
        "read" => {
            let r = io.call(
                "fs/read_text_file",
                json!({"sessionId": session, "path": words.get(1).copied().unwrap_or("")}),
            );
            match r["result"]["content"].as_str() {
                Some(c) => say(session, &format!("read: {c}")),
                None => say(session, &format!("fs error: {}", r["error"])),
            }
            "end_turn"
        }
        "write" => {
            let r = io.call(
                "fs/write_text_file",
                json!({"sessionId": session, "path": words.get(1).copied().unwrap_or(""),
                       "content": words.get(2).copied().unwrap_or("")}),
            );
            if r.get("error").is_some() {
                say(session, &format!("fs error: {}", r["error"]));
            } else {
                say(session, "wrote");
            }
            "end_turn"
        }
        _ => {
            update(
                session,
                json!({"sessionUpdate": "plan", "entries": [{"content": "answer", "priority": "medium", "status": "in_progress"}]}),
            );
            update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Think", "kind": "think", "status": "pending"}),
            );
            update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}),
            );
            let reply: Vec<char> = format!("echo: {text}").chars().collect();
            let third = reply.len().div_ceil(3).max(1);
            for part in reply.chunks(third) {
                say(session, &part.iter().collect::<String>());
            }
            for b in blocks.iter().filter(|b| b["type"] == "resource_link") {
                say(
                    session,
                    &format!("\nlink: {}", b["uri"].as_str().unwrap_or("")),
                );
            }
            "end_turn"
        }
    }
}
