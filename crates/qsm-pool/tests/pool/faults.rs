//! Fault injection against `DirPool`: damaged, truncated, foreign and missing files, a
//! directory that is not a pool, a full file system and a read-only one. Every fault must
//! give a clear error naming the object (or a report), never a panic, and must not make
//! frames synced before it unreadable.

use std::path::{Path, PathBuf};
use std::process::Command;

use qsm_codec::Compression;
use qsm_pool::conformance::{encode, random_data, scan_all};
use qsm_pool::{DirPool, DirPoolOptions, FrameLocation, Pool, PoolError, ScanStop};

use crate::common::{TestResult, flip, new_pool, text_frames, truncate, write_container};

fn read_ok(pool: &DirPool, frames: &[Vec<u8>], locs: &[FrameLocation]) -> TestResult {
    let mut out = Vec::new();
    for (frame, loc) in frames.iter().zip(locs) {
        pool.read_frame(loc, None, &mut out)?;
        assert!(out == *frame, "frame at {loc:?} reads back different bytes");
    }
    Ok(())
}

fn expect_corrupt(
    result: Result<impl std::fmt::Debug, PoolError>,
    container: u64,
    offset: u64,
    needle: &str,
) {
    match result {
        Err(e @ PoolError::Corrupt { .. }) => {
            let PoolError::Corrupt { container: c, offset: o, .. } = &e else { unreachable!() };
            assert_eq!((*c, *o), (container, offset), "wrong place in {e}");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{container:016x}")), "no container id in: {msg}");
            assert!(msg.contains(needle), "{needle:?} not in: {msg}");
        }
        other => panic!("expected Corrupt at {container:016x}+{offset}, got {other:?}"),
    }
}

#[test]
fn corrupt_payloads_are_reported_and_audit_goes_on() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(6, 1)?;
    for seal in [true, false] {
        let (id, locs) = write_container(&pool, &frames, seal)?;
        let path = pool.container_path(id);
        for i in [1, 4] {
            flip(&path, locs[i].offset + u64::from(locs[i].len) / 2, 0x40)?;
        }
        let mut out = Vec::new();
        let result = pool.read_frame(&locs[1], Some(77), &mut out);
        expect_corrupt(result, id, locs[1].offset, "(chunk 77)");
        assert!(out.is_empty(), "damaged bytes were returned");
        read_ok(&pool, &frames[2..4], &locs[2..4])?;
        let report = pool.audit(id)?;
        let damaged: Vec<u64> = report.damaged.iter().map(|d| d.offset).collect();
        assert_eq!(damaged, vec![locs[1].offset, locs[4].offset], "sealed {seal}: {report:?}");
        assert_eq!(report.frames_ok, 4, "sealed {seal}: {report:?}");
        assert_eq!(report.end.is_sealed(), seal);
    }
    Ok(())
}

#[test]
fn damaged_frame_header_in_an_unsealed_container_stops_the_scan_not_the_audit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(5, 2)?;
    let (id, locs) = write_container(&pool, &frames, false)?;
    flip(&pool.container_path(id), locs[2].offset + 9, 0x01)?;
    let (scanned, end) = scan_all(&pool, id)?;
    assert_eq!(scanned.len(), 2);
    assert_eq!(end.end, locs[2].offset);
    assert!(
        matches!(&end.stop, ScanStop::Stopped { detail } if detail.contains("invalid frame header")),
        "{end:?}"
    );
    let report = pool.audit(id)?;
    assert_eq!(report.frames_ok, 4, "the audit did not resume after the damage: {report:?}");
    assert_eq!(report.damaged.len(), 1);
    // The damage spans the bad frame: the audit resumed at the next one.
    let span = (report.damaged[0].offset, report.damaged[0].len);
    assert_eq!(span, (locs[2].offset, u64::from(locs[2].len)));
    expect_corrupt(pool.read_frame(&locs[2], None, &mut Vec::new()), id, locs[2].offset, "header");
    read_ok(&pool, &frames[3..], &locs[3..])
}

#[test]
fn damaged_frame_header_in_a_sealed_container_is_found_by_the_audit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(5, 3)?;
    let (id, locs) = write_container(&pool, &frames, true)?;
    flip(&pool.container_path(id), locs[2].offset + 17, 0x80)?;
    // The index is intact, so the scan still lists every frame.
    let (scanned, end) = scan_all(&pool, id)?;
    assert_eq!((scanned.len(), end.is_sealed()), (5, true));
    let report = pool.audit(id)?;
    assert_eq!(report.damaged.len(), 1, "{report:?}");
    assert_eq!(report.damaged[0].offset, locs[2].offset);
    assert_eq!(report.frames_ok, 4);
    Ok(())
}

