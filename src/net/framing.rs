//! Line framing: split on `\n`, never buffer more than the cap (+1 byte) while looking for
//! it, keep a trailing `\r` (the auth signature covers hello bytes as received).

use super::BoxReader;

/// Framing failures.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A line longer than [`crate::wire::MAX_LINE`]: answer `err too_large` and close.
    #[error("line over the size limit")]
    TooLarge,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Buffered line reader over a connection's read half.
pub struct LineReader {}

impl LineReader {
    /// Wrap a reader.
    pub fn new(r: BoxReader) -> LineReader {
        let _ = r;
        todo!()
    }
    /// Next line without its `\n`; `Ok(None)` at a clean EOF (a partial last line without
    /// `\n` at EOF is dropped).
    pub async fn read_line(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        todo!()
    }
    /// A complete line already in the buffer, without reading (for batching).
    pub fn buffered_line(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        todo!()
    }
}
