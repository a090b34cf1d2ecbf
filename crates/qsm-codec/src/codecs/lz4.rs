//! Id 1: LZ4 block format (`lz4_flex`), no frame and no size prefix: the quantum frame
//! already carries both lengths and a checksum.

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// LZ4 (block format). It has no levels: `lz4_flex` implements the default "fast" mode.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lz4;

impl Lz4 {
    /// Permanent id.
    pub const ID: CodecId = 1;
}

struct Lz4Block;

impl Codec for Lz4 {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "lz4"
    }
    fn levels(&self) -> LevelRange {
        LevelRange::NONE
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        lz4_flex::block::get_maximum_output_size(raw_len)
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(Box::new(Lz4Block))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(Box::new(Lz4Block))
    }
}

impl Compressor for Lz4Block {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        lz4_flex::block::compress_into(src, dst)
            .map_err(|_| CodecError::OutputTooSmall { codec: "lz4", capacity: dst.len() })
    }
}

impl Decompressor for Lz4Block {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let n = lz4_flex::block::decompress_into(src, dst)
            .map_err(|e| CodecError::Corrupt { codec: "lz4", detail: e.to_string() })?;
        if n != dst.len() {
            return Err(crate::codec::length_mismatch("lz4", dst.len(), n));
        }
        Ok(())
    }
}