#[test]
fn truncated_containers_give_their_valid_prefix() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(5, 4)?;
    for seal in [true, false] {
        for (cut, what) in [(10, "incomplete frame header"), (40, "incomplete frame")] {
            let (id, locs) = write_container(&pool, &frames, seal)?;
            // Read once whole first: the pool keeps the container open, and must still see
            // the cut.
            read_ok(&pool, &frames, &locs)?;
            let path = pool.container_path(id);
            truncate(&path, locs[3].offset + cut)?;
            let (scanned, end) = scan_all(&pool, id)?;
            let scanned: Vec<FrameLocation> = scanned.iter().map(|(l, _)| *l).collect();
            assert_eq!(scanned, locs[..3].to_vec(), "sealed {seal}, cut {cut}");
            assert_eq!((end.frames, end.end, end.size), (3, locs[3].offset, locs[3].offset + cut));
            assert!(
                matches!(&end.stop, ScanStop::Stopped { detail } if detail.contains(what)),
                "sealed {seal}, cut {cut}: {end:?}"
            );
            read_ok(&pool, &frames[..3], &locs[..3])?;
            expect_corrupt(
                pool.read_frame(&locs[3], Some(3), &mut Vec::new()),
                id,
                locs[3].offset,
                "runs past the end",
            );
            // A crashed writer's tail is not damage: nothing references it.
            let report = pool.audit(id)?;
            assert!(report.is_clean() && report.frames_ok == 3, "{report:?}");
            let listed = pool.containers()?;
            assert!(listed.iter().any(|c| c.id == id && !c.sealed));
        }
    }
    Ok(())
}

#[test]
fn a_cut_in_the_trailer_falls_back_to_a_forward_scan() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(4, 5)?;
    let (id, locs) = write_container(&pool, &frames, true)?;
    let path = pool.container_path(id);
    let size = std::fs::metadata(&path)?.len();
    truncate(&path, size - 10)?;
    let (scanned, end) = scan_all(&pool, id)?;
    assert_eq!(scanned.len(), 4);
    assert_eq!(end.trailer_damage, None);
    assert!(
        matches!(&end.stop, ScanStop::Stopped { detail } if detail.contains("index block")),
        "{end:?}"
    );
    let report = pool.audit(id)?;
    assert!(report.is_clean() && report.frames_ok == 4, "{report:?}");
    read_ok(&pool, &frames, &locs)
}

#[test]
fn damaged_index_or_trailer_is_reported_and_scanned_around() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(4, 6)?;
    let index_at = |locs: &[FrameLocation]| locs.last().map_or(48, |l| l.offset + u64::from(l.len));
    // A byte of an index entry, the trailer's frame count, its index offset, its check.
    for (what, at) in
        [("index entry", 20i64), ("count", -40), ("index offset", -32), ("check", -16)]
    {
        let (id, locs) = write_container(&pool, &frames, true)?;
        let path = pool.container_path(id);
        let size = std::fs::metadata(&path)?.len();
        let offset = if at >= 0 { index_at(&locs) + at as u64 } else { size - at.unsigned_abs() };
        flip(&path, offset, 0x04)?;
        let (scanned, end) = scan_all(&pool, id)?;
        assert_eq!(scanned.len(), 4, "{what}");
        assert!(end.trailer_damage.is_some(), "{what}: {end:?}");
        let report = pool.audit(id)?;
        assert_eq!(report.frames_ok, 4, "{what}: {report:?}");
        assert_eq!(report.damaged.len(), 1, "{what}: {report:?}");
        assert!(report.damaged[0].detail.contains("trailer or index damaged"), "{what}");
        read_ok(&pool, &frames, &locs)?;
    }
    Ok(())
}

