//! The SQLite catalog: one bundled SQLite database in WAL mode. One writer connection behind a
//! mutex (SQLite allows one writer at a time anyway) and a small pool of reader connections,
//! which WAL lets run beside the writer, so a long inventory stream never blocks a backup.
//! `synchronous = FULL`: a committed transaction survives power loss, not only a crash,
//! because the commit protocol promises that what the catalog says exists is durable.
//!
//! Long reads (the inventories, the version listing, the expiration scan) go in pages, each
//! its own short read transaction, so a slow caller never holds a snapshot that would stop
//! WAL checkpoints (`crate::paging`). On a full disk the catalog opens read-only, since even
//! SQLite's usual open of a WAL database writes (it grows the `-shm` WAL index), and every
//! write fails as [`CatalogError::DiskFull`], naming the catalog.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, ErrorCode, OptionalExtension, Row, params};

use crate::chunk_list;
use crate::error::{CatalogError, Result};
use crate::migrations::{self, Dialect, LATEST};
use crate::model::*;
use crate::{Catalog, Txn};

/// Reader connections kept open for reuse.
const MAX_IDLE_READERS: usize = 4;
/// How long a connection waits for a lock held by another process before failing.
const BUSY_TIMEOUT_MS: u32 = 10_000;
/// Versions per page of the active inventory.
const INVENTORY_PAGE: usize = 10_000;
/// Rows per page of the expiration scan.
const EXPIRY_PAGE: usize = 10_000;
/// Problems listed by a consistency check before the rest are only counted.
const MAX_PROBLEMS: usize = 1000;

use crate::migrations::{OBJECT_COLUMNS, STATE_ACTIVE, STATE_ARCHIVE};

/// The SQLite catalog.
#[derive(Debug)]
pub struct SqliteCatalog {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    // Boxed: rare, and `AnyCatalog` holds this struct unboxed beside a boxed PostgreSQL one.
    upgraded: Option<Box<Upgrade>>,
    /// Opened read-only because its disk was full.
    read_only: bool,
}

/// An upgrade of the schema done when the catalog was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// The schema version found.
    pub from: u32,
    /// The schema version now.
    pub to: u32,
    /// The copy of the catalog taken before migrating it.
    pub backup: PathBuf,
}

fn classify(path: &Path, op: &'static str) -> impl FnOnce(rusqlite::Error) -> CatalogError {
    let path = path.to_path_buf();
    move |e| match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => CatalogError::NotADatabase { path, detail: e.to_string() },
        Some(ErrorCode::DiskFull) => {
            let detail = match space_left(&path) {
                Some(free) => format!("{free} bytes free; SQLite: {e}"),
                None => format!("SQLite: {e}"),
            };
            CatalogError::DiskFull { path, op, detail }
        }
        // SQLite reports ENOSPC on its shared-memory file (growing the WAL index) as a plain
        // "disk I/O error", and a write refused by a catalog opened read-only because its disk
        // was full as "readonly": either, on a disk with (almost) nothing left, is that disk.
        Some(ErrorCode::SystemIoFailure | ErrorCode::ReadOnly) => match space_left(&path) {
            Some(free) if free < LOW_SPACE => CatalogError::DiskFull {
                path,
                op,
                detail: format!("{free} bytes free; SQLite: {e}"),
            },
            _ => CatalogError::Db { op, source: e },
        },
        _ => CatalogError::Db { op, source: e },
    }
}

/// Free space below which an I/O error is taken for a full disk: less than SQLite needs to
/// grow its WAL index (32 KiB) or write a page or two of WAL.
const LOW_SPACE: u64 = 1 << 20;

/// The bytes this process may still write on the file system holding `path` (the reserve
/// kept for root counts only for root), or `None` if that cannot be told.
fn space_left(path: &Path) -> Option<u64> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let st = rustix::fs::statvfs(dir).ok()?;
    let blocks = if rustix::process::geteuid().is_root() { st.f_bfree } else { st.f_bavail };
    Some(blocks.saturating_mul(st.f_frsize))
}

/// Opens `path` (an existing catalog) for reading only, writing nothing, for when its disk is
/// full: SQLite's usual open of a WAL database must grow the shared-memory WAL index (the
/// `-shm` file, 32 KiB) and fails with "disk I/O error" on a full disk. `readonly_shm=1`
/// opens that file read-only: when a server or backup has the catalog open, its WAL index is
/// read as they keep it; when nobody has, SQLite rebuilds it in this process's memory from
/// the WAL. Both files are created empty if missing (an empty file needs no free blocks).
fn open_read_only(path: &Path) -> Result<Connection> {
    use rusqlite::OpenFlags;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    for suffix in ["-shm", "-wal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        // Never truncated or touched if it exists: a running server's WAL is in there.
        let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(name);
    }
    // A URI (for `readonly_shm`), so the path is percent-encoded byte by byte.
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?mode=ro&readonly_shm=1");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let op = "opening the catalog read-only";
    let conn = Connection::open_with_flags(&uri, flags).map_err(classify(path, op))?;
    conn.busy_timeout(std::time::Duration::from_millis(u64::from(BUSY_TIMEOUT_MS)))
        .map_err(classify(path, op))?;
    conn.execute_batch("PRAGMA query_only = 1; PRAGMA cache_size = -65536;")
        .map_err(classify(path, op))?;
    // The first read is where a file that cannot be read this way says so.
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
        .map_err(classify(path, op))?;
    Ok(conn)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned mutex means a thread panicked mid-call; SQLite's own transaction state is
    // still consistent (an open transaction is rolled back by the next BEGIN's failure path),
    // so recover the guard rather than wedge the server.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_connection(path: &Path) -> Result<Connection> {
    // A new catalog is owner-only whatever the umask: it names every file backed up. SQLite
    // opens an empty file as an empty database and gives its WAL and shared-memory files the
    // database file's permissions. A failure here is reported by the open below.
    if !path.exists() {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    }
    let conn = Connection::open(path).map_err(classify(path, "opening the database"))?;
    conn.busy_timeout(std::time::Duration::from_millis(u64::from(BUSY_TIMEOUT_MS)))
        .map_err(classify(path, "setting the busy timeout"))?;
    // The first statement that reads the file is where SQLite notices it is not a database.
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .map_err(classify(path, "enabling WAL"))?;
    // A 256 MiB page cache (SQLite's default is 2 MiB): inserts land all over the path index,
    // and with the default cache a million-object catalog ran at 62k inserts/s instead of
    // over 100k (docs/PERFORMANCE.md). Pages are only allocated when used.
    conn.execute_batch(
        "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA cache_size = -262144;",
    )
    .map_err(classify(path, "setting pragmas"))?;
    Ok(conn)
}

fn read_version(conn: &Connection, path: &Path) -> Result<u32> {
    let has_schema: bool = conn
        .query_row("SELECT count(*) FROM sqlite_master WHERE name = 'qsm_schema'", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(classify(path, "reading the schema version"))?
        > 0;
    if !has_schema {
        let others: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'",
                [],
                |r| r.get(0),
            )
            .map_err(classify(path, "reading the schema"))?;
        if others > 0 {
            return Err(CatalogError::NotADatabase {
                path: path.to_path_buf(),
                detail: "an SQLite database, but without the qsm_schema table".into(),
            });
        }
        return Ok(0);
    }
    let v: i64 = conn
        .query_row("SELECT version FROM qsm_schema", [], |r| r.get(0))
        .map_err(classify(path, "reading the schema version"))?;
    u32::try_from(v)
        .map_err(|_| CatalogError::Damaged(format!("schema version {v} in {}", path.display())))
}

/// Where the copy of a catalog of schema `from` goes before it is upgraded: beside it, never
/// over an earlier copy.
fn pre_upgrade_path(path: &Path, from: u32) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let base = path.with_file_name(format!("{name}.schema-{from}.bak"));
    if !base.exists() {
        return base;
    }
    (2..)
        .map(|k| path.with_file_name(format!("{name}.schema-{from}.{k}.bak")))
        .find(|p| !p.exists())
        .unwrap_or(base)
}

/// Copies the database of `src` to the new file `dest` as of one moment: SQLite's online
/// backup API, every page in one step, so one read transaction that under WAL blocks no
/// writer and cannot be restarted by one (a stepped backup starts over whenever another
/// connection writes). Measured against `VACUUM INTO` (docs/PERFORMANCE.md 9): a third of
/// the time, so writers are slowed a third as long; free pages are copied, and compress away.
///
/// `dest` is made here, new and owner-only (a catalog names every file and holds every
/// secret): an existing file is never overwritten.
fn copy_database(src: &Connection, dest: &Path) -> Result<()> {
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dest)
            .map_err(|e| CatalogError::Refused(format!("cannot create {}: {e}", dest.display())))?;
    }
    let mut dst = Connection::open(dest).map_err(classify(dest, "copying the catalog"))?;
    // Not synced as it is written: whoever keeps the copy syncs what it makes of it.
    dst.execute_batch("PRAGMA synchronous = OFF").map_err(classify(dest, "copying the catalog"))?;
    let backup = rusqlite::backup::Backup::new(src, &mut dst)
        .map_err(classify(dest, "copying the catalog"))?;
    // Busy or locked only while another connection changes the journal mode or checkpoints
    // with truncation: moments.
    for _ in 0..600 {
        match backup.step(-1).map_err(classify(dest, "copying the catalog"))? {
            rusqlite::backup::StepResult::Done => return Ok(()),
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    Err(CatalogError::Refused(format!(
        "copying the catalog to {}: its source stayed locked for 30 s",
        dest.display()
    )))
}

fn migrate(conn: &Connection, path: &Path, from: u32, to: u32) -> Result<()> {
    for version in from + 1..=to {
        let sql = migrations::sql(version, Dialect::Sqlite)
            .ok_or_else(|| CatalogError::Damaged(format!("no migration {version}")))?;
        let step = || -> rusqlite::Result<()> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            conn.execute_batch("CREATE TABLE IF NOT EXISTS qsm_schema (version BIGINT NOT NULL)")?;
            conn.execute_batch(&sql)?;
            conn.execute("DELETE FROM qsm_schema", [])?;
            conn.execute("INSERT INTO qsm_schema (version) VALUES (?1)", [i64::from(version)])?;
            conn.execute_batch("COMMIT")
        };
        if let Err(e) = step() {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(classify(path, "migrating the schema")(e));
        }
    }
    Ok(())
}

impl SqliteCatalog {
    /// Opens the catalog at `path`, creating it if missing and migrating it to the newest
    /// schema. A file that is not a QSM catalog, or one written by a newer program, is an error.
    pub fn open(path: &Path) -> Result<SqliteCatalog> {
        SqliteCatalog::open_at(path, LATEST)
    }

