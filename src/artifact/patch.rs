//! Patches (notes §5): anchored `text_edits`, RFC 6902 `json_patch` through the
//! `json-patch` crate, generated summaries, and the recorded-patch diff.
//!
//! These functions only transform data; validation and normalization by the kind, and the
//! "unchanged" rule, are the engine's. Replay uses [`apply`] on the recorded patch, which
//! by the recorded-patch rule gives exactly the stored result.

use serde_json::{Map, Value};

use super::frames::{Patch, Rejection, TextEdit};

/// Apply `patch` to `data` (no validation). Errors: patch_failed with artifactr's texts:
/// `'<field>' is not a text field`, `the anchor <preview> is not found`, `the anchor
/// <preview> is ambiguous: it occurs N times`, `an empty anchor is only allowed when the
/// text is empty`, `the JSON patch does not apply: <library text>`; a result that is not
/// an object is validation_failed `invalid <kind> data` by the caller, here a patch_failed
/// `the JSON patch does not apply: the result is not an object`.
pub fn apply(data: &Map<String, Value>, patch: &Patch) -> Result<Map<String, Value>, Rejection> {
    match patch {
        Patch::TextEdits { field, edits } => apply_text_edits(data, field, edits),
        Patch::JsonPatch { ops } => apply_json_patch(data, ops),
    }
}

fn apply_text_edits(
    data: &Map<String, Value>,
    field: &str,
    edits: &[TextEdit],
) -> Result<Map<String, Value>, Rejection> {
    let mut text = match data.get(field) {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(Rejection::patch_failed(format!(
                "{} is not a text field",
                py_repr(field)
            )))
        }
    };
    // Each edit scans the whole text: bound the bytes scanned by one patch (peer input,
    // run under the store's writer lock).
    let mut scanned = 0usize;
    for e in edits {
        scanned = scanned.saturating_add(text.len());
        if scanned > MAX_EDIT_SCAN_BYTES {
            return Err(Rejection::patch_failed(format!(
                "too many edits for a text this long: at most {MAX_EDIT_SCAN_BYTES} bytes scanned per patch"
            )));
        }
        if e.old.is_empty() {
            if !text.is_empty() {
                return Err(Rejection::patch_failed(
                    "an empty anchor is only allowed when the text is empty",
                ));
            }
            text = e.new.clone();
            continue;
        }
        match text.matches(e.old.as_str()).count() {
            1 => text = text.replacen(e.old.as_str(), &e.new, 1),
            0 => {
                return Err(Rejection::patch_failed(format!(
                    "the anchor {} is not found",
                    preview(&e.old)
                )))
            }
            n => {
                return Err(Rejection::patch_failed(format!(
                    "the anchor {} is ambiguous: it occurs {n} times",
                    preview(&e.old)
                )))
            }
        }
    }
    let mut out = data.clone();
    out.insert(field.to_owned(), Value::String(text));
    Ok(out)
}

