//! Blobs: files sent as a msg `blob` part plus `chunk` lines (protocol-notes §Blobs, spec
//! §9.3).
//!
//! - [`send`]: reading a file for sending (size limit, SHA-256, media type) and building
//!   its chunk lines ([`CHUNK_SIZE`] of data per chunk, standard padded base64, `n` from 0, `last`
//!   on the final one; an empty file is one chunk `n=0 last=true data ""`). The node queues
//!   the chunks and then the msg naming the blob in ONE store transaction.
//! - [`receive`]: [`BlobReceiver`], which assembles inbound blobs from chunks and naming
//!   msgs in any order, writes each chunk at its recorded offset (cut to it, write; one
//!   fsync per file and batch, then the new offsets recorded) and moves a complete blob to
//!   its final file.
//! - [`stream`]: files sent as chunk stubs whose data is read from the file when written.
//! - [`fast`]: received chunk lines parsed without a JSON value of their data.
//! - [`expire`]: unfinished inbound blobs go after a day without data
//!   ([`expire::UNFINISHED_MAX_AGE_MS`]), freeing the sender's pending budget.
//!
//! Files land under `$AWP_HOME/blobs/<peer>/` where `<peer>` is the first 16 characters of
//! the sender's key (base64url, see [`peer_dir`]); partial data is kept in
//! `<peer>/.partial/<hash of ref>` until the blob is complete. Final names come from the
//! declared name through [`sanitize_name`], with ` (1)`, ` (2)`, … added on a collision.

pub mod expire;
pub mod fast;
pub mod pending;
pub mod receive;
pub mod send;
pub mod stream;

