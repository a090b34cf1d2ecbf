//! The conformance suite every [`Pool`] implementation must pass: the directory pool now,
//! the object-store pool later, with the same checks (as restic's `internal/backend/test`
//! does for its backends).
//!
//! A backend's integration test supplies a [`PoolFactory`] (a closure making a new, empty
//! pool with a given container target size) and runs [`run_all`], or each entry of
//! [`CHECKS`] as its own test. Checks return a [`Failure`] saying what went wrong instead of
//! panicking. Fault injection (damaged bytes, full or read-only storage) depends on the
//! backend and lives in its own tests.
//!
//! ```no_run
//! use qsm_pool::{DirPool, DirPoolOptions, Pool, PoolError};
//!
//! let dir = std::env::temp_dir().join("qsm-pool-conformance");
//! let mut n = 0;
//! let mut factory = |target_size: u64| -> Result<Box<dyn Pool>, PoolError> {
//!     n += 1;
//!     let options = DirPoolOptions { target_size: Some(target_size), ..Default::default() };
//!     Ok(Box::new(DirPool::create(dir.join(format!("pool-{n}")), "conformance", &options)?))
//! };
//! qsm_pool::conformance::run_all(&mut factory).map_err(|e| e.to_string())?;
//! # Ok::<(), String>(())
//! ```

use std::collections::HashSet;
use std::fmt;

use qsm_codec::{CodecError, Compression, FrameEncoder, FrameError, FrameHeader, registry};

use crate::{
    CatalogTag, ContainerId, FrameLocation, Pool, PoolError, PoolWriter, ScanEnd, ScanStop,
    audit_pool, copy_frames,
};

/// Why a check failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Failure {
        Failure(format!("unexpected pool error: {e}"))
    }
}

impl From<FrameError> for Failure {
    fn from(e: FrameError) -> Failure {
        Failure(format!("making a test frame: {e}"))
    }
}

impl From<CodecError> for Failure {
    fn from(e: CodecError) -> Failure {
        Failure(format!("setting up a codec: {e}"))
    }
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($msg)+)));
        }
    };
}

/// Makes a new, empty pool whose writers seal containers at `target_size` bytes (see
/// [`crate::DirPoolOptions::target_size`]). Every call must return a different pool.
pub trait PoolFactory {
    /// A new, empty pool.
    fn new_pool(&mut self, target_size: u64) -> Result<Box<dyn Pool>, PoolError>;
}

impl<F: FnMut(u64) -> Result<Box<dyn Pool>, PoolError>> PoolFactory for F {
    fn new_pool(&mut self, target_size: u64) -> Result<Box<dyn Pool>, PoolError> {
        self(target_size)
    }
}

/// One check of the suite.
pub type Check = fn(&mut dyn PoolFactory) -> Result<(), Failure>;

/// Every check, by name.
pub const CHECKS: &[(&str, Check)] = &[
    ("identity", identity),
    ("round_trip_every_codec", round_trip_every_codec),
    ("synced_frames_readable_while_open", synced_frames_readable_while_open),
    ("concurrent_writers", concurrent_writers),
    ("rollover_at_target_size", rollover_at_target_size),
    ("scan_sealed_matches_unsealed", scan_sealed_matches_unsealed),
    ("delete_container", delete_container),
    ("missing_container", missing_container),
    ("audit_healthy", audit_healthy),
    ("rejects_invalid_frames", rejects_invalid_frames),
    ("empty_writer_leaves_nothing", empty_writer_leaves_nothing),
    ("copy_frames_moves_live_frames", copy_frames_moves_live_frames),
    ("wrong_locations_are_corrupt", wrong_locations_are_corrupt),
    ("read_for_decode_matches_read", read_for_decode_matches_read),
    ("catalog_record", catalog_record),
];

/// Runs every check and reports all failures, not only the first.
pub fn run_all(factory: &mut dyn PoolFactory) -> Result<(), Failure> {
    let failures: Vec<String> = CHECKS
        .iter()
        .filter_map(|(name, check)| check(factory).err().map(|e| format!("{name}: {e}")))
        .collect();
    if failures.is_empty() {
        return Ok(());
    }
    Err(Failure(format!(
        "{} of {} conformance checks failed:\n{}",
        failures.len(),
        CHECKS.len(),
        failures.join("\n")
    )))
}

