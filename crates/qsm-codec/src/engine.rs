//! The parallel quantum engine: streams in, streams out, every core busy, output identical
//! for any thread count (see [`crate::pipeline`] for the memory bound).

use std::io::{Read, Seek, SeekFrom, Write};
use std::num::NonZeroUsize;
use std::ops::Range;

use crate::error::{Error, FrameError};
use crate::frame::{
    FRAME_HEADER_LEN, FRAME_MAGIC, FrameDecoder, FrameEncoder, FrameHeader, MAX_QUANTUM,
};
use crate::pipeline::{self, Slot};
use crate::registry::Compression;
use crate::stream::{
    INDEX_MAGIC, IndexBuilder, STREAM_HEADER_LEN, StreamIndex, check_stream_header, read_full,
    stream_header,
};

/// The default quantum: 1 MiB. On the 23 files of the Silesia, Canterbury and Snappy corpora,
/// independent 1 MiB quanta cost zstd -3 +0.91% of size on average and +4.80% at worst
/// (samba), within the project's 2% / 5% targets; 256 KiB costs +4.1% / +15%, 64 KiB
/// +8.3% / +28%, and 4 MiB gains only 0.6% more for four times the memory per slot
/// (docs/PERFORMANCE.md, "Ratio penalty of independent quanta").
pub const DEFAULT_QUANTUM: usize = 1 << 20;
/// The smallest quantum accepted: below 4 KiB every codec loses most of its ratio and the
/// 28-byte header and per-quantum overhead start to matter.
pub const MIN_QUANTUM: usize = 4096;

/// Worker threads when none is asked for: one per core.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// How to compress a stream.
#[derive(Debug, Clone, Copy)]
pub struct CompressOptions {
    /// Codec, level and probing.
    pub compression: Compression,
    /// Raw bytes per quantum (the last may be shorter).
    pub quantum_size: usize,
    /// Worker threads; `None` means one per core.
    pub threads: Option<usize>,
}

impl Default for CompressOptions {
    fn default() -> Self {
        CompressOptions {
            compression: Compression::AUTO,
            quantum_size: DEFAULT_QUANTUM,
            threads: None,
        }
    }
}

/// What a stream operation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Quanta processed.
    pub quanta: u64,
    /// Quanta stored raw (incompressible, or codec `none`).
    pub raw_quanta: u64,
    /// Bytes of original data.
    pub raw_bytes: u64,
    /// Bytes of the compressed stream (header, frames, index and trailer) read or written.
    pub stream_bytes: u64,
}

/// Receives each frame (its bytes and parsed header) in quantum order.
pub type FrameSink<'a> = dyn FnMut(&[u8], &FrameHeader) -> Result<(), Error> + 'a;

/// Compresses `input` into frames on all cores and hands each to `sink` in order, on the
/// caller's thread: the building block of both `compress` (which adds the stream's header and
/// index) and backup (which appends frames to a pool). An error from `sink` stops everything
/// and is returned.
pub fn encode_frames<R>(
    mut input: R,
    options: &CompressOptions,
    sink: &mut FrameSink<'_>,
) -> Result<u64, Error>
where
    R: Read + Send,
{
    let quantum = options.quantum_size;
    if !(MIN_QUANTUM..=MAX_QUANTUM).contains(&quantum) {
        return Err(Error::Invalid(format!(
            "quantum size {quantum} is out of range ({MIN_QUANTUM}..={MAX_QUANTUM} bytes)"
        )));
    }
    let setting = options.compression;
    FrameEncoder::new(setting)?; // reject a bad level before any output is written
    let mut consumed = 0u64;
    pipeline::run(
        options.threads.unwrap_or_else(default_threads),
        |_, slot: &mut Slot| {
            if slot.input.len() < quantum {
                slot.input.resize(quantum, 0);
            }
            let n = read_full(&mut input, &mut slot.input[..quantum])
                .map_err(Error::io("reading input"))?;
            slot.input_len = n;
            slot.offset = consumed;
            consumed += n as u64;
            Ok(n > 0)
        },
        || Ok(FrameEncoder::new(setting)?),
        |encoder, seq, slot| {
            let header = encoder
                .encode(&slot.input[..slot.input_len], &mut slot.output)
                .map_err(|source| Error::Quantum { index: seq, offset: slot.offset, source })?;
            slot.output_len = header.frame_len();
            slot.header = Some(header);
            Ok(())
        },
        |_, slot| match &slot.header {
            Some(header) => sink(&slot.output[..slot.output_len], header),
            None => Err(Error::Invalid("internal error: encoded slot without header".into())),
        },
    )
}

