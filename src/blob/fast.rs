//! Parsing a received chunk line without building a JSON value of it (issue 10 §3): the
//! line is decoded straight into its fields, and the base64 data, found at the line's end
//! and checked as base64 without a JSON scan, copied once. Only lines in the form senders
//! emit (`{"t":"chunk",…,"data":"…"}`, known fields only, no escapes in the strings,
//! standard padded base64) take this path; everything else — and everything the strict
//! parser would refuse — gets `None`, and the caller uses [`crate::wire::parse_line`],
//! which gives the same [`Line`] for any line this accepts, and the error for the rest.

use crate::wire::{self, parse::MAX_ID_LEN, Chunk, Line, MAX_LINE, MAX_SAFE_INT};
use serde::Deserialize;

/// The fields of a chunk line other than `data`, borrowed from it. Unknown fields (a
/// second `data` among them) make the line take the strict parser (which also checks
/// them); a repeated field is an error here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Head<'a> {
    t: &'a str,
    id: &'a str,
    ts: &'a str,
    #[serde(default, borrow)]
    th: Option<&'a str>,
    #[serde(rename = "ref")]
    blob_ref: &'a str,
    n: u64,
    last: bool,
}

/// The member senders put last, before the data and its closing `"}`.
const DATA_KEY: &[u8] = br#","data":""#;

/// `raw` (one line without its `\n`) as a chunk when it is one in the plain form above and
/// passes every check of [`wire::parse_line`] (size, UTF-8, no duplicate keys, integers
/// within ±(2^53−1), id non-empty, id and th at most [`MAX_ID_LEN`] bytes, ts RFC 3339);
/// `None` otherwise (then ask [`wire::parse_line`]).
///
/// The data is not scanned as JSON: the line must end with `,"data":"…"}` and the data be
/// standard padded base64 (checked with SIMD), which has no byte that a JSON string would
/// escape or end at. What comes before it is parsed with `}` in place of the data member:
/// that parses only when the cut is between two members of the top-level object, so the
/// line is that object with one more member, `data`.
pub fn parse_chunk(raw: &[u8]) -> Option<Line> {
    if raw.len() > MAX_LINE || !raw.starts_with(br#"{"t":"chunk","#) {
        return None;
    }
    let body = raw.strip_suffix(b"\"}")?;
    let at = memchr::memmem::find(body, DATA_KEY)?;
    let data = &body[at + DATA_KEY.len()..];
    base64_simd::STANDARD.check(data).ok()?;
    let mut head = Vec::with_capacity(at + 1);
    head.extend_from_slice(&body[..at]);
    head.push(b'}');
    let text = std::str::from_utf8(&head).ok()?;
    let h: Head<'_> = serde_json::from_str(text).ok()?;
    let ok = h.t == "chunk"
        && !h.id.is_empty()
        && h.id.len() <= MAX_ID_LEN
        && h.th.is_none_or(|th| th.len() <= MAX_ID_LEN)
        && h.n <= MAX_SAFE_INT
        && wire::time::parse_rfc3339(h.ts).is_ok();
    if !ok {
        return None;
    }
    // Base64 text is ASCII, so valid UTF-8.
    let data = String::from_utf8(data.to_vec()).ok()?;
    Some(Line::Chunk(Chunk {
        id: h.id.to_owned(),
        ts: h.ts.to_owned(),
        th: h.th.map(str::to_owned),
        blob_ref: h.blob_ref.to_owned(),
        n: h.n,
        last: h.last,
        data,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical() -> Vec<u8> {
        Line::Chunk(Chunk {
            id: "01K00000000000000000000001".into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            th: Some("thr_1".into()),
            blob_ref: "r1".into(),
            n: 7,
            last: false,
            data: wire::b64::encode_std(b"hello, world"),
        })
        .encode()
    }

    /// The fast path either declines or agrees with the strict parser.
    fn agrees(line: &[u8]) -> bool {
        match parse_chunk(line) {
            None => true,
            Some(fast) => wire::parse_line(line).as_ref() == Ok(&fast),
        }
    }

    #[test]
    fn plain_chunk_lines_take_the_fast_path_and_parse_the_same() {
        let c = canonical();
        let fast = parse_chunk(&c).expect("the form senders emit");
        assert_eq!(Ok(fast), wire::parse_line(&c));
        let no_th = br#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""}"#;
        assert!(parse_chunk(no_th).is_some());
        assert!(agrees(no_th));
        // Data in another form than standard padded base64 is the strict parser's.
        let unpadded = br#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":"aGk"}"#;
        assert!(parse_chunk(unpadded).is_none());
        assert!(wire::parse_line(unpadded).is_ok());
    }

    /// Every line the strict parser refuses is declined here (each a rejection of the
    /// strict parser: duplicate key, big or negative or fractional integer, bad ts, empty
    /// or long id, long th, unknown or nested field, escapes, other type, trailing data).
    #[test]
    fn anything_else_is_left_to_the_strict_parser() {
        let long = "x".repeat(MAX_ID_LEN + 1);
        let cases: Vec<String> = vec![
            r#"{"t":"chunk","id":"a","id":"b","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":9007199254740992,"last":true,"data":""}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":-1,"last":true,"data":""}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":1.5,"last":true,"data":""}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"yesterday","ref":"r","n":0,"last":true,"data":""}"#.into(),
            r#"{"t":"chunk","id":"","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""}"#.into(),
            format!(r#"{{"t":"chunk","id":"{long}","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""}}"#),
            format!(r#"{{"t":"chunk","id":"a","th":"{long}","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""}}"#),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":"","x":{"y":1,"y":2}}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":"aGk\u003d"}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":"yes","data":""}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""} x"#.into(),
            r#"{"t":"chunk","t":"msg","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":""}"#.into(),
            r#"["chunk","a","2026-01-01T00:00:00Z",null,"r",0,true,""]"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":"aGk=","data":"aGk="}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"x":[1,"data":"aGk="}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"x":{"last":true,"data":"aGk="}"#.into(),
            r#"{"t":"chunk","id":"a,"data":"aGk="}"#.into(),
            r#"{"t":"chunk","data":"aGk=","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true}"#.into(),
            r#"{"t":"chunk","id":"a","ts":"2026-01-01T00:00:00Z","ref":"r","n":0,"last":true,"data":"aG\k="}"#.into(),
            "{\"t\":\"chunk\",\"id\":\"a\",\"ts\":\"2026-01-01T00:00:00Z\",\"ref\":\"r\",\"n\":0,\"last\":true,\"data\":\"aGk\u{1}\"}".into(),
        ];
        for c in &cases {
            assert!(parse_chunk(c.as_bytes()).is_none(), "fast path took {c}");
            assert!(agrees(c.as_bytes()));
        }
        let mut over = canonical();
        over.resize(MAX_LINE + 1, b' ');
        assert!(parse_chunk(&over).is_none());
        assert!(parse_chunk(b"{\"t\":\"chunk\",\xff}").is_none());
    }

    /// Random byte changes to a chunk line (bounded): whatever the fast path accepts, the
    /// strict parser accepts as the same line.
    #[test]
    fn mutated_lines_never_disagree() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let base = canonical();
        let alphabet = b"{}[]\",:\\0123456789-+.eEtfnul aZ/=\r\n";
        for _ in 0..5000 {
            let mut l = base.clone();
            for _ in 0..rng.gen_range(1..4) {
                let i = rng.gen_range(0..l.len());
                l[i] = alphabet[rng.gen_range(0..alphabet.len())];
            }
            assert!(agrees(&l), "{}", String::from_utf8_lossy(&l));
        }
    }
}
