//! Catalog benchmark: insert rate of object versions in batched transactions, time to stream
//! the active inventory of a large filespace and to list every version, and bytes per object
//! version.
//!
//! `cargo run --release -p qsm-catalog --example catalog_bench -- [OBJECTS] [BATCH] [DIR]`
//! (defaults: 1,000,000 objects, 4,096 per transaction, a temporary directory). DIR may be a
//! `postgres://` URL instead: the same measurements on that (empty) PostgreSQL database, so
//! both backends are timed by one program. Each object
//! is a file with one chunk and a path shaped like a source tree's
//! (`/src/projNN/dirNNN/subNN/file_NNNNNNN.ext`, about 40 bytes), inserted in directory-walk
//! order as a backup inserts them. (Paths scattered across the tree in every transaction
//! dirty one index page per object and run at about 65k/s on a million objects.)

use std::error::Error;
use std::time::Instant;

use qsm_catalog::{
    AnyCatalog, Attributes, Catalog, ContainerId, NewChunk, NewObject, ObjectChunk, ObjectKind,
    ObjectType, SqliteCatalog,
};

/// Versions whose chunk lists are read, and chunk ids looked up.
const POINT_READS: usize = 20_000;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let objects: u64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1_000_000);
    let batch: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(4096);
    let target = args.get(3).filter(|a| qsm_catalog::is_postgres(a));
    let path = match target {
        Some(_) => std::path::PathBuf::new(),
        None => tempfile_dir(args.get(3))?.join("catalog.db"),
    };
    let any = match target {
        Some(url) => AnyCatalog::open(url)?,
        None => {
            let _ = std::fs::remove_file(&path);
            AnyCatalog::Sqlite(SqliteCatalog::open(&path)?)
        }
    };
    let cat = any.catalog();
    let domain = cat.define_domain("standard", "")?;
    let node = cat.register_node("bench", "h", domain)?;
    let fs = cat.filespace(node, "/")?;
    let pool = cat.define_pool("disk", "dir", "/pool")?;
    let container = ContainerId(1);
    let mut t = cat.begin()?;
    t.add_container(pool, container)?;
    t.commit()?;

    let mut path_total = 0u64;
    let start = Instant::now();
    let mut i = 0u64;
    while i < objects {
        let mut t = cat.begin()?;
        for _ in 0..batch.min(objects - i) {
            // Paths in the order a directory walk produces them, as a backup inserts them.
            let path = format!(
                "/src/proj{:02}/dir{:03}/sub{:02}/file_{:07}.{}",
                i / 100_000,
                (i / 100) % 1000,
                (i / 10) % 10,
                i,
                ["c", "h", "rs", "txt"][(i % 4) as usize]
            );
            path_total += path.len() as u64;
            let object = NewObject {
                filespace: fs,
                path: path.into_bytes(),
                kind: ObjectKind::Backup,
                object_type: ObjectType::File,
                attrs: Attributes {
                    size: 10_000 + i % 50_000,
                    mtime_ns: 1_700_000_000_000_000_000 + i as i64 * 1_000_003,
                    ctime_ns: 1_700_000_000_000_000_000 + i as i64 * 1_000_007,
                    mode: 0o100644,
                    uid: 1000,
                    gid: 1000,
                    link_target: None,
                    ino: i + 2,
                    ..Attributes::default()
                },
                mgmt_class: None,
                description: None,
                retain_until: None,
                chunks: vec![ObjectChunk::New(NewChunk {
                    container,
                    offset: i * 4000,
                    stored_len: 4000,
                    raw_len: 10_000,
                    codec: 2,
                })],
                replica: None,
            };
            t.insert_object(&object, 1_700_000_000 + (i / batch) as i64)?;
            i += 1;
        }
        t.commit()?;
    }
    let insert_secs = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut streamed = 0u64;
    cat.for_each_active(fs, &mut |_| {
        streamed += 1;
        Ok(())
    })?;
    let stream_secs = start.elapsed().as_secs_f64();
    // Every version, as point-in-time restore and `query backup --inactive` read them: in
    // pages along the two partial indexes (issue 23), never one long read transaction.
    let start = Instant::now();
    let mut listed = 0u64;
    cat.for_each_version(fs, &mut |_| {
        listed += 1;
        Ok(())
    })?;
    let list_secs = start.elapsed().as_secs_f64();
    // A restore's and a backup's point reads: the chunk list of each of the first versions,
    // and dedup lookups (none found: the chunks have no keyed id) in batches as a client asks.
    let mut ids = Vec::new();
    cat.for_each_active(fs, &mut |v| {
        if ids.len() < POINT_READS {
            ids.push(v.id);
        }
        Ok(())
    })?;
    let start = Instant::now();
    for id in &ids {
        cat.object_chunks(*id)?;
    }
    let chunks_secs = start.elapsed().as_secs_f64();
    let scope = cat.dedup_scope(node, [7; 32])?.id;
    let hashes: Vec<[u8; 32]> =
        (0..POINT_READS as u64).map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes()).collect();
    let start = Instant::now();
    for batch in hashes.chunks(1000) {
        cat.find_chunks(scope, false, batch)?;
    }
    let find_secs = start.elapsed().as_secs_f64();
    let bytes = match any {
        AnyCatalog::Sqlite(cat) => {
            drop(cat);
            // Checkpoint the WAL so the main file holds everything, then measure it.
            let cat = SqliteCatalog::open(&path)?;
            cat.raw_execute_for_tests("PRAGMA wal_checkpoint(TRUNCATE)")?;
            let stats = cat.stats()?;
            std::fs::metadata(&path)?.len().max(stats.database_bytes)
        }
        AnyCatalog::Postgres(cat) => cat.stats()?.database_bytes,
    };

    println!("| measurement | value |");
    println!("|---|---:|");
    println!(
        "| object versions | {objects} ({batch} per transaction, one chunk each, paths {:.1} bytes on average) |",
        path_total as f64 / objects as f64
    );
    println!(
        "| insert rate | **{:.0} object versions/s** ({insert_secs:.1} s) |",
        objects as f64 / insert_secs
    );
    println!(
        "| stream the active inventory | **{stream_secs:.2} s** for {streamed} objects ({:.0}/s) |",
        streamed as f64 / stream_secs
    );
    println!(
        "| list every version | **{list_secs:.2} s** for {listed} versions ({:.0}/s) |",
        listed as f64 / list_secs
    );
    println!(
        "| chunk lists of versions (object_chunks) | **{chunks_secs:.2} s** for {} ({:.0}/s) |",
        ids.len(),
        ids.len() as f64 / chunks_secs
    );
    println!(
        "| dedup lookups (find_chunks, 1,000 per call) | **{find_secs:.2} s** for {} ({:.0}/s) |",
        hashes.len(),
        hashes.len() as f64 / find_secs
    );
    println!(
        "| catalog size | {bytes} bytes = **{:.0} bytes per object version** (with its chunk) |",
        bytes as f64 / objects as f64
    );
    Ok(())
}

fn tempfile_dir(arg: Option<&String>) -> Result<std::path::PathBuf, Box<dyn Error>> {
    let dir = match arg {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("qsm-catalog-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
