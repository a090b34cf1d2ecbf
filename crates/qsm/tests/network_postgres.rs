//! End-to-end tests of servers on a real PostgreSQL catalog (a throw-away database per
//! server, named in its data directory's `server.toml`): several servers on one catalog and
//! pool, failover, a PostgreSQL restart, an S3 pool stopped or misconfigured. The whole suite
//! runs on PostgreSQL in `network_s3.rs` (with the pool on S3 too); this file uses its
//! helpers, not all of them.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unused_macros)]

/// Whether the servers of this run keep their catalog on PostgreSQL.
const POSTGRES: bool = true;
/// Whether their pool is in an S3 bucket (with a PostgreSQL catalog only).
const S3: bool = false;

include!("suite/helpers.rs");

/// A server on `data` with the node alpha, and a slow backup by alpha of a tree under `dir`
/// (with 40 big files) under way: its first objects committed. Returns the server, alpha's
/// password file, the tree and the backup's process.
fn backup_under_way(data: &Path, dir: &Path) -> (ServerProc, PathBuf, PathBuf, Child) {
    let server = ServerProc::start(data, false);
    register(&server, "alpha", "alpha-password");
    let pw = password_file(dir, "pw", "alpha-password");
    let src = dir.join("src");
    tree(&src);
    big_tree(&src.join("big"), 40);
    let backup = slow_backup(&server.url, &pw, &src, dir);
    wait_for("a first commit", || committed_objects(&server, "alpha", &pw) >= 3);
    (server, pw, src, backup)
}

/// A second server's data directory `to`, with the settings (catalog, pool) of `from`.
fn share_settings(from: &Path, to: &Path) {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(to).unwrap();
    fs::copy(from.join("server.toml"), to.join("server.toml")).unwrap();
}

/// A slow backup of `src` by alpha given the addresses of `first`, then `second`; `first` is
/// killed once three objects are committed. The backup must finish on `second` and say so;
/// returns its JSON report.
fn backup_failing_over(
    first: &mut ServerProc,
    second: &ServerProc,
    pw: &Path,
    src: &Path,
    home: &Path,
) -> serde_json::Value {
    let both = format!("{},{}", first.url, second.url);
    let backup = slow_backup(&both, pw, src, home);
    wait_for("a first commit", || committed_objects(second, "alpha", pw) >= 3);
    first.kill();
    let out = backup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("resuming on another server"), "{err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

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
    share_settings(&one, &two);
    let second = ServerProc::start_with(&two, false, &["--pool", pool_arg]);

    // A node registered through one server logs in through the other.
    register(&first, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 40);
    let report = backup_failing_over(&mut first, &second, &pw, &src, dir.path());
    let sent = report[0]["backed_up"].as_u64().unwrap();
    assert!(sent < 41, "the second server was sent everything again: {report}");

    let restored = dir.path().join("restored");
    restores_intact(&second, "alpha", &pw, &src, &restored);
    // The restarted first server sees the versions the second one stored.
    let first = ServerProc::start_with(&one, false, &["--pool", pool_arg]);
    let listed = json(client(&first, "alpha", &pw).args(["query", "backup"]).arg(&src));
    assert!(listed.as_array().unwrap().len() >= 41, "{listed}");
}

/// A server data directory naming a PostgreSQL catalog (as `backend` writes it) and the S3
/// pool `pool`.
fn s3_data_dir(data: &Path, pool: &qsm_pool_s3::S3PoolConfig) {
    backend(data);
    let catalog = fs::read_to_string(data.join("server.toml")).unwrap();
    fs::write(data.join("server.toml"), catalog + &s3_settings(pool)).unwrap();
}

