//! The container format: a header, the frames exactly as `qsm-codec` makes them, and, once
//! sealed, an index of the frame headers and a fixed-size trailer. Byte layout:
//! `docs/FORMAT.md`, section "Storage-pool containers"; this file is its only
//! implementation.
//!
//! Everything here works on ranged reads ([`ReadAt`]) and byte slices, not on files, so that
//! every pool backend (the local directory now, an object store later) parses containers with
//! the same code and the same checks.

use qsm_codec::frame::{FRAME_HEADER_LEN, FRAME_MAGIC, FrameHeader, MAX_STORED};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::error::PoolError;
use crate::{ContainerId, PoolId};

/// The first four bytes of every container.
pub const CONTAINER_MAGIC: [u8; 4] = *b"QSMC";
/// The container format version this program writes and reads.
pub const CONTAINER_VERSION: u8 = 1;
/// Bytes in the container header; the first frame starts here.
pub const CONTAINER_HEADER_LEN: usize = 48;
/// The first four bytes of a sealed container's index block.
pub const INDEX_MAGIC: [u8; 4] = *b"QSMD";
/// Bytes before the index entries: magic and four reserved zero bytes.
pub const INDEX_HEADER_LEN: usize = 8;
/// Bytes per index entry: a verbatim copy of the frame's header.
pub const INDEX_ENTRY_LEN: usize = FRAME_HEADER_LEN;
/// The last four bytes of a sealed container.
pub const TRAILER_MAGIC: [u8; 4] = *b"QSMX";
/// Bytes in the trailer.
pub const TRAILER_LEN: usize = 40;
/// The smallest sealed container: a header, an empty index and a trailer.
pub const MIN_SEALED_LEN: u64 = (CONTAINER_HEADER_LEN + INDEX_HEADER_LEN + TRAILER_LEN) as u64;
/// The longest frame a container may hold; nothing longer is ever allocated for one frame.
pub const MAX_FRAME_LEN: u64 = (FRAME_HEADER_LEN + MAX_STORED) as u64;

/// A problem with the bytes of a container, found at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    /// Where in the container.
    pub offset: u64,
    /// What is wrong.
    pub detail: String,
}

impl FormatError {
    fn new(offset: u64, detail: impl Into<String>) -> FormatError {
        FormatError { offset, detail: detail.into() }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn header_check(bytes: &[u8]) -> u32 {
    // The low 32 bits, as for the frame header check.
    xxh3_64(bytes) as u32
}

/// The decoded container header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerHeader {
    /// The pool the container belongs to.
    pub pool: PoolId,
    /// The container's own id (also its file or object name).
    pub container: ContainerId,
    /// When the container was created, in seconds since the Unix epoch (informative).
    pub created: u64,
}

impl ContainerHeader {
    /// The header bytes.
    pub fn to_bytes(&self) -> [u8; CONTAINER_HEADER_LEN] {
        let mut b = [0u8; CONTAINER_HEADER_LEN];
        b[0..4].copy_from_slice(&CONTAINER_MAGIC);
        b[4] = CONTAINER_VERSION;
        b[8..24].copy_from_slice(&self.pool.0);
        b[24..32].copy_from_slice(&self.container.to_le_bytes());
        b[32..40].copy_from_slice(&self.created.to_le_bytes());
        let check = header_check(&b[..44]);
        b[44..48].copy_from_slice(&check.to_le_bytes());
        b
    }

