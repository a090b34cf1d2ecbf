//! End-to-end tests of the real `qsm` binary as a server and as clients over real sockets:
//! TLS and the local socket, incremental backups, restores of every kind, two isolated
//! nodes, bad logins, malformed requests, cancellation, and SIGKILL of either side.
//!
//! The suite itself is `suite/network.rs`; `network_postgres.rs` runs it again with the
//! catalog on PostgreSQL, and `network_s3.rs` with the catalog on PostgreSQL and the pool on
//! S3.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Whether the servers of this run keep their catalog on PostgreSQL.
const POSTGRES: bool = false;
/// Whether their pool is in an S3 bucket (with a PostgreSQL catalog only).
const S3: bool = false;

include!("suite/network.rs");
