//! Expiration and reclamation while backups run (issues 6 and 7): whatever the interleaving,
//! no committed active version loses a chunk. The backups deduplicate, and each path's
//! content alternates between two variants, so expiration keeps killing chunks that the next
//! version stores again: the upsert that revives a dead chunk races reclamation deleting it.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{data, open_store};
use qsm_catalog::expire::{ExpireOptions, ExpireProgress, expire_inventory};
use qsm_catalog::{ChunkKey, ObjectKind};
use qsm_store::TxnLimits;
use tempfile::TempDir;

const PATHS: usize = 24;
const ROUNDS: u64 = 30;

fn content(path: usize, round: u64) -> (Vec<u8>, [u8; 32]) {
    let seed = path as u64 * 2 + round % 2;
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&seed.to_le_bytes());
    (data(3000 + path * 700, seed), id)
}

#[test]
fn expiration_and_reclamation_beside_backups_lose_no_active_version() {
    let dir = TempDir::new().unwrap();
    // Small containers, so reclamation always has containers to rewrite.
    let (store, fs) = open_store(dir.path(), Some(64 << 10));
    let store = &store;
    let node = store.catalog().nodes().unwrap()[0].id;
    let scope = store.catalog().dedup_scope(node, [1; 32]).unwrap().id;
    let latest: Mutex<HashMap<usize, u64>> = Mutex::new(HashMap::new());
    let done = AtomicBool::new(false);
    let (mut expired, mut reclaimed, mut refused) = (0u64, 0usize, 0usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..ROUNDS {
                let mut batch =
                    store.batch(TxnLimits { group_max: 8, byte_limit: u64::MAX }).unwrap();
                for path in 0..PATHS {
                    let (bytes, id) = content(path, round);
                    let frame = &common::frames(&bytes, 1 << 20)[0];
                    let object = common::object(fs, &format!("/f{path:02}"), bytes.len());
                    batch.begin_object(object, bytes.len() as u64, round as i64).unwrap();
                    batch
                        .append_chunk(
                            frame,
                            ChunkKey { hash: id, scope: Some(scope), sealed: false },
                        )
                        .unwrap();
                    batch.end_object().unwrap();
                }
                batch.finish(round as i64).unwrap();
                let mut l = latest.lock().unwrap();
                for path in 0..PATHS {
                    l.insert(path, round);
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        let expirer = s.spawn(|| {
            let mut deleted = 0;
            let cancel = AtomicBool::new(false);
            while !done.load(Ordering::Relaxed) {
                let progress = ExpireProgress::default();
                // Far ahead: every inactive version is past its retention.
                let now = qsm_catalog::now() + 1000 * 86_400;
                let options = ExpireOptions {
                    resource: 2,
                    batch: 7,
                    ..ExpireOptions::new(now, &cancel, &progress)
                };
                let r = expire_inventory(store.catalog().as_ref(), &options).unwrap();
                deleted += r.backups;
            }
            deleted
        });
        let reclaimer = s.spawn(|| {
            let (mut ok, mut refused) = (0, 0);
            while !done.load(Ordering::Relaxed) {
                // A chunk revived by a backup between reclamation's listing and its commit
                // makes the commit refuse (the chunk is referenced again): nothing changes,
                // and the next pass tries again.
                match store.reclaim(0.9) {
                    Ok(r) => ok += r.len(),
                    Err(e) if e.to_string().contains("still referenced") => refused += 1,
                    Err(e) => panic!("reclamation failed: {e}"),
                }
            }
            (ok, refused)
        });
        expired = expirer.join().unwrap();
        (reclaimed, refused) = reclaimer.join().unwrap();
    });
    // Once more each, quietly, then everything must hold.
    let cancel = AtomicBool::new(false);
    let progress = ExpireProgress::default();
    let now = qsm_catalog::now() + 1000 * 86_400;
    let options = ExpireOptions { batch: 100, ..ExpireOptions::new(now, &cancel, &progress) };
    expired += expire_inventory(store.catalog().as_ref(), &options).unwrap().backups;
    reclaimed += store.reclaim(0.9).unwrap().len();
    eprintln!(
        "expired {expired} versions, reclaimed {reclaimed} containers, {refused} reclamations refused"
    );
    assert!(
        expired > 0 && reclaimed > 0,
        "the race was not run: {expired} expired, {reclaimed} reclaimed"
    );
    // Refused reclamations left their copies behind, unreferenced: orphans, now removable.
    store.remove_orphans().unwrap();
    let report = store.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let catalog = store.catalog();
    let latest = latest.into_inner().unwrap();
    for path in 0..PATHS {
        let versions = catalog.versions(fs, format!("/f{path:02}").as_bytes()).unwrap();
        let active: Vec<_> =
            versions.iter().filter(|v| v.active && v.kind == ObjectKind::Backup).collect();
        assert_eq!(active.len(), 1, "/f{path:02}");
        assert_eq!(
            versions.len(),
            1,
            "/f{path:02}: inactive versions left after the last expiration"
        );
        let (expected, _) = content(path, latest[&path]);
        assert_eq!(common::restore(store, active[0].id), expected, "/f{path:02}");
    }
}