pub use receive::{BlobError, BlobReceiver, BlobSync, Completed, Verdict};
pub use send::{Digests, FileSlice, Hashing, Outgoing, SendError, Streamed};

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Data bytes per chunk (before base64): 765 KiB, so a chunk line (1,044,480 bytes of
/// base64 plus its envelope) stays under the 1 MiB line cap ([`crate::wire::MAX_LINE`])
/// with 4 KiB left for the envelope (ids, ts, a `th` of up to 256 bytes, the ref). Fewer,
/// larger lines: one parse, write and bookkeeping per 765 KiB (issue 10 §3).
pub const CHUNK_SIZE: usize = 765 * 1024;

/// Default largest blob, in bytes (50 MiB), for sending and receiving.
pub const DEFAULT_LIMIT: u64 = 50 * 1024 * 1024;

/// Environment variable that sets the blob limit of a node (bytes, or with a `K`, `M` or
/// `G` suffix meaning KiB, MiB, GiB). Applies to sending and receiving.
pub const LIMIT_ENV: &str = "AWP_BLOB_LIMIT";

/// Longest blob ref accepted from a peer, in bytes. Longer refs are refused.
pub const MAX_REF_LEN: usize = 256;

/// Most inbound blobs pending (neither complete nor refused) per peer; a new ref beyond it
/// is refused. Bounds the partial files a peer can make us keep.
pub const MAX_PENDING_PER_PEER: usize = 64;

/// Partial data kept per peer at most, as a multiple of the blob limit (2: two blobs of
/// the largest size in flight at once). A chunk beyond it is refused.
pub const PENDING_LIMITS_PER_PEER: u64 = 2;

/// Longest final file name, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Name of the directory (inside a peer's blob directory) that holds partial data.
pub const PARTIAL_DIR: &str = ".partial";

/// Parse a limit like `52428800`, `512K`, `50M`, `1G` (binary units). None when invalid.
pub fn parse_limit(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// The blob limit from [`LIMIT_ENV`], or [`DEFAULT_LIMIT`] when unset or invalid (logged).
pub fn limit_from_env() -> u64 {
    match std::env::var(LIMIT_ENV) {
        Ok(v) => parse_limit(&v).unwrap_or_else(|| {
            tracing::warn!("{LIMIT_ENV}={v:?} is not a size; using {DEFAULT_LIMIT} bytes");
            DEFAULT_LIMIT
        }),
        Err(_) => DEFAULT_LIMIT,
    }
}

/// Directory name for a peer's blobs: the first 16 characters of its key after
/// `ed25519:` (base64url: letters, digits, `-`, `_`).
pub fn peer_dir(root: &Path, peer: &crate::wire::PeerKey) -> PathBuf {
    let k = peer.to_string();
    let short: String = k
        .strip_prefix("ed25519:")
        .unwrap_or(&k)
        .chars()
        .take(16)
        .collect();
    root.join(short)
}

/// The partial file of `blob_ref` from a peer: `<peer dir>/.partial/<32 hex chars of
/// SHA-256(ref)>`. The ref is peer input, so it never becomes part of a path itself.
pub fn partial_path(peer_dir: &Path, blob_ref: &str) -> PathBuf {
    let h = Sha256::digest(blob_ref.as_bytes());
    peer_dir.join(PARTIAL_DIR).join(hex(&h[..16]))
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(D[(x >> 4) as usize] as char);
        s.push(D[(x & 15) as usize] as char);
    }
    s
}

/// A safe file name from a name a peer chose: only its last path component (split at
/// `/` and `\`), without control characters, without leading dots or spaces (no hidden
/// files, never `.` or `..`), at most [`MAX_NAME_LEN`] bytes (the extension kept when it
/// is short), and `blob` when nothing is left. `../../etc/passwd` becomes `passwd`.
pub fn sanitize_name(name: &str) -> String {
    let last = name
        .rsplit(['/', '\\'])
        .find(|c| !c.trim().is_empty())
        .unwrap_or("");
    let clean: String = last
        .chars()
        .filter(|c| !c.is_control() && !matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
        .collect();
    let clean = clean.trim().trim_start_matches(['.', ' ']).trim_end();
    if clean.is_empty() {
        return "blob".into();
    }
    if clean.len() <= MAX_NAME_LEN {
        return clean.to_string();
    }
    let (stem, ext) = split_ext(clean);
    let ext = if ext.len() <= 16 { ext } else { "" };
    let room = MAX_NAME_LEN - ext.len();
    format!("{}{ext}", cut(stem, room))
}

/// `name` with ` (i)` before its extension.
pub fn numbered(name: &str, i: u32) -> String {
    let (stem, ext) = split_ext(name);
    format!("{stem} ({i}){ext}")
}

/// (stem, `.ext` or "") — a leading dot is not an extension.
fn split_ext(name: &str) -> (&str, &str) {
    match name.rfind('.') {
        Some(i) if i > 0 => (&name[..i], &name[i..]),
        _ => (name, ""),
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The media type of a file: from its extension when known, else from its first bytes
/// (a few magic numbers; UTF-8 text without NUL is `text/plain`), else
/// `application/octet-stream`.
pub fn guess_mime(name: &str, head: &[u8]) -> String {
    let ext = split_ext(name)
        .1
        .trim_start_matches('.')
        .to_ascii_lowercase();
    let by_ext = match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "rs" | "py" | "go" | "c" | "h" | "cpp" | "java" | "sh" | "ts" | "rb" => "text/plain",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        _ => "",
    };
    if !by_ext.is_empty() {
        return by_ext.into();
    }
    let magic: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF8", "image/gif"),
        (b"%PDF-", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
        (b"\x1f\x8b", "application/gzip"),
    ];
    for (m, t) in magic {
        if head.starts_with(m) {
            return (*t).into();
        }
    }
    if !head.is_empty() && !head.contains(&0) && utf8_prefix_ok(head) {
        return "text/plain".into();
    }
    "application/octet-stream".into()
}

/// Whether `b` is UTF-8, allowing a character cut at the end.
fn utf8_prefix_ok(b: &[u8]) -> bool {
    match std::str::from_utf8(b) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && b.len() - e.valid_up_to() < 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize_name("../../etc/passwd"), "passwd");
        assert_eq!(sanitize_name("..\\..\\win.ini"), "win.ini");
        assert_eq!(sanitize_name("report.pdf"), "report.pdf");
        assert_eq!(sanitize_name(".."), "blob");
        assert_eq!(sanitize_name("."), "blob");
        assert_eq!(sanitize_name(""), "blob");
        assert_eq!(sanitize_name("dir/"), "dir");
        assert_eq!(sanitize_name(".bashrc"), "bashrc");
        assert_eq!(sanitize_name("a\u{0}b\nc\u{1b}[31m.txt"), "abc[31m.txt");
        assert_eq!(sanitize_name("evil\u{202e}txt.exe"), "eviltxt.exe");
        assert_eq!(sanitize_name("/"), "blob");
        let long = format!("{}.tar.gz", "x".repeat(500));
        let s = sanitize_name(&long);
        assert!(s.len() <= MAX_NAME_LEN, "{}", s.len());
        assert!(s.ends_with(".gz"));
        let wide = "é".repeat(300);
        assert!(sanitize_name(&wide).len() <= MAX_NAME_LEN);
    }

    #[test]
    fn numbered_names_keep_the_extension() {
        assert_eq!(numbered("a.txt", 1), "a (1).txt");
        assert_eq!(numbered("noext", 2), "noext (2)");
    }

    #[test]
    fn mime_from_extension_then_content() {
        assert_eq!(guess_mime("a.PNG", b""), "image/png");
        assert_eq!(guess_mime("x", b"%PDF-1.7"), "application/pdf");
        assert_eq!(guess_mime("notes", b"hello world"), "text/plain");
        assert_eq!(guess_mime("bin", &[0, 1, 2, 3]), "application/octet-stream");
        assert_eq!(guess_mime("empty", b""), "application/octet-stream");
    }

    #[test]
    fn limits_parse() {
        assert_eq!(parse_limit("100"), Some(100));
        assert_eq!(parse_limit("50M"), Some(50 << 20));
        assert_eq!(parse_limit("512k"), Some(512 << 10));
        assert_eq!(parse_limit("1G"), Some(1 << 30));
        assert_eq!(parse_limit("x"), None);
        assert_eq!(parse_limit(""), None);
        assert_eq!(parse_limit("99999999999999999999G"), None);
    }

    #[test]
    fn partial_paths_never_use_the_ref() {
        let p = partial_path(Path::new("/h/blobs/peer"), "../../x");
        assert_eq!(p.parent().unwrap(), Path::new("/h/blobs/peer/.partial"));
        assert_eq!(p.file_name().unwrap().len(), 32);
    }
}
