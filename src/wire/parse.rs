//! Strict line parsing and exact encoding (protocol-notes §Framing, §Envelope).
//!
//! Parsing goes in three steps: a strict JSON reader that builds a `Value` and refuses
//! duplicate keys at any depth; a lexical scan that refuses integers beyond ±(2^53−1)
//! anywhere in the line; then the typed decode of the line's `t`.

use super::types::*;
use super::{MAX_LINE, MAX_SAFE_INT};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Largest accepted `id`, `th` or `re` (and `seen` entries), in bytes, so that they are
/// safe to use as store keys.
pub const MAX_ID_LEN: usize = 256;

/// Why a line was refused. Every variant maps to an err code via [`FrameError::code`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    #[error("line is over {max} bytes")]
    TooLarge { max: usize },
    #[error("bad frame: {detail}")]
    BadFrame {
        detail: String,
        /// The line's `id` when one was readable (goes in the err's `re`).
        id: Option<String>,
    },
}

impl FrameError {
    /// `too_large` or `bad_frame`; both close the connection.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::TooLarge { .. } => super::code::TOO_LARGE,
            FrameError::BadFrame { .. } => super::code::BAD_FRAME,
        }
    }

    /// The offending line's id, when one was readable (for the err's `re`).
    pub fn id(&self) -> Option<&str> {
        match self {
            FrameError::TooLarge { .. } => None,
            FrameError::BadFrame { id, .. } => id.as_deref(),
        }
    }
}

fn bad(detail: impl Into<String>, id: Option<&str>) -> FrameError {
    FrameError::BadFrame {
        detail: detail.into(),
        id: id.map(str::to_owned),
    }
}

/// Parse one line (without its `\n`). Refuses: over [`super::MAX_LINE`], invalid UTF-8,
/// not a JSON object, duplicate keys at any depth, integers beyond ±(2^53−1), missing `t`,
/// a known type with a required field missing or of the wrong type, a `ts` that is not
/// RFC 3339, a leading byte order mark (U+FEFF, named in the detail). Unknown `t` gives
/// [`Line::Unknown`]; unknown fields are ignored.
///
/// Also refuses, on known types, an empty `id` and an `id`, `th`, `re` or `seen` entry
/// longer than [`MAX_ID_LEN`] bytes. Whitespace around the object (including a trailing
/// `\r`) is accepted, as by any JSON parser; the caller keeps the bytes as received.
/// Never panics; nesting deeper than [`MAX_DEPTH`] levels is refused.
pub fn parse_line(bytes: &[u8]) -> Result<Line, FrameError> {
    parse_inner(bytes, false).map(|(line, _)| line)
}

/// [`parse_line`], and for a line of a signed kind ([`super::sig::is_signed_kind`]) also
/// its signature check made ready from the same strict parse (what
/// [`super::sig::prepare_line`] gives for these bytes), so a signing peer's line is parsed
/// once, not twice. `None` for other kinds and unknown types.
pub fn parse_line_prepared(bytes: &[u8]) -> Result<(Line, Option<Prepared>), FrameError> {
    parse_inner(bytes, true)
}

/// The signature check of a line, made ready (or why it cannot be).
pub type Prepared = Result<super::sig::Prepared, super::sig::SigError>;

fn parse_inner(bytes: &[u8], prepare: bool) -> Result<(Line, Option<Prepared>), FrameError> {
    if bytes.len() > MAX_LINE {
        return Err(FrameError::TooLarge { max: MAX_LINE });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| bad("invalid UTF-8", None))?;
    if text.starts_with('\u{feff}') {
        return Err(bad(
            "line starts with a byte order mark (U+FEFF): send UTF-8 without a BOM",
            None,
        ));
    }
    let value = strict_from_str(text).map_err(|e| {
        let id = readable_id(text);
        bad(format!("invalid JSON: {e}"), id.as_deref())
    })?;
    let Value::Object(obj) = value else {
        return Err(bad("not a JSON object", None));
    };
    let id = match obj.get("id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_ID_LEN => Some(id.as_str()),
        _ => None,
    };
    if depth(&obj) > MAX_DEPTH {
        return Err(bad(format!("nested deeper than {MAX_DEPTH} levels"), id));
    }
    let id = match obj.get("id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_ID_LEN => Some(id.as_str()),
        _ => None,
    };
    check_integer_bounds(text).map_err(|d| bad(d, id))?;
    let t = match obj.get("t") {
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err(bad("`t` is not a string", id)),
        None => return Err(bad("missing `t`", id)),
    };
    if !is_known(&t) {
        let id = id.map(str::to_owned);
        return Ok((Line::Unknown { t, id }, None));
    }
    check_envelope(&obj, id)?;
    let prepared =
        (prepare && super::sig::is_signed_kind(&t)).then(|| super::sig::prepare_object(&obj));
    let id_owned = id.map(str::to_owned);
    let mut line = decode_known(&t, Value::Object(obj)).map_err(|e| FrameError::BadFrame {
        detail: format!("malformed {t}: {e}"),
        id: id_owned,
    })?;
    if let Line::Presence(p) = &mut line {
        p.doc_raw = raw_doc(text);
    }
    Ok((line, prepared))
}