/// Two servers on one PostgreSQL catalog and one S3 pool (a real S3-protocol server, s3s-fs,
/// over real sockets): backups through either, a failover, an audit that reads every chunk
/// back from S3, restores identical; then a bucket that does not exist is a clear error.
#[test]
fn servers_on_postgres_and_an_s3_pool_back_up_fail_over_audit_and_restore() {
    let dir = TempDir::new().unwrap();
    fs::create_dir(dir.path().join("s3")).unwrap();
    let s3 = qsm_pool_s3::test_server::TestServer::start(
        dir.path().join("s3"),
        "127.0.0.1:0".parse().unwrap(),
        "qsm-test-key",
        "qsm-test-secret",
    )
    .unwrap();
    s3.create_bucket("backups").unwrap();
    let one = dir.path().join("srv1");
    s3_data_dir(&one, &s3.pool_config("backups", "qsm"));
    let mut first = ServerProc::start(&one, false);
    let two = dir.path().join("srv2");
    share_settings(&one, &two);
    let second = ServerProc::start(&two, false);
    assert!(!one.join("pool").exists(), "the pool went to disk, not to S3");

    register(&first, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    tree(&src);
    big_tree(&src.join("big"), 40);
    backup_failing_over(&mut first, &second, &pw, &src, dir.path());

    // Every chunk read back from S3 and verified.
    let audit = json(admin(&second).args(["audit", "stgpool"]));
    assert!(audit["damaged"].as_array().unwrap().is_empty(), "{audit}");
    // An incremental sends nothing; a change is sent and restores.
    let again = json(client(&second, "alpha", &pw).arg("backup").arg(&src));
    assert_eq!(backed_up(&again), 0, "{again}");
    fs::write(src.join("docs/a.txt"), b"changed\n".repeat(300)).unwrap();
    let changed = json(client(&second, "alpha", &pw).arg("backup").arg(&src));
    assert_eq!(backed_up(&changed), 1, "{changed}");
    let restored = dir.path().join("restored");
    restores_intact(&second, "alpha", &pw, &src, &restored);

    // A bucket that does not exist: the server refuses to start and says which.
    let three = dir.path().join("srv3");
    s3_data_dir(&three, &s3.pool_config("no-such-bucket", "qsm"));
    let err = server_refusal(&three);
    assert!(err.contains("no-such-bucket"), "{err}");
    assert!(!err.contains("qsm-test-secret"), "the secret key was printed: {err}");
}

/// A data directory whose `server.toml` names the catalog `url` (and nothing else).
fn catalog_data_dir(data: &Path, url: &str) {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(data).unwrap();
    fs::write(data.join("server.toml"), format!("catalog = {url:?}\n")).unwrap();
}

/// PostgreSQL restarted (`pg_ctl stop -m fast`, down two seconds, started again) in the
/// middle of a backup: the server's sessions lose their connections and open transactions,
/// waits for the database, retries the transaction it lost, and the backup completes;
/// everything restores and the audit is clean.
#[test]
fn a_postgresql_restart_during_a_backup_is_ridden_out_and_loses_nothing() {
    let cluster = qsm_catalog::testing::Cluster::start().unwrap();
    let url = cluster.create_database("qsm_restart").unwrap();
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("srv");
    catalog_data_dir(&data, &url);
    let (server, pw, src, backup) = backup_under_way(&data, dir.path());
    cluster.stop().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    cluster.resume().unwrap();
    let out = backup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report[0]["failed"], 0, "{report}");

    let again = json(client(&server, "alpha", &pw).arg("backup").arg(&src));
    assert_eq!(backed_up(&again), 0, "everything was committed: {again}");
    let audit = json(admin(&server).args(["audit", "stgpool"]));
    assert!(audit["damaged"].as_array().unwrap().is_empty(), "{audit}");
    let restored = dir.path().join("restored");
    restores_intact(&server, "alpha", &pw, &src, &restored);
}

/// The S3 server stopped in the middle of a backup: the backup fails with an error naming
/// the pool's endpoint, what was committed before stays, and once S3 is back the next backup
/// sends the rest and everything restores. Wrong credentials keep the server from starting,
/// named, without the secret.
#[test]
fn s3_stopped_mid_backup_or_wrong_credentials_are_clear_errors_and_lose_nothing() {
    use qsm_pool_s3::test_server::TestServer;
    let dir = TempDir::new().unwrap();
    let root = dir.path().join("s3");
    fs::create_dir(&root).unwrap();
    let start_s3 = |addr: &str| {
        TestServer::start(&root, addr.parse().unwrap(), "qsm-test-key", "qsm-test-secret").unwrap()
    };
    let s3 = start_s3("127.0.0.1:0");
    let addr = s3.addr().to_string();
    s3.create_bucket("backups").unwrap();
    let data = dir.path().join("srv");
    s3_data_dir(&data, &s3.pool_config("backups", "qsm"));
    let (server, pw, src, backup) = backup_under_way(&data, dir.path());
    let committed = committed_objects(&server, "alpha", &pw);
    drop(s3);
    let out = backup.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a backup without its pool succeeded: {err}");
    assert!(err.contains(&addr) || err.contains("S3"), "the pool is not named: {err}");

    // S3 back on the same address: what was committed is still there, the rest is sent.
    let s3 = start_s3(&addr);
    assert!(committed_objects(&server, "alpha", &pw) >= committed);
    let rest = json(client(&server, "alpha", &pw).arg("backup").arg(&src));
    assert!(backed_up(&rest) > 0, "{rest}");
    let audit = json(admin(&server).args(["audit", "stgpool"]));
    assert!(audit["damaged"].as_array().unwrap().is_empty(), "{audit}");
    let restored = dir.path().join("restored");
    restores_intact(&server, "alpha", &pw, &src, &restored);

    // Wrong credentials: the server refuses to start, naming the bucket, never the secret.
    let wrong = dir.path().join("srv-wrong");
    let mut config = s3.pool_config("backups", "qsm");
    config.secret_key = Some("not-the-secret-key".into());
    s3_data_dir(&wrong, &config);
    let err = server_refusal(&wrong);
    assert!(err.contains("backups"), "{err}");
    assert!(!err.contains("not-the-secret-key"), "the secret key was printed: {err}");
}

