//! JSON Schema of every line type, generated from [`super::types`] (`awp schema`,
//! checked in as `spec/awp.schema.json`).

/// The JSON Schema (draft 2020-12) of an AWP v0 line.
pub fn schema() -> serde_json::Value {
    todo!()
}
