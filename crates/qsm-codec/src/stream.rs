//! The stream container of `qsm compress`: a header, the frames in order, an index of frame
//! offsets and a fixed-size trailer, so a reader can find any quantum without scanning and a
//! sequential reader can verify that nothing is missing. Byte layout: `docs/FORMAT.md`.

use std::io::{ErrorKind, Read, Seek, SeekFrom};

use xxhash_rust::xxh3::Xxh3;

use crate::error::{Error, FrameError};
use crate::frame::{FRAME_HEADER_LEN, FrameHeader, MAX_QUANTUM, MAX_STORED};

/// The first four bytes of a stream.
pub const STREAM_MAGIC: [u8; 4] = *b"QSMS";
/// The stream format version this program writes and reads.
pub const STREAM_VERSION: u8 = 1;
/// Bytes in the stream header.
pub const STREAM_HEADER_LEN: usize = 8;
/// The first four bytes of the index.
pub const INDEX_MAGIC: [u8; 4] = *b"QSMI";
/// Bytes before the index entries: magic and four reserved zero bytes.
pub const INDEX_HEADER_LEN: usize = 8;
/// Bytes per index entry: frame offset and raw offset, both u64.
pub const INDEX_ENTRY_LEN: usize = 16;
/// The last four bytes of a stream.
pub const TRAILER_MAGIC: [u8; 4] = *b"QSMT";
/// Bytes in the trailer.
pub const TRAILER_LEN: usize = 40;

/// The 8-byte stream header.
pub fn stream_header() -> [u8; STREAM_HEADER_LEN] {
    let mut b = [0u8; STREAM_HEADER_LEN];
    b[..4].copy_from_slice(&STREAM_MAGIC);
    b[4] = STREAM_VERSION;
    b
}

/// Validates a stream header.
pub fn check_stream_header(b: &[u8]) -> Result<(), Error> {
    if b.len() < STREAM_HEADER_LEN || b[..4] != STREAM_MAGIC {
        return Err(Error::stream(0, "not a QSM stream (no \"QSMS\" magic at the start)"));
    }
    if b[4] != STREAM_VERSION {
        return Err(Error::stream(4, format!("stream format version {} is not supported", b[4])));
    }
    if b[5..8] != [0, 0, 0] {
        return Err(Error::stream(5, "reserved header bytes are not zero"));
    }
    Ok(())
}

/// Where quantum `i` sits in the stream and in the original data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the frame from the start of the stream.
    pub frame_offset: u64,
    /// Offset of the quantum's first byte in the original data.
    pub raw_offset: u64,
}

/// Collects index entries while frames are written, and renders the index and trailer.
#[derive(Debug, Clone)]
pub struct IndexBuilder {
    entries: Vec<IndexEntry>,
    next_frame: u64,
    raw_total: u64,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        IndexBuilder { entries: Vec::new(), next_frame: STREAM_HEADER_LEN as u64, raw_total: 0 }
    }
}

impl IndexBuilder {
    /// An empty index for a stream whose first frame follows the header.
    pub fn new() -> IndexBuilder {
        IndexBuilder::default()
    }

    /// Records the next frame.
    pub fn push(&mut self, header: &FrameHeader) {
        self.entries.push(IndexEntry { frame_offset: self.next_frame, raw_offset: self.raw_total });
        self.next_frame += header.frame_len() as u64;
        self.raw_total += u64::from(header.raw_len);
    }

    /// Frames recorded so far.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether no frame was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stream offset where the next frame (or the index) starts.
    pub fn next_offset(&self) -> u64 {
        self.next_frame
    }

    /// Raw bytes recorded so far.
    pub fn raw_total(&self) -> u64 {
        self.raw_total
    }

