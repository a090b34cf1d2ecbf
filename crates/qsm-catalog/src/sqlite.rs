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

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode};

use crate::error::{CatalogError, Result};
use crate::migrations::{self, Dialect, LATEST};
use crate::sql::{Arg, Open, Row, Sql, Value};

/// Reader connections kept open for reuse.
const MAX_IDLE_READERS: usize = 4;
/// How long a connection waits for a lock held by another process before failing.
const BUSY_TIMEOUT_MS: u32 = 10_000;

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

/// The error of `op` on the catalog at `path`. The path is copied only when there is an
/// error: every statement and row of the hot paths goes through here.
fn classify(path: &Path, op: &'static str) -> impl FnOnce(rusqlite::Error) -> CatalogError {
    move |e| match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            CatalogError::NotADatabase { path: path.to_path_buf(), detail: e.to_string() }
        }
        Some(ErrorCode::DiskFull) => {
            let detail = match space_left(path) {
                Some(free) => format!("{free} bytes free; SQLite: {e}"),
                None => format!("SQLite: {e}"),
            };
            CatalogError::DiskFull { path: path.to_path_buf(), op, detail }
        }
        // SQLite reports ENOSPC on its shared-memory file (growing the WAL index) as a plain
        // "disk I/O error", and a write refused by a catalog opened read-only because its disk
        // was full as "readonly": either, on a disk with (almost) nothing left, is that disk.
        Some(code @ (ErrorCode::SystemIoFailure | ErrorCode::ReadOnly)) => match space_left(path) {
            Some(free) if free < LOW_SPACE => CatalogError::DiskFull {
                path: path.to_path_buf(),
                op,
                detail: format!("{free} bytes free; SQLite: {e}"),
            },
            _ if code == ErrorCode::SystemIoFailure => CatalogError::DiskFailed {
                path: path.to_path_buf(),
                op,
                detail: format!("{} failed; SQLite: {e}", io_step(&e)),
            },
            _ => CatalogError::Db { op, source: e },
        },
        _ => CatalogError::Db { op, source: e },
    }
}

/// Which step of SQLite's I/O an error is (its extended code), for messages.
fn io_step(e: &rusqlite::Error) -> &'static str {
    let rusqlite::Error::SqliteFailure(f, _) = e else { return "an I/O call" };
    match f.extended_code {
        rusqlite::ffi::SQLITE_IOERR_FSYNC | rusqlite::ffi::SQLITE_IOERR_DIR_FSYNC => "a sync",
        rusqlite::ffi::SQLITE_IOERR_WRITE => "a write",
        rusqlite::ffi::SQLITE_IOERR_READ | rusqlite::ffi::SQLITE_IOERR_SHORT_READ => "a read",
        rusqlite::ffi::SQLITE_IOERR_TRUNCATE => "a truncation",
        c if c & 0xff == rusqlite::ffi::SQLITE_IOERR
            && (rusqlite::ffi::SQLITE_IOERR_SHMOPEN..=rusqlite::ffi::SQLITE_IOERR_SHMMAP)
                .contains(&c) =>
        {
            "the shared-memory (-shm) file"
        }
        _ => "an I/O call",
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
        let created =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
        // SQLite syncs the directory when it creates a WAL, never for the database file
        // itself: without this, a power cut could leave the pool and lose the catalog's name
        // (found by tests/powercut.rs, issue 28).
        if created.is_ok() {
            qsm_types::durable::sync_parent(path).map_err(|e| CatalogError::Io {
                op: "syncing the new catalog's directory",
                path: path.to_path_buf(),
                source: e,
            })?;
        }
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

    /// Runs `f` on a reader connection (one of the idle ones, or a new one).
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

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(i) => ValueRef::Integer(i),
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
            Arg::Bytes(b) => ValueRef::Blob(b),
            // `Dialect::arrays` is false here: the SQL written once never binds one.
            Arg::Ints(_) | Arg::ByteList(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "an array parameter, which SQLite cannot bind".into(),
                ));
            }
        }))
    }
}

/// A row of a result, read in place.
struct SqliteRow<'r, 's> {
    row: &'r rusqlite::Row<'s>,
    op: &'static str,
}

impl SqliteRow<'_, '_> {
    fn get<T: rusqlite::types::FromSql>(&self, i: usize) -> Result<T> {
        self.row.get(i).map_err(CatalogError::db(self.op))
    }
}

