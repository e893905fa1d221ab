//! Typed AWP v0 lines (schema `$defs`), one struct per line type.
//!
//! Every struct carries the envelope fields first (`id`, `ts`, then `th`, `re` where they
//! apply) so that encoding emits `t,id,ts,th,re` before the type's own fields
//! (protocol-notes §Envelope). Unknown fields are ignored on decode.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// One AWP line, decoded. `Unknown` holds a line whose `t` is not a v0 type (ignored by
/// receivers, protocol-notes §Framing).
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Hello(Hello),
    Auth(Auth),
    Resume(Resume),
    State(State),
    Msg(Msg),
    Ack(Ack),
    Chunk(Chunk),
    Ping(Ping),
    Pong(Pong),
    Bye(Bye),
    Err(ErrLine),
    Grant(GrantMsg),
    Introduce(Introduce),
    Presence(PresenceMsg),
    Mirror(Mirror),
    Private(Private),
    /// A line whose `t` is not one of ours; `id` when it had a string one.
    Unknown {
        t: String,
        id: Option<String>,
    },
}

/// hello (§7.1): first line on every connection, written by both sides at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hello {
    pub id: String,
    pub ts: String,
    /// Protocol major version; ours is 0.
    pub v: u64,
    /// `ed25519:` + unpadded base64url of 32 bytes. Kept as text: a bad key is `err auth`,
    /// not `bad_frame`.
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// 32 random bytes, unpadded base64url.
    #[schemars(pattern(super::schema::B64URL_PATTERN))]
    pub nonce: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caps: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    /// Extension: an address where the sender can be dialed back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<Vec<Value>>,
}

/// auth (§7.2): the second line; `sig` over the auth transcript
/// (see [`crate::identity::auth_transcript`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Auth {
    pub id: String,
    pub ts: String,
    /// Ed25519 signature, unpadded base64url (64 bytes).
    #[schemars(pattern(super::schema::B64URL_PATTERN))]
    pub sig: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
}

/// resume (§9.5): `seen` maps thread id → the largest content id received in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Resume {
    pub id: String,
    pub ts: String,
    pub seen: BTreeMap<String, String>,
}

/// state (§8.1): the sender's own soft view of a thread. Acked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct State {
    pub id: String,
    pub ts: String,
    pub th: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re: Option<String>,
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// msg (§9.1): content in a thread. Acked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Msg {
    pub id: String,
    pub ts: String,
    pub th: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub parts: Vec<Part>,
}

/// One part of a msg. Unknown kinds are kept verbatim and ignored (§Framing).
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(TextPart),
    Code(CodePart),
    Data(DataPart),
    Blob(BlobPart),
    /// A part whose `k` is not one of ours (the whole object as received).
    Unknown(Map<String, Value>),
}

/// `{"k":"text","text":…}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TextPart {
    pub text: String,
}

/// `{"k":"code","text":…,"lang":…}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CodePart {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
}

/// `{"k":"data","data":<any JSON>,"mime":…}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DataPart {
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
}

/// `{"k":"blob","ref":…,"size":…,"name":…,"mime":…}`; data travels in chunk lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BlobPart {
    #[serde(rename = "ref")]
    pub blob_ref: String,
    /// Size in bytes before encoding.
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
}

/// ack (§9.2): `re` names the msg/state now durable at the receiver. Not acked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Ack {
    pub id: String,
    pub ts: String,
    pub th: String,
    pub re: String,
}

impl Ack {
    /// The same bytes as `Line::Ack(self.clone()).encode()` (compact JSON, `t,id,ts,th,re`,
    /// U+2028/U+2029 escaped), written directly: one buffer instead of a JSON value tree
    /// per ack, the receive path's most frequent line.
    pub fn encode_line(&self) -> Vec<u8> {
        let len = 40 + self.id.len() + self.ts.len() + self.th.len() + self.re.len();
        let mut out = Vec::with_capacity(len);
        // Writing a string into a Vec cannot fail.
        let field = |out: &mut Vec<u8>, key: &[u8], v: &String| {
            out.extend_from_slice(key);
            let _ = serde_json::to_writer(&mut *out, v);
        };
        field(&mut out, br#"{"t":"ack","id":"#, &self.id);
        field(&mut out, br#","ts":"#, &self.ts);
        field(&mut out, br#","th":"#, &self.th);
        field(&mut out, br#","re":"#, &self.re);
        out.push(b'}');
        super::escape_separators(out)
    }
}

/// chunk (§9.3): blob data, standard base64 with padding in `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Chunk {
    pub id: String,
    pub ts: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub th: Option<String>,
    #[serde(rename = "ref")]
    pub blob_ref: String,
    /// Chunk index from 0.
    pub n: u64,
    pub last: bool,
    #[schemars(pattern(super::schema::B64STD_PATTERN))]
    pub data: String,
}

/// ping (§9.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Ping {
    pub id: String,
    pub ts: String,
}

/// pong (§9.4): `re` = the ping's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pong {
    pub id: String,
    pub ts: String,
    pub re: String,
}

/// bye (§9.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Bye {
    pub id: String,
    pub ts: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// err (§9.7). `code` is kept as text: unknown codes must be accepted (and never close).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Err")]
pub struct ErrLine {
    pub id: String,
    pub ts: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub th: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re: Option<String>,
    #[schemars(extend("enum" = ["bad_frame", "version", "auth", "unsupported", "forbidden", "blob_refused", "too_large", "internal"]))]
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The blob ref, for `blob_refused`.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub blob_ref: Option<String>,
}

/// Grant object (§10.2). `extra` keeps unknown fields: they are covered by `sig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Grant {
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub iss: String,
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub sub: String,
    pub caps: Vec<String>,
    /// RFC 3339, whole seconds.
    #[schemars(extend("format" = "date-time"))]
    pub exp: String,
    #[schemars(pattern(super::schema::B64URL_PATTERN))]
    pub nonce: String,
    #[schemars(pattern(super::schema::B64URL_PATTERN))]
    pub sig: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub aud: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Map<String, Value>,
}