/// The exact text of the top-level field `doc` of a presence line (already parsed
/// strictly, so the object is valid and has one `doc`).
fn raw_doc(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct DocOnly<'a> {
        #[serde(borrow)]
        doc: &'a serde_json::value::RawValue,
    }
    serde_json::from_str::<DocOnly>(text)
        .ok()
        .map(|d| d.doc.get().to_string())
}

/// Deepest nesting accepted in a line, counting the line's own object as 1. Anything a
/// peer sends is shown and re-wrapped locally (control responses, events), so the bound
/// stays well below serde_json's recursion limit of 128.
pub const MAX_DEPTH: usize = 64;

/// Nesting depth of an object (the object itself is 1), computed without recursion.
fn depth(obj: &Map<String, Value>) -> usize {
    let mut max = 1;
    let mut stack: Vec<(&Value, usize)> = obj.values().map(|v| (v, 2)).collect();
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(m) => {
                max = max.max(d);
                stack.extend(m.values().map(|c| (c, d + 1)));
            }
            Value::Array(a) => {
                max = max.max(d);
                stack.extend(a.iter().map(|c| (c, d + 1)));
            }
            _ => {}
        }
    }
    max
}

/// Parse a JSON value by the same rules as a line's content: no duplicate keys, integers
/// within ±(2^53−1), nesting at most [`MAX_DEPTH`] (a top-level array or object counts 1).
/// For local input that will travel on the wire (e.g. `awp send --data`).
pub fn parse_json_value(text: &str) -> Result<Value, String> {
    let v = strict_from_str(text).map_err(|e| e.to_string())?;
    check_integer_bounds(text)?;
    let mut wrapped = Map::new();
    wrapped.insert(String::new(), v);
    // The wrapper adds one level.
    if depth(&wrapped) - 1 > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    Ok(wrapped.remove("").unwrap_or(Value::Null))
}

/// The top-level `id` of a line that the strict reader refused (e.g. for a duplicate key
/// deeper inside), when the line is otherwise an object with one usable string `id`.
fn readable_id(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        #[serde(default)]
        id: Option<String>,
    }
    let id = serde_json::from_str::<IdOnly>(text).ok()?.id?;
    (!id.is_empty() && id.len() <= MAX_ID_LEN).then_some(id)
}

const KNOWN: [&str; 16] = [
    "hello",
    "auth",
    "resume",
    "state",
    "msg",
    "ack",
    "chunk",
    "ping",
    "pong",
    "bye",
    "err",
    "grant",
    "introduce",
    "presence",
    "mirror",
    "private",
];

fn is_known(t: &str) -> bool {
    KNOWN.contains(&t)
}

/// Envelope checks beyond the typed decode: id non-empty and capped, th/re capped, ts
/// RFC 3339, resume's seen entries capped.
fn check_envelope(obj: &Map<String, Value>, id: Option<&str>) -> Result<(), FrameError> {
    match obj.get("id") {
        Some(Value::String(s)) if s.is_empty() => return Err(bad("empty `id`", None)),
        Some(Value::String(s)) if s.len() > MAX_ID_LEN => {
            return Err(bad(format!("`id` over {MAX_ID_LEN} bytes"), None))
        }
        Some(Value::String(_)) => {}
        Some(_) => return Err(bad("`id` is not a string", None)),
        None => return Err(bad("missing `id`", None)),
    }
    for field in ["th", "re"] {
        if let Some(Value::String(s)) = obj.get(field) {
            if s.len() > MAX_ID_LEN {
                return Err(bad(format!("`{field}` over {MAX_ID_LEN} bytes"), id));
            }
        }
    }
    match obj.get("ts") {
        Some(Value::String(ts)) => {
            super::time::parse_rfc3339(ts).map_err(|e| bad(e.to_string(), id))?;
        }
        Some(_) => return Err(bad("`ts` is not a string", id)),
        None => return Err(bad("missing `ts`", id)),
    }
    if let Some(Value::Object(seen)) = obj.get("seen") {
        for (th, last) in seen {
            let long = th.len() > MAX_ID_LEN || last.as_str().is_some_and(|s| s.len() > MAX_ID_LEN);
            if long {
                return Err(bad(format!("`seen` entry over {MAX_ID_LEN} bytes"), id));
            }
        }
    }
    Ok(())
}

