//! The quantum frame: one independently decodable block with a 28-byte header
//! (the "data encapsulation protocol"). The byte layout is specified in `docs/FORMAT.md`;
//! this file is its only implementation.

use xxhash_rust::xxh3::xxh3_64;

use crate::codec::{CodecId, Compressor, Decompressor};
use crate::codecs::NoCompression;
use crate::error::{CodecError, FrameError};
use crate::registry::{self, Compression};

/// The first four bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"QSMF";
/// The frame format version this program writes and reads.
pub const FRAME_VERSION: u8 = 1;
/// Bytes in a frame header.
pub const FRAME_HEADER_LEN: usize = 28;
/// The largest quantum (raw length) a frame may hold. 16 MiB is 16 times the default quantum:
/// past 4 MiB the ratio penalty of independent quanta is under 0.4% on average
/// (docs/PERFORMANCE.md), while larger quanta cost parallelism and memory. Readers reject
/// larger lengths before allocating anything.
pub const MAX_QUANTUM: usize = 16 << 20;
/// The largest payload a frame may hold: a quantum plus room for the nonce and tag that
/// encryption will add.
pub const MAX_STORED: usize = MAX_QUANTUM + 4096;

/// Flag: the payload is the raw data (the codec was `none`, or compression did not pay).
/// In a sealed frame it describes the plaintext inside the seal.
pub const FLAG_RAW: u8 = 0x01;
/// Flag bits 1-2: the seal (FORMAT.md 4.8): 0 none, [`SEAL_AES_256_GCM`],
/// [`SEAL_CHACHA20_POLY1305`]; 3 is reserved and refused.
pub const SEAL_MASK: u8 = 0x06;
/// Seal kind 1: AES-256-GCM.
pub const SEAL_AES_256_GCM: u8 = 1;
/// Seal kind 2: ChaCha20-Poly1305.
pub const SEAL_CHACHA20_POLY1305: u8 = 2;
const KNOWN_FLAGS: u8 = FLAG_RAW | SEAL_MASK;
/// Bytes a seal adds to a payload: a 12-byte nonce before the ciphertext, a 16-byte tag after.
pub const SEALED_OVERHEAD: usize = 12 + 16;
/// Bytes of the header that a seal's associated data covers: everything before the checksum
/// (magic, version, flags, codec, both lengths). The checksum of a sealed frame is computed
/// over the sealed payload, after sealing, so it cannot be covered; the header check covers it.
pub const SEALED_AAD_HEADER: usize = 16;

