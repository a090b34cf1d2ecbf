//! The SQLite catalog: the shared conformance suite, migrations, and bad files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

use std::path::Path;

use qsm_catalog::migrations::LATEST;
use qsm_catalog::{Catalog, CatalogError, SqliteCatalog, conformance};
use tempfile::TempDir;

#[test]
fn passes_the_conformance_suite() {
    let dir = TempDir::new().unwrap();
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let failures = conformance::run_all(&|| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let path = dir.path().join(format!("case{n}.db"));
        Box::new(SqliteCatalog::open(&path).unwrap()) as Box<dyn Catalog>
    });
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(counter.into_inner(), conformance::CASES.len());
}

#[test]
fn migrates_from_every_earlier_version() {
    for from in 0..LATEST {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("catalog.db");
        let old = SqliteCatalog::open_at(&path, from).unwrap();
        assert_eq!(old.schema_version().unwrap(), from);
        drop(old);
        let cat = SqliteCatalog::open(&path).unwrap();
        assert_eq!(cat.schema_version().unwrap(), LATEST);
        // A migrated catalog is a working one.
        let failures = conformance::policy(&cat);
        assert!(failures.is_ok(), "from version {from}: {failures:?}");
    }
}

/// The oldest schema a released QSM wrote, with data in it, upgrades in place: a copy of it
/// as it was is taken first (and opens at its old version), and everything in it survives.
#[test]
fn upgrading_the_oldest_schema_copies_it_first_and_keeps_its_data() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    {
        let old = SqliteCatalog::open_at(&path, 1).unwrap();
        old.raw_execute_for_tests(
            "INSERT INTO domains (name, description) VALUES ('standard', 'old');
             INSERT INTO nodes (name, password_hash, domain_id, registered) VALUES ('alpha', 'h', 1, 5);
             INSERT INTO filespaces (node_id, name, created) VALUES (1, '/home', 5);
             INSERT INTO storage_pools (name, kind, location) VALUES ('primary', 'dir', '/p');
             INSERT INTO containers (id, pool_id, size, sealed) VALUES (77, 1, 100, 1);
             INSERT INTO chunks (container_id, frame_offset, stored_len, raw_len, codec, refcount) VALUES (77, 0, 100, 300, 2, 1);
             INSERT INTO objects (filespace_id, state, path, object_type, size, mtime_ns, ctime_ns, mode, uid, gid, inserted, chunk_list)
                 VALUES (1, 1, X'2f61', 0, 300, 1, 1, 33188, 0, 0, 5, X'02');",
        )
        .unwrap();
    }
    let cat = SqliteCatalog::open(&path).unwrap();
    assert_eq!(cat.schema_version().unwrap(), LATEST);
    let upgrade = cat.upgraded().expect("no upgrade recorded").clone();
    assert_eq!((upgrade.from, upgrade.to), (1, LATEST));
    assert!(cat.check().unwrap().problems.is_empty(), "{:?}", cat.check().unwrap().problems);
    let node = cat.node("alpha").unwrap().expect("node lost");
    let fs = cat.filespaces(node.id).unwrap();
    let mut active = Vec::new();
    cat.for_each_active(fs[0].id, &mut |v| {
        active.push((v.path.clone(), v.attrs.size, v.attrs.ino, v.damaged));
        Ok(())
    })
    .unwrap();
    assert_eq!(active, [(b"/a".to_vec(), 300, 0, false)]);
    assert_eq!(cat.object_chunks(active_id(&cat, fs[0].id)).unwrap().len(), 1);
    drop(cat);
    // The copy is the old catalog, untouched; a second upgrade never overwrites it.
    let copy = SqliteCatalog::open_at(&upgrade.backup, 0).unwrap();
    assert_eq!(copy.schema_version().unwrap(), 1);
    let reopened = SqliteCatalog::open(&path).unwrap();
    assert!(reopened.upgraded().is_none(), "an up-to-date catalog was copied again");
}

