//! Feeds arbitrary bytes to both stream readers and the frame decoder. Any panic, hang or
//! out-of-memory is a bug: damaged input must only ever produce an error.
#![no_main]

use std::io::{Cursor, sink};

use libfuzzer_sys::fuzz_target;
use qsm_codec::{FrameDecoder, StreamIndex, decompress, decompress_quanta};

fuzz_target!(|data: &[u8]| {
    let _ = decompress(data, sink(), Some(2), &mut |_| {});
    let mut cursor = Cursor::new(data);
    if let Ok(index) = StreamIndex::read(&mut cursor) {
        let _ = decompress_quanta(cursor, &index, 0..index.len(), sink(), Some(2), &mut |_| {});
    }
    let _ = FrameDecoder::new().decode(data, &mut Vec::new());
});
