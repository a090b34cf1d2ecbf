//! Catalog backups and restores (TSM's `BACKUP DB` / `dsmserv RESTORE DB`) and the volume
//! history that lists them.
//!
//! A backup is a consistent snapshot of the live catalog ([`qsm_catalog::Catalog::snapshot`],
//! SQLite's online backup API)
//! compressed with zstd as a QSM stream (`qsm info` and `qsm decompress` read it; every
//! quantum carries its checksum), written under a temporary name, synced, then renamed. The
//! volume history is a JSON-lines file in the data directory, not a catalog table: after a
//! restore the catalog is the older copy, and the history must still list the backups taken
//! after it.
//!
//! A restore runs with the server stopped (it takes the server's lock): the copy is
//! decompressed and verified beside the catalog, the current catalog is kept aside under a
//! new name, and the restored one is marked restored, so orphan removal keeps the containers
//! it does not know (the data of later backups) until an audit has reported them.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use qsm_catalog::{Catalog, SqliteCatalog};
use serde::{Deserialize, Serialize};

use crate::ServerConfig;

/// The volume history file in the data directory.
pub const VOLHIST: &str = "volhist.jsonl";
/// Where catalog backups go by default, in the data directory.
pub const BACKUP_DIR: &str = "dbbackup";
/// The server's lock file in the data directory: held while a server runs or a restore does.
pub const LOCK: &str = "server.lock";

/// One line of the volume history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolhistEntry {
    /// Seconds since the epoch.
    pub time: i64,
    /// "dbbackup" or "dbrestore".
    pub kind: String,
    /// The backup file (for a restore: the file restored from).
    pub path: PathBuf,
    /// Bytes of the backup file.
    pub bytes: u64,
    /// The catalog's schema version in the copy.
    pub schema: u32,
    /// Bytes of the catalog copied (uncompressed).
    #[serde(default)]
    pub catalog_bytes: u64,
    /// Free text: objects and chunks in the copy, or what a restore replaced.
    #[serde(default)]
    pub detail: String,
}

impl From<VolhistEntry> for qsm_proto::reports::VolhistRow {
    fn from(e: VolhistEntry) -> qsm_proto::reports::VolhistRow {
        qsm_proto::reports::VolhistRow {
            time: e.time,
            kind: e.kind,
            path: e.path.display().to_string(),
            bytes: e.bytes,
            schema: e.schema,
            catalog_bytes: e.catalog_bytes,
            detail: e.detail,
        }
    }
}

/// What a backup made.
#[derive(Debug, Clone)]
pub struct DbBackup {
    pub entry: VolhistEntry,
}