    /// Parses and validates a header: length, magic, version, header check, reserved bytes, in
    /// that order (the version before the check, as for frames: a future version may define
    /// the check differently). Which pool and container it names is the caller's to compare.
    pub fn parse(b: &[u8]) -> Result<ContainerHeader, FormatError> {
        let Some(b) = b.get(..CONTAINER_HEADER_LEN) else {
            return Err(FormatError::new(
                0,
                format!(
                    "{} bytes is shorter than a container header ({CONTAINER_HEADER_LEN}): \
                     truncated, or not a QSM container",
                    b.len()
                ),
            ));
        };
        if b[0..4] != CONTAINER_MAGIC {
            return Err(FormatError::new(
                0,
                format!("not a QSM container (magic {:02x?}, expected \"QSMC\")", &b[0..4]),
            ));
        }
        if b[4] != CONTAINER_VERSION {
            return Err(FormatError::new(
                4,
                format!(
                    "container format version {} is not supported (this program reads version \
                     {CONTAINER_VERSION})",
                    b[4]
                ),
            ));
        }
        let (stored, computed) = (u32_at(b, 44), header_check(&b[..44]));
        if stored != computed {
            return Err(FormatError::new(
                44,
                format!(
                    "container header is damaged (header check {stored:#010x}, computed \
                     {computed:#010x})"
                ),
            ));
        }
        if b[5..8] != [0; 3] || b[40..44] != [0; 4] {
            return Err(FormatError::new(5, "reserved container header bytes are not zero"));
        }
        let mut pool = [0u8; 16];
        pool.copy_from_slice(&b[8..24]);
        Ok(ContainerHeader { pool: PoolId(pool), container: u64_at(b, 24), created: u64_at(b, 32) })
    }
}

/// Collects the headers of the frames a writer appends and renders the index block and
/// trailer that seal the container.
#[derive(Debug, Clone)]
pub struct IndexBuilder {
    headers: Vec<u8>,
    next_offset: u64,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        IndexBuilder { headers: Vec::new(), next_offset: CONTAINER_HEADER_LEN as u64 }
    }
}

impl IndexBuilder {
    /// An empty index for a container whose first frame follows the header.
    pub fn new() -> IndexBuilder {
        IndexBuilder::default()
    }

    /// Records the next frame, given its header bytes (the first [`FRAME_HEADER_LEN`] bytes of
    /// the frame, already validated by the caller) and its whole length.
    pub fn push(&mut self, header: &[u8; FRAME_HEADER_LEN], frame_len: u64) {
        self.headers.extend_from_slice(header);
        self.next_offset += frame_len;
    }

    /// Frames recorded.
    pub fn len(&self) -> u64 {
        (self.headers.len() / INDEX_ENTRY_LEN) as u64
    }

    /// Whether no frame was recorded.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }

    /// Offset where the next frame (or the index block) starts.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The index block and trailer that seal `container` holding exactly the recorded frames.
    pub fn finish(&self, container: ContainerId) -> Vec<u8> {
        let mut out = Vec::with_capacity(INDEX_HEADER_LEN + self.headers.len() + TRAILER_LEN);
        out.extend_from_slice(&INDEX_MAGIC);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.headers);
        let mut trailer = [0u8; TRAILER_LEN];
        trailer[0..8].copy_from_slice(&self.len().to_le_bytes());
        trailer[8..16].copy_from_slice(&self.next_offset.to_le_bytes());
        trailer[16..24].copy_from_slice(&container.to_le_bytes());
        let check = index_check(&out, &trailer[..24]);
        trailer[24..32].copy_from_slice(&check.to_le_bytes());
        trailer[32] = CONTAINER_VERSION;
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

/// The fields of a trailer that passed [`parse_trailer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Frames in the container.
    pub frame_count: u64,
    /// Where the index block starts (= where the last frame ends).
    pub index_offset: u64,
    /// The container id repeated.
    pub container: ContainerId,
    /// XXH3-64 of the index block and trailer bytes 0..24.
    pub index_check: u64,
}

/// Whether `trailer` (the last [`TRAILER_LEN`] bytes) ends with the trailer magic: a
/// container without it is unsealed and read by forward scan.
pub fn has_trailer_magic(trailer: &[u8; TRAILER_LEN]) -> bool {
    trailer[36..40] == TRAILER_MAGIC
}

