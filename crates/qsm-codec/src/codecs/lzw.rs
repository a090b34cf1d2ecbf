//! Id 5: LZW (`weezl`), the algorithm of the ADSM client's software and hardware compression.
//! 8-bit symbols, LSB-first codes growing from 9 to 12 bits, a clear code when the table is
//! full, and an end code. It is slow (tens of MB/s) and kept for comparison with the paper.

use weezl::{BitOrder, LzwStatus, decode, encode};

use crate::codec::{Codec, CodecId, Compressor, Decompressor, LevelRange, check_level};
use crate::error::CodecError;

/// LZW with 12-bit maximum codes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lzw;

impl Lzw {
    /// Permanent id.
    pub const ID: CodecId = 5;
}

const SYMBOL_BITS: u8 = 8;

struct LzwCompressor(encode::Encoder);
struct LzwDecompressor(decode::Decoder);

impl Codec for Lzw {
    fn id(&self) -> CodecId {
        Self::ID
    }
    fn name(&self) -> &'static str {
        "lzw"
    }
    fn levels(&self) -> LevelRange {
        LevelRange::NONE
    }
    fn max_compressed_len(&self, raw_len: usize) -> usize {
        // At most one code of at most 12 bits per input byte, one clear code per table fill
        // (over 3,800 codes), a leading clear code and the end code.
        raw_len + raw_len / 2 + raw_len / 1024 + 16
    }
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError> {
        check_level(self, level)?;
        Ok(Box::new(LzwCompressor(encode::Encoder::new(BitOrder::Lsb, SYMBOL_BITS))))
    }
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
        Ok(Box::new(LzwDecompressor(decode::Decoder::new(BitOrder::Lsb, SYMBOL_BITS))))
    }
}

impl Compressor for LzwCompressor {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let enc = &mut self.0;
        enc.reset();
        enc.finish();
        let (mut read, mut written) = (0, 0);
        loop {
            let r = enc.encode_bytes(&src[read..], &mut dst[written..]);
            read += r.consumed_in;
            written += r.consumed_out;
            match r.status {
                Ok(LzwStatus::Done) => return Ok(written),
                Ok(LzwStatus::Ok) if r.consumed_in + r.consumed_out > 0 => {}
                Ok(_) => {
                    return Err(CodecError::OutputTooSmall { codec: "lzw", capacity: dst.len() });
                }
                Err(e) => return Err(CodecError::Internal { codec: "lzw", detail: e.to_string() }),
            }
        }
    }
}

impl Decompressor for LzwDecompressor {
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let corrupt = |detail: String| CodecError::Corrupt { codec: "lzw", detail };
        let dec = &mut self.0;
        dec.reset();
        let (mut read, mut written) = (0, 0);
        loop {
            let r = dec.decode_bytes(&src[read..], &mut dst[written..]);
            read += r.consumed_in;
            written += r.consumed_out;
            match r.status {
                Ok(LzwStatus::Done) => break,
                Ok(LzwStatus::Ok) if r.consumed_in + r.consumed_out > 0 => {}
                Ok(_) if written == dst.len() => {
                    return Err(corrupt(format!("expands beyond {} bytes", dst.len())));
                }
                Ok(_) => {
                    return Err(corrupt(format!("ends without an end code at input byte {read}")));
                }
                Err(e) => return Err(corrupt(format!("{e} at input byte {read}"))),
            }
        }
        if written != dst.len() {
            return Err(crate::codec::length_mismatch("lzw", dst.len(), written));
        }
        // weezl buffers input ahead of the end code, so bytes after it cannot be detected here;
        // they cannot alter the output either, whose length and checksum the frame verifies.
        Ok(())
    }
}
