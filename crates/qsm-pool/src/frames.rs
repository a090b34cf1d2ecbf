//! Checks every pool backend makes of the frames it stores and returns: the frame handed to
//! a writer, the bytes read back at a location, and the data checksum of a decoded frame.

use std::sync::{Mutex, MutexGuard};

use qsm_codec::frame::FRAME_HEADER_LEN;
use qsm_codec::{FrameDecoder, FrameError, FrameHeader};

use crate::PoolError;

/// Decode buffers larger than this are not kept between reads, so an occasional huge quantum
/// does not pin 16 MiB per idle decoder.
const KEEP_SCRATCH: usize = 4 << 20;
/// Decoders kept for reuse between reads (about one per reading thread).
const KEEP_DECODERS: usize = 8;

/// The frame's header, checked against the number of bytes the location gives, without
/// decoding it.
pub fn check_frame(frame: &[u8]) -> Result<FrameHeader, FrameError> {
    let header = FrameHeader::parse(frame)?;
    if header.frame_len() != frame.len() {
        return Err(FrameError::BadLength(format!(
            "the frame header says {} bytes but the location gives {}",
            header.frame_len(),
            frame.len()
        )));
    }
    Ok(header)
}

/// A frame handed to [`crate::PoolWriter::append`] of pool `pool`: one complete frame, whose
/// header bytes are returned for the container's index.
pub fn check_appended(pool: &str, frame: &[u8]) -> Result<[u8; FRAME_HEADER_LEN], PoolError> {
    let invalid = |source| PoolError::InvalidFrame { pool: pool.to_owned(), source };
    let parsed = FrameHeader::parse(frame).map_err(invalid)?;
    if parsed.frame_len() != frame.len() {
        return Err(invalid(FrameError::BadLength(format!(
            "{} bytes given for a frame of {} bytes",
            frame.len(),
            parsed.frame_len()
        ))));
    }
    let mut header = [0u8; FRAME_HEADER_LEN];
    header.copy_from_slice(&frame[..FRAME_HEADER_LEN]);
    Ok(header)
}

#[derive(Debug, Default)]
struct Scratch {
    decoder: FrameDecoder,
    raw: Vec<u8>,
}

/// Verifies frames' data checksums by decoding them, with decoders and buffers reused
/// between calls from any thread.
#[derive(Debug, Default)]
pub struct Verifier {
    scratch: Mutex<Vec<Scratch>>,
}

impl Verifier {
    fn lock(&self) -> MutexGuard<'_, Vec<Scratch>> {
        // A poisoned lock only means a thread panicked mid-verify; the kept decoders are
        // reset by each use.
        self.scratch.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Checks that `frame` is exactly one valid frame ([`check_frame`]) and decodes it to
    /// verify its data checksum.
    pub fn verify(&self, frame: &[u8]) -> Result<FrameHeader, FrameError> {
        check_frame(frame)?;
        let mut s = self.lock().pop().unwrap_or_default();
        let result = s.decoder.verify(frame, &mut s.raw);
        if s.raw.capacity() <= KEEP_SCRATCH {
            let mut kept = self.lock();
            if kept.len() < KEEP_DECODERS {
                kept.push(s);
            }
        }
        result
    }
}