/// Holds the server's lock on `data_dir` while alive.
#[derive(Debug)]
pub struct ServerLock(#[allow(dead_code)] File);

/// Takes the lock on `data_dir` that one server (or one restore) holds while it runs.
pub fn lock(data_dir: &Path) -> Result<ServerLock, String> {
    let path = data_dir.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening the lock {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(ServerLock(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another qsm server (or catalog restore) is using {}: stop it first",
            data_dir.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("locking {}: {e}", path.display())),
    }
}

/// The volume history of `data_dir`, oldest first. A missing file is an empty history; a
/// line that cannot be read is an error naming it (the history is what a restore chooses
/// from: it must not be silently partial).
pub fn volhist(data_dir: &Path) -> Result<Vec<VolhistEntry>, String> {
    let path = data_dir.join(VOLHIST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

fn record(data_dir: &Path, entry: &VolhistEntry) -> Result<(), String> {
    let path = data_dir.join(VOLHIST);
    let line = serde_json::to_string(entry).map_err(|e| e.to_string())?;
    let new = !path.exists();
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    writeln!(f, "{line}")
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    // A new history's name is durable only once its directory is synced (issue 28: a power
    // cut lost the history of a catalog backup reported done).
    if new { sync_parent(&path) } else { Ok(()) }
}

fn sync_parent(path: &Path) -> Result<(), String> {
    qsm_types::durable::sync_parent(path)
        .map_err(|e| format!("syncing the directory of {}: {e}", path.display()))
}

/// Removes a temporary file when dropped, unless disarmed.
struct Temp(Option<PathBuf>);

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Where a backup asked for with `to` goes: a directory gets a new file named by the time.
fn destination(config: &ServerConfig, to: Option<&Path>, now: i64) -> Result<PathBuf, String> {
    let dir_default = config.data_dir.join(BACKUP_DIR);
    let (dir, name) = match to {
        Some(p) if p.is_dir() => (p.to_path_buf(), None),
        Some(p) => (
            p.parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            Some(p.to_path_buf()),
        ),
        None => (dir_default, None),
    };
    qsm_types::durable::create_dir_all(&dir, 0o700)
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = match name {
        Some(p) => p,
        None => {
            let base = format!("catalog-{now}");
            (0..)
                .map(|k| {
                    if k == 0 {
                        dir.join(format!("{base}.qsmdb"))
                    } else {
                        dir.join(format!("{base}-{k}.qsmdb"))
                    }
                })
                .find(|p| !p.exists())
                .unwrap_or_else(|| dir.join(format!("{base}.qsmdb")))
        }
    };
    if path.exists() {
        return Err(format!("{} exists: a catalog backup never overwrites a file", path.display()));
    }
    Ok(path)
}

/// Takes a catalog backup of the running server's `catalog` to `to` (a file or directory;
/// default DATA_DIR/dbbackup) and records it in the volume history.
pub fn backup(
    catalog: &dyn Catalog,
    config: &ServerConfig,
    to: Option<&Path>,
) -> Result<DbBackup, String> {
    let now = qsm_catalog::now();
    let dest = destination(config, to, now)?;
    let raw_path = dest.with_extension("snapshot-tmp");
    // Removed when done or on failure, but only once this backup made it.
    let made = catalog.snapshot(&raw_path);
    let raw = Temp(made.is_ok().then(|| raw_path.clone()));
    made.map_err(|e| format!("copying the catalog: {e}"))?;
    let copy =
        SqliteCatalog::open_at(&raw_path, 0).map_err(|e| format!("reading the copy: {e}"))?;
    let schema = copy.schema_version().map_err(|e| e.to_string())?;
    let stats = copy.stats().map_err(|e| e.to_string())?;
    drop(copy);
    let catalog_bytes = std::fs::metadata(&raw_path).map(|m| m.len()).unwrap_or_default();
    let partial_path = dest.with_extension("partial");
    let partial;
    {
        use std::os::unix::fs::OpenOptionsExt;
        let input =
            File::open(&raw_path).map_err(|e| format!("reading {}: {e}", raw_path.display()))?;
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial_path)
            .map_err(|e| format!("creating {}: {e}", partial_path.display()))?;
        partial = Temp(Some(partial_path.clone()));
        let mut out = BufWriter::with_capacity(1 << 20, out);
        let options = qsm_codec::CompressOptions {
            compression: qsm_codec::Compression::parse("zstd:3").map_err(|e| e.to_string())?,
            quantum_size: qsm_codec::DEFAULT_QUANTUM,
            // One thread: the server goes on serving backups while it copies its catalog,
            // and on a small machine compressing on every core starved them.
            threads: Some(1),
        };
        qsm_codec::compress(
            BufReader::with_capacity(1 << 20, input),
            &mut out,
            &options,
            &mut |_| {},
        )
        .map_err(|e| format!("compressing the catalog copy: {e}"))?;
        let file =
            out.into_inner().map_err(|e| format!("writing {}: {e}", partial_path.display()))?;
        file.sync_all().map_err(|e| format!("syncing {}: {e}", partial_path.display()))?;
    }
    std::fs::rename(&partial_path, &dest)
        .map_err(|e| format!("renaming to {}: {e}", dest.display()))?;
    sync_parent(&dest)?;
    drop(partial);
    drop(raw);
    let entry = VolhistEntry {
        time: now,
        kind: "dbbackup".into(),
        path: std::path::absolute(&dest).unwrap_or(dest.clone()),
        bytes: std::fs::metadata(&dest).map(|m| m.len()).unwrap_or_default(),
        schema,
        catalog_bytes,
        detail: format!("{} object versions, {} chunks", stats.objects, stats.chunks),
    };
    record(&config.data_dir, &entry)?;
    Ok(DbBackup { entry })
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The backup restored.
    pub from: PathBuf,
    /// When it was taken, if the volume history knows.
    pub taken: Option<i64>,
    /// Object versions in it.
    pub objects: u64,
    /// Where the catalog it replaced was kept.
    pub replaced: Option<PathBuf>,
    /// Chunks it places in containers the pool no longer has (reclaimed after the copy),
    /// marked damaged, and the versions using them; or why the pool was not checked.
    pub missing: Result<(u64, u64), String>,
}

/// Restores the catalog of the stopped server of `config` from `from`, or from the newest
/// backup in the volume history.
pub fn restore(config: &ServerConfig, from: Option<&Path>) -> Result<Restored, String> {
    let _lock = lock(&config.data_dir)?;
    let history = volhist(&config.data_dir)?;
    let backups: Vec<&VolhistEntry> = history.iter().filter(|e| e.kind == "dbbackup").collect();
    let from = match from {
        Some(p) => p.to_path_buf(),
        None => backups
            .iter()
            .rev()
            .find(|e| e.path.exists())
            .map(|e| e.path.clone())
            .ok_or_else(|| {
                format!(
                    "no catalog backup to restore: the volume history {} lists none that exists; give --from FILE",
                    config.data_dir.join(VOLHIST).display()
                )
            })?,
    };
    let taken = backups.iter().rev().find(|e| same_file(&e.path, &from)).map(|e| e.time);
    // A PostgreSQL catalog is loaded from a SQLite file made in the data directory.
    let target = match config.catalog_url() {
        Some(_) => config.data_dir.join("catalog-from-backup.db"),
        None => config.catalog_path(),
    };
    let restoring = Temp(Some(target.with_file_name(format!(
        "{}.restoring",
        target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    ))));
    let restoring_path = restoring.0.clone().unwrap_or_default();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", restoring_path.display()));
    }
    {
        let input = File::open(&from).map_err(|e| format!("opening {}: {e}", from.display()))?;
        use std::os::unix::fs::OpenOptionsExt;
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&restoring_path)
            .map_err(|e| format!("creating {}: {e}", restoring_path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, out);
        qsm_codec::decompress(
            BufReader::with_capacity(1 << 20, input),
            &mut out,
            None,
            &mut |_| {},
        )
        .map_err(|e| format!("{} is not a readable catalog backup: {e}", from.display()))?;
        let file =
            out.into_inner().map_err(|e| format!("writing {}: {e}", restoring_path.display()))?;
        file.sync_all().map_err(|e| format!("syncing {}: {e}", restoring_path.display()))?;
    }
    let objects = {
        let copy = SqliteCatalog::open(&restoring_path)
            .map_err(|e| format!("{} does not hold a catalog: {e}", from.display()))?;
        let report = copy.check().map_err(|e| e.to_string())?;
        if !report.problems.is_empty() {
            return Err(format!(
                "the catalog in {} is inconsistent, not restoring it: {}",
                from.display(),
                report.problems.join("; ")
            ));
        }
        copy.set_state_value(qsm_store::RESTORED_AT, qsm_catalog::now().max(1))
            .map_err(|e| e.to_string())?;
        // It gives out again the ids issued after it was taken: replication targets must
        // know it for another catalog.
        qsm_store::renew_incarnation(&copy).map_err(|e| e.to_string())?;
        // Clients' dedup caches describe the catalog as it was before: none may match this
        // one, now or after later rises (a counter stays far below the clock in µs).
        let epoch = copy.dedup_epoch().map_err(|e| e.to_string())? as i64;
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        copy.set_state_value("dedup_epoch", epoch.saturating_add(1).max(micros))
            .map_err(|e| e.to_string())?;
        copy.stats().map_err(|e| e.to_string())?.objects
    };
    // Containers reclaimed after the copy are gone from the pool: their chunks, as the copy
    // places them, are damaged (not offered for deduplication; their files sent again).
    let missing = mark_missing(&restoring_path, config);
    let (replaced, catalog_bytes) = match config.catalog_url() {
        Some(url) => restore_into_postgres(&url, config, &restoring_path)?,
        None => {
            let replaced = swap_sqlite(&restoring_path, &target)?;
            (replaced, std::fs::metadata(&target).map(|m| m.len()).unwrap_or_default())
        }
    };
    drop(restoring);
    let entry = VolhistEntry {
        time: qsm_catalog::now(),
        kind: "dbrestore".into(),
        path: std::path::absolute(&from).unwrap_or(from.clone()),
        bytes: std::fs::metadata(&from).map(|m| m.len()).unwrap_or_default(),
        schema: qsm_catalog::migrations::LATEST,
        catalog_bytes,
        detail: match &replaced {
            Some(p) => {
                format!("{objects} object versions; the catalog replaced is {}", p.display())
            }
            None => format!("{objects} object versions"),
        },
    };
    record(&config.data_dir, &entry)?;
    Ok(Restored { from, taken, objects, replaced, missing })
}

/// Puts the restored SQLite catalog at `restoring` in place of `target`, keeping the one it
/// replaces (with its write-ahead log) beside it; returns where.
fn swap_sqlite(restoring: &Path, target: &Path) -> Result<Option<PathBuf>, String> {
    let replaced = if target.exists() {
        let aside = PathBuf::from(format!("{}.replaced-{}", target.display(), qsm_catalog::now()));
        // The write-ahead log moves with its database, or the copy kept aside loses what
        // was in it.
        for suffix in ["", "-wal", "-shm"] {
            let old = PathBuf::from(format!("{}{suffix}", target.display()));
            if old.exists() {
                std::fs::rename(&old, format!("{}{suffix}", aside.display()))
                    .map_err(|e| format!("moving {} aside: {e}", old.display()))?;
            }
        }
        Some(aside)
    } else {
        None
    };
    std::fs::rename(restoring, target)
        .map_err(|e| format!("moving the restored catalog to {}: {e}", target.display()))?;
    sync_parent(target)?;
    Ok(replaced)
}

/// Replaces the content of the PostgreSQL catalog at `url` with the restored copy at
/// `restoring`, in one transaction, after keeping what it held as a SQLite file in the data
/// directory. Returns that file and the database's size.
fn restore_into_postgres(
    url: &str,
    config: &ServerConfig,
    restoring: &Path,
) -> Result<(Option<PathBuf>, u64), String> {
    let pg = qsm_catalog::PostgresCatalog::open(url).map_err(|e| e.to_string())?;
    let aside = config.data_dir.join(format!("catalog-replaced-{}.db", qsm_catalog::now()));
    pg.snapshot(&aside)
        .map_err(|e| format!("keeping the catalog being replaced in {}: {e}", aside.display()))?;
    let copy = SqliteCatalog::open(restoring).map_err(|e| e.to_string())?;
    qsm_catalog::copy::copy_catalog(&copy, &pg)
        .map_err(|e| format!("loading the restored catalog into {}: {e}", pg.url()))?;
    let bytes = pg.stats().map_err(|e| e.to_string())?.database_bytes;
    Ok((Some(aside), bytes))
}

/// Marks damaged the chunks the catalog at `catalog` places in containers the pool lacks;
/// returns (chunks, versions) marked, or why the pool could not be checked.
fn mark_missing(catalog: &Path, config: &ServerConfig) -> Result<(u64, u64), String> {
    let mut restoring = config.clone();
    restoring.catalog = Some(catalog.to_path_buf());
    let store = restoring.open_store()?;
    let missing = store.missing_containers().map_err(|e| e.to_string())?;
    if missing.is_empty() {
        return Ok((0, 0));
    }
    let options = qsm_store::AuditOptions {
        mark_damaged: true,
        containers: Some(missing),
        ..Default::default()
    };
    let report = store.audit(&options).map_err(|e| e.to_string())?;
    Ok((report.damaged.len() as u64, report.damaged_objects.len() as u64))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