/// Issue 23.7: two servers on one catalog and pool see each other's sessions; a lock or a
/// cancel given to one ends a backup running on the other within seconds; a container the
/// other is writing before its first commit is leased, so orphan removal keeps it, until the
/// other is killed and its lease lapses: then it is an orphan, and removed.
#[test]
fn servers_sharing_a_catalog_stop_each_others_sessions_and_lease_their_containers() {
    let dir = TempDir::new().unwrap();
    let pool = dir.path().join("pool");
    let pool_arg = pool.to_str().unwrap();
    let one = dir.path().join("srv1");
    backend(&one);
    // The shortest lease, so that the test waits seconds, not half a minute.
    let settings = fs::read_to_string(one.join("server.toml")).unwrap();
    fs::write(one.join("server.toml"), format!("lease_seconds = 6\n{settings}")).unwrap();
    let first = ServerProc::start_with(&one, false, &["--pool", pool_arg]);
    let two = dir.path().join("srv2");
    share_settings(&one, &two);
    let mut second = ServerProc::start_with(&two, false, &["--pool", pool_arg]);
    register(&first, "alpha", "alpha-password");
    let pw = password_file(dir.path(), "pw", "alpha-password");
    let src = dir.path().join("src");
    big_tree(&src, 40);
    let alpha_sessions = |server: &ServerProc| -> Vec<serde_json::Value> {
        let all = json(admin(server).args(["query", "session"]));
        all.as_array().unwrap().iter().filter(|s| s["account"] == "alpha").cloned().collect()
    };
    let ends_within = |backup: Child, what: &str| {
        let started = Instant::now();
        let out = backup.wait_with_output().unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains("cancelled"), "{what}: {err}");
        assert!(took < Duration::from_secs(15), "{what}: the backup ran {took:?} more");
        println!("{what}: the backup on the other server ended {took:?} later");
    };

    // A lock given to the first server ends the backup running on the second.
    let backup = slow_backup(&second.url, &pw, &src, dir.path());
    wait_for("a first commit", || committed_objects(&second, "alpha", &pw) >= 3);
    let listed = alpha_sessions(&first);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let pid = format!("pid {}", second.child.id());
    assert!(listed[0]["server"].as_str().unwrap().ends_with(&pid), "{listed:?}");
    admin(&first).args(["lock-node", "alpha"]).assert().success();
    ends_within(backup, "lock node");
    wait_for("the session's end", || alpha_sessions(&first).is_empty());
    admin(&first).args(["unlock-node", "alpha"]).assert().success();

    // So does a cancel of its session, by the number the first server lists.
    let backup = slow_backup(&second.url, &pw, &src, dir.path());
    wait_for("a session", || !alpha_sessions(&first).is_empty());
    let id = alpha_sessions(&first)[0]["id"].as_u64().unwrap().to_string();
    admin(&first).args(["cancel", "session", &id]).assert().success();
    ends_within(backup, "cancel session");

    leases_keep_a_writing_servers_container_until_they_lapse(&first, &mut second, &pool, &pw, &src);
    // What the second server committed before restores through the survivor.
    let listed = json(client(&first, "alpha", &pw).args(["query", "backup"]).arg(&src));
    assert!(!listed.as_array().unwrap().is_empty(), "{listed}");
}
