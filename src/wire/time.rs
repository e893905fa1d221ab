//! Timestamps: emit `YYYY-MM-DDTHH:MM:SS.mmmZ`, accept any RFC 3339 (protocol-notes §Envelope).

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    todo!()
}
/// Format Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_ms(ms: u64) -> String {
    todo!("{ms}")
}
/// Parse any RFC 3339 timestamp to Unix nanoseconds (i128 keeps full precision).
pub fn parse_rfc3339(s: &str) -> Result<i128, TimeError> {
    todo!("{s}")
}
/// A timestamp that is not RFC 3339.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not an RFC 3339 timestamp: {0}")]
pub struct TimeError(pub String);
