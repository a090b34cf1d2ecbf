//! The PostgreSQL catalog against a real PostgreSQL: the shared conformance suite, migrations,
//! concurrency between connections and servers, copies between backends, bad databases.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

use qsm_catalog::copy::{copy_catalog, digest};
use qsm_catalog::migrations::LATEST;
use qsm_catalog::testing::TempDatabase;
use qsm_catalog::{Catalog, CatalogError, PostgresCatalog, SqliteCatalog, conformance};

#[test]
fn passes_the_conformance_suite() {
    let dbs = std::sync::Mutex::new(Vec::new());
    let failures = conformance::run_all(&|| {
        let db = TempDatabase::new().unwrap();
        let cat = PostgresCatalog::open(&db.url).unwrap();
        dbs.lock().unwrap().push(db);
        Box::new(cat) as Box<dyn Catalog>
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn migrates_from_every_earlier_version_with_the_same_numbers() {
    for from in 0..LATEST {
        let db = TempDatabase::new().unwrap();
        let old = PostgresCatalog::open_at(&db.url, from).unwrap();
        assert_eq!(old.schema_version().unwrap(), from);
        drop(old);
        let cat = PostgresCatalog::open(&db.url).unwrap();
        assert_eq!(cat.schema_version().unwrap(), LATEST);
        assert!(conformance::policy(&cat).is_ok(), "from version {from}");
    }
}

#[test]
fn a_foreign_database_and_a_newer_schema_are_refused() {
    let db = TempDatabase::new().unwrap();
    qsm_catalog::testing::execute(&db.url, "CREATE TABLE payroll (id BIGINT)").unwrap();
    let e = PostgresCatalog::open(&db.url).unwrap_err();
    assert!(e.to_string().contains("no QSM catalog"), "{e}");

    let db = TempDatabase::new().unwrap();
    drop(PostgresCatalog::open(&db.url).unwrap());
    qsm_catalog::testing::execute(&db.url, "UPDATE qsm_schema SET version = 999").unwrap();
    assert!(matches!(PostgresCatalog::open(&db.url), Err(CatalogError::TooNew { found: 999, .. })));
}

#[test]
fn an_unreachable_server_is_a_clear_error_naming_it_without_its_password() {
    let started = std::time::Instant::now();
    let e = PostgresCatalog::open("postgres://qsm:secret@127.0.0.1:1/qsm").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("127.0.0.1:1") && !text.contains("secret"), "{text}");
    assert!(text.contains("unavailable"), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let e = PostgresCatalog::open("postgres://nobody@127.0.0.1:5432/qsm_no_such_db").unwrap_err();
    assert!(e.to_string().contains("qsm_no_such_db"), "{e}");
}

/// Two servers starting on one new database: one migrates, the other waits and finds it done.
#[test]
fn servers_opening_one_new_database_at_once_migrate_it_once() {
    let db = TempDatabase::new().unwrap();
    let opened: Vec<_> = std::thread::scope(|s| {
        let h: Vec<_> = (0..4).map(|_| s.spawn(|| PostgresCatalog::open(&db.url))).collect();
        h.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for c in opened {
        assert_eq!(c.unwrap().schema_version().unwrap(), LATEST);
    }
}

/// Many writers on separate connections (as several servers are) referencing and releasing
/// the same deduplicated chunks: the reference counts stay exact.
#[test]
fn concurrent_writers_keep_reference_counts_exact() {
    use qsm_catalog::*;
    let db = TempDatabase::new().unwrap();
    // The racing writers deadlock by design, and PostgreSQL looks for a deadlock only after
    // `deadlock_timeout` (1 s): each one would cost the test a second.
    let url = format!("{}?options=-c%20deadlock_timeout%3D20ms", db.url);
    let cats: Vec<PostgresCatalog> = (0..2).map(|_| PostgresCatalog::open(&url).unwrap()).collect();
    let domain = standard_domain(&cats[0]).unwrap();
    let node = cats[0].register_node("n", "h", domain).unwrap();
    let scope = cats[0].dedup_scope(node, [7; 32]).unwrap();
    let pool = cats[0].define_pool("p", "dir", "/p").unwrap();
    let mut t = cats[0].begin().unwrap();
    t.add_container(pool, ContainerId(1)).unwrap();
    t.commit().unwrap();
    let threads = 6;
    let per = 40;
    std::thread::scope(|s| {
        for w in 0..threads {
            let cat = &cats[w % 2];
            s.spawn(move || {
                // Writers 0 and 3, 1 and 4, 2 and 5 share a filespace (through different
                // catalog connections): new versions of one path race.
                let fs = cat.filespace(node, &format!("/fs{}", w % 3)).unwrap();
                for i in 0..per {
                    let chunks = (0..4u8)
                        .map(|k| {
                            ObjectChunk::Keyed(
                                NewChunk {
                                    container: ContainerId(1),
                                    offset: u64::from(k) * 100,
                                    stored_len: 100,
                                    raw_len: 100,
                                    codec: 0,
                                },
                                ChunkKey { hash: [k; 32], scope: Some(scope.id), sealed: false },
                            )
                        })
                        .collect();
                    let object = NewObject {
                        filespace: fs,
                        path: format!("/f{}", i % 5).into_bytes(),
                        kind: ObjectKind::Backup,
                        object_type: ObjectType::File,
                        attrs: Attributes::default(),
                        mgmt_class: None,
                        description: None,
                        retain_until: None,
                        chunks,
                        replica: None,
                    };
                    // A deadlock between two writers, or two versions of one path made active
                    // at once, is reported as transient: retry it.
                    loop {
                        let mut t = cat.begin().unwrap();
                        match t.insert_object(&object, i as i64).and_then(|_| t.commit()) {
                            Ok(()) => break,
                            Err(e) if e.is_transient() => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    let report = cats[1].check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // Every path has exactly one active version: the racing writers were serialised.
    for f in 0..3 {
        let fs = cats[0].filespace(node, &format!("/fs{f}")).unwrap();
        for i in 0..5 {
            let versions = cats[0].versions(fs, format!("/f{i}").as_bytes()).unwrap();
            assert_eq!(versions.iter().filter(|v| v.active).count(), 1, "/fs{f}/f{i}");
        }
    }
}

/// SQLite to PostgreSQL and back: every row, id and digest survives, and the copies work.
#[test]
fn a_catalog_copies_between_backends_and_verifies() {
    let dir = tempfile::TempDir::new().unwrap();
    let sqlite = SqliteCatalog::open(&dir.path().join("a.db")).unwrap();
    conformance::expiration_by_policy(&sqlite).unwrap();
    let before = digest(&sqlite).unwrap();
    assert!(before.rows() > 10);

    let db = TempDatabase::new().unwrap();
    let pg = PostgresCatalog::open(&db.url).unwrap();
    let copied = copy_catalog(&sqlite, &pg).unwrap();
    assert_eq!(copied, before);
    assert_eq!(digest(&pg).unwrap(), before);
    // New ids continue after the copied ones.
    let node = pg.nodes().unwrap()[0].clone();
    let fs = pg.filespace(node.id, "/new").unwrap();
    assert!(pg.filespaces(node.id).unwrap().iter().all(|f| f.id.0 <= fs.0));
    assert!(pg.check().unwrap().problems.is_empty());

    let back = SqliteCatalog::open(&dir.path().join("b.db")).unwrap();
    let again = copy_catalog(&pg, &back).unwrap();
    assert_eq!(again, digest(&pg).unwrap());
    assert!(back.check().unwrap().problems.is_empty());

    // The snapshot of a PostgreSQL catalog is a SQLite catalog with the same rows.
    let snap = dir.path().join("snap.db");
    pg.snapshot(&snap).unwrap();
    assert_eq!(digest(&SqliteCatalog::open(&snap).unwrap()).unwrap(), digest(&pg).unwrap());
}

/// With every connection of the pool in use, a caller waits, and gets the first one returned
/// at once, not when its wait times out (60 s): a load of many sessions must not stall.
#[test]
fn a_caller_waiting_for_a_connection_gets_the_next_one_returned() {
    let db = TempDatabase::new().unwrap();
    let cat = PostgresCatalog::open(&db.url).unwrap();
    // 32 transactions: every connection the pool opens.
    let mut held: Vec<_> = (0..32).map(|_| cat.begin().unwrap()).collect();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let started = std::time::Instant::now();
            let t = cat.begin().unwrap();
            drop(t);
            started.elapsed()
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!waiter.is_finished(), "a 33rd connection was opened");
        // Rolled back: its connection goes back to the idle list.
        held.pop();
        let waited = waiter.join().unwrap();
        assert!(
            waited < std::time::Duration::from_secs(20),
            "woken only by the timeout: {waited:?}"
        );
    });
    drop(held);
}

/// Issue 23: the catalog connection is encrypted (the Debian PostgreSQL here serves TLS with
/// its snakeoil certificate, issued to `localhost`), and verified when asked.
#[test]
fn the_connection_is_encrypted_and_verified_when_asked() {
    let db = TempDatabase::new().unwrap();
    let with = |params: &str| {
        let sep = if db.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}{params}", db.url)
    };
    // Fails unless this very connection is encrypted.
    let encrypted = "DO $$ BEGIN IF NOT (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()) \
                     THEN RAISE EXCEPTION 'not encrypted'; END IF; END $$";
    qsm_catalog::testing::execute(&with("sslmode=require"), encrypted).unwrap();
    let e = qsm_catalog::testing::execute(&with("sslmode=disable"), encrypted).unwrap_err();
    assert!(e.contains("not encrypted"), "{e}");
    let cat = PostgresCatalog::open(&with("sslmode=require")).unwrap();
    assert!(conformance::policy(&cat).is_ok());

    let snakeoil = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    if !std::path::Path::new(snakeoil).exists() {
        assert!(
            std::env::var_os("QSM_TEST_REQUIRE_ROOT").is_none(),
            "{snakeoil} is missing: the verify-full half cannot run"
        );
        eprintln!("skipped verify-full: {snakeoil} is missing");
        return;
    }
    let verified = |host: &str| {
        let url = with(&format!("sslmode=verify-full&sslrootcert={snakeoil}"));
        let url = url.replacen("127.0.0.1", host, 1).replacen("@localhost", &format!("@{host}"), 1);
        qsm_catalog::testing::execute(&url, encrypted)
    };
    verified("localhost").unwrap();
    // The certificate names localhost, not 127.0.0.1: refused, saying why.
    let e = verified("127.0.0.1").unwrap_err();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // A CA that signed nothing of the server's.
    let other = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(other.path(), include_str!("other-ca.pem")).unwrap();
    let url = with(&format!("sslmode=verify-full&sslrootcert={}", other.path().display()))
        .replacen("127.0.0.1", "localhost", 1);
    let e = qsm_catalog::testing::execute(&url, encrypted).unwrap_err();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
}

/// Issue 23: a version listing paused by its caller holds no transaction open on PostgreSQL
/// (which would hold back vacuum as a held SQLite snapshot holds back checkpoints); and the
/// check itself sees a transaction that is open.
#[test]
fn a_paused_listing_holds_no_transaction() {
    let db = TempDatabase::new().unwrap();
    let cat = PostgresCatalog::open(&db.url).unwrap();
    let idle = || {
        qsm_catalog::testing::execute(
            &db.url,
            "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND xact_start IS NOT NULL) THEN \
             RAISE EXCEPTION 'a transaction is open on the catalog'; END IF; END $$",
        )
    };
    conformance::listing_interleaved_with_commits_probed(&cat, &idle).unwrap();
    let open = cat.begin().unwrap();
    assert!(idle().is_err(), "an open transaction went unnoticed");
    drop(open);
}
