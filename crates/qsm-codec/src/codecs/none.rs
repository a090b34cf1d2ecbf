//! Id 0: the identity. Frames of this codec are always stored with the RAW flag.

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// No compression: the payload is the data.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCompression;

impl NoCompression {
    /// Permanent id.
    pub const ID: CodecId = 0;
}

struct Copy;

impl Codec for NoCompression {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "none"
    }
    fn levels(&self) -> LevelRange {
        LevelRange::NONE
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        raw_len
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(Box::new(Copy))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(Box::new(Copy))
    }
}

impl Compressor for Copy {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let capacity = dst.len();
        let out = dst
            .get_mut(..src.len())
            .ok_or(CodecError::OutputTooSmall { codec: "none", capacity })?;
        out.copy_from_slice(src);
        Ok(src.len())
    }
}

impl Decompressor for Copy {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        if src.len() != dst.len() {
            return Err(crate::codec::length_mismatch("none", dst.len(), src.len()));
        }
        dst.copy_from_slice(src);
        Ok(())
    }
}