fn apply_json_patch(
    data: &Map<String, Value>,
    ops: &[Map<String, Value>],
) -> Result<Map<String, Value>, Rejection> {
    let fail =
        |why: String| Rejection::patch_failed(format!("the JSON patch does not apply: {why}"));
    let mut parsed = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let op: json_patch::PatchOperation = serde_json::from_value(Value::Object(op.clone()))
            .map_err(|e| fail(format!("operation {i}: {e}")))?;
        parsed.push(op);
    }
    // Ops run one by one on a copy (all or nothing). `test` compares as Python's `==`
    // does (1 == 1.0, true != 1), so it is checked here; every other op is the crate's.
    let mut doc = Value::Object(data.clone());
    // Peer patches are hostile: `copy` doubles the document per op and `move` nests it
    // one level deeper per op, so upper bounds of size and depth are kept per op and
    // the patch fails before either is materialized (the kind checks the result later).
    let mut size = json_size(&doc, MAX_PATCH_BYTES);
    let mut depth = json_depth(&doc, MAX_PATCH_DEPTH);
    for (i, op) in parsed.iter().enumerate() {
        let segs = |p: &str| p.matches('/').count();
        use json_patch::PatchOperation as P;
        let (grow, deeper) = match op {
            P::Add(o) => (
                json_size(&o.value, MAX_PATCH_BYTES),
                segs(o.path.as_str()) + json_depth(&o.value, MAX_PATCH_DEPTH),
            ),
            P::Replace(o) => (
                json_size(&o.value, MAX_PATCH_BYTES),
                segs(o.path.as_str()) + json_depth(&o.value, MAX_PATCH_DEPTH),
            ),
            P::Copy(o) => (
                doc.pointer(o.from.as_str())
                    .map_or(0, |v| json_size(v, MAX_PATCH_BYTES.saturating_sub(size))),
                (segs(o.path.as_str()) + depth).saturating_sub(segs(o.from.as_str())),
            ),
            P::Move(o) => (
                0,
                (segs(o.path.as_str()) + depth).saturating_sub(segs(o.from.as_str())),
            ),
            _ => (0, 0),
        };
        size = size.saturating_add(grow);
        depth = depth.max(deeper);
        if size > MAX_PATCH_BYTES || depth > MAX_PATCH_DEPTH {
            return Err(fail(format!(
                "operation {i}: the result would exceed {MAX_PATCH_BYTES} bytes or {MAX_PATCH_DEPTH} levels"
            )));
        }
        match op {
            json_patch::PatchOperation::Test(t) => {
                let path = t.path.to_string();
                match doc.pointer(&path) {
                    Some(v) if py_eq(v, &t.value) => {}
                    Some(_) => {
                        return Err(fail(format!(
                            "operation {i}: test failed at path {path}: value did not match"
                        )))
                    }
                    None => {
                        return Err(fail(format!(
                            "operation {i}: test failed at path {path}: path does not exist"
                        )))
                    }
                }
            }
            other => json_patch::patch(&mut doc, std::slice::from_ref(other))
                .map_err(|e| fail(format!("operation {i}: {e}")))?,
        }
    }
    match doc {
        Value::Object(m) => Ok(m),
        _ => Err(fail("the result is not an object".into())),
    }
}

/// Most text bytes one text_edits patch may scan (the text's length once per edit): 128
/// edits of the largest data.
pub const MAX_EDIT_SCAN_BYTES: usize = 128 * super::kinds::MAX_DATA_BYTES;

/// Most bytes (as compact JSON, estimated) a document may reach while a json_patch
/// applies: room for the largest data plus a patch line, far below what `copy` doubling
/// would build.
pub const MAX_PATCH_BYTES: usize = 4 * super::kinds::MAX_DATA_BYTES;
/// Most nesting levels a document may reach while a json_patch applies: past the kinds'
/// limit, far below what recursion over the value could not survive, and low enough that
/// a replica's snapshot (the data ~7 levels down) still parses back (serde_json: 128).
pub const MAX_PATCH_DEPTH: usize = super::kinds::MAX_DEPTH + 16;

/// Size of `v` as compact JSON (strings without escapes), counted up to `limit`: the
/// result is `limit + 1` as soon as it is known to be above `limit`.
fn json_size(v: &Value, limit: usize) -> usize {
    let mut n = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        n += match v {
            Value::Null | Value::Bool(_) => 5,
            Value::Number(_) => 8,
            Value::String(s) => s.len() + 2,
            Value::Array(a) => {
                stack.extend(a.iter());
                2 + a.len()
            }
            Value::Object(m) => {
                stack.extend(m.values());
                2 + m.keys().map(|k| k.len() + 4).sum::<usize>()
            }
        };
        if n > limit {
            return limit + 1;
        }
    }
    n
}

/// Nesting levels of `v` (a scalar is 0, `{}` 1), counted up to `limit`: `limit + 1` as
/// soon as it is known to be deeper.
fn json_depth(v: &Value, limit: usize) -> usize {
    let mut max = 0usize;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let kids: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(m) => Box::new(m.values()),
            _ => continue,
        };
        max = max.max(d + 1);
        if max > limit {
            return limit + 1;
        }
        stack.extend(kids.map(|k| (k, d + 1)));
    }
    max
}