/// A target size large enough that checks not about rollover stay in one container.
const ONE_CONTAINER: u64 = 64 << 20;

/// Deterministic pseudo-random bytes (xorshift64*): incompressible.
pub fn random_data(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Deterministic text-like bytes: compressible.
pub fn text_data(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&[u8]; 8] =
        [b"quantum ", b"storage ", b"pool ", b"the ", b"container ", b"frame ", b"of ", b"\n"];
    let picks = random_data(len / 2 + 1, seed);
    let mut out = Vec::with_capacity(len + 16);
    for p in picks.iter().cycle() {
        if out.len() >= len {
            break;
        }
        out.extend_from_slice(WORDS[usize::from(p & 7)]);
    }
    out.truncate(len);
    out
}

/// One frame of `raw` made with `setting`, exactly as a client would send it.
pub fn encode(setting: Compression, raw: &[u8]) -> Result<Vec<u8>, Failure> {
    let mut out = Vec::new();
    let header = FrameEncoder::new(setting)?.encode(raw, &mut out)?;
    out.truncate(header.frame_len());
    Ok(out)
}

/// Frames of every codec of the registry and of `auto`, over compressible, incompressible,
/// constant, one-byte and empty data: compressed and RAW frames of every codec id.
pub fn sample_frames(seed: u64) -> Result<Vec<Vec<u8>>, Failure> {
    let mut settings: Vec<Compression> =
        registry::all().iter().map(|codec| Compression::new(*codec)).collect();
    settings.push(Compression::AUTO);
    let data = [
        text_data(20_000, seed),
        random_data(5_000, seed + 1),
        vec![0u8; 3_000],
        vec![0x5a],
        Vec::new(),
    ];
    let mut frames = Vec::new();
    for setting in settings {
        for raw in &data {
            frames.push(encode(setting, raw)?);
        }
    }
    Ok(frames)
}

/// Every frame of container `id` as [`Pool::scan`] visits it, and how the scan ended.
pub fn scan_all(
    pool: &dyn Pool,
    id: ContainerId,
) -> Result<(Vec<(FrameLocation, FrameHeader)>, ScanEnd), PoolError> {
    let mut frames = Vec::new();
    let end = pool.scan(id, &mut |loc, header| {
        frames.push((loc, *header));
        Ok(())
    })?;
    Ok((frames, end))
}

fn append_all(w: &mut dyn PoolWriter, frames: &[Vec<u8>]) -> Result<Vec<FrameLocation>, Failure> {
    frames.iter().map(|f| w.append(f).map_err(Failure::from)).collect()
}

/// Reads every location back and compares it with the frame that was appended there.
fn check_reads(pool: &dyn Pool, frames: &[Vec<u8>], locs: &[FrameLocation]) -> Result<(), Failure> {
    ensure!(frames.len() == locs.len(), "{} frames but {} locations", frames.len(), locs.len());
    let mut out = Vec::new();
    for (i, (frame, loc)) in frames.iter().zip(locs).enumerate() {
        let header = pool.read_frame(loc, Some(i as u64), &mut out)?;
        ensure!(out == *frame, "frame {i} at {loc:?} reads back different bytes");
        ensure!(header == FrameHeader::parse(frame)?, "frame {i} at {loc:?}: wrong header");
        ensure!(
            usize::try_from(loc.len).ok() == Some(frame.len()),
            "frame {i}: wrong length in {loc:?}"
        );
    }
    Ok(())
}

/// Locations must not overlap and must lie after the container header.
fn check_disjoint(locs: &[FrameLocation]) -> Result<(), Failure> {
    let mut sorted = locs.to_vec();
    sorted.sort();
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        ensure!(
            a.container != b.container || a.offset + u64::from(a.len) <= b.offset,
            "locations {a:?} and {b:?} overlap"
        );
    }
    Ok(())
}

/// A new pool has a name, a stable id and no containers.
pub fn identity(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let q = f.new_pool(ONE_CONTAINER)?;
    ensure!(!p.name().is_empty(), "the pool has an empty name");
    ensure!(p.id() == p.id(), "the pool id changes");
    ensure!(p.id() != q.id(), "two new pools share the id {}", p.id());
    let listed = p.containers()?;
    ensure!(listed.is_empty(), "a new pool lists containers: {listed:?}");
    Ok(())
}

