//! Errors of the codec layer.
//!
//! Policy: nothing in this crate panics on input, whatever its bytes. Errors are typed and
//! carry what a user needs to find the damage: the codec, the quantum number, the byte offset.
//! [`CodecError`] comes from one algorithm on one block, [`FrameError`] from one frame, and
//! [`Error`] is the crate's public boundary for streams, naming the quantum and offset.

use std::io;

use crate::codec::CodecId;

/// An error of one block algorithm on one block.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// The level is not in the codec's range.
    #[error("level {level} is out of range for {codec} (valid: {min}..={max})")]
    LevelOutOfRange {
        /// Codec name.
        codec: &'static str,
        /// The rejected level.
        level: i32,
        /// Lowest valid level.
        min: i32,
        /// Highest valid level.
        max: i32,
    },
    /// The output buffer cannot hold the result.
    #[error("{codec}: output buffer of {capacity} bytes is too small")]
    OutputTooSmall {
        /// Codec name.
        codec: &'static str,
        /// Size of the buffer given.
        capacity: usize,
    },
    /// The compressed payload does not decode.
    #[error("corrupt {codec} payload: {detail}")]
    Corrupt {
        /// Codec name.
        codec: &'static str,
        /// What the decoder said.
        detail: String,
    },
    /// The codec library failed for a reason other than the input (e.g. out of memory).
    #[error("{codec} failed: {detail}")]
    Internal {
        /// Codec name.
        codec: &'static str,
        /// What the library said.
        detail: String,
    },
}

/// An error in one quantum frame.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header or payload needs.
    #[error("truncated frame: needed {needed} bytes, found {found}")]
    Truncated {
        /// Bytes needed.
        needed: u64,
        /// Bytes present.
        found: u64,
    },
    /// The first four bytes are not the frame magic.
    #[error("not a QSM frame (magic {found:02x?}, expected \"QSMF\")")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A format version this program does not know.
    #[error("frame format version {0} is not supported (this program reads version 1)")]
    UnsupportedVersion(u8),
    /// Flag bits this version does not define.
    #[error("frame has unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    /// The header check does not match: the header itself is damaged.
    #[error("frame header is damaged (header check {stored:#010x}, computed {computed:#010x})")]
    HeaderCheck {
        /// Value stored in the header.
        stored: u32,
        /// Value computed over the header.
        computed: u32,
    },
    /// A codec id this program does not know.
    #[error("frame uses unknown codec id {0}")]
    UnknownCodec(CodecId),
    /// Lengths outside the format's limits, rejected before any allocation.
    #[error("frame lengths are invalid: {0}")]
    BadLength(String),
    /// The payload failed to decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The decoded bytes do not match the checksum of the original data.
    #[error("checksum mismatch: frame says {stored:#018x}, data gives {computed:#018x}")]
    ChecksumMismatch {
        /// Checksum stored in the frame.
        stored: u64,
        /// Checksum of the decoded bytes.
        computed: u64,
    },
    /// The frame is encrypted and no key was given to open it.
    #[error("the frame is encrypted: its node's key is needed to read it")]
    Encrypted,
    /// An encrypted frame failed authentication: altered, or moved under another header or
    /// chunk id, or sealed by another key.
    #[error(
        "the encrypted frame failed authentication: it was altered, moved or replayed, or belongs to another key"
    )]
    Tampered,
}

/// An error of a whole stream operation: the crate's public error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the input or writing the output failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done ("reading input", "writing output").
        op: &'static str,
        /// The I/O error.
        source: io::Error,
    },
    /// One quantum failed; `offset` is where it starts (in the input when compressing, in the
    /// compressed stream when decompressing).
    #[error("quantum {index} at byte offset {offset}: {source}")]
    Quantum {
        /// Zero-based quantum number.
        index: u64,
        /// Byte offset of the quantum.
        offset: u64,
        /// What went wrong.
        source: FrameError,
    },
    /// The stream's header, index or trailer is missing or damaged.
    #[error("corrupt stream at byte offset {offset}: {detail}")]
    Stream {
        /// Where the problem was found.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// The request itself is invalid (unknown codec, bad quantum size, range out of bounds).
    #[error("{0}")]
    Invalid(String),
    /// A codec could not be set up (e.g. level out of range).
    #[error(transparent)]
    Codec(#[from] CodecError),
}

impl Error {
    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { op, source }
    }

    pub(crate) fn stream(offset: u64, detail: impl Into<String>) -> Error {
        Error::Stream { offset, detail: detail.into() }
    }
}
