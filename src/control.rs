//! The local control protocol between the `awp` CLI and its node: NDJSON over the unix
//! socket `$AWP_HOME/awp.sock` (mode 0600; a short private runtime path recorded in the
//! home when that path is too long for a unix socket).
//!
//! One request per line; one response line per request, except `subscribe`, which answers
//! `{"ok":true}` and then streams [`Event`] lines until the client closes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest control line accepted by the node, in bytes (a msg line plus framing).
pub const MAX_CONTROL_LINE: usize = 2 * 1024 * 1024;

/// A CLI → node request. `peer` arguments are a full key, a name, or a unique key prefix of
/// at least 4 characters (with or without `ed25519:`); the node resolves them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Node status: key, name, addresses, pid, uptime, peers up, outbox size.
    Status,
    /// Key, name, fingerprint.
    Whoami,
    /// Addresses another host can dial.
    Address,
    /// Dial an address now and wait for the handshake (or failure) up to `timeout_ms`.
    Connect {
        address: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Queue a msg. New thread when `th` is None (the node allocates `thr_<ulid>`).
    /// `peer` may be omitted when `th` names an existing thread.
    Send {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        re: Option<String>,
        /// Wire parts (`{"k":"text",…}` etc.).
        parts: Vec<Value>,
        /// Wait up to this long for the peer's ack; the response says `delivered` or
        /// `queued`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ack_ms: Option<u64>,
    },
    /// Queue a state line for a thread.
    State {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        th: String,
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ack_ms: Option<u64>,
    },
    /// All threads.
    Threads,
    /// All known peers with connection state.
    Peers,
    /// Unread inbound entries (of one thread when `th`), marking them read unless `mark`
    /// is false.
    Read {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
        #[serde(default = "yes")]
        mark: bool,
    },
    /// Stream events. `from_seq`: first replay log entries with seq > from_seq (tail's
    /// history), then live events. Filters: thread, peer.
    Subscribe {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_seq: Option<u64>,
    },
    /// Stop the node (answers, then exits).
    Shutdown,
}

fn yes() -> bool {
    true
}

/// A node → CLI response: `{"ok":true, …result fields}` or
/// `{"ok":false,"error":{"code":…,"message":…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ControlError>,
    /// Result fields (an object) when ok.
    #[serde(flatten)]
    pub body: serde_json::Map<String, Value>,
}

/// A failed request. `code` is one of: `bad_request`, `no_such_peer`, `ambiguous_peer`,
/// `no_such_thread`, `connect_failed`, `internal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlError {
    pub code: String,
    pub message: String,
}

/// A streamed event (subscribe, and `awp listen` output).
///
/// Shapes:
/// - `{"event":"line","seq":N,"dir":"in"|"out","peer":KEY,"peer_name":NAME?,"th":TH?,
///   "id":ID,"t":"msg"|"state"|…,"line":<the wire line as JSON>,"at":RFC3339}` — a content
///   line stored in the log (inbound: received; outbound: queued).
/// - `{"event":"ack","peer":KEY,"th":TH,"re":ID}` — our line was acked by the peer.
/// - `{"event":"peer_up"|"peer_down","peer":KEY,"peer_name":NAME?,"remote":ADDR?,"reason":…?}`
/// - `{"event":"listening","address":ADDR,"addresses":[ADDR…],"key":KEY,"name":NAME}`
///   (first line of `awp listen`).
pub type Event = serde_json::Map<String, Value>;

impl Response {
    /// A success with `body` fields (must be a JSON object; other values go under `result`).
    pub fn ok(body: Value) -> Response {
        let body = match body {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            other => {
                let mut m = serde_json::Map::new();
                m.insert("result".into(), other);
                m
            }
        };
        Response {
            ok: true,
            error: None,
            body,
        }
    }
    /// A failure.
    pub fn err(code: &str, message: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(ControlError {
                code: code.into(),
                message: message.into(),
            }),
            body: serde_json::Map::new(),
        }
    }
}