/// grant (§10.3): presents one grant object. Not acked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GrantMsg {
    pub id: String,
    pub ts: String,
    pub grant: Grant,
}

/// The introduced peer of an introduce line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IntroPeer {
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// introduce (§10.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Introduce {
    pub id: String,
    pub ts: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub th: Option<String>,
    pub peer: IntroPeer,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
}

/// presence (extension): a signed document passed on with a hop count. `doc` is kept as
/// received because its signature covers unknown fields; see [`Presence`] for its shape.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PresenceMsg {
    pub id: String,
    pub ts: String,
    #[schemars(with = "Presence")]
    pub doc: Map<String, Value>,
    pub hops: u64,
    /// The exact JSON text of `doc` as received (set by [`super::parse_line`]; `None` for
    /// lines built here). Forwarders send these bytes unchanged: re-serializing `doc`
    /// would change how its numbers are written (`1e21` → `1e+21`).
    #[serde(skip)]
    #[schemars(skip)]
    pub doc_raw: Option<String>,
}

/// Equality compares `id`, `ts`, `doc` and `hops`, not how `doc` was spelled
/// (`doc_raw`).
impl PartialEq for PresenceMsg {
    fn eq(&self, o: &Self) -> bool {
        self.id == o.id && self.ts == o.ts && self.doc == o.doc && self.hops == o.hops
    }
}

/// Signed presence document (extension).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Presence {
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub origin: String,
    pub seq: u64,
    #[schemars(extend("format" = "date-time"))]
    pub ts: String,
    #[schemars(pattern(super::schema::B64URL_PATTERN))]
    pub sig: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub active: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PresencePeer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<PresenceThread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
}

/// A peer entry of a presence document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PresencePeer {
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    /// Round trip in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt: Option<u64>,
}

/// A thread entry of a presence document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PresenceThread {
    pub th: String,
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub peer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theirs: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub updated: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
}

/// mirror (extension): a copy of a line exchanged with a third peer. Acked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Mirror {
    pub id: String,
    pub ts: String,
    pub th: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re: Option<String>,
    #[schemars(pattern(super::schema::KEY_PATTERN))]
    pub of: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["out", "in"]))]
    pub dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraw: Option<bool>,
}

/// private (extension): a thread marked private. Acked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Private {
    pub id: String,
    pub ts: String,
    pub th: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re: Option<String>,
}

impl Serialize for Part {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        fn with_k<S: serde::Serializer, T: Serialize>(
            s: S,
            k: &str,
            body: &T,
        ) -> Result<S::Ok, S::Error> {
            let v = serde_json::to_value(body).map_err(serde::ser::Error::custom)?;
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("k", k)?;
            if let Value::Object(o) = v {
                for (key, val) in o {
                    m.serialize_entry(&key, &val)?;
                }
            }
            m.end()
        }
        match self {
            Part::Text(p) => with_k(s, "text", p),
            Part::Code(p) => with_k(s, "code", p),
            Part::Data(p) => with_k(s, "data", p),
            Part::Blob(p) => with_k(s, "blob", p),
            Part::Unknown(m) => m.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let m = Map::<String, Value>::deserialize(d)?;
        let k = match m.get("k") {
            Some(Value::String(k)) => k.clone(),
            Some(_) => return Err(D::Error::custom("part `k` must be a string")),
            None => return Err(D::Error::custom("part without `k`")),
        };
        fn typed<T: serde::de::DeserializeOwned, E: Error>(m: Map<String, Value>) -> Result<T, E> {
            serde_json::from_value(Value::Object(m)).map_err(|e| E::custom(e.to_string()))
        }
        Ok(match k.as_str() {
            "text" => Part::Text(typed(m)?),
            "code" => Part::Code(typed(m)?),
            "data" => Part::Data(typed(m)?),
            "blob" => Part::Blob(typed(m)?),
            _ => Part::Unknown(m),
        })
    }
}

impl JsonSchema for Part {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Part".into()
    }
    /// One of the four known part kinds; receivers also accept (and ignore) other kinds.
    fn json_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let kinds = [
            gen.subschema_for::<TextPart>(),
            gen.subschema_for::<CodePart>(),
            gen.subschema_for::<DataPart>(),
            gen.subschema_for::<BlobPart>(),
        ];
        schemars::json_schema!({ "oneOf": kinds })
    }
}