#[test]
fn a_crashed_writers_tail_is_skipped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(4, 7)?;
    let (id, locs) = write_container(&pool, &frames, false)?;
    // What a crash mid-append leaves: part of a frame after the synced ones.
    let partial = encode(Compression::NONE, &random_data(10_000, 1))?;
    let path = pool.container_path(id);
    let mut bytes = std::fs::read(&path)?;
    bytes.extend_from_slice(&partial[..5_000]);
    std::fs::write(&path, bytes)?;
    let (scanned, end) = scan_all(&pool, id)?;
    assert_eq!(scanned.len(), 4);
    assert!(matches!(end.stop, ScanStop::Stopped { .. }), "{end:?}");
    let report = pool.audit(id)?;
    assert!(report.is_clean(), "{report:?}");
    read_ok(&pool, &frames, &locs)
}

#[test]
fn missing_container_file_is_not_found() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(2, 8)?;
    let (id, locs) = write_container(&pool, &frames, true)?;
    // Read first, so the pool keeps the container open: a kept handle must not outlive the
    // file's name, whether the file is replaced by a (here damaged) copy or removed.
    read_ok(&pool, &frames, &locs)?;
    let path = pool.container_path(id);
    let copy = path.with_extension("copy");
    std::fs::copy(&path, &copy)?;
    flip(&copy, locs[0].offset + u64::from(locs[0].len) - 1, 0x40)?;
    std::fs::rename(&copy, &path)?;
    expect_corrupt(pool.read_frame(&locs[0], Some(5), &mut Vec::new()), id, locs[0].offset, "");
    read_ok(&pool, &frames[1..], &locs[1..])?;
    std::fs::remove_file(&path)?;
    match pool.read_frame(&locs[1], Some(5), &mut Vec::new()) {
        Err(e @ PoolError::NotFound { .. }) => {
            assert!(e.to_string().contains(&format!("{id:016x}")), "{e}");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    Ok(())
}

fn plant(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, bytes)
}

#[test]
fn files_that_are_not_containers_are_refused_clearly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let id = 0xabcd_0000_0000_0001;
    let path = pool.container_path(id);
    let loc = FrameLocation { container: id, offset: 48, len: 100 };
    for (bytes, needle) in [
        (
            b"an ordinary text file, long enough to hold a container header, but not one".to_vec(),
            "not a QSM container",
        ),
        (b"short".to_vec(), "not a QSM container"),
        (vec![0u8; 4096], "not a QSM container"),
    ] {
        plant(&path, &bytes)?;
        expect_corrupt(scan_all(&pool, id), id, 0, needle);
        expect_corrupt(pool.audit(id), id, 0, needle);
        expect_corrupt(pool.read_frame(&loc, None, &mut Vec::new()), id, 0, needle);
    }
    // A future container version is named.
    let frames = text_frames(2, 9)?;
    let (id2, _) = write_container(&pool, &frames, true)?;
    flip(&pool.container_path(id2), 4, 0x03)?;
    expect_corrupt(scan_all(&pool, id2), id2, 4, "container format version 2 is not supported");
    // A container copied under another id.
    let (id3, locs3) = write_container(&pool, &frames, true)?;
    let copy = pool.container_path(0x1111_2222_3333_4444);
    plant(&copy, &std::fs::read(pool.container_path(id3))?)?;
    let moved = FrameLocation { container: 0x1111_2222_3333_4444, ..locs3[0] };
    expect_corrupt(
        pool.read_frame(&moved, None, &mut Vec::new()),
        moved.container,
        24,
        "renamed or copied",
    );
    // Empty, or the start of a header only: a writer stopped right after creating the file.
    for bytes in [&b""[..], &b"QSMC\x01\x00"[..]] {
        plant(&path, bytes)?;
        let (scanned, end) = scan_all(&pool, id)?;
        assert!(scanned.is_empty() && matches!(end.stop, ScanStop::Stopped { .. }), "{end:?}");
        assert!(pool.audit(id)?.is_clean());
    }
    // Listing shows them all, unsealed where they are; nothing panics.
    let listed = pool.containers()?;
    assert!(listed.iter().any(|c| c.id == id && !c.sealed));
    Ok(())
}