/// Seals and opens frame payloads (client-side encryption). This crate fixes the layout
/// (`nonce ‖ ciphertext ‖ tag`, [`SEALED_OVERHEAD`] bytes more than the plaintext) and the
/// associated data (the first [`SEALED_AAD_HEADER`] header bytes, then the caller's context:
/// the chunk id); the keys and the AEAD belong to the implementation (`qsm-crypt`).
pub trait PayloadSealer: Send + Sync {
    /// The seal kind this sealer writes ([`SEAL_AES_256_GCM`] or [`SEAL_CHACHA20_POLY1305`]).
    fn kind(&self) -> u8;
    /// Appends `plaintext` sealed under `aad` to `out`: exactly
    /// `plaintext.len() + SEALED_OVERHEAD` bytes.
    fn seal(&self, aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError>;
    /// Appends the plaintext of `sealed`, sealed with seal `kind` under `aad`, to `out` if it
    /// is authentic ([`FrameError::Tampered`] otherwise, [`FrameError::Encrypted`] for a kind
    /// it has no key for); nothing unauthenticated is appended.
    fn open(
        &self,
        kind: u8,
        aad: &[u8],
        sealed: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FrameError>;
}

/// A compressed quantum is kept only if it saves at least `raw_len / 32` bytes (rounded down:
/// about 3.1%) and at least one byte.
/// Below that the saving is noise (JPEG, video and archives shrink by 0-2% under zstd, and
/// LZ4 expands random data by 0.4%), while a raw frame restores at copy speed.
pub const MIN_SAVING_DIVISOR: usize = 32;

/// The checksum of a quantum's raw bytes: XXH3-64 (over 30 GB/s per core, so it costs
/// under 3% even next to LZ4 decompression).
pub fn checksum(data: &[u8]) -> u64 {
    xxh3_64(data)
}

fn header_check(bytes: &[u8]) -> u32 {
    // The low 32 bits; the header check guards the lengths before they are trusted.
    xxh3_64(bytes) as u32
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// A decoded and validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The codec that made the payload (or that was tried, for a raw frame).
    pub codec: CodecId,
    /// Flag bits ([`FLAG_RAW`]).
    pub flags: u8,
    /// Length of the quantum's raw data.
    pub raw_len: u32,
    /// Length of the payload that follows the header.
    pub stored_len: u32,
    /// [`checksum`] of the raw data.
    pub checksum: u64,
}

impl FrameHeader {
    /// Whether the payload (in a sealed frame: the plaintext inside the seal) is the raw data.
    pub fn is_raw(&self) -> bool {
        self.flags & FLAG_RAW != 0
    }

    /// The seal kind: 0 for a plaintext frame.
    pub fn seal(&self) -> u8 {
        (self.flags & SEAL_MASK) >> 1
    }

    /// Whether the payload is sealed (encrypted on the client).
    pub fn is_sealed(&self) -> bool {
        self.seal() != 0
    }

    /// The plaintext payload's length: the stored length less a seal's overhead.
    fn plain_len(&self) -> usize {
        let stored = self.stored_len as usize;
        if self.is_sealed() { stored.saturating_sub(SEALED_OVERHEAD) } else { stored }
    }

    /// The associated data of a sealed payload: header bytes 0..16, then `context`.
    fn aad(&self, context: &[u8], aad: &mut Vec<u8>) {
        aad.clear();
        aad.extend_from_slice(&self.to_bytes()[..SEALED_AAD_HEADER]);
        aad.extend_from_slice(context);
    }

    /// Header plus payload length.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + self.stored_len as usize
    }

    /// The 28 header bytes.
    pub fn to_bytes(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC);
        b[4] = FRAME_VERSION;
        b[5] = self.flags;
        b[6..8].copy_from_slice(&self.codec.to_le_bytes());
        b[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.stored_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        let check = header_check(&b[..24]);
        b[24..28].copy_from_slice(&check.to_le_bytes());
        b
    }

    /// Parses and validates the first [`FRAME_HEADER_LEN`] bytes of `bytes`: magic, version,
    /// header check, flags, codec and length limits, in that order.
    pub fn parse(bytes: &[u8]) -> Result<FrameHeader, FrameError> {
        let b = bytes.get(..FRAME_HEADER_LEN).ok_or(FrameError::Truncated {
            needed: FRAME_HEADER_LEN as u64,
            found: bytes.len() as u64,
        })?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        if b[4] != FRAME_VERSION {
            return Err(FrameError::UnsupportedVersion(b[4]));
        }
        let (stored, computed) = (le_u32(b, 24), header_check(&b[..24]));
        if stored != computed {
            return Err(FrameError::HeaderCheck { stored, computed });
        }
        let header = FrameHeader {
            flags: b[5],
            codec: le_u16(b, 6),
            raw_len: le_u32(b, 8),
            stored_len: le_u32(b, 12),
            checksum: le_u64(b, 16),
        };
        if header.flags & !KNOWN_FLAGS != 0 || header.seal() == 3 {
            return Err(FrameError::UnknownFlags(header.flags & (!KNOWN_FLAGS | SEAL_MASK)));
        }
        // A raw frame is readable whatever codec declined it; a compressed one needs its codec.
        if !header.is_raw() && registry::by_id(header.codec).is_none() {
            return Err(FrameError::UnknownCodec(header.codec));
        }
        let (raw, stored) = (header.raw_len as usize, header.stored_len as usize);
        if raw > MAX_QUANTUM {
            return Err(FrameError::BadLength(format!(
                "raw length {raw} exceeds the maximum quantum of {MAX_QUANTUM}"
            )));
        }
        if stored > MAX_STORED {
            return Err(FrameError::BadLength(format!(
                "stored length {stored} exceeds the maximum of {MAX_STORED}"
            )));
        }
        if header.is_sealed() && stored < SEALED_OVERHEAD {
            return Err(FrameError::BadLength(format!(
                "sealed frame of {stored} bytes, shorter than a seal's {SEALED_OVERHEAD}"
            )));
        }
        let plain = header.plain_len();
        if header.is_raw() && raw != plain {
            return Err(FrameError::BadLength(format!(
                "raw frame with raw length {raw} but stored length {stored}"
            )));
        }
        if !header.is_raw() && (plain == 0 || raw == 0) {
            return Err(FrameError::BadLength("compressed frame with an empty side".into()));
        }
        if !header.is_raw() && header.codec == NoCompression::ID {
            return Err(FrameError::BadLength("codec none without the RAW flag".into()));
        }
        Ok(header)
    }
}

/// Makes frames with one codec at one level; one per worker thread.
pub struct FrameEncoder {
    setting: Compression,
    compressor: Box<dyn Compressor>,
    scratch: Vec<u8>,
    /// The plaintext frame of a sealed one, and its associated data.
    plain: Vec<u8>,
    aad: Vec<u8>,
}

impl std::fmt::Debug for FrameEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameEncoder").field("setting", &self.setting).finish_non_exhaustive()
    }
}

