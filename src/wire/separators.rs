//! U+2028 (LINE SEPARATOR) and U+2029 (PARAGRAPH SEPARATOR) are legal raw inside JSON
//! strings, but JavaScript and Python line splitters (`str.splitlines`, readline-based
//! framers in some runtimes) cut lines at them. Everything this node writes as JSON (lines
//! to peers, control responses, `--json` output) carries them escaped as `\u2028` and
//! `\u2029` instead (issue 8 §4b).
//!
//! The escape is a choice of serialization only: the JSON value is the same, so JCS
//! (RFC 8785) forms and the signatures over them do not change, and a line's bytes are
//! escaped before anything signs them as sent (our hello).

/// UTF-8 of U+2028.
const LS: [u8; 3] = [0xe2, 0x80, 0xa8];
/// UTF-8 of U+2029.
const PS: [u8; 3] = [0xe2, 0x80, 0xa9];

/// `json` (compact or pretty JSON text, UTF-8) with every raw U+2028 / U+2029 replaced by
/// its `\uXXXX` escape. Outside strings JSON has no place for these characters, and UTF-8
/// never contains their byte sequences as part of another character, so the result is the
/// same JSON value. Input without them is returned unchanged (no copy).
pub fn escape_separators(json: Vec<u8>) -> Vec<u8> {
    // `contains` on bytes is core's memchr: cheap on the hot path of every line.
    if !json.contains(&LS[0]) || !json.windows(3).any(|w| w == LS || w == PS) {
        return json;
    }
    let mut out = Vec::with_capacity(json.len() + 8);
    let mut i = 0;
    while i < json.len() {
        let w = json.get(i..i + 3);
        if w == Some(&LS[..]) {
            out.extend_from_slice(b"\\u2028");
            i += 3;
        } else if w == Some(&PS[..]) {
            out.extend_from_slice(b"\\u2029");
            i += 3;
        } else {
            out.push(json[i]);
            i += 1;
        }
    }
    out
}

/// [`escape_separators`] for a `String`.
pub fn escape_separators_str(json: String) -> String {
    match String::from_utf8(escape_separators(json.into_bytes())) {
        Ok(s) => s,
        // Replacing whole UTF-8 sequences by ASCII keeps valid UTF-8 valid.
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn separators_are_escaped_and_the_value_is_unchanged() {
        let v = json!({"text": "a\u{2028}b\u{2029}c", "k\u{2028}": ["\u{2029}"]});
        let raw = serde_json::to_vec(&v).unwrap();
        assert!(raw.windows(3).any(|w| w == LS));
        let out = escape_separators(raw);
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            !text.contains('\u{2028}') && !text.contains('\u{2029}'),
            "{text}"
        );
        assert!(text.contains("a\\u2028b\\u2029c"), "{text}");
        let back: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, v);
        // The canonical form for signing is the same either way.
        assert_eq!(
            serde_jcs::to_vec(&back).unwrap(),
            serde_jcs::to_vec(&v).unwrap()
        );
    }

    #[test]
    fn other_text_is_left_alone() {
        let s = "{\"t\":\"é\u{2027}\u{202a}→\"}".to_string();
        assert_eq!(escape_separators_str(s.clone()), s);
    }
}