#[test]
fn containers_of_another_pool_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ours = DirPool::create(dir.path().join("ours"), "ours", &DirPoolOptions::default())?;
    let theirs = DirPool::create(dir.path().join("theirs"), "theirs", &DirPoolOptions::default())?;
    let frames = text_frames(3, 10)?;
    let (id, locs) = write_container(&theirs, &frames, true)?;
    plant(&ours.container_path(id), &std::fs::read(theirs.container_path(id))?)?;
    for result in [
        scan_all(&ours, id).map(|_| ()),
        ours.audit(id).map(|_| ()),
        ours.read_frame(&locs[0], None, &mut Vec::new()).map(|_| ()),
    ] {
        match result {
            Err(e @ PoolError::WrongPool { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&theirs.id().to_string()), "{msg}");
                assert!(msg.contains(&ours.id().to_string()), "{msg}");
                assert!(msg.contains(&format!("{id:016x}")), "{msg}");
            }
            other => panic!("expected WrongPool, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn directories_that_are_not_pools_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let expect_not_a_pool = |path: &Path, needle: &str| match DirPool::open(path) {
        Err(e @ PoolError::NotAPool { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(needle), "{needle:?} not in: {msg}");
            assert!(msg.contains(&path.display().to_string()), "path not in: {msg}");
        }
        other => panic!("{}: expected NotAPool, got {other:?}", path.display()),
    };
    expect_not_a_pool(&dir.path().join("absent"), "does not exist");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x")?;
    expect_not_a_pool(&file, "not a directory");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty)?;
    expect_not_a_pool(&empty, "no POOL descriptor");
    let garbage = dir.path().join("garbage");
    std::fs::create_dir(&garbage)?;
    std::fs::write(garbage.join("POOL"), vec![b'z'; 100_000])?;
    expect_not_a_pool(&garbage, "not a pool descriptor");

    let pool = DirPool::create(dir.path().join("pool"), "main", &DirPoolOptions::default())?;
    let descriptor = pool.root().join("POOL");
    let original = std::fs::read(&descriptor)?;
    flip(&descriptor, 30, 0x01)?;
    expect_not_a_pool(pool.root(), "damaged");
    std::fs::write(&descriptor, &original)?;
    flip(&descriptor, 4, 0x02)?;
    expect_not_a_pool(pool.root(), "version 3 is not supported");
    std::fs::write(&descriptor, &original)?;
    std::fs::remove_dir(pool.root().join("containers"))?;
    expect_not_a_pool(pool.root(), "containers directory is missing");
    Ok(())
}

#[test]
fn pools_are_created_and_reopened() -> TestResult {
    let dir = tempfile::tempdir()?;
    let options = DirPoolOptions { target_size: Some(1 << 20), ..DirPoolOptions::default() };
    let pool = DirPool::create(dir.path().join("p"), "BACKUPPOOL", &options)?;
    let reopened = DirPool::open(pool.root())?;
    assert_eq!(
        (reopened.id(), reopened.name(), reopened.target_size()),
        (pool.id(), "BACKUPPOOL", 1 << 20)
    );
    let override_ = DirPoolOptions { target_size: Some(1 << 16), ..DirPoolOptions::default() };
    assert_eq!(DirPool::open_with(pool.root(), &override_)?.target_size(), 1 << 16);
    for (path, name, target) in [
        (pool.root().to_path_buf(), "again", None),
        (dir.path().join("q"), "", None),
        (dir.path().join("q"), "bad\nname", None),
        (dir.path().join("q"), "ok", Some(100)),
    ] {
        let options = DirPoolOptions { target_size: target, ..DirPoolOptions::default() };
        match DirPool::create(&path, name, &options) {
            Err(PoolError::Invalid(msg)) => assert!(!msg.is_empty()),
            other => panic!("create({}, {name:?}, {target:?}) gave {other:?}", path.display()),
        }
    }
    // Containers fan out by the first two hex digits of their id.
    let frames = text_frames(1, 11)?;
    let (id, _) = write_container(&pool, &frames, true)?;
    let hex = format!("{id:016x}");
    let expected: PathBuf =
        pool.root().join("containers").join(&hex[..2]).join(format!("{hex}.qsmc"));
    assert_eq!(pool.container_path(id), expected);
    assert!(expected.is_file());
    Ok(())
}

#[test]
fn an_open_container_cannot_be_deleted() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = new_pool(dir.path(), None)?;
    let frames = text_frames(1, 12)?;
    let mut w = pool.writer()?;
    w.append(&frames[0])?;
    w.sync()?;
    assert!(matches!(pool.delete(w.container()), Err(PoolError::Busy { .. })));
    let id = w.container();
    w.finish()?;
    pool.delete(id)?;
    Ok(())
}