impl FrameEncoder {
    /// An encoder for `setting`.
    pub fn new(setting: Compression) -> Result<FrameEncoder, CodecError> {
        let compressor = setting.codec.compressor(setting.level)?;
        Ok(FrameEncoder {
            setting,
            compressor,
            scratch: Vec::new(),
            plain: Vec::new(),
            aad: Vec::new(),
        })
    }

    /// Encodes `raw` (at most [`MAX_QUANTUM`] bytes) as one frame written to the front of
    /// `out`, which grows as needed and is never shrunk, so reusing it costs no allocation and
    /// no zeroing. The frame is `out[..header.frame_len()]`.
    pub fn encode(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<FrameHeader, FrameError> {
        if raw.len() > MAX_QUANTUM {
            return Err(FrameError::BadLength(format!(
                "quantum of {} bytes exceeds the maximum of {MAX_QUANTUM}",
                raw.len()
            )));
        }
        let codec = self.setting.codec;
        let bound = codec.max_compressed_len(raw.len()).max(raw.len());
        if out.len() < FRAME_HEADER_LEN + bound {
            out.resize(FRAME_HEADER_LEN + bound, 0);
        }
        let try_codec = codec.id() != NoCompression::ID
            && !raw.is_empty()
            && !(self.setting.skip_incompressible
                && crate::probe::looks_incompressible(raw, &mut self.scratch));
        let mut stored = None;
        if try_codec {
            let n = self.compressor.compress(raw, &mut out[FRAME_HEADER_LEN..])?;
            if n <= raw.len() - raw.len() / MIN_SAVING_DIVISOR && n < raw.len() {
                stored = Some(n);
            }
        }
        let (flags, stored_len) = match stored {
            Some(n) => (0, n),
            None => {
                out[FRAME_HEADER_LEN..FRAME_HEADER_LEN + raw.len()].copy_from_slice(raw);
                (FLAG_RAW, raw.len())
            }
        };
        // Both lengths are at most MAX_STORED, far below u32::MAX.
        let header = FrameHeader {
            codec: codec.id(),
            flags,
            raw_len: raw.len() as u32,
            stored_len: stored_len as u32,
            checksum: checksum(raw),
        };
        out[..FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
        Ok(header)
    }

    /// Encodes `raw` as [`FrameEncoder::encode`] does, then seals the payload with `sealer`
    /// under the header and `context` (the chunk id): the frame's checksum is then XXH3-64 of
    /// the sealed payload, so the server can verify what it stores without learning anything
    /// of the plaintext.
    pub fn encode_sealed(
        &mut self,
        raw: &[u8],
        out: &mut Vec<u8>,
        sealer: &dyn PayloadSealer,
        context: &[u8],
    ) -> Result<FrameHeader, FrameError> {
        let mut plain = std::mem::take(&mut self.plain);
        let result = self.encode(raw, &mut plain).and_then(|inner| {
            let kind = sealer.kind();
            if kind == 0 || kind > 2 {
                return Err(FrameError::UnknownFlags(kind << 1));
            }
            let payload = &plain[FRAME_HEADER_LEN..inner.frame_len()];
            let mut header = FrameHeader {
                flags: inner.flags | (kind << 1),
                stored_len: (payload.len() + SEALED_OVERHEAD) as u32,
                checksum: 0,
                ..inner
            };
            header.aad(context, &mut self.aad);
            out.clear();
            out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
            sealer.seal(&self.aad, payload, out)?;
            if out.len() != header.frame_len() {
                return Err(FrameError::BadLength(format!(
                    "the seal made {} bytes of a {}-byte payload",
                    out.len() - FRAME_HEADER_LEN,
                    payload.len()
                )));
            }
            header.checksum = checksum(&out[FRAME_HEADER_LEN..]);
            out[..FRAME_HEADER_LEN].copy_from_slice(&header.to_bytes());
            Ok(header)
        });
        self.plain = plain;
        result
    }
}

/// The header of `frame`, which must be exactly one whole frame.
fn parse_whole(frame: &[u8]) -> Result<FrameHeader, FrameError> {
    let header = FrameHeader::parse(frame)?;
    if frame.len() != header.frame_len() {
        return Err(FrameError::Truncated {
            needed: header.frame_len() as u64,
            found: frame.len() as u64,
        });
    }
    Ok(header)
}

/// A sealed frame's checksum, over the sealed payload: what can be checked without the key.
fn check_sealed(header: &FrameHeader, payload: &[u8]) -> Result<(), FrameError> {
    let computed = checksum(payload);
    if computed != header.checksum {
        return Err(FrameError::ChecksumMismatch { stored: header.checksum, computed });
    }
    Ok(())
}

/// Decodes frames of any codec; keeps one decompressor per codec seen. One per worker thread.
#[derive(Default)]
pub struct FrameDecoder {
    decompressors: Vec<(CodecId, Box<dyn Decompressor>)>,
    /// The opened plaintext payload of a sealed frame, and its associated data.
    plain: Vec<u8>,
    aad: Vec<u8>,
}

impl std::fmt::Debug for FrameDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<CodecId> = self.decompressors.iter().map(|(id, _)| *id).collect();
        f.debug_struct("FrameDecoder").field("codecs", &ids).finish()
    }
}