/// JSON equality as Python's `==` on decoded JSON: numbers by value (1 == 1.0), booleans
/// never equal numbers, objects regardless of key order.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(p), Some(q)) => p == q,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(p), Some(q)) => p == q,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| py_eq(v, w)))
        }
        _ => a == b,
    }
}

/// The generated summary of a patch (notes §5): `edited <field> (N replacement[s])`, or
/// `<op> <path>` of up to 3 ops joined by `; `, then ` and N more`.
pub fn summarize(patch: &Patch) -> String {
    match patch {
        Patch::TextEdits { field, edits } => {
            let n = edits.len();
            format!(
                "edited {field} ({n} replacement{})",
                if n == 1 { "" } else { "s" }
            )
        }
        Patch::JsonPatch { ops } => {
            let parts: Vec<String> = ops
                .iter()
                .take(3)
                .map(|op| {
                    let s = |k: &str| op.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                    format!("{} {}", s("op"), s("path"))
                })
                .collect();
            let mut out = parts.join("; ");
            if ops.len() > 3 {
                out.push_str(&format!(" and {} more", ops.len() - 3));
            }
            out
        }
    }
}

/// An RFC 6902 patch that turns `before` into `after` (used as the recorded patch when
/// normalization changed the result or reviewer changes were layered on).
pub fn diff(before: &Map<String, Value>, after: &Map<String, Value>) -> Patch {
    let p = json_patch::diff(
        &Value::Object(before.clone()),
        &Value::Object(after.clone()),
    );
    let ops =
        p.0.iter()
            .filter_map(|op| match serde_json::to_value(op) {
                Ok(Value::Object(m)) => Some(m),
                _ => None,
            })
            .collect();
    Patch::JsonPatch { ops }
}

/// The anchor preview of error messages: Python `repr` of the anchor, cut to 59 chars
/// plus `…` when longer than 60.
pub fn preview(anchor: &str) -> String {
    if anchor.chars().count() > 60 {
        let cut: String = anchor
            .chars()
            .take(59)
            .chain(std::iter::once('…'))
            .collect();
        py_repr(&cut)
    } else {
        py_repr(anchor)
    }
}