    /// Opens the catalog and migrates it only up to `version` (for migration tests and
    /// tools); newer than `version` but not than the program is fine.
    pub fn open_at(path: &Path, version: u32) -> Result<SqliteCatalog> {
        let mut read_only = false;
        let conn = match open_connection(path) {
            // Reading needs no free space, so on a full disk queries and restores still work;
            // writes fail, naming the full disk (`classify`).
            Err(CatalogError::DiskFull { .. }) if path.exists() => {
                read_only = true;
                open_read_only(path)?
            }
            other => other?,
        };
        let found = read_version(&conn, path)?;
        if found > LATEST {
            return Err(CatalogError::TooNew {
                path: path.to_path_buf(),
                found,
                supported: LATEST,
            });
        }
        let mut upgraded = None;
        if found < version {
            let to = version.min(LATEST);
            // A catalog in use is copied before its schema changes: a migration that fails
            // half-way rolls back, but one that succeeds and turns out wrong, or a program
            // that must be downgraded, needs the catalog as it was.
            if read_only {
                return Err(CatalogError::DiskFull {
                    path: path.to_path_buf(),
                    op: "upgrading the catalog's schema",
                    detail: format!("schema {found} must become {to}"),
                });
            }
            if found > 0 {
                let backup = pre_upgrade_path(path, found);
                copy_database(&conn, &backup).map_err(|e| {
                    CatalogError::Refused(format!(
                        "not upgrading {} from schema {found}: its copy to {} failed first: {e}",
                        path.display(),
                        backup.display()
                    ))
                })?;
                upgraded = Some(Box::new(Upgrade { from: found, to, backup }));
            }
            migrate(&conn, path, found, to)?;
        }
        Ok(SqliteCatalog {
            path: path.to_path_buf(),
            writer: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            upgraded,
            read_only,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema upgrade done at opening, with the copy taken before it, if there was one.
    pub fn upgraded(&self) -> Option<&Upgrade> {
        self.upgraded.as_deref()
    }

    /// Why the catalog was opened read-only, if it was: its disk was full, and reading is all
    /// that needs no free space.
    pub fn read_only(&self) -> Option<String> {
        self.read_only.then(|| {
            let free = space_left(&self.path)
                .map_or_else(String::new, |free| format!(" ({free} bytes free)"));
            format!(
                "the disk holding the catalog {} is full{free}: it is open read-only, so nothing \
                 can be backed up, archived or changed until space is freed",
                self.path.display()
            )
        })
    }

    /// Runs raw SQL on the writer connection. For tests that must build states the API
    /// refuses to make (a foreign table, a future schema version); never use it elsewhere.
    #[doc(hidden)]
    pub fn raw_execute_for_tests(&self, sql: &str) -> Result<()> {
        lock(&self.writer).execute_batch(sql).map_err(CatalogError::db("running raw SQL"))
    }

    /// One page of [`Catalog::for_each_expirable`]: the non-active rows after `after` (path,
    /// state, id) in index order, each with whether its path has an active version.
    fn expirable_page(
        &self,
        filespace: FilespaceId,
        after: &crate::expire::ExpiryCursor,
    ) -> Result<Vec<crate::expire::ExpiryRow>> {
        let op = "listing expirable versions";
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT o.id, o.path, o.state, o.inserted, o.deactivated, o.retain_until, o.mgmt_class_id, \
                     EXISTS (SELECT 1 FROM objects a WHERE a.filespace_id = o.filespace_id AND a.path = o.path AND a.state = 1) \
                     FROM objects o WHERE o.filespace_id = ?1 AND o.state <> 1 AND (o.path, o.state, o.id) > (?2, ?3, ?4) \
                     ORDER BY o.path, o.state, o.id LIMIT ?5",
                )
                .map_err(CatalogError::db(op))?;
            let rows = stmt
                .query_map(
                    params![filespace.0, after.0, after.1, after.2, EXPIRY_PAGE as i64],
                    |r| {
                        Ok(crate::expire::ExpiryRow {
                            id: ObjectId(r.get(0)?),
                            path: r.get(1)?,
                            archive: r.get::<_, i64>(2)? == STATE_ARCHIVE,
                            inserted: r.get(3)?,
                            deactivated: r.get(4)?,
                            retain_until: r.get(5)?,
                            mgmt_class: r.get::<_, Option<i64>>(6)?.map(MgmtClassId),
                            has_active: r.get::<_, i64>(7)? != 0,
                        })
                    },
                )
                .map_err(CatalogError::db(op))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db(op))
        })
    }

    /// One page of [`Catalog::for_each_version`]: every version of the next paths after
    /// `after` (from the first when `None`), in the listing's order, and the page's last path
    /// (`None` when it was the last page). Read along the two partial indexes as
    /// [`crate::paging`] explains, in one read transaction that ends before the caller sees a
    /// row.
    fn versions_page(
        &self,
        filespace: FilespaceId,
        after: Option<&[u8]>,
    ) -> Result<(Vec<ObjectVersion>, Option<Vec<u8>>)> {
        let op = "listing versions";
        let from = if after.is_some() { "path > ?2" } else { "?2 IS NULL" };
        let arm = |states: &str| {
            format!(
                "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND {states} AND {from} ORDER BY path LIMIT ?3"
            )
        };
        let rest = format!(
            "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND state <> 1 AND path = ?2"
        );
        self.with_reader(|c| {
            let tx = c.unchecked_transaction().map_err(CatalogError::db(op))?;
            let limit = crate::paging::VERSION_ARM as i64;
            let (mut active, mut inactive) = (Vec::new(), Vec::new());
            query_objects(&tx, &arm("state = 1"), params![filespace.0, after, limit], &mut active)?;
            query_objects(
                &tx,
                &arm("state <> 1"),
                params![filespace.0, after, limit],
                &mut inactive,
            )?;
            let (last, reread) = crate::paging::cut(&mut active, &mut inactive);
            if let (Some(path), true) = (&last, reread) {
                query_objects(&tx, &rest, params![filespace.0, path], &mut inactive)?;
            }
            tx.commit().map_err(CatalogError::db(op))?;
            Ok((crate::paging::sorted(active, inactive), last))
        })
    }

    fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = match lock(&self.readers).pop() {
            Some(c) => c,
            None if self.read_only => open_read_only(&self.path)?,
            None => {
                let c = open_connection(&self.path)?;
                c.execute_batch("PRAGMA query_only = 1")
                    .map_err(CatalogError::db("opening a reader"))?;
                c
            }
        };
        let result = f(&conn);
        let mut idle = lock(&self.readers);
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
        result
    }

    fn with_writer<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
        op: &'static str,
    ) -> Result<T> {
        f(&lock(&self.writer)).map_err(classify(&self.path, op))
    }
}

fn unique_violation(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation)
}

fn object_from_row(row: &Row<'_>) -> Result<ObjectVersion> {
    let get = |e| CatalogError::Db { op: "reading an object version", source: e };
    let state: i64 = row.get(2).map_err(get)?;
    let code: i64 = row.get(4).map_err(get)?;
    let id: i64 = row.get(0).map_err(get)?;
    let object_type = ObjectType::from_code(code)
        .ok_or_else(|| CatalogError::Damaged(format!("object {id} has unknown type {code}")))?;
    let blob: Vec<u8> = row.get(17).map_err(get)?;
    let int = |i: usize| -> Result<i64> { row.get::<_, i64>(i).map_err(get) };
    let meta: Option<Vec<u8>> = row.get(20).map_err(get)?;
    let mut v = ObjectVersion {
        id: ObjectId(id),
        filespace: FilespaceId(int(1)?),
        path: row.get(3).map_err(get)?,
        kind: if state == STATE_ARCHIVE { ObjectKind::Archive } else { ObjectKind::Backup },
        active: state == STATE_ACTIVE,
        object_type,
        attrs: Attributes {
            size: int(5)? as u64,
            mtime_ns: int(6)?,
            ctime_ns: int(7)?,
            mode: int(8)? as u32,
            uid: int(9)? as u32,
            gid: int(10)? as u32,
            link_target: row.get(16).map_err(get)?,
            ino: int(18)? as u64,
            // The rest is in the `meta` column, read below.
            ..Attributes::default()
        },
        inserted: int(11)?,
        deactivated: row.get(12).map_err(get)?,
        mgmt_class: row.get::<_, Option<i64>>(13).map_err(get)?.map(MgmtClassId),
        description: row.get(14).map_err(get)?,
        retain_until: row.get(15).map_err(get)?,
        chunks: chunk_list::decode(&blob)
            .map_err(|e| CatalogError::Damaged(format!("object {id}: {e}")))?,
        damaged: int(19)? != 0,
    };
    crate::meta::apply(id, meta.as_deref(), &mut v.attrs)?;
    Ok(v)
}

fn query_objects(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
    out: &mut Vec<ObjectVersion>,
) -> Result<()> {
    let mut stmt =
        conn.prepare_cached(sql).map_err(CatalogError::db("querying object versions"))?;
    let mut rows = stmt.query(args).map_err(CatalogError::db("querying object versions"))?;
    while let Some(row) = rows.next().map_err(CatalogError::db("reading object versions"))? {
        out.push(object_from_row(row)?);
    }
    Ok(())
}

fn chunk_from_row(row: &Row<'_>) -> rusqlite::Result<Chunk> {
    Ok(Chunk {
        id: ChunkId(row.get(0)?),
        location: NewChunk {
            container: ContainerId(row.get::<_, i64>(1)? as u64),
            offset: row.get::<_, i64>(2)? as u64,
            stored_len: row.get::<_, i64>(3)? as u32,
            raw_len: row.get::<_, i64>(4)? as u32,
            codec: row.get::<_, i64>(5)? as u16,
        },
        refcount: row.get::<_, i64>(6)? as u64,
    })
}

const CHUNK_COLUMNS: &str = "id, container_id, frame_offset, stored_len, raw_len, codec, refcount";

/// The id of the dedup scope `name`, made with `secret` if it does not exist (an existing
/// scope keeps its own secret).
fn scope_named(c: &Connection, name: &str, secret: &[u8; 32], op: &'static str) -> Result<i64> {
    c.execute(
        "INSERT INTO dedup_scopes (name, secret) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
        params![name, &secret[..]],
    )
    .map_err(CatalogError::db(op))?;
    c.query_row("SELECT id FROM dedup_scopes WHERE name = ?1", [name], |r| r.get(0))
        .map_err(CatalogError::db(op))
}

