//! base64 forms of protocol-notes §Envelope: encoders emit the canonical form, decoders
//! accept base64url or standard, padded or not.

/// Unpadded base64url (keys, nonces, signatures).
pub fn encode_url(bytes: &[u8]) -> String {
    todo!("{bytes:?}")
}
/// Standard base64 with padding (chunk data).
pub fn encode_std(bytes: &[u8]) -> String {
    todo!("{bytes:?}")
}
/// Decode any of the four forms. Errors on anything else.
pub fn decode_any(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    todo!("{s}")
}