/// Compresses `input` into a stream on `output`. `progress` is called on the caller's thread
/// with the input bytes consumed so far. On error, `output` holds an incomplete stream, which
/// every reader rejects (it has no trailer).
pub fn compress<R, W>(
    input: R,
    mut output: W,
    options: &CompressOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<Summary, Error>
where
    R: Read + Send,
    W: Write,
{
    // Validate before the header is written, so a bad option leaves the output empty.
    if !(MIN_QUANTUM..=MAX_QUANTUM).contains(&options.quantum_size) {
        return encode_frames(input, options, &mut |_, _| Ok(())).map(|_| Summary::default());
    }
    FrameEncoder::new(options.compression)?;
    output.write_all(&stream_header()).map_err(Error::io("writing output"))?;
    let mut index = IndexBuilder::new();
    let mut raw_quanta = 0;
    encode_frames(input, options, &mut |frame, header| {
        output.write_all(frame).map_err(Error::io("writing output"))?;
        index.push(header);
        raw_quanta += u64::from(header.is_raw());
        progress(index.raw_total());
        Ok(())
    })?;
    let tail = index.finish();
    output.write_all(&tail).map_err(Error::io("writing output"))?;
    output.flush().map_err(Error::io("writing output"))?;
    Ok(Summary {
        quanta: index.len(),
        raw_quanta,
        raw_bytes: index.raw_total(),
        stream_bytes: index.next_offset() + tail.len() as u64,
    })
}

/// Decompresses a whole stream read sequentially (a pipe works), verifying every frame's
/// checksum and, at the end, that the index and trailer match the frames exactly, so a
/// truncated or spliced stream is an error. `progress` gets the stream bytes consumed.
pub fn decompress<R, W>(
    input: R,
    mut output: W,
    threads: Option<usize>,
    progress: &mut dyn FnMut(u64),
) -> Result<Summary, Error>
where
    R: Read + Send,
    W: Write,
{
    let mut reader = SequentialReader::new(input)?;
    let mut summary = Summary::default();
    pipeline::run(
        threads.unwrap_or_else(default_threads),
        |seq, slot| reader.next_frame(seq, slot),
        || Ok(FrameDecoder::new()),
        decode_slot,
        |_, slot| write_decoded(&mut output, slot, &mut summary, progress),
    )?;
    output.flush().map_err(Error::io("writing output"))?;
    summary.stream_bytes = reader.offset;
    Ok(summary)
}

/// Decompresses only quanta `range` of the stream in `file`, found through its `index`.
pub fn decompress_quanta<R, W>(
    mut file: R,
    index: &StreamIndex,
    range: Range<u64>,
    mut output: W,
    threads: Option<usize>,
    progress: &mut dyn FnMut(u64),
) -> Result<Summary, Error>
where
    R: Read + Seek + Send,
    W: Write,
{
    if range.start > range.end || range.end > index.len() {
        return Err(Error::Invalid(format!(
            "quantum range {}..{} is outside the stream's {} quanta",
            range.start,
            range.end,
            index.len()
        )));
    }
    if !range.is_empty() {
        let at = index.frame_span(range.start).0;
        file.seek(SeekFrom::Start(at)).map_err(Error::io("seeking input"))?;
    }
    let mut summary = Summary::default();
    pipeline::run(
        threads.unwrap_or_else(default_threads),
        |seq, slot| {
            let i = range.start + seq;
            if i >= range.end {
                return Ok(false);
            }
            let (offset, span) = index.frame_span(i);
            read_frame(&mut file, slot, offset, span as usize, i)?;
            let header = FrameHeader::parse(&slot.input).map_err(|source| Error::Quantum {
                index: i,
                offset,
                source,
            })?;
            index.check_header(i, &header)?;
            slot.header = Some(header);
            Ok(true)
        },
        || Ok(FrameDecoder::new()),
        |decoder, seq, slot| decode_slot(decoder, range.start + seq, slot),
        |_, slot| write_decoded(&mut output, slot, &mut summary, progress),
    )?;
    output.flush().map_err(Error::io("writing output"))?;
    Ok(summary)
}

fn read_frame<R: Read>(
    r: &mut R,
    slot: &mut Slot,
    offset: u64,
    len: usize,
    index: u64,
) -> Result<(), Error> {
    if slot.input.len() < len {
        slot.input.resize(len, 0);
    }
    let n = read_full(r, &mut slot.input[..len]).map_err(Error::io("reading input"))?;
    if n < len {
        let source = FrameError::Truncated { needed: len as u64, found: n as u64 };
        return Err(Error::Quantum { index, offset, source });
    }
    slot.input_len = len;
    slot.offset = offset;
    Ok(())
}

fn decode_slot(decoder: &mut FrameDecoder, index: u64, slot: &mut Slot) -> Result<(), Error> {
    let Some(header) = slot.header else {
        return Err(Error::Invalid("internal error: frame without header".into()));
    };
    let raw_len = header.raw_len as usize;
    if slot.output.len() < raw_len {
        slot.output.resize(raw_len, 0);
    }
    decoder
        .decode_payload(
            &header,
            &slot.input[FRAME_HEADER_LEN..slot.input_len],
            &mut slot.output[..raw_len],
        )
        .map_err(|source| Error::Quantum { index, offset: slot.offset, source })?;
    slot.output_len = raw_len;
    Ok(())
}

fn write_decoded<W: Write>(
    output: &mut W,
    slot: &Slot,
    summary: &mut Summary,
    progress: &mut dyn FnMut(u64),
) -> Result<(), Error> {
    output.write_all(&slot.output[..slot.output_len]).map_err(Error::io("writing output"))?;
    summary.quanta += 1;
    summary.raw_bytes += slot.output_len as u64;
    summary.raw_quanta += u64::from(slot.header.is_some_and(|h| h.is_raw()));
    summary.stream_bytes += slot.input_len as u64;
    progress(slot.offset + slot.input_len as u64);
    Ok(())
}

/// Reads frames one after another and checks the index and trailer at the end against the
/// frames it saw: the expected bytes are fully determined by them.
struct SequentialReader<R> {
    input: R,
    offset: u64,
    index: IndexBuilder,
}

impl<R: Read> SequentialReader<R> {
    fn new(mut input: R) -> Result<Self, Error> {
        let mut head = [0u8; STREAM_HEADER_LEN];
        let n = read_full(&mut input, &mut head).map_err(Error::io("reading input"))?;
        if n < head.len() {
            return Err(Error::stream(
                0,
                format!("truncated: {n} bytes is too short for a stream header"),
            ));
        }
        check_stream_header(&head)?;
        Ok(SequentialReader { input, offset: STREAM_HEADER_LEN as u64, index: IndexBuilder::new() })
    }

    fn next_frame(&mut self, seq: u64, slot: &mut Slot) -> Result<bool, Error> {
        let offset = self.offset;
        let quantum_err = |source| Error::Quantum { index: seq, offset, source };
        if slot.input.len() < FRAME_HEADER_LEN {
            slot.input.resize(FRAME_HEADER_LEN, 0);
        }
        let n =
            read_full(&mut self.input, &mut slot.input[..4]).map_err(Error::io("reading input"))?;
        if n == 0 {
            return Err(Error::stream(
                offset,
                format!("truncated: the stream ends after {seq} quanta without its index"),
            ));
        }
        if n == 4 && slot.input[..4] == INDEX_MAGIC {
            self.check_tail()?;
            return Ok(false);
        }
        if n < 4 {
            return Err(quantum_err(FrameError::Truncated {
                needed: FRAME_HEADER_LEN as u64,
                found: n as u64,
            }));
        }
        if slot.input[..4] != FRAME_MAGIC {
            let mut found = [0u8; 4];
            found[..n].copy_from_slice(&slot.input[..n]);
            return Err(quantum_err(FrameError::BadMagic { found }));
        }
        let n = read_full(&mut self.input, &mut slot.input[4..FRAME_HEADER_LEN])
            .map_err(Error::io("reading input"))?;
        if n < FRAME_HEADER_LEN - 4 {
            return Err(quantum_err(FrameError::Truncated {
                needed: FRAME_HEADER_LEN as u64,
                found: 4 + n as u64,
            }));
        }
        let header = FrameHeader::parse(&slot.input).map_err(quantum_err)?;
        let len = header.frame_len();
        if slot.input.len() < len {
            slot.input.resize(len, 0);
        }
        let n = read_full(&mut self.input, &mut slot.input[FRAME_HEADER_LEN..len])
            .map_err(Error::io("reading input"))?;
        if n < len - FRAME_HEADER_LEN {
            return Err(quantum_err(FrameError::Truncated {
                needed: len as u64,
                found: (FRAME_HEADER_LEN + n) as u64,
            }));
        }
        slot.input_len = len;
        slot.offset = offset;
        slot.header = Some(header);
        self.index.push(&header);
        self.offset += len as u64;
        Ok(true)
    }

    fn check_tail(&mut self) -> Result<(), Error> {
        let expected = self.index.finish();
        let mut tail = vec![0u8; expected.len()];
        tail[..4].copy_from_slice(&INDEX_MAGIC);
        let n = read_full(&mut self.input, &mut tail[4..]).map_err(Error::io("reading input"))?;
        if let Some(at) = tail[..4 + n].iter().zip(&expected).position(|(a, b)| a != b) {
            return Err(Error::stream(
                self.offset + at as u64,
                "the index or trailer does not match the frames before it (damaged, or frames are missing)",
            ));
        }
        if 4 + n < expected.len() {
            return Err(Error::stream(
                self.offset + (4 + n) as u64,
                "truncated: the index or trailer is incomplete",
            ));
        }
        self.offset += expected.len() as u64;
        let mut extra = [0u8; 1];
        match read_full(&mut self.input, &mut extra) {
            Ok(0) => Ok(()),
            Ok(_) => Err(Error::stream(self.offset, "unexpected data after the trailer")),
            Err(e) => Err(Error::Io { op: "reading input", source: e }),
        }
    }
}
