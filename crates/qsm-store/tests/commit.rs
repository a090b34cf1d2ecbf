//! The commit protocol: what is committed is restorable, what is not is invisible, and the
//! store's check and reclamation keep pool and catalog in agreement.
#![allow(clippy::unwrap_used)]

mod common;

use common::{add, data, open_store, restore};
use qsm_catalog::Catalog;
use qsm_store::TxnLimits;
use tempfile::TempDir;

#[test]
fn committed_objects_restore_byte_for_byte() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    let inputs: Vec<Vec<u8>> = (0..20).map(|i| data(1 + i * 9_000, i as u64)).collect();
    for (i, bytes) in inputs.iter().enumerate() {
        add(&mut batch, fs, &format!("/f{i:02}"), bytes);
    }
    let committed = batch.finish(2_000).unwrap();
    assert_eq!(committed.objects.len(), 20);
    for (id, bytes) in committed.objects.iter().zip(&inputs) {
        assert_eq!(&restore(&store, *id), bytes);
    }
    let report = store.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.chunks_read >= 20);
}

#[test]
fn limits_split_transactions() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let mut batch = store.batch(TxnLimits { group_max: 3, byte_limit: u64::MAX }).unwrap();
    let mut commits = 0;
    for i in 0..10 {
        let frames = common::frames(&data(100, i), 4096);
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
        if batch
            .add(common::object(fs, &format!("/f{i}"), 100), &refs, 1)
            .unwrap()
            .is_some_and(|c| c.objects.len() == 3)
        {
            commits += 1;
        }
        assert!(batch.pending() <= 3);
    }
    assert_eq!(commits, 3);
    assert_eq!(
        store.catalog().stats().unwrap().objects,
        9,
        "three full transactions committed, one object pending"
    );
    batch.finish(1).unwrap();
    assert_eq!(store.catalog().stats().unwrap().objects, 10);
    // The byte limit splits too.
    let mut batch = store.batch(TxnLimits { group_max: 1000, byte_limit: 50_000 }).unwrap();
    let mut byte_commits = 0;
    for i in 0..6 {
        let big = data(30_000, 100 + i);
        let frames = common::frames(&big, 16 * 1024);
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
        byte_commits += usize::from(
            batch
                .add(common::object(fs, &format!("/big{i}"), big.len()), &refs, 1)
                .unwrap()
                .is_some(),
        );
    }
    assert!(byte_commits >= 2, "byte limit never committed");
}

#[test]
fn an_uncommitted_batch_leaves_only_orphan_bytes() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    {
        let mut batch = store.batch(TxnLimits::default()).unwrap();
        add(&mut batch, fs, "/lost", &data(50_000, 1));
        // dropped: frames are in the pool, the catalog never heard of them
    }
    assert_eq!(store.catalog().stats().unwrap().objects, 0);
    assert!(store.check().unwrap().problems.is_empty());
    let removed = store.remove_orphans().unwrap();
    assert!(!removed.is_empty(), "the orphan container was not found");
    assert!(store.pool().containers().unwrap().is_empty());
}

#[test]
fn a_new_version_replaces_the_active_one_and_deletions_deactivate() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    add(&mut batch, fs, "/a", b"version one");
    add(&mut batch, fs, "/b", b"doomed");
    batch.commit(10).unwrap();
    add(&mut batch, fs, "/a", b"version two");
    batch.deactivate(fs, b"/b");
    batch.finish(20).unwrap();
    let versions = store.catalog().versions(fs, b"/a").unwrap();
    assert_eq!(versions.len(), 2);
    assert!(versions[0].active && !versions[1].active);
    assert_eq!(restore(&store, versions[0].id), b"version two");
    assert_eq!(restore(&store, versions[1].id), b"version one");
    assert!(!store.catalog().versions(fs, b"/b").unwrap()[0].active);
}