fn active_id(cat: &SqliteCatalog, fs: qsm_catalog::FilespaceId) -> qsm_catalog::ObjectId {
    let mut id = None;
    cat.for_each_active(fs, &mut |v| {
        id = Some(v.id);
        Ok(())
    })
    .unwrap();
    id.unwrap()
}

/// A snapshot is a catalog of its own, as of one moment, taken while a writer holds a
/// transaction open.
#[test]
fn a_snapshot_opens_as_the_same_catalog_while_a_writer_is_busy() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    let cat = SqliteCatalog::open(&path).unwrap();
    let d = cat.define_domain("standard", "").unwrap();
    cat.register_node("alpha", "h", d).unwrap();
    let open = cat.begin().unwrap();
    let dest = dir.path().join("copy.db");
    let other = SqliteCatalog::open(&path).unwrap();
    other.snapshot(&dest).unwrap();
    drop(open);
    let copy = SqliteCatalog::open(&dest).unwrap();
    assert!(copy.node("alpha").unwrap().is_some());
    assert_eq!(copy.stats().unwrap().objects, 0);
}

#[test]
fn reopening_keeps_everything() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    {
        let cat = SqliteCatalog::open(&path).unwrap();
        let d = cat.define_domain("standard", "").unwrap();
        cat.register_node("alpha", "h", d).unwrap();
    }
    let cat = SqliteCatalog::open(&path).unwrap();
    assert!(cat.node("alpha").unwrap().is_some());
}

fn open_err(path: &Path) -> CatalogError {
    match SqliteCatalog::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e,
    }
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    let err = open_err(&path);
    assert!(matches!(err, CatalogError::NotADatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("catalog.db"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), vec![0x42u8; 8192], "the file was modified");
}

#[test]
fn another_programs_database_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("other.db");
    drop(foreign_database(&path));
    let err = open_err(&path);
    assert!(err.to_string().contains("qsm_schema"), "{err}");
}

/// An SQLite database of some other program: one unrelated table, no `qsm_schema`.
fn foreign_database(path: &Path) -> SqliteCatalog {
    let cat = SqliteCatalog::open_at(path, 0).unwrap();
    cat.raw_execute_for_tests("CREATE TABLE photos (id INTEGER PRIMARY KEY)").unwrap();
    cat
}

#[test]
fn a_newer_catalog_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    let cat = SqliteCatalog::open(&path).unwrap();
    cat.raw_execute_for_tests(&format!("UPDATE qsm_schema SET version = {}", LATEST + 1)).unwrap();
    drop(cat);
    let err = open_err(&path);
    assert!(matches!(err, CatalogError::TooNew { found, .. } if found == LATEST + 1), "{err:?}");
    assert!(err.to_string().contains("upgrade qsm"), "{err}");
}

