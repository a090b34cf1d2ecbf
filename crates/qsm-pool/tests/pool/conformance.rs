//! The pool conformance suite (`qsm_pool::conformance`) run against `DirPool`, fsync on, one
//! test per check.

use std::path::Path;

use qsm_pool::{DirPool, DirPoolOptions, Pool, PoolError};

use crate::common::TestResult;

fn dir_factory(root: &Path) -> impl FnMut(u64) -> Result<Box<dyn Pool>, PoolError> + '_ {
    let mut n = 0;
    move |target_size| {
        n += 1;
        let options = DirPoolOptions { target_size: Some(target_size), fsync: true };
        Ok(Box::new(DirPool::create(root.join(format!("pool-{n}")), "conformance", &options)?))
    }
}

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() -> TestResult {
                let dir = tempfile::tempdir()?;
                qsm_pool::conformance::$name(&mut dir_factory(dir.path()))?;
                Ok(())
            }
        )*

        #[test]
        fn every_check_runs_against_dir_pool() {
            let here: &[&str] = &[$(stringify!($name)),*];
            let missing: Vec<&str> = qsm_pool::conformance::CHECKS
                .iter()
                .map(|(name, _)| *name)
                .filter(|name| !here.contains(name))
                .collect();
            assert!(missing.is_empty(), "conformance checks not run against DirPool: {missing:?}");
        }
    };
}

conformance_tests!(
    identity,
    round_trip_every_codec,
    synced_frames_readable_while_open,
    concurrent_writers,
    rollover_at_target_size,
    scan_sealed_matches_unsealed,
    delete_container,
    missing_container,
    audit_healthy,
    rejects_invalid_frames,
    empty_writer_leaves_nothing,
    copy_frames_moves_live_frames,
    wrong_locations_are_corrupt,
    read_for_decode_matches_read,
    catalog_record,
);

#[test]
fn run_all_passes() -> TestResult {
    let dir = tempfile::tempdir()?;
    // fsync off: this run repeats the checks above only to test `run_all` itself.
    let mut n = 0;
    let mut factory = |target_size| -> Result<Box<dyn Pool>, PoolError> {
        n += 1;
        let options = DirPoolOptions { target_size: Some(target_size), fsync: false };
        Ok(Box::new(DirPool::create(dir.path().join(format!("p{n}")), "all", &options)?))
    };
    qsm_pool::conformance::run_all(&mut factory)?;
    Ok(())
}
