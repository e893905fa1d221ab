//! One test per refusal (and per deliberate acceptance) of `parse_line`
//! (protocol-notes §Framing, §Envelope), plus encode/parse round trips.

use awp_node::wire::*;
use proptest::prelude::*;

const TS: &str = "2026-01-01T00:00:00.000Z";

fn bad_frame(line: &[u8]) -> (String, Option<String>) {
    match parse_line(line) {
        Err(FrameError::BadFrame { detail, id }) => (detail, id),
        other => panic!(
            "expected BadFrame for {:?}, got {other:?}",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        ),
    }
}

fn msg_line(text: &str) -> String {
    format!(
        r#"{{"t":"msg","id":"m1","ts":"{TS}","th":"th1","parts":[{{"k":"text","text":"{text}"}}]}}"#
    )
}

#[test]
fn over_cap_is_too_large() {
    let line = vec![b' '; MAX_LINE + 1];
    let err = parse_line(&line).unwrap_err();
    assert_eq!(err, FrameError::TooLarge { max: MAX_LINE });
    assert_eq!(err.code(), "too_large");
}

#[test]
fn valid_msg_of_exactly_the_cap_is_accepted() {
    let empty = msg_line("").len();
    let line = msg_line(&"a".repeat(MAX_LINE - empty));
    assert_eq!(line.len(), MAX_LINE);
    let Line::Msg(m) = parse_line(line.as_bytes()).unwrap() else {
        panic!("not a msg")
    };
    let Part::Text(t) = &m.parts[0] else {
        panic!("not text")
    };
    assert_eq!(t.text.len(), MAX_LINE - empty);
}

#[test]
fn valid_msg_one_byte_over_the_cap_is_too_large() {
    let empty = msg_line("").len();
    let line = msg_line(&"a".repeat(MAX_LINE - empty + 1));
    assert!(matches!(
        parse_line(line.as_bytes()),
        Err(FrameError::TooLarge { .. })
    ));
}

#[test]
fn invalid_utf8_is_bad_frame() {
    let mut line = msg_line("x").into_bytes();
    let at = line.len() - 5;
    line[at] = 0xff;
    let (detail, _) = bad_frame(&line);
    assert!(detail.contains("UTF-8"), "{detail}");
}

#[test]
fn empty_line_is_bad_frame() {
    bad_frame(b"");
}

#[test]
fn whitespace_only_line_is_bad_frame() {
    bad_frame(b" \r");
}

#[test]
fn array_is_bad_frame() {
    bad_frame(b"[1,2,3]");
}

#[test]
fn number_is_bad_frame() {
    bad_frame(b"42");
}

#[test]
fn json_string_is_bad_frame() {
    bad_frame(b"\"\"");
}

#[test]
fn not_json_is_bad_frame() {
    bad_frame(b"this is not json");
}

#[test]
fn broken_object_is_bad_frame() {
    bad_frame(br#"{"t":"msg",oops}"#);
}

#[test]
fn trailing_garbage_is_bad_frame() {
    bad_frame(format!(r#"{{"t":"ping","id":"p","ts":"{TS}"}} x"#).as_bytes());
}

#[test]
fn two_objects_on_one_line_is_bad_frame() {
    let p = format!(r#"{{"t":"ping","id":"p","ts":"{TS}"}}"#);
    bad_frame(format!("{p}{p}").as_bytes());
}

#[test]
fn missing_t_is_bad_frame_with_id() {
    let (_, id) = bad_frame(br#"{"id":"x","ts":"2026-01-01T00:00:00Z"}"#);
    assert_eq!(id.as_deref(), Some("x"));
}

#[test]
fn non_string_t_is_bad_frame() {
    let (_, id) = bad_frame(format!(r#"{{"t":7,"id":"x","ts":"{TS}"}}"#).as_bytes());
    assert_eq!(id.as_deref(), Some("x"));
    bad_frame(format!(r#"{{"t":null,"id":"x","ts":"{TS}"}}"#).as_bytes());
}

#[test]
fn duplicate_top_level_key_is_bad_frame() {
    bad_frame(format!(r#"{{"t":"ping","id":"a","id":"b","ts":"{TS}"}}"#).as_bytes());
}

#[test]
fn duplicate_key_after_unescaping_is_bad_frame() {
    bad_frame(format!(r#"{{"t":"ping","id":"a","\u0069d":"b","ts":"{TS}"}}"#).as_bytes());
}

#[test]
fn duplicate_key_inside_a_part_is_bad_frame() {
    let line = format!(
        r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"text","text":"a","text":"b"}}]}}"#
    );
    let (_, id) = bad_frame(line.as_bytes());
    assert_eq!(id.as_deref(), Some("m"));
}

#[test]
fn duplicate_key_inside_data_is_bad_frame() {
    let line = format!(
        r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"data","data":{{"x":{{"y":1,"y":2}}}}}}]}}"#
    );
    bad_frame(line.as_bytes());
}

#[test]
fn duplicate_key_inside_unknown_type_is_bad_frame() {
    bad_frame(br#"{"t":"frobnicate","a":{"b":1,"b":1}}"#);
}

#[test]
fn integer_beyond_safe_range_in_known_field_is_bad_frame() {
    let line = format!(
        r#"{{"t":"hello","id":"h","ts":"{TS}","v":9007199254740992,"key":"k","nonce":"n"}}"#
    );
    let (_, id) = bad_frame(line.as_bytes());
    assert_eq!(id.as_deref(), Some("h"));
}

#[test]
fn largest_safe_integer_is_accepted() {
    let line = format!(
        r#"{{"t":"chunk","id":"c","ts":"{TS}","ref":"r","n":9007199254740991,"last":true,"data":""}}"#
    );
    let Line::Chunk(c) = parse_line(line.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(c.n, MAX_SAFE_INT);
}

#[test]
fn integer_beyond_safe_range_inside_data_is_bad_frame() {
    for n in [
        "9007199254740992",
        "-9007199254740992",
        "18446744073709551616",
        "123456789012345678901234567890",
    ] {
        let line = format!(
            r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"data","data":{{"n":[{n}]}}}}]}}"#
        );
        bad_frame(line.as_bytes());
    }
}