fn scope_by_id(c: &Connection, id: DedupScopeId) -> Result<DedupScope> {
    let (name, secret): (String, Vec<u8>) = c
        .query_row("SELECT name, secret FROM dedup_scopes WHERE id = ?1", [id.0], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(CatalogError::db("reading a dedup scope"))?;
    let secret = secret.try_into().map_err(|_| {
        CatalogError::Damaged(format!("dedup scope {name} has a secret of the wrong length"))
    })?;
    Ok(DedupScope { id, name, secret })
}

/// Raises the dedup epoch: chunks may be gone, clients' caches of what is stored are stale.
fn bump_epoch(c: &Connection) -> Result<()> {
    c.prepare_cached("UPDATE catalog_state SET value = value + 1 WHERE name = 'dedup_epoch'")
        .and_then(|mut s| s.execute([]))
        .map_err(CatalogError::db("raising the dedup epoch"))?;
    Ok(())
}

fn node_from_row(row: &Row<'_>) -> rusqlite::Result<Node> {
    Ok(Node {
        id: NodeId(row.get(0)?),
        name: row.get(1)?,
        password_hash: row.get(2)?,
        domain: DomainId(row.get(3)?),
        locked: row.get::<_, i64>(4)? != 0,
        registered: row.get(5)?,
    })
}

fn severity_code(s: Severity) -> i64 {
    match s {
        Severity::Info => 0,
        Severity::Warning => 1,
        Severity::Error => 2,
    }
}

impl Catalog for SqliteCatalog {
    fn schema_version(&self) -> Result<u32> {
        read_version(&lock(&self.writer), &self.path)
    }

    fn sql(&self) -> &dyn crate::sql::Backend {
        self
    }

    fn define_domain(&self, name: &str, description: &str) -> Result<DomainId> {
        let conn = lock(&self.writer);
        match conn.execute(
            "INSERT INTO domains (name, description) VALUES (?1, ?2)",
            params![name, description],
        ) {
            Ok(_) => Ok(DomainId(conn.last_insert_rowid())),
            Err(e) if unique_violation(&e) => {
                Err(CatalogError::Exists { what: "domain", name: name.into() })
            }
            Err(e) => Err(classify(&self.path, "defining a domain")(e)),
        }
    }

    fn domain(&self, name: &str) -> Result<Option<Domain>> {
        self.with_reader(|c| {
            c.query_row("SELECT id, name, description FROM domains WHERE name = ?1", [name], |r| {
                Ok(Domain { id: DomainId(r.get(0)?), name: r.get(1)?, description: r.get(2)? })
            })
            .optional()
            .map_err(CatalogError::db("reading a domain"))
        })
    }

    fn define_mgmt_class(
        &self,
        domain: DomainId,
        name: &str,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<MgmtClassId> {
        let mut conn = lock(&self.writer);
        let tx = conn.transaction().map_err(classify(&self.path, "defining a management class"))?;
        let id = match tx.execute(
            "INSERT INTO mgmt_classes (domain_id, name) VALUES (?1, ?2)",
            params![domain.0, name],
        ) {
            Ok(_) => tx.last_insert_rowid(),
            Err(e) if unique_violation(&e) => {
                // Either the name exists in the domain, or the domain does not exist.
                let known: Option<i64> = tx
                    .query_row("SELECT id FROM domains WHERE id = ?1", [domain.0], |r| r.get(0))
                    .optional()
                    .map_err(classify(&self.path, "defining a management class"))?;
                return Err(match known {
                    Some(_) => CatalogError::Exists { what: "management class", name: name.into() },
                    None => CatalogError::NotFound { what: "domain", key: domain.0.to_string() },
                });
            }
            Err(e) => {
                return Err(classify(&self.path, "defining a management class")(e));
            }
        };
        tx.execute(
            "INSERT INTO backup_copygroups (mgmt_class_id, versions_exist, versions_deleted, retain_extra_days, retain_only_days) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, backup.versions_exist, backup.versions_deleted, backup.retain_extra_days, backup.retain_only_days],
        )
        .map_err(|e| if unique_violation(&e) { CatalogError::Refused(format!("invalid backup copy group for {name}: versions-exist must be at least 1")) } else { CatalogError::Db { op: "defining a copy group", source: e } })?;
        tx.execute(
            "INSERT INTO archive_copygroups (mgmt_class_id, retain_version_days) VALUES (?1, ?2)",
            params![id, archive.retain_version_days],
        )
        .map_err(classify(&self.path, "defining a copy group"))?;
        tx.commit().map_err(classify(&self.path, "defining a management class"))?;
        Ok(MgmtClassId(id))
    }

    fn domains(&self) -> Result<Vec<Domain>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached("SELECT id, name, description FROM domains ORDER BY name")
                .map_err(CatalogError::db("reading domains"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(Domain { id: DomainId(r.get(0)?), name: r.get(1)?, description: r.get(2)? })
                })
                .map_err(CatalogError::db("reading domains"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading domains"))
        })
    }

    fn delete_domain(&self, domain: DomainId) -> Result<()> {
        let mut conn = lock(&self.writer);
        let op = "deleting a domain";
        let t = conn.transaction().map_err(classify(&self.path, op))?;
        let count = |sql: &str| -> Result<i64> {
            t.query_row(sql, [domain.0], |r| r.get(0)).map_err(classify(&self.path, op))
        };
        let nodes = count("SELECT count(*) FROM nodes WHERE domain_id = ?1")?;
        if nodes > 0 {
            return Err(CatalogError::Refused(format!(
                "the domain still has {nodes} nodes: move them to another domain first"
            )));
        }
        let bound = count(
            "SELECT count(*) FROM objects WHERE mgmt_class_id IN (SELECT id FROM mgmt_classes WHERE domain_id = ?1)",
        )?;
        if bound > 0 {
            return Err(CatalogError::Refused(format!(
                "{bound} versions are bound to the domain's management classes"
            )));
        }
        for sql in [
            "DELETE FROM backup_copygroups WHERE mgmt_class_id IN (SELECT id FROM mgmt_classes WHERE domain_id = ?1)",
            "DELETE FROM archive_copygroups WHERE mgmt_class_id IN (SELECT id FROM mgmt_classes WHERE domain_id = ?1)",
            "DELETE FROM mgmt_classes WHERE domain_id = ?1",
        ] {
            t.execute(sql, [domain.0]).map_err(classify(&self.path, op))?;
        }
        let n = t
            .execute("DELETE FROM domains WHERE id = ?1", [domain.0])
            .map_err(classify(&self.path, op))?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "domain", key: domain.0.to_string() });
        }
        t.commit().map_err(classify(&self.path, op))
    }

    fn update_mgmt_class(
        &self,
        class: MgmtClassId,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<()> {
        let mut conn = lock(&self.writer);
        let op = "updating a management class";
        let t = conn.transaction().map_err(classify(&self.path, op))?;
        let n = t
            .execute(
                "UPDATE backup_copygroups SET versions_exist = ?1, versions_deleted = ?2, retain_extra_days = ?3, retain_only_days = ?4 WHERE mgmt_class_id = ?5",
                params![backup.versions_exist, backup.versions_deleted, backup.retain_extra_days, backup.retain_only_days, class.0],
            )
            .map_err(|e| {
                if unique_violation(&e) {
                    CatalogError::Refused("versions-exist must be at least 1".into())
                } else {
                    CatalogError::Db { op, source: e }
                }
            })?;
        if n == 0 {
            return Err(CatalogError::NotFound {
                what: "management class",
                key: class.0.to_string(),
            });
        }
        t.execute(
            "UPDATE archive_copygroups SET retain_version_days = ?1 WHERE mgmt_class_id = ?2",
            params![archive.retain_version_days, class.0],
        )
        .map_err(classify(&self.path, op))?;
        t.commit().map_err(classify(&self.path, op))
    }

    fn delete_mgmt_class(&self, class: MgmtClassId) -> Result<()> {
        let mut conn = lock(&self.writer);
        let op = "deleting a management class";
        let t = conn.transaction().map_err(classify(&self.path, op))?;
        let bound: i64 = t
            .query_row("SELECT count(*) FROM objects WHERE mgmt_class_id = ?1", [class.0], |r| {
                r.get(0)
            })
            .map_err(classify(&self.path, op))?;
        if bound > 0 {
            return Err(CatalogError::Refused(format!(
                "{bound} versions are bound to the management class"
            )));
        }
        // `standard` is the policy of every version of the domain's nodes not bound to
        // another class: without it they would fall back to the built-in defaults, which
        // may keep far less.
        let nodes: i64 = t
            .query_row(
                "SELECT count(*) FROM nodes n JOIN mgmt_classes m ON m.domain_id = n.domain_id WHERE m.id = ?1 AND m.name = 'standard'",
                [class.0],
                |r| r.get(0),
            )
            .map_err(classify(&self.path, op))?;
        if nodes > 0 {
            return Err(CatalogError::Refused(format!(
                "it is the default class of the domain's {nodes} nodes: move them to another domain first"
            )));
        }
        t.execute("DELETE FROM backup_copygroups WHERE mgmt_class_id = ?1", [class.0])
            .map_err(classify(&self.path, op))?;
        t.execute("DELETE FROM archive_copygroups WHERE mgmt_class_id = ?1", [class.0])
            .map_err(classify(&self.path, op))?;
        let n = t
            .execute("DELETE FROM mgmt_classes WHERE id = ?1", [class.0])
            .map_err(classify(&self.path, op))?;
        if n == 0 {
            return Err(CatalogError::NotFound {
                what: "management class",
                key: class.0.to_string(),
            });
        }
        t.commit().map_err(classify(&self.path, op))
    }

    fn set_node_domain(&self, node: NodeId, domain: DomainId) -> Result<()> {
        let n = self
            .with_writer(
                |c| {
                    c.execute(
                        "UPDATE nodes SET domain_id = ?1 WHERE id = ?2",
                        params![domain.0, node.0],
                    )
                },
                "moving a node to a domain",
            )
            .map_err(|e| match e {
                CatalogError::Db { source, .. } if unique_violation(&source) => {
                    CatalogError::NotFound { what: "domain", key: domain.0.to_string() }
                }
                other => other,
            })?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        Ok(())
    }

    fn mgmt_classes(&self, domain: DomainId) -> Result<Vec<MgmtClass>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT m.id, m.name, b.versions_exist, b.versions_deleted, b.retain_extra_days, b.retain_only_days, a.retain_version_days \
                     FROM mgmt_classes m JOIN backup_copygroups b ON b.mgmt_class_id = m.id JOIN archive_copygroups a ON a.mgmt_class_id = m.id \
                     WHERE m.domain_id = ?1 ORDER BY m.name",
                )
                .map_err(CatalogError::db("reading management classes"))?;
            let rows = stmt
                .query_map([domain.0], |r| {
                    Ok(MgmtClass {
                        id: MgmtClassId(r.get(0)?),
                        domain,
                        name: r.get(1)?,
                        backup: BackupCopyGroup {
                            versions_exist: r.get(2)?,
                            versions_deleted: r.get(3)?,
                            retain_extra_days: r.get(4)?,
                            retain_only_days: r.get(5)?,
                        },
                        archive: ArchiveCopyGroup { retain_version_days: r.get(6)? },
                    })
                })
                .map_err(CatalogError::db("reading management classes"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading management classes"))
        })
    }

    fn register_node(&self, name: &str, password_hash: &str, domain: DomainId) -> Result<NodeId> {
        let conn = lock(&self.writer);
        match conn.execute(
            "INSERT INTO nodes (name, password_hash, domain_id, locked, registered) VALUES (?1, ?2, ?3, 0, ?4)",
            params![name, password_hash, domain.0, crate::now()],
        ) {
            Ok(_) => Ok(NodeId(conn.last_insert_rowid())),
            Err(e) if unique_violation(&e) => {
                let exists: bool = conn.query_row("SELECT count(*) FROM nodes WHERE name = ?1", [name], |r| r.get::<_, i64>(0)).map_err(classify(&self.path, "registering a node"))? > 0;
                Err(if exists { CatalogError::Exists { what: "node", name: name.into() } } else { CatalogError::NotFound { what: "domain", key: domain.0.to_string() } })
            }
            Err(e) => Err(classify(&self.path, "registering a node")(e)),
        }
    }

    fn node(&self, name: &str) -> Result<Option<Node>> {
        self.with_reader(|c| {
            c.query_row("SELECT id, name, password_hash, domain_id, locked, registered FROM nodes WHERE name = ?1", [name], node_from_row)
                .optional()
                .map_err(CatalogError::db("reading a node"))
        })
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached("SELECT id, name, password_hash, domain_id, locked, registered FROM nodes ORDER BY name").map_err(CatalogError::db("reading nodes"))?;
            let rows = stmt.query_map([], node_from_row).map_err(CatalogError::db("reading nodes"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading nodes"))
        })
    }

    fn set_node_locked(&self, node: NodeId, locked: bool) -> Result<()> {
        let n = self.with_writer(
            |c| {
                c.execute(
                    "UPDATE nodes SET locked = ?1 WHERE id = ?2",
                    params![i64::from(locked), node.0],
                )
            },
            "locking a node",
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        Ok(())
    }

    fn register_admin(
        &self,
        name: &str,
        password_hash: &str,
        privileges: &[Privilege],
    ) -> Result<()> {
        let conn = lock(&self.writer);
        match conn.execute(
            "INSERT INTO admins (name, password_hash, locked, registered, privileges) VALUES (?1, ?2, 0, ?3, ?4)",
            params![name, password_hash, crate::now(), Privilege::join(privileges)],
        ) {
            Ok(_) => Ok(()),
            Err(e) if unique_violation(&e) => {
                Err(CatalogError::Exists { what: "administrator", name: name.into() })
            }
            Err(e) => Err(classify(&self.path, "registering an administrator")(e)),
        }
    }

    fn admin(&self, name: &str) -> Result<Option<Admin>> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT name, password_hash, locked, registered, privileges FROM admins WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0, r.get(3)?, r.get::<_, String>(4)?)),
            )
            .optional()
            .map_err(CatalogError::db("reading an administrator"))?
            .map(|(name, password_hash, locked, registered, privileges)| {
                let privileges = Privilege::parse_list(&privileges)
                    .map_err(|e| CatalogError::Damaged(format!("administrator {name}: {e}")))?;
                Ok(Admin { name, password_hash, locked, registered, privileges })
            })
            .transpose()
        })
    }

    fn set_admin_privileges(&self, name: &str, privileges: &[Privilege]) -> Result<()> {
        let n = self.with_writer(
            |c| {
                c.execute(
                    "UPDATE admins SET privileges = ?1 WHERE name = ?2",
                    params![Privilege::join(privileges), name],
                )
            },
            "granting privileges",
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "administrator", key: name.into() });
        }
        Ok(())
    }

    fn set_password(&self, admin: bool, name: &str, password_hash: &str) -> Result<()> {
        let (sql, what) = if admin {
            ("UPDATE admins SET password_hash = ?1 WHERE name = ?2", "administrator")
        } else {
            ("UPDATE nodes SET password_hash = ?1 WHERE name = ?2", "node")
        };
        let n = self
            .with_writer(|c| c.execute(sql, params![password_hash, name]), "changing a password")?;
        if n == 0 {
            return Err(CatalogError::NotFound { what, key: name.into() });
        }
        Ok(())
    }

    fn set_admin_locked(&self, name: &str, locked: bool) -> Result<()> {
        let n = self.with_writer(
            |c| {
                c.execute(
                    "UPDATE admins SET locked = ?1 WHERE name = ?2",
                    params![i64::from(locked), name],
                )
            },
            "locking an administrator",
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "administrator", key: name.into() });
        }
        Ok(())
    }

    fn remove_admin(&self, name: &str) -> Result<()> {
        let n = self.with_writer(
            |c| c.execute("DELETE FROM admins WHERE name = ?1", params![name]),
            "removing an administrator",
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "administrator", key: name.into() });
        }
        Ok(())
    }

    fn filespace(&self, node: NodeId, name: &str) -> Result<FilespaceId> {
        let conn = lock(&self.writer);
        let found: Option<i64> = conn
            .query_row(
                "SELECT id FROM filespaces WHERE node_id = ?1 AND name = ?2",
                params![node.0, name],
                |r| r.get(0),
            )
            .optional()
            .map_err(classify(&self.path, "reading a filespace"))?;
        if let Some(id) = found {
            return Ok(FilespaceId(id));
        }
        match conn.execute(
            "INSERT INTO filespaces (node_id, name, created) VALUES (?1, ?2, ?3)",
            params![node.0, name, crate::now()],
        ) {
            Ok(_) => Ok(FilespaceId(conn.last_insert_rowid())),
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                Err(CatalogError::NotFound { what: "node", key: node.0.to_string() })
            }
            Err(e) => Err(classify(&self.path, "creating a filespace")(e)),
        }
    }

    fn delete_filespace(
        &self,
        filespace: FilespaceId,
        batch: usize,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<u64> {
        let op = "deleting a filespace";
        let ids = |limit: i64| {
            // Each state through its own partial index (`state = 1`, `state <> 1` literally).
            self.with_reader(|c| {
                let mut ids = Vec::new();
                for sql in [
                    "SELECT id FROM objects WHERE filespace_id = ?1 AND state = 1 LIMIT ?2",
                    "SELECT id FROM objects WHERE filespace_id = ?1 AND state <> 1 LIMIT ?2",
                ] {
                    let mut stmt = c.prepare_cached(sql).map_err(classify(&self.path, op))?;
                    let rows = stmt
                        .query_map(params![filespace.0, limit], |r| r.get(0))
                        .map_err(classify(&self.path, op))?;
                    for id in rows {
                        ids.push(id.map_err(classify(&self.path, op))?);
                    }
                }
                Ok(ids)
            })
        };
        let remove = || {
            self.with_writer(
                |c| {
                    c.execute(
                        "DELETE FROM filespaces WHERE id = ?1 AND NOT EXISTS \
                         (SELECT 1 FROM objects WHERE filespace_id = ?1)",
                        [filespace.0],
                    )
                },
                op,
            )
            .map(|n| n > 0)
        };
        let exists = || {
            self.with_reader(|c| {
                c.query_row("SELECT count(*) FROM filespaces WHERE id = ?1", [filespace.0], |r| {
                    r.get::<_, i64>(0)
                })
                .map(|n| n > 0)
                .map_err(classify(&self.path, op))
            })
        };
        crate::delete_filespace_in_batches(self, filespace, batch, stop, &ids, &remove, &exists)
    }

    fn delete_node(&self, node: NodeId) -> Result<()> {
        let conn = lock(&self.writer);
        let op = "deleting a node";
        let filespaces: i64 = conn
            .query_row("SELECT count(*) FROM filespaces WHERE node_id = ?1", [node.0], |r| r.get(0))
            .map_err(classify(&self.path, op))?;
        if filespaces > 0 {
            return Err(CatalogError::Refused(format!(
                "the node still has {filespaces} filespaces: delete them first"
            )));
        }
        conn.execute_batch("BEGIN IMMEDIATE").map_err(classify(&self.path, op))?;
        let result = (|| {
            conn.execute("DELETE FROM sessions WHERE node_id = ?1", [node.0])?;
            let n = conn.execute("DELETE FROM nodes WHERE id = ?1", [node.0])?;
            conn.execute_batch("COMMIT")?;
            Ok::<usize, rusqlite::Error>(n)
        })();
        match result {
            Ok(0) => Err(CatalogError::NotFound { what: "node", key: node.0.to_string() }),
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(CatalogError::Db { op, source: e })
            }
        }
    }

    fn filespaces(&self, node: NodeId) -> Result<Vec<Filespace>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, name, created, generation FROM filespaces WHERE node_id = ?1 ORDER BY name",
                )
                .map_err(CatalogError::db("reading filespaces"))?;
            let rows = stmt
                .query_map([node.0], |r| {
                    Ok(Filespace {
                        id: FilespaceId(r.get(0)?),
                        node,
                        name: r.get(1)?,
                        created: r.get(2)?,
                        generation: r.get(3)?,
                    })
                })
                .map_err(CatalogError::db("reading filespaces"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(CatalogError::db("reading filespaces"))
        })
    }

    fn define_pool(&self, name: &str, kind: &str, location: &str) -> Result<PoolId> {
        let conn = lock(&self.writer);
        match conn.execute(
            "INSERT INTO storage_pools (name, kind, location) VALUES (?1, ?2, ?3)",
            params![name, kind, location],
        ) {
            Ok(_) => Ok(PoolId(conn.last_insert_rowid())),
            Err(e) if unique_violation(&e) => {
                Err(CatalogError::Exists { what: "storage pool", name: name.into() })
            }
            Err(e) => Err(classify(&self.path, "defining a storage pool")(e)),
        }
    }

    fn pool_usage(&self, pool: PoolId) -> Result<PoolUsage> {
        let op = "measuring a pool";
        self.with_reader(|c| {
            let (containers, bytes): (i64, i64) = c
                .query_row(
                    "SELECT count(*), COALESCE(SUM(size), 0) FROM containers WHERE pool_id = ?1",
                    [pool.0],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(CatalogError::db(op))?;
            let (chunks, live, damaged): (i64, i64, i64) = c
                .query_row(
                    "SELECT count(*), COALESCE(SUM(CASE WHEN k.refcount > 0 THEN k.stored_len ELSE 0 END), 0), \
                     COALESCE(SUM(k.damaged), 0) FROM chunks k JOIN containers t ON t.id = k.container_id WHERE t.pool_id = ?1",
                    [pool.0],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .map_err(CatalogError::db(op))?;
            Ok(PoolUsage {
                containers: containers as u64,
                bytes: bytes as u64,
                chunks: chunks as u64,
                live_bytes: live as u64,
                damaged_chunks: damaged as u64,
            })
        })
    }

    fn pools(&self) -> Result<Vec<StoragePool>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached("SELECT id, name, kind, location FROM storage_pools ORDER BY name")
                .map_err(CatalogError::db("reading pools"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(StoragePool {
                        id: PoolId(r.get(0)?),
                        name: r.get(1)?,
                        kind: r.get(2)?,
                        location: r.get(3)?,
                    })
                })
                .map_err(CatalogError::db("reading pools"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading pools"))
        })
    }

    fn containers(&self, pool: PoolId) -> Result<Vec<Container>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, size, sealed FROM containers WHERE pool_id = ?1 ORDER BY id",
                )
                .map_err(CatalogError::db("reading containers"))?;
            let rows = stmt
                .query_map([pool.0], |r| {
                    Ok(Container {
                        id: ContainerId(r.get::<_, i64>(0)? as u64),
                        pool,
                        size: r.get::<_, i64>(1)? as u64,
                        sealed: r.get::<_, i64>(2)? != 0,
                    })
                })
                .map_err(CatalogError::db("reading containers"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(CatalogError::db("reading containers"))
        })
    }

    fn chunks_in_container(&self, container: ContainerId) -> Result<Vec<Chunk>> {
        self.with_reader(|c| {
            let sql = format!(
                "SELECT {CHUNK_COLUMNS} FROM chunks WHERE container_id = ?1 ORDER BY frame_offset"
            );
            let mut stmt = c.prepare_cached(&sql).map_err(CatalogError::db("reading chunks"))?;
            let rows = stmt
                .query_map([container.0 as i64], chunk_from_row)
                .map_err(CatalogError::db("reading chunks"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading chunks"))
        })
    }

    fn dedup_scope(&self, node: NodeId, new_secret: [u8; 32]) -> Result<DedupScope> {
        // One transaction on the writer: a node's first scope is set only where none is, so
        // an administrator's set-dedup-scope running at the same time is never undone.
        let mut conn = lock(&self.writer);
        let op = "reading a node's dedup scope";
        let t = conn.transaction().map_err(classify(&self.path, op))?;
        let found: Option<(String, Option<i64>)> = t
            .query_row("SELECT name, dedup_scope FROM nodes WHERE id = ?1", [node.0], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(classify(&self.path, op))?;
        let (name, scope) = found
            .ok_or_else(|| CatalogError::NotFound { what: "node", key: node.0.to_string() })?;
        let id = match scope {
            Some(id) => id,
            None => {
                let id = scope_named(&t, &format!("node:{name}"), &new_secret, op)?;
                t.execute(
                    "UPDATE nodes SET dedup_scope = ?1 WHERE id = ?2 AND dedup_scope IS NULL",
                    params![id, node.0],
                )
                .map_err(classify(&self.path, op))?;
                id
            }
        };
        let scope = scope_by_id(&t, DedupScopeId(id))?;
        t.commit().map_err(classify(&self.path, op))?;
        Ok(scope)
    }

    fn set_dedup_scope(
        &self,
        node: NodeId,
        name: &str,
        new_secret: [u8; 32],
    ) -> Result<DedupScope> {
        let mut conn = lock(&self.writer);
        let op = "setting a node's dedup scope";
        let t = conn.transaction().map_err(classify(&self.path, op))?;
        let id = scope_named(&t, name, &new_secret, op)?;
        let n = t
            .execute("UPDATE nodes SET dedup_scope = ?1 WHERE id = ?2", params![id, node.0])
            .map_err(classify(&self.path, op))?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        let scope = scope_by_id(&t, DedupScopeId(id))?;
        t.commit().map_err(classify(&self.path, op))?;
        Ok(scope)
    }

    fn find_chunks(
        &self,
        scope: DedupScopeId,
        sealed: bool,
        hashes: &[[u8; 32]],
    ) -> Result<Vec<Option<ChunkId>>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id FROM chunks WHERE scope = ?1 AND sealed = ?3 AND hash = ?2 AND refcount > 0 AND damaged = 0",
                )
                .map_err(CatalogError::db("looking up chunks"))?;
            hashes
                .iter()
                .map(|h| {
                    stmt.query_row(params![scope.0, &h[..], i64::from(sealed)], |r| r.get(0))
                        .optional()
                        .map(|id| id.map(ChunkId))
                        .map_err(CatalogError::db("looking up chunks"))
                })
                .collect()
        })
    }

    fn dedup_epoch(&self) -> Result<u64> {
        self.with_reader(|c| {
            c.query_row("SELECT value FROM catalog_state WHERE name = 'dedup_epoch'", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|v| v as u64)
            .map_err(CatalogError::db("reading the dedup epoch"))
        })
    }

    fn node_key(&self, node: NodeId) -> Result<Option<Vec<u8>>> {
        self.with_reader(|c| {
            c.query_row("SELECT key_file FROM nodes WHERE id = ?1", [node.0], |r| r.get(0))
                .optional()
                .map_err(CatalogError::db("reading a node's key"))?
                .ok_or_else(|| CatalogError::NotFound { what: "node", key: node.0.to_string() })
        })
    }

    fn set_node_key(&self, node: NodeId, key_file: &[u8]) -> Result<()> {
        let n = self.with_writer(
            |c| {
                c.execute("UPDATE nodes SET key_file = ?1 WHERE id = ?2", params![key_file, node.0])
            },
            "storing a node's key",
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        Ok(())
    }

    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        let conn = lock(&self.writer);
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(classify(&self.path, "starting a transaction"))?;
        Ok(Box::new(SqliteTxn {
            conn,
            done: false,
            chunks_gone: false,
            changed: Default::default(),
        }))
    }

    fn for_each_active(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        // In pages, each its own read transaction: a backup merges the inventory with its walk
        // as it goes, and a snapshot held open for the whole backup would stop WAL
        // checkpoints. Pages continue after the last path seen, so versions committed
        // meanwhile at paths already passed (the backup's own) do not show up.
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut page = Vec::with_capacity(INVENTORY_PAGE);
            self.with_reader(|c| {
                let op = CatalogError::db("streaming the active inventory");
                let tail = "ORDER BY path LIMIT ?3";
                let sql = if after.is_some() {
                    format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND state = 1 AND path > ?2 {tail}")
                } else {
                    format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND state = 1 AND ?2 IS NULL {tail}")
                };
                let mut stmt = c.prepare_cached(&sql).map_err(op)?;
                let mut rows = stmt
                    .query(params![filespace.0, after, INVENTORY_PAGE as i64])
                    .map_err(CatalogError::db("streaming the active inventory"))?;
                while let Some(row) = rows.next().map_err(CatalogError::db("streaming the active inventory"))? {
                    page.push(object_from_row(row)?);
                }
                Ok(())
            })?;
            for v in &page {
                visit(v)?;
            }
            match page.pop() {
                Some(last) if page.len() + 1 == INVENTORY_PAGE => after = Some(last.path),
                _ => return Ok(()),
            }
        }
    }

    fn for_each_version(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        // In pages of whole paths, each its own short read transaction: a restore or a
        // listing piped into `less` must not hold a snapshot while its reader dawdles, or WAL
        // checkpoints stop and the WAL grows without bound. `visit` runs between pages.
        crate::paging::for_each_in_pages(|after| self.versions_page(filespace, after), visit)
    }

    fn for_each_expirable(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&crate::expire::ExpiryRow) -> Result<()>,
    ) -> Result<()> {
        // In pages, each its own read snapshot (as the active inventory): a scan of millions of
        // versions must not stop WAL checkpoints for its whole length, and each page sees
        // which paths still have an active version as of its own reading. Pages follow the
        // partial index of non-active rows, (path, state, rowid), so they never skip or repeat
        // a row; `visit` runs between pages, outside any read.
        crate::expire::for_each_in_pages(
            EXPIRY_PAGE,
            |after| self.expirable_page(filespace, after),
            visit,
        )
    }

    fn versions(&self, filespace: FilespaceId, path: &[u8]) -> Result<Vec<ObjectVersion>> {
        self.with_reader(|c| {
            let mut out = Vec::new();
            let active = format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND path = ?2 AND state = 1");
            let others = format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND path = ?2 AND state <> 1");
            query_objects(c, &active, params![filespace.0, path], &mut out)?;
            query_objects(c, &others, params![filespace.0, path], &mut out)?;
            out.sort_by_key(|v| std::cmp::Reverse((v.inserted, v.id)));
            Ok(out)
        })
    }

    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        self.with_reader(|c| {
            let mut out = Vec::new();
            query_objects(
                c,
                &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE id = ?1"),
                [id.0],
                &mut out,
            )?;
            Ok(out.pop())
        })
    }

    fn object_chunks(&self, object: ObjectId) -> Result<Vec<ChunkRef>> {
        let Some(obj) = self.object(object)? else {
            return Err(CatalogError::NotFound { what: "object", key: object.0.to_string() });
        };
        self.with_reader(|c| {
            let sql = format!("SELECT {CHUNK_COLUMNS}, hash FROM chunks WHERE id = ?1");
            let mut stmt = c.prepare_cached(&sql).map_err(CatalogError::db("reading chunks"))?;
            obj.chunks
                .iter()
                .map(|id| {
                    let chunk = stmt
                        .query_row([id.0], |r| {
                            let hash: Option<Vec<u8>> = r.get(7)?;
                            Ok((chunk_from_row(r)?, hash))
                        })
                        .optional()
                        .map_err(CatalogError::db("reading chunks"))?;
                    let chunk = chunk.ok_or_else(|| {
                        CatalogError::Damaged(format!(
                            "object {} refers to missing chunk {}",
                            object.0, id.0
                        ))
                    })?;
                    let (chunk, hash) = chunk;
                    let hash = match hash {
                        None => None,
                        Some(h) => Some(<[u8; 32]>::try_from(h).map_err(|_| {
                            CatalogError::Damaged(format!(
                                "chunk {} has an id of the wrong length",
                                id.0
                            ))
                        })?),
                    };
                    Ok(ChunkRef { id: chunk.id, location: chunk.location, hash })
                })
                .collect()
        })
    }

    fn check(&self) -> Result<ConsistencyReport> {
        self.with_reader(|c| {
            let mut report = ConsistencyReport::default();
            let problem = |report: &mut ConsistencyReport, text: String| {
                if report.problems.len() < MAX_PROBLEMS {
                    report.problems.push(text);
                }
            };
            // Read both tables in one snapshot.
            c.execute_batch("BEGIN").map_err(CatalogError::db("checking"))?;
            let result = (|| -> Result<()> {
                let mut refs: HashMap<i64, u64> = HashMap::new();
                let mut stmt = c.prepare("SELECT id, chunk_list FROM objects").map_err(CatalogError::db("checking objects"))?;
                let mut rows = stmt.query([]).map_err(CatalogError::db("checking objects"))?;
                while let Some(row) = rows.next().map_err(CatalogError::db("checking objects"))? {
                    report.objects += 1;
                    let id: i64 = row.get(0).map_err(CatalogError::db("checking objects"))?;
                    let blob: Vec<u8> = row.get(1).map_err(CatalogError::db("checking objects"))?;
                    match chunk_list::decode(&blob) {
                        Ok(list) => list.iter().for_each(|ch| *refs.entry(ch.0).or_default() += 1),
                        Err(e) => problem(&mut report, format!("object {id}: {e}")),
                    }
                }
                let mut stmt = c
                    .prepare("SELECT c.id, c.refcount, c.container_id, k.id FROM chunks c LEFT JOIN containers k ON k.id = c.container_id")
                    .map_err(CatalogError::db("checking chunks"))?;
                let mut rows = stmt.query([]).map_err(CatalogError::db("checking chunks"))?;
                while let Some(row) = rows.next().map_err(CatalogError::db("checking chunks"))? {
                    report.chunks += 1;
                    let id: i64 = row.get(0).map_err(CatalogError::db("checking chunks"))?;
                    let refcount: i64 = row.get(1).map_err(CatalogError::db("checking chunks"))?;
                    let container: i64 = row.get(2).map_err(CatalogError::db("checking chunks"))?;
                    let known: Option<i64> = row.get(3).map_err(CatalogError::db("checking chunks"))?;
                    let counted = refs.remove(&id).unwrap_or(0);
                    if refcount as u64 != counted {
                        problem(&mut report, format!("chunk {id}: reference count {refcount}, but {counted} references"));
                    }
                    if counted == 0 {
                        report.unreferenced_chunks += 1;
                    }
                    if known.is_none() {
                        problem(&mut report, format!("chunk {id}: container {:016x} is not recorded", container as u64));
                    }
                }
                for (id, n) in refs {
                    problem(&mut report, format!("chunk {id} is missing but referenced {n} times"));
                }
                Ok(())
            })();
            let _ = c.execute_batch("COMMIT");
            result.map(|()| report)
        })
    }

    fn objects_using(
        &self,
        chunks: &std::collections::HashSet<ChunkId>,
    ) -> Result<(Vec<crate::VersionRef>, ObjectId)> {
        let op = "finding the objects of chunks";
        let mut found = Vec::new();
        let mut after = 0i64;
        if chunks.is_empty() {
            return Ok((found, ObjectId(after)));
        }
        loop {
            // Pages by id, each its own read: a scan of every version must not pin a snapshot.
            let page: Vec<(i64, i64, Vec<u8>, Vec<u8>)> = self.with_reader(|c| {
                c.prepare_cached(
                    "SELECT id, filespace_id, path, chunk_list FROM objects WHERE id > ?1 ORDER BY id LIMIT ?2",
                )
                .and_then(|mut s| {
                    s.query_map(params![after, INVENTORY_PAGE as i64], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })?
                    .collect()
                })
                .map_err(CatalogError::db(op))
            })?;
            let Some(last) = page.last() else { return Ok((found, ObjectId(after))) };
            after = last.0;
            let full = page.len() == INVENTORY_PAGE;
            for (id, fs, path, blob) in page {
                let list = chunk_list::decode(&blob)
                    .map_err(|e| CatalogError::Damaged(format!("object {id}: {e}")))?;
                if list.iter().any(|c| chunks.contains(c)) {
                    found.push((ObjectId(id), FilespaceId(fs), path));
                }
            }
            if !full {
                return Ok((found, ObjectId(after)));
            }
        }
    }

    fn mark_damaged(
        &self,
        chunks: &[ChunkId],
        objects: &[ObjectId],
        after: ObjectId,
    ) -> Result<()> {
        let conn = lock(&self.writer);
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(classify(&self.path, "starting a transaction"))?;
        let mut t = SqliteTxn {
            conn,
            done: false,
            chunks_gone: !chunks.is_empty(),
            changed: Default::default(),
        };
        let op = "marking chunks and versions damaged";
        for id in chunks {
            t.conn
                .prepare_cached("UPDATE chunks SET damaged = 1 WHERE id = ?1")
                .and_then(|mut s| s.execute([id.0]))
                .map_err(classify(&self.path, op))?;
        }
        // Versions committed since the scan that found `objects`: few, and read in this
        // transaction, so none can slip between the scan and the marks.
        let wanted: std::collections::HashSet<ChunkId> = chunks.iter().copied().collect();
        let mut later = Vec::new();
        {
            let mut stmt = t
                .conn
                .prepare_cached("SELECT id, chunk_list FROM objects WHERE id > ?1")
                .map_err(classify(&self.path, op))?;
            let mut rows = stmt.query([after.0]).map_err(classify(&self.path, op))?;
            while let Some(r) = rows.next().map_err(classify(&self.path, op))? {
                let id: i64 = r.get(0).map_err(classify(&self.path, op))?;
                let blob: Vec<u8> = r.get(1).map_err(classify(&self.path, op))?;
                if chunk_list::decode(&blob)?.iter().any(|c| wanted.contains(c)) {
                    later.push(ObjectId(id));
                }
            }
        }
        for id in objects.iter().chain(&later) {
            // The damaged active versions leave the inventory clients compare with: their
            // filespaces get a new generation.
            let fs: Option<i64> = t
                .conn
                .prepare_cached(
                    "UPDATE objects SET damaged = 1 WHERE id = ?1 RETURNING filespace_id",
                )
                .and_then(|mut s| s.query_row([id.0], |r| r.get(0)).optional())
                .map_err(classify(&self.path, op))?;
            t.changed.extend(fs);
        }
        Box::new(t).commit()
    }

    fn state_value(&self, name: &str) -> Result<Option<i64>> {
        self.with_reader(|c| {
            c.query_row("SELECT value FROM catalog_state WHERE name = ?1", [name], |r| r.get(0))
                .optional()
                .map_err(CatalogError::db("reading the catalog state"))
        })
    }

    fn set_state_value(&self, name: &str, value: i64) -> Result<()> {
        self.with_writer(
            |c| {
                c.execute(
                    "INSERT INTO catalog_state (name, value) VALUES (?1, ?2) \
                     ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    params![name, value],
                )
            },
            "writing the catalog state",
        )
        .map(|_| ())
    }

    fn snapshot(&self, dest: &Path) -> Result<()> {
        // Its own connection: one read transaction that writers never wait for.
        copy_database(&open_connection(&self.path)?, dest)
    }

    fn stats(&self) -> Result<CatalogStats> {
        self.with_reader(|c| {
            let count = |table: &str| -> Result<u64> {
                c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get::<_, i64>(0))
                    .map(|n| n as u64)
                    .map_err(CatalogError::db("counting"))
            };
            let pages: i64 = c
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .map_err(CatalogError::db("measuring"))?;
            let page_size: i64 = c
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .map_err(CatalogError::db("measuring"))?;
            Ok(CatalogStats {
                objects: count("objects")?,
                chunks: count("chunks")?,
                containers: count("containers")?,
                database_bytes: (pages * page_size) as u64,
                damaged_chunks: count("chunks WHERE damaged <> 0")?,
                damaged_objects: count("objects WHERE damaged <> 0")?,
            })
        })
    }

    fn start_session(&self, node: NodeId) -> Result<SessionId> {
        let conn = lock(&self.writer);
        conn.execute(
            "INSERT INTO sessions (node_id, started, state) VALUES (?1, ?2, 'running')",
            params![node.0, crate::now()],
        )
        .map_err(classify(&self.path, "starting a session"))?;
        Ok(SessionId(conn.last_insert_rowid()))
    }

    fn update_session(&self, session: SessionId, bytes: u64, objects: u64) -> Result<()> {
        self.with_writer(
            |c| {
                c.execute(
                    "UPDATE sessions SET bytes = bytes + ?1, objects = objects + ?2 WHERE id = ?3",
                    params![bytes as i64, objects as i64, session.0],
                )
            },
            "updating a session",
        )?;
        Ok(())
    }

    fn end_session(&self, session: SessionId, state: &str) -> Result<()> {
        self.with_writer(
            |c| {
                c.execute(
                    "UPDATE sessions SET ended = ?1, state = ?2 WHERE id = ?3",
                    params![crate::now(), state, session.0],
                )
            },
            "ending a session",
        )?;
        Ok(())
    }

    fn running_sessions(&self) -> Result<Vec<Session>> {
        self.with_reader(|c| {
            let mut stmt = c.prepare_cached("SELECT id, node_id, started, ended, bytes, objects, state FROM sessions WHERE ended IS NULL ORDER BY id").map_err(CatalogError::db("reading sessions"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(Session {
                        id: SessionId(r.get(0)?),
                        node: NodeId(r.get(1)?),
                        started: r.get(2)?,
                        ended: r.get(3)?,
                        bytes: r.get::<_, i64>(4)? as u64,
                        objects: r.get::<_, i64>(5)? as u64,
                        state: r.get(6)?,
                    })
                })
                .map_err(CatalogError::db("reading sessions"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading sessions"))
        })
    }

    fn start_process(&self, kind: &str, detail: &str) -> Result<ProcessId> {
        let conn = lock(&self.writer);
        conn.execute(
            "INSERT INTO processes (kind, started, state, detail) VALUES (?1, ?2, 'running', ?3)",
            params![kind, crate::now(), detail],
        )
        .map_err(classify(&self.path, "starting a process"))?;
        Ok(ProcessId(conn.last_insert_rowid()))
    }

    fn end_process(&self, process: ProcessId, state: &str, detail: &str) -> Result<()> {
        self.with_writer(
            |c| {
                c.execute(
                    "UPDATE processes SET ended = ?1, state = ?2, detail = ?3 WHERE id = ?4",
                    params![crate::now(), state, detail, process.0],
                )
            },
            "ending a process",
        )?;
        Ok(())
    }

    fn process(&self, process: ProcessId) -> Result<Option<Process>> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT id, kind, started, ended, state, detail FROM processes WHERE id = ?1",
                [process.0],
                |r| {
                    Ok(Process {
                        id: ProcessId(r.get(0)?),
                        kind: r.get(1)?,
                        started: r.get(2)?,
                        ended: r.get(3)?,
                        state: r.get(4)?,
                        detail: r.get(5)?,
                    })
                },
            )
            .optional()
            .map_err(CatalogError::db("reading a process"))
        })
    }

    fn log(
        &self,
        severity: Severity,
        message: &str,
        node: Option<NodeId>,
        session: Option<SessionId>,
        process: Option<ProcessId>,
    ) -> Result<()> {
        self.with_writer(
            |c| {
                c.execute(
                    "INSERT INTO activity_log (time, severity, message, node_id, session_id, process_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![crate::now(), severity_code(severity), message, node.map(|n| n.0), session.map(|s| s.0), process.map(|p| p.0)],
                )
            },
            "writing the activity log",
        )?;
        Ok(())
    }

    fn activity(&self, since: Timestamp, limit: u32) -> Result<Vec<ActivityEntry>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare_cached("SELECT id, time, severity, message, node_id, session_id, process_id FROM activity_log WHERE time >= ?1 ORDER BY id LIMIT ?2")
                .map_err(CatalogError::db("reading the activity log"))?;
            let rows = stmt
                .query_map(params![since, i64::from(limit)], |r| {
                    Ok(ActivityEntry {
                        id: r.get(0)?,
                        time: r.get(1)?,
                        severity: match r.get::<_, i64>(2)? {
                            0 => Severity::Info,
                            1 => Severity::Warning,
                            _ => Severity::Error,
                        },
                        message: r.get(3)?,
                        node: r.get::<_, Option<i64>>(4)?.map(NodeId),
                        session: r.get::<_, Option<i64>>(5)?.map(SessionId),
                        process: r.get::<_, Option<i64>>(6)?.map(ProcessId),
                    })
                })
                .map_err(CatalogError::db("reading the activity log"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(CatalogError::db("reading the activity log"))
        })
    }
}

