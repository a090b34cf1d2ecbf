//! The end-to-end suite of `network.rs` (the real binary as server and clients over real
//! sockets) with every server's catalog on a real PostgreSQL: a throw-away database per
//! server, named in its data directory's `server.toml`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Whether the servers of this run keep their catalog on PostgreSQL.
const POSTGRES: bool = true;

include!("suite/network.rs");

/// Two `qsm server` processes on different ports share one PostgreSQL catalog and one pool;
/// a client given both addresses loses its server mid-backup and finishes on the other,
/// resuming after what the lost one committed; everything restores through the survivor.
#[test]
fn two_servers_share_a_catalog_and_pool_and_a_backup_fails_over_when_one_dies() {
    let dir = TempDir::new().unwrap();
    let pool = dir.path().join("pool");
    let pool_arg = pool.to_str().unwrap();
    let one = dir.path().join("srv1");
    let mut first = ServerProc::start_with(&one, false, &["--pool", pool_arg]);
    // The second server: a data directory of its own, the first one's catalog and pool.
    let two = dir.path().join("srv2");
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&two).unwrap();
    fs::copy(one.join("server.toml"), two.join("server.toml")).unwrap();
    let second = ServerProc::start_with(&two, false, &["--pool", pool_arg]);

    // A node registered through one server logs in through the other.
    register(&first, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 40);
    let both = format!("{},{}", first.url, second.url);
    let backup = StdCommand::new(assert_cmd::cargo::cargo_bin("qsm"))
        .env("QSM_SERVER", &both)
        .env("QSM_NODE", "alpha")
        .env("QSM_PASSWORD_FILE", &pw)
        .env("QSM_HOME", "/nonexistent/embedded-must-not-be-used")
        .env("HOME", dir.path())
        .args(["backup", "--json", "--compression", "off", "--limit-upload", "4MB"])
        .args(["--txn-group-max", "3"])
        .arg(&src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("a first commit", || committed_objects(&second, "alpha", &pw) >= 3);
    first.kill();
    let out = backup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("resuming on another server"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sent = report[0]["backed_up"].as_u64().unwrap();
    assert!(sent < 41, "the second server was sent everything again: {report}");

    let restored = dir.path().join("restored");
    client(&second, "alpha", &pw)
        .arg("restore")
        .arg(&src)
        .arg("--to")
        .arg(&restored)
        .assert()
        .success();
    assert_same(&src, &restored);
    // The restarted first server sees the versions the second one stored.
    let first = ServerProc::start_with(&one, false, &["--pool", pool_arg]);
    let listed = json(client(&first, "alpha", &pw).args(["query", "backup"]).arg(&src));
    assert!(listed.as_array().unwrap().len() >= 41, "{listed}");
}