/// Frames of every codec round-trip through append, sync and read, before and after sealing.
pub fn round_trip_every_codec(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(1)?;
    let mut w = p.writer()?;
    let locs = append_all(&mut *w, &frames)?;
    w.sync()?;
    check_disjoint(&locs)?;
    check_reads(&*p, &frames, &locs)?;
    w.finish()?;
    check_reads(&*p, &frames, &locs)
}

/// Synced frames of an open container are readable and scannable before it is sealed (the
/// catalog commits right after the sync), and the container is listed as unsealed.
pub fn synced_frames_readable_while_open(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(2)?;
    let mut w = p.writer()?;
    let id = w.container();
    let locs = append_all(&mut *w, &frames[..10])?;
    w.sync()?;
    check_reads(&*p, &frames[..10], &locs)?;
    let listed = p.containers()?;
    ensure!(
        listed.iter().any(|c| c.id == id && !c.sealed),
        "the open container {id:016x} is not listed as unsealed: {listed:?}"
    );
    let one = p.container(id)?;
    ensure!(
        listed.iter().any(|c| Some(c) == one.as_ref()),
        "container({id:016x}) gives {one:?}, the listing {listed:?}"
    );
    let (scanned, end) = scan_all(&*p, id)?;
    let scanned: Vec<FrameLocation> = scanned.iter().map(|(loc, _)| *loc).collect();
    ensure!(scanned == locs, "scan of the open container gives {scanned:?}, expected {locs:?}");
    ensure!(end.stop == ScanStop::EndOfFile, "scan of the open container ended with {end:?}");
    let more = append_all(&mut *w, &frames[10..])?;
    w.sync()?;
    check_reads(&*p, &frames[10..], &more)?;
    w.finish()?;
    let listed = p.containers()?;
    ensure!(
        listed.iter().any(|c| c.id == id && c.sealed),
        "the finished container {id:016x} is not listed as sealed: {listed:?}"
    );
    let one = p.container(id)?;
    ensure!(
        listed.iter().any(|c| Some(c) == one.as_ref()),
        "container({id:016x}) gives {one:?}, the listing {listed:?}"
    );
    check_reads(&*p, &frames[..10], &locs)
}

/// Four writers on four threads append to one pool at once, each in containers of its own.
pub fn concurrent_writers(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    type Written = (ContainerId, Vec<FrameLocation>, Vec<Vec<u8>>);
    let p = f.new_pool(ONE_CONTAINER)?;
    let pool: &dyn Pool = &*p;
    let results: Vec<Result<Written, Failure>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || -> Result<Written, Failure> {
                    let mut w = pool.writer()?;
                    let id = w.container();
                    let (mut locs, mut frames) = (Vec::new(), Vec::new());
                    for i in 0..16u64 {
                        let raw = text_data(3_000 + 97 * i as usize, t * 100 + i);
                        let frame = encode(Compression::AUTO, &raw)?;
                        locs.push(w.append(&frame)?);
                        frames.push(frame);
                        if i % 4 == 3 {
                            w.sync()?;
                        }
                    }
                    w.finish()?;
                    Ok((id, locs, frames))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(Failure("a writer thread panicked".into()))))
            .collect()
    });
    let mut ids = HashSet::new();
    for result in results {
        let (id, locs, frames) = result?;
        ensure!(ids.insert(id), "two writers share container {id:016x}");
        ensure!(
            locs.iter().all(|l| l.container == id),
            "writer of container {id:016x} returned locations elsewhere: {locs:?}"
        );
        check_reads(pool, &frames, &locs)?;
    }
    let listed = pool.containers()?;
    ensure!(
        listed.len() == 4 && listed.iter().all(|c| c.sealed && ids.contains(&c.id)),
        "expected the writers' 4 sealed containers, the pool lists {listed:?}"
    );
    Ok(())
}

