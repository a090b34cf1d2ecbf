//! Catalog backup and restore against a real catalog and pool: a restore of a copy older
//! than a reclamation marks the chunks it places in reclaimed containers damaged, makes client
//! dedup caches stale, keeps the replaced catalog, and keeps reclamation off until released.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use qsm_catalog::{Attributes, NewObject, ObjectKind, ObjectType};
use qsm_codec::{Compression, FrameEncoder};
use qsm_server::{ServerConfig, dbcopy};
use tempfile::TempDir;

fn frames(seed: u8) -> Vec<Vec<u8>> {
    let mut enc = FrameEncoder::new(Compression::parse("none").unwrap()).unwrap();
    (0..4)
        .map(|i| {
            let raw: Vec<u8> = (0..20_000u32).map(|k| (k as u8) ^ seed ^ (i as u8)).collect();
            let mut out = Vec::new();
            let h = enc.encode(&raw, &mut out).unwrap();
            out.truncate(h.frame_len());
            out
        })
        .collect()
}

#[test]
fn restoring_a_copy_older_than_a_reclamation_marks_what_it_lost() {
    let dir = TempDir::new().unwrap();
    let config = ServerConfig { data_dir: dir.path().join("srv"), ..ServerConfig::default() };
    std::fs::create_dir_all(&config.data_dir).unwrap();
    let (catalog_path, pool_path) = (config.catalog_path(), config.pool_path());
    let epoch_before;
    {
        let store = qsm_store::open_local(&catalog_path, &pool_path, "primary").unwrap();
        let cat = store.catalog();
        let d = qsm_catalog::standard_domain(cat.as_ref()).unwrap();
        let node = cat.register_node("alpha", "h", d).unwrap();
        let fs = cat.filespace(node, "/data").unwrap();
        let mut batch = store.batch(qsm_store::TxnLimits::default()).unwrap();
        let mut ids = Vec::new();
        for i in 0..6u8 {
            let f = frames(i);
            let refs: Vec<&[u8]> = f.iter().map(Vec::as_slice).collect();
            let object = NewObject {
                filespace: fs,
                path: format!("/f{i}").into_bytes(),
                kind: ObjectKind::Backup,
                object_type: ObjectType::File,
                attrs: Attributes { size: 80_000, ..Attributes::default() },
                mgmt_class: None,
                description: None,
                retain_until: None,
                chunks: Vec::new(),
                replica: None,
            };
            batch.add(object, &refs, 1).unwrap();
        }
        ids.extend(batch.finish(1).unwrap().objects);
        let copy = dbcopy::backup(cat.as_ref(), &config, None).unwrap();
        assert!(copy.entry.path.starts_with(config.data_dir.join(dbcopy::BACKUP_DIR)));
        epoch_before = cat.dedup_epoch().unwrap();
        // After the copy: most versions expire and reclamation rewrites their container.
        let mut t = cat.begin().unwrap();
        for id in &ids[1..] {
            t.delete_object(*id, qsm_catalog::model::now()).unwrap();
        }
        t.commit().unwrap();
        assert!(!store.reclaim(0.9).unwrap().is_empty(), "nothing reclaimed");
        assert!(store.missing_containers().unwrap().is_empty(), "the live catalog misses nothing");
    }
    // A server holding the lock refuses the restore.
    let held = dbcopy::lock(&config.data_dir).unwrap();
    let refused = dbcopy::restore(&config, None).unwrap_err();
    assert!(refused.contains("another qsm server"), "{refused}");
    drop(held);

    let restored = dbcopy::restore(&config, None).unwrap();
    assert_eq!(restored.objects, 6);
    let (chunks, versions) = restored.missing.clone().unwrap();
    assert!(chunks >= 4 && versions >= 1, "missing chunks {chunks}, versions {versions}");
    let replaced = restored.replaced.expect("the replaced catalog was not kept");
    assert!(replaced.exists());

    let store = qsm_store::open_local(&catalog_path, &pool_path, "primary").unwrap();
    let cat = store.catalog();
    let stats = cat.stats().unwrap();
    assert_eq!(stats.damaged_chunks, chunks, "{stats:?}");
    assert!(cat.dedup_epoch().unwrap() > epoch_before + 1_000_000, "dedup caches could match");
    let err = store.reclaim(0.5).unwrap_err().to_string();
    assert!(err.contains("restored from a copy"), "{err}");
    let history = dbcopy::volhist(&config.data_dir).unwrap();
    let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["dbbackup", "dbrestore"]);
    // Released by an audit: reclamation runs again.
    let options = qsm_store::AuditOptions { release_unknown: true, ..Default::default() };
    let report = store.audit(&options).unwrap();
    assert!(report.released && !report.unknown_containers.is_empty(), "{report:?}");
    store.reclaim(0.5).unwrap();
}