#[test]
fn deactivations_and_inserts_apply_in_the_order_asked() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    add(&mut batch, fs, "/a", b"one");
    add(&mut batch, fs, "/b", b"one");
    batch.commit(10).unwrap();
    // Deleted, then created again in the same transaction: the new version is active.
    batch.deactivate(fs, b"/a");
    add(&mut batch, fs, "/a", b"two");
    // Created, then deleted: nothing is active.
    add(&mut batch, fs, "/b", b"two");
    batch.deactivate(fs, b"/b");
    batch.finish(20).unwrap();
    let a = store.catalog().versions(fs, b"/a").unwrap();
    assert_eq!(a.iter().filter(|v| v.active).count(), 1, "{a:?}");
    assert_eq!(restore(&store, a.iter().find(|v| v.active).unwrap().id), b"two");
    let b = store.catalog().versions(fs, b"/b").unwrap();
    assert_eq!((b.len(), b.iter().filter(|v| v.active).count()), (2, 0), "{b:?}");
}

#[test]
fn reclamation_compacts_and_keeps_every_live_version() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), Some(1 << 20));
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    let inputs: Vec<Vec<u8>> = (0..30).map(|i| data(40_000, i)).collect();
    for (i, bytes) in inputs.iter().enumerate() {
        add(&mut batch, fs, &format!("/f{i:02}"), bytes);
    }
    let ids = batch.finish(1).unwrap().objects;
    let before = store.pool().containers().unwrap();
    // Expire two objects in three.
    let mut t = store.catalog().begin().unwrap();
    for id in ids.iter().enumerate().filter(|(i, _)| i % 3 != 0).map(|(_, id)| *id) {
        t.delete_object(id, qsm_catalog::model::now()).unwrap();
    }
    t.commit().unwrap();
    let reclaimed = store.reclaim(0.5).unwrap();
    assert!(!reclaimed.is_empty(), "nothing reclaimed from {before:?}");
    let after = store.pool().containers().unwrap();
    let bytes = |v: &[qsm_pool::ContainerInfo]| v.iter().map(|c| c.size).sum::<u64>();
    assert!(
        bytes(&after) < bytes(&before) / 2,
        "pool did not shrink: {} -> {}",
        bytes(&before),
        bytes(&after)
    );
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        assert_eq!(restore(&store, *id), inputs[i], "object {i} after reclamation");
    }
    let report = store.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.catalog.unreferenced_chunks, 0, "dead chunks were not dropped");
}

#[test]
fn a_container_with_nothing_live_is_simply_deleted() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    add(&mut batch, fs, "/a", &data(50_000, 9));
    let id = batch.finish(1).unwrap().objects[0];
    let mut t = store.catalog().begin().unwrap();
    t.delete_object(id, qsm_catalog::model::now()).unwrap();
    t.commit().unwrap();
    assert_eq!(store.reclaim(0.5).unwrap().len(), 1);
    assert!(store.pool().containers().unwrap().is_empty(), "an empty container was left behind");
    assert_eq!(store.catalog().stats().unwrap().chunks, 0);
    assert!(store.check().unwrap().problems.is_empty());
}

#[test]
fn another_pool_under_a_known_name_is_refused() {
    let dir = TempDir::new().unwrap();
    drop(open_store(dir.path(), None));
    // A different pool directory, created under the same name.
    std::fs::rename(dir.path().join("pool"), dir.path().join("old-pool")).unwrap();
    let other = qsm_pool::DirPool::create(
        dir.path().join("pool"),
        "main",
        &qsm_pool::DirPoolOptions::default(),
    )
    .unwrap();
    let catalog = qsm_catalog::SqliteCatalog::open(&dir.path().join("catalog.db")).unwrap();
    let err =
        qsm_store::Store::new(std::sync::Arc::new(catalog), std::sync::Arc::new(other), "test")
            .unwrap_err();
    assert!(err.to_string().contains("has id"), "{err}");
}

