//! The PostgreSQL catalog: the same schema and migrations as SQLite (numbered identically,
//! spelled by [`Dialect::Postgres`]), for sites past one machine and for several servers
//! sharing one catalog.
//!
//! The connections are [`crate::pg_pool`]'s; this module opens the catalog on them, migrates
//! it, and gives the SQL written once ([`crate::imp`]) its transactions.
//!
//! ## Concurrency comes from the database
//! No process-local lock is relied on: several servers may share the catalog. Transactions
//! run at READ COMMITTED; every read-modify-write is one statement on the rows it changes
//! (reference counts are `refcount = refcount ± 1`, a chunk is deleted only `WHERE refcount
//! = 0`, a deduplicated chunk is inserted under its unique index with `ON CONFLICT`, a move is
//! conditional on where the chunk was), so concurrent transactions serialise on row locks,
//! never on a lost update. Schema migrations take an advisory lock, so two servers starting
//! on a new database do not both migrate it.
//!
//! A connection that breaks (PostgreSQL restarted) is dropped from the pool; reads are retried
//! once on a new connection, writes report the error (whether they committed is unknown to
//! the caller, and the commit protocol makes a repeated backup safe).

use std::ops::DerefMut;
use std::path::Path;
use std::time::Duration;

use futures_executor::block_on;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};

use crate::copy::{self, Value};
use crate::error::{CatalogError, Result};
use crate::migrations::{self, Dialect, LATEST};
use crate::pg_pool::{Conn, Connections, Lease, get};
use crate::sql::{Arg, Open, Sql};

/// The advisory lock migrations hold ("QSM" in ASCII).
const MIGRATION_LOCK: i64 = 0x0051_534d;

/// The PostgreSQL catalog.
pub struct PostgresCatalog {
    url: String,
    pool: Connections,
}

impl std::fmt::Debug for PostgresCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCatalog").field("url", &self.url).finish()
    }
}

/// `url` without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    // postgres://user:password@host/... and key=value strings with password=...
    if let Some(rest) = url.split_once("://").map(|(_, r)| r)
        && let Some((auth, _)) = rest.split_once('@')
        && let Some((user, _)) = auth.split_once(':')
    {
        return url.replacen(auth, &format!("{user}:***"), 1);
    }
    url.split_whitespace()
        .map(|kv| if kv.starts_with("password=") { "password=***" } else { kv })
        .collect::<Vec<_>>()
        .join(" ")
}

impl PostgresCatalog {
    /// Connects to the database at `url` (`postgres://user@host:port/db` or key=value form),
    /// creating the schema in an empty database and migrating an older one. A database with
    /// other tables but no QSM schema, or one written by a newer program, is refused.
    pub fn open(url: &str) -> Result<PostgresCatalog> {
        PostgresCatalog::open_at(url, LATEST)
    }

    /// Opens and migrates only up to `version` (for migration tests).
    pub fn open_at(url: &str, version: u32) -> Result<PostgresCatalog> {
        let cat = PostgresCatalog::connect_only(url)?;
        let mut c = cat.pool.get().map_err(|e| cat.named(e))?;
        migrate(&mut c, &cat.url, version)?;
        drop(c);
        Ok(cat)
    }

    /// The connection string without its password.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn named(&self, e: CatalogError) -> CatalogError {
        match e {
            CatalogError::Pg { op, source } => CatalogError::Unavailable {
                what: self.url.clone(),
                detail: format!("{op}: {}", crate::error::pg_detail(&source)),
            },
            other => other,
        }
    }

    /// A read: retried once on a new connection if the first one turned out to be broken.
    fn read<T>(&self, mut f: impl FnMut(&mut Conn) -> Result<T>) -> Result<T> {
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        match f(&mut c) {
            Err(_) if c.broken => {
                drop(c);
                let mut c = self.pool.get().map_err(|e| self.named(e))?;
                f(&mut c)
            }
            r => r,
        }
    }
}