fn decode_known(t: &str, v: Value) -> Result<Line, serde_json::Error> {
    use serde_json::from_value as from;
    Ok(match t {
        "hello" => Line::Hello(from(v)?),
        "auth" => Line::Auth(from(v)?),
        "resume" => Line::Resume(from(v)?),
        "state" => Line::State(from(v)?),
        "msg" => Line::Msg(from(v)?),
        "ack" => Line::Ack(from(v)?),
        "chunk" => Line::Chunk(from(v)?),
        "ping" => Line::Ping(from(v)?),
        "pong" => Line::Pong(from(v)?),
        "bye" => Line::Bye(from(v)?),
        "err" => Line::Err(from(v)?),
        "grant" => Line::Grant(from(v)?),
        "introduce" => Line::Introduce(from(v)?),
        "presence" => Line::Presence(from(v)?),
        "mirror" => Line::Mirror(from(v)?),
        "private" => Line::Private(from(v)?),
        other => {
            return Err(serde::de::Error::custom(format!(
                "not a known type: {other}"
            )))
        }
    })
}

/// Parse JSON text into a `Value`, refusing duplicate object keys at any depth (after
/// unescaping, so `"a"` and `"\u0061"` are the same key). Nesting is bounded by
/// serde_json's recursion limit (128).
pub fn strict_from_str(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<StrictValue>(text).map(|s| s.0)
}