#[test]
fn a_damaged_container_is_reported_with_its_location() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    add(&mut batch, fs, "/a", &data(100_000, 5));
    let id = batch.finish(1).unwrap().objects[0];
    let chunk = store.catalog().object_chunks(id).unwrap()[2];
    let container = qsm_pool::DirPool::open(dir.path().join("pool"))
        .unwrap()
        .container_path(chunk.location.container.0);
    let mut bytes = std::fs::read(&container).unwrap();
    bytes[chunk.location.offset as usize + 40] ^= 0x20;
    std::fs::write(&container, bytes).unwrap();
    let report = store.check().unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let msg = &report.problems[0];
    assert!(
        msg.contains(&format!("{:016x}", chunk.location.container.0))
            && msg.contains(&chunk.location.offset.to_string())
            && msg.contains(&chunk.id.0.to_string()),
        "{msg}"
    );
    let err = store.restore(id, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains(&chunk.location.offset.to_string()), "{err}");
}

/// A full disk fails the batch with a clear error and loses nothing committed before it.
#[test]
fn a_full_pool_disk_loses_nothing_committed() {
    let dir = TempDir::new().unwrap();
    let mount = dir.path().join("small");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&mount)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!(
            "SKIPPED: cannot mount a tmpfs here (needs root); the full-disk case is not tested"
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mount.clone());
    // The catalog sits elsewhere (as the SSD article advises); the pool fills up.
    let catalog = qsm_catalog::SqliteCatalog::open(&dir.path().join("catalog.db")).unwrap();
    let d = catalog.define_domain("standard", "").unwrap();
    let n = catalog.register_node("alpha", "h", d).unwrap();
    let fs = catalog.filespace(n, "/data").unwrap();
    let pool = qsm_pool::DirPool::create(
        mount.join("pool"),
        "small",
        &qsm_pool::DirPoolOptions::default(),
    )
    .unwrap();
    let store =
        qsm_store::Store::new(std::sync::Arc::new(catalog), std::sync::Arc::new(pool), "test")
            .unwrap();
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    let mut committed = Vec::new();
    let mut error = None;
    for i in 0..100u64 {
        let bytes = common::data(100_000, i).iter().map(|b| b ^ (i as u8)).collect::<Vec<u8>>();
        let frames = common::frames(&bytes, 16 * 1024);
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
        if let Err(e) = batch
            .add(common::object(fs, &format!("/f{i}"), bytes.len()), &refs, 1)
            .and_then(|_| batch.commit(1))
        {
            error = Some(e);
            break;
        }
        committed.push((
            store.catalog().versions(fs, format!("/f{i}").as_bytes()).unwrap()[0].id,
            bytes,
        ));
    }
    let error = error.expect("a 2 MiB pool took 10 MB");
    assert!(error.to_string().contains("full") || error.to_string().contains("space"), "{error}");
    drop(batch);
    assert!(!committed.is_empty());
    for (id, bytes) in &committed {
        assert_eq!(&common::restore(&store, *id), bytes);
    }
    assert!(store.check().unwrap().problems.is_empty());
}