/// A write transaction on the writer connection, held for its whole life.
struct SqliteTxn<'a> {
    conn: MutexGuard<'a, Connection>,
    done: bool,
    /// A chunk lost its last reference or was deleted: the dedup epoch rises at commit.
    chunks_gone: bool,
    /// Filespaces whose active inventory changed: a new generation at commit.
    changed: std::collections::BTreeSet<i64>,
}

impl Drop for SqliteTxn<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// Deletes an object version and releases its chunk references; returns whether a chunk
/// lost its last one.
fn delete_object(c: &Connection, id: ObjectId) -> Result<bool> {
    let mut gone = false;
    let blob: Option<Vec<u8>> = c
        .prepare_cached("SELECT chunk_list FROM objects WHERE id = ?1")
        .and_then(|mut s| s.query_row([id.0], |r| r.get(0)).optional())
        .map_err(CatalogError::db("deleting an object version"))?;
    let blob =
        blob.ok_or_else(|| CatalogError::NotFound { what: "object", key: id.0.to_string() })?;
    for chunk in chunk_list::decode(&blob)? {
        let left: Option<i64> = c
            .prepare_cached(
                "UPDATE chunks SET refcount = refcount - 1 WHERE id = ?1 RETURNING refcount",
            )
            .and_then(|mut s| s.query_row([chunk.0], |r| r.get(0)).optional())
            .map_err(CatalogError::db("releasing a chunk reference"))?;
        gone |= left == Some(0);
    }
    c.prepare_cached("DELETE FROM objects WHERE id = ?1")
        .and_then(|mut s| s.execute([id.0]))
        .map_err(CatalogError::db("deleting an object version"))?;
    Ok(gone)
}