    /// The index block and trailer that end a stream holding exactly the recorded frames.
    pub fn finish(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            INDEX_HEADER_LEN + self.entries.len() * INDEX_ENTRY_LEN + TRAILER_LEN,
        );
        out.extend_from_slice(&INDEX_MAGIC);
        out.extend_from_slice(&[0; 4]);
        for e in &self.entries {
            out.extend_from_slice(&e.frame_offset.to_le_bytes());
            out.extend_from_slice(&e.raw_offset.to_le_bytes());
        }
        let mut trailer = [0u8; TRAILER_LEN];
        trailer[0..8].copy_from_slice(&self.len().to_le_bytes());
        trailer[8..16].copy_from_slice(&self.next_frame.to_le_bytes());
        trailer[16..24].copy_from_slice(&self.raw_total.to_le_bytes());
        let check = index_check(&out, &trailer[..24]);
        trailer[24..32].copy_from_slice(&check.to_le_bytes());
        trailer[32] = STREAM_VERSION;
        trailer[36..40].copy_from_slice(&TRAILER_MAGIC);
        out.extend_from_slice(&trailer);
        out
    }
}

fn index_check(index: &[u8], trailer_fields: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(index);
    h.update(trailer_fields);
    h.digest()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The validated index of a stream held in a seekable file.
#[derive(Debug, Clone)]
pub struct StreamIndex {
    entries: Vec<IndexEntry>,
    index_offset: u64,
    raw_total: u64,
}

impl StreamIndex {
    /// Reads and validates the header, trailer and index of the stream in `file`, whose length
    /// bounds every allocation: a damaged count cannot make this allocate more than the file.
    pub fn read<R: Read + Seek>(file: &mut R) -> Result<StreamIndex, Error> {
        let len = file.seek(SeekFrom::End(0)).map_err(Error::io("seeking input"))?;
        let min = (STREAM_HEADER_LEN + INDEX_HEADER_LEN + TRAILER_LEN) as u64;
        if len < min {
            return Err(Error::stream(
                len,
                format!("truncated: {len} bytes is shorter than the smallest stream ({min})"),
            ));
        }
        let mut head = [0u8; STREAM_HEADER_LEN];
        read_at(file, 0, &mut head)?;
        check_stream_header(&head)?;
        let mut trailer = [0u8; TRAILER_LEN];
        let trailer_at = len - TRAILER_LEN as u64;
        read_at(file, trailer_at, &mut trailer)?;
        if trailer[36..40] != TRAILER_MAGIC {
            return Err(Error::stream(
                len - 4,
                "no \"QSMT\" trailer at the end: truncated or not a complete stream",
            ));
        }
        if trailer[32] != STREAM_VERSION {
            let detail = format!("trailer format version {} is not supported", trailer[32]);
            return Err(Error::stream(trailer_at + 32, detail));
        }
        if trailer[33..36] != [0, 0, 0] {
            return Err(Error::stream(trailer_at + 33, "reserved trailer bytes are not zero"));
        }
        let (count, index_offset, raw_total) =
            (u64_at(&trailer, 0), u64_at(&trailer, 8), u64_at(&trailer, 16));
        let expected_len = count
            .checked_mul(INDEX_ENTRY_LEN as u64)
            .and_then(|n| n.checked_add(index_offset))
            .and_then(|n| n.checked_add((INDEX_HEADER_LEN + TRAILER_LEN) as u64));
        if expected_len != Some(len) {
            return Err(Error::stream(
                trailer_at,
                format!(
                    "trailer says {count} quanta with the index at {index_offset}, which does not fit a stream of {len} bytes"
                ),
            ));
        }
        let mut index = vec![0u8; (trailer_at - index_offset) as usize];
        read_at(file, index_offset, &mut index)?;
        if index_check(&index, &trailer[..24]) != u64_at(&trailer, 24) {
            return Err(Error::stream(
                index_offset,
                "index or trailer is damaged (check mismatch)",
            ));
        }
        if index[..4] != INDEX_MAGIC || index[4..8] != [0; 4] {
            return Err(Error::stream(
                index_offset,
                "no \"QSMI\" index magic where the trailer points",
            ));
        }
        let entries = index[INDEX_HEADER_LEN..]
            .chunks_exact(INDEX_ENTRY_LEN)
            .map(|e| IndexEntry { frame_offset: u64_at(e, 0), raw_offset: u64_at(e, 8) })
            .collect();
        let parsed = StreamIndex { entries, index_offset, raw_total };
        parsed.validate()?;
        Ok(parsed)
    }

    /// Offsets must start where they should, grow, and leave room for a frame each within the
    /// format's limits. Frame lengths themselves are checked against these spans when read.
    fn validate(&self) -> Result<(), Error> {
        let bad = |detail: String| Err(Error::stream(self.index_offset, detail));
        let Some(first) = self.entries.first() else {
            if self.index_offset != STREAM_HEADER_LEN as u64 || self.raw_total != 0 {
                return bad("an empty stream with frames or data".into());
            }
            return Ok(());
        };
        if first.frame_offset != STREAM_HEADER_LEN as u64 || first.raw_offset != 0 {
            return bad("the first quantum does not start the stream".into());
        }
        for i in 0..self.entries.len() {
            let (frame, raw) = (self.frame_span(i as u64), self.raw_span(i as u64));
            let frame_ok = frame.1 >= FRAME_HEADER_LEN as u64
                && frame.1 <= (FRAME_HEADER_LEN + MAX_STORED) as u64;
            if !frame_ok || raw.1 > MAX_QUANTUM as u64 {
                return bad(format!("index entry {i} is inconsistent"));
            }
        }
        Ok(())
    }

    /// Number of quanta.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether the stream holds no quantum.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Length of the original data.
    pub fn raw_len(&self) -> u64 {
        self.raw_total
    }

    /// Where the index starts (= the end of the last frame).
    pub fn index_offset(&self) -> u64 {
        self.index_offset
    }

    /// The entries, in quantum order.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Offset and length of frame `i` in the stream (saturating on a bad index, which
    /// `validate` has ruled out).
    pub fn frame_span(&self, i: u64) -> (u64, u64) {
        let i = i as usize;
        let start = self.entries[i].frame_offset;
        let end = self.entries.get(i + 1).map_or(self.index_offset, |e| e.frame_offset);
        (start, end.saturating_sub(start))
    }

    /// Offset and length of quantum `i` in the original data.
    pub fn raw_span(&self, i: u64) -> (u64, u64) {
        let i = i as usize;
        let start = self.entries[i].raw_offset;
        let end = self.entries.get(i + 1).map_or(self.raw_total, |e| e.raw_offset);
        (start, end.wrapping_sub(start))
    }

    /// Reads and parses the header of frame `i`.
    pub fn frame_header<R: Read + Seek>(&self, file: &mut R, i: u64) -> Result<FrameHeader, Error> {
        let offset = self.frame_span(i).0;
        let mut b = [0u8; FRAME_HEADER_LEN];
        read_at(file, offset, &mut b)?;
        let header =
            FrameHeader::parse(&b).map_err(|source| Error::Quantum { index: i, offset, source })?;
        self.check_header(i, &header)?;
        Ok(header)
    }

    /// Checks that `header` fills exactly the spans the index gives quantum `i`.
    pub fn check_header(&self, i: u64, header: &FrameHeader) -> Result<(), Error> {
        let ((offset, span), (_, raw)) = (self.frame_span(i), self.raw_span(i));
        if header.frame_len() as u64 != span || u64::from(header.raw_len) != raw {
            return Err(Error::Quantum {
                index: i,
                offset,
                source: FrameError::BadLength(format!(
                    "frame of {} bytes holding {} raw bytes, but the index gives {span} and {raw}",
                    header.frame_len(),
                    header.raw_len
                )),
            });
        }
        Ok(())
    }
}

fn read_at<R: Read + Seek>(file: &mut R, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
    file.seek(SeekFrom::Start(offset)).map_err(Error::io("seeking input"))?;
    file.read_exact(buf).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            Error::stream(offset, format!("truncated: cannot read {} bytes here", buf.len()))
        } else {
            Error::Io { op: "reading input", source: e }
        }
    })
}

/// Reads `buf.len()` bytes, or fewer only at end of input; returns how many.
pub(crate) fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
