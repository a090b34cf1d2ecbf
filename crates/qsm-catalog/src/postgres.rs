//! The PostgreSQL catalog: the same schema and migrations as SQLite (numbered identically,
//! spelled by [`Dialect::Postgres`]), for sites past one machine and for several servers
//! sharing one catalog.
//!
//! ## Why tokio-postgres, driven this way
//! The [`Catalog`] interface is synchronous (the server calls it from blocking threads, the
//! embedded server and the tools from plain ones) but some calls come from threads of the
//! server's async runtime. The blocking `postgres` wrapper panics there ("cannot start a
//! runtime from within a runtime"), and so does any `Runtime::block_on`. So the catalog owns
//! a small runtime of its own that drives the connections' sockets, and a call waits for its
//! query with `futures_executor::block_on`: a tokio-postgres client future only talks to its
//! connection task through channels, so it can be awaited from any thread. `sqlx` would have
//! meant moving the SQLite catalog to it too (its SQLite and rusqlite cannot coexist), and
//! `deadpool-postgres` spawns onto the caller's runtime; the pool here is a few lines.
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

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_executor::block_on;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, Statement};

use crate::copy::{self, Value};
use crate::error::{CatalogError, Result};
use crate::migrations::{self, Dialect, LATEST};
use crate::sql::{self, Arg, Open, Sql};

/// Idle connections kept open for reuse.
const MAX_IDLE: usize = 8;
/// Connections open at once at most; a caller beyond waits, up to [`POOL_WAIT`].
const MAX_OPEN: usize = 32;
const POOL_WAIT: Duration = Duration::from_secs(60);
/// How long a new connection is retried (PostgreSQL restarting takes a few seconds).
const CONNECT_FOR: Duration = Duration::from_secs(15);
/// The advisory lock migrations hold ("QSM" in ASCII).
const MIGRATION_LOCK: i64 = 0x0051_534d;

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

fn pg(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CatalogError {
    move |source| CatalogError::Pg { op, source }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection with its prepared statements, by their text as written (`?N`).
struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    /// The statements of [`Sql::insert`], each with `RETURNING id` appended.
    inserts: HashMap<String, Statement>,
    /// Set when a statement failed in a way that may leave the session unusable.
    broken: bool,
}

impl Conn {
    fn statement(&mut self, sql: &str, op: &'static str) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = block_on(self.client.prepare(&sql::dollar_placeholders(sql))).map_err(pg(op))?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    fn insert_statement(&mut self, sql: &str, op: &'static str) -> Result<Statement> {
        if let Some(s) = self.inserts.get(sql) {
            return Ok(s.clone());
        }
        let returning = format!("{} RETURNING id", sql::dollar_placeholders(sql));
        let s = block_on(self.client.prepare(&returning)).map_err(pg(op))?;
        self.inserts.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    fn note<T>(
        &mut self,
        r: std::result::Result<T, tokio_postgres::Error>,
        op: &'static str,
    ) -> Result<T> {
        r.map_err(|e| {
            if self.client.is_closed() {
                self.broken = true;
            }
            CatalogError::Pg { op, source: e }
        })
    }

    fn query(&mut self, sql: &str, params: Params<'_>, op: &'static str) -> Result<Vec<Row>> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.query(&s, params));
        self.note(r, op)
    }

    fn one(&mut self, sql: &str, params: Params<'_>, op: &'static str) -> Result<Row> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.query_one(&s, params));
        self.note(r, op)
    }

    fn exec(&mut self, sql: &str, params: Params<'_>, op: &'static str) -> Result<u64> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.execute(&s, params));
        self.note(r, op)
    }

    fn batch(&mut self, sql: &str, op: &'static str) -> Result<()> {
        let r = block_on(self.client.batch_execute(sql));
        self.note(r, op)
    }
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize, op: &'static str) -> Result<T> {
    row.try_get(i).map_err(pg(op))
}

/// The connections: made on demand, kept while idle, dropped when broken.
struct Connections {
    config: tokio_postgres::Config,
    tls: crate::pg_tls::Tls,
    runtime: Option<tokio::runtime::Runtime>,
    idle: Mutex<Vec<Conn>>,
    open: Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Drop for Connections {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics on an async thread; this does not.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A connection taken from the pool; back to it on drop unless broken.
struct Lease<'a> {
    pool: &'a Connections,
    conn: Option<Conn>,
}

impl std::ops::Deref for Lease<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        // Present from creation to drop.
        self.conn.as_ref().unwrap_or_else(|| unreachable!("a lease holds its connection"))
    }
}

impl std::ops::DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().unwrap_or_else(|| unreachable!("a lease holds its connection"))
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let keep = !conn.broken && !conn.client.is_closed();
            let mut idle = lock(&self.pool.idle);
            if keep && idle.len() < MAX_IDLE {
                idle.push(conn);
                drop(idle);
                // A caller waiting for a connection takes this one. Notified under the lock
                // it waits with, so the wake-up cannot fall between its look at the idle
                // list and its wait.
                let _open = lock(&self.pool.open);
                self.pool.freed.notify_one();
            } else {
                drop(idle);
                *lock(&self.pool.open) -= 1;
                self.pool.freed.notify_one();
            }
        }
    }
}