/// A new backup version of `object.path` is about to become active: the inactive versions
/// beyond its class's versions-exist (the active one counts) are deleted in this
/// transaction, as TSM does at backup time, so a file backed up hourly keeps its limit
/// between expirations. The class is the new version's (the domain's default if unbound).
fn enforce_versions_exist(c: &Connection, object: &NewObject) -> Result<bool> {
    let op = "applying versions-exist";
    let limit: i64 = c
        .prepare_cached(
            "SELECT COALESCE(\
                   (SELECT b.versions_exist FROM backup_copygroups b WHERE b.mgmt_class_id = ?1), \
                   (SELECT b.versions_exist FROM filespaces f JOIN nodes n ON n.id = f.node_id \
                      JOIN mgmt_classes m ON m.domain_id = n.domain_id AND m.name = 'standard' \
                      JOIN backup_copygroups b ON b.mgmt_class_id = m.id WHERE f.id = ?2), \
                   ?3)",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    object.mgmt_class.map(|m| m.0),
                    object.filespace.0,
                    i64::from(BackupCopyGroup::default().versions_exist)
                ],
                |r| r.get(0),
            )
        })
        .map_err(CatalogError::db(op))?;
    if limit >= i64::from(crate::expire::NO_LIMIT) {
        return Ok(false);
    }
    // `state <> 1` repeated for the partial index of inactive versions.
    let doomed: Vec<i64> = c
            .prepare_cached(
                "SELECT id FROM objects WHERE filespace_id = ?1 AND path = ?2 AND state <> 1 AND state = 0 \
                 ORDER BY inserted DESC, id DESC LIMIT -1 OFFSET ?3",
            )
            .and_then(|mut s| {
                s.query_map(params![object.filespace.0, object.path, (limit - 1).max(0)], |r| {
                    r.get(0)
                })?
                .collect()
            })
            .map_err(CatalogError::db(op))?;
    let mut gone = false;
    for id in doomed {
        gone |= delete_object(c, ObjectId(id))?;
    }
    Ok(gone)
}

