//! # qsm-pool-s3: storage pools on an S3-compatible object store
//!
//! [`S3Pool`] implements [`qsm_pool::Pool`] on a bucket of AWS S3 or any S3-compatible
//! server, through `object_store`'s S3 client, and passes the same
//! [`qsm_pool::conformance`] suite as [`qsm_pool::DirPool`]. Where it lives and how to reach
//! it is an [`S3PoolConfig`] (endpoint, bucket, prefix, region, credentials, retries), which
//! the server can keep in its TOML configuration.
//!
//! ## Layout
//!
//! ```text
//! PREFIX/POOL                        the pool descriptor: the same bytes as DirPool's POOL file
//! PREFIX/containers/3f9a0c41d2e87b65 one object per container, named by its id in hex
//! ```
//!
//! Containers are byte for byte the containers of `docs/FORMAT.md` ("Storage-pool
//! containers"), written and parsed with [`qsm_pool::container`]; a container copied between a
//! pool directory and a bucket reads the same. S3 lists keys in order and has no directories,
//! so there is no fan-out.
//!
//! The descriptor is written with a put-if-absent (`If-None-Match: *`), so of two servers
//! creating the same pool at once exactly one succeeds; [`S3Pool::open`] on a prefix without
//! it is an error, never an empty pool. The bucket must exist: a missing bucket, refused
//! credentials and an unreachable endpoint are errors naming the endpoint and bucket.
//!
//! ## Writing: one object per container, uploaded whole
//!
//! S3 objects cannot be appended to, and an upload becomes visible only when complete, so a
//! writer keeps its open container in memory (header and frames, at most the target size,
//! [`S3_MAX_TARGET_SIZE`] at most: memory per writer) and uploads the whole object:
//!
//! - **Sync.** [`qsm_pool::PoolWriter::sync`] uploads the open container as it is, unsealed
//!   (header and frames, no index), replacing the previous upload of the same container.
//!   When it returns, S3 holds every frame appended so far: readable, scannable, listed as
//!   unsealed, and durable as S3 makes objects durable. Each sync re-uploads the container
//!   from its start, which would cost quadratic traffic for many syncs into one large
//!   container; so a sync that finds the container at [`S3PoolConfig::sync_seal_size`] bytes
//!   or more (8 MiB by default) seals it instead, and the next frame starts a new one. With
//!   syncs every `s` bytes, a container is uploaded about `sync_seal_size / (2 s)` times at
//!   most; with the server's default transactions (up to 25 MiB) usually once.
//! - **Seal.** When the next frame would pass the target size, at such a sync, and at
//!   [`qsm_pool::PoolWriter::finish`], the writer appends index and trailer and uploads the
//!   sealed container, which then never changes. Containers are therefore at most the target
//!   size but often smaller. A writer that never appended uploads nothing.
//! - **New ids.** A container's id is random, chosen when the writer opens it; its first
//!   upload is a put-if-absent, so an existing object is never overwritten (a collision fails
//!   the writer before any of its frames is synced). A multipart upload cannot be
//!   conditional: a large first upload first claims the id with a put-if-absent of the
//!   48-byte header (a valid, empty, unsealed container).
//! - **Large objects** (over 8 MiB) go up as multipart uploads in 8 MiB parts, four in flight.
//! - **Crashes.** A writer dropped without `finish` (or a crashed server) leaves its last
//!   upload: an unsealed container with every synced frame, read by forward scan, exactly as
//!   the durability contract of [`qsm_pool`] allows.
//!
//! A container object is only ever replaced by a longer version of itself, so readers that
//! read it in several ranged GETs (scans, audits) see consistent bytes below the size they
//! found first; and S3 replaces objects atomically, so a frame read during an upload comes
//! from the old or the new version, which hold it at the same place.
//!
//! ## Reading
//!
//! [`qsm_pool::Pool::read_frame`] is one ranged GET of exactly the frame (plus one of the
//! 48-byte header the first time a container is read, verified as in `DirPool`), then the
//! frame's header, length and checksum are checked: damage is
//! [`qsm_pool::PoolError::Corrupt`], a missing object `NotFound`. Scans and audits read the
//! container in ranged GETs growing from 16 KiB to 8 MiB: a sealed scan reads the first
//! 16 KiB, the trailer and the index, an audit or a forward scan soon reads in large pieces. [`qsm_pool::Pool::containers`] lists the prefix (a failed page
//! fails the listing: never a partial list) and reads each container's 40-byte trailer, 16
//! at a time, to tell sealed from unsealed. [`qsm_pool::Pool::delete`] needs a HEAD before the
//! DELETE, since S3 deletes missing keys without complaint and the contract wants `NotFound`.
//!
//! ## Errors and retries
//!
//! Transient failures (5xx and 429 answers, refused or reset connections, timeouts of
//! idempotent requests) are retried by `object_store`'s own retry logic, configured from
//! [`S3PoolConfig::max_retries`] and [`S3PoolConfig::retry_timeout_secs`] with exponential
//! backoff from 100 ms, so a dead endpoint is reported after a bounded time. Failures are
//! [`qsm_pool::PoolError::Io`] naming the operation and the object as
//! `ENDPOINT/BUCKET/KEY`, with a hint for refused credentials and unreachable endpoints.
//! Credentials never appear in errors or `Debug` output.
//!
//! ## Threads
//!
//! The [`qsm_pool::Pool`] trait is synchronous and is called from plain threads, from
//! `spawn_blocking` threads and from async tasks of other tokio runtimes. Each pool owns a
//! small private tokio runtime (two worker threads) on which every request runs; callers
//! wait for it with `futures::executor::block_on`, which works on any thread (a caller on an
//! async worker blocks that worker for the duration, as any blocking call would).
//!
//! ## Testing
//!
//! The cargo feature `test-server` adds `test_server::TestServer`, an S3 server (`s3s-fs`
//! over a directory, signatures checked) running in the process, which this crate's tests use
//! and other crates' tests may too; the example `s3-test-server` runs it standalone:
//!
//! ```text
//! cargo run -p qsm-pool-s3 --example s3-test-server -- \
//!     --root DIR --addr 127.0.0.1:PORT --access-key K --secret-key S [--bucket NAME]...
//! ```

mod client;
mod config;
mod pool;
#[cfg(feature = "test-server")]
pub mod test_server;
mod writer;

pub use client::MULTIPART_THRESHOLD;
pub use config::{DEFAULT_SYNC_SEAL_SIZE, S3PoolConfig};
pub use pool::{S3_MAX_TARGET_SIZE, S3Pool};
