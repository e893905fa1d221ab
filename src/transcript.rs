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

use crate::store::{Dir, Store, StoreError};
use crate::wire::{sig, PeerKey};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Version of the transcript format, in the header's `awp_transcript`.
pub const FORMAT: u64 = 1;

/// One thread line for export: its author's key and the line's JSON text exactly as stored
/// (for a received line, the bytes received), so that its `sig` checks over it.
#[derive(Debug, Clone)]
pub struct Record {
    pub from: PeerKey,
    pub line: String,
}

/// One page of thread `th` with `peer`'s stored lines for the control request
/// `thread_lines` ([`crate::control::Request::ThreadLines`]): log entries with seq >
/// `after`, at most [`crate::control::PAGE_ITEMS`] and [`crate::control::PAGE_BYTES`] of
/// line bytes (at least one line unless the page held only stubs), each line's stored bytes
/// as a string. The out log's chunk stubs of streamed blobs (`"data":""` with `x_off`, see
/// [`crate::blob::stream`]) are left out: they are not the lines sent, and `next` still
/// passes them. Errors: the store's.
pub fn stored_page(
    store: &Store,
    peer: &PeerKey,
    th: &str,
    after: u64,
) -> Result<Value, StoreError> {
    use crate::control::{PAGE_BYTES, PAGE_ITEMS};
    let entries = store.thread_log(after, peer, th, false, PAGE_ITEMS + 1)?;
    let mut more = entries.len() > PAGE_ITEMS;
    let mut lines = Vec::new();
    let mut bytes = 0;
    let mut last = after;
    for e in entries {
        if e.dir == Dir::Out && is_out_stub(&e.line) {
            last = e.seq;
            continue;
        }
        if !lines.is_empty() && (bytes + e.line.len() > PAGE_BYTES || lines.len() >= PAGE_ITEMS) {
            more = true;
            break;
        }
        bytes += e.line.len();
        last = e.seq;
        let dir = if e.dir == Dir::Out { "out" } else { "in" };
        // Stored lines were strictly parsed (inbound) or encoded by us: UTF-8. A line that
        // is not would be shown with U+FFFD, and its signature then fails at `awp verify`.
        let text = String::from_utf8_lossy(&e.line);
        lines.push(json!({"seq": e.seq, "dir": dir, "line": text}));
    }
    let mut v = json!({"peer": peer.to_string(), "th": th, "lines": lines});
    if more {
        v["next"] = json!(last);
    }
    Ok(v)
}

/// Whether out-log line `line` is the stored stub of a streamed blob's chunk: a `chunk`
/// whose data is left out and located by `x_off` (written by the store at `send -f`).
fn is_out_stub(line: &[u8]) -> bool {
    line.starts_with(br#"{"t":"chunk","#)
        && serde_json::from_slice::<Map<String, Value>>(line).is_ok_and(|l| l.contains_key("x_off"))
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
/// Each record's `line` is the stored text verbatim.
pub fn to_ndjson(header: &Value, records: &[Record]) -> String {
    let mut out = String::new();
    out.push_str(&header.to_string());
    out.push('\n');
    for r in records {
        push_record(&mut out, r);
        out.push('\n');
    }
    out
}

/// The JSON text of a transcript: `{"header":…,"lines":[…]}` (lines verbatim, as in NDJSON).
pub fn to_json(header: &Value, records: &[Record]) -> String {
    let mut out = String::from("{\"header\":");
    out.push_str(&header.to_string());
    out.push_str(",\"lines\":[");
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_record(&mut out, r);
    }
    out.push_str("]}");
    out
}

fn push_record(out: &mut String, r: &Record) {
    out.push_str("{\"from\":");
    out.push_str(&Value::from(r.from.to_string()).to_string());
    out.push_str(",\"line\":");
    out.push_str(r.line.trim_end_matches(['\n', '\r']));
    out.push('}');
}

/// A blob of an exported thread: its author, `ref`, size in bytes and lowercase hex
/// SHA-256, as listed in the header's `blobs` (`awp export --with-blobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobEntry {
    pub from: PeerKey,
    pub blob_ref: String,
    pub size: u64,
    pub sha256: String,
}

