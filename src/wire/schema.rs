//! JSON Schema of every line type, generated from [`super::types`] (`awp schema`,
//! checked in as `spec/awp.schema.json`).
//!
//! The shape follows the reference schema: a `$defs` map with one definition per line type
//! (each with a `const` `t`), the part kinds, the grant and presence objects, and a
//! `Message` definition that is `oneOf` the line types.

use super::types::*;
use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

/// Pattern of a key string: `ed25519:` + 43 base64url characters (protocol-notes §Envelope).
pub const KEY_PATTERN: &str = "^ed25519:[A-Za-z0-9_-]{43}$";
/// Pattern of nonces and signatures: base64url without padding.
pub const B64URL_PATTERN: &str = "^[A-Za-z0-9_-]+$";
/// Pattern of chunk `data`: standard base64 with padding.
pub const B64STD_PATTERN: &str = "^[A-Za-z0-9+/]*={0,2}$";

/// The line types in `Message`'s `oneOf`: (`t`, definition name).
pub const LINE_DEFS: [(&str, &str); 16] = [
    ("hello", "Hello"),
    ("auth", "Auth"),
    ("resume", "Resume"),
    ("state", "State"),
    ("msg", "Msg"),
    ("ack", "Ack"),
    ("chunk", "Chunk"),
    ("ping", "Ping"),
    ("pong", "Pong"),
    ("bye", "Bye"),
    ("err", "Err"),
    ("grant", "GrantMsg"),
    ("introduce", "Introduce"),
    ("presence", "PresenceMsg"),
    ("mirror", "Mirror"),
    ("private", "Private"),
];

const PART_DEFS: [(&str, &str); 4] = [
    ("text", "TextPart"),
    ("code", "CodePart"),
    ("data", "DataPart"),
    ("blob", "BlobPart"),
];

/// The JSON Schema (draft 2020-12) of an AWP v0 line: `{"$schema", "$ref":
/// "#/$defs/Message", "$defs": {…}, "title", "description"}`. Deterministic, so the
/// checked-in copy can be compared byte for byte.
pub fn schema() -> Value {
    let mut gen = SchemaSettings::draft2020_12().into_generator();
    gen.subschema_for::<Hello>();
    gen.subschema_for::<Auth>();
    gen.subschema_for::<Resume>();
    gen.subschema_for::<State>();
    gen.subschema_for::<Msg>();
    gen.subschema_for::<Ack>();
    gen.subschema_for::<Chunk>();
    gen.subschema_for::<Ping>();
    gen.subschema_for::<Pong>();
    gen.subschema_for::<Bye>();
    gen.subschema_for::<ErrLine>();
    gen.subschema_for::<GrantMsg>();
    gen.subschema_for::<Introduce>();
    gen.subschema_for::<PresenceMsg>();
    gen.subschema_for::<Mirror>();
    gen.subschema_for::<Private>();
    let mut defs = gen.take_definitions(true);

    for (t, name) in LINE_DEFS {
        if let Some(Value::Object(def)) = defs.get_mut(name) {
            add_tag(def, "t", t, "`t` is the message type.");
            envelope_rules(def);
            def.insert("title".into(), Value::String(t.into()));
        }
    }
    for (k, name) in PART_DEFS {
        if let Some(Value::Object(def)) = defs.get_mut(name) {
            add_tag(
                def,
                "k",
                k,
                "`k` is the part kind: text, code, data or blob.",
            );
        }
    }
    defs.insert(
        "Message".into(),
        json!({
            "oneOf": LINE_DEFS
                .iter()
                .map(|(_, name)| json!({ "$ref": format!("#/$defs/{name}") }))
                .collect::<Vec<_>>(),
            "description": "One AWP v0 line. Receivers ignore lines of other types.",
        }),
    );
    defs.insert("Envelope".into(), envelope());
    let mut defs: Vec<(String, Value)> = defs.into_iter().collect();
    defs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut defs: Map<String, Value> = defs.into_iter().collect();
    for def in defs.values_mut() {
        drop_null_types(def);
    }

    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/Message",
        "$defs": defs,
        "title": "Agent Wire Protocol v0",
        "description": "The lines of the Agent Wire Protocol v0, one compact JSON object per \
            line. Every line is an envelope (t, id, ts, and th or re where they apply) with \
            the fields of its type beside it. Generated from the awp-node wire types.",
    })
}

/// The envelope every line carries (protocol-notes §Envelope).
fn envelope() -> Value {
    let mut def = json!({
        "type": "object",
        "properties": {
            "id": { "type": "string" },
            "ts": { "type": "string" },
            "th": { "type": "string", "description": "The thread id." },
            "re": { "type": "string", "description": "The id of the line answered." },
        },
        "required": ["id", "ts"],
        "description": "The fields every line carries; the type's own fields sit beside them.",
    });
    if let Value::Object(def) = &mut def {
        envelope_rules(def);
        if let Some(Value::Object(props)) = def.get_mut("properties") {
            props.shift_insert(0, "t".into(), json!({ "type": "string" }));
        }
        if let Some(Value::Array(req)) = def.get_mut("required") {
            req.insert(0, "t".into());
        }
    }
    def
}

/// Put `tag: {type: string, const: value}` first in `properties` and in `required`.
fn add_tag(def: &mut Map<String, Value>, tag: &str, value: &str, description: &str) {
    let props = def
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(props) = props {
        props.shift_insert(
            0,
            tag.into(),
            json!({ "type": "string", "const": value, "description": description }),
        );
    }
    let req = def
        .entry("required")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(req) = req {
        req.retain(|r| r != tag);
        req.insert(0, Value::String(tag.into()));
    }
}

/// `id` non-empty, `ts` a date-time.
fn envelope_rules(def: &mut Map<String, Value>) {
    let Some(Value::Object(props)) = def.get_mut("properties") else {
        return;
    };
    if let Some(Value::Object(id)) = props.get_mut("id") {
        id.insert("minLength".into(), json!(1));
    }
    if let Some(Value::Object(ts)) = props.get_mut("ts") {
        ts.insert("format".into(), json!("date-time"));
    }
}

/// Optional fields are omitted on the wire, never `null`: turn `"type": [X, "null"]` into
/// `"type": X` and `anyOf: [S, {"type": "null"}]` into S.
fn drop_null_types(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::Array(types)) = o.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if rest.len() == 1 {
                    o.insert("type".into(), rest[0].clone());
                } else if rest.len() != types.len() {
                    o.insert("type".into(), Value::Array(rest));
                }
            }
            if let Some(Value::Array(any)) = o.get("anyOf") {
                let rest: Vec<Value> = any
                    .iter()
                    .filter(|s| **s != json!({ "type": "null" }))
                    .cloned()
                    .collect();
                if rest.len() == 1 && rest.len() != any.len() {
                    o.remove("anyOf");
                    if let Value::Object(inner) = &rest[0] {
                        for (k, x) in inner {
                            o.entry(k.clone()).or_insert_with(|| x.clone());
                        }
                    }
                }
            }
            if o.get("default") == Some(&Value::Null) {
                o.remove("default");
            }
            o.values_mut().for_each(drop_null_types);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_null_types),
        _ => {}
    }
}

/// The schema as the checked-in file holds it: pretty-printed with a trailing newline.
pub fn schema_text() -> String {
    let mut s = serde_json::to_string_pretty(&schema()).expect("a Value always serialises");
    s.push('\n');
    s
}
