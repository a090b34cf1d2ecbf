//! Ids 3 and 4: DEFLATE in a zlib container and in a gzip container (`flate2` on the
//! `zlib-rs` backend). Each payload is a complete zlib stream or gzip member, so any standard
//! tool (`gzip -d`, `zlib-flate`) can read a payload cut out of a frame.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// DEFLATE in a zlib container (RFC 1950).
#[derive(Debug, Clone, Copy, Default)]
pub struct Zlib;

/// DEFLATE in a gzip container (RFC 1952).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gzip;

impl Zlib {
    /// Permanent id.
    pub const ID: CodecId = 3;
}

impl Gzip {
    /// Permanent id.
    pub const ID: CodecId = 4;
}

/// Both containers share these levels: zlib's 1 (fastest) to 9 (best), default 6.
const LEVELS: LevelRange = LevelRange { min: 1, max: 9, default: 6 };
/// Offset of the OS byte in a gzip header (RFC 1952, section 2.3).
const GZIP_OS_BYTE: usize = 9;
/// zlib's window: 2^15 bytes, the only one every inflater accepts.
const WINDOW_BITS: u8 = 15;

/// zlib's conservative `deflateBound` (the one it uses for non-default parameters), plus the
/// larger (gzip) wrapper. The tighter default bound (`n + n/4096 + ...`) does not hold here:
/// zlib-rs's level 1 ("quick") emits static-Huffman blocks, which spend 9 bits on some byte
/// values and grow random data by up to 1/8 (found by the conformance suite).
fn bound(raw_len: usize) -> usize {
    raw_len + (raw_len >> 3) + (raw_len >> 8) + (raw_len >> 9) + 4 + 18 + 64
}

#[derive(Clone, Copy)]
enum Container {
    Zlib,
    Gzip,
}

impl Container {
    fn name(self) -> &'static str {
        match self {
            Container::Zlib => "zlib",
            Container::Gzip => "gzip",
        }
    }
}

struct DeflateCompressor {
    inner: Compress,
    container: Container,
}

struct DeflateDecompressor {
    inner: Decompress,
    container: Container,
}

fn compressor(container: Container, level: i32) -> Box<dyn Compressor> {
    // `check_level` has bounded `level` to 1..=9.
    let level = Compression::new(level.unsigned_abs());
    let inner = match container {
        Container::Zlib => Compress::new(level, true),
        Container::Gzip => Compress::new_gzip(level, WINDOW_BITS),
    };
    Box::new(DeflateCompressor { inner, container })
}

fn decompressor(container: Container) -> Box<dyn Decompressor> {
    let inner = match container {
        Container::Zlib => Decompress::new(true),
        Container::Gzip => Decompress::new_gzip(WINDOW_BITS),
    };
    Box::new(DeflateDecompressor { inner, container })
}

impl Codec for Zlib {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "zlib"
    }
    fn levels(&self) -> LevelRange {
        LEVELS
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        bound(raw_len)
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(compressor(Container::Zlib, level))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(decompressor(Container::Zlib))
    }
}

impl Codec for Gzip {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "gzip"
    }
    fn levels(&self) -> LevelRange {
        LEVELS
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        bound(raw_len)
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(compressor(Container::Gzip, level))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(decompressor(Container::Gzip))
    }
}

impl Compressor for DeflateCompressor {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let codec = self.container.name();
        self.inner.reset();
        let status = self
            .inner
            .compress(src, dst, FlushCompress::Finish)
            .map_err(|e| CodecError::Internal { codec, detail: e.to_string() })?;
        if status != Status::StreamEnd || self.inner.total_in() != src.len() as u64 {
            return Err(CodecError::OutputTooSmall { codec, capacity: dst.len() });
        }
        let n = usize::try_from(self.inner.total_out())
            .map_err(|_| CodecError::Internal { codec, detail: "output length overflow".into() })?;
        if let (Container::Gzip, Some(os)) = (self.container, dst.get_mut(GZIP_OS_BYTE)) {
            // The gzip header names the OS that wrote it (3 on Unix, 19 on macOS...). Writing
            // 255, "unknown", makes a stream's bytes the same on every platform; the byte is
            // outside the member's CRC and every inflater ignores it.
            *os = 255;
        }
        Ok(n)
    }
}

impl Decompressor for DeflateDecompressor {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let codec = self.container.name();
        let corrupt = |detail: String| CodecError::Corrupt { codec, detail };
        match self.container {
            Container::Zlib => self.inner.reset(true),
            // `reset` cannot re-enter gzip mode on every backend: start afresh instead.
            Container::Gzip => self.inner = Decompress::new_gzip(WINDOW_BITS),
        }
        let status = self
            .inner
            .decompress(src, dst, FlushDecompress::Finish)
            .map_err(|e| corrupt(e.to_string()))?;
        let (read, written) = (self.inner.total_in(), self.inner.total_out());
        if status != Status::StreamEnd {
            return Err(corrupt(format!(
                "stream does not end within {} bytes of output ({read} of {} input bytes read)",
                dst.len(),
                src.len()
            )));
        }
        if written != dst.len() as u64 {
            return Err(crate::codec::length_mismatch(codec, dst.len(), written as usize));
        }
        if read != src.len() as u64 {
            return Err(corrupt(format!("{} bytes of trailing data", src.len() as u64 - read)));
        }
        Ok(())
    }
}
