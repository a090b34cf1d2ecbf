//! Damaged bytes in the store (changed in the file s3s-fs keeps each object in) are found:
//! `read_frame` refuses them as `Corrupt`, audits list them, listings and scans say what
//! they found. Nothing panics, whatever an object holds.

mod common;

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};

use common::{BUCKET, Env, TestResult, frames};
use qsm_pool::{FrameLocation, Pool, PoolError, ScanStop, audit_pool};
use qsm_pool_s3::S3Pool;

/// XORs the byte at `offset` of the file holding `key` with 0x40.
fn flip(env: &Env, key: &str, offset: u64) -> TestResult {
    let path = env.server.object_file(BUCKET, key);
    let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
    let mut b = [0u8; 1];
    file.seek(SeekFrom::Start(offset))?;
    std::io::Read::read_exact(&mut file, &mut b)?;
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(&[b[0] ^ 0x40])?;
    Ok(())
}

fn write(pool: &S3Pool, frames: &[Vec<u8>], finish: bool) -> Result<Vec<FrameLocation>, PoolError> {
    let mut w = pool.writer()?;
    let locs = frames.iter().map(|f| w.append(f)).collect::<Result<Vec<_>, _>>()?;
    w.sync()?;
    if finish {
        w.finish()?;
    }
    Ok(locs)
}

#[test]
fn damaged_payload_is_corrupt_and_audited() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", None)?;
    let frames = frames(4, 2_000);
    for finish in [true, false] {
        let locs = write(&pool, &frames, finish)?;
        let id = locs[0].container;
        let key = pool.container_key(id);
        // A payload byte of the third frame.
        flip(&env, &key, locs[2].offset + 100)?;
        let mut out = b"stale".to_vec();
        match pool.read_frame(&locs[2], Some(77), &mut out) {
            Err(e @ PoolError::Corrupt { container, offset, chunk: Some(77), .. })
                if container == id && offset == locs[2].offset =>
            {
                let text = e.to_string();
                assert!(
                    text.contains(&format!("{id:016x}")) && text.contains("chunk 77"),
                    "{text}"
                );
            }
            other => panic!("read of a damaged frame (sealed: {finish}) gave {other:?}"),
        }
        assert!(out.is_empty(), "damaged bytes returned");
        // Its neighbours are intact.
        for i in [0, 1, 3] {
            pool.read_frame(&locs[i], None, &mut out)?;
            assert_eq!(out, frames[i]);
        }
        let report = pool.audit(id)?;
        assert_eq!(report.frames_ok, 3, "{report:?}");
        assert_eq!(report.damaged.len(), 1, "{report:?}");
        assert_eq!(report.damaged[0].offset, locs[2].offset);
        assert_eq!(report.end.is_sealed(), finish, "{report:?}");
    }
    let audits = audit_pool(&pool)?;
    assert_eq!(audits.len(), 2);
    for (_, report) in audits {
        assert_eq!(report?.damaged.len(), 1);
    }
    Ok(())
}

#[test]
fn damaged_header_trailer_and_strangers() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", None)?;
    let frames = frames(3, 500);

    // A damaged trailer: listed as unsealed, scanned forward, reported by the audit.
    let locs = write(&pool, &frames, true)?;
    let sealed = locs[0].container;
    let key = pool.container_key(sealed);
    let size = std::fs::metadata(env.server.object_file(BUCKET, &key))?.len();
    flip(&env, &key, size - 20)?;
    let listed = pool.containers()?;
    assert!(listed.iter().any(|c| c.id == sealed && !c.sealed), "{listed:?}");
    let mut n = 0;
    let end = pool.scan(sealed, &mut |_, _| {
        n += 1;
        Ok(())
    })?;
    assert_eq!(n, 3);
    assert!(end.trailer_damage.is_some() && !end.is_sealed(), "{end:?}");
    let report = pool.audit(sealed)?;
    assert_eq!(report.frames_ok, 3);
    assert!(!report.is_clean(), "{report:?}");

    // A damaged container header: every read of it is Corrupt.
    let locs = write(&pool, &frames, true)?;
    let id = locs[0].container;
    flip(&env, &pool.container_key(id), 30)?;
    let mut out = Vec::new();
    let e = pool.read_frame(&locs[0], Some(1), &mut out);
    assert!(matches!(e, Err(PoolError::Corrupt { .. })), "{e:?}");
    assert!(matches!(pool.scan(id, &mut |_, _| Ok(())), Err(PoolError::Corrupt { .. })));
    assert!(matches!(pool.audit(id), Err(PoolError::Corrupt { .. })));

    // Objects that are not containers: a foreign name is ignored, an object with a container
    // name is listed and refused when read; a truncated one stops its scan.
    let dir = env.server.object_file(BUCKET, "p/containers");
    std::fs::write(dir.join("README"), b"not a container")?;
    std::fs::write(dir.join("00000000000000aa"), b"garbage that is no container at all")?;
    std::fs::write(dir.join("00000000000000bb"), b"QSM")?;
    let ids: Vec<u64> = pool.containers()?.iter().map(|c| c.id).collect();
    assert!(ids.contains(&0xaa) && ids.contains(&0xbb) && ids.len() == 4, "{ids:x?}");
    let at = |container| FrameLocation { container, offset: 48, len: 100 };
    assert!(matches!(pool.read_frame(&at(0xaa), None, &mut out), Err(PoolError::Corrupt { .. })));
    assert!(matches!(pool.read_frame(&at(0xbb), None, &mut out), Err(PoolError::Corrupt { .. })));
    let end = pool.scan(0xbb, &mut |_, _| Ok(()))?;
    assert!(matches!(end.stop, ScanStop::Stopped { .. }) && end.frames == 0, "{end:?}");

    // A container of another pool, copied here.
    let other = S3Pool::create(&env.config("other"), "OTHER", None)?;
    let theirs = write(&other, &frames, true)?;
    let copied = pool.container_key(theirs[0].container);
    std::fs::copy(
        env.server.object_file(BUCKET, &other.container_key(theirs[0].container)),
        env.server.object_file(BUCKET, &copied),
    )?;
    let e = pool.read_frame(&theirs[0], None, &mut out);
    assert!(matches!(e, Err(PoolError::WrongPool { .. })), "{e:?}");
    Ok(())
}