#[test]
fn integer_beyond_safe_range_in_unknown_field_is_bad_frame() {
    bad_frame(format!(r#"{{"t":"ping","id":"p","ts":"{TS}","x":-99999999999999999}}"#).as_bytes());
}

#[test]
fn floats_inside_data_are_accepted() {
    let line = format!(
        r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"data","data":[1.5,1e300,-0.0,9007199254740993.0]}}]}}"#
    );
    assert!(parse_line(line.as_bytes()).is_ok());
}

#[test]
fn float_in_integer_field_is_bad_frame() {
    bad_frame(
        format!(r#"{{"t":"chunk","id":"c","ts":"{TS}","ref":"r","n":1.5,"last":true,"data":""}}"#)
            .as_bytes(),
    );
}

#[test]
fn negative_integer_in_unsigned_field_is_bad_frame() {
    bad_frame(
        format!(r#"{{"t":"chunk","id":"c","ts":"{TS}","ref":"r","n":-1,"last":true,"data":""}}"#)
            .as_bytes(),
    );
}

#[test]
fn known_type_missing_required_field_is_bad_frame_with_id() {
    // ack without re
    let (detail, id) =
        bad_frame(format!(r#"{{"t":"ack","id":"a9","ts":"{TS}","th":"t"}}"#).as_bytes());
    assert_eq!(id.as_deref(), Some("a9"));
    assert!(detail.contains("re"), "{detail}");
    // msg without th, hello without nonce
    bad_frame(format!(r#"{{"t":"msg","id":"m","ts":"{TS}","parts":[]}}"#).as_bytes());
    bad_frame(format!(r#"{{"t":"hello","id":"h","ts":"{TS}","v":0,"key":"k"}}"#).as_bytes());
}

#[test]
fn known_type_wrong_json_type_is_bad_frame_with_id() {
    let (_, id) = bad_frame(
        format!(r#"{{"t":"chunk","id":"c1","ts":"{TS}","ref":"r","n":0,"last":"yes","data":""}}"#)
            .as_bytes(),
    );
    assert_eq!(id.as_deref(), Some("c1"));
    bad_frame(format!(r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":{{}}}}"#).as_bytes());
    bad_frame(format!(r#"{{"t":"resume","id":"r","ts":"{TS}","seen":{{"t":5}}}}"#).as_bytes());
}

#[test]
fn known_part_kind_missing_field_is_bad_frame() {
    bad_frame(
        format!(
            r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"blob","ref":"r"}}]}}"#
        )
        .as_bytes(),
    );
    bad_frame(
        format!(r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"data"}}]}}"#)
            .as_bytes(),
    );
    bad_frame(
        format!(r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"text":"no k"}}]}}"#)
            .as_bytes(),
    );
}

