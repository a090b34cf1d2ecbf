//! Id 6: LZO1X, one of the two software compressors the STAND paper measured. The payload is
//! a bare LZO1X stream with its end marker; no length prefix (the frame carries the raw
//! length). Written, at levels 1 to 8, by QSM's own LZO1X-1-style compressor (`lzo1x1.rs`,
//! the fast search the paper measured) and, at level 9, by `lzokay-native` (a pure-Rust port
//! of the MIT-licensed lzokay, an `lzo1x_999`-like search: better ratio, about a hundred
//! times slower); read by
//! the `lzo` crate, a decoder made for untrusted input (`forbid(unsafe_code)`, fuzzed), because
//! lzokay-native's own decoder panics on damaged input (the conformance suite's
//! `garbage_never_panics` found it) and damaged input must be an error.

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// LZO1X.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lzo;

impl Lzo {
    /// Permanent id.
    pub const ID: CodecId = 6;
}

/// Keeps the match finder's memory from block to block.
enum LzoCompressor {
    /// Levels 1–8: the hash table of the LZO1X-1 search.
    Fast(Vec<u32>),
    /// Level 9: lzokay's dictionary (about 200 KiB).
    Best(Box<lzokay_native::Dict>),
}
struct LzoDecompressor;

impl Codec for Lzo {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "lzo"
    }
    fn levels(&self) -> LevelRange {
        // As liblzo numbers them: 1 the fast lzo1x_1 search, 9 the optimal lzo1x_999.
        LevelRange { min: 1, max: 9, default: 1 }
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        // LZO1X's documented worst case (lzo1x_worst_compress in the LZO headers).
        raw_len + raw_len / 16 + 64 + 3
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(Box::new(if level == 9 {
            LzoCompressor::Best(Box::new(lzokay_native::Dict::new()))
        } else {
            LzoCompressor::Fast(Vec::new())
        }))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(Box::new(LzoDecompressor))
    }
}

impl Compressor for LzoCompressor {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        match self {
            LzoCompressor::Fast(table) => super::lzo1x1::compress(src, dst, table),
            LzoCompressor::Best(dict) => {
                // The crate returns a new vector; the copy costs a few percent of its time
                // and keeps the contract (compress into the caller's buffer).
                let packed = lzokay_native::compress_with_dict(src, dict)
                    .map_err(|e| CodecError::Internal { codec: "lzo", detail: e.to_string() })?;
                crate::codec::copy_out("lzo", &packed, dst)
            }
        }
    }
}

impl Decompressor for LzoDecompressor {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        if src.is_empty() && dst.is_empty() {
            return Ok(()); // the compressor writes nothing at all for empty input
        }
        let n = lzo::decompress_into(src, dst)
            .map_err(|e| CodecError::Corrupt { codec: "lzo", detail: e.to_string() })?;
        if n != dst.len() {
            return Err(crate::codec::length_mismatch("lzo", dst.len(), n));
        }
        Ok(())
    }
}