/// Deduplication at the store: a chunk sent once is referenced by id by later objects,
/// within the batch (even when the object that sent it was abandoned: its frame is in the
/// pool all the same) and after commit; an id the scope does not hold is refused and nothing
/// of the object is committed.
#[test]
fn keyed_chunks_are_referenced_by_id_and_unknown_ids_are_refused() {
    use qsm_catalog::{ChunkKey, DedupScopeId};
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), None);
    let node = store.catalog().nodes().unwrap()[0].id;
    let scope = store.catalog().dedup_scope(node, [5; 32]).unwrap().id;
    let bytes = data(50_000, 3);
    let frame = &common::frames(&bytes, 1 << 20)[0];
    let key = |hash: u8| ChunkKey { hash: [hash; 32], scope: Some(scope), sealed: false };

    let mut batch = store.batch(TxnLimits::default()).unwrap();
    // Sent inside an object that is then abandoned (its file changed while being read).
    batch.begin_object(common::object(fs, "/torn", bytes.len()), 0, 1).unwrap();
    batch.append_chunk(frame, key(1)).unwrap();
    batch.abandon_object();
    // Referenced by the next object: resolved to the abandoned object's frame.
    batch.begin_object(common::object(fs, "/a", bytes.len()), 0, 1).unwrap();
    batch.reference_chunk([1; 32], scope, false).unwrap();
    batch.end_object().unwrap();
    let first = batch.finish(2).unwrap();
    assert_eq!(restore(&store, first.objects[0]), bytes);

    // After commit, through the catalog; twice in one object.
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    batch.begin_object(common::object(fs, "/b", 2 * bytes.len()), 0, 3).unwrap();
    batch.reference_chunk([1; 32], scope, false).unwrap();
    batch.reference_chunk([1; 32], scope, false).unwrap();
    batch.end_object().unwrap();
    let second = batch.finish(4).unwrap();
    assert_eq!(restore(&store, second.objects[0]), [bytes.clone(), bytes.clone()].concat());
    assert_eq!(store.catalog().stats().unwrap().chunks, 1, "one chunk, three references");

    // Unknown ids, and ids of another scope, are refused by name.
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    batch.begin_object(common::object(fs, "/c", bytes.len()), 0, 5).unwrap();
    let e = batch.reference_chunk([2; 32], scope, false).unwrap_err().to_string();
    assert!(e.contains("/c") && e.contains(&"02".repeat(32)), "{e}");
    let e = batch.reference_chunk([1; 32], DedupScopeId(scope.0 + 1), false).unwrap_err();
    assert!(e.to_string().contains("does not hold"), "{e}");
    // A plaintext chunk does not stand in for a sealed one of the same id.
    let e = batch.reference_chunk([1; 32], scope, true).unwrap_err();
    assert!(e.to_string().contains("does not hold"), "{e}");
    drop(batch);
    assert!(store.check().unwrap().problems.is_empty());
}

/// Issue 23: a lost or mistyped catalog used to be replaced by an empty one, after which orphan
/// removal deleted every container of the pool.
#[test]
fn a_pool_with_data_and_a_new_catalog_is_refused_and_left_intact() {
    let dir = TempDir::new().unwrap();
    let (catalog, pool) = (dir.path().join("catalog.db"), dir.path().join("pool"));
    let store = qsm_store::open_local(&catalog, &pool, "main").unwrap();
    let node = store
        .catalog()
        .register_node("n", "h", qsm_catalog::standard_domain(store.catalog().as_ref()).unwrap())
        .unwrap();
    let fs = store.catalog().filespace(node, "/data").unwrap();
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    add(&mut batch, fs, "/a", &data(200_000, 1));
    batch.finish(1).unwrap();
    let before = store.pool().containers().unwrap();
    assert!(!before.is_empty());
    drop(store);

    // The catalog moved away: refused, and no empty catalog is left in its place.
    std::fs::rename(&catalog, dir.path().join("moved.db")).unwrap();
    let err = qsm_store::open_local(&catalog, &pool, "main").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, qsm_store::StoreError::ForeignCatalog { .. }), "{text}");
    for part in
        ["'main'", "1 containers", "catalog.db (missing)", "restore-db", "written under catalog"]
    {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert!(!catalog.exists(), "an empty catalog was created in place of the lost one");

    // Another, existing catalog (a mistyped --catalog): refused the same way.
    let other = dir.path().join("other.db");
    drop(qsm_catalog::SqliteCatalog::open(&other).unwrap());
    let err = qsm_store::open_local(&other, &pool, "main").unwrap_err();
    assert!(matches!(err, qsm_store::StoreError::ForeignCatalog { .. }), "{err}");

    // The pool is untouched, and its own catalog opens it again, data and all.
    std::fs::rename(dir.path().join("moved.db"), &catalog).unwrap();
    let store = qsm_store::open_local(&catalog, &pool, "main").unwrap();
    assert_eq!(store.pool().containers().unwrap(), before);
    assert!(store.remove_orphans().unwrap().is_empty());
    assert!(store.check().unwrap().problems.is_empty());
}