/// Chunk lines of one blob seen in a transcript: (`n`, `last`, `data`, line number).
type Chunks = Vec<(u64, bool, String, usize)>;

/// The bytes of a blob from its chunk lines: chunks `0..=k` each once, in order of `n`,
/// the last one marked `last`, data base64. Errors say what is wrong.
fn assemble(chunks: &Chunks) -> Result<Vec<u8>, String> {
    let mut sorted: Vec<&(u64, bool, String, usize)> = chunks.iter().collect();
    sorted.sort_by_key(|c| c.0);
    let mut data = Vec::new();
    for (i, (n, last, d, _)) in sorted.iter().map(|c| (c.0, c.1, &c.2, c.3)).enumerate() {
        if n != i as u64 {
            return Err(format!("chunk {i} missing or repeated (found n={n})"));
        }
        let bytes =
            crate::wire::b64::decode_any(d).map_err(|e| format!("chunk {n}: bad data: {e}"))?;
        data.extend_from_slice(&bytes);
        if last != (i + 1 == sorted.len()) {
            return Err("chunks do not end with the one marked last".into());
        }
    }
    if sorted.is_empty() {
        return Err("no chunks".into());
    }
    Ok(data)
}

fn chunk_of(line: &Map<String, Value>) -> Option<(String, u64, bool, String)> {
    Some((
        line.get("ref")?.as_str()?.to_string(),
        line.get("n")?.as_u64()?,
        line.get("last").and_then(Value::as_bool).unwrap_or(false),
        line.get("data")?.as_str()?.to_string(),
    ))
}

/// The blob parts of msg line `line`: (`ref`, declared `size`) of each part with
/// `"k":"blob"` and both fields; none for a line that is not a msg.
fn blob_parts(line: &Map<String, Value>) -> impl Iterator<Item = (&str, u64)> {
    let msg = line.get("t").and_then(Value::as_str) == Some("msg");
    line.get("parts")
        .and_then(Value::as_array)
        .filter(|_| msg)
        .into_iter()
        .flatten()
        .filter(|part| part.get("k").and_then(Value::as_str) == Some("blob"))
        .filter_map(|part| {
            Some((
                part.get("ref").and_then(Value::as_str)?,
                part.get("size").and_then(Value::as_u64)?,
            ))
        })
}

/// The blobs the msg lines of `records` name, in order, each once: (author, `ref`,
/// declared `size`).
pub fn named_blobs(records: &[Record]) -> Vec<(PeerKey, String, u64)> {
    let mut out: Vec<(PeerKey, String, u64)> = Vec::new();
    for r in records {
        let Ok(Value::Object(line)) = crate::wire::parse::strict_from_str(&r.line) else {
            continue;
        };
        for (b, size) in blob_parts(&line) {
            if !out.iter().any(|(f, x, _)| *f == r.from && x == b) {
                out.push((r.from, b.to_string(), size));
            }
        }
    }
    out
}

