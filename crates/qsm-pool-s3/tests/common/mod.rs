//! A real S3 server (s3s-fs, signatures checked) in the test process, over a temporary
//! directory.

#![allow(dead_code)]

use std::net::SocketAddr;

use qsm_codec::Compression;
use qsm_pool::conformance::{encode, random_data};
use qsm_pool_s3::S3PoolConfig;
use qsm_pool_s3::test_server::TestServer;
use tempfile::TempDir;

pub const ACCESS_KEY: &str = "qsm-test-access-key";
pub const SECRET_KEY: &str = "qsm-test-secret-key-0123456789";
pub const BUCKET: &str = "qsm-test";

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A running server with the bucket [`BUCKET`]; the directory goes when it is dropped.
pub struct Env {
    pub server: TestServer,
    // Dropped after the server.
    pub dir: TempDir,
}

impl Env {
    pub fn start() -> Result<Env, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = TestServer::start(dir.path(), addr, ACCESS_KEY, SECRET_KEY)?;
        server.create_bucket(BUCKET)?;
        Ok(Env { server, dir })
    }

    pub fn config(&self, prefix: &str) -> S3PoolConfig {
        self.server.pool_config(BUCKET, prefix)
    }
}

/// `n` RAW frames of `len` random bytes each.
pub fn frames(n: u64, len: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| encode(Compression::NONE, &random_data(len, i + 1)).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("making test frames: {e}"))
}