#[test]
fn bad_ts_is_bad_frame_with_id() {
    for ts in [
        r#""yesterday""#,
        r#""2026-13-01T00:00:00Z""#,
        "12",
        r#""2026-01-01 00:00:00""#,
    ] {
        let (_, id) = bad_frame(format!(r#"{{"t":"ping","id":"p","ts":{ts}}}"#).as_bytes());
        assert_eq!(id.as_deref(), Some("p"), "{ts}");
    }
}

#[test]
fn any_rfc3339_ts_is_accepted() {
    let line = r#"{"t":"ping","id":"p","ts":"2026-09-25T15:30:00.123456789-04:30"}"#;
    assert!(parse_line(line.as_bytes()).is_ok());
}

#[test]
fn missing_or_empty_or_non_string_id_is_bad_frame() {
    bad_frame(format!(r#"{{"t":"ping","ts":"{TS}"}}"#).as_bytes());
    bad_frame(format!(r#"{{"t":"ping","id":"","ts":"{TS}"}}"#).as_bytes());
    bad_frame(format!(r#"{{"t":"ping","id":5,"ts":"{TS}"}}"#).as_bytes());
}

#[test]
fn id_th_re_over_256_bytes_are_bad_frame() {
    let long = "x".repeat(257);
    let ok = "x".repeat(256);
    assert!(parse_line(format!(r#"{{"t":"ping","id":"{ok}","ts":"{TS}"}}"#).as_bytes()).is_ok());
    bad_frame(format!(r#"{{"t":"ping","id":"{long}","ts":"{TS}"}}"#).as_bytes());
    let (_, id) = bad_frame(
        format!(r#"{{"t":"ack","id":"a","ts":"{TS}","th":"{long}","re":"r"}}"#).as_bytes(),
    );
    assert_eq!(id.as_deref(), Some("a"));
    bad_frame(format!(r#"{{"t":"pong","id":"a","ts":"{TS}","re":"{long}"}}"#).as_bytes());
    bad_frame(
        format!(r#"{{"t":"resume","id":"r","ts":"{TS}","seen":{{"{long}":"x"}}}}"#).as_bytes(),
    );
}

#[test]
fn unknown_type_is_unknown_line() {
    let line = format!(r#"{{"t":"frobnicate","id":"x1","ts":"{TS}","whatever":[1,{{}}]}}"#);
    assert_eq!(
        parse_line(line.as_bytes()).unwrap(),
        Line::Unknown {
            t: "frobnicate".into(),
            id: Some("x1".into())
        }
    );
    assert_eq!(
        parse_line(br#"{"t":"frobnicate"}"#).unwrap(),
        Line::Unknown {
            t: "frobnicate".into(),
            id: None
        }
    );
}

#[test]
fn unknown_top_level_field_and_unknown_part_kind_are_accepted() {
    let line = format!(
        r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","x-priority":"high","parts":[{{"k":"text","text":"hi","extra":1}},{{"k":"hologram","beam":[1,2]}}]}}"#
    );
    let Line::Msg(m) = parse_line(line.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(m.parts.len(), 2);
    assert_eq!(m.parts[0], Part::Text(TextPart { text: "hi".into() }));
    let Part::Unknown(u) = &m.parts[1] else {
        panic!("{:?}", m.parts[1])
    };
    assert_eq!(u["k"], "hologram");
    assert_eq!(u["beam"], serde_json::json!([1, 2]));
}

#[test]
fn trailing_cr_is_not_stripped_but_parses_as_json_whitespace() {
    let hello = format!(
        r#"{{"t":"hello","id":"h","ts":"{TS}","v":0,"key":"ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg","nonce":"AA"}}"#
    );
    let with_cr = format!("{hello}\r");
    let a = parse_line(hello.as_bytes()).unwrap();
    let b = parse_line(with_cr.as_bytes()).unwrap();
    assert_eq!(a, b);
    // The line bytes (which the auth signature covers) are the caller's; parse_line takes
    // them by reference and the transcript over `with_cr` differs from the one over `hello`.
    assert_ne!(
        awp_node::identity::auth_transcript(with_cr.as_bytes(), b""),
        awp_node::identity::auth_transcript(hello.as_bytes(), b"")
    );
}

#[test]
fn deep_nesting_is_bad_frame_not_a_crash() {
    let depth = 100_000;
    let line = format!(
        r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","parts":[{{"k":"data","data":{}{}}}]}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    bad_frame(line.as_bytes());
}

#[test]
fn error_codes_of_frame_errors() {
    assert_eq!(FrameError::TooLarge { max: 1 }.code(), code::TOO_LARGE);
    let e = FrameError::BadFrame {
        detail: String::new(),
        id: Some("x".into()),
    };
    assert_eq!(e.code(), code::BAD_FRAME);
    assert_eq!(e.id(), Some("x"));
    assert!(code::closes(e.code()));
    assert!(!code::closes("some_future_code"));
}

// Encoding

#[test]
fn encode_puts_envelope_first_and_does_not_escape_html() {
    let line = Line::Msg(Msg {
        id: "m".into(),
        ts: TS.into(),
        th: "t".into(),
        re: Some("r".into()),
        subject: Some("<a> & </b>".into()),
        parts: vec![Part::Code(CodePart {
            text: "x<y".into(),
            lang: None,
        })],
    });
    let enc = String::from_utf8(line.encode()).unwrap();
    assert_eq!(
        enc,
        format!(
            r#"{{"t":"msg","id":"m","ts":"{TS}","th":"t","re":"r","subject":"<a> & </b>","parts":[{{"k":"code","text":"x<y"}}]}}"#
        )
    );
}

#[test]
fn unknown_line_encodes_t_and_id() {
    let l = Line::Unknown {
        t: "x".into(),
        id: Some("1".into()),
    };
    assert_eq!(l.encode(), br#"{"t":"x","id":"1"}"#);
    assert_eq!(l.kind(), "x");
    assert_eq!(l.id(), Some("1"));
}

fn s() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 <>&\"\\\\é😀\n\r]{0,12}"
}
fn id() -> impl Strategy<Value = String> {
    "[0-9A-Z]{1,26}"
}
fn ts() -> impl Strategy<Value = String> {
    (0u64..4_102_444_800_000).prop_map(time::format_ms)
}
fn small() -> impl Strategy<Value = u64> {
    0..=MAX_SAFE_INT
}
fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(MAX_SAFE_INT as i64)..=MAX_SAFE_INT as i64).prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        s().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(s(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        s().prop_map(|text| Part::Text(TextPart { text })),
        (s(), proptest::option::of(s()))
            .prop_map(|(text, lang)| Part::Code(CodePart { text, lang })),
        (json(), proptest::option::of(s()))
            .prop_map(|(data, mime)| Part::Data(DataPart { data, mime })),
        (
            s(),
            small(),
            proptest::option::of(s()),
            proptest::option::of(s())
        )
            .prop_map(|(blob_ref, size, name, mime)| Part::Blob(BlobPart {
                blob_ref,
                size,
                name,
                mime
            })),
        s().prop_map(|x| {
            let mut m = serde_json::Map::new();
            m.insert("k".into(), "hologram".into());
            m.insert("x".into(), x.into());
            Part::Unknown(m)
        }),
    ]
}
fn grant() -> impl Strategy<Value = Grant> {
    (
        s(),
        s(),
        prop::collection::vec(s(), 0..3),
        ts(),
        s(),
        s(),
        proptest::option::of(s()),
        proptest::option::of(s()),
    )
        .prop_map(|(iss, sub, caps, exp, nonce, sig, aud, ext)| {
            let mut extra = serde_json::Map::new();
            if let Some(e) = ext {
                extra.insert("ext".into(), e.into());
            }
            Grant {
                iss,
                sub,
                caps,
                exp,
                nonce,
                sig,
                aud,
                extra,
            }
        })
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        (
            id(),
            ts(),
            small(),
            s(),
            proptest::option::of(s()),
            s(),
            prop::collection::vec(s(), 0..3),
            proptest::option::of(s()),
            proptest::option::of(s())
        )
            .prop_map(
                |(id, ts, v, key, name, nonce, caps, about, addr)| Line::Hello(Hello {
                    id,
                    ts,
                    v,
                    key,
                    name,
                    nonce,
                    caps,
                    about,
                    addr,
                    shares: None
                })
            ),
        (id(), ts(), s(), prop::collection::vec(grant(), 0..2)).prop_map(
            |(id, ts, sig, grants)| Line::Auth(Auth {
                id,
                ts,
                sig,
                grants
            })
        ),
        (id(), ts(), prop::collection::btree_map(id(), id(), 0..3))
            .prop_map(|(id, ts, seen)| Line::Resume(Resume { id, ts, seen })),
        (
            id(),
            ts(),
            id(),
            proptest::option::of(id()),
            s(),
            proptest::option::of(s())
        )
            .prop_map(|(id, ts, th, re, state, note)| Line::State(State {
                id,
                ts,
                th,
                re,
                state,
                note
            })),
        (
            id(),
            ts(),
            id(),
            proptest::option::of(id()),
            proptest::option::of(s()),
            prop::collection::vec(part(), 0..4)
        )
            .prop_map(|(id, ts, th, re, subject, parts)| Line::Msg(Msg {
                id,
                ts,
                th,
                re,
                subject,
                parts
            })),
        (id(), ts(), id(), id()).prop_map(|(id, ts, th, re)| Line::Ack(Ack { id, ts, th, re })),
        (
            id(),
            ts(),
            proptest::option::of(id()),
            s(),
            small(),
            any::<bool>(),
            s()
        )
            .prop_map(|(id, ts, th, blob_ref, n, last, data)| Line::Chunk(Chunk {
                id,
                ts,
                th,
                blob_ref,
                n,
                last,
                data
            })),
        (id(), ts()).prop_map(|(id, ts)| Line::Ping(Ping { id, ts })),
        (id(), ts(), id()).prop_map(|(id, ts, re)| Line::Pong(Pong { id, ts, re })),
        (
            id(),
            ts(),
            proptest::option::of(id()),
            proptest::option::of(s())
        )
            .prop_map(|(id, ts, re, reason)| Line::Bye(Bye { id, ts, re, reason })),
        (
            id(),
            ts(),
            proptest::option::of(id()),
            proptest::option::of(id()),
            s(),
            proptest::option::of(s()),
            proptest::option::of(s())
        )
            .prop_map(
                |(id, ts, th, re, code, detail, blob_ref)| Line::Err(ErrLine {
                    id,
                    ts,
                    th,
                    re,
                    code,
                    detail,
                    blob_ref
                })
            ),
        (id(), ts(), grant()).prop_map(|(id, ts, grant)| Line::Grant(GrantMsg { id, ts, grant })),
        (
            id(),
            ts(),
            proptest::option::of(id()),
            s(),
            proptest::option::of(s()),
            proptest::option::of(s()),
            proptest::option::of(grant())
        )
            .prop_map(|(id, ts, th, key, name, address, grant)| Line::Introduce(
                Introduce {
                    id,
                    ts,
                    th,
                    peer: IntroPeer { key, name, address },
                    grant
                }
            )),
        (id(), ts(), json(), small()).prop_map(|(id, ts, doc, hops)| {
            let mut d = serde_json::Map::new();
            d.insert("origin".into(), "o".into());
            d.insert("any".into(), doc);
            Line::Presence(PresenceMsg {
                id,
                ts,
                doc: d,
                hops,
                doc_raw: None,
            })
        }),
        (
            id(),
            ts(),
            id(),
            s(),
            proptest::option::of(json()),
            proptest::option::of(any::<bool>())
        )
            .prop_map(|(id, ts, th, of, line, withdraw)| Line::Mirror(Mirror {
                id,
                ts,
                th,
                re: None,
                of,
                of_name: None,
                subject: None,
                dir: Some("out".into()),
                // `"line":null` reads as an absent line: the same on the wire.
                line: line.filter(|l| !l.is_null()),
                withdraw
            })),
        (id(), ts(), id(), proptest::option::of(id()))
            .prop_map(|(id, ts, th, re)| Line::Private(Private { id, ts, th, re })),
    ]
}

proptest! {
    #[test]
    fn encode_then_parse_round_trips(l in line()) {
        let enc = l.encode();
        prop_assert_eq!(l.try_encode().unwrap(), enc.clone());
        let text = String::from_utf8(enc.clone()).unwrap();
        prop_assert!(!text.contains('\n'), "one line: {}", text);
        prop_assert!(text.starts_with(&format!(r#"{{"t":"{}","id":"#, l.kind())), "{}", text);
        let back = parse_line(&enc).unwrap();
        prop_assert_eq!(back, l);
    }

    #[test]
    fn parse_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_line(&bytes);
    }

    #[test]
    fn parse_never_panics_on_mutated_lines(l in line(), at in any::<usize>(), b in any::<u8>()) {
        let mut enc = l.encode();
        let i = at % enc.len();
        enc[i] = b;
        let _ = parse_line(&enc);
    }
}

#[test]
fn duplicate_id_reports_no_id() {
    let (_, id) = bad_frame(format!(r#"{{"t":"ping","id":"a","id":"b","ts":"{TS}"}}"#).as_bytes());
    assert_eq!(id, None);
}

/// The fuzz target's property over its seed corpus, so it runs in every `cargo test`.
#[test]
fn fuzz_corpus_round_trips() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse_line");
    let mut accepted = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        if let Ok(line) = parse_line(&bytes) {
            accepted += 1;
            assert_eq!(parse_line(&line.encode()).unwrap(), line);
        }
    }
    assert!(accepted >= 17, "only {accepted} corpus lines parsed");
}