/// A writer seals its container before a frame would take it past the target size and
/// continues in a new one; a frame larger than the target gets a container of its own.
pub fn rollover_at_target_size(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let target = 16 << 10;
    let p = f.new_pool(target)?;
    let mut w = p.writer()?;
    // 3028-byte RAW frames: five fit in 16 KiB after the header, six do not.
    let mut frames: Vec<Vec<u8>> = (0..30)
        .map(|i| encode(Compression::NONE, &random_data(3_000, i)))
        .collect::<Result<_, _>>()?;
    let mut locs = append_all(&mut *w, &frames)?;
    let big = encode(Compression::NONE, &random_data(20_000, 99))?;
    locs.push(w.append(&big)?);
    frames.push(big);
    let small = encode(Compression::NONE, &random_data(100, 100))?;
    locs.push(w.append(&small)?);
    frames.push(small);
    ensure!(
        locs.last().map(|l| l.container) == Some(w.container()),
        "container() does not name the container of the last frame"
    );
    w.sync()?;
    w.finish()?;
    check_reads(&*p, &frames, &locs)?;
    check_disjoint(&locs)?;
    // Containers appear in runs: a writer never returns to a container it left.
    let mut runs: Vec<(ContainerId, Vec<FrameLocation>)> = Vec::new();
    for loc in &locs {
        match runs.last_mut() {
            Some((id, run)) if *id == loc.container => run.push(*loc),
            _ => {
                ensure!(
                    runs.iter().all(|(id, _)| *id != loc.container),
                    "the writer returned to container {:016x}",
                    loc.container
                );
                runs.push((loc.container, vec![*loc]));
            }
        }
    }
    ensure!(
        runs.len() >= 7,
        "32 frames of 3 to 20 KiB in 16 KiB containers used {} containers",
        runs.len()
    );
    for (id, run) in &runs {
        let end = run.iter().map(|l| l.offset + u64::from(l.len)).max().unwrap_or(0);
        ensure!(
            run.len() == 1 || end <= target,
            "container {id:016x} holds {} frames ending at {end}, past the target {target}",
            run.len()
        );
    }
    let big_run = runs.iter().find(|(_, run)| run.iter().any(|l| l.len > 20_000));
    ensure!(
        big_run.is_some_and(|(_, run)| run.len() == 1),
        "the frame larger than the target shares its container"
    );
    let listed = p.containers()?;
    ensure!(
        listed.len() == runs.len() && listed.iter().all(|c| c.sealed),
        "expected {} sealed containers, the pool lists {listed:?}",
        runs.len()
    );
    Ok(())
}

/// Scanning a container gives the same frames before and after it is sealed.
pub fn scan_sealed_matches_unsealed(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(3)?;
    let mut w = p.writer()?;
    let id = w.container();
    let locs = append_all(&mut *w, &frames)?;
    w.sync()?;
    let (open, open_end) = scan_all(&*p, id)?;
    w.finish()?;
    let (sealed, sealed_end) = scan_all(&*p, id)?;
    ensure!(open == sealed, "scans before and after sealing differ:\n{open:?}\n{sealed:?}");
    let expected: Vec<(FrameLocation, FrameHeader)> = locs
        .iter()
        .zip(&frames)
        .map(|(loc, frame)| FrameHeader::parse(frame).map(|h| (*loc, h)))
        .collect::<Result<_, _>>()?;
    ensure!(sealed == expected, "the scan does not list the appended frames in order");
    ensure!(open_end.stop == ScanStop::EndOfFile, "unsealed scan ended with {open_end:?}");
    ensure!(sealed_end.is_sealed(), "sealed scan ended with {sealed_end:?}");
    ensure!(
        open_end.frames == frames.len() as u64
            && sealed_end.frames == open_end.frames
            && sealed_end.end == open_end.end,
        "scan ends disagree: {open_end:?} and {sealed_end:?}"
    );
    ensure!(
        open_end.trailer_damage.is_none() && sealed_end.trailer_damage.is_none(),
        "trailer damage reported"
    );
    Ok(())
}

/// A deleted container is gone from listings, reads, scans and audits; others remain.
pub fn delete_container(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(4)?;
    let mut w = p.writer()?;
    let gone = w.container();
    let gone_locs = append_all(&mut *w, &frames[..3])?;
    w.finish()?;
    let mut w = p.writer()?;
    let kept = w.container();
    let kept_locs = append_all(&mut *w, &frames[3..6])?;
    w.finish()?;
    // Read before it is deleted, so a pool that keeps containers open for reading has it open.
    check_reads(&*p, &frames[..3], &gone_locs)?;
    p.delete(gone)?;
    let listed: Vec<ContainerId> = p.containers()?.iter().map(|c| c.id).collect();
    ensure!(listed == vec![kept], "after deleting {gone:016x} the pool lists {listed:?}");
    let mut out = Vec::new();
    let not_found = |r: Result<(), PoolError>, what: &str| match r {
        Err(PoolError::NotFound { container, .. }) if container == gone => Ok(()),
        other => Err(Failure(format!("{what} of a deleted container gave {other:?}"))),
    };
    not_found(p.read_frame(&gone_locs[0], None, &mut out).map(|_| ()), "read_frame")?;
    not_found(p.scan(gone, &mut |_, _| Ok(())).map(|_| ()), "scan")?;
    not_found(p.audit(gone).map(|_| ()), "audit")?;
    not_found(p.delete(gone), "delete")?;
    let one = p.container(gone)?;
    ensure!(one.is_none(), "container({gone:016x}) of a deleted container gives {one:?}");
    check_reads(&*p, &frames[3..6], &kept_locs)
}