impl Txn for SqliteTxn<'_> {
    fn add_container(&mut self, pool: PoolId, id: ContainerId) -> Result<()> {
        self.conn
            .prepare_cached("INSERT INTO containers (id, pool_id, size, sealed) VALUES (?1, ?2, 0, 0) ON CONFLICT DO NOTHING")
            .and_then(|mut s| s.execute(params![id.0 as i64, pool.0]))
            .map_err(CatalogError::db("recording a container"))?;
        Ok(())
    }

    fn set_container(&mut self, id: ContainerId, size: u64, sealed: bool) -> Result<()> {
        let n = self
            .conn
            .prepare_cached("UPDATE containers SET size = ?1, sealed = ?2 WHERE id = ?3")
            .and_then(|mut s| s.execute(params![size as i64, i64::from(sealed), id.0 as i64]))
            .map_err(CatalogError::db("updating a container"))?;
        if n == 0 {
            return Err(CatalogError::NotFound {
                what: "container",
                key: format!("{:016x}", id.0),
            });
        }
        Ok(())
    }

    fn insert_object(&mut self, object: &NewObject, now: Timestamp) -> Result<ObjectId> {
        if object.kind == ObjectKind::Backup {
            self.changed.insert(object.filespace.0);
        }
        let c = &*self.conn;
        let state = match object.kind {
            ObjectKind::Backup => {
                let replaced = c.prepare_cached("UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND path = ?3 AND state = 1")
                    .and_then(|mut s| s.execute(params![now, object.filespace.0, object.path]))
                    .map_err(CatalogError::db("deactivating the previous version"))?;
                if replaced > 0 {
                    self.chunks_gone |= enforce_versions_exist(c, object)?;
                }
                STATE_ACTIVE
            }
            ObjectKind::Archive => STATE_ARCHIVE,
        };
        let mut ids = Vec::with_capacity(object.chunks.len());
        let mut damaged = false;
        for chunk in &object.chunks {
            match chunk {
                ObjectChunk::New(n) => {
                    c.prepare_cached("INSERT INTO chunks (container_id, frame_offset, stored_len, raw_len, codec, refcount) VALUES (?1, ?2, ?3, ?4, ?5, 1)")
                        .and_then(|mut s| s.execute(params![n.container.0 as i64, n.offset as i64, n.stored_len, n.raw_len, n.codec]))
                        .map_err(|e| {
                            if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) {
                                CatalogError::NotFound { what: "container", key: format!("{:016x}", n.container.0) }
                            } else {
                                CatalogError::Db { op: "inserting a chunk", source: e }
                            }
                        })?;
                    ids.push(ChunkId(c.last_insert_rowid()));
                }
                ObjectChunk::Keyed(n, key) => {
                    // With a scope, the unique index (scope, hash) decides who stored it first:
                    // a second copy adds a reference to the first, and its frame stays
                    // unreferenced for reclamation, unless an audit found the first damaged:
                    // then the new frame repairs every object that refers to the chunk.
                    let id: i64 = c.prepare_cached("INSERT INTO chunks (container_id, frame_offset, stored_len, raw_len, codec, refcount, hash, scope, sealed) VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8) \
                        ON CONFLICT (scope, sealed, hash) WHERE scope IS NOT NULL DO UPDATE SET refcount = refcount + 1, \
                        container_id = CASE WHEN damaged <> 0 THEN excluded.container_id ELSE container_id END, \
                        frame_offset = CASE WHEN damaged <> 0 THEN excluded.frame_offset ELSE frame_offset END, \
                        stored_len = CASE WHEN damaged <> 0 THEN excluded.stored_len ELSE stored_len END, \
                        codec = CASE WHEN damaged <> 0 THEN excluded.codec ELSE codec END, \
                        damaged = 0 RETURNING id")
                        .and_then(|mut s| s.query_row(params![n.container.0 as i64, n.offset as i64, n.stored_len, n.raw_len, n.codec, &key.hash[..], key.scope.map(|s| s.0), i64::from(key.sealed)], |r| r.get(0)))
                        .map_err(|e| {
                            if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) {
                                CatalogError::NotFound { what: "container", key: format!("{:016x}", n.container.0) }
                            } else {
                                CatalogError::Db { op: "inserting a chunk", source: e }
                            }
                        })?;
                    ids.push(ChunkId(id));
                }
                ObjectChunk::Existing(id) => {
                    let found: Option<i64> = c
                        .prepare_cached(
                            "UPDATE chunks SET refcount = refcount + 1 WHERE id = ?1 RETURNING damaged",
                        )
                        .and_then(|mut s| s.query_row([id.0], |r| r.get(0)).optional())
                        .map_err(CatalogError::db("referencing a chunk"))?;
                    match found {
                        None => {
                            return Err(CatalogError::NotFound {
                                what: "chunk",
                                key: id.0.to_string(),
                            });
                        }
                        // Looked up before an audit marked it: the version is damaged too, so
                        // the next incremental backup sends its file again.
                        Some(d) => damaged |= d != 0,
                    }
                    ids.push(*id);
                }
            }
        }
        let a = &object.attrs;
        c.prepare_cached(
            "INSERT INTO objects (filespace_id, state, path, object_type, size, mtime_ns, ctime_ns, mode, uid, gid, inserted, mgmt_class_id, description, retain_until, link_target, chunk_list, ino, damaged, meta) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
        )
        .and_then(|mut s| {
            s.execute(params![
                object.filespace.0,
                state,
                object.path,
                object.object_type.code(),
                a.size as i64,
                a.mtime_ns,
                a.ctime_ns,
                a.mode,
                a.uid,
                a.gid,
                now,
                object.mgmt_class.map(|m| m.0),
                object.description,
                object.retain_until,
                a.link_target,
                chunk_list::encode(&ids),
                a.ino as i64,
                i64::from(damaged),
                crate::meta::encode(a),
            ])
        })
        .map_err(|e| {
            if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) {
                CatalogError::NotFound { what: "filespace or management class", key: format!("{} / {:?}", object.filespace.0, object.mgmt_class) }
            } else {
                CatalogError::Db { op: "inserting an object version", source: e }
            }
        })?;
        Ok(ObjectId(c.last_insert_rowid()))
    }

    fn deactivate(&mut self, filespace: FilespaceId, path: &[u8], now: Timestamp) -> Result<bool> {
        self.changed.insert(filespace.0);
        let n = self
            .conn
            .prepare_cached("UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND path = ?3 AND state = 1")
            .and_then(|mut s| s.execute(params![now, filespace.0, path]))
            .map_err(CatalogError::db("deactivating a version"))?;
        Ok(n > 0)
    }

    fn delete_object(&mut self, id: ObjectId) -> Result<()> {
        self.chunks_gone |= delete_object(&self.conn, id)?;
        Ok(())
    }

    fn deactivate_tree(
        &mut self,
        filespace: FilespaceId,
        path: &[u8],
        now: Timestamp,
    ) -> Result<u64> {
        self.changed.insert(filespace.0);
        let mut n = 0;
        // Everything in `path/`: from "path/" up to, not including, "path0" ('0' follows '/'),
        // one range of the active index. The root's (empty path's) subtree is everything.
        let result = if path.is_empty() {
            self.conn
                .prepare_cached(
                    "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND state = 1",
                )
                .and_then(|mut s| s.execute(params![now, filespace.0]))
        } else {
            let (mut low, mut high) = (path.to_vec(), path.to_vec());
            low.push(b'/');
            high.push(b'0');
            self.conn
                .prepare_cached(
                    "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND state = 1 \
                     AND path >= ?3 AND path < ?4",
                )
                .and_then(|mut s| s.execute(params![now, filespace.0, low, high]))
        };
        n += result.map_err(CatalogError::db("deactivating a tree"))? as u64;
        Ok(n)
    }

    fn move_chunk(
        &mut self,
        id: ChunkId,
        from: (ContainerId, u64),
        container: ContainerId,
        offset: u64,
    ) -> Result<()> {
        let n = self
            .conn
            .prepare_cached(
                "UPDATE chunks SET container_id = ?1, frame_offset = ?2 WHERE id = ?3 \
                 AND container_id = ?4 AND frame_offset = ?5",
            )
            .and_then(|mut s| {
                s.execute(params![
                    container.0 as i64,
                    offset as i64,
                    id.0,
                    from.0.0 as i64,
                    from.1 as i64
                ])
            })
            .map_err(CatalogError::db("moving a chunk"))?;
        if n == 0 {
            let exists: bool = self
                .conn
                .prepare_cached("SELECT count(*) FROM chunks WHERE id = ?1")
                .and_then(|mut s| s.query_row([id.0], |r| r.get::<_, i64>(0)))
                .map_err(CatalogError::db("moving a chunk"))?
                > 0;
            return Err(if exists {
                CatalogError::Refused(format!("chunk {} moved since it was read", id.0))
            } else {
                CatalogError::NotFound { what: "chunk", key: id.0.to_string() }
            });
        }
        Ok(())
    }

    fn delete_chunk(&mut self, id: ChunkId) -> Result<()> {
        let c = &*self.conn;
        let refcount: Option<i64> = c
            .prepare_cached("SELECT refcount FROM chunks WHERE id = ?1")
            .and_then(|mut s| s.query_row([id.0], |r| r.get(0)).optional())
            .map_err(CatalogError::db("deleting a chunk"))?;
        match refcount {
            None => Err(CatalogError::NotFound { what: "chunk", key: id.0.to_string() }),
            Some(n) if n > 0 => {
                Err(CatalogError::Refused(format!("chunk {} is still referenced {n} times", id.0)))
            }
            Some(_) => {
                c.prepare_cached("DELETE FROM chunks WHERE id = ?1")
                    .and_then(|mut s| s.execute([id.0]))
                    .map_err(CatalogError::db("deleting a chunk"))?;
                self.chunks_gone = true;
                Ok(())
            }
        }
    }

    fn delete_container(&mut self, id: ContainerId) -> Result<()> {
        let c = &*self.conn;
        let chunks: i64 = c
            .prepare_cached("SELECT count(*) FROM chunks WHERE container_id = ?1")
            .and_then(|mut s| s.query_row([id.0 as i64], |r| r.get(0)))
            .map_err(CatalogError::db("deleting a container"))?;
        if chunks > 0 {
            return Err(CatalogError::Refused(format!(
                "container {:016x} still holds {chunks} chunks",
                id.0
            )));
        }
        c.prepare_cached("DELETE FROM containers WHERE id = ?1")
            .and_then(|mut s| s.execute([id.0 as i64]))
            .map_err(CatalogError::db("deleting a container"))?;
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        if self.chunks_gone {
            bump_epoch(&self.conn)?;
        }
        for fs in &self.changed {
            self.conn
                .prepare_cached("UPDATE filespaces SET generation = random() WHERE id = ?1")
                .and_then(|mut s| s.execute([fs]))
                .map_err(CatalogError::db("renewing a filespace's generation"))?;
        }
        // A full disk shows at commit, when the transaction's pages go to the WAL.
        let path = PathBuf::from(self.conn.path().unwrap_or_default());
        self.conn.execute_batch("COMMIT").map_err(classify(&path, "committing"))?;
        self.done = true;
        Ok(())
    }
}