fn read_version(c: &mut Conn, url: &str) -> Result<u32> {
    let op = "reading the schema version";
    let has: bool = get(&c.one("SELECT to_regclass('qsm_schema') IS NOT NULL", &[], op)?, 0, op)?;
    if !has {
        let others: i64 = get(
            &c.one(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
                &[],
                op,
            )?,
            0,
            op,
        )?;
        if others > 0 {
            return Err(CatalogError::Refused(format!(
                "the database {url} holds {others} tables but no QSM catalog: give QSM a \
                 database of its own"
            )));
        }
        return Ok(0);
    }
    let v: i64 = get(&c.one("SELECT COALESCE(max(version), 0) FROM qsm_schema", &[], op)?, 0, op)?;
    u32::try_from(v).map_err(|_| CatalogError::Damaged(format!("schema version {v} in {url}")))
}

fn migrate(c: &mut Conn, url: &str, version: u32) -> Result<()> {
    let op = "migrating the schema";
    c.batch("BEGIN", op)?;
    let result = (|| {
        // Servers starting at once on one database: the second waits here, then finds the
        // schema migrated.
        c.exec("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK], op)?;
        let found = read_version(c, url)?;
        if found > LATEST {
            return Err(CatalogError::TooNew { path: url.into(), found, supported: LATEST });
        }
        c.batch("CREATE TABLE IF NOT EXISTS qsm_schema (version BIGINT NOT NULL)", op)?;
        for v in found + 1..=version.min(LATEST) {
            let sql = migrations::sql(v, Dialect::Postgres)
                .ok_or_else(|| CatalogError::Damaged(format!("no migration {v}")))?;
            c.batch(&sql, op)?;
        }
        if found < version.min(LATEST) {
            c.exec("DELETE FROM qsm_schema", &[], op)?;
            c.exec(
                "INSERT INTO qsm_schema (version) VALUES ($1)",
                &[&i64::from(version.min(LATEST))],
                op,
            )?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => c.batch("COMMIT", op),
        Err(e) => {
            let _ = c.batch("ROLLBACK", op);
            Err(e)
        }
    }
}

/// Runs `sql` once on a connection of its own to `url` (administration: creating and dropping
/// databases, which cannot run inside a transaction).
pub fn execute_once(url: &str, sql: &str) -> Result<()> {
    let cat = PostgresCatalog::connect_only(url)?;
    let mut c = cat.pool.get().map_err(|e| cat.named(e))?;
    c.batch(sql, "running an administrative statement")
}

/// The names of the databases on the server at `url` that start with `prefix`.
pub fn databases(url: &str, prefix: &str) -> Result<Vec<String>> {
    let cat = PostgresCatalog::connect_only(url)?;
    let mut c = cat.pool.get().map_err(|e| cat.named(e))?;
    let op = "listing databases";
    c.query("SELECT datname FROM pg_database WHERE starts_with(datname, $1)", &[&prefix], op)?
        .iter()
        .map(|r| get(r, 0, op))
        .collect()
}

impl PostgresCatalog {
    /// The pool without opening or migrating a catalog.
    fn connect_only(url: &str) -> Result<PostgresCatalog> {
        let shown = redact(url);
        let (mut config, tls) = crate::pg_tls::parse(url, &shown)?;
        if config.get_application_name().is_none() {
            config.application_name("qsm");
        }
        config.connect_timeout(Duration::from_secs(10));
        Ok(PostgresCatalog { url: shown, pool: Connections::new(config, tls)? })
    }
}

/// An [`Arg`] bound as whatever type the statement wants: the SQL written once binds only
/// integers to BIGINT, text to TEXT, bytes to BYTEA, arrays of those, and NULL to anything.
impl ToSql for Arg<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Int(i) => i.to_sql(ty, out),
            Arg::Text(s) => s.to_sql(ty, out),
            Arg::Bytes(b) => b.to_sql(ty, out),
            Arg::Ints(v) => v.to_sql(ty, out),
            Arg::ByteList(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A row of a result, read in place.
struct PgRow<'a> {
    row: &'a Row,
    op: &'static str,
}

impl PgRow<'_> {
    fn get<'a, T: FromSql<'a>>(&'a self, i: usize) -> Result<T> {
        get(self.row, i, self.op)
    }

    fn type_of(&self, i: usize) -> Option<&Type> {
        self.row.columns().get(i).map(|c| c.type_())
    }
}

impl crate::sql::Row for PgRow<'_> {
    fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.ok_or_else(|| {
            CatalogError::Damaged(format!("{}: column {i} is NULL, an integer expected", self.op))
        })
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        // Counts and the catalog's columns are BIGINT; `EXISTS` is a boolean.
        match self.type_of(i) {
            Some(&Type::INT4) => Ok(self.get::<Option<i32>>(i)?.map(i64::from)),
            Some(&Type::BOOL) => Ok(self.get::<Option<bool>>(i)?.map(i64::from)),
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
        self.get(i)
    }
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        self.get(i)
    }
    fn value(&self, i: usize) -> Result<Value> {
        Ok(match self.type_of(i) {
            Some(&Type::TEXT | &Type::VARCHAR) => {
                self.opt_text(i)?.map_or(Value::Null, Value::Text)
            }
            Some(&Type::BYTEA) => self.opt_bytes(i)?.map_or(Value::Null, Value::Bytes),
            Some(&Type::INT8 | &Type::INT4 | &Type::BOOL) => {
                self.opt_int(i)?.map_or(Value::Null, Value::Int)
            }
            ty => {
                return Err(CatalogError::Damaged(format!(
                    "{}: column {i} has type {ty:?}, not one the catalog uses",
                    self.op
                )));
            }
        })
    }
    fn columns(&self) -> usize {
        self.row.len()
    }
}