/// A container that never existed is `NotFound`, with its id in the message.
pub fn missing_container(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let id: ContainerId = 0x0123_4567_89ab_cdef;
    let loc = FrameLocation { container: id, offset: 48, len: 100 };
    let mut out = vec![1, 2, 3];
    let results = [
        ("read_frame", p.read_frame(&loc, Some(7), &mut out).map(|_| ())),
        ("scan", p.scan(id, &mut |_, _| Ok(())).map(|_| ())),
        ("audit", p.audit(id).map(|_| ())),
        ("delete", p.delete(id)),
    ];
    for (what, result) in results {
        match result {
            Err(e @ PoolError::NotFound { .. }) => ensure!(
                e.to_string().contains("0123456789abcdef"),
                "{what}: the message does not name the container: {e}"
            ),
            other => return Err(Failure(format!("{what} of a missing container gave {other:?}"))),
        }
    }
    ensure!(out.is_empty(), "read_frame left bytes in the buffer after an error");
    Ok(())
}

/// An audit of healthy containers, open and sealed, finds every frame and no damage.
pub fn audit_healthy(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(5)?;
    let bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
    let mut w = p.writer()?;
    let id = w.container();
    append_all(&mut *w, &frames)?;
    w.sync()?;
    let open = p.audit(id)?;
    ensure!(
        open.is_clean() && open.frames_ok == frames.len() as u64 && open.bytes_ok == bytes,
        "audit of a healthy open container: {open:?}"
    );
    w.finish()?;
    let sealed = p.audit(id)?;
    ensure!(
        sealed.is_clean()
            && sealed.frames_ok == frames.len() as u64
            && sealed.bytes_ok == bytes
            && sealed.end.is_sealed(),
        "audit of a healthy sealed container: {sealed:?}"
    );
    for (container, report) in audit_pool(&*p)? {
        let report = report?;
        ensure!(report.is_clean(), "audit_pool finds damage in {container:016x}: {report:?}");
    }
    Ok(())
}

/// `append` rejects anything but one complete valid frame, writes nothing for it, and the
/// writer stays usable.
pub fn rejects_invalid_frames(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let good = encode(Compression::AUTO, &text_data(5_000, 6))?;
    let mut flipped = good.clone();
    flipped[10] ^= 1;
    let mut longer = good.clone();
    longer.push(0);
    let bad: [(&str, &[u8]); 5] = [
        ("empty input", &[]),
        (
            "text that is not a frame",
            b"this is not a QSM frame, only some text that is long enough",
        ),
        ("a truncated frame", &good[..good.len() - 1]),
        ("a frame with a byte too many", &longer),
        ("a frame with a damaged header", &flipped),
    ];
    let mut w = p.writer()?;
    for (what, bytes) in bad {
        match w.append(bytes) {
            Err(PoolError::InvalidFrame { .. }) => {}
            other => return Err(Failure(format!("append of {what} gave {other:?}"))),
        }
    }
    let loc = w.append(&good)?;
    w.sync()?;
    ensure!(loc.offset == 48, "rejected frames took space: the first frame is at {}", loc.offset);
    check_reads(&*p, std::slice::from_ref(&good), &[loc])?;
    w.finish()?;
    Ok(())
}

/// A writer that never appends leaves no container behind, whether finished or dropped.
pub fn empty_writer_leaves_nothing(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    p.writer()?.finish()?;
    drop(p.writer()?);
    let listed = p.containers()?;
    ensure!(listed.is_empty(), "writers without frames left containers: {listed:?}");
    Ok(())
}