/// Validates the trailer of a container of `size` bytes that should be `container`: magic,
/// version, reserved bytes, the container id and, before anything is allocated for the
/// index, that the index it describes fills the file exactly. The index check is verified by
/// [`parse_index`].
pub fn parse_trailer(
    t: &[u8; TRAILER_LEN],
    size: u64,
    container: ContainerId,
) -> Result<Trailer, FormatError> {
    let at = size.saturating_sub(TRAILER_LEN as u64);
    if !has_trailer_magic(t) {
        return Err(FormatError::new(at + 36, "no \"QSMX\" trailer magic at the end"));
    }
    if t[32] != CONTAINER_VERSION {
        return Err(FormatError::new(
            at + 32,
            format!("trailer format version {} is not supported", t[32]),
        ));
    }
    if t[33..36] != [0; 3] {
        return Err(FormatError::new(at + 33, "reserved trailer bytes are not zero"));
    }
    let trailer = Trailer {
        frame_count: u64_at(t, 0),
        index_offset: u64_at(t, 8),
        container: u64_at(t, 16),
        index_check: u64_at(t, 24),
    };
    if trailer.container != container {
        return Err(FormatError::new(
            at + 16,
            format!("trailer names container {:016x}", trailer.container),
        ));
    }
    let Trailer { frame_count: count, index_offset, .. } = trailer;
    let expected = count
        .checked_mul(INDEX_ENTRY_LEN as u64)
        .and_then(|n| n.checked_add(index_offset))
        .and_then(|n| n.checked_add((INDEX_HEADER_LEN + TRAILER_LEN) as u64));
    // Every frame is at least a header long, so a count that the frame area cannot hold is
    // damage, whatever the lengths add up to.
    let frames_fit = index_offset
        .checked_sub(CONTAINER_HEADER_LEN as u64)
        .is_some_and(|area| count <= area / FRAME_HEADER_LEN as u64);
    if expected != Some(size) || !frames_fit {
        return Err(FormatError::new(
            at,
            format!(
                "trailer says {count} frames with the index at {index_offset}, which does not \
                 fit a container of {size} bytes"
            ),
        ));
    }
    Ok(trailer)
}

/// One frame listed by a sealed container's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the frame in the container.
    pub offset: u64,
    /// The frame's header, as the index records it.
    pub header: FrameHeader,
}

/// Validates the index block `index` (all the bytes from `trailer.index_offset` to the
/// trailer) against the trailer bytes `t` and returns its entries: the index check, the
/// index magic, every entry as a frame header, and that the frames fill the container from
/// its header to the index, back to back.
pub fn parse_index(
    index: &[u8],
    t: &[u8; TRAILER_LEN],
    trailer: &Trailer,
) -> Result<Vec<IndexEntry>, FormatError> {
    let at = trailer.index_offset;
    if index_check(index, &t[..24]) != trailer.index_check {
        return Err(FormatError::new(at, "index or trailer is damaged (check mismatch)"));
    }
    if index.get(..4) != Some(&INDEX_MAGIC[..]) || index.get(4..8) != Some(&[0u8; 4][..]) {
        return Err(FormatError::new(at, "no \"QSMD\" index magic where the trailer points"));
    }
    let entries = index.get(INDEX_HEADER_LEN..).unwrap_or_default();
    let mut out = Vec::with_capacity(entries.len() / INDEX_ENTRY_LEN);
    let mut offset = CONTAINER_HEADER_LEN as u64;
    for (i, entry) in entries.chunks_exact(INDEX_ENTRY_LEN).enumerate() {
        let header = FrameHeader::parse(entry)
            .map_err(|e| FormatError::new(at, format!("index entry {i}: {e}")))?;
        out.push(IndexEntry { offset, header });
        offset = offset.saturating_add(header.frame_len() as u64);
    }
    if offset != trailer.index_offset {
        return Err(FormatError::new(
            at,
            format!(
                "the indexed frames end at offset {offset}, but the index starts at {}",
                trailer.index_offset
            ),
        ));
    }
    Ok(out)
}

/// Ranged reads of one container: what every backend provides to the parsers here.
pub trait ReadAt {
    /// The container's size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` with the bytes at `offset`; callers stay within [`ReadAt::size`].
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), PoolError>;
}

/// What reading the trailer of a container found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sealing {
    /// A valid trailer and index: the container is sealed.
    Sealed(Vec<IndexEntry>),
    /// No trailer magic at the end: an open container, or one whose writer stopped (or
    /// crashed) before sealing it.
    Unsealed,
    /// The container ends with the trailer magic but the trailer or index is invalid.
    Damaged(FormatError),
}

