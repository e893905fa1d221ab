//! Human output: short keys, ages, aligned tables, one-line renderings of events.
//!
//! Everything here is a pure function of JSON values and the current time, so it is
//! tested without a node. Field names read from node responses:
//! - threads: `th`, `peer`, `peer_name`, `subject`, `mine` (our state), `theirs`,
//!   `unread`, `updated_ms` (or `updated_at`/`at`, RFC 3339);
//! - peers: `key`, `name`, `connected` (bool) or `state`, `address` (or `remote`),
//!   `last_seen_ms` (or `last_seen`), `outbox` (queued lines);
//! - line events: `dir`, `peer`, `peer_name`, `th`, `id`, `t`, `line`, `at`.

use serde_json::{Map, Value};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `ed25519:AbCdEfGhIj…` → `AbCdEfGh` (first 8 characters of the key text).
pub fn short_key(key: &str) -> String {
    key.strip_prefix("ed25519:")
        .unwrap_or(key)
        .chars()
        .take(8)
        .collect()
}

/// `name (AbCdEfGh)`, or just the short key when there is no name.
pub fn peer_label(key: Option<&str>, name: Option<&str>) -> String {
    match (name.filter(|n| !n.is_empty()), key) {
        (Some(n), Some(k)) => format!("{n} ({})", short_key(k)),
        (Some(n), None) => n.to_string(),
        (None, Some(k)) => short_key(k),
        (None, None) => "?".into(),
    }
}

/// An age in seconds as `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn format_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

/// A timestamp as milliseconds since the epoch: a JSON number of milliseconds or an
/// RFC 3339 string.
pub fn timestamp_ms(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .ok()?;
            Some((t.unix_timestamp_nanos() / 1_000_000) as i64)
        }
        _ => None,
    }
}

/// The first of `fields` present (and not null) in `obj`.
pub fn field<'a>(obj: &'a Map<String, Value>, fields: &[&str]) -> Option<&'a Value> {
    fields
        .iter()
        .find_map(|f| obj.get(*f).filter(|v| !v.is_null()))
}

/// The first of `fields` present in `obj` as a string.
pub fn str_field<'a>(obj: &'a Map<String, Value>, fields: &[&str]) -> Option<&'a str> {
    fields
        .iter()
        .find_map(|f| obj.get(*f).and_then(Value::as_str))
}

/// The age of the first timestamp among `fields`, or `-`.
fn age_field(obj: &Map<String, Value>, fields: &[&str], now_ms: i64) -> String {
    field(obj, fields)
        .and_then(timestamp_ms)
        .map(|t| format_age((now_ms - t) / 1000))
        .unwrap_or_else(|| "-".into())
}

/// At most `max` characters, newlines shown as spaces, with `…` when cut.
pub fn clip(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut out: String = flat.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// Whether `c` changes the direction of the text around it: the Unicode bidirectional
/// embeddings and overrides (U+202A–U+202E), isolates (U+2066–U+2069) and marks (U+200E,
/// U+200F, U+061C). A peer's name or subject holding U+202E shows the rest of the line
/// reversed, e.g. a file name `txt.exe` as `exe.txt` ("Trojan Source", CVE-2021-42574).
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// `s` with every control character (including newlines) and every bidirectional control
/// ([`is_bidi_control`]) shown as an escape such as `\u{1b}` or `\u{202e}`, so text a
/// peer chose (names, subjects, messages) cannot move the cursor, retitle the terminal,
/// forge table rows or reorder what follows it.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Columns aligned with two spaces between them; the last column is not padded. Cells
/// are passed through [`printable`].
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| printable(c)).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let render = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            if i + 1 < widths.len() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        line.trim_end().to_string()
    };
    let mut out = render(&mut headers.iter().copied());
    for row in rows {
        out.push('\n');
        out.push_str(&render(&mut row.iter().map(String::as_str)));
    }
    out
}