/// A `Value` whose deserialisation refuses duplicate keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value without duplicate keys")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(StrictValue(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate key `{key}`")));
            }
            let StrictValue(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Refuse any integer literal (a JSON number without fraction or exponent) whose magnitude
/// exceeds 2^53−1, wherever it appears. Works on the raw text because serde_json turns
/// integers beyond 64 bits into floats. Expects syntactically valid JSON.
fn check_integer_bounds(text: &str) -> Result<(), String> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                if b[i] == b'-' {
                    i += 1;
                }
                let digits_start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                let digits = &text[digits_start..i];
                let mut is_int = true;
                while i < b.len() && matches!(b[i], b'.' | b'e' | b'E' | b'+' | b'-' | b'0'..=b'9')
                {
                    is_int = false;
                    i += 1;
                }
                let too_big =
                    digits.len() > 16 || digits.parse::<u64>().is_ok_and(|n| n > MAX_SAFE_INT);
                if is_int && too_big {
                    return Err(format!(
                        "integer {} beyond ±(2^53−1)",
                        &text[start..start + (digits_start - start) + digits.len().min(32)]
                    ));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// A line could not be encoded without breaking a wire rule.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// An integer beyond ±(2^53−1) (protocol-notes §Framing).
    #[error("integer {0} beyond ±(2^53−1)")]
    UnsafeInteger(String),
}

impl Line {
    /// Exact encoding without the `\n`: compact JSON, `t,id,ts,th,re` first, no HTML
    /// escaping, U+2028/U+2029 escaped (see [`super::separators`]). `Unknown` encodes as
    /// `{"t":…,"id":…}`.
    ///
    /// Integers beyond ±(2^53−1) (which no valid line carries: sizes, counters and
    /// milliseconds stay far below) are clamped to the bound so that the wire rule holds;
    /// use [`Line::try_encode`] to refuse them instead.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.to_value();
        clamp_integers(&mut v);
        super::escape_separators(serde_json::to_vec(&v).expect("a Value always serialises"))
    }

    /// Like [`Line::encode`], but errors with [`EncodeError::UnsafeInteger`] when an integer
    /// is beyond ±(2^53−1) instead of clamping it.
    pub fn try_encode(&self) -> Result<Vec<u8>, EncodeError> {
        let v = self.to_value();
        if let Some(n) = find_unsafe_integer(&v) {
            return Err(EncodeError::UnsafeInteger(n));
        }
        Ok(super::escape_separators(
            serde_json::to_vec(&v).expect("a Value always serialises"),
        ))
    }

    /// This line as a JSON object with `t` first, then the struct's fields in declaration
    /// order (envelope fields first).
    pub fn to_value(&self) -> Value {
        fn body<T: serde::Serialize>(t: &str, x: &T) -> Value {
            let mut out = Map::new();
            out.insert("t".into(), Value::String(t.to_owned()));
            if let Ok(Value::Object(fields)) = serde_json::to_value(x) {
                for (k, v) in fields {
                    if k != "t" {
                        out.insert(k, v);
                    }
                }
            }
            Value::Object(out)
        }
        let t = self.kind();
        match self {
            Line::Hello(x) => body(t, x),
            Line::Auth(x) => body(t, x),
            Line::Resume(x) => body(t, x),
            Line::State(x) => body(t, x),
            Line::Msg(x) => body(t, x),
            Line::Ack(x) => body(t, x),
            Line::Chunk(x) => body(t, x),
            Line::Ping(x) => body(t, x),
            Line::Pong(x) => body(t, x),
            Line::Bye(x) => body(t, x),
            Line::Err(x) => body(t, x),
            Line::Grant(x) => body(t, x),
            Line::Introduce(x) => body(t, x),
            Line::Presence(x) => body(t, x),
            Line::Mirror(x) => body(t, x),
            Line::Private(x) => body(t, x),
            Line::Unknown { t, id } => {
                let mut out = Map::new();
                out.insert("t".into(), Value::String(t.clone()));
                if let Some(id) = id {
                    out.insert("id".into(), Value::String(id.clone()));
                }
                Value::Object(out)
            }
        }
    }

    /// The `t` of this line.
    pub fn kind(&self) -> &str {
        match self {
            Line::Hello(_) => "hello",
            Line::Auth(_) => "auth",
            Line::Resume(_) => "resume",
            Line::State(_) => "state",
            Line::Msg(_) => "msg",
            Line::Ack(_) => "ack",
            Line::Chunk(_) => "chunk",
            Line::Ping(_) => "ping",
            Line::Pong(_) => "pong",
            Line::Bye(_) => "bye",
            Line::Err(_) => "err",
            Line::Grant(_) => "grant",
            Line::Introduce(_) => "introduce",
            Line::Presence(_) => "presence",
            Line::Mirror(_) => "mirror",
            Line::Private(_) => "private",
            Line::Unknown { t, .. } => t,
        }
    }

    /// The line's `id` (None only for an Unknown line without one).
    pub fn id(&self) -> Option<&str> {
        Some(match self {
            Line::Hello(x) => &x.id,
            Line::Auth(x) => &x.id,
            Line::Resume(x) => &x.id,
            Line::State(x) => &x.id,
            Line::Msg(x) => &x.id,
            Line::Ack(x) => &x.id,
            Line::Chunk(x) => &x.id,
            Line::Ping(x) => &x.id,
            Line::Pong(x) => &x.id,
            Line::Bye(x) => &x.id,
            Line::Err(x) => &x.id,
            Line::Grant(x) => &x.id,
            Line::Introduce(x) => &x.id,
            Line::Presence(x) => &x.id,
            Line::Mirror(x) => &x.id,
            Line::Private(x) => &x.id,
            Line::Unknown { id, .. } => return id.as_deref(),
        })
    }

    /// The line's `th`, if it has one.
    pub fn th(&self) -> Option<&str> {
        match self {
            Line::State(x) => Some(&x.th),
            Line::Msg(x) => Some(&x.th),
            Line::Ack(x) => Some(&x.th),
            Line::Mirror(x) => Some(&x.th),
            Line::Private(x) => Some(&x.th),
            Line::Chunk(x) => x.th.as_deref(),
            Line::Err(x) => x.th.as_deref(),
            Line::Introduce(x) => x.th.as_deref(),
            _ => None,
        }
    }
}

fn is_unsafe(n: &Number) -> bool {
    n.as_u64().is_some_and(|u| u > MAX_SAFE_INT)
        || n.as_i64().is_some_and(|i| i.unsigned_abs() > MAX_SAFE_INT)
}