/// A catalog on a full disk: the failing transaction reports it, and everything committed
/// before it is still there after reopening.
#[test]
fn a_full_disk_loses_no_committed_transaction() {
    use qsm_catalog::{
        Attributes, ContainerId, NewChunk, NewObject, ObjectChunk, ObjectKind, ObjectType,
    };
    // Not skipped silently where it cannot mount (issue 23): `Tmpfs::mount` says so, or fails
    // under QSM_TEST_REQUIRE_ROOT=1.
    let Some(disk) =
        qsm_catalog::testing::Tmpfs::mount("a_full_disk_loses_no_committed", "1m").unwrap()
    else {
        return;
    };
    let mount = disk.path();
    let path = mount.join("catalog.db");
    let cat = SqliteCatalog::open(&path).unwrap();
    let d = cat.define_domain("standard", "").unwrap();
    let n = cat.register_node("alpha", "h", d).unwrap();
    let fs = cat.filespace(n, "/data").unwrap();
    let pool = cat.define_pool("disk", "dir", "/pool").unwrap();
    let mut t = cat.begin().unwrap();
    t.add_container(pool, ContainerId(1)).unwrap();
    t.commit().unwrap();
    let mut committed = 0u64;
    let mut failure = None;
    'fill: for batch in 0..10_000u64 {
        let mut t = cat.begin().unwrap();
        for i in 0..100u64 {
            let k = batch * 100 + i;
            let object = NewObject {
                filespace: fs,
                path: format!("/a/rather/long/directory/name/to/fill/the/disk/faster/file{k:08}")
                    .into_bytes(),
                kind: ObjectKind::Backup,
                object_type: ObjectType::File,
                attrs: Attributes::default(),
                mgmt_class: None,
                description: None,
                retain_until: None,
                chunks: vec![ObjectChunk::New(NewChunk {
                    container: ContainerId(1),
                    offset: k,
                    stored_len: 1,
                    raw_len: 1,
                    codec: 0,
                })],
                replica: None,
            };
            if let Err(e) = t.insert_object(&object, 1) {
                failure = Some(e);
                break 'fill;
            }
        }
        match t.commit() {
            Ok(()) => committed += 100,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failure = failure.expect("1 MiB held a million objects");
    assert!(failure.to_string().contains("full"), "{failure}");
    assert!(committed > 0);
    drop(cat);
    let cat = SqliteCatalog::open(&path).unwrap();
    assert_eq!(
        cat.stats().unwrap().objects,
        committed,
        "committed objects lost or uncommitted ones kept"
    );
    assert!(cat.check().unwrap().problems.is_empty());
}

/// `copy::TABLES` names every table and column of the schema, so a whole-catalog copy
/// (migrate-catalog, a PostgreSQL snapshot) cannot silently drop one a migration added.
#[test]
fn tables_list_every_column() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    drop(SqliteCatalog::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
             AND name <> 'qsm_schema' ORDER BY name",
        )
        .unwrap();
    let mut tables: Vec<String> =
        stmt.query_map([], |r| r.get(0)).unwrap().map(|r| r.unwrap()).collect();
    let mut listed: Vec<String> =
        qsm_catalog::copy::TABLES.iter().map(|t| t.0.to_string()).collect();
    listed.extend(qsm_catalog::copy::EPHEMERAL.iter().map(|t| t.to_string()));
    tables.sort();
    listed.sort();
    assert_eq!(tables, listed);
    for (table, columns) in qsm_catalog::copy::TABLES {
        let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})")).unwrap();
        let mut actual: Vec<String> =
            stmt.query_map([], |r| r.get(1)).unwrap().map(|r| r.unwrap()).collect();
        let mut expected: Vec<String> = columns.iter().map(|c| c.0.to_string()).collect();
        actual.sort();
        expected.sort();
        assert_eq!(actual, expected, "table {table}");
    }
}

/// Issue 23: a listing paused by its caller (`qsm query backup --inactive | less`) holds no
/// read transaction, so the WAL can be checkpointed and truncated to nothing meanwhile; and
/// the check itself fails when a reader does hold one.
#[test]
fn a_paused_listing_lets_the_wal_be_checkpointed_and_truncated() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    let cat = SqliteCatalog::open(&path).unwrap();
    let wal = dir.path().join("catalog.db-wal");
    let other = rusqlite::Connection::open(&path).unwrap();
    other.busy_timeout(std::time::Duration::from_millis(200)).unwrap();
    let truncated = || -> Result<(), String> {
        let busy: i64 = other
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        let left = std::fs::metadata(&wal).map_err(|e| e.to_string())?.len();
        if busy != 0 || left != 0 {
            return Err(format!("WAL not truncated: busy {busy}, {left} bytes left"));
        }
        Ok(())
    };
    conformance::listing_interleaved_with_commits_probed(&cat, &truncated).unwrap();

    // The probe sees a reader that holds a snapshot.
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    reader.query_row("SELECT count(*) FROM objects", [], |r| r.get::<_, i64>(0)).unwrap();
    cat.log(qsm_catalog::Severity::Info, "a commit the reader does not see", None, None, None)
        .unwrap();
    assert!(truncated().is_err(), "a reader holding a snapshot went unnoticed");
}

