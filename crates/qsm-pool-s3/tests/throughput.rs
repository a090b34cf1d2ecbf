//! Rough throughput against the local s3s-fs server (ignored by default; run with
//! `cargo test -p qsm-pool-s3 --release --test throughput -- --ignored --nocapture`). It
//! measures this crate plus s3s-fs on one machine, not S3.

mod common;

use std::time::Instant;

use common::{Env, TestResult, frames};
use qsm_pool::{FrameLocation, Pool};
use qsm_pool_s3::S3Pool;

#[test]
#[ignore = "a measurement, not a check"]
fn throughput() -> TestResult {
    let env = Env::start()?;
    let pool = S3Pool::create(&env.config("p"), "P", None)?;
    let frames = frames(32, 1 << 20);
    let total_mib = 256.0;
    let mut locs: Vec<FrameLocation> = Vec::new();
    let started = Instant::now();
    let mut w = pool.writer()?;
    for i in 0..256 {
        locs.push(w.append(&frames[i % frames.len()])?);
        // A commit every 16 MiB, as small transactions would make.
        if i % 16 == 15 {
            w.sync()?;
        }
    }
    w.finish()?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!("write: {total_mib} MiB in {secs:.2} s = {:.0} MiB/s", total_mib / secs);
    eprintln!("containers: {}", pool.containers()?.len());

    let started = Instant::now();
    let mut out = Vec::new();
    for loc in &locs {
        pool.read_frame(loc, None, &mut out)?;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("read_frame, 1 thread: {:.0} MiB/s", total_mib / secs);

    let started = Instant::now();
    std::thread::scope(|s| {
        for part in locs.chunks(64) {
            let pool = &pool;
            s.spawn(move || {
                let mut out = Vec::new();
                for loc in part {
                    pool.read_frame(loc, None, &mut out)
                        .map(|_| ())
                        .unwrap_or_else(|e| panic!("{e}"));
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    eprintln!("read_frame, 4 threads: {:.0} MiB/s", total_mib / secs);

    let started = Instant::now();
    for info in pool.containers()? {
        assert!(pool.audit(info.id)?.is_clean());
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("audit: {:.0} MiB/s", total_mib / secs);

    let started = Instant::now();
    let n = pool.containers()?.len();
    eprintln!("containers() of {n}: {:?}", started.elapsed());
    Ok(())
}
