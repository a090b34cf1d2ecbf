//! The black-box contract every block algorithm implements.
//!
//! A [`Codec`] describes an algorithm (permanent id, name, levels, output bound) and makes
//! per-thread [`Compressor`]s and [`Decompressor`]s. Those hold the algorithm's reusable state
//! (hash tables, windows, zstd contexts), which is why they take `&mut self`: one per worker
//! thread, reused for every quantum, so no block pays for allocation.

use std::fmt;

use crate::error::CodecError;

/// A codec's permanent numeric id, written into every frame. Never renumber: see `docs/FORMAT.md`.
pub type CodecId = u16;

/// The levels a codec accepts, and the one it uses when none is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelRange {
    /// Lowest accepted level (zstd's "fast" levels are negative).
    pub min: i32,
    /// Highest accepted level.
    pub max: i32,
    /// The level used when the caller names none.
    pub default: i32,
}

impl LevelRange {
    /// The range of an algorithm without levels: only 0 is accepted.
    pub const NONE: LevelRange = LevelRange { min: 0, max: 0, default: 0 };

    /// Whether `level` is accepted.
    pub fn contains(&self, level: i32) -> bool {
        (self.min..=self.max).contains(&level)
    }
}

/// A block algorithm: compress and decompress independent blocks.
pub trait Codec: Send + Sync + fmt::Debug {
    /// The permanent id stored in frames.
    fn id(&self) -> CodecId;
    /// The name users type (`zstd`, `lz4`, ...), lower case.
    fn name(&self) -> &'static str;
    /// The accepted levels.
    fn levels(&self) -> LevelRange;
    /// An upper bound on the compressed size of `raw_len` bytes; a `dst` of this size never
    /// makes [`Compressor::compress`] fail for lack of room.
    fn max_compressed_len(&self, raw_len: usize) -> usize;
    /// A compressor at `level`, or [`CodecError::LevelOutOfRange`].
    fn compressor(&self, level: i32) -> Result<Box<dyn Compressor>, CodecError>;
    /// A decompressor.
    fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError>;
}

/// Per-thread compression state of one codec at one level.
pub trait Compressor: Send {
    /// Compresses all of `src` into the front of `dst` and returns the bytes written.
    /// `dst` should hold [`Codec::max_compressed_len`] bytes; a smaller one may fail with
    /// [`CodecError::OutputTooSmall`].
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError>;
}

/// Per-thread decompression state of one codec.
pub trait Decompressor: Send {
    /// Decompresses `src`, which must expand to exactly `dst.len()` bytes: fewer or more is
    /// [`CodecError::Corrupt`], and so is trailing input where the format has an end marker
    /// the decoder can see (not LZ4 blocks, nor LZW as weezl reads ahead). Never panics,
    /// whatever `src` holds: the frame's length and checksum catch whatever a codec cannot.
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError>;
}

/// Checks `level` against `codec`'s range.
pub(crate) fn check_level(codec: &dyn Codec, level: i32) -> Result<(), CodecError> {
    let range = codec.levels();
    if range.contains(level) {
        Ok(())
    } else {
        Err(CodecError::LevelOutOfRange {
            codec: codec.name(),
            level,
            min: range.min,
            max: range.max,
        })
    }
}

/// Copies a block a library compressed into its own vector to the front of `dst`: for crates
/// that return a new vector rather than write into the caller's buffer.
pub(crate) fn copy_out(
    codec: &'static str,
    packed: &[u8],
    dst: &mut [u8],
) -> Result<usize, CodecError> {
    let capacity = dst.len();
    let out = dst.get_mut(..packed.len()).ok_or(CodecError::OutputTooSmall { codec, capacity })?;
    out.copy_from_slice(packed);
    Ok(packed.len())
}

/// The error for a decompressor that produced a different length than the frame declares.
pub(crate) fn length_mismatch(codec: &'static str, expected: usize, got: usize) -> CodecError {
    CodecError::Corrupt { codec, detail: format!("decoded {got} bytes, expected {expected}") }
}
