//! # qsm-codec: block algorithms, quantum frames and the parallel engine
//!
//! QSM cuts data into independent **quanta**. Each is compressed and checksummed on its own and
//! framed with a 28-byte header, so all cores can work at once and any quantum decodes alone.
//! This crate knows nothing of files, networks or databases; it offers:
//!
//! - [`Codec`]: the black-box contract of a block algorithm, and the [`registry`] of built-in
//!   codecs (none, LZ4, Zstandard, zlib, gzip, LZW) under permanent ids.
//! - [`frame`]: the frame format ([`FrameEncoder`], [`FrameDecoder`]) with expansion detection
//!   and the `auto` [`probe`] that stores incompressible data raw.
//! - [`stream`]: the container of `qsm compress` (frames, index, trailer).
//! - [`engine`]: compress and decompress streams on N threads with bounded memory and output
//!   identical for any thread count; decode any range of quanta through the index.
//!
//! The byte layouts are specified in `docs/FORMAT.md` and pinned by the test vectors in
//! `tests/vectors/`.

pub mod codec;
pub mod codecs;
pub mod engine;
pub mod error;
pub mod frame;
pub mod pipeline;
pub mod probe;
pub mod queue;
pub mod registry;
pub mod stream;

pub use codec::{Codec, CodecId, Compressor, Decompressor, LevelRange};
pub use engine::{
    CompressOptions, DEFAULT_QUANTUM, Summary, compress, decompress, decompress_quanta,
    encode_frames,
};
pub use error::{CodecError, Error, FrameError};
pub use frame::{FrameDecoder, FrameEncoder, FrameHeader, PayloadSealer};
pub use registry::Compression;
pub use stream::StreamIndex;
