//! Record and key encodings. A record is `u32 BE header length ‖ header JSON ‖ payload`,
//! where the payload is an encoded line kept byte-exact (no JSON escaping of the line).
//! Every decoding failure is [`StoreError::Corrupt`]; nothing here panics on disk data.
//!
//! Payloads of [`COMPRESS_MIN`] to [`COMPRESS_MAX`] bytes are stored compressed when that
//! saves at least a sixteenth: below [`DEFLATE_MIN`] bytes as an LZ4 block (prefixed with
//! the decompressed length as a little-endian `u32`; bit 30 of the length word, [`LZ4`]),
//! from it up as raw DEFLATE (RFC 1951, level 1; the top bit, [`DEFLATED`]). Records from
//! before compression existed have both bits clear and read as they are; records of earlier
//! versions that DEFLATE-compressed every size still read. Compression keeps the database
//! within 1.5 × the lines it holds (`scripts/bench-disk.sh`, 1.5 KB lines): sled 0.34
//! rewrites a log segment only once half of it is dead, so its files are up to about twice
//! what they hold. Why two codecs: a DEFLATE round trip of a 300-byte line costs about
//! 17 µs, most of it building Huffman tables and compressor state per line, against under
//! 1 µs for LZ4 (it was two thirds of a resume replay's CPU, and every signed msg line is
//! over 256 bytes); on 1.5 KB of prose LZ4 keeps 54 % of the bytes against DEFLATE's 38 %,
//! which takes the database over the 1.5 × bound.

use super::{AddrSource, Dir, StoreError};
use crate::wire::PeerKey;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Outbox value: the line's thread, kind and the seq of its out log entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OutRec {
    pub th: Option<String>,
    pub kind: String,
    pub seq: u64,
    /// Set when the line is stored once, as the payload of out log entry `seq` (this
    /// record's own payload is then empty): the line's length in bytes, counted in the
    /// peer's queued bytes. None for chunk lines (their log entry is a stub without the
    /// data) and records written before lines were stored once (the line is the payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_len: Option<u64>,
}

impl OutRec {
    /// Bytes this outbox record stands for in the peer's queued-bytes count: the record
    /// (`stored`, its length) plus the line kept in the log for it.
    pub fn queued_len(&self, stored: usize) -> usize {
        stored.saturating_add(self.log_len.unwrap_or(0) as usize)
    }
}

/// Log value (payload = the line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LogRec {
    pub dir: Dir,
    pub peer: String,
    pub id: String,
    pub th: Option<String>,
    pub kind: String,
    pub at: u64,
    pub read: bool,
    pub acked: bool,
}

/// Thread value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ThreadRec {
    pub peer: String,
    pub subject: Option<String>,
    pub mine: Option<String>,
    pub my_note: Option<String>,
    pub theirs: Option<String>,
    pub their_note: Option<String>,
    pub since: u64,
    pub updated: u64,
    pub unread: u64,
    /// Created by a line we sent (false for threads a peer opened, and for records
    /// written before this field existed).
    #[serde(default)]
    pub ours: bool,
}

/// Peer value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeerRec {
    pub name: Option<String>,
    pub about: Option<String>,
    pub caps: Vec<String>,
    pub first: u64,
    pub last: u64,
    pub parked: bool,
    /// The park came from `awp disconnect` (false for records written before this field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parked_by_us: bool,
    /// Hex key of the peer whose introduction created this record; None once the peer
    /// itself completed a handshake (and for records written before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introduced_by: Option<String>,
}

/// Address value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AddrRec {
    pub source: AddrSource,
    pub ok: Option<u64>,
    pub err_at: Option<u64>,
    pub err: Option<String>,
    /// Hex key of the introducer, for addresses of source `introduce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When the peer last announced this address in an authenticated hello, or the user
    /// last gave it (ms); None for introduced hints and records written before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heard: Option<u64>,
}

pub(crate) fn corrupt(tree: &'static str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        tree,
        detail: detail.to_string(),
    }
}

/// Bit of the length word marking a raw-DEFLATE-compressed payload (RFC 1951).
pub(crate) const DEFLATED: u32 = 1 << 31;
/// Bit of the length word marking an LZ4-compressed payload (decompressed length as a
/// little-endian `u32`, then one LZ4 block).
pub(crate) const LZ4: u32 = 1 << 30;
/// The length word's bits that give the header length.
const LEN_MASK: u32 = LZ4 - 1;
/// Shorter payloads are stored as they are.
pub(crate) const COMPRESS_MIN: usize = 256;
/// Payloads from this size up are DEFLATE-compressed, shorter ones LZ4-compressed.
pub(crate) const DEFLATE_MIN: usize = 1024;
/// DEFLATE level (1: fastest; a 1.5 KB line takes some microseconds).
const DEFLATE_LEVEL: u8 = 1;
/// Longer payloads too: blob chunk lines (up to 1 MiB of base64 of file data, which
/// compression shrinks by a quarter at most) are stored as they are, so sending and
/// receiving files costs no compression time.
pub(crate) const COMPRESS_MAX: usize = 16 * 1024;