/// Thread objects most recently updated first (ties by thread id), the order `awp
/// threads` shows; the node lists them in thread-id order, a page at a time.
pub fn recent_first(mut threads: Vec<Value>) -> Vec<Value> {
    fn key(t: &Value) -> (std::cmp::Reverse<u64>, &str) {
        let updated = t.get("updated_ms").and_then(Value::as_u64).unwrap_or(0);
        let th = t.get("th").and_then(Value::as_str).unwrap_or("");
        (std::cmp::Reverse(updated), th)
    }
    threads.sort_by(|a, b| key(a).cmp(&key(b)));
    threads
}

/// The threads table from a list of thread objects.
pub fn threads_table(threads: &[Value], now_ms: i64) -> String {
    let rows: Vec<Vec<String>> = threads
        .iter()
        .filter_map(Value::as_object)
        .map(|t| {
            let state = |fs: &[&str]| str_field(t, fs).unwrap_or("-").to_string();
            let unread = field(t, &["unread"]).and_then(Value::as_u64).unwrap_or(0);
            vec![
                str_field(t, &["th"]).unwrap_or("?").to_string(),
                peer_label(str_field(t, &["peer"]), str_field(t, &["peer_name"])),
                clip(str_field(t, &["subject"]).unwrap_or(""), 40),
                format!(
                    "{}/{}",
                    state(&["mine", "state"]),
                    state(&["theirs", "peer_state"])
                ),
                if unread > 0 {
                    unread.to_string()
                } else {
                    "-".into()
                },
                age_field(t, &["updated_ms", "updated_at", "at"], now_ms),
            ]
        })
        .collect();
    table(
        &[
            "THREAD",
            "PEER",
            "SUBJECT",
            "STATE (ours/theirs)",
            "UNREAD",
            "UPDATED",
        ],
        &rows,
    )
}

/// The peers table from a list of peer objects.
pub fn peers_table(peers: &[Value], now_ms: i64) -> String {
    let rows: Vec<Vec<String>> = peers
        .iter()
        .filter_map(Value::as_object)
        .map(|p| {
            // A peer down and parked: `parked` (by `awp disconnect`) or `bye` (it said
            // bye); neither is redialed until new traffic.
            let up = match field(p, &["connected", "up"]) {
                Some(Value::Bool(true)) => "up".to_string(),
                Some(Value::Bool(false)) => match str_field(p, &["parked_by"]) {
                    Some("us") => "parked".to_string(),
                    Some("peer") => "bye".to_string(),
                    _ => "down".to_string(),
                },
                _ => str_field(p, &["state"]).unwrap_or("-").to_string(),
            };
            let queued = field(p, &["outbox", "queued"])
                .and_then(Value::as_u64)
                .unwrap_or(0);
            vec![
                str_field(p, &["name", "peer_name"])
                    .unwrap_or("-")
                    .to_string(),
                short_key(str_field(p, &["key", "peer"]).unwrap_or("?")),
                up,
                str_field(p, &["address", "remote"])
                    .unwrap_or("-")
                    .to_string(),
                age_field(p, &["last_seen_ms", "last_seen"], now_ms),
                if queued > 0 {
                    queued.to_string()
                } else {
                    "-".into()
                },
            ]
        })
        .collect();
    table(
        &["NAME", "KEY", "CONN", "ADDRESS", "LAST SEEN", "QUEUED"],
        &rows,
    )
}