impl Connections {
    fn connect_once(&self) -> std::result::Result<Client, tokio_postgres::Error> {
        let rt = self.runtime.as_ref().unwrap_or_else(|| unreachable!("runtime lives until drop"));
        let (config, tls) = (self.config.clone(), self.tls.clone());
        // The connection task must run on the catalog's runtime; its handle can be awaited
        // from anywhere.
        let task = rt.spawn(async move {
            let client = match tls {
                crate::pg_tls::Tls::Off => {
                    let (client, connection) = config.connect(NoTls).await?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    client
                }
                crate::pg_tls::Tls::On(tls) => {
                    let (client, connection) = config.connect(tls).await?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    client
                }
            };
            Ok::<_, tokio_postgres::Error>(client)
        });
        match block_on(task) {
            Ok(r) => r,
            Err(join) => {
                // Only a panic in the driver (cancellation never happens: the runtime lives
                // as long as the pool); report it as a closed connection.
                std::panic::resume_unwind(join.into_panic())
            }
        }
    }

    fn connect(&self) -> Result<Conn> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match self.connect_once() {
                Ok(client) => {
                    return Ok(Conn {
                        client,
                        statements: HashMap::new(),
                        inserts: HashMap::new(),
                        broken: false,
                    });
                }
                // Refused, reset, "the database system is starting up": worth waiting for.
                // A certificate refused stays refused: not waited for.
                Err(e)
                    if started.elapsed() < CONNECT_FOR
                        && !crate::pg_tls::is_refused_certificate(&e)
                        && (e.code().is_none()
                            || e.code() == Some(&SqlState::CANNOT_CONNECT_NOW)) =>
                {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    return Err(CatalogError::Pg { op: "connecting to PostgreSQL", source: e });
                }
            }
        }
    }

    fn get(&self) -> Result<Lease<'_>> {
        {
            // An idle connection, or room for a new one, or a wait for either. A lease
            // returning its connection notifies under this lock (see its Drop): a connection
            // that turns idle wakes a waiter at once.
            let mut open = lock(&self.open);
            let deadline = Instant::now() + POOL_WAIT;
            loop {
                if let Some(conn) = lock(&self.idle).pop() {
                    return Ok(Lease { pool: self, conn: Some(conn) });
                }
                if *open < MAX_OPEN {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(CatalogError::Refused(format!(
                        "all {MAX_OPEN} PostgreSQL connections stayed busy for {} s",
                        POOL_WAIT.as_secs()
                    )));
                }
                open = self
                    .freed
                    .wait_timeout(open, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            *open += 1;
        }
        match self.connect() {
            Ok(conn) => Ok(Lease { pool: self, conn: Some(conn) }),
            Err(e) => {
                *lock(&self.open) -= 1;
                self.freed.notify_one();
                Err(e)
            }
        }
    }
}

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
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("qsm-postgres")
            .enable_all()
            .build()
            .map_err(|e| CatalogError::Refused(format!("starting the PostgreSQL driver: {e}")))?;
        Ok(PostgresCatalog {
            url: shown,
            pool: Connections {
                config,
                tls,
                runtime: Some(runtime),
                idle: Mutex::new(Vec::new()),
                open: Mutex::new(0),
                freed: std::sync::Condvar::new(),
            },
        })
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

/// A connection of this catalog seen through [`Sql`].
struct PgSql<'a> {
    conn: &'a mut Conn,
    op: &'static str,
}

/// `args` as the driver takes them.
fn refs<'a>(args: &'a [Arg<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

impl Sql for PgSql<'_> {
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

/// A connection of the pool in a transaction, held until it ends.
struct PgOpen<'a> {
    lease: Lease<'a>,
    op: &'static str,
    done: bool,
}

impl Sql for PgOpen<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        PgSql { conn: &mut self.lease, op: self.op }.execute(sql, args)
    }
    fn insert(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<i64> {
        PgSql { conn: &mut self.lease, op: self.op }.insert(sql, args)
    }
    fn each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&dyn crate::sql::Row) -> Result<()>,
    ) -> Result<()> {
        PgSql { conn: &mut self.lease, op: self.op }.each(sql, args, f)
    }
}

impl Open for PgOpen<'_> {
    fn set_op(&mut self, op: &'static str) {
        self.op = op;
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        self.lease.batch("COMMIT", "committing")?;
        self.done = true;
        Ok(())
    }
}

impl Drop for PgOpen<'_> {
    fn drop(&mut self) {
        if !self.done && self.lease.batch("ROLLBACK", "rolling back").is_err() {
            self.lease.broken = true;
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
        self.read(|c| f(&mut PgSql { conn: c, op }))
    }

    fn snapshot_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()> {
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", op)?;
        let result = f(&mut PgSql { conn: &mut c, op });
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
        f(&mut PgSql { conn: &mut c, op })
    }

    fn open_txn(&self, op: &'static str) -> Result<Box<dyn Open + '_>> {
        let mut lease = self.pool.get().map_err(|e| self.named(e))?;
        lease.batch("BEGIN", op)?;
        Ok(Box::new(PgOpen { lease, op, done: false }))
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