/// How a record's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Raw,
    Deflate,
    Lz4,
}

impl Codec {
    fn flag(self) -> u32 {
        match self {
            Codec::Raw => 0,
            Codec::Deflate => DEFLATED,
            Codec::Lz4 => LZ4,
        }
    }
}

/// A record's payload as stored: raw, or compressed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Payload<'b> {
    bytes: &'b [u8],
    codec: Codec,
}

impl<'b> Payload<'b> {
    /// Bytes as stored.
    pub fn stored_len(&self) -> usize {
        self.bytes.len()
    }

    /// The payload's bytes (decompressed when stored compressed; at most
    /// [`crate::wire::MAX_LINE`] bytes, else corrupt).
    pub fn get(&self, tree: &'static str) -> Result<std::borrow::Cow<'b, [u8]>, StoreError> {
        let bad = |e: &dyn std::fmt::Display| corrupt(tree, format!("compressed payload: {e}"));
        match self.codec {
            Codec::Raw => Ok(std::borrow::Cow::Borrowed(self.bytes)),
            Codec::Deflate => miniz_oxide::inflate::decompress_to_vec_with_limit(
                self.bytes,
                crate::wire::MAX_LINE,
            )
            .map(std::borrow::Cow::Owned)
            .map_err(|e| bad(&e)),
            Codec::Lz4 => {
                let (len, block) = self
                    .bytes
                    .split_first_chunk::<4>()
                    .ok_or_else(|| bad(&"shorter than its length"))?;
                let len = u32::from_le_bytes(*len) as usize;
                if len > COMPRESS_MAX {
                    return Err(bad(&format!("length {len} over {COMPRESS_MAX}")));
                }
                let out = lz4_flex::block::decompress(block, len).map_err(|e| bad(&e))?;
                if out.len() != len {
                    return Err(bad(&format!("{} bytes, {len} expected", out.len())));
                }
                Ok(std::borrow::Cow::Owned(out))
            }
        }
    }
}

/// `payload` compressed, with the codec's flag, when that saves at least a sixteenth (see
/// the module doc).
fn compress(payload: &[u8]) -> Option<(u32, Vec<u8>)> {
    if !(COMPRESS_MIN..=COMPRESS_MAX).contains(&payload.len()) {
        return None;
    }
    let (flag, out) = if payload.len() >= DEFLATE_MIN {
        (
            DEFLATED,
            miniz_oxide::deflate::compress_to_vec(payload, DEFLATE_LEVEL),
        )
    } else {
        let len = u32::try_from(payload.len()).ok()?;
        let mut out = vec![0u8; 4 + lz4_flex::block::get_maximum_output_size(payload.len())];
        out[..4].copy_from_slice(&len.to_le_bytes());
        let n = lz4_flex::block::compress_into(payload, &mut out[4..]).ok()?;
        out.truncate(4 + n);
        (LZ4, out)
    };
    (out.len() + payload.len() / 16 <= payload.len()).then_some((flag, out))
}

fn header_bytes<T: Serialize>(header: &T) -> Result<(Vec<u8>, u32), StoreError> {
    let h = serde_json::to_vec(header).map_err(|e| StoreError::Db(format!("encode: {e}")))?;
    let len = u32::try_from(h.len())
        .ok()
        .filter(|l| l & !LEN_MASK == 0)
        .ok_or_else(|| StoreError::Db("record header too large".into()))?;
    Ok((h, len))
}

fn assemble(h: &[u8], len: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + h.len() + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(h);
    out.extend_from_slice(payload);
    out
}

/// Header plus payload (compressed when that pays, see the module doc).
pub(crate) fn pack<T: Serialize>(header: &T, payload: &[u8]) -> Result<Vec<u8>, StoreError> {
    let (h, len) = header_bytes(header)?;
    match compress(payload) {
        Some((flag, z)) => Ok(assemble(&h, len | flag, &z)),
        None => Ok(assemble(&h, len, payload)),
    }
}

/// A new header with a payload kept as it was stored (no recompression).
pub(crate) fn repack<T: Serialize>(
    header: &T,
    payload: Payload<'_>,
) -> Result<Vec<u8>, StoreError> {
    let (h, len) = header_bytes(header)?;
    Ok(assemble(&h, len | payload.codec.flag(), payload.bytes))
}

/// Split a packed record into its decoded header and its payload.
pub(crate) fn unpack<'b, T: DeserializeOwned>(
    tree: &'static str,
    bytes: &'b [u8],
) -> Result<(T, Payload<'b>), StoreError> {
    let (header, payload) = split(tree, bytes)?;
    let header = serde_json::from_slice(header).map_err(|e| corrupt(tree, e))?;
    Ok((header, payload))
}

