//! JSON-RPC 2.0 of the Roll Runtime Protocol v1: request envelopes, strict parameter
//! types, error objects with `rollCode` and `retryable`, and UUID checks.
//!
//! Source: `../shared/seeds/roll-runtime-protocol.schema.json` (`$defs.*Params`,
//! `errorResponse`, `runtimeProtocolErrorData`). The schema leaves the JSON-RPC `code`
//! numbers and the meaning of `retryable` open; this front's choices are in
//! `spec/roll-front.md` and in [`RollCode::code`] / [`RollError::retryable`].

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The only protocol version this front speaks (`initializeResult.protocolVersion`).
pub const PROTOCOL_VERSION: &str = "1.0";
/// Largest request frame accepted, in bytes without the `\n` (`limits.maxFrameBytes`).
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// Largest page of `thread.list` / `thread.snapshot` (`limits.maxPageSize`, the schema's
/// `limit` maximum).
pub const MAX_PAGE: u64 = 500;
/// Default page size (the schema's `limit` default).
pub const DEFAULT_PAGE: u64 = 100;
/// Largest `turn.start` input text, in bytes (it travels as one AWP msg, whose line is
/// capped at 1 MiB by protocol-notes §Framing).
pub const MAX_INPUT_BYTES: usize = 512 * 1024;
/// Longest approval `reason`, in bytes.
pub const MAX_REASON_BYTES: usize = 4096;

/// JSON-RPC 2.0 parse error (the frame is not JSON).
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC 2.0 invalid request (not a request object).
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC 2.0 method not found.
pub const METHOD_NOT_FOUND: i64 = -32601;

/// The schema's `runtimeProtocolErrorData.rollCode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollCode {
    /// `initialize` named no version this front speaks (only `1.0`).
    ProtocolVersionUnsupported,
    /// A method other than `initialize` before a successful `initialize`.
    InitializeRequired,
    /// Parameters that do not match the method's `$defs.*Params`, or break a limit.
    InvalidParams,
    /// No Roll thread with that id (never created here, or deleted).
    ThreadNotFound,
    /// The thread has an active turn and cannot be deleted now.
    ThreadBusy,
    /// No turn with that id in that thread, or it is not the active one.
    TurnNotFound,
    /// `turn.start` while another turn of the thread is running.
    TurnAlreadyActive,
    /// No pending approval with that id in that turn.
    ApprovalNotFound,
    /// A feature this front does not offer.
    CapabilityUnavailable,
    /// The front is shutting down (SIGTERM/SIGINT): start a new runtime.
    RuntimeClosing,
    /// The node was asked but did not answer: the change may or may not be stored.
    OutcomeUnknown,
    /// The node refused or failed, or is not running.
    InternalError,
}

impl RollCode {
    /// The schema's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RollCode::ProtocolVersionUnsupported => "PROTOCOL_VERSION_UNSUPPORTED",
            RollCode::InitializeRequired => "INITIALIZE_REQUIRED",
            RollCode::InvalidParams => "INVALID_PARAMS",
            RollCode::ThreadNotFound => "THREAD_NOT_FOUND",
            RollCode::ThreadBusy => "THREAD_BUSY",
            RollCode::TurnNotFound => "TURN_NOT_FOUND",
            RollCode::TurnAlreadyActive => "TURN_ALREADY_ACTIVE",
            RollCode::ApprovalNotFound => "APPROVAL_NOT_FOUND",
            RollCode::CapabilityUnavailable => "CAPABILITY_UNAVAILABLE",
            RollCode::RuntimeClosing => "RUNTIME_CLOSING",
            RollCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            RollCode::InternalError => "INTERNAL_ERROR",
        }
    }

    /// The JSON-RPC `error.code` used with this roll code: the JSON-RPC 2.0 reserved codes
    /// where one fits (-32602 invalid params, -32603 internal error), else one of the
    /// implementation-defined server errors -32001..-32010 (spec/roll-front.md).
    pub fn code(self) -> i64 {
        match self {
            RollCode::ProtocolVersionUnsupported => -32001,
            RollCode::InitializeRequired => -32002,
            RollCode::InvalidParams => -32602,
            RollCode::ThreadNotFound => -32003,
            RollCode::ThreadBusy => -32004,
            RollCode::TurnNotFound => -32005,
            RollCode::TurnAlreadyActive => -32006,
            RollCode::ApprovalNotFound => -32007,
            RollCode::CapabilityUnavailable => -32008,
            RollCode::RuntimeClosing => -32009,
            RollCode::OutcomeUnknown => -32010,
            RollCode::InternalError => -32603,
        }
    }

    /// Whether the same request may succeed later, unchanged: true for THREAD_BUSY and
    /// TURN_ALREADY_ACTIVE (once the active turn ends) and RUNTIME_CLOSING (on a new
    /// runtime); INTERNAL_ERROR decides per case ([`RollError::retryable`]); false for the
    /// rest — OUTCOME_UNKNOWN included: read the thread first (`thread.snapshot`), the
    /// change may have happened.
    pub fn default_retryable(self) -> bool {
        matches!(
            self,
            RollCode::ThreadBusy | RollCode::TurnAlreadyActive | RollCode::RuntimeClosing
        )
    }
}