fn to_sql_value(v: &crate::copy::Value) -> rusqlite::types::Value {
    use crate::copy::Value;
    match v {
        Value::Null => rusqlite::types::Value::Null,
        Value::Int(i) => rusqlite::types::Value::Integer(*i),
        Value::Text(s) => rusqlite::types::Value::Text(s.clone()),
        Value::Bytes(b) => rusqlite::types::Value::Blob(b.clone()),
    }
}

fn from_sql_value(v: rusqlite::types::ValueRef<'_>, table: &str) -> Result<crate::copy::Value> {
    use crate::copy::Value;
    use rusqlite::types::ValueRef;
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Text(t) => Value::Text(String::from_utf8(t.to_vec()).map_err(|_| {
            CatalogError::Damaged(format!("text in table {table} that is not UTF-8"))
        })?),
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
        ValueRef::Real(r) => {
            return Err(CatalogError::Damaged(format!("a real number {r} in table {table}")));
        }
    })
}

impl crate::copy::RawTables for SqliteCatalog {
    fn export(&self, sink: &mut crate::copy::RowSink<'_>) -> Result<()> {
        let op = "reading the catalog for a copy";
        crate::copy::check_version(self.schema_version()?)?;
        self.with_reader(|c| {
            // One read transaction: every table as of one moment.
            c.execute_batch("BEGIN").map_err(CatalogError::db(op))?;
            let result = (|| {
                for table in crate::copy::TABLES {
                    let mut stmt =
                        c.prepare(&crate::copy::select_sql(table)).map_err(CatalogError::db(op))?;
                    let mut rows = stmt.query([]).map_err(CatalogError::db(op))?;
                    let mut values = Vec::with_capacity(table.1.len());
                    while let Some(row) = rows.next().map_err(CatalogError::db(op))? {
                        values.clear();
                        for i in 0..table.1.len() {
                            let v = row.get_ref(i).map_err(CatalogError::db(op))?;
                            values.push(from_sql_value(v, table.0)?);
                        }
                        sink(table, &values)?;
                    }
                }
                Ok(())
            })();
            let _ = c.execute_batch("COMMIT");
            result
        })
    }

