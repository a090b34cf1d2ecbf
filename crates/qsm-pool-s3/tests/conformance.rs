//! The conformance suite of `qsm-pool`, against a real S3 server.

mod common;

use std::time::Instant;

use common::{Env, TestResult};
use qsm_pool::{Pool, PoolError};
use qsm_pool_s3::S3Pool;

#[test]
fn conformance_suite() -> TestResult {
    let env = Env::start()?;
    let mut n = 0;
    let mut factory = |target_size: u64| -> Result<Box<dyn Pool>, PoolError> {
        n += 1;
        let pool =
            S3Pool::create(&env.config(&format!("pool-{n}")), "conformance", Some(target_size))?;
        Ok(Box::new(pool))
    };
    let started = Instant::now();
    qsm_pool::conformance::run_all(&mut factory)?;
    eprintln!("conformance suite: {:?}", started.elapsed());
    Ok(())
}