/// `key: value` lines with the values aligned (status, whoami).
pub fn key_values(obj: &Map<String, Value>) -> String {
    let width = obj.keys().map(|k| k.chars().count()).max().unwrap_or(0);
    obj.iter()
        .map(|(k, v)| format!("{k:width$}  {}", plain_value(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A JSON value as text for people: strings without quotes, `-` for null and for what is
/// empty, array items joined by `, ` (objects among them by `; `), objects as `k=v` pairs.
fn plain_value(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".into(),
        Value::Array(items) => {
            let sep = if items.iter().any(Value::is_object) {
                "; "
            } else {
                ", "
            };
            items.iter().map(plain_value).collect::<Vec<_>>().join(sep)
        }
        Value::Object(m) if m.is_empty() => "-".into(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", plain_value(v)))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}

/// One part of a msg in a few words.
fn part_summary(part: &Value) -> String {
    let Some(p) = part.as_object() else {
        return "?".into();
    };
    match str_field(p, &["k"]) {
        Some("text") => str_field(p, &["text"]).unwrap_or("").to_string(),
        Some("code") => {
            let text = str_field(p, &["text"]).unwrap_or("");
            let lang = str_field(p, &["lang"]).unwrap_or("code");
            format!("[{lang}, {} lines]", text.lines().count())
        }
        Some("data") => {
            let data = p.get("data").map(Value::to_string).unwrap_or_default();
            match str_field(p, &["mime"]) {
                Some(m) => format!("[data {m}] {data}"),
                None => format!("[data] {data}"),
            }
        }
        Some("blob") => format!(
            "[file {} {} bytes]",
            str_field(p, &["name"]).unwrap_or("?"),
            p.get("size").and_then(Value::as_u64).unwrap_or(0)
        ),
        Some(other) => format!("[{other}]"),
        None => "?".into(),
    }
}

/// The content of a wire line in one line: a msg's subject and parts, a state and note.
pub fn line_summary(line: &Value) -> String {
    let Some(l) = line.as_object() else {
        return String::new();
    };
    match str_field(l, &["t"]) {
        Some("msg") => {
            let parts: Vec<String> = l
                .get("parts")
                .and_then(Value::as_array)
                .map(|ps| ps.iter().map(part_summary).collect())
                .unwrap_or_default();
            let body = parts.join(" ");
            match str_field(l, &["subject"]) {
                Some(s) => format!("«{s}» {body}"),
                None => body,
            }
        }
        Some("state") => {
            let st = str_field(l, &["state"]).unwrap_or("?");
            match str_field(l, &["note"]) {
                Some(n) => format!("state → {st} ({n})"),
                None => format!("state → {st}"),
            }
        }
        Some("err") => {
            // A peer's refusal of one of our lines (stored in its thread).
            let code = str_field(l, &["code"]).unwrap_or("?");
            let re = str_field(l, &["re"]).unwrap_or("?");
            match str_field(l, &["detail"]) {
                Some(d) => format!("ERROR {code} (re {re}): {d}"),
                None => format!("ERROR {code} (re {re})"),
            }
        }
        Some(t) => format!("[{t}]"),
        None => String::new(),
    }
}

/// One human line for an event, or `None` for events not shown (`caught_up`).
pub fn event_line(ev: &Map<String, Value>, now_ms: i64) -> Option<String> {
    let who = peer_label(str_field(ev, &["peer"]), str_field(ev, &["peer_name"]));
    match str_field(ev, &["event"])? {
        "line" => {
            let arrow = if str_field(ev, &["dir"]) == Some("out") {
                "→"
            } else {
                "←"
            };
            let th = str_field(ev, &["th"]).unwrap_or("-");
            let body = ev.get("line").map(line_summary).unwrap_or_default();
            let age = age_field(ev, &["at"], now_ms);
            Some(format!(
                "{age:>8}  {arrow} {who}  {th}  {}",
                clip(&body, 200)
            ))
        }
        "ack" => Some(format!(
            "acked by {who}: {} in {}",
            str_field(ev, &["re"]).unwrap_or("?"),
            str_field(ev, &["th"]).unwrap_or("-")
        )),
        "peer_up" => Some(match str_field(ev, &["remote"]) {
            Some(r) => format!("peer up: {who} via {r}"),
            None => format!("peer up: {who}"),
        }),
        "peer_down" => Some(match str_field(ev, &["reason"]) {
            Some(r) => format!("peer down: {who} ({r})"),
            None => format!("peer down: {who}"),
        }),
        "listening" => Some(format!(
            "listening on {} as {} ({})",
            listening_addresses(ev).join(", "),
            str_field(ev, &["name"]).unwrap_or("?"),
            str_field(ev, &["key"]).unwrap_or("?")
        )),
        "caught_up" => None,
        other => Some(format!("{other}: {}", Value::Object(ev.clone()))),
    }
}

/// The addresses of a listening event or status body (`addresses`, else `address`).
pub fn listening_addresses(obj: &Map<String, Value>) -> Vec<String> {
    match obj.get("addresses").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        None => str_field(obj, &["address"])
            .map(|a| vec![a.to_string()])
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::table as table_fn;
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn ages() {
        assert_eq!(format_age(-3), "0s ago");
        assert_eq!(format_age(59), "59s ago");
        assert_eq!(format_age(60), "1m ago");
        assert_eq!(format_age(3 * 60 + 59), "3m ago");
        assert_eq!(format_age(7200), "2h ago");
        assert_eq!(format_age(3 * 86400 + 5), "3d ago");
    }

    #[test]
    fn timestamps_from_ms_and_rfc3339() {
        assert_eq!(timestamp_ms(&json!(1234)), Some(1234));
        assert_eq!(timestamp_ms(&json!("1970-01-01T00:00:01.500Z")), Some(1500));
        assert_eq!(timestamp_ms(&json!("1970-01-01T01:00:00+01:00")), Some(0));
        assert_eq!(timestamp_ms(&json!("yesterday")), None);
    }

    #[test]
    fn keys_and_labels() {
        let k = "ed25519:AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcde";
        assert_eq!(short_key(k), "AbCdEfGh");
        assert_eq!(peer_label(Some(k), Some("alice")), "alice (AbCdEfGh)");
        assert_eq!(peer_label(Some(k), None), "AbCdEfGh");
        assert_eq!(peer_label(Some(k), Some("")), "AbCdEfGh");
    }

    #[test]
    fn clip_flattens_and_cuts() {
        assert_eq!(clip("a\nb", 10), "a b");
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abcd", 4), "abcd");
    }

    #[test]
    fn peer_text_cannot_reach_the_terminal_raw() {
        let evil = "\u{1b}]0;pwned\u{7}\u{1b}[2Jbob\nfake";
        let p = printable(evil);
        assert!(!p.chars().any(|c| c.is_control()), "{p}");
        let t = table(&["NAME"], &[vec![evil.to_string()]]);
        assert_eq!(t.lines().count(), 2, "no forged row: {t}");
        assert!(!t.contains('\u{1b}'));
    }

    #[test]
    fn bidi_controls_are_escaped() {
        // (character, escaped form); every bidi embedding, override, isolate and mark.
        let table = [
            ('\u{061C}', "\\u{61c}"),
            ('\u{200E}', "\\u{200e}"),
            ('\u{200F}', "\\u{200f}"),
            ('\u{202A}', "\\u{202a}"),
            ('\u{202B}', "\\u{202b}"),
            ('\u{202C}', "\\u{202c}"),
            ('\u{202D}', "\\u{202d}"),
            ('\u{202E}', "\\u{202e}"),
            ('\u{2066}', "\\u{2066}"),
            ('\u{2067}', "\\u{2067}"),
            ('\u{2068}', "\\u{2068}"),
            ('\u{2069}', "\\u{2069}"),
        ];
        for (c, want) in table {
            assert!(is_bidi_control(c), "{c:?}");
            assert_eq!(printable(&format!("a{c}b")), format!("a{want}b"));
        }
        // Neighbours and ordinary right-to-left text stay as they are.
        for c in [
            '\u{2029}', '\u{202F}', '\u{2065}', '\u{206A}', '\u{200D}', 'א', 'ع', 'é',
        ] {
            assert!(!is_bidi_control(c), "{c:?}");
            assert_eq!(printable(&c.to_string()), c.to_string());
        }
        // In a table cell, as a peer's name.
        let t = table_fn(&["NAME"], &[vec!["bob\u{202E}txt.exe".to_string()]]);
        assert!(!t.chars().any(is_bidi_control), "{t}");
        assert!(t.ends_with("bob\\u{202e}txt.exe"), "{t}");
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["A", "BB", "C"],
            &[
                vec!["xxx".into(), "y".into(), "z".into()],
                vec!["1".into(), "22222".into(), "3".into()],
            ],
        );
        assert_eq!(t, "A    BB     C\nxxx  y      z\n1    22222  3");
    }

    #[test]
    fn threads_table_shows_names_states_unread_and_age() {
        let now = 1_000_000_000;
        let threads = vec![
            json!({
                "th": "thr_01", "peer": "ed25519:AbCdEfGhIjKl", "peer_name": "alice",
                "subject": "review", "mine": "working", "theirs": "waiting",
                "unread": 2, "updated_ms": now - 180_000
            }),
            json!({"th": "thr_02", "peer": "ed25519:ZZZZZZZZZZ", "unread": 0}),
        ];
        let out = threads_table(&threads, now);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("THREAD  PEER"));
        assert!(lines[1].contains("alice (AbCdEfGh)"));
        assert!(lines[1].contains("working/waiting"));
        assert!(lines[1].contains("3m ago"));
        assert!(lines[2].contains("-/-"));
        // Columns line up: the subject column starts at the same offset in every row.
        let col = lines[0].find("SUBJECT").unwrap();
        assert_eq!(&lines[1][col..col + 6], "review");
    }

    #[test]
    fn peers_table_shows_connection() {
        let now = 10_000_000;
        let peers = vec![
            json!({"key": "ed25519:QQQQQQQQQQQ", "name": "bob", "connected": true,
            "address": "tls:10.0.0.2:7700", "last_seen_ms": now - 5_000, "outbox": 3}),
        ];
        let out = peers_table(&peers, now);
        let row = out.lines().nth(1).unwrap();
        for want in ["bob", "QQQQQQQQ", "up", "tls:10.0.0.2:7700", "5s ago", "3"] {
            assert!(row.contains(want), "{want} missing in {row:?}");
        }
        let conn = |connected: bool, parked_by: Value| {
            let p = json!({"key": "ed25519:QQQQQQQQQQQ", "connected": connected,
                "parked_by": parked_by});
            let out = peers_table(&[p], now);
            let row = out.lines().nth(1).unwrap().to_string();
            row.split_whitespace().nth(2).unwrap().to_string()
        };
        assert_eq!(conn(false, Value::Null), "down");
        assert_eq!(conn(false, json!("us")), "parked");
        assert_eq!(conn(false, json!("peer")), "bye");
        assert_eq!(conn(true, Value::Null), "up");
    }

    #[test]
    fn line_event_rendering() {
        let ev = obj(json!({
            "event": "line", "dir": "in", "peer": "ed25519:AbCdEfGhIj", "peer_name": "alice",
            "th": "thr_1", "id": "01J", "t": "msg", "at": "1970-01-01T00:00:00Z",
            "line": {"t": "msg", "subject": "hi", "parts": [
                {"k": "text", "text": "hello\nthere"},
                {"k": "code", "text": "a\nb\n", "lang": "rust"},
                {"k": "data", "data": {"x": 1}, "mime": "application/json"}
            ]}
        }));
        let line = event_line(&ev, 120_000).unwrap();
        assert_eq!(
            line,
            "  2m ago  ← alice (AbCdEfGh)  thr_1  «hi» hello there [rust, 2 lines] [data application/json] {\"x\":1}"
        );
        let st = obj(
            json!({"event": "line", "dir": "out", "peer": "ed25519:Zz", "th": "thr_1",
            "line": {"t": "state", "state": "done", "note": "merged"}}),
        );
        assert!(event_line(&st, 0)
            .unwrap()
            .contains("→ Zz  thr_1  state → done (merged)"));
        assert_eq!(event_line(&obj(json!({"event": "caught_up"})), 0), None);
    }

    #[test]
    fn key_values_align() {
        let out = key_values(&obj(
            json!({"key": "k1", "addresses": ["a", "b"], "pid": 7}),
        ));
        assert_eq!(out, "key        k1\naddresses  a, b\npid        7");
    }

    /// Null and empty values show as `-`, objects as `k=v` pairs (never raw JSON).
    #[test]
    fn key_values_show_empty_and_nested_values_plainly() {
        let out = key_values(&obj(json!({
            "artifactr": null,
            "via": [],
            "notices": "",
            "connections": [
                {"peer": "ed25519:AA", "up": true},
                {"peer": "ed25519:BB", "up": false}
            ]
        })));
        assert_eq!(
            out,
            "artifactr    -\nvia          -\nnotices      -\nconnections  peer=ed25519:AA up=true; peer=ed25519:BB up=false"
        );
    }
}
