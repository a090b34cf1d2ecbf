//! How the S3 writer maps the durability contract onto whole-object uploads: unsealed uploads
//! at sync, sealing at `sync_seal_size`, multipart uploads of large containers, what a
//! dropped writer leaves, and reopening.

mod common;

use common::{BUCKET, Env, TestResult, frames};
use qsm_pool::{FrameLocation, Pool, PoolError, PoolWriter, ScanStop};
use qsm_pool_s3::{MULTIPART_THRESHOLD, S3Pool, S3PoolConfig};

fn append_all(w: &mut dyn PoolWriter, frames: &[Vec<u8>]) -> Result<Vec<FrameLocation>, PoolError> {
    frames.iter().map(|f| w.append(f)).collect()
}

fn check_reads(pool: &S3Pool, frames: &[Vec<u8>], locs: &[FrameLocation]) -> TestResult {
    let mut out = Vec::new();
    for (frame, loc) in frames.iter().zip(locs) {
        pool.read_frame(loc, None, &mut out)?;
        assert!(out == *frame, "{loc:?} reads back different bytes");
    }
    Ok(())
}

fn stored_size(env: &Env, pool: &S3Pool, id: u64) -> std::io::Result<u64> {
    Ok(std::fs::metadata(env.server.object_file(BUCKET, &pool.container_key(id)))?.len())
}

#[test]
fn sync_uploads_unsealed_then_seals_at_the_sync_seal_size() -> TestResult {
    let env = Env::start()?;
    let config = S3PoolConfig { sync_seal_size: 64 << 10, ..env.config("p") };
    let pool = S3Pool::create(&config, "P", None)?;
    let frames = frames(8, 10_000);
    let mut w = pool.writer()?;
    let first = w.container();
    // Nothing is uploaded before a frame is synced.
    assert!(pool.containers()?.is_empty());
    let a = append_all(&mut *w, &frames[..2])?;
    assert!(pool.containers()?.is_empty(), "appended frames uploaded before sync");
    w.sync()?;
    let listed = pool.containers()?;
    assert!(listed.len() == 1 && listed[0].id == first && !listed[0].sealed, "{listed:?}");
    assert_eq!(listed[0].size, a[1].offset + u64::from(a[1].len));
    check_reads(&pool, &frames[..2], &a)?;
    // Below 64 KiB: uploaded again, unsealed, in the same container.
    let b = append_all(&mut *w, &frames[2..4])?;
    w.sync()?;
    assert!(b.iter().all(|l| l.container == first));
    let listed = pool.containers()?;
    assert!(listed.len() == 1 && !listed[0].sealed, "{listed:?}");
    // Past 64 KiB at a sync: sealed, and the next frame starts a new container.
    let c = append_all(&mut *w, &frames[4..7])?;
    w.sync()?;
    assert!(c.iter().all(|l| l.container == first));
    let listed = pool.containers()?;
    assert!(listed.len() == 1 && listed[0].sealed, "{listed:?}");
    let d = w.append(&frames[7])?;
    assert!(d.container != first && w.container() == d.container);
    w.sync()?;
    w.finish()?;
    let listed = pool.containers()?;
    assert!(listed.len() == 2 && listed.iter().all(|c| c.sealed), "{listed:?}");
    let all: Vec<FrameLocation> = [a, b, c, vec![d]].concat();
    check_reads(&pool, &frames, &all)?;
    // A sync with nothing new uploads nothing and changes nothing.
    let mut w = pool.writer()?;
    w.sync()?;
    w.finish()?;
    assert_eq!(pool.containers()?.len(), 2);
    Ok(())
}

