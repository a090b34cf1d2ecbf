//! The end-to-end suite of `network.rs` (the real binary as server and clients over real
//! sockets) with every server's catalog on a real PostgreSQL: a throw-away database per
//! server, named in its data directory's `server.toml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Whether the servers of this run keep their catalog on PostgreSQL.
const POSTGRES: bool = true;

include!("suite/network.rs");
