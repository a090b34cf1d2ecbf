//! Property test: random frame sequences, written with random target sizes and sync points,
//! read back identically through scan and read_frame.

use std::collections::BTreeMap;

use proptest::prelude::*;
use qsm_codec::{Compression, FrameHeader, registry};
use qsm_pool::conformance::{encode, random_data, scan_all, text_data};
use qsm_pool::{ContainerId, DirPool, DirPoolOptions, FrameLocation, Pool, ScanStop};

/// One frame to write: the kind of data, its length, and which codec setting.
type Spec = (u8, usize, usize);

fn run_case(specs: &[Spec], target: u64, sync_every: usize, seal: bool) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let dir = tempfile::tempdir().map_err(|e| err(&e))?;
    // fsync off: this checks layout and bookkeeping, not durability, and must stay fast.
    let options = DirPoolOptions { target_size: Some(target), fsync: false };
    let pool = DirPool::create(dir.path().join("pool"), "prop", &options).map_err(|e| err(&e))?;
    let mut settings: Vec<Compression> =
        registry::all().iter().map(|c| Compression::new(*c)).collect();
    settings.push(Compression::AUTO);

    let mut w = pool.writer().map_err(|e| err(&e))?;
    let mut written: Vec<(FrameLocation, Vec<u8>)> = Vec::new();
    for (i, &(kind, len, codec)) in specs.iter().enumerate() {
        let seed = i as u64;
        let raw = match kind {
            0 => text_data(len, seed),
            1 => random_data(len, seed),
            _ => vec![kind; len],
        };
        let frame = encode(settings[codec % settings.len()], &raw).map_err(|e| err(&e))?;
        let loc = w.append(&frame).map_err(|e| err(&e))?;
        written.push((loc, frame));
        if (i + 1) % sync_every == 0 {
            w.sync().map_err(|e| err(&e))?;
        }
    }
    w.sync().map_err(|e| err(&e))?;
    let last = w.container();
    if seal {
        w.finish().map_err(|e| err(&e))?;
    } else {
        // Earlier containers were sealed by rollover; the last stays unsealed.
        drop(w);
    }

    let mut by_container: BTreeMap<ContainerId, Vec<(FrameLocation, &[u8])>> = BTreeMap::new();
    for (loc, frame) in &written {
        by_container.entry(loc.container).or_default().push((*loc, frame));
    }
    let listed: Vec<ContainerId> =
        pool.containers().map_err(|e| err(&e))?.iter().map(|c| c.id).collect();
    let expected: Vec<ContainerId> = by_container.keys().copied().collect();
    if listed != expected {
        return Err(format!("pool lists {listed:?}, frames went to {expected:?}"));
    }
    let mut out = Vec::new();
    for (id, frames) in &by_container {
        let (scanned, end) = scan_all(&pool, *id).map_err(|e| err(&e))?;
        let want: Vec<(FrameLocation, FrameHeader)> = frames
            .iter()
            .map(|(loc, f)| FrameHeader::parse(f).map(|h| (*loc, h)))
            .collect::<Result<_, _>>()
            .map_err(|e| err(&e))?;
        if scanned != want {
            return Err(format!("container {id:016x}: scan differs from what was written"));
        }
        let want_stop = if *id == last && !seal { ScanStop::EndOfFile } else { ScanStop::Sealed };
        if end.stop != want_stop {
            return Err(format!("container {id:016x}: scan ended with {end:?}"));
        }
        let frames_end = frames.iter().map(|(l, _)| l.offset + u64::from(l.len)).max();
        if frames.len() > 1 && frames_end.is_some_and(|e| e > target) {
            return Err(format!("container {id:016x} grew past the target {target}"));
        }
        for (loc, frame) in frames {
            pool.read_frame(loc, None, &mut out).map_err(|e| err(&e))?;
            if out != *frame {
                return Err(format!("frame at {loc:?} reads back different bytes"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn frames_round_trip_through_containers(
        specs in prop::collection::vec((0u8..4, 0usize..6_000, 0usize..7), 1..40),
        target in 4_096u64..65_536,
        sync_every in 1usize..8,
        seal in any::<bool>(),
    ) {
        prop_assert_eq!(run_case(&specs, target, sync_every, seal), Ok(()));
    }
}