/// Reads and validates the trailer and index of `container` through `src`. The index is read
/// only after the trailer has been checked to fit the container exactly, so a damaged count or
/// offset cannot make this allocate more than the container's size.
pub fn read_sealing(src: &mut dyn ReadAt, container: ContainerId) -> Result<Sealing, PoolError> {
    let size = src.size();
    if size < MIN_SEALED_LEN {
        return Ok(Sealing::Unsealed);
    }
    let mut t = [0u8; TRAILER_LEN];
    src.read_at(size - TRAILER_LEN as u64, &mut t)?;
    if !has_trailer_magic(&t) {
        return Ok(Sealing::Unsealed);
    }
    let trailer = match parse_trailer(&t, size, container) {
        Ok(trailer) => trailer,
        Err(e) => return Ok(Sealing::Damaged(e)),
    };
    // parse_trailer proved index_offset + index + trailer == size, so this fits the file.
    let index_len = size - TRAILER_LEN as u64 - trailer.index_offset;
    let mut index = vec![0u8; index_len as usize];
    src.read_at(trailer.index_offset, &mut index)?;
    Ok(match parse_index(&index, &t, &trailer) {
        Ok(entries) => Sealing::Sealed(entries),
        Err(e) => Sealing::Damaged(e),
    })
}

/// Where a forward scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardEnd {
    /// Frames visited.
    pub frames: u64,
    /// Offset just past the last frame visited.
    pub end: u64,
    /// Why the scan stopped before the end of the container; `None` when the frames reach
    /// it exactly.
    pub stop: Option<String>,
    /// Whether it stopped at an index block (a sealed container whose trailer is missing or
    /// damaged), rather than at a damaged or incomplete frame.
    pub at_index: bool,
}

/// Walks the frames from `start` (a frame boundary) by their headers alone, calling `visit`
/// with each frame's offset and header, and stops at the end of the container or at the first
/// frame that is incomplete or whose header is invalid: that is where a writer that crashed
/// before sealing stopped. Payloads are not read, so their checksums are not verified here.
pub fn scan_forward(
    src: &mut dyn ReadAt,
    start: u64,
    visit: &mut dyn FnMut(u64, &FrameHeader) -> Result<(), PoolError>,
) -> Result<ForwardEnd, PoolError> {
    let size = src.size();
    let mut offset = start;
    let mut frames = 0;
    let stopped = |frames, end, detail: String, at_index| {
        Ok(ForwardEnd { frames, end, stop: Some(detail), at_index })
    };
    loop {
        let left = size.saturating_sub(offset);
        if left == 0 {
            return Ok(ForwardEnd { frames, end: offset, stop: None, at_index: false });
        }
        let mut b = [0u8; FRAME_HEADER_LEN];
        let have = left.min(FRAME_HEADER_LEN as u64) as usize;
        src.read_at(offset, &mut b[..have])?;
        if have >= 4 && b[..4] == INDEX_MAGIC {
            let detail = "an index block starts here but no valid trailer ends the container \
                          (sealing was interrupted, or the trailer is damaged or truncated)";
            return stopped(frames, offset, detail.into(), true);
        }
        if have < FRAME_HEADER_LEN {
            let detail = format!(
                "{have} bytes at the end are an incomplete frame header (a writer stopped \
                 mid-frame, or the container was truncated)"
            );
            return stopped(frames, offset, detail, false);
        }
        let header = match FrameHeader::parse(&b) {
            Ok(header) => header,
            Err(e) => return stopped(frames, offset, format!("invalid frame header: {e}"), false),
        };
        let len = header.frame_len() as u64;
        if len > left {
            let detail = format!(
                "incomplete frame: its header announces {len} bytes but only {left} remain (a \
                 writer stopped mid-frame, or the container was truncated)"
            );
            return stopped(frames, offset, detail, false);
        }
        visit(offset, &header)?;
        frames += 1;
        offset += len;
    }
}