/// A connection of this catalog seen through [`Sql`]: borrowed for one call, or leased from
/// the pool by a transaction (`open`), rolled back if dropped uncommitted.
struct PgSql<C: DerefMut<Target = Conn>> {
    conn: C,
    op: &'static str,
    open: bool,
}

/// `args` as the driver takes them.
fn refs<'a>(args: &'a [Arg<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

impl<C: DerefMut<Target = Conn>> Sql for PgSql<C> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        self.conn.exec(sql, &refs(args), self.op)
    }

    fn insert(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<i64> {
        let s = self.conn.insert_statement(sql, self.op)?;
        let r = block_on(self.conn.client.query_one(&s, &refs(args)));
        let row = self.conn.note(r, self.op)?;
        get(&row, 0, self.op)
    }

    fn each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&dyn crate::sql::Row) -> Result<()>,
    ) -> Result<()> {
        for row in &self.conn.query(sql, &refs(args), self.op)? {
            f(&PgRow { row, op: self.op })?;
        }
        Ok(())
    }
}

impl Open for PgSql<Lease<'_>> {
    fn set_op(&mut self, op: &'static str) {
        self.op = op;
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        self.conn.batch("COMMIT", "committing")?;
        self.open = false;
        Ok(())
    }
}

impl<C: DerefMut<Target = Conn>> Drop for PgSql<C> {
    fn drop(&mut self) {
        if self.open && self.conn.batch("ROLLBACK", "rolling back").is_err() {
            self.conn.broken = true;
        }
    }
}

impl crate::sql::Backend for PostgresCatalog {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn read_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        self.read(|c| f(&mut PgSql { conn: c, op, open: false }))
    }

    fn snapshot_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", op)?;
        let result = f(&mut PgSql { conn: &mut *c, op, open: false });
        if c.batch(if result.is_ok() { "COMMIT" } else { "ROLLBACK" }, op).is_err() {
            c.broken = true;
        }
        result
    }

    fn autocommit(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        f(&mut PgSql { conn: &mut *c, op, open: false })
    }

    fn open_txn(&self, op: &'static str) -> Result<Box<dyn Open + '_>> {
        let mut lease = self.pool.get().map_err(|e| self.named(e))?;
        lease.batch("BEGIN", op)?;
        Ok(Box::new(PgSql { conn: lease, op, open: true }))
    }

    fn read_schema_version(&self) -> Result<u32> {
        self.read(|c| read_version(c, &self.url))
    }

    fn copy_to(&self, dest: &Path) -> Result<()> {
        // A SQLite catalog holding this one's rows as of one moment: `backup db` writes one
        // format whatever the backend, and `restore-db` or `migrate-catalog` load it into
        // either.
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dest)
                .map_err(|e| {
                    CatalogError::Refused(format!("cannot create {}: {e}", dest.display()))
                })?;
        }
        let copy = crate::SqliteCatalog::open(dest)?;
        copy::copy_catalog(self, &copy)?;
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    fn location(&self) -> String {
        self.url.clone()
    }
}
