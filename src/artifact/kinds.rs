//! The artifact kinds this node registers (artifactr registers none itself, notes §11):
//! `markdown` `{text}`, `code` `{language, text}`, `json` `{value, schema}`, each with
//! write policy `direct`. Validation rejects unknown fields and wrong types, and
//! normalization fills defaults, the way artifactr's kinds (pydantic models) do.
//!
//! | kind | fields (default) |
//! |---|---|
//! | markdown | `text`: string (`""`) |
//! | code | `language`: string (required), `text`: string (`""`) |
//! | json | `value`: any JSON (required), `schema`: object or null (`null`) |
//!
//! A `json` artifact's `schema` is given at creation (the CLI's `--schema FILE`), stored in
//! the data so that every replica and every replay has it, and fixed afterwards: `value`
//! must validate against it after every change, and a change of `schema` itself is a
//! validation_failed.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::frames::Rejection;

/// Deepest nesting of an artifact's data (the object itself is level 1). Deeper data could
/// not be parsed back by a replica (serde_json stops at 128) and would make patches and
/// drops recurse without bound (choice of spec/artifact-threads.md §7).
pub const MAX_DEPTH: usize = 64;

/// Largest artifact data, as compact JSON, so that any event carrying it (a recorded diff,
/// an accepted creation) fits in one 1 MiB AWP line (spec/artifact-threads.md §7).
pub const MAX_DATA_BYTES: usize = 512 * 1024;

/// True when `v` holds a container `limit` or more levels below it.
fn too_deep(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit == 0 || a.iter().any(|x| too_deep(x, limit - 1)),
        Value::Object(m) => limit == 0 || m.values().any(|x| too_deep(x, limit - 1)),
        _ => false,
    }
}

/// Whether agents write directly or must propose (notes §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WritePolicy {
    /// Writes apply (unless the thread is in `suggest` mode).
    Direct,
    /// Agents' writes become proposals.
    Propose,
}

/// One registered kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `markdown` `{text}`.
    Markdown,
    /// `code` `{language, text}`.
    Code,
    /// `json` `{value, schema}`.
    Json,
}

impl Kind {
    /// The kind registered under `name`, if any.
    pub fn by_name(name: &str) -> Option<Kind> {
        match name {
            "markdown" => Some(Kind::Markdown),
            "code" => Some(Kind::Code),
            "json" => Some(Kind::Json),
            _ => None,
        }
    }

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Markdown => "markdown",
            Kind::Code => "code",
            Kind::Json => "json",
        }
    }

    /// The kind's write policy: `direct` for all three.
    pub fn write_policy(self) -> WritePolicy {
        WritePolicy::Direct
    }

    /// Validate `data` as this kind and return it normalized (defaults filled, fields in
    /// the kind's order). Errors: validation_failed `invalid <kind> data` with a list of
    /// `{type, loc, msg}` errors (types `missing`, `string_type`, `dict_type`,
    /// `extra_forbidden`, `schema`, `schema_invalid`, and `too_deep` past [`MAX_DEPTH`]
    /// levels or `too_large` past [`MAX_DATA_BYTES`]).
    pub fn normalize(self, data: &Map<String, Value>) -> Result<Map<String, Value>, Rejection> {
        let mut errors = Vec::new();
        let mut out = Map::new();
        let fields: &[&str] = match self {
            Kind::Markdown => &["text"],
            Kind::Code => &["language", "text"],
            Kind::Json => &["value", "schema"],
        };
        for key in data.keys() {
            if !fields.contains(&key.as_str()) {
                errors.push(err(
                    "extra_forbidden",
                    key,
                    "Extra inputs are not permitted",
                ));
            }
        }
        let string_field =
            |name: &str, required: bool, errors: &mut Vec<Value>| match data.get(name) {
                Some(Value::String(s)) => Some(Value::String(s.clone())),
                Some(_) => {
                    errors.push(err("string_type", name, "Input should be a valid string"));
                    None
                }
                None if required => {
                    errors.push(err("missing", name, "Field required"));
                    None
                }
                None => Some(Value::String(String::new())),
            };
        match self {
            Kind::Markdown => {
                if let Some(v) = string_field("text", false, &mut errors) {
                    out.insert("text".into(), v);
                }
            }
            Kind::Code => {
                if let Some(v) = string_field("language", true, &mut errors) {
                    out.insert("language".into(), v);
                }
                if let Some(v) = string_field("text", false, &mut errors) {
                    out.insert("text".into(), v);
                }
            }
            Kind::Json => {
                let schema = match data.get("schema") {
                    None | Some(Value::Null) => Value::Null,
                    Some(s @ Value::Object(_)) => s.clone(),
                    Some(_) => {
                        errors.push(err(
                            "dict_type",
                            "schema",
                            "Input should be a valid dictionary or null",
                        ));
                        Value::Null
                    }
                };
                match data.get("value") {
                    None => errors.push(err("missing", "value", "Field required")),
                    Some(v) => {
                        if errors.is_empty() && !schema.is_null() {
                            check_schema(&schema, v, &mut errors);
                        }
                        out.insert("value".into(), v.clone());
                    }
                }
                out.insert("schema".into(), schema);
            }
        }
        if errors.is_empty() {
            if out.values().any(|v| too_deep(v, MAX_DEPTH - 1)) {
                errors.push(err(
                    "too_deep",
                    "data",
                    &format!("data may nest at most {MAX_DEPTH} levels"),
                ));
            } else if serde_json::to_vec(&out).map_or(true, |b| b.len() > MAX_DATA_BYTES) {
                errors.push(err(
                    "too_large",
                    "data",
                    &format!("data may take at most {MAX_DATA_BYTES} bytes as JSON"),
                ));
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(Rejection::validation(
                format!("invalid {} data", self.name()),
                errors,
            ))
        }
    }

    /// Extra rule for a change from `before` to `after` (both normalized): the `schema` of a
    /// `json` artifact is fixed at creation (validation_failed `invalid json data`).
    pub fn check_change(
        self,
        before: &Map<String, Value>,
        after: &Map<String, Value>,
    ) -> Result<(), Rejection> {
        if self == Kind::Json && before.get("schema") != after.get("schema") {
            return Err(Rejection::validation(
                "invalid json data",
                vec![err(
                    "schema_fixed",
                    "schema",
                    "the schema of a json artifact is fixed at creation",
                )],
            ));
        }
        Ok(())
    }
}

fn err(ty: &str, loc: &str, msg: &str) -> Value {
    json!({"type": ty, "loc": [loc], "msg": msg})
}

/// Check `value` against the JSON Schema `schema` (draft picked from `$schema`, default
/// 2020-12), pushing one error per violation (at most 20) or `schema_invalid`.
fn check_schema(schema: &Value, value: &Value, errors: &mut Vec<Value>) {
    let validator = match jsonschema::validator_for(schema) {
        Ok(v) => v,
        Err(e) => {
            errors.push(err(
                "schema_invalid",
                "schema",
                &format!("not a valid JSON Schema: {e}"),
            ));
            return;
        }
    };
    for e in validator.iter_errors(value).take(20) {
        errors.push(json!({
            "type": "schema",
            "loc": ["value", e.instance_path().to_string()],
            "msg": e.to_string(),
        }));
    }
}