/// A catalog that knows the pool while the pool names another catalog is an older copy put
/// back by hand: it opens, but reclamation and orphan removal wait for an audit.
#[test]
fn a_copy_of_another_catalog_opens_as_restored() {
    let dir = TempDir::new().unwrap();
    let (catalog, pool) = (dir.path().join("catalog.db"), dir.path().join("pool"));
    let store = qsm_store::open_local(&catalog, &pool, "main").unwrap();
    let id = store.catalog().state_value(qsm_store::CATALOG_ID).unwrap();
    assert!(id.is_some_and(|id| id != 0), "the catalog has no id");
    assert_eq!(
        store.pool().catalog().unwrap().map(|t| t.id),
        id.map(|id| format!("{:016x}", id as u64))
    );
    store.catalog().set_state_value(qsm_store::CATALOG_ID, 42).unwrap();
    drop(store);
    let store = qsm_store::open_local(&catalog, &pool, "main").unwrap();
    let err = store.remove_orphans().unwrap_err();
    assert!(matches!(err, qsm_store::StoreError::Restored(_)), "{err}");
    assert!(matches!(store.reclaim(0.5).unwrap_err(), qsm_store::StoreError::Restored(_)));
    assert_eq!(store.pool().catalog().unwrap().map(|t| t.id).as_deref(), Some("000000000000002a"));
}

/// Containers and the pool's directories are owner-only whatever the umask (issue 23).
#[test]
fn pool_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new().unwrap();
    let pool = dir.path().join("pool");
    std::fs::create_dir(&pool).unwrap();
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = qsm_store::open_local(&dir.path().join("catalog.db"), &pool, "main").unwrap();
    let node = store
        .catalog()
        .register_node("n", "h", qsm_catalog::standard_domain(store.catalog().as_ref()).unwrap())
        .unwrap();
    let fs = store.catalog().filespace(node, "/data").unwrap();
    let mut batch = store.batch(TxnLimits::default()).unwrap();
    add(&mut batch, fs, "/a", &data(10_000, 2));
    batch.finish(1).unwrap();
    let mut seen = 0;
    let mut stack = vec![pool.clone()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let expected = if meta.is_dir() { 0o700 } else { 0o600 };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if p.extension().is_some_and(|e| e == "qsmc") {
            seen += 1;
        }
        if meta.is_dir() || p.extension().is_some_and(|e| e == "qsmc") || p.ends_with("CATALOG") {
            assert_eq!(meta.permissions().mode() & 0o777, expected, "{}", p.display());
        }
    }
    assert!(seen > 0, "no container was found to check");
}

/// A batch that fills several containers leaves the catalog knowing each one's whole size:
/// an audit finds no bytes past what the catalog recorded (the index of every container the
/// writer sealed on the way was once reported so).
#[test]
fn containers_sealed_on_the_way_are_recorded_whole() {
    let dir = TempDir::new().unwrap();
    let (store, fs) = open_store(dir.path(), Some(300_000));
    let limits = TxnLimits { group_max: 4, byte_limit: 1 << 30 };
    let mut batch = store.batch(limits).unwrap();
    for i in 0..20 {
        add(&mut batch, fs, &format!("/f{i:02}"), &data(100_000, i));
    }
    let ids = batch.finish(7).unwrap().objects;
    let containers = store.catalog().containers(store.catalog().pools().unwrap()[0].id).unwrap();
    assert!(containers.len() >= 4, "{containers:?}");
    let report = store.audit(&qsm_store::AuditOptions::default()).unwrap();
    assert!(report.unrecorded_tails.is_empty(), "{:?}", report.unrecorded_tails);
    assert!(report.damaged.is_empty() && report.unknown_containers.is_empty());
    assert!(containers.iter().all(|c| c.sealed), "{containers:?}");

    // The containers reclamation writes are recorded whole too.
    let mut t = store.catalog().begin().unwrap();
    for &id in ids.iter().step_by(2) {
        t.delete_object(id, qsm_catalog::model::now()).unwrap();
    }
    t.commit().unwrap();
    assert!(!store.reclaim(0.99).unwrap().is_empty());
    let report = store.audit(&qsm_store::AuditOptions::default()).unwrap();
    assert!(report.unrecorded_tails.is_empty(), "after reclaim: {:?}", report.unrecorded_tails);
    assert!(report.damaged.is_empty() && report.unknown_containers.is_empty());
}