#[test]
fn large_containers_go_up_in_parts() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", Some(32 << 20))?;
    let frames = frames(12, 1 << 20);
    // Sealed at its first upload (put-if-absent of the header, then a multipart upload),
    // and after an unsealed upload (a multipart upload replacing it).
    for sync_first in [false, true] {
        let mut w = pool.writer()?;
        let mut locs = append_all(&mut *w, &frames[..1])?;
        if sync_first {
            w.sync()?;
        }
        locs.extend(append_all(&mut *w, &frames[1..])?);
        w.finish()?;
        let id = locs[0].container;
        assert!(locs.iter().all(|l| l.container == id));
        let size = stored_size(&env, &pool, id)?;
        assert!(size > MULTIPART_THRESHOLD as u64, "{size}");
        check_reads(&pool, &frames, &locs)?;
        let report = pool.audit(id)?;
        assert!(
            report.is_clean() && report.end.is_sealed() && report.frames_ok == 12,
            "{report:?}"
        );
    }
    Ok(())
}

#[test]
fn a_dropped_writer_leaves_its_synced_frames_unsealed() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", Some(1 << 20))?;
    let frames = frames(5, 3_000);
    let mut w = pool.writer()?;
    let id = w.container();
    let synced = append_all(&mut *w, &frames[..3])?;
    w.sync()?;
    append_all(&mut *w, &frames[3..])?;
    // An open container cannot be deleted by this process.
    assert!(matches!(pool.delete(id), Err(PoolError::Busy { .. })));
    drop(w);
    let listed = pool.containers()?;
    assert!(listed.len() == 1 && !listed[0].sealed, "{listed:?}");
    check_reads(&pool, &frames[..3], &synced)?;
    let mut seen = Vec::new();
    let end = pool.scan(id, &mut |loc, _| {
        seen.push(loc);
        Ok(())
    })?;
    assert_eq!(seen, synced);
    assert_eq!(end.stop, ScanStop::EndOfFile);
    assert!(pool.audit(id)?.is_clean());
    // Reopened, by a "restarted server": the same pool, and the container can go now.
    let reopened = S3Pool::open(&env.config("p"))?;
    assert_eq!((reopened.id(), reopened.name(), reopened.target_size()), (pool.id(), "P", 1 << 20));
    assert_eq!(reopened.containers()?, listed);
    reopened.delete(id)?;
    assert!(matches!(reopened.delete(id), Err(PoolError::NotFound { .. })));
    assert!(pool.containers()?.is_empty());
    Ok(())
}

#[test]
fn a_failed_writer_refuses_further_work() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", None)?;
    let frames = frames(2, 1_000);
    let mut w = pool.writer()?;
    let synced = w.append(&frames[0])?;
    w.sync()?;
    w.append(&frames[1])?;
    let Env { server, dir } = env;
    drop(server);
    assert!(matches!(w.sync(), Err(PoolError::Io { .. })));
    assert!(matches!(w.append(&frames[1]), Err(PoolError::WriterFailed { .. })));
    assert!(matches!(w.finish(), Err(PoolError::WriterFailed { .. })));
    // What was synced before the failure is still there once the store is back.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let server = qsm_pool_s3::test_server::TestServer::start(
        dir.path(),
        addr,
        common::ACCESS_KEY,
        common::SECRET_KEY,
    )?;
    let pool = S3Pool::open(&server.pool_config(BUCKET, "p"))?;
    let mut out = Vec::new();
    pool.read_frame(&synced, None, &mut out)?;
    assert_eq!(out, frames[0]);
    Ok(())
}

#[test]
fn a_pool_at_the_bucket_root() -> TestResult {
    let env = Env::start()?;
    env.server.create_bucket("whole")?;
    let config = env.server.pool_config("whole", "");
    let pool = S3Pool::create(&config, "ROOT", None)?;
    let frames = frames(2, 500);
    let mut w = pool.writer()?;
    let locs = append_all(&mut *w, &frames)?;
    w.finish()?;
    assert_eq!(
        pool.container_key(locs[0].container),
        format!("containers/{:016x}", locs[0].container)
    );
    let reopened = S3Pool::open(&config)?;
    assert_eq!(reopened.id(), pool.id());
    assert_eq!(reopened.containers()?.len(), 1);
    check_reads(&reopened, &frames, &locs)?;
    assert!(S3Pool::create(&config, "AGAIN", None).is_err());
    Ok(())
}