/// The offset of the first position at or after `from` where a valid frame header starts and
/// the frame it announces fits the container, if any. Used by audits to resume after a
/// damaged frame header in an unsealed container. It can also find a frame that a damaged
/// frame carried in its payload (a backed-up QSM stream stored raw), which is why only audits
/// use it and never a scan the catalog would trust.
pub fn find_next_frame(src: &mut dyn ReadAt, from: u64) -> Result<Option<u64>, PoolError> {
    const BLOCK: usize = 256 << 10;
    let size = src.size();
    let mut pos = from;
    let mut buf = vec![0u8; BLOCK];
    while size.saturating_sub(pos) >= FRAME_HEADER_LEN as u64 {
        let n = (size - pos).min(BLOCK as u64) as usize;
        src.read_at(pos, &mut buf[..n])?;
        for i in 0..=n - 4 {
            if buf[i..i + 4] != FRAME_MAGIC {
                continue;
            }
            let at = pos + i as u64;
            if size - at < FRAME_HEADER_LEN as u64 {
                return Ok(None);
            }
            let mut h = [0u8; FRAME_HEADER_LEN];
            match buf.get(i..i + FRAME_HEADER_LEN) {
                Some(b) if i + FRAME_HEADER_LEN <= n => h.copy_from_slice(b),
                _ => src.read_at(at, &mut h)?,
            }
            if let Ok(header) = FrameHeader::parse(&h)
                && header.frame_len() as u64 <= size - at
            {
                return Ok(Some(at));
            }
        }
        if pos + n as u64 >= size {
            break;
        }
        // The next block starts 3 bytes back, so a magic cut by the block boundary is found.
        pos += (n - 3) as u64;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h =
            ContainerHeader { pool: PoolId([7; 16]), container: 0x0123_4567_89ab_cdef, created: 5 };
        let b = h.to_bytes();
        assert_eq!(ContainerHeader::parse(&b), Ok(h));
        for i in 0..CONTAINER_HEADER_LEN {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert!(ContainerHeader::parse(&bad).is_err(), "flip in byte {i} accepted");
        }
        assert!(ContainerHeader::parse(&b[..47]).is_err());
    }

    /// The example container of `docs/FORMAT.md` ("Storage-pool containers"): pool id
    /// 00 01 .. 0f, container 0123456789abcdef created 2026-11-22, one RAW frame of `abc`.
    fn example() -> Vec<u8> {
        let mut pool = [0u8; 16];
        for (i, b) in pool.iter_mut().enumerate() {
            *b = i as u8;
        }
        let header = ContainerHeader {
            pool: PoolId(pool),
            container: 0x0123_4567_89ab_cdef,
            created: 1_795_305_600,
        };
        let frame = FrameHeader {
            codec: 0,
            flags: qsm_codec::frame::FLAG_RAW,
            raw_len: 3,
            stored_len: 3,
            checksum: qsm_codec::frame::checksum(b"abc"),
        };
        let mut out = header.to_bytes().to_vec();
        out.extend_from_slice(&frame.to_bytes());
        out.extend_from_slice(b"abc");
        let mut index = IndexBuilder::new();
        index.push(&frame.to_bytes(), frame.frame_len() as u64);
        out.extend_from_slice(&index.finish(header.container));
        out
    }

    #[test]
    fn the_documented_example_is_what_writers_write() {
        let bytes = example();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "51534d4301000000000102030405060708090a0b0c0d0e0fefcdab89674523018030026b00000000\
             00000000b08c7f8a51534d4601010000030000000300000050392f89945faf78dc4cfa5561626351\
             534d440000000051534d4601010000030000000300000050392f89945faf78dc4cfa550100000000\
             0000004f00000000000000efcdab896745230154abced13767f9740100000051534d58"
        );
        let size = bytes.len() as u64;
        let mut t = [0u8; TRAILER_LEN];
        t.copy_from_slice(&bytes[bytes.len() - TRAILER_LEN..]);
        let trailer = parse_trailer(&t, size, 0x0123_4567_89ab_cdef).map_err(|e| e.detail);
        assert_eq!(trailer.map(|t| (t.frame_count, t.index_offset)), Ok((1, 79)));
        let trailer = parse_trailer(&t, size, 0x0123_4567_89ab_cdef).map_err(|e| e.detail);
        let entries = trailer.and_then(|tr| {
            parse_index(&bytes[79..bytes.len() - TRAILER_LEN], &t, &tr).map_err(|e| e.detail)
        });
        assert_eq!(entries.map(|e| e.iter().map(|e| e.offset).collect::<Vec<_>>()), Ok(vec![48]));
    }

    #[test]
    fn empty_index_seals() {
        let sealed = IndexBuilder::new().finish(9);
        let mut t = [0u8; TRAILER_LEN];
        t.copy_from_slice(&sealed[sealed.len() - TRAILER_LEN..]);
        let size = (CONTAINER_HEADER_LEN + sealed.len()) as u64;
        let trailer = parse_trailer(&t, size, 9).map_err(|e| e.detail);
        assert_eq!(trailer.map(|t| t.frame_count), Ok(0));
        assert!(parse_trailer(&t, size, 8).is_err(), "another container's trailer accepted");
        assert!(parse_trailer(&t, size + 1, 9).is_err(), "a trailer that does not fit accepted");
    }
}