impl FrameDecoder {
    /// A decoder with no state yet.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Decodes the complete frame `frame` (header and payload, nothing more) into the front of
    /// `out`, which grows as needed; the data is `out[..header.raw_len]`. A sealed frame is
    /// refused ([`FrameError::Encrypted`]): it needs [`FrameDecoder::decode_sealed`].
    pub fn decode(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<FrameHeader, FrameError> {
        self.decode_sealed(frame, out, None, &[])
    }

    /// Verifies what can be verified without a key: a plaintext frame is decoded (into
    /// `scratch`) and its data checksum checked; a sealed frame's checksum is checked over the
    /// sealed payload. Audits of the pool use this.
    pub fn verify(
        &mut self,
        frame: &[u8],
        scratch: &mut Vec<u8>,
    ) -> Result<FrameHeader, FrameError> {
        let header = parse_whole(frame)?;
        if header.is_sealed() {
            check_sealed(&header, &frame[FRAME_HEADER_LEN..])?;
            return Ok(header);
        }
        self.decode(frame, scratch)
    }

    /// [`FrameDecoder::decode`] for frames that may be sealed: `sealer` opens them, with
    /// `context` (the chunk id the catalog names for this frame) in the associated data.
    pub fn decode_sealed(
        &mut self,
        frame: &[u8],
        out: &mut Vec<u8>,
        sealer: Option<&dyn PayloadSealer>,
        context: &[u8],
    ) -> Result<FrameHeader, FrameError> {
        let raw_len = parse_whole(frame)?.raw_len as usize;
        if out.len() < raw_len {
            out.resize(raw_len, 0);
        }
        self.decode_sealed_into(frame, out, sealer, context)
    }

    /// [`FrameDecoder::decode_sealed`] into a buffer the caller placed (a restore writing
    /// with `O_DIRECT` needs it aligned): the data is `out[..header.raw_len]`, and an `out`
    /// shorter than that is refused ([`FrameError::BadLength`]).
    pub fn decode_sealed_into(
        &mut self,
        frame: &[u8],
        out: &mut [u8],
        sealer: Option<&dyn PayloadSealer>,
        context: &[u8],
    ) -> Result<FrameHeader, FrameError> {
        let header = parse_whole(frame)?;
        let raw_len = header.raw_len as usize;
        let Some(out) = out.get_mut(..raw_len) else {
            return Err(FrameError::BadLength(format!(
                "output of {} bytes for a frame of {raw_len}",
                out.len()
            )));
        };
        let payload = &frame[FRAME_HEADER_LEN..];
        if !header.is_sealed() {
            self.decode_payload(&header, payload, out)?;
            return Ok(header);
        }
        // The checksum first: damage in storage is told apart from tampering.
        check_sealed(&header, payload)?;
        let sealer = sealer.ok_or(FrameError::Encrypted)?;
        header.aad(context, &mut self.aad);
        let mut plain = std::mem::take(&mut self.plain);
        plain.clear();
        let opened = sealer.open(header.seal(), &self.aad, payload, &mut plain).and_then(|()| {
            if plain.len() != header.plain_len() {
                return Err(FrameError::Tampered);
            }
            self.decode_plain(&header, &plain, out)
        });
        self.plain = plain;
        opened.map(|()| header)
    }

    /// Decodes an opened plaintext payload. Its integrity was proven by the seal, so there is
    /// no data checksum to check; the caller checks the chunk id.
    fn decode_plain(
        &mut self,
        header: &FrameHeader,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<(), FrameError> {
        if header.is_raw() {
            out.copy_from_slice(payload);
        } else {
            self.decompressor(header.codec)?.decompress(payload, out)?;
        }
        Ok(())
    }

    /// Decodes `payload` of a parsed `header` into `out` (exactly `raw_len` bytes) and
    /// verifies the checksum.
    pub fn decode_payload(
        &mut self,
        header: &FrameHeader,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<(), FrameError> {
        if header.is_sealed() {
            return Err(FrameError::Encrypted);
        }
        if payload.len() != header.stored_len as usize || out.len() != header.raw_len as usize {
            return Err(FrameError::BadLength(format!(
                "payload of {} bytes for a frame declaring {}, output of {} for {}",
                payload.len(),
                header.stored_len,
                out.len(),
                header.raw_len
            )));
        }
        if header.is_raw() {
            out.copy_from_slice(payload);
        } else {
            self.decompressor(header.codec)?.decompress(payload, out)?;
        }
        let computed = checksum(out);
        if computed != header.checksum {
            return Err(FrameError::ChecksumMismatch { stored: header.checksum, computed });
        }
        Ok(())
    }

    fn decompressor(&mut self, id: CodecId) -> Result<&mut Box<dyn Decompressor>, FrameError> {
        let at = match self.decompressors.iter().position(|(known, _)| *known == id) {
            Some(at) => at,
            None => {
                let codec = registry::by_id(id).ok_or(FrameError::UnknownCodec(id))?;
                self.decompressors.push((id, codec.decompressor()?));
                self.decompressors.len() - 1
            }
        };
        Ok(&mut self.decompressors[at].1)
    }
}
