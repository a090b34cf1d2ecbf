//! Id 7: QuickLZ 1.5.0 level 1 (the `quicklz` crate, an MIT/Apache reimplementation of the
//! format), the other software compressor the STAND paper measured. The payload is one
//! QuickLZ packet: its own header (flags, compressed and raw sizes), then the data.

use std::io::Cursor;

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// QuickLZ level 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuickLz;

impl QuickLz {
    /// Permanent id.
    pub const ID: CodecId = 7;
}

struct QuickLzCompressor;
struct QuickLzDecompressor;

impl Codec for QuickLz {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "quicklz"
    }
    fn levels(&self) -> LevelRange {
        // Level 1 only: the one the paper measured. (The crate also has level 3; adding it
        // later is a new level, not a new format: packets record their level.)
        LevelRange { min: 1, max: 1, default: 1 }
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        // QuickLZ 1.5.0's bound: at most 400 bytes more than the input.
        raw_len + 400
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(Box::new(QuickLzCompressor))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(Box::new(QuickLzDecompressor))
    }
}

impl Compressor for QuickLzCompressor {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        // The crate panics above 4 GiB - 400; quanta are at most 16 MiB, but say so rather
        // than trust it.
        if src.len() > u32::MAX as usize - 400 {
            return Err(CodecError::Internal {
                codec: "quicklz",
                detail: "block over 4 GiB".into(),
            });
        }
        let packed = quicklz::compress(src, quicklz::CompressionLevel::Lvl1);
        crate::codec::copy_out("quicklz", &packed, dst)
    }
}

impl Decompressor for QuickLzDecompressor {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let corrupt = |detail: String| CodecError::Corrupt { codec: "quicklz", detail };
        let limit = u32::try_from(dst.len()).map_err(|_| corrupt("block over 4 GiB".into()))?;
        let mut reader = Cursor::new(src);
        let raw = quicklz::decompress(&mut reader, limit).map_err(|e| corrupt(e.to_string()))?;
        if raw.len() != dst.len() {
            return Err(crate::codec::length_mismatch("quicklz", dst.len(), raw.len()));
        }
        if reader.position() != src.len() as u64 {
            return Err(corrupt(format!(
                "{} bytes after the end of the packet",
                src.len() as u64 - reader.position()
            )));
        }
        dst.copy_from_slice(&raw);
        Ok(())
    }
}
