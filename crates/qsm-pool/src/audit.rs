//! The audit of one container, written once for every backend: from its index when sealed,
//! else by a forward scan that resumes at the next valid frame after a damaged one, reading
//! and verifying every frame. Backends open the container and check its header; what differs
//! between them is only what a failed read means ([`ReadErrors`]).

use qsm_codec::FrameHeader;

use crate::container::{self, CONTAINER_HEADER_LEN, ReadAt, Sealing};
use crate::frames::Verifier;
use crate::{AuditReport, ContainerId, Damage, PoolError, ScanEnd, ScanStop};

/// What a failed read of a frame means to the audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadErrors {
    /// Damage of that frame (a bad sector of a disk): recorded, and the audit goes on.
    Damage,
    /// Nothing about the stored bytes (a failed request to an object store): the audit
    /// ends with the error.
    Fail,
}

/// Audits container `id` behind `src`, whose header the caller has checked. `report` comes
/// in as the caller made it (for the container, with nothing found yet) and is returned
/// filled in.
pub fn audit_frames(
    src: &mut dyn ReadAt,
    id: ContainerId,
    verifier: &Verifier,
    read_errors: ReadErrors,
    mut report: AuditReport,
) -> Result<AuditReport, PoolError> {
    let size = src.size();
    let mut buf = Vec::new();
    let mut trailer_damage = None;
    let mut check = |src: &mut dyn ReadAt,
                     offset: u64,
                     expected: &FrameHeader,
                     from_index: bool,
                     report: &mut AuditReport| {
        audit_frame(src, verifier, read_errors, offset, expected, from_index, &mut buf, report)
    };
    match container::read_sealing(src, id)? {
        Sealing::Sealed(entries) => {
            let mut end = CONTAINER_HEADER_LEN as u64;
            for e in &entries {
                end = e.offset + e.header.frame_len() as u64;
                check(src, e.offset, &e.header, true, &mut report)?;
            }
            let frames = entries.len() as u64;
            report.end = ScanEnd { frames, end, size, stop: ScanStop::Sealed, trailer_damage };
            return Ok(report);
        }
        Sealing::Unsealed => {}
        Sealing::Damaged(e) => {
            report.damaged.push(Damage {
                offset: e.offset,
                len: size.saturating_sub(e.offset),
                detail: format!("trailer or index damaged, frames found by scanning: {}", e.detail),
            });
            trailer_damage = Some(format!("at byte offset {}: {}", e.offset, e.detail));
        }
    }
    // Forward scan; after a damaged frame header, resume at the next valid one so that one
    // damaged frame does not hide the rest of the container.
    let mut frames = 0;
    let mut start = CONTAINER_HEADER_LEN as u64;
    let end = loop {
        let mut found = Vec::new();
        let fwd = container::scan_forward(src, start, &mut |offset, header| {
            found.push((offset, *header));
            Ok(())
        })?;
        frames += fwd.frames;
        for (offset, header) in &found {
            check(src, *offset, header, false, &mut report)?;
        }
        let Some(detail) = fwd.stop.clone().filter(|_| !fwd.at_index) else { break fwd };
        match container::find_next_frame(src, fwd.end + 1)? {
            Some(next) => {
                report.damaged.push(Damage {
                    offset: fwd.end,
                    len: next - fwd.end,
                    detail: format!(
                        "{detail}; the scan resumed at the next valid frame, offset {next}"
                    ),
                });
                start = next;
            }
            None => break fwd,
        }
    };
    report.damaged.sort_by_key(|d| d.offset);
    let stop = match end.stop {
        None => ScanStop::EndOfFile,
        Some(detail) => ScanStop::Stopped { detail },
    };
    report.end = ScanEnd { frames, end: end.end, size, stop, trailer_damage };
    Ok(report)
}

/// Reads and verifies one frame, recording the result in `report`.
#[allow(clippy::too_many_arguments)] // the loop's state, passed down rather than boxed
fn audit_frame(
    src: &mut dyn ReadAt,
    verifier: &Verifier,
    read_errors: ReadErrors,
    offset: u64,
    expected: &FrameHeader,
    from_index: bool,
    buf: &mut Vec<u8>,
    report: &mut AuditReport,
) -> Result<(), PoolError> {
    let len = expected.frame_len() as u64;
    buf.resize(len as usize, 0);
    let result = match src.read_at(offset, buf) {
        Ok(()) => verifier.verify(buf).map_err(|e| e.to_string()).and_then(|header| {
            if from_index && header != *expected {
                return Err("the frame header differs from its index entry".to_string());
            }
            Ok(())
        }),
        Err(e) if read_errors == ReadErrors::Damage => Err(e.to_string()),
        Err(e) => return Err(e),
    };
    match result {
        Ok(()) => {
            report.frames_ok += 1;
            report.bytes_ok += len;
        }
        Err(detail) => report.damaged.push(Damage { offset, len, detail }),
    }
    Ok(())
}