/// The payload of a packed record, its header skipped unread (for readers that need only
/// the line, such as the outbox's replay). Errors: the length word is missing, names two
/// codecs, or runs past the record.
pub(crate) fn payload_only<'b>(
    tree: &'static str,
    bytes: &'b [u8],
) -> Result<Payload<'b>, StoreError> {
    split(tree, bytes).map(|(_, payload)| payload)
}

/// A packed record's header bytes (JSON, not parsed) and its payload.
fn split<'b>(tree: &'static str, bytes: &'b [u8]) -> Result<(&'b [u8], Payload<'b>), StoreError> {
    let len_bytes: [u8; 4] = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt(tree, "record shorter than its length prefix"))?;
    let word = u32::from_be_bytes(len_bytes);
    let codec = match (word & DEFLATED != 0, word & LZ4 != 0) {
        (false, false) => Codec::Raw,
        (true, false) => Codec::Deflate,
        (false, true) => Codec::Lz4,
        (true, true) => return Err(corrupt(tree, "record marked with two codecs")),
    };
    let len = (word & LEN_MASK) as usize;
    let end = 4usize
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| corrupt(tree, "record header length out of range"))?;
    Ok((
        &bytes[4..end],
        Payload {
            bytes: &bytes[end..],
            codec,
        },
    ))
}

/// A header-only record.
pub(crate) fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>, StoreError> {
    pack(v, &[])
}

/// Decode a header-only record.
pub(crate) fn dec<T: DeserializeOwned>(tree: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    unpack(tree, bytes).map(|(h, _)| h)
}

pub(crate) fn u64_be(v: u64) -> [u8; 8] {
    v.to_be_bytes()
}

pub(crate) fn read_u64(tree: &'static str, bytes: &[u8]) -> Result<u64, StoreError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| corrupt(tree, format!("expected 8 bytes, got {}", bytes.len())))?;
    Ok(u64::from_be_bytes(arr))
}

/// `peer ‖ suffix`.
pub(crate) fn pkey(peer: &PeerKey, suffix: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(32 + suffix.len());
    k.extend_from_slice(peer.as_bytes());
    k.extend_from_slice(suffix);
    k
}

/// Split `peer ‖ suffix` keys.
pub(crate) fn split_pkey(tree: &'static str, key: &[u8]) -> Result<(PeerKey, Vec<u8>), StoreError> {
    if key.len() < 32 {
        return Err(corrupt(tree, "key shorter than a peer key"));
    }
    let peer = peer_from_slice(tree, &key[..32])?;
    Ok((peer, key[32..].to_vec()))
}

pub(crate) fn peer_from_slice(tree: &'static str, b: &[u8]) -> Result<PeerKey, StoreError> {
    let arr: [u8; 32] = b
        .try_into()
        .map_err(|_| corrupt(tree, "peer key is not 32 bytes"))?;
    PeerKey::from_bytes_cached(&arr).map_err(|e| corrupt(tree, e))
}

/// What follows the 32-byte peer key that starts a record key from a prefix scan by that
/// peer (`scan_prefix(peer)` guarantees the prefix; nothing to decode).
pub(crate) fn after_pkey<'k>(tree: &'static str, key: &'k [u8]) -> Result<&'k [u8], StoreError> {
    key.get(32..)
        .ok_or_else(|| corrupt(tree, "key shorter than a peer key"))
}

pub(crate) fn utf8(tree: &'static str, b: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(b.to_vec()).map_err(|e| corrupt(tree, e))
}

pub(crate) fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(D[(x >> 4) as usize] as char);
        s.push(D[(x & 15) as usize] as char);
    }
    s
}

pub(crate) fn peer_from_hex(tree: &'static str, s: &str) -> Result<PeerKey, StoreError> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return Err(corrupt(tree, "peer hex is not 64 chars"));
    }
    let nib = |c: u8| -> Result<u8, StoreError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(corrupt(tree, "peer hex has a non-hex char")),
        }
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nib(b[2 * i])? << 4) | nib(b[2 * i + 1])?;
    }
    PeerKey::from_bytes(&out).map_err(|e| corrupt(tree, e))
}
