//! Offline-verifiable thread transcripts (`awp export`, `awp verify`; `spec/signed-lines.md`).
//!
//! NDJSON form: line 1 is the header `{"awp_transcript":1,"th":TH,"keys":[{"key":K,
//! "fingerprint":F}…]}` naming both keys; every following line is one record
//! `{"from":KEY,"line":LINE}` with LINE the thread's line as stored, in log order. The JSON
//! form is one object `{"header":HEADER,"lines":[RECORD…]}`; problems then count the header
//! as line 1 and record i (from 0) as line i + 2, the same numbers as in NDJSON.
//!
//! [`verify`] needs no node: every line but `chunk` must carry a `sig` that verifies under its
//! `from` key (`wire::sig`), every line belongs to the header's thread, ids increase
//! strictly (as byte strings) per author, and every `re` names an earlier line.

use crate::wire::{sig, PeerKey};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};

/// Version of the transcript format, in the header's `awp_transcript`.
pub const FORMAT: u64 = 1;

/// One thread line for export: its author's key and the line object as stored.
#[derive(Debug, Clone)]
pub struct Record {
    pub from: PeerKey,
    pub line: Value,
}

/// The header object for thread `th` between `keys` (ours first).
pub fn header(th: &str, keys: &[PeerKey]) -> Value {
    let keys: Vec<Value> = keys
        .iter()
        .map(|k| json!({"key": k.to_string(), "fingerprint": k.fingerprint()}))
        .collect();
    json!({"awp_transcript": FORMAT, "th": th, "keys": keys})
}

/// The NDJSON text of a transcript (header, then one record per line, `\n` after each).
pub fn to_ndjson(header: &Value, records: &[Record]) -> String {
    let mut out = String::new();
    out.push_str(&header.to_string());
    out.push('\n');
    for r in records {
        out.push_str(&record_value(r).to_string());
        out.push('\n');
    }
    out
}

/// The JSON text of a transcript: `{"header":…,"lines":[…]}`.
pub fn to_json(header: &Value, records: &[Record]) -> String {
    let lines: Vec<Value> = records.iter().map(record_value).collect();
    json!({"header": header, "lines": lines}).to_string()
}

fn record_value(r: &Record) -> Value {
    json!({"from": r.from.to_string(), "line": r.line})
}

/// One problem found by [`verify`]: the 1-based line number (header = 1) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

/// Check a transcript (NDJSON or JSON form, detected by content) offline; an empty list
/// means every signature, the thread, the id order and the `re` links hold.
pub fn verify(text: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut p = |line: usize, what: String| problems.push(Problem { line, what });
    // (line number, text of the record) pairs; the header first.
    let mut items: Vec<(usize, Value)> = Vec::new();
    let trimmed = text.trim_start();
    let whole = crate::wire::parse::strict_from_str(trimmed).ok();
    if let Some(Value::Object(mut doc)) = whole.filter(|v| v.get("header").is_some()) {
        items.push((1, doc.remove("header").unwrap_or(Value::Null)));
        match doc.remove("lines") {
            Some(Value::Array(lines)) => {
                items.extend(lines.into_iter().enumerate().map(|(i, l)| (i + 2, l)))
            }
            _ => p(1, "no `lines` array".into()),
        }
    } else {
        for (i, l) in text.lines().enumerate() {
            if l.trim().is_empty() {
                continue;
            }
            match crate::wire::parse::strict_from_str(l) {
                Ok(v) => items.push((i + 1, v)),
                Err(e) => p(i + 1, format!("not strict JSON: {e}")),
            }
        }
    }
    let Some((hline, head)) = items.first().cloned() else {
        p(1, "empty transcript".into());
        return problems;
    };
    if head.get("awp_transcript").and_then(Value::as_u64) != Some(FORMAT) {
        p(
            hline,
            format!("header: not an awp_transcript {FORMAT} header"),
        );
        return problems;
    }
    let th = head.get("th").and_then(Value::as_str).unwrap_or_default();
    let mut keys = HashSet::new();
    for k in head
        .get("keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match k.get("key").and_then(Value::as_str).map(PeerKey::parse) {
            Some(Ok(key)) => {
                if k.get("fingerprint").and_then(Value::as_str) != Some(&key.fingerprint()) {
                    p(hline, format!("header: fingerprint does not match {key}"));
                }
                keys.insert(key);
            }
            _ => p(hline, format!("header: bad key entry {k}")),
        }
    }
    let mut last_id: HashMap<PeerKey, String> = HashMap::new();
    let mut ids: HashSet<String> = HashSet::new();
    for (n, rec) in items.into_iter().skip(1) {
        let from = match rec.get("from").and_then(Value::as_str).map(PeerKey::parse) {
            Some(Ok(k)) if keys.contains(&k) => k,
            _ => {
                p(n, "`from` is not a key named in the header".into());
                if let Some(id) = rec.pointer("/line/id").and_then(Value::as_str) {
                    ids.insert(id.to_string());
                }
                continue;
            }
        };
        let Some(Value::Object(line)) = rec.get("line") else {
            p(n, "no `line` object".into());
            continue;
        };
        let kind = line.get("t").and_then(Value::as_str).unwrap_or_default();
        // Every line but blob data is signed; an unknown `t` is checked too (the signature
        // covers `t`, so a changed kind cannot skip the check).
        if kind != "chunk" {
            if let Err(e) = sig::verify_object(&from, line) {
                p(n, format!("{kind}: {e}"));
            }
        }
        if line.get("th").and_then(Value::as_str) != Some(th) {
            p(n, format!("{kind} is not in thread {th:?}"));
        }
        check_order(line, &from, &mut last_id, &mut ids, n, &mut p);
    }
    problems
}

