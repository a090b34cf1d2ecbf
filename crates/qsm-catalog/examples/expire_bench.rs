//! Inventory expiration benchmark (issue 7), run by `bench/expire.sh`.
//!
//! `expire_bench gen DB VERSIONS [FILESPACES]` makes a catalog of VERSIONS object versions
//! over FILESPACES filespaces (default 20, one node each): every path has five versions,
//! backed up 100, 80, 60, 40 and 20 days ago, so four are inactive (since 80, 60, 40 and 20
//! days) and one active; each version has one chunk. Under the default copy group (2 / 1 /
//! 30 / 60) three of the five expire: 60% of the versions.
//!
//! `expire_bench expire DB RESOURCE` runs the expiration engine the server runs
//! (`qsm_catalog::expire::expire_inventory`, 2,000 deletions per transaction) with RESOURCE
//! workers and prints one JSON line: versions examined and deleted, seconds, deletions per
//! minute.

use std::error::Error;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use qsm_catalog::expire::{ExpireOptions, ExpireProgress, expire_inventory};
use qsm_catalog::{
    Attributes, Catalog, ContainerId, NewChunk, NewObject, ObjectChunk, ObjectKind, ObjectType,
    SqliteCatalog,
};

const DAY: i64 = 86_400;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: expire_bench gen DB VERSIONS [FILESPACES] | expire DB RESOURCE";
    match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("gen"), Some(db)) => {
            let versions: u64 = args.get(3).ok_or(usage)?.parse()?;
            let filespaces: u64 = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(20);
            generate(db.as_ref(), versions, filespaces)
        }
        (Some("expire"), Some(db)) => {
            let resource: usize = args.get(3).ok_or(usage)?.parse()?;
            expire(db.as_ref(), resource)
        }
        _ => Err(usage.into()),
    }
}

fn generate(db: &std::path::Path, versions: u64, filespaces: u64) -> Result<(), Box<dyn Error>> {
    let _ = std::fs::remove_file(db);
    let cat = SqliteCatalog::open(db)?;
    let domain = cat.define_domain("standard", "")?;
    // Versions-exist applies at backup time: the catalog is made under a class keeping every
    // version, then tightened to TSM's defaults (2 / 1 / 30 / 60) for expiration to apply,
    // as after an administrator's policy change.
    let keep_all = qsm_catalog::BackupCopyGroup {
        versions_exist: qsm_catalog::expire::NO_LIMIT,
        ..Default::default()
    };
    let class = cat.define_mgmt_class(domain, "standard", keep_all, Default::default())?;
    let pool = cat.define_pool("disk", "dir", "/pool")?;
    let container = ContainerId(1);
    let mut t = cat.begin()?;
    t.add_container(pool, container)?;
    t.commit()?;
    let now = qsm_catalog::now();
    let paths = versions / 5;
    let per_fs = paths.div_ceil(filespaces);
    let started = Instant::now();
    let mut offset = 48u64;
    let mut made = 0u64;
    for f in 0..filespaces {
        let node = cat.register_node(&format!("node{f:03}"), "h", domain)?;
        let fs = cat.filespace(node, "/home")?;
        let mut p = 0;
        while p < per_fs && made < paths {
            let mut t = cat.begin()?;
            // Five versions of 800 paths per transaction, oldest first as backups made them.
            for _ in 0..800 {
                if p >= per_fs || made >= paths {
                    break;
                }
                let path = format!("dir{:04}/sub{:02}/file_{p:07}.txt", p / 1000, p % 97);
                for age in [100, 80, 60, 40, 20] {
                    offset += 4096;
                    let object = NewObject {
                        filespace: fs,
                        path: path.clone().into_bytes(),
                        kind: ObjectKind::Backup,
                        object_type: ObjectType::File,
                        attrs: Attributes { size: 4000, mode: 0o100644, ..Attributes::default() },
                        mgmt_class: None,
                        description: None,
                        retain_until: None,
                        chunks: vec![ObjectChunk::New(NewChunk {
                            container,
                            offset,
                            stored_len: 4000,
                            raw_len: 4000,
                            codec: 0,
                        })],
                        replica: None,
                    };
                    t.insert_object(&object, now - age * DAY)?;
                }
                p += 1;
                made += 1;
            }
            t.commit()?;
        }
    }
    cat.update_mgmt_class(class, Default::default(), Default::default())?;
    eprintln!(
        "{} versions in {} filespaces in {:.1} s; catalog {} MB",
        made * 5,
        filespaces,
        started.elapsed().as_secs_f64(),
        std::fs::metadata(db)?.len() / 1_000_000
    );
    Ok(())
}

fn expire(db: &std::path::Path, resource: usize) -> Result<(), Box<dyn Error>> {
    let cat = SqliteCatalog::open(db)?;
    let cancel = AtomicBool::new(false);
    let progress = ExpireProgress::default();
    let options =
        ExpireOptions { resource, ..ExpireOptions::new(qsm_catalog::now(), &cancel, &progress) };
    let started = Instant::now();
    let r = expire_inventory(&cat, &options)?;
    let seconds = started.elapsed().as_secs_f64();
    let deleted = r.backups + r.archives;
    println!(
        "{{\"resource\": {resource}, \"examined\": {}, \"deleted\": {deleted}, \"seconds\": {seconds:.2}, \"per_minute\": {:.0}}}",
        r.examined,
        deleted as f64 / seconds * 60.0
    );
    Ok(())
}