impl Row for SqliteRow<'_, '_> {
    // Integers and bytes straight from the column's value: `get` converts through `FromSql`
    // and its error type, which an inventory row's twenty columns pay for on every row.
    // Anything else takes `get`, for its error.
    fn int(&self, i: usize) -> Result<i64> {
        match self.row.get_ref(i) {
            Ok(ValueRef::Integer(v)) => Ok(v),
            _ => self.get(i),
        }
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.row.get_ref(i) {
            Ok(ValueRef::Integer(v)) => Ok(Some(v)),
            Ok(ValueRef::Null) => Ok(None),
            _ => self.get(i),
        }
    }
    fn text(&self, i: usize) -> Result<String> {
        self.get(i)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>> {
        self.get(i)
    }
    fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        match self.row.get_ref(i) {
            Ok(ValueRef::Blob(b)) => Ok(b.to_vec()),
            _ => self.get(i),
        }
    }
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        match self.row.get_ref(i) {
            Ok(ValueRef::Blob(b)) => Ok(Some(b.to_vec())),
            Ok(ValueRef::Null) => Ok(None),
            _ => self.get(i),
        }
    }
    fn value(&self, i: usize) -> Result<Value> {
        from_sql_value(self.row.get_ref(i).map_err(CatalogError::db(self.op))?, self.op)
    }
    fn columns(&self) -> usize {
        self.row.as_ref().column_count()
    }
}

/// A connection of this catalog seen through [`Sql`]: a reader or the writer borrowed for
/// one call, or the writer held by a transaction (`open`), rolled back if dropped
/// uncommitted. Statements are prepared once per connection (rusqlite's cache, by the
/// statement's text).
struct SqliteSql<'p, C: Deref<Target = Connection>> {
    conn: C,
    path: &'p Path,
    op: &'static str,
    open: bool,
}

impl<C: Deref<Target = Connection>> Sql for SqliteSql<'_, C> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(rusqlite::params_from_iter(args)))
            .map(|n| n as u64)
            .map_err(classify(self.path, self.op))
    }

    fn insert(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<i64> {
        self.execute(sql, args)?;
        Ok(self.conn.last_insert_rowid())
    }

    fn each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&dyn Row) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(classify(self.path, self.op))?;
        let mut rows =
            stmt.query(rusqlite::params_from_iter(args)).map_err(classify(self.path, self.op))?;
        while let Some(row) = rows.next().map_err(classify(self.path, self.op))? {
            f(&SqliteRow { row, op: self.op })?;
        }
        Ok(())
    }

    fn each_of(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        width: usize,
        f: &mut dyn FnMut(usize, &dyn Row) -> Result<()>,
    ) -> Result<()> {
        // The statement looked up once for all the runs.
        let mut stmt = self.conn.prepare_cached(sql).map_err(classify(self.path, self.op))?;
        for (i, args) in args.chunks(width.max(1)).enumerate() {
            let mut rows = stmt
                .query(rusqlite::params_from_iter(args))
                .map_err(classify(self.path, self.op))?;
            while let Some(row) = rows.next().map_err(classify(self.path, self.op))? {
                f(i, &SqliteRow { row, op: self.op })?;
            }
        }
        Ok(())
    }
}

impl Open for SqliteSql<'_, MutexGuard<'_, Connection>> {
    fn set_op(&mut self, op: &'static str) {
        self.op = op;
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        // A full disk shows at commit, when the transaction's pages go to the WAL.
        self.conn.execute_batch("COMMIT").map_err(classify(self.path, "committing"))?;
        self.open = false;
        Ok(())
    }
}

impl<C: Deref<Target = Connection>> Drop for SqliteSql<'_, C> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

impl crate::sql::Backend for SqliteCatalog {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn read_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        self.with_reader(|conn| f(&mut SqliteSql { conn, path: &self.path, op, open: false }))
    }

    fn snapshot_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        self.with_reader(|conn| {
            // Under WAL a read transaction is one snapshot that no writer waits for.
            conn.execute_batch("BEGIN").map_err(classify(&self.path, op))?;
            let result = f(&mut SqliteSql { conn, path: &self.path, op, open: false });
            let _ = conn.execute_batch(if result.is_ok() { "COMMIT" } else { "ROLLBACK" });
            result
        })
    }

    fn autocommit(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        f(&mut SqliteSql { conn: lock(&self.writer), path: &self.path, op, open: false })
    }

    fn open_txn(&self, op: &'static str) -> Result<Box<dyn Open + '_>> {
        let conn = lock(&self.writer);
        conn.execute_batch("BEGIN IMMEDIATE").map_err(classify(&self.path, op))?;
        Ok(Box::new(SqliteSql { conn, path: &self.path, op, open: true }))
    }

    fn read_schema_version(&self) -> Result<u32> {
        read_version(&lock(&self.writer), &self.path)
    }

    fn copy_to(&self, dest: &Path) -> Result<()> {
        // Its own connection: one read transaction that writers never wait for.
        copy_database(&open_connection(&self.path)?, dest)
    }

    fn shared(&self) -> bool {
        false
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }
}