/// A failed request: a roll code, a message, whether to retry, optional details.
#[derive(Debug, Clone, PartialEq)]
pub struct RollError {
    /// The schema's `rollCode`.
    pub code: RollCode,
    /// What went wrong (`error.message`).
    pub message: String,
    /// `error.data.retryable`.
    pub retryable: bool,
    /// `error.data.details` (any JSON), when there is something to add.
    pub details: Option<Value>,
}

impl RollError {
    /// An error with the code's default `retryable`.
    pub fn new(code: RollCode, message: impl Into<String>) -> RollError {
        RollError {
            code,
            message: message.into(),
            retryable: code.default_retryable(),
            details: None,
        }
    }
    /// INVALID_PARAMS.
    pub fn invalid(message: impl Into<String>) -> RollError {
        RollError::new(RollCode::InvalidParams, message)
    }
    /// The same error with `retryable` set.
    pub fn retryable(mut self, r: bool) -> RollError {
        self.retryable = r;
        self
    }
    /// The same error with `details`.
    pub fn details(mut self, d: Value) -> RollError {
        self.details = Some(d);
        self
    }
    /// The JSON-RPC `error` object.
    pub fn to_json(&self) -> Value {
        let mut data = json!({"rollCode": self.code.as_str(), "retryable": self.retryable});
        if let Some(d) = &self.details {
            data["details"] = d.clone();
        }
        json!({"code": self.code.code(), "message": self.message, "data": data})
    }
}

/// A success response line.
pub fn success(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response line (`id` null when the request's id could not be read).
pub fn failure(id: &Value, error: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// A JSON-RPC error object without roll data (parse error, invalid request, unknown
/// method).
pub fn plain_error(code: i64, message: &str) -> Value {
    json!({"code": code, "message": message})
}

/// A request frame as read: strict (duplicate keys and unknown members are refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope<'a> {
    /// Must be `"2.0"`.
    pub jsonrpc: String,
    /// String or number; absent for a notification.
    #[serde(default)]
    pub id: Option<Value>,
    /// The method name.
    pub method: String,
    /// Raw parameters, parsed by the method.
    #[serde(default, borrow)]
    pub params: Option<&'a RawValue>,
}

/// What a frame turned out to be.
#[derive(Debug)]
pub enum Frame<'a> {
    /// A request (with an id) or notification (without).
    Request(Envelope<'a>),
    /// Not a request: answer with this error object and `id` (null when unreadable).
    Bad { id: Value, error: Value },
}

/// Parse one frame (without its `\n`): JSON, then the envelope shape.
pub fn parse_frame(bytes: &[u8]) -> Frame<'_> {
    let v: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            return Frame::Bad {
                id: Value::Null,
                error: plain_error(PARSE_ERROR, &format!("parse error: {e}")),
            }
        }
    };
    // The id, when one is readable, so that even a malformed request gets its answer.
    let id = match v.get("id") {
        Some(i @ (Value::String(_) | Value::Number(_))) => i.clone(),
        _ => Value::Null,
    };
    let bad = |msg: String| Frame::Bad {
        id: id.clone(),
        error: plain_error(INVALID_REQUEST, &msg),
    };
    if !v.is_object() {
        return bad("a request is a JSON object".into());
    }
    let env: Envelope<'_> = match serde_json::from_slice(bytes) {
        Ok(e) => e,
        Err(e) => return bad(format!("invalid request: {e}")),
    };
    if env.jsonrpc != "2.0" {
        return bad("jsonrpc must be \"2.0\"".into());
    }
    match &env.id {
        None | Some(Value::String(_)) => {}
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() || n.is_f64() => {}
        Some(_) => return bad("id must be a string or a number".into()),
    }
    Frame::Request(env)
}