fn find_unsafe_integer(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) if is_unsafe(n) => Some(n.to_string()),
        Value::Array(a) => a.iter().find_map(find_unsafe_integer),
        Value::Object(o) => o.values().find_map(find_unsafe_integer),
        _ => None,
    }
}

fn clamp_integers(v: &mut Value) {
    match v {
        Value::Number(n) if is_unsafe(n) => {
            let neg = n.as_i64().is_some_and(|i| i < 0);
            *n = if neg {
                Number::from(-(MAX_SAFE_INT as i64))
            } else {
                Number::from(MAX_SAFE_INT)
            };
        }
        Value::Array(a) => a.iter_mut().for_each(clamp_integers),
        Value::Object(o) => o.values_mut().for_each(clamp_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_scan_ignores_strings_and_floats() {
        assert!(check_integer_bounds(r#"{"a":"9007199254740993","b":1.5e300}"#).is_ok());
        assert!(check_integer_bounds(r#"{"a":"\"","b":9007199254740991}"#).is_ok());
        assert!(check_integer_bounds(r#"{"a":"\\","b":-9007199254740991}"#).is_ok());
        assert!(check_integer_bounds(r#"{"a":"\\","b":9007199254740992}"#).is_err());
        assert!(check_integer_bounds(r#"[-9007199254740992]"#).is_err());
        assert!(check_integer_bounds(r#"[123456789012345678901234567890]"#).is_err());
        assert!(check_integer_bounds(r#"[0,-0,1e400,9007199254740993.0]"#).is_ok());
    }

    #[test]
    fn nesting_beyond_max_depth_is_refused() {
        let line = |n: usize| {
            format!(
                r#"{{"t":"msg","id":"m","ts":"2026-01-01T00:00:00Z","th":"t","parts":[{{"k":"data","data":{}{}}}]}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        // Object (1) > parts array (2) > part object (3) > data arrays (4..).
        assert!(parse_line(line(MAX_DEPTH - 3).as_bytes()).is_ok());
        let e = parse_line(line(MAX_DEPTH - 2).as_bytes()).unwrap_err();
        assert_eq!(e.code(), "bad_frame");
        assert_eq!(e.id(), Some("m"));
        assert!(parse_json_value(&"[".repeat(MAX_DEPTH)).is_err());
        assert!(parse_json_value(&format!(
            "{}{}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        ))
        .is_ok());
        assert!(parse_json_value(&format!(
            "{}{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        ))
        .is_err());
        assert!(parse_json_value(r#"{"a":1,"a":2}"#).is_err());
        assert!(parse_json_value(r#"{"a":9007199254740993}"#).is_err());
    }

    #[test]
    fn strict_reader_refuses_escaped_duplicate() {
        assert!(strict_from_str(r#"{"a":1,"\u0061":2}"#).is_err());
        assert!(strict_from_str(r#"{"a":1,"b":{"a":2}}"#).is_ok());
    }

    #[test]
    fn try_encode_refuses_and_encode_clamps() {
        let line = Line::Chunk(Chunk {
            id: "1".into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: None,
            blob_ref: "r".into(),
            n: u64::MAX,
            last: true,
            data: String::new(),
        });
        assert!(line.try_encode().is_err());
        let enc = String::from_utf8(line.encode()).unwrap();
        assert!(enc.contains(r#""n":9007199254740991"#), "{enc}");
        assert!(parse_line(enc.as_bytes()).is_ok());
    }

    #[test]
    fn ack_encode_line_is_byte_for_byte_the_generic_encoding() {
        let odd = [
            "01KAAAAAAAAAAAAAAAAAAAAAAA",
            "",
            "quote \" back \\ slash",
            "ctl \u{1}\n\t end",
            "é ü 漢 \u{1F600}",
            "sep \u{2028} and \u{2029}",
            "<html> & 'x'",
        ];
        for a in odd {
            for b in odd {
                let ack = crate::wire::Ack {
                    id: a.into(),
                    ts: "2026-01-01T00:00:00.000Z".into(),
                    th: b.into(),
                    re: a.into(),
                };
                let direct = ack.encode_line();
                assert_eq!(direct, Line::Ack(ack.clone()).encode(), "{a:?} {b:?}");
                if !a.is_empty() && !b.is_empty() {
                    assert_eq!(parse_line(&direct).unwrap(), Line::Ack(ack));
                }
            }
        }
    }
}