/// Python's `repr` of a string: single quotes unless it holds `'` and no `"`; escapes
/// `\\`, the quote, `\n`, `\r`, `\t` and other control characters.
pub fn py_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }
    fn edits(pairs: &[(&str, &str)]) -> Patch {
        Patch::TextEdits {
            field: "text".into(),
            edits: pairs
                .iter()
                .map(|(o, n)| TextEdit {
                    old: (*o).into(),
                    new: (*n).into(),
                })
                .collect(),
        }
    }
    fn msg(r: Rejection) -> String {
        match r {
            Rejection::PatchFailed { message } => message,
            other => panic!("not patch_failed: {other:?}"),
        }
    }

    #[test]
    fn text_edits_apply_in_order_to_previous_result() {
        let d = obj(json!({"text": "a b c"}));
        let out = apply(&d, &edits(&[("a", "x"), ("x b", "y")])).unwrap();
        assert_eq!(out["text"], "y c");
    }

    #[test]
    fn non_overlapping_count_aa_in_aaa_is_one() {
        let d = obj(json!({"text": "aaa"}));
        assert_eq!(apply(&d, &edits(&[("aa", "b")])).unwrap()["text"], "ba");
    }

    #[test]
    fn anchor_rejections() {
        let d = obj(json!({"text": "one two two", "n": 1}));
        assert_eq!(
            msg(apply(&d, &edits(&[("three", "")])).unwrap_err()),
            "the anchor 'three' is not found"
        );
        assert_eq!(
            msg(apply(&d, &edits(&[("two", "")])).unwrap_err()),
            "the anchor 'two' is ambiguous: it occurs 2 times"
        );
        assert_eq!(
            msg(apply(&d, &edits(&[("", "x")])).unwrap_err()),
            "an empty anchor is only allowed when the text is empty"
        );
        let p = Patch::TextEdits {
            field: "n".into(),
            edits: vec![TextEdit {
                old: "1".into(),
                new: "2".into(),
            }],
        };
        assert_eq!(msg(apply(&d, &p).unwrap_err()), "'n' is not a text field");
        // One failing edit fails the whole command: nothing is returned.
        assert!(apply(&d, &edits(&[("one", "1"), ("zzz", "")])).is_err());
    }

    #[test]
    fn empty_anchor_writes_an_empty_field() {
        let d = obj(json!({"text": ""}));
        assert_eq!(apply(&d, &edits(&[("", "hi")])).unwrap()["text"], "hi");
    }

    #[test]
    fn long_anchor_preview_is_cut_at_59_plus_ellipsis() {
        let a = "x".repeat(61);
        assert_eq!(preview(&a), format!("'{}…'", "x".repeat(59)));
        assert_eq!(preview(&"y".repeat(60)), format!("'{}'", "y".repeat(60)));
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a\nb"), "'a\\nb'");
    }

    #[test]
    fn json_patch_is_all_or_nothing_and_names_the_failure() {
        let d = obj(json!({"value": {"a": 1}}));
        let p = Patch::JsonPatch {
            ops: vec![
                obj(json!({"op": "add", "path": "/value/b", "value": 2})),
                obj(json!({"op": "test", "path": "/value/a", "value": 5})),
            ],
        };
        let m = msg(apply(&d, &p).unwrap_err());
        assert!(m.starts_with("the JSON patch does not apply: "), "{m}");
        let missing_value = Patch::JsonPatch {
            ops: vec![obj(json!({"op": "add", "path": "/value/b"}))],
        };
        assert!(msg(apply(&d, &missing_value).unwrap_err())
            .starts_with("the JSON patch does not apply: "));
        let bad_op = Patch::JsonPatch {
            ops: vec![obj(json!({"op": "frob", "path": "/value"}))],
        };
        assert!(apply(&d, &bad_op).is_err());
        let ok = Patch::JsonPatch {
            ops: vec![obj(
                json!({"op": "replace", "path": "/value/a", "value": 3}),
            )],
        };
        assert_eq!(apply(&d, &ok).unwrap()["value"], json!({"a": 3}));
    }

    #[test]
    fn json_patch_test_equates_1_and_1_0_but_not_true_and_1() {
        let d = obj(json!({"value": {"n": 1, "b": true}}));
        let test = |path: &str, value: Value| Patch::JsonPatch {
            ops: vec![
                obj(json!({"op": "test", "path": path, "value": value})),
                obj(json!({"op": "replace", "path": "/value/n", "value": 2})),
            ],
        };
        assert!(apply(&d, &test("/value/n", json!(1.0))).is_ok());
        assert!(apply(&d, &test("/value/b", json!(1))).is_err());
        assert!(apply(&d, &test("/value/n", json!(true))).is_err());
        assert!(apply(&d, &test("/value/zz", json!(1))).is_err());
        assert!(apply(&d, &test("/value", json!({"b": true, "n": 1.0}))).is_ok());
    }

    #[test]
    fn summaries() {
        assert_eq!(
            summarize(&edits(&[("a", "b")])),
            "edited text (1 replacement)"
        );
        assert_eq!(
            summarize(&edits(&[("a", "b"), ("c", "d")])),
            "edited text (2 replacements)"
        );
        let ops: Vec<_> = (0..5)
            .map(|i| obj(json!({"op": "add", "path": format!("/v/{i}"), "value": i})))
            .collect();
        assert_eq!(
            summarize(&Patch::JsonPatch { ops }),
            "add /v/0; add /v/1; add /v/2 and 2 more"
        );
    }

    #[test]
    fn diff_turns_before_into_after() {
        let a = obj(json!({"text": "x", "k": [1, 2]}));
        let b = obj(json!({"text": "y", "k": [1]}));
        assert_eq!(apply(&a, &diff(&a, &b)).unwrap(), b);
    }
}