/// A tmpfs mounted on a temporary directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size`, or explains why it cannot and returns `None` (not root, no
    /// `mount`). With `QSM_TEST_REQUIRE_MOUNT` set, not being able to mount is a failure.
    fn mount(size: &str) -> Result<Option<Tmpfs>, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let result = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        let why = match result {
            Ok(out) if out.status.success() => return Ok(Some(Tmpfs { dir })),
            Ok(out) => format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => format!("cannot run mount: {e}"),
        };
        if std::env::var_os("QSM_TEST_REQUIRE_MOUNT").is_some() {
            return Err(format!("mounting a tmpfs failed ({why})").into());
        }
        eprintln!("SKIPPED: this test mounts a tmpfs, which needs root: {why}");
        Ok(None)
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount_read_only(&self) -> Result<(), Box<dyn std::error::Error>> {
        let status = Command::new("mount").args(["-o", "remount,ro"]).arg(self.path()).status()?;
        if !status.success() {
            return Err(
                format!("remounting {} read-only failed: {status}", self.path().display()).into()
            );
        }
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(self.dir.path()).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            // Busy: detach it now, the kernel frees it when the last file closes.
            let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
    }
}

#[test]
fn a_full_file_system_is_reported_and_synced_frames_survive() -> TestResult {
    let Some(fs) = Tmpfs::mount("512k")? else { return Ok(()) };
    let pool = new_pool(fs.path(), None)?;
    let mut w = pool.writer()?;
    let (mut synced, mut pending) = (Vec::new(), Vec::new());
    let mut i = 0;
    let error = loop {
        assert!(i < 1_000, "a 512 KiB file system never filled up");
        let frame = encode(Compression::NONE, &random_data(20_000, i))?;
        match w.append(&frame) {
            Ok(loc) => pending.push((loc, frame)),
            Err(e) => break e,
        }
        if i % 3 == 2 {
            match w.sync() {
                Ok(()) => synced.append(&mut pending),
                Err(e) => break e,
            }
        }
        i += 1;
    };
    assert!(matches!(error, PoolError::Full { .. }), "expected Full, got {error:?}");
    assert!(error.to_string().contains("no space left"), "{error}");
    // The writer refuses further work.
    let frame = encode(Compression::NONE, &random_data(100, 1))?;
    assert!(matches!(w.append(&frame), Err(PoolError::WriterFailed { .. })));
    assert!(matches!(w.sync(), Err(PoolError::WriterFailed { .. })));
    assert!(matches!(w.finish(), Err(PoolError::WriterFailed { .. })));
    assert!(synced.len() >= 10, "only {} frames were synced", synced.len());
    // Every frame synced before the error reads back, also through a new handle.
    let reopened = DirPool::open(pool.root())?;
    let mut out = Vec::new();
    for (loc, frame) in &synced {
        reopened.read_frame(loc, None, &mut out)?;
        assert!(out == *frame, "synced frame at {loc:?} lost");
    }
    let id = synced[0].0.container;
    let (scanned, _) = scan_all(&reopened, id)?;
    assert!(scanned.len() >= synced.len());
    assert!(reopened.audit(id)?.is_clean());
    Ok(())
}

#[test]
fn a_read_only_pool_refuses_writers_and_still_reads() -> TestResult {
    let Some(fs) = Tmpfs::mount("2m")? else { return Ok(()) };
    let pool = new_pool(fs.path(), None)?;
    let frames = text_frames(4, 13)?;
    let (sealed, sealed_locs) = write_container(&pool, &frames, true)?;
    let (open, open_locs) = write_container(&pool, &frames, false)?;
    fs.remount_read_only()?;
    match pool.writer() {
        Err(e @ PoolError::ReadOnly { .. }) => {
            assert!(e.to_string().contains("read-only"), "{e}");
        }
        other => panic!("expected ReadOnly, got {other:?}"),
    }
    assert!(matches!(pool.delete(sealed), Err(PoolError::ReadOnly { .. })));
    match DirPool::create(fs.path().join("another"), "x", &DirPoolOptions::default()) {
        Err(PoolError::ReadOnly { .. }) => {}
        other => panic!("expected ReadOnly, got {other:?}"),
    }
    let pool = DirPool::open(pool.root())?;
    read_ok(&pool, &frames, &sealed_locs)?;
    read_ok(&pool, &frames, &open_locs)?;
    assert_eq!(pool.containers()?.len(), 2);
    for id in [sealed, open] {
        assert_eq!(scan_all(&pool, id)?.0.len(), 4);
        assert!(pool.audit(id)?.is_clean());
    }
    Ok(())
}