fn check_order(
    line: &Map<String, Value>,
    from: &PeerKey,
    last_id: &mut HashMap<PeerKey, String>,
    ids: &mut HashSet<String>,
    n: usize,
    p: &mut impl FnMut(usize, String),
) {
    let Some(id) = line.get("id").and_then(Value::as_str) else {
        p(n, "no id".into());
        return;
    };
    if let Some(prev) = last_id.get(from) {
        if id.as_bytes() <= prev.as_bytes() {
            p(
                n,
                format!("id {id} does not follow {prev} from the same author"),
            );
        }
    }
    if let Some(re) = line.get("re").and_then(Value::as_str) {
        if !ids.contains(re) {
            p(n, format!("re {re} names no earlier line"));
        }
    }
    last_id.insert(*from, id.to_string());
    ids.insert(id.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::wire::sig::sign_encoded;

    fn line(who: &Identity, id: &str, th: &str, re: Option<&str>) -> Value {
        let mut v = json!({"t":"msg","id":id,"ts":"2026-11-30T18:00:00.000Z","th":th,
                           "parts":[{"k":"text","text":"hi"}]});
        if let Some(re) = re {
            v["re"] = json!(re);
        }
        let signed = sign_encoded(who, v.to_string().as_bytes()).unwrap();
        serde_json::from_slice(&signed).unwrap()
    }

    fn two() -> (Identity, Identity, Vec<Record>) {
        let a = Identity::from_seed(&[1; 32]);
        let b = Identity::from_seed(&[2; 32]);
        let recs = vec![
            Record {
                from: a.key(),
                line: line(&a, "01A", "thr_1", None),
            },
            Record {
                from: b.key(),
                line: line(&b, "01B", "thr_1", Some("01A")),
            },
            Record {
                from: a.key(),
                line: line(&a, "01C", "thr_1", Some("01B")),
            },
        ];
        (a, b, recs)
    }

    #[test]
    fn good_transcript_verifies_in_both_forms() {
        let (a, b, recs) = two();
        let h = header("thr_1", &[a.key(), b.key()]);
        assert_eq!(verify(&to_ndjson(&h, &recs)), vec![]);
        assert_eq!(verify(&to_json(&h, &recs)), vec![]);
    }

    #[test]
    fn every_single_byte_tamper_in_a_line_is_caught_with_its_number() {
        let (a, b, recs) = two();
        let h = header("thr_1", &[a.key(), b.key()]);
        let text = to_ndjson(&h, &recs);
        let lines: Vec<&str> = text.lines().collect();
        // Flip each byte of the second record (file line 3) in turn (bounded: one line).
        let target = lines[2].as_bytes();
        for i in 0..target.len() {
            let mut t = target.to_vec();
            t[i] ^= 0x01;
            let Ok(t) = String::from_utf8(t) else {
                continue;
            };
            let mut all = lines.clone();
            all[2] = &t;
            let probs = verify(&all.join("\n"));
            assert!(
                probs.iter().any(|p| p.line == 3),
                "flip at byte {i} ({t}) not caught: {probs:?}"
            );
        }
    }

    #[test]
    fn line_from_another_thread_is_caught() {
        let (a, b, mut recs) = two();
        recs.push(Record {
            from: b.key(),
            line: line(&b, "01D", "thr_2", None),
        });
        let h = header("thr_1", &[a.key(), b.key()]);
        let probs = verify(&to_ndjson(&h, &recs));
        assert_eq!(probs.len(), 1, "{probs:?}");
        assert_eq!(probs[0].line, 5);
    }

    #[test]
    fn order_re_and_unsigned_problems() {
        let (a, b, mut recs) = two();
        recs.swap(0, 2); // 01C before 01A from a; 01B's re now points forward.
        let mut unsigned = line(&b, "01E", "thr_1", None);
        unsigned.as_object_mut().unwrap().remove("sig");
        recs.push(Record {
            from: b.key(),
            line: unsigned,
        });
        let h = header("thr_1", &[a.key(), b.key()]);
        let text: Vec<String> = verify(&to_ndjson(&h, &recs))
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert!(
            text.iter().any(|p| p.starts_with("line 2: re 01B")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|p| p.starts_with("line 4: id 01A")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|p| p == "line 5: msg: line has no sig"),
            "{text:?}"
        );
    }

    #[test]
    fn foreign_author_and_bad_header_are_caught() {
        let (a, b, recs) = two();
        let c = Identity::from_seed(&[3; 32]);
        let h = header("thr_1", &[a.key(), c.key()]);
        let probs = verify(&to_ndjson(&h, &recs));
        assert_eq!(
            probs,
            vec![Problem {
                line: 3,
                what: "`from` is not a key named in the header".into()
            }]
        );
        assert_eq!(verify("{}\n")[0].line, 1);
        assert_eq!(verify("")[0].line, 1);
        let _ = b;
    }
}
