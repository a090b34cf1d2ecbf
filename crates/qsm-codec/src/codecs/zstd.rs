//! Id 2: Zstandard (`zstd`, bundled libzstd), one zstd frame per quantum, levels from the
//! negative "fast" levels to 22. Contexts are kept per thread and reused.

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx};

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// Zstandard.
#[derive(Debug, Clone, Copy, Default)]
pub struct Zstd;

impl Zstd {
    /// Permanent id.
    pub const ID: CodecId = 2;
    /// zstd's own fast levels go down to -131072, but below -50 nothing changes measurably
    /// (the acceleration saturates), so the accepted range stops there.
    pub const MIN_LEVEL: i32 = -50;
}

struct ZstdCompressor(CCtx<'static>);
struct ZstdDecompressor(DCtx<'static>);

fn internal(detail: &str) -> CodecError {
    CodecError::Internal { codec: "zstd", detail: detail.to_owned() }
}

impl Codec for Zstd {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "zstd"
    }
    fn levels(&self) -> LevelRange {
        LevelRange { min: Self::MIN_LEVEL, max: zstd_safe::max_c_level(), default: 3 }
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        zstd_safe::compress_bound(raw_len)
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        let mut cctx = CCtx::try_create().ok_or_else(|| internal("cannot allocate a context"))?;
        cctx.set_parameter(CParameter::CompressionLevel(level))
            .map_err(|code| internal(zstd_safe::get_error_name(code)))?;
        // The frame header already carries the raw length and an XXH3 of the data.
        cctx.set_parameter(CParameter::ChecksumFlag(false))
            .map_err(|code| internal(zstd_safe::get_error_name(code)))?;
        Ok(Box::new(ZstdCompressor(cctx)))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        let dctx = DCtx::try_create().ok_or_else(|| internal("cannot allocate a context"))?;
        Ok(Box::new(ZstdDecompressor(dctx)))
    }
}

impl Compressor for ZstdCompressor {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let capacity = dst.len();
        self.0.compress2(dst, src).map_err(|code| {
            if zstd_safe::get_error_name(code).contains("too small") {
                CodecError::OutputTooSmall { codec: "zstd", capacity }
            } else {
                internal(zstd_safe::get_error_name(code))
            }
        })
    }
}

impl Decompressor for ZstdDecompressor {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let expected = dst.len();
        // One zstd frame per payload, nothing before or after it (zstd would also accept
        // concatenated and skippable frames).
        match zstd_safe::find_frame_compressed_size(src) {
            Ok(n) if n == src.len() => {}
            Ok(n) => {
                let detail = format!("{} bytes after the zstd frame", src.len() - n);
                return Err(CodecError::Corrupt { codec: "zstd", detail });
            }
            Err(code) => {
                let detail = zstd_safe::get_error_name(code).to_owned();
                return Err(CodecError::Corrupt { codec: "zstd", detail });
            }
        }
        let n = self.0.decompress(dst, src).map_err(|code| CodecError::Corrupt {
            codec: "zstd",
            detail: zstd_safe::get_error_name(code).to_owned(),
        })?;
        if n != expected {
            return Err(crate::codec::length_mismatch("zstd", expected, n));
        }
        Ok(())
    }
}