/// Issue 23: a catalog on a full disk still opens and reads (read-only, saying why), and a
/// write to it fails naming the full disk and the catalog, both when the catalog is opened
/// after the disk filled and when it was already open (a server running). Needs root for a
/// tmpfs of its own.
#[test]
fn a_full_disk_still_reads_and_names_itself_on_writes() {
    use qsm_catalog::{NewObject, ObjectKind, ObjectType};
    let Some(disk) = qsm_catalog::testing::Tmpfs::mount("a_full_disk_still_reads", "8m").unwrap()
    else {
        return;
    };
    let path = disk.path().join("catalog.db");
    let fs = {
        let cat = SqliteCatalog::open(&path).unwrap();
        let d = cat.define_domain("standard", "").unwrap();
        let node = cat.register_node("alpha", "h", d).unwrap();
        let fs = cat.filespace(node, "/home").unwrap();
        let mut t = cat.begin().unwrap();
        for i in 0..2_000u32 {
            let object = NewObject {
                filespace: fs,
                path: format!("/f{i:05}").into_bytes(),
                kind: ObjectKind::Backup,
                object_type: ObjectType::Directory,
                attrs: Default::default(),
                mgmt_class: None,
                description: None,
                retain_until: None,
                chunks: vec![],
                replica: None,
            };
            t.insert_object(&object, 100).unwrap();
        }
        t.commit().unwrap();
        fs
    };
    // Open before the disk fills, as a running server has it.
    let running = SqliteCatalog::open(&path).unwrap();
    assert!(running.read_only().is_none());
    disk.fill().unwrap();

    let named = |e: CatalogError| {
        let text = e.to_string();
        assert!(matches!(e, CatalogError::DiskFull { .. }), "{text}");
        assert!(text.contains("is full") && text.contains(&path.display().to_string()), "{text}");
    };
    let count = |cat: &SqliteCatalog| {
        let mut n = 0;
        cat.for_each_version(fs, &mut |_| {
            n += 1;
            Ok(())
        })
        .unwrap();
        n
    };
    // The catalog open before: its writes fail naming the full disk, and it still reads, as
    // does another opened beside it (its WAL index is there already).
    let big = "x".repeat(64 << 10);
    let mut failed = None;
    for _ in 0..200 {
        if let Err(e) = running.log(qsm_catalog::Severity::Info, &big, None, None, None) {
            failed = Some(e);
            break;
        }
    }
    named(failed.expect("13 MB of log entries fitted on an 8 MB disk"));
    assert_eq!(count(&running), 2_000);
    let beside = SqliteCatalog::open(&path).unwrap();
    assert_eq!(count(&beside), 2_000);
    drop((running, beside));

    // Filled while nobody had it open: SQLite's usual open would have to make and grow the
    // WAL index (the "disk I/O error … enabling WAL" of the issue).
    std::fs::remove_file(disk.path().join("fill")).unwrap();
    drop(SqliteCatalog::open(&path).unwrap());
    assert!(!disk.path().join("catalog.db-shm").exists(), "the WAL index outlived its catalog");
    disk.fill().unwrap();
    let cat = SqliteCatalog::open(&path).unwrap();
    let why = cat.read_only().expect("opened for writing on a full disk");
    assert!(why.contains("is full") && why.contains(&path.display().to_string()), "{why}");
    let node = cat.node("alpha").unwrap().unwrap();
    assert_eq!(cat.filespaces(node.id).unwrap().len(), 1);
    assert_eq!(count(&cat), 2_000);
    named(cat.define_domain("other", "").unwrap_err());
    named(cat.begin().map(drop).unwrap_err());
}