/// Whether `s` matches the schema's UUID pattern: hyphenated, 36 characters, version 1–8
/// and variant 10xx, or the nil UUID.
pub fn valid_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 36 {
        return false;
    }
    for (i, c) in b.iter().enumerate() {
        let hyphen = matches!(i, 8 | 13 | 18 | 23);
        if hyphen != (*c == b'-') || (!hyphen && !c.is_ascii_hexdigit()) {
            return false;
        }
    }
    if s == "00000000-0000-0000-0000-000000000000" {
        return true;
    }
    matches!(b[14], b'1'..=b'8') && matches!(b[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

/// Parse a method's params strictly into `T` (absent params read as `{}`).
pub fn params<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Result<T, RollError> {
    let text = raw.map_or("{}", RawValue::get);
    serde_json::from_str(text).map_err(|e| RollError::invalid(format!("invalid params: {e}")))
}

/// Check a UUID field.
pub fn uuid_field(name: &str, v: &str) -> Result<(), RollError> {
    if valid_uuid(v) {
        Ok(())
    } else {
        Err(RollError::invalid(format!("{name} is not a UUID")))
    }
}

fn default_page() -> u64 {
    DEFAULT_PAGE
}

/// Check a page `limit` (1..=[`MAX_PAGE`]).
pub fn page_limit(limit: u64) -> Result<usize, RollError> {
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit as usize)
    } else {
        Err(RollError::invalid(format!("limit must be 1..={MAX_PAGE}")))
    }
}

/// `$defs.initializeParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InitializeParams {
    pub protocol_versions: Vec<String>,
    pub client: ClientInfo,
}

/// `initializeParams.client`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientInfo {
    pub name: String,
    pub version: String,
}

/// `$defs.threadListParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadListParams {
    #[serde(default)]
    pub cursor: Option<String>,
    #[serde(default = "default_page")]
    pub limit: u64,
}

/// `$defs.threadCreateParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ThreadCreateParams {
    pub request_id: String,
    #[serde(default)]
    pub title: Option<String>,
}

/// `$defs.threadOpenParams` and `$defs.threadCapabilitiesParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ThreadIdParams {
    pub thread_id: String,
}

/// `$defs.threadSnapshotParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ThreadSnapshotParams {
    pub thread_id: String,
    #[serde(default)]
    pub message_before_sequence: Option<u64>,
    #[serde(default)]
    pub operation_before_sequence: Option<u64>,
    #[serde(default = "default_page")]
    pub limit: u64,
}

/// `$defs.threadRenameParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ThreadRenameParams {
    pub request_id: String,
    pub thread_id: String,
    pub title: String,
}

/// `$defs.threadDeleteParams` and `$defs.threadDetachParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ThreadRequestParams {
    pub request_id: String,
    pub thread_id: String,
}

/// `$defs.turnStartParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TurnStartParams {
    pub request_id: String,
    pub thread_id: String,
    pub turn_id: String,
    pub input: TurnInput,
}

/// `turnStartParams.input`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnInput {
    pub text: String,
}

/// `$defs.turnCancelParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TurnCancelParams {
    pub request_id: String,
    pub thread_id: String,
    pub turn_id: String,
}

