//! Catalog backup and restore benchmark (issue 7), run by `bench/dbbackup.sh`.
//!
//! `dbbackup_bench DB WORKDIR` takes `qsm admin backup db`'s backup of the catalog DB (the
//! server's own code, `qsm_server::dbcopy::backup`) twice: once idle, once while a writer
//! thread commits backup versions into the same catalog as fast as it can (transactions of
//! 1,000), and reports the writer's rate during the backup against its rate alone; then
//! restores the copy as `qsm server restore-db` does. Prints one JSON line.

use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use qsm_catalog::{Attributes, Catalog, NewObject, ObjectKind, ObjectType, SqliteCatalog};
use qsm_server::{ServerConfig, dbcopy};

fn writer(
    cat: Arc<SqliteCatalog>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Result<(), String> {
    let node = cat.nodes().map_err(|e| e.to_string())?[0].id;
    let fs = cat.filespace(node, "/bench-writer").map_err(|e| e.to_string())?;
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut t = cat.begin().map_err(|e| e.to_string())?;
        for _ in 0..1000 {
            k += 1;
            let object = NewObject {
                filespace: fs,
                path: format!("w/{k:09}").into_bytes(),
                kind: ObjectKind::Backup,
                object_type: ObjectType::File,
                attrs: Attributes::default(),
                mgmt_class: None,
                description: None,
                retain_until: None,
                chunks: Vec::new(),
                replica: None,
            };
            t.insert_object(&object, qsm_catalog::now()).map_err(|e| e.to_string())?;
        }
        t.commit().map_err(|e| e.to_string())?;
        done.fetch_add(1000, Ordering::Relaxed);
    }
    Ok(())
}

fn rate_alone(cat: &Arc<SqliteCatalog>, seconds: f64) -> Result<f64, Box<dyn Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let h = {
        let (c, s, d) = (Arc::clone(cat), Arc::clone(&stop), Arc::clone(&done));
        std::thread::spawn(move || writer(c, s, d))
    };
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    h.join().map_err(|_| "writer panicked")??;
    Ok(done.load(Ordering::Relaxed) as f64 / seconds)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, db, work] = args.as_slice() else {
        return Err("usage: dbbackup_bench DB WORKDIR".into());
    };
    let work = Path::new(work);
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work)?;
    let config = ServerConfig {
        data_dir: work.join("srv"),
        catalog: Some(db.into()),
        ..ServerConfig::default()
    };
    std::fs::create_dir_all(&config.data_dir)?;
    let cat = Arc::new(SqliteCatalog::open(Path::new(db))?);
    let catalog_bytes = std::fs::metadata(db)?.len();

    let started = Instant::now();
    let idle = dbcopy::backup(cat.as_ref(), &config, None)?;
    let idle_s = started.elapsed().as_secs_f64();

    // The writer alone, before and after the busy backup: the rate it reaches depends on the
    // catalog's size and its write-ahead log, which grow as it runs.
    let alone_before = rate_alone(&cat, idle_s.clamp(2.0, 30.0))?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let h = {
        let (c, s, d) = (Arc::clone(&cat), Arc::clone(&stop), Arc::clone(&done));
        std::thread::spawn(move || writer(c, s, d))
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = done.load(Ordering::Relaxed);
    let started = Instant::now();
    let busy = dbcopy::backup(cat.as_ref(), &config, None)?;
    let busy_s = started.elapsed().as_secs_f64();
    let during = (done.load(Ordering::Relaxed) - before) as f64 / busy_s;
    // The snapshot alone (the online backup API), to see which part slows the writer.
    let before = done.load(Ordering::Relaxed);
    let started = Instant::now();
    let snap = work.join("snapshot-only.db");
    cat.snapshot(&snap)?;
    let snapshot_s = started.elapsed().as_secs_f64();
    let during_snapshot = (done.load(Ordering::Relaxed) - before) as f64 / snapshot_s;
    std::fs::remove_file(&snap)?;
    stop.store(true, Ordering::Relaxed);
    h.join().map_err(|_| "writer panicked")??;
    let alone = (alone_before + rate_alone(&cat, busy_s.clamp(2.0, 30.0))?) / 2.0;
    drop(cat);

    let restore_config =
        ServerConfig { data_dir: work.join("restored"), catalog: None, ..ServerConfig::default() };
    std::fs::create_dir_all(&restore_config.data_dir)?;
    let started = Instant::now();
    let restored = dbcopy::restore(&restore_config, Some(&busy.entry.path))?;
    let restore_s = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "catalog_bytes": catalog_bytes,
            "copy_bytes": idle.entry.catalog_bytes,
            "backup_bytes": idle.entry.bytes,
            "idle_seconds": idle_s,
            "busy_seconds": busy_s,
            "writer_per_s_during": during,
            "writer_per_s_alone": alone,
            "snapshot_seconds": snapshot_s,
            "writer_per_s_during_snapshot": during_snapshot,
            "restore_seconds": restore_s,
            "restored_versions": restored.objects,
        })
    );
    Ok(())
}
