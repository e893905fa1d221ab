//! The checked-in `spec/awp.schema.json` is what `wire::schema::schema()` generates, and it
//! covers everything the reference schema (`../shared/seeds/awp.schema.json`) requires.

use awp_node::wire::schema::{schema, schema_text, LINE_DEFS};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn checked_in_schema_is_current() {
    let path = manifest_dir().join("spec/awp.schema.json");
    let generated = schema_text();
    if std::env::var_os("AWP_BLESS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "spec/awp.schema.json is out of date; regenerate it with \
         `cargo run -- schema > spec/awp.schema.json` or `AWP_BLESS=1 cargo test --test schema`"
    );
}

fn defs(schema: &Value) -> &serde_json::Map<String, Value> {
    schema["$defs"].as_object().expect("$defs is an object")
}

#[test]
fn message_is_one_of_every_line_type_with_const_t() {
    let s = schema();
    let d = defs(&s);
    let refs: Vec<&str> = d["Message"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["$ref"].as_str().unwrap())
        .collect();
    assert_eq!(refs.len(), LINE_DEFS.len());
    for (t, name) in LINE_DEFS {
        assert!(refs.contains(&format!("#/$defs/{name}").as_str()), "{name}");
        let def = &d[name];
        assert_eq!(def["properties"]["t"]["const"], t, "{name}");
        assert_eq!(def["required"][0], "t", "{name}");
        assert_eq!(def["properties"]["id"]["minLength"], 1, "{name}");
    }
    assert_eq!(s["$ref"], "#/$defs/Message");
}

#[test]
fn integers_have_minimum_zero_and_options_are_not_nullable() {
    let text = schema_text();
    assert!(
        !text.contains("\"null\""),
        "optional fields must not be nullable"
    );
    let s = schema();
    assert_eq!(s["$defs"]["Chunk"]["properties"]["n"]["minimum"], 0);
    assert_eq!(s["$defs"]["Hello"]["properties"]["v"]["minimum"], 0);
}

/// (def, property) → pattern / enum values / required names, for every definition.
fn facts(schema: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (name, def) in defs(schema) {
        if let Some(req) = def["required"].as_array() {
            for r in req {
                out.insert(format!("{name}: required {}", r.as_str().unwrap_or("?")));
            }
        }
        if let Some(props) = def["properties"].as_object() {
            for (p, ps) in props {
                if let Some(pat) = ps["pattern"].as_str() {
                    out.insert(format!("{name}.{p}: pattern {pat}"));
                }
                if let Some(vals) = ps["enum"].as_array() {
                    for v in vals {
                        out.insert(format!("{name}.{p}: enum {v}"));
                    }
                }
                if let Some(c) = ps["const"].as_str() {
                    out.insert(format!("{name}.{p}: const {c}"));
                }
            }
        }
        if let Some(one) = def["oneOf"].as_array() {
            for r in one {
                if let Some(r) = r["$ref"].as_str() {
                    out.insert(format!("{name}: oneOf {r}"));
                }
            }
        }
        out.insert(format!("def {name}"));
    }
    out
}

#[test]
fn covers_the_reference_schema() {
    let seed = manifest_dir().join("../shared/seeds/awp.schema.json");
    let Ok(text) = std::fs::read_to_string(&seed) else {
        eprintln!("skipped: ../shared/seeds/awp.schema.json not found");
        return;
    };
    let reference: Value = serde_json::from_str(&text).expect("reference schema is JSON");
    let ours = facts(&schema());
    let missing: Vec<String> = facts(&reference)
        .into_iter()
        .filter(|f| !ours.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "missing from our schema:\n{}",
        missing.join("\n")
    );
}