/// `$defs.approvalRespondParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApprovalRespondParams {
    pub request_id: String,
    pub thread_id: String,
    pub turn_id: String,
    pub approval_id: String,
    pub decision: Decision,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `approvalRespondParams.decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approve,
    Reject,
}

/// `$defs.operationGetParams`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OperationGetParams {
    pub thread_id: String,
    pub operation_id: String,
}

/// The methods of `x-roll-methods`.
pub const METHODS: &[&str] = &[
    "initialize",
    "thread.list",
    "thread.create",
    "thread.open",
    "thread.snapshot",
    "thread.rename",
    "thread.delete",
    "thread.detach",
    "thread.capabilities",
    "turn.start",
    "turn.cancel",
    "approval.respond",
    "operation.get",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_pattern_as_the_schema_says() {
        assert!(valid_uuid("123e4567-e89b-42d3-a456-426614174000"));
        assert!(valid_uuid("00000000-0000-0000-0000-000000000000"));
        assert!(valid_uuid("123E4567-E89B-82D3-B456-426614174000"));
        for bad in [
            "",
            "123e4567e89b42d3a456426614174000",
            "{123e4567-e89b-42d3-a456-426614174000}",
            "123e4567-e89b-02d3-a456-426614174000",
            "123e4567-e89b-92d3-a456-426614174000",
            "123e4567-e89b-42d3-c456-426614174000",
            "123e4567-e89b-42d3-a456-42661417400g",
            "123e4567-e89b-42d3-a456_426614174000",
            "123e4567-e89b-42d3-a456-4266141740000",
        ] {
            assert!(!valid_uuid(bad), "{bad}");
        }
    }

    #[test]
    fn frames_that_are_not_requests() {
        let cases: &[(&[u8], i64, Value)] = &[
            (b"", PARSE_ERROR, Value::Null),
            (b"{", PARSE_ERROR, Value::Null),
            (b"\xff", PARSE_ERROR, Value::Null),
            (b"[1]", INVALID_REQUEST, Value::Null),
            (b"42", INVALID_REQUEST, Value::Null),
            (br#"{"id":1,"method":"x"}"#, INVALID_REQUEST, json!(1)),
            (
                br#"{"jsonrpc":"1.0","id":"a","method":"x"}"#,
                INVALID_REQUEST,
                json!("a"),
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","extra":1}"#,
                INVALID_REQUEST,
                json!(1),
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"x","method":"y"}"#,
                INVALID_REQUEST,
                json!(1),
            ),
            (
                br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                br#"{"jsonrpc":"2.0","id":2,"method":7}"#,
                INVALID_REQUEST,
                json!(2),
            ),
        ];
        for (bytes, code, id) in cases {
            match parse_frame(bytes) {
                Frame::Bad { id: got, error } => {
                    assert_eq!(error["code"], *code, "{}", String::from_utf8_lossy(bytes));
                    assert_eq!(&got, id);
                }
                Frame::Request(_) => panic!("accepted {}", String::from_utf8_lossy(bytes)),
            }
        }
        assert!(matches!(
            parse_frame(br#"{"jsonrpc":"2.0","method":"x"}"#),
            Frame::Request(Envelope { id: None, .. })
        ));
    }

    #[test]
    fn params_are_strict() {
        let raw = RawValue::from_string(r#"{"threadId":"x","extra":1}"#.into()).unwrap();
        assert!(params::<ThreadIdParams>(Some(&raw)).is_err());
        let dup = RawValue::from_string(r#"{"threadId":"a","threadId":"b"}"#.into()).unwrap();
        assert!(params::<ThreadIdParams>(Some(&dup)).is_err());
        let e = params::<ThreadIdParams>(None).unwrap_err();
        assert_eq!(e.code, RollCode::InvalidParams);
        let list: ThreadListParams = params(None).unwrap();
        assert_eq!(list.limit, DEFAULT_PAGE);
        assert!(page_limit(0).is_err() && page_limit(501).is_err() && page_limit(500).is_ok());
    }
}