    fn import(
        &self,
        feed: &mut dyn FnMut(&mut crate::copy::RowSink<'_>) -> Result<()>,
    ) -> Result<()> {
        let op = "writing a copy into the catalog";
        crate::copy::check_version(self.schema_version()?)?;
        let conn = lock(&self.writer);
        conn.execute_batch("BEGIN IMMEDIATE").map_err(CatalogError::db(op))?;
        let result = (|| {
            // The servers running on the replaced content go with it (copy::EPHEMERAL).
            let tables = crate::copy::TABLES.iter().rev().map(|t| t.0);
            for table in tables.chain(crate::copy::EPHEMERAL.iter().copied()) {
                conn.execute(&format!("DELETE FROM {table}"), []).map_err(CatalogError::db(op))?;
            }
            feed(&mut |table, row| {
                let sql = crate::copy::insert_sql(table, |i| format!("?{i}"));
                let mut stmt = conn.prepare_cached(&sql).map_err(CatalogError::db(op))?;
                stmt.execute(rusqlite::params_from_iter(row.iter().map(to_sql_value)))
                    .map_err(CatalogError::db(op))?;
                Ok(())
            })?;
            // AUTOINCREMENT already continues after the largest id inserted.
            conn.execute_batch("COMMIT").map_err(CatalogError::db(op))
        })();
        if result.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        result
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// A connection of this catalog seen through [`crate::sql::Sql`].
struct SqliteSql<'a> {
    conn: &'a Connection,
    path: &'a Path,
    op: &'static str,
}

impl crate::sql::Sql for SqliteSql<'_> {
    fn exec(&mut self, sql: &str, params: &[crate::copy::Value]) -> Result<u64> {
        let params = rusqlite::params_from_iter(params.iter().map(to_sql_value));
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(params))
            .map(|n| n as u64)
            .map_err(classify(self.path, self.op))
    }

    fn rows(
        &mut self,
        sql: &str,
        params: &[crate::copy::Value],
    ) -> Result<Vec<Vec<crate::copy::Value>>> {
        let params = rusqlite::params_from_iter(params.iter().map(to_sql_value));
        let mut stmt = self.conn.prepare_cached(sql).map_err(classify(self.path, self.op))?;
        let columns = stmt.column_count();
        let mut rows = stmt.query(params).map_err(classify(self.path, self.op))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(classify(self.path, self.op))? {
            let mut values = Vec::with_capacity(columns);
            for i in 0..columns {
                let v = row.get_ref(i).map_err(classify(self.path, self.op))?;
                values.push(from_sql_value(v, self.op)?);
            }
            out.push(values);
        }
        Ok(out)
    }
}

impl crate::sql::Backend for SqliteCatalog {
    fn write_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn crate::sql::Sql) -> Result<()>,
    ) -> Result<()> {
        let conn = lock(&self.writer);
        conn.execute_batch("BEGIN IMMEDIATE").map_err(classify(&self.path, op))?;
        let result = f(&mut SqliteSql { conn: &conn, path: &self.path, op })
            .and_then(|()| conn.execute_batch("COMMIT").map_err(classify(&self.path, op)));
        if result.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        result
    }

    fn read_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn crate::sql::Sql) -> Result<()>,
    ) -> Result<()> {
        self.with_reader(|conn| f(&mut SqliteSql { conn, path: &self.path, op }))
    }
}
