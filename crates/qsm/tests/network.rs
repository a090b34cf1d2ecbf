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

/// Two servers with data directories of their own on one SQLite catalog and one pool: nothing
/// forbids it, so the second's container, written before its first commit, must survive a
/// reclamation by the first (its lease), and become an orphan only once the second is killed
/// and its lease lapsed. Without leases on SQLite, the first deleted it under the second.
#[test]
fn servers_sharing_a_sqlite_catalog_lease_their_containers_too() {
    let dir = TempDir::new().unwrap();
    let one = dir.path().join("srv1");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&one).unwrap();
    fs::write(one.join("server.toml"), "lease_seconds = 6\n").unwrap();
    let first = ServerProc::start(&one, false);
    let two = dir.path().join("srv2");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&two).unwrap();
    let shared = format!(
        "lease_seconds = 6\ncatalog = {:?}\npool = {:?}\n",
        one.join("catalog.db"),
        one.join("pool")
    );
    fs::write(two.join("server.toml"), shared).unwrap();
    let mut second = ServerProc::start(&two, false);
    register(&first, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 40);
    leases_keep_a_writing_servers_container_until_they_lapse(
        &first,
        &mut second,
        &one.join("pool"),
        &pw,
        &src,
    );
}