/// Reclamation: live frames copied by [`copy_frames`] read back the same from their new
/// locations after the old container is deleted.
pub fn copy_frames_moves_live_frames(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(7)?;
    let mut w = p.writer()?;
    let old = w.container();
    let locs = append_all(&mut *w, &frames[..12])?;
    w.finish()?;
    let (live, live_frames): (Vec<FrameLocation>, Vec<Vec<u8>>) =
        locs.iter().zip(&frames).step_by(2).map(|(l, f)| (*l, f.clone())).unzip();
    let mut w = p.writer()?;
    let moved = copy_frames(&*p, &live, &mut *w)?;
    w.finish()?;
    ensure!(moved.len() == live.len(), "{} frames copied to {} locations", live.len(), moved.len());
    ensure!(moved.iter().all(|l| l.container != old), "a copy landed in the old container");
    p.delete(old)?;
    check_reads(&*p, &live_frames, &moved)
}

/// A location that does not hold exactly one frame is `Corrupt` (naming the container and
/// chunk) and returns no bytes, whatever it points at.
pub fn wrong_locations_are_corrupt(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(8)?;
    let mut w = p.writer()?;
    let id = w.container();
    let locs = append_all(&mut *w, &frames[..3])?;
    w.finish()?;
    let (first, last) = (locs[0], locs[2]);
    let at = |offset: u64, len: u32| FrameLocation { container: id, offset, len };
    let wrong = [
        ("one byte short", at(first.offset, first.len - 1)),
        ("one byte too long", at(first.offset, first.len + 1)),
        ("the last frame one byte too long", at(last.offset, last.len + 1)),
        ("one byte into the frame", at(first.offset + 1, first.len)),
        ("at offset 0", at(0, first.len)),
        ("length 0", at(first.offset, 0)),
        ("an impossible length", at(first.offset, u32::MAX)),
        ("far past the end", at(1 << 40, first.len)),
        ("at the largest offset", at(u64::MAX - 10, first.len)),
    ];
    let mut out = Vec::new();
    for (what, loc) in wrong {
        out.extend_from_slice(b"stale");
        match p.read_frame(&loc, Some(42), &mut out) {
            Err(PoolError::Corrupt { container, chunk: Some(42), .. }) if container == id => {}
            other => return Err(Failure(format!("reading {what} ({loc:?}) gave {other:?}"))),
        }
        ensure!(out.is_empty(), "reading {what} left bytes in the buffer");
        out.extend_from_slice(b"stale");
        match p.read_frame_for_decode(&loc, Some(42), &mut out) {
            Err(PoolError::Corrupt { container, chunk: Some(42), .. }) if container == id => {}
            other => {
                return Err(Failure(format!(
                    "read_frame_for_decode of {what} ({loc:?}) gave {other:?}"
                )));
            }
        }
        ensure!(out.is_empty(), "read_frame_for_decode of {what} left bytes in the buffer");
    }
    Ok(())
}

/// `read_frame_for_decode` returns the same bytes as `read_frame` for every valid frame.
pub fn read_for_decode_matches_read(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    let frames = sample_frames(9)?;
    let mut w = p.writer()?;
    let locs = append_all(&mut *w, &frames)?;
    w.finish()?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (loc, frame) in locs.iter().zip(&frames) {
        let ha = p.read_frame(loc, None, &mut a)?;
        let hb = p.read_frame_for_decode(loc, None, &mut b)?;
        ensure!(ha == hb && a == b && &a == frame, "the two reads of {loc:?} differ");
    }
    Ok(())
}

/// A new pool records no catalog; a recorded one reads back as written, a second replaces
/// it, and the record is not listed as a container.
pub fn catalog_record(f: &mut dyn PoolFactory) -> Result<(), Failure> {
    let p = f.new_pool(ONE_CONTAINER)?;
    ensure!(p.catalog()?.is_none(), "a new pool names a catalog: {:?}", p.catalog()?);
    let first =
        CatalogTag { id: "0123456789abcdef".into(), location: "sqlite:/a/catalog.db".into() };
    p.set_catalog(&first)?;
    ensure!(p.catalog()? == Some(first.clone()), "the record reads back as {:?}", p.catalog()?);
    let second = CatalogTag { id: "fedcba9876543210".into(), location: "postgres://h/qsm".into() };
    p.set_catalog(&second)?;
    ensure!(p.catalog()? == Some(second), "the record was not replaced: {:?}", p.catalog()?);
    ensure!(p.containers()?.is_empty(), "the record is listed as a container");
    Ok(())
}
