//! Timestamps: emit `YYYY-MM-DDTHH:MM:SS.mmmZ`, accept any RFC 3339 (protocol-notes §Envelope).

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Format Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, exactly three fraction
/// digits), the form every `ts` is written in. Values past year 9999 are clamped to
/// `9999-12-31T23:59:59.999Z`.
pub fn format_ms(ms: u64) -> String {
    const MAX_MS: u64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    let ms = ms.min(MAX_MS);
    let dt = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.millisecond()
    )
}

/// Parse any RFC 3339 timestamp (any offset, up to nanosecond fractions) to Unix
/// nanoseconds; i128 keeps full precision. Errors with [`TimeError`] on anything else.
pub fn parse_rfc3339(s: &str) -> Result<i128, TimeError> {
    OffsetDateTime::parse(s, &Rfc3339)
        .map(|dt| dt.unix_timestamp_nanos())
        .map_err(|_| TimeError(s.to_owned()))
}

/// Whether an RFC 3339 expiry `exp` has passed at `now_ms` (Unix milliseconds): expired
/// when now >= exp (grants, §10.2). Errors when `exp` is not RFC 3339.
pub fn is_expired(exp: &str, now_ms: u64) -> Result<bool, TimeError> {
    Ok(now_ms as i128 * 1_000_000 >= parse_rfc3339(exp)?)
}

/// A timestamp that is not RFC 3339.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not an RFC 3339 timestamp: {0}")]
pub struct TimeError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_three_fraction_digits() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(1_767_225_600_001), "2026-01-01T00:00:00.001Z");
        assert_eq!(format_ms(u64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn formatted_value_parses_back() {
        let ms = 1_790_355_791_250;
        assert_eq!(
            parse_rfc3339(&format_ms(ms)).unwrap(),
            ms as i128 * 1_000_000
        );
    }

    #[test]
    fn now_is_after_2025() {
        assert!(now_ms() > 1_735_689_600_000);
    }
}
