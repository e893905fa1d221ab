//! Hostile bytes as the store's redo journal file (`store/journal.rs`): the decoder never
//! panics, reads at most one record per 16-byte header, and reading the first half of the
//! input yields a prefix of the records read from all of it.
#![no_main]

use awp_node::store::journal_lsns;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (lsns, stop) = journal_lsns(data);
    // Each record takes at least its 16-byte header.
    assert!(lsns.len() * 16 <= data.len());
    if data.is_empty() {
        assert!(lsns.is_empty() && stop.is_none());
    }
    // Reading a prefix that ends inside the input never yields more records.
    let half = &data[..data.len() / 2];
    let (fewer, _) = journal_lsns(half);
    assert!(fewer.len() <= lsns.len());
    assert_eq!(&lsns[..fewer.len()], &fewer[..]);
});
