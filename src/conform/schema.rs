//! Validation of received lines against the JSON Schema of [`crate::wire::schema::schema`].
//!
//! A line whose `t` is a v0 type is validated against that type's definition (the
//! `Message` `oneOf` would only say "no branch matched"); a line of another type against
//! `Envelope` (receivers ignore unknown types, but the envelope still applies).

use crate::wire::schema::LINE_DEFS;
use serde_json::Value;
use std::collections::HashMap;

/// Most violations reported for one line.
const MAX_ERRORS_PER_LINE: usize = 5;
/// Longest message kept per violation, in bytes (instances can be up to 1 MiB).
const MAX_MESSAGE: usize = 240;

/// The schema could not be compiled (a bug in the generated schema).
#[derive(Debug, thiserror::Error)]
#[error("cannot compile the JSON Schema of {def}: {message}")]
pub struct SchemaError {
    /// The definition that failed.
    pub def: String,
    /// The validator's message.
    pub message: String,
}

/// Compiled validators, one per line type plus the envelope.
pub struct LineSchema {
    by_type: HashMap<&'static str, jsonschema::Validator>,
    envelope: jsonschema::Validator,
}

impl std::fmt::Debug for LineSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineSchema")
            .field("types", &self.by_type.len())
            .finish()
    }
}

fn compile(base: &Value, def: &str) -> Result<jsonschema::Validator, SchemaError> {
    let mut s = base.clone();
    if let Value::Object(o) = &mut s {
        o.insert("$ref".into(), Value::String(format!("#/$defs/{def}")));
    }
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&s)
        .map_err(|e| SchemaError {
            def: def.to_string(),
            message: e.to_string(),
        })
}

impl LineSchema {
    /// Compile the node's schema (draft 2020-12, formats checked).
    pub fn new() -> Result<LineSchema, SchemaError> {
        let base = crate::wire::schema::schema();
        let mut by_type = HashMap::new();
        for (t, def) in LINE_DEFS {
            by_type.insert(t, compile(&base, def)?);
        }
        Ok(LineSchema {
            by_type,
            envelope: compile(&base, "Envelope")?,
        })
    }

    /// Violations of `line` (a parsed JSON line), each as `<pointer>: <message>`; empty
    /// when valid. At most a few per line, each message clipped.
    pub fn violations(&self, line: &Value) -> Vec<String> {
        let t = line.get("t").and_then(Value::as_str).unwrap_or("");
        let v = self.by_type.get(t).unwrap_or(&self.envelope);
        v.iter_errors(line)
            .take(MAX_ERRORS_PER_LINE)
            .map(|e| {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() { "/".into() } else { path };
                super::report::clip(&format!("{path}: {e}"), MAX_MESSAGE)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn valid_and_invalid_lines() {
        let s = LineSchema::new().unwrap();
        let pong = json!({"t":"pong","id":"01K0","ts":"2026-01-01T00:00:00.000Z","re":"x"});
        assert!(s.violations(&pong).is_empty());
        let bad = json!({"t":"pong","id":"01K0","ts":"yesterday"});
        let v = s.violations(&bad);
        assert!(v.iter().any(|m| m.contains("re")), "{v:?}");
        assert!(v.iter().any(|m| m.starts_with("/ts")), "{v:?}");
        let unknown = json!({"t":"frobnicate","id":"x","ts":"2026-01-01T00:00:00Z","z":1});
        assert!(s.violations(&unknown).is_empty());
        assert!(!s.violations(&json!({"t":"frobnicate"})).is_empty());
    }
}