/// Copy blob file `src` into `dir` (created when missing) as `dir/<sha256>` when its bytes
/// are `size` long and hash to `sha256` (lowercase hex), as recorded by the node. Errors
/// (I/O, or a file that no longer holds the blob) as text; nothing is written then.
pub fn copy_blob(src: &Path, dir: &Path, sha256: &str, size: u64) -> Result<(), String> {
    let data = std::fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?;
    if data.len() as u64 != size || crate::blob::hex(&Sha256::digest(&data)) != sha256 {
        return Err(format!("{} no longer holds the blob", src.display()));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(sha256);
    std::fs::write(&path, &data).map_err(|e| format!("{}: {e}", path.display()))
}

/// `header` with a `blobs` list `[{"from":KEY,"ref":REF,"size":N,"sha256":HEX}…]`.
pub fn with_blobs(mut header: Value, blobs: &[BlobEntry]) -> Value {
    let list: Vec<Value> = blobs
        .iter()
        .map(|b| json!({"from": b.from.to_string(), "ref": b.blob_ref, "size": b.size, "sha256": b.sha256}))
        .collect();
    header["blobs"] = Value::Array(list);
    header
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
/// means every signature, the thread, the id order and the `re` links hold. Blob files are
/// not read (see [`verify_with`]).
pub fn verify(text: &str) -> Vec<Problem> {
    verify_with(text, None)
}

/// [`verify`], and with `blob_dir` also the blobs the header lists (`awp verify FILE
/// --blobs DIR`): each must be the file `DIR/<sha256>` with those bytes (one problem per
/// missing or altered file), its size must be the one the signed msg naming it declares,
/// and the chunk lines of the transcript must hold the same bytes; every blob a msg names
/// must be listed. Without `blob_dir` the listed hashes are still checked against the chunk
/// lines. A blob's problem carries the number of the msg naming it (else the header's).
pub fn verify_with(text: &str, blob_dir: Option<&Path>) -> Vec<Problem> {
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
    let mut blobs = BlobCheck::default();
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
        blobs.note(&from, kind, line, n);
    }
    blobs.check(&head, hline, blob_dir, &mut p);
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

/// What a transcript says about its blobs, gathered while its lines are checked.
#[derive(Default)]
struct BlobCheck {
    /// (author, ref) → (line number of the first msg naming it, declared size).
    named: BTreeMap<(String, String), (usize, u64)>,
    /// (author, ref) → its chunk lines.
    chunks: BTreeMap<(String, String), Chunks>,
}

impl BlobCheck {
    fn note(&mut self, from: &PeerKey, kind: &str, line: &Map<String, Value>, n: usize) {
        match kind {
            "msg" => {
                for (r, size) in blob_parts(line) {
                    self.named
                        .entry((from.to_string(), r.to_string()))
                        .or_insert((n, size));
                }
            }
            "chunk" => {
                if let Some((r, cn, last, data)) = chunk_of(line) {
                    self.chunks
                        .entry((from.to_string(), r))
                        .or_default()
                        .push((cn, last, data, n));
                }
            }
            _ => {}
        }
    }

    fn check(
        &self,
        head: &Value,
        hline: usize,
        dir: Option<&Path>,
        p: &mut impl FnMut(usize, String),
    ) {
        let none = Vec::new();
        let list = match head.get("blobs") {
            None if dir.is_none() => return,
            None => &none,
            Some(Value::Array(list)) => list,
            Some(_) => {
                p(hline, "header: `blobs` is not a list".into());
                return;
            }
        };
        let mut listed = HashSet::new();
        for b in list {
            let (Some(from), Some(r), Some(size), Some(sha)) = (
                b.get("from").and_then(Value::as_str),
                b.get("ref").and_then(Value::as_str),
                b.get("size").and_then(Value::as_u64),
                b.get("sha256").and_then(Value::as_str),
            ) else {
                p(hline, format!("header: bad blob entry {b}"));
                continue;
            };
            // A file name: exactly 64 lowercase hex digits, never a path.
            if sha.len() != 64 || !sha.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                p(
                    hline,
                    format!("header: blob {r:?}: sha256 is not 64 lowercase hex digits"),
                );
                continue;
            }
            let key = (from.to_string(), r.to_string());
            let at = self.named.get(&key).map_or(hline, |(n, _)| *n);
            listed.insert(key.clone());
            match self.named.get(&key) {
                None => p(hline, format!("blob {r:?} from {from} is named by no msg")),
                Some((n, declared)) if *declared != size => p(
                    *n,
                    format!("blob {r:?}: listed size {size} is not the declared {declared}"),
                ),
                Some(_) => {}
            }
            if let Some(chunks) = self.chunks.get(&key) {
                match assemble(chunks) {
                    Ok(data) if crate::blob::hex(&Sha256::digest(&data)) != sha => p(
                        at,
                        format!("blob {r:?}: its chunk lines do not hash to the listed sha256"),
                    ),
                    Ok(_) => {}
                    Err(e) => p(at, format!("blob {r:?}: {e}")),
                }
            }
            if let Some(dir) = dir {
                let path = dir.join(sha);
                match std::fs::read(&path) {
                    Err(e) => p(at, format!("blob {r:?}: {}: {e}", path.display())),
                    Ok(data) => {
                        if data.len() as u64 != size
                            || crate::blob::hex(&Sha256::digest(&data)) != sha
                        {
                            p(
                                at,
                                format!("blob {r:?}: {} does not hold its bytes", path.display()),
                            )
                        }
                    }
                }
            }
        }
        if dir.is_some() {
            for ((from, r), (n, _)) in &self.named {
                if !listed.contains(&(from.clone(), r.clone())) {
                    p(*n, format!("blob {r:?} is not in the header's blobs"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::wire::sig::sign_encoded;

    fn line(who: &Identity, id: &str, th: &str, re: Option<&str>) -> String {
        let mut v = json!({"t":"msg","id":id,"ts":"2026-11-30T18:00:00.000Z","th":th,
                           "parts":[{"k":"text","text":"hi"}]});
        if let Some(re) = re {
            v["re"] = json!(re);
        }
        let signed = sign_encoded(who, v.to_string().as_bytes()).unwrap();
        String::from_utf8(signed).unwrap()
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
        let mut unsigned: Value = serde_json::from_str(&line(&b, "01E", "thr_1", None)).unwrap();
        unsigned.as_object_mut().unwrap().remove("sig");
        recs.push(Record {
            from: b.key(),
            line: unsigned.to_string(),
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

    /// A thread with one blob `r1` (two chunks) named by a signed msg, as exported with
    /// `--with-blobs`: (header, records, blob bytes).
    fn with_blob() -> (Value, Vec<Record>, Vec<u8>) {
        let a = Identity::from_seed(&[1; 32]);
        let b = Identity::from_seed(&[2; 32]);
        let data = b"hello blob".to_vec();
        let chunk = |id: &str, n: u64, last: bool, d: &[u8]| Record {
            from: a.key(),
            line: json!({"t":"chunk","id":id,"ts":"2026-11-30T18:00:00.000Z","th":"thr_1",
                         "ref":"r1","n":n,"last":last,"data":crate::wire::b64::encode_std(d)})
            .to_string(),
        };
        let m = json!({"t":"msg","id":"01C","ts":"2026-11-30T18:00:00.000Z","th":"thr_1",
                       "parts":[{"k":"blob","ref":"r1","size":data.len()}]});
        let m = String::from_utf8(sign_encoded(&a, m.to_string().as_bytes()).unwrap()).unwrap();
        let recs = vec![
            chunk("01A", 0, false, &data[..4]),
            chunk("01B", 1, true, &data[4..]),
            Record {
                from: a.key(),
                line: m,
            },
        ];
        let entry = BlobEntry {
            from: a.key(),
            blob_ref: "r1".into(),
            size: data.len() as u64,
            sha256: crate::blob::hex(&Sha256::digest(&data)),
        };
        let h = with_blobs(header("thr_1", &[a.key(), b.key()]), &[entry]);
        (h, recs, data)
    }

    fn problems_with(h: &Value, recs: &[Record], dir: Option<&Path>) -> Vec<String> {
        verify_with(&to_ndjson(h, recs), dir)
            .iter()
            .map(|p| p.to_string())
            .collect()
    }

    #[test]
    fn blob_files_checked_and_each_rejection_reported() {
        let (h, recs, data) = with_blob();
        let sha = h["blobs"][0]["sha256"].as_str().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        // Missing file.
        let p = problems_with(&h, &recs, Some(dir.path()));
        assert!(
            p.len() == 1 && p[0].starts_with("line 4: blob \"r1\": "),
            "{p:?}"
        );
        // Good file; without a dir the files are not read.
        std::fs::write(dir.path().join(&sha), &data).unwrap();
        assert_eq!(
            problems_with(&h, &recs, Some(dir.path())),
            Vec::<String>::new()
        );
        assert_eq!(problems_with(&h, &recs, None), Vec::<String>::new());
        // Altered file.
        std::fs::write(dir.path().join(&sha), b"hello blub").unwrap();
        let p = problems_with(&h, &recs, Some(dir.path()));
        assert!(
            p.len() == 1 && p[0].contains("does not hold its bytes"),
            "{p:?}"
        );
        std::fs::write(dir.path().join(&sha), &data).unwrap();
        // Listed size differs from the signed one.
        let mut bad = h.clone();
        bad["blobs"][0]["size"] = json!(3);
        let p = problems_with(&bad, &recs, None);
        assert!(p.iter().any(|p| p.contains("not the declared 10")), "{p:?}");
        // A sha256 that is not a file name of 64 hex digits (never a path).
        let mut bad = h.clone();
        bad["blobs"][0]["sha256"] = json!("../etc/passwd");
        let p = problems_with(&bad, &recs, Some(dir.path()));
        assert!(p.iter().any(|p| p.contains("64 lowercase hex")), "{p:?}");
        // Chunk lines that do not hash to the listed sha256.
        let mut bad = h.clone();
        bad["blobs"][0]["sha256"] = json!("0".repeat(64));
        let p = problems_with(&bad, &recs, None);
        assert!(
            p.iter().any(|p| p.contains("chunk lines do not hash")),
            "{p:?}"
        );
        // A blob named by a msg but not listed (checked with a dir).
        let mut bad = h.clone();
        bad["blobs"] = json!([]);
        let p = problems_with(&bad, &recs, Some(dir.path()));
        assert!(
            p.iter().any(|p| p.contains("not in the header's blobs")),
            "{p:?}"
        );
        // Listed but named by no msg; and an entry with fields missing; blobs not a list.
        let mut bad = h.clone();
        bad["blobs"][0]["ref"] = json!("r2");
        let p = problems_with(&bad, &recs, None);
        assert!(p.iter().any(|p| p.contains("named by no msg")), "{p:?}");
        let mut bad = h.clone();
        bad["blobs"] = json!([{"ref": "r1"}]);
        assert!(problems_with(&bad, &recs, None)[0].contains("bad blob entry"));
        let mut bad = h.clone();
        bad["blobs"] = json!({});
        assert!(problems_with(&bad, &recs, None)[0].contains("not a list"));
        // A missing chunk.
        let p = problems_with(&h, &[recs[1].clone(), recs[2].clone()], None);
        assert!(p.iter().any(|p| p.contains("chunk 0 missing")), "{p:?}");
    }

    #[test]
    fn records_keep_the_stored_text_verbatim() {
        let a = Identity::from_seed(&[1; 32]);
        let raw = r#"{ "t":"msg" , "id":"01A","ts":"2026-11-30T18:00:00.000Z","th":"thr_1","parts":[{"k":"text","text":"caf\u00e9"}] }"#;
        let signed = String::from_utf8(sign_encoded(&a, raw.as_bytes()).unwrap()).unwrap();
        let recs = vec![Record {
            from: a.key(),
            line: signed.clone(),
        }];
        let h = header("thr_1", &[a.key()]);
        let nd = to_ndjson(&h, &recs);
        assert_eq!(
            nd.lines().nth(1).unwrap(),
            format!("{{\"from\":\"{}\",\"line\":{signed}}}", a.key())
        );
        assert!(to_json(&h, &recs).contains(&signed));
        assert_eq!(verify(&nd), vec![]);
        assert_eq!(verify(&to_json(&h, &recs)), vec![]);
    }
}
