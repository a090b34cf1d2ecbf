//! The end-to-end suite of `network.rs` (the real binary as server and clients over real
//! sockets) on the scale-out backends: every server's catalog on a real PostgreSQL (a
//! throw-away database) and its pool in a bucket of a real S3-protocol server (s3s-fs,
//! started in this process on 127.0.0.1), both named in its data directory's `server.toml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Whether the servers of this run keep their catalog on PostgreSQL.
const POSTGRES: bool = true;
/// Whether their pool is in an S3 bucket (with a PostgreSQL catalog only).
const S3: bool = true;

include!("suite/network.rs");
