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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_executor::block_on;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, NoTls, Row, Statement};

use crate::chunk_list;
use crate::copy::{self, Kind, RawTables, Value};
use crate::error::{CatalogError, Result};
use crate::migrations::{self, Dialect, LATEST, OBJECT_COLUMNS, STATE_ACTIVE, STATE_ARCHIVE};
use crate::model::*;
use crate::{Catalog, Txn};

/// Idle connections kept open for reuse.
const MAX_IDLE: usize = 8;
/// Connections open at once at most; a caller beyond waits, up to [`POOL_WAIT`].
const MAX_OPEN: usize = 32;
const POOL_WAIT: Duration = Duration::from_secs(60);
/// How long a new connection is retried (PostgreSQL restarting takes a few seconds).
const CONNECT_FOR: Duration = Duration::from_secs(15);
/// Versions per page of the streamed inventories.
const PAGE: i64 = 10_000;
const MAX_PROBLEMS: usize = 1000;
/// The advisory lock migrations hold ("QSM" in ASCII).
const MIGRATION_LOCK: i64 = 0x0051_534d;

const CHUNK_COLUMNS: &str = "id, container_id, frame_offset, stored_len, raw_len, codec, refcount";

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

fn pg(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CatalogError {
    move |source| CatalogError::Pg { op, source }
}

fn is_code(e: &CatalogError, code: &SqlState) -> bool {
    matches!(e, CatalogError::Pg { source, .. } if source.code() == Some(code))
}

/// Replaces an error of a refused constraint with `instead()`, passing others through.
fn on_constraint(
    instead: impl FnOnce() -> CatalogError,
) -> impl FnOnce(CatalogError) -> CatalogError {
    move |e| if constraint(&e) { instead() } else { e }
}

/// A unique, foreign-key or check constraint refused a write (SQLite's ConstraintViolation).
fn constraint(e: &CatalogError) -> bool {
    matches!(e, CatalogError::Pg { source, .. }
        if source.code().is_some_and(|c| c.code().starts_with("23")))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection with its prepared statements.
struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    /// Set when a statement failed in a way that may leave the session unusable.
    broken: bool,
}

impl Conn {
    fn statement(&mut self, sql: &str, op: &'static str) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = block_on(self.client.prepare(sql)).map_err(pg(op))?;
        self.statements.insert(sql.to_owned(), s.clone());
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

    fn opt(&mut self, sql: &str, params: Params<'_>, op: &'static str) -> Result<Option<Row>> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.query_opt(&s, params));
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
                    return Ok(Conn { client, statements: HashMap::new(), broken: false });
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

    /// A write outside a [`Txn`]: one statement or its own transaction, never retried.
    fn write<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        f(&mut c)
    }

    /// Runs `f` in a transaction of its own.
    fn in_txn<T>(&self, op: &'static str, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        c.batch("BEGIN", op)?;
        match f(&mut c) {
            Ok(v) => {
                c.batch("COMMIT", op)?;
                Ok(v)
            }
            Err(e) => {
                if c.batch("ROLLBACK", op).is_err() {
                    c.broken = true;
                }
                Err(e)
            }
        }
    }

    /// One page of [`Catalog::for_each_version`], as on SQLite ([`crate::paging`]): every
    /// version of the next paths after `after`, read along the two partial indexes in one
    /// short read-only transaction (repeatable read, so the page is one snapshot), and the
    /// page's last path (`None` for the last page).
    fn versions_page(
        &self,
        filespace: FilespaceId,
        after: Option<&[u8]>,
    ) -> Result<(Vec<ObjectVersion>, Option<Vec<u8>>)> {
        let arm = |states: &str, from: &str| {
            format!(
                "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = $1 AND {states}{from} ORDER BY path LIMIT $2"
            )
        };
        let rest = format!(
            "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = $1 AND state <> 1 AND path = $2"
        );
        let limit = crate::paging::VERSION_ARM as i64;
        self.in_txn("listing versions", |c| {
            c.batch(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
                "listing versions",
            )?;
            let (mut active, mut inactive) = (Vec::new(), Vec::new());
            match after {
                None => {
                    query_objects(c, &arm("state = 1", ""), &[&filespace.0, &limit], &mut active)?;
                    query_objects(
                        c,
                        &arm("state <> 1", ""),
                        &[&filespace.0, &limit],
                        &mut inactive,
                    )?;
                }
                Some(a) => {
                    let from = " AND path > $3";
                    query_objects(
                        c,
                        &arm("state = 1", from),
                        &[&filespace.0, &limit, &a],
                        &mut active,
                    )?;
                    query_objects(
                        c,
                        &arm("state <> 1", from),
                        &[&filespace.0, &limit, &a],
                        &mut inactive,
                    )?;
                }
            }
            let (last, reread) = crate::paging::cut(&mut active, &mut inactive);
            if let (Some(path), true) = (&last, reread) {
                query_objects(c, &rest, &[&filespace.0, path], &mut inactive)?;
            }
            Ok((crate::paging::sorted(active, inactive), last))
        })
    }

    fn expirable_page(
        &self,
        filespace: FilespaceId,
        after: &crate::expire::ExpiryCursor,
    ) -> Result<Vec<crate::expire::ExpiryRow>> {
        let op = "listing expirable versions";
        self.read(|c| {
            let rows = c.query(
                "SELECT o.id, o.path, o.state, o.inserted, o.deactivated, o.retain_until, o.mgmt_class_id, \
                 EXISTS (SELECT 1 FROM objects a WHERE a.filespace_id = o.filespace_id AND a.path = o.path AND a.state = 1) \
                 FROM objects o WHERE o.filespace_id = $1 AND o.state <> 1 AND (o.path, o.state, o.id) > ($2, $3, $4) \
                 ORDER BY o.path, o.state, o.id LIMIT $5",
                &[&filespace.0, &after.0, &after.1, &after.2, &PAGE],
                op,
            )?;
            rows.iter()
                .map(|r| {
                    Ok(crate::expire::ExpiryRow {
                        id: ObjectId(get(r, 0, op)?),
                        path: get(r, 1, op)?,
                        archive: get::<i64>(r, 2, op)? == STATE_ARCHIVE,
                        inserted: get(r, 3, op)?,
                        deactivated: get(r, 4, op)?,
                        retain_until: get(r, 5, op)?,
                        mgmt_class: get::<Option<i64>>(r, 6, op)?.map(MgmtClassId),
                        has_active: get(r, 7, op)?,
                    })
                })
                .collect()
        })
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

fn object_from_row(row: &Row) -> Result<ObjectVersion> {
    let op = "reading an object version";
    let state: i64 = get(row, 2, op)?;
    let code: i64 = get(row, 4, op)?;
    let id: i64 = get(row, 0, op)?;
    let object_type = ObjectType::from_code(code)
        .ok_or_else(|| CatalogError::Damaged(format!("object {id} has unknown type {code}")))?;
    let blob: Vec<u8> = get(row, 17, op)?;
    let int = |i: usize| -> Result<i64> { get::<i64>(row, i, op) };
    let meta: Option<Vec<u8>> = get(row, 20, op)?;
    let mut v = ObjectVersion {
        id: ObjectId(id),
        filespace: FilespaceId(int(1)?),
        path: get(row, 3, op)?,
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
            link_target: get(row, 16, op)?,
            ino: int(18)? as u64,
            // The rest is in the `meta` column, read below.
            ..Attributes::default()
        },
        inserted: int(11)?,
        deactivated: get(row, 12, op)?,
        mgmt_class: get::<Option<i64>>(row, 13, op)?.map(MgmtClassId),
        description: get(row, 14, op)?,
        retain_until: get(row, 15, op)?,
        chunks: chunk_list::decode(&blob)
            .map_err(|e| CatalogError::Damaged(format!("object {id}: {e}")))?,
        damaged: int(19)? != 0,
    };
    crate::meta::apply(id, meta.as_deref(), &mut v.attrs)?;
    Ok(v)
}

fn chunk_from_row(row: &Row) -> Result<Chunk> {
    let op = "reading a chunk";
    let int = |i: usize| -> Result<i64> { get::<i64>(row, i, op) };
    Ok(Chunk {
        id: ChunkId(int(0)?),
        location: NewChunk {
            container: ContainerId(int(1)? as u64),
            offset: int(2)? as u64,
            stored_len: int(3)? as u32,
            raw_len: int(4)? as u32,
            codec: int(5)? as u16,
        },
        refcount: int(6)? as u64,
    })
}

fn node_from_row(r: &Row) -> Result<Node> {
    let op = "reading a node";
    Ok(Node {
        id: NodeId(get(r, 0, op)?),
        name: get(r, 1, op)?,
        password_hash: get(r, 2, op)?,
        domain: DomainId(get(r, 3, op)?),
        locked: get::<i64>(r, 4, op)? != 0,
        registered: get(r, 5, op)?,
    })
}

fn severity_code(s: Severity) -> i64 {
    match s {
        Severity::Info => 0,
        Severity::Warning => 1,
        Severity::Error => 2,
    }
}

fn scope_named(c: &mut Conn, name: &str, secret: &[u8; 32], op: &'static str) -> Result<i64> {
    c.exec(
        "INSERT INTO dedup_scopes (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[&name, &&secret[..]],
        op,
    )?;
    get(&c.one("SELECT id FROM dedup_scopes WHERE name = $1", &[&name], op)?, 0, op)
}

fn scope_by_id(c: &mut Conn, id: DedupScopeId) -> Result<DedupScope> {
    let op = "reading a dedup scope";
    let r = c.one("SELECT name, secret FROM dedup_scopes WHERE id = $1", &[&id.0], op)?;
    let name: String = get(&r, 0, op)?;
    let secret: Vec<u8> = get(&r, 1, op)?;
    let secret = secret.try_into().map_err(|_| {
        CatalogError::Damaged(format!("dedup scope {name} has a secret of the wrong length"))
    })?;
    Ok(DedupScope { id, name, secret })
}

fn count(c: &mut Conn, sql: &str, params: Params<'_>, op: &'static str) -> Result<i64> {
    get(&c.one(sql, params, op)?, 0, op)
}

fn query_objects(
    c: &mut Conn,
    sql: &str,
    params: Params<'_>,
    out: &mut Vec<ObjectVersion>,
) -> Result<()> {
    for row in c.query(sql, params, "querying object versions")? {
        out.push(object_from_row(&row)?);
    }
    Ok(())
}

impl Catalog for PostgresCatalog {
    fn is_shared(&self) -> bool {
        true
    }

    fn schema_version(&self) -> Result<u32> {
        self.read(|c| read_version(c, &self.url))
    }

    fn sql(&self) -> &dyn crate::sql::Backend {
        self
    }

    fn define_domain(&self, name: &str, description: &str) -> Result<DomainId> {
        let op = "defining a domain";
        self.write(|c| {
            match c.one(
                "INSERT INTO domains (name, description) VALUES ($1, $2) RETURNING id",
                &[&name, &description],
                op,
            ) {
                Ok(r) => Ok(DomainId(get(&r, 0, op)?)),
                Err(e) if constraint(&e) => {
                    Err(CatalogError::Exists { what: "domain", name: name.into() })
                }
                Err(e) => Err(e),
            }
        })
    }

    fn domain(&self, name: &str) -> Result<Option<Domain>> {
        let op = "reading a domain";
        self.read(|c| {
            c.opt("SELECT id, name, description FROM domains WHERE name = $1", &[&name], op)?
                .map(|r| {
                    Ok(Domain {
                        id: DomainId(get(&r, 0, op)?),
                        name: get(&r, 1, op)?,
                        description: get(&r, 2, op)?,
                    })
                })
                .transpose()
        })
    }

    fn define_mgmt_class(
        &self,
        domain: DomainId,
        name: &str,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<MgmtClassId> {
        let op = "defining a management class";
        self.in_txn(op, |c| {
            let known = c.opt("SELECT id FROM domains WHERE id = $1 FOR SHARE", &[&domain.0], op)?;
            if known.is_none() {
                return Err(CatalogError::NotFound { what: "domain", key: domain.0.to_string() });
            }
            let id: i64 = match c.one(
                "INSERT INTO mgmt_classes (domain_id, name) VALUES ($1, $2) RETURNING id",
                &[&domain.0, &name],
                op,
            ) {
                Ok(r) => get(&r, 0, op)?,
                Err(e) if constraint(&e) => {
                    return Err(CatalogError::Exists { what: "management class", name: name.into() });
                }
                Err(e) => return Err(e),
            };
            c.exec(
                "INSERT INTO backup_copygroups (mgmt_class_id, versions_exist, versions_deleted, retain_extra_days, retain_only_days) VALUES ($1, $2, $3, $4, $5)",
                &[
                    &id,
                    &i64::from(backup.versions_exist),
                    &i64::from(backup.versions_deleted),
                    &i64::from(backup.retain_extra_days),
                    &i64::from(backup.retain_only_days),
                ],
                op,
            )
            .map_err(on_constraint(|| CatalogError::Refused(format!(
                        "invalid backup copy group for {name}: versions-exist must be at least 1"
                    ))))?;
            c.exec(
                "INSERT INTO archive_copygroups (mgmt_class_id, retain_version_days) VALUES ($1, $2)",
                &[&id, &i64::from(archive.retain_version_days)],
                op,
            )?;
            Ok(MgmtClassId(id))
        })
    }

    fn mgmt_classes(&self, domain: DomainId) -> Result<Vec<MgmtClass>> {
        let op = "reading management classes";
        self.read(|c| {
            let rows = c.query(
                "SELECT m.id, m.name, b.versions_exist, b.versions_deleted, b.retain_extra_days, b.retain_only_days, a.retain_version_days \
                 FROM mgmt_classes m JOIN backup_copygroups b ON b.mgmt_class_id = m.id JOIN archive_copygroups a ON a.mgmt_class_id = m.id \
                 WHERE m.domain_id = $1 ORDER BY m.name",
                &[&domain.0],
                op,
            )?;
            let u = |r: &Row, i| -> Result<u32> {
                let v: i64 = get(r, i, op)?;
                u32::try_from(v).map_err(|_| CatalogError::Damaged(format!("copy group value {v}")))
            };
            rows.iter()
                .map(|r| {
                    Ok(MgmtClass {
                        id: MgmtClassId(get(r, 0, op)?),
                        domain,
                        name: get(r, 1, op)?,
                        backup: BackupCopyGroup {
                            versions_exist: u(r, 2)?,
                            versions_deleted: u(r, 3)?,
                            retain_extra_days: u(r, 4)?,
                            retain_only_days: u(r, 5)?,
                        },
                        archive: ArchiveCopyGroup { retain_version_days: u(r, 6)? },
                    })
                })
                .collect()
        })
    }

    fn domains(&self) -> Result<Vec<Domain>> {
        let op = "reading domains";
        self.read(|c| {
            c.query("SELECT id, name, description FROM domains ORDER BY name", &[], op)?
                .iter()
                .map(|r| {
                    Ok(Domain {
                        id: DomainId(get(r, 0, op)?),
                        name: get(r, 1, op)?,
                        description: get(r, 2, op)?,
                    })
                })
                .collect()
        })
    }

    fn delete_domain(&self, domain: DomainId) -> Result<()> {
        let op = "deleting a domain";
        self.in_txn(op, |c| {
            let found = c.opt("SELECT id FROM domains WHERE id = $1 FOR UPDATE", &[&domain.0], op)?;
            if found.is_none() {
                return Err(CatalogError::NotFound { what: "domain", key: domain.0.to_string() });
            }
            let nodes = count(c, "SELECT count(*) FROM nodes WHERE domain_id = $1", &[&domain.0], op)?;
            if nodes > 0 {
                return Err(CatalogError::Refused(format!(
                    "the domain still has {nodes} nodes: move them to another domain first"
                )));
            }
            let bound = count(
                c,
                "SELECT count(*) FROM objects WHERE mgmt_class_id IN (SELECT id FROM mgmt_classes WHERE domain_id = $1)",
                &[&domain.0],
                op,
            )?;
            if bound > 0 {
                return Err(CatalogError::Refused(format!(
                    "{bound} versions are bound to the domain's management classes"
                )));
            }
            for sql in [
                "DELETE FROM backup_copygroups WHERE mgmt_class_id IN (SELECT id FROM mgmt_classes WHERE domain_id = $1)",
                "DELETE FROM archive_copygroups WHERE mgmt_class_id IN (SELECT id FROM mgmt_classes WHERE domain_id = $1)",
                "DELETE FROM mgmt_classes WHERE domain_id = $1",
                "DELETE FROM domains WHERE id = $1",
            ] {
                // A version bound meanwhile makes the delete fail on its foreign key.
                c.exec(sql, &[&domain.0], op).map_err(on_constraint(|| CatalogError::Refused("versions were just bound to the domain's classes".into())))?;
            }
            Ok(())
        })
    }

    fn update_mgmt_class(
        &self,
        class: MgmtClassId,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<()> {
        let op = "updating a management class";
        self.in_txn(op, |c| {
            let n = c
                .exec(
                    "UPDATE backup_copygroups SET versions_exist = $1, versions_deleted = $2, retain_extra_days = $3, retain_only_days = $4 WHERE mgmt_class_id = $5",
                    &[
                        &i64::from(backup.versions_exist),
                        &i64::from(backup.versions_deleted),
                        &i64::from(backup.retain_extra_days),
                        &i64::from(backup.retain_only_days),
                        &class.0,
                    ],
                    op,
                )
                .map_err(on_constraint(|| CatalogError::Refused("versions-exist must be at least 1".into())))?;
            if n == 0 {
                return Err(CatalogError::NotFound {
                    what: "management class",
                    key: class.0.to_string(),
                });
            }
            c.exec(
                "UPDATE archive_copygroups SET retain_version_days = $1 WHERE mgmt_class_id = $2",
                &[&i64::from(archive.retain_version_days), &class.0],
                op,
            )?;
            Ok(())
        })
    }

    fn delete_mgmt_class(&self, class: MgmtClassId) -> Result<()> {
        let op = "deleting a management class";
        self.in_txn(op, |c| {
            let found =
                c.opt("SELECT id FROM mgmt_classes WHERE id = $1 FOR UPDATE", &[&class.0], op)?;
            if found.is_none() {
                return Err(CatalogError::NotFound {
                    what: "management class",
                    key: class.0.to_string(),
                });
            }
            let bound =
                count(c, "SELECT count(*) FROM objects WHERE mgmt_class_id = $1", &[&class.0], op)?;
            if bound > 0 {
                return Err(CatalogError::Refused(format!(
                    "{bound} versions are bound to the management class"
                )));
            }
            let nodes = count(
                c,
                "SELECT count(*) FROM nodes n JOIN mgmt_classes m ON m.domain_id = n.domain_id WHERE m.id = $1 AND m.name = 'standard'",
                &[&class.0],
                op,
            )?;
            if nodes > 0 {
                return Err(CatalogError::Refused(format!(
                    "it is the default class of the domain's {nodes} nodes: move them to another domain first"
                )));
            }
            for sql in [
                "DELETE FROM backup_copygroups WHERE mgmt_class_id = $1",
                "DELETE FROM archive_copygroups WHERE mgmt_class_id = $1",
                "DELETE FROM mgmt_classes WHERE id = $1",
            ] {
                c.exec(sql, &[&class.0], op).map_err(on_constraint(|| CatalogError::Refused("versions were just bound to the management class".into())))?;
            }
            Ok(())
        })
    }

    fn set_node_domain(&self, node: NodeId, domain: DomainId) -> Result<()> {
        let op = "moving a node to a domain";
        let n = self
            .write(|c| {
                c.exec("UPDATE nodes SET domain_id = $1 WHERE id = $2", &[&domain.0, &node.0], op)
            })
            .map_err(on_constraint(|| CatalogError::NotFound {
                what: "domain",
                key: domain.0.to_string(),
            }))?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        Ok(())
    }

    fn register_node(&self, name: &str, password_hash: &str, domain: DomainId) -> Result<NodeId> {
        let op = "registering a node";
        self.write(|c| {
            match c.one(
                "INSERT INTO nodes (name, password_hash, domain_id, locked, registered) VALUES ($1, $2, $3, 0, $4) RETURNING id",
                &[&name, &password_hash, &domain.0, &crate::now()],
                op,
            ) {
                Ok(r) => Ok(NodeId(get(&r, 0, op)?)),
                Err(e) if is_code(&e, &SqlState::UNIQUE_VIOLATION) => {
                    Err(CatalogError::Exists { what: "node", name: name.into() })
                }
                Err(e) if constraint(&e) => {
                    Err(CatalogError::NotFound { what: "domain", key: domain.0.to_string() })
                }
                Err(e) => Err(e),
            }
        })
    }

    fn node(&self, name: &str) -> Result<Option<Node>> {
        self.read(|c| {
            c.opt(
                "SELECT id, name, password_hash, domain_id, locked, registered FROM nodes WHERE name = $1",
                &[&name],
                "reading a node",
            )?
            .map(|r| node_from_row(&r))
            .transpose()
        })
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.read(|c| {
            c.query(
                "SELECT id, name, password_hash, domain_id, locked, registered FROM nodes ORDER BY name",
                &[],
                "reading nodes",
            )?
            .iter()
            .map(node_from_row)
            .collect()
        })
    }

    fn set_node_locked(&self, node: NodeId, locked: bool) -> Result<()> {
        let n = self.write(|c| {
            c.exec(
                "UPDATE nodes SET locked = $1 WHERE id = $2",
                &[&i64::from(locked), &node.0],
                "locking a node",
            )
        })?;
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
        let op = "registering an administrator";
        self.write(|c| {
            match c.exec(
                "INSERT INTO admins (name, password_hash, locked, registered, privileges) VALUES ($1, $2, 0, $3, $4)",
                &[&name, &password_hash, &crate::now(), &Privilege::join(privileges)],
                op,
            ) {
                Ok(_) => Ok(()),
                Err(e) if constraint(&e) => {
                    Err(CatalogError::Exists { what: "administrator", name: name.into() })
                }
                Err(e) => Err(e),
            }
        })
    }

    fn set_admin_privileges(&self, name: &str, privileges: &[Privilege]) -> Result<()> {
        let n = self.write(|c| {
            c.exec(
                "UPDATE admins SET privileges = $1 WHERE name = $2",
                &[&Privilege::join(privileges), &name],
                "granting privileges",
            )
        })?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "administrator", key: name.into() });
        }
        Ok(())
    }

    fn set_password(&self, admin: bool, name: &str, password_hash: &str) -> Result<()> {
        let (sql, what) = if admin {
            ("UPDATE admins SET password_hash = $1 WHERE name = $2", "administrator")
        } else {
            ("UPDATE nodes SET password_hash = $1 WHERE name = $2", "node")
        };
        let n = self.write(|c| c.exec(sql, &[&password_hash, &name], "changing a password"))?;
        if n == 0 {
            return Err(CatalogError::NotFound { what, key: name.into() });
        }
        Ok(())
    }

    fn set_admin_locked(&self, name: &str, locked: bool) -> Result<()> {
        let n = self.write(|c| {
            c.exec(
                "UPDATE admins SET locked = $1 WHERE name = $2",
                &[&i64::from(locked), &name],
                "locking an administrator",
            )
        })?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "administrator", key: name.into() });
        }
        Ok(())
    }

    fn remove_admin(&self, name: &str) -> Result<()> {
        let n = self.write(|c| {
            c.exec("DELETE FROM admins WHERE name = $1", &[&name], "removing an administrator")
        })?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "administrator", key: name.into() });
        }
        Ok(())
    }

    fn admin(&self, name: &str) -> Result<Option<Admin>> {
        let op = "reading an administrator";
        self.read(|c| {
            c.opt(
                "SELECT name, password_hash, locked, registered, privileges FROM admins WHERE name = $1",
                &[&name],
                op,
            )?
            .map(|r| {
                let name: String = get(&r, 0, op)?;
                let privileges: String = get(&r, 4, op)?;
                let privileges = Privilege::parse_list(&privileges)
                    .map_err(|e| CatalogError::Damaged(format!("administrator {name}: {e}")))?;
                Ok(Admin {
                    password_hash: get(&r, 1, op)?,
                    locked: get::<i64>(&r, 2, op)? != 0,
                    registered: get(&r, 3, op)?,
                    name,
                    privileges,
                })
            })
            .transpose()
        })
    }

    fn filespace(&self, node: NodeId, name: &str) -> Result<FilespaceId> {
        let op = "creating a filespace";
        self.write(|c| {
            // Two sessions of a node creating one filespace at once: one inserts, the other
            // finds its row.
            let inserted = c
                .opt(
                    "INSERT INTO filespaces (node_id, name, created) VALUES ($1, $2, $3) \
                     ON CONFLICT (node_id, name) DO NOTHING RETURNING id",
                    &[&node.0, &name, &crate::now()],
                    op,
                )
                .map_err(on_constraint(|| CatalogError::NotFound {
                    what: "node",
                    key: node.0.to_string(),
                }))?;
            let row = match inserted {
                Some(r) => r,
                None => c.one(
                    "SELECT id FROM filespaces WHERE node_id = $1 AND name = $2",
                    &[&node.0, &name],
                    op,
                )?,
            };
            Ok(FilespaceId(get(&row, 0, op)?))
        })
    }

    fn filespaces(&self, node: NodeId) -> Result<Vec<Filespace>> {
        let op = "reading filespaces";
        self.read(|c| {
            c.query(
                "SELECT id, name, created, generation FROM filespaces WHERE node_id = $1 ORDER BY name",
                &[&node.0],
                op,
            )?
            .iter()
            .map(|r| {
                Ok(Filespace {
                    id: FilespaceId(get(r, 0, op)?),
                    node,
                    name: get(r, 1, op)?,
                    created: get(r, 2, op)?,
                    generation: get(r, 3, op)?,
                })
            })
            .collect()
        })
    }

    fn delete_filespace(
        &self,
        filespace: FilespaceId,
        batch: usize,
        stop: &AtomicBool,
    ) -> Result<u64> {
        let op = "deleting a filespace";
        let ids = |limit: i64| {
            self.read(|c| {
                c.query(
                    "SELECT id FROM objects WHERE filespace_id = $1 LIMIT $2",
                    &[&filespace.0, &limit],
                    op,
                )?
                .iter()
                .map(|r| get(r, 0, op))
                .collect()
            })
        };
        let remove = || {
            self.write(|c| {
                c.exec(
                    "DELETE FROM filespaces WHERE id = $1 AND NOT EXISTS \
                     (SELECT 1 FROM objects WHERE filespace_id = $1)",
                    &[&filespace.0],
                    op,
                )
            })
            .map(|n| n > 0)
        };
        let exists = || {
            self.read(|c| {
                count(c, "SELECT count(*) FROM filespaces WHERE id = $1", &[&filespace.0], op)
            })
            .map(|n| n > 0)
        };
        crate::delete_filespace_in_batches(self, filespace, batch, stop, &ids, &remove, &exists)
    }

    fn delete_node(&self, node: NodeId) -> Result<()> {
        let op = "deleting a node";
        self.in_txn(op, |c| {
            let found = c.opt("SELECT id FROM nodes WHERE id = $1 FOR UPDATE", &[&node.0], op)?;
            if found.is_none() {
                return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
            }
            let filespaces =
                count(c, "SELECT count(*) FROM filespaces WHERE node_id = $1", &[&node.0], op)?;
            if filespaces > 0 {
                return Err(CatalogError::Refused(format!(
                    "the node still has {filespaces} filespaces: delete them first"
                )));
            }
            c.exec("DELETE FROM sessions WHERE node_id = $1", &[&node.0], op)?;
            c.exec("DELETE FROM nodes WHERE id = $1", &[&node.0], op)?;
            Ok(())
        })
    }

    fn define_pool(&self, name: &str, kind: &str, location: &str) -> Result<PoolId> {
        let op = "defining a storage pool";
        self.write(|c| {
            match c.one(
                "INSERT INTO storage_pools (name, kind, location) VALUES ($1, $2, $3) RETURNING id",
                &[&name, &kind, &location],
                op,
            ) {
                Ok(r) => Ok(PoolId(get(&r, 0, op)?)),
                Err(e) if constraint(&e) => {
                    Err(CatalogError::Exists { what: "storage pool", name: name.into() })
                }
                Err(e) => Err(e),
            }
        })
    }

    fn pools(&self) -> Result<Vec<StoragePool>> {
        let op = "reading pools";
        self.read(|c| {
            c.query("SELECT id, name, kind, location FROM storage_pools ORDER BY name", &[], op)?
                .iter()
                .map(|r| {
                    Ok(StoragePool {
                        id: PoolId(get(r, 0, op)?),
                        name: get(r, 1, op)?,
                        kind: get(r, 2, op)?,
                        location: get(r, 3, op)?,
                    })
                })
                .collect()
        })
    }

    fn containers(&self, pool: PoolId) -> Result<Vec<Container>> {
        let op = "reading containers";
        self.read(|c| {
            c.query(
                "SELECT id, size, sealed FROM containers WHERE pool_id = $1 ORDER BY id",
                &[&pool.0],
                op,
            )?
            .iter()
            .map(|r| {
                Ok(Container {
                    id: ContainerId(get::<i64>(r, 0, op)? as u64),
                    pool,
                    size: get::<i64>(r, 1, op)? as u64,
                    sealed: get::<i64>(r, 2, op)? != 0,
                })
            })
            .collect()
        })
    }

    fn pool_usage(&self, pool: PoolId) -> Result<PoolUsage> {
        let op = "measuring a pool";
        self.read(|c| {
            let r = c.one(
                "SELECT count(*), COALESCE(SUM(size), 0)::BIGINT FROM containers WHERE pool_id = $1",
                &[&pool.0],
                op,
            )?;
            let (containers, bytes): (i64, i64) = (get(&r, 0, op)?, get(&r, 1, op)?);
            let r = c.one(
                "SELECT count(*), COALESCE(SUM(CASE WHEN k.refcount > 0 THEN k.stored_len ELSE 0 END), 0)::BIGINT, \
                 COALESCE(SUM(k.damaged), 0)::BIGINT FROM chunks k JOIN containers t ON t.id = k.container_id WHERE t.pool_id = $1",
                &[&pool.0],
                op,
            )?;
            Ok(PoolUsage {
                containers: containers as u64,
                bytes: bytes as u64,
                chunks: get::<i64>(&r, 0, op)? as u64,
                live_bytes: get::<i64>(&r, 1, op)? as u64,
                damaged_chunks: get::<i64>(&r, 2, op)? as u64,
            })
        })
    }

    fn chunks_in_container(&self, container: ContainerId) -> Result<Vec<Chunk>> {
        let sql = format!(
            "SELECT {CHUNK_COLUMNS} FROM chunks WHERE container_id = $1 ORDER BY frame_offset"
        );
        self.read(|c| {
            c.query(&sql, &[&(container.0 as i64)], "reading chunks")?
                .iter()
                .map(chunk_from_row)
                .collect()
        })
    }

    fn dedup_scope(&self, node: NodeId, new_secret: [u8; 32]) -> Result<DedupScope> {
        let op = "reading a node's dedup scope";
        self.in_txn(op, |c| {
            // The node's row locked: an administrator's set-dedup-scope at the same moment
            // is either before (and kept) or after.
            let r = c
                .opt(
                    "SELECT name, dedup_scope FROM nodes WHERE id = $1 FOR UPDATE",
                    &[&node.0],
                    op,
                )?
                .ok_or_else(|| CatalogError::NotFound { what: "node", key: node.0.to_string() })?;
            let name: String = get(&r, 0, op)?;
            let id = match get::<Option<i64>>(&r, 1, op)? {
                Some(id) => id,
                None => {
                    let id = scope_named(c, &format!("node:{name}"), &new_secret, op)?;
                    c.exec("UPDATE nodes SET dedup_scope = $1 WHERE id = $2", &[&id, &node.0], op)?;
                    id
                }
            };
            scope_by_id(c, DedupScopeId(id))
        })
    }

    fn set_dedup_scope(
        &self,
        node: NodeId,
        name: &str,
        new_secret: [u8; 32],
    ) -> Result<DedupScope> {
        let op = "setting a node's dedup scope";
        self.in_txn(op, |c| {
            let id = scope_named(c, name, &new_secret, op)?;
            let n =
                c.exec("UPDATE nodes SET dedup_scope = $1 WHERE id = $2", &[&id, &node.0], op)?;
            if n == 0 {
                return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
            }
            scope_by_id(c, DedupScopeId(id))
        })
    }

    fn find_chunks(
        &self,
        scope: DedupScopeId,
        sealed: bool,
        hashes: &[[u8; 32]],
    ) -> Result<Vec<Option<ChunkId>>> {
        let op = "looking up chunks";
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        // One round trip for the whole list, however long.
        let list: Vec<&[u8]> = hashes.iter().map(|h| &h[..]).collect();
        self.read(|c| {
            let rows = c.query(
                "SELECT id, hash FROM chunks WHERE scope = $1 AND sealed = $2 AND hash = ANY($3) \
                 AND refcount > 0 AND damaged = 0",
                &[&scope.0, &i64::from(sealed), &list],
                op,
            )?;
            let mut found: HashMap<Vec<u8>, i64> = HashMap::with_capacity(rows.len());
            for r in &rows {
                found.insert(get(r, 1, op)?, get(r, 0, op)?);
            }
            Ok(hashes.iter().map(|h| found.get(&h[..]).map(|id| ChunkId(*id))).collect())
        })
    }

    fn dedup_epoch(&self) -> Result<u64> {
        let op = "reading the dedup epoch";
        self.read(|c| {
            Ok(count(c, "SELECT value FROM catalog_state WHERE name = 'dedup_epoch'", &[], op)?
                as u64)
        })
    }

    fn node_key(&self, node: NodeId) -> Result<Option<Vec<u8>>> {
        let op = "reading a node's key";
        self.read(|c| {
            let r = c
                .opt("SELECT key_file FROM nodes WHERE id = $1", &[&node.0], op)?
                .ok_or_else(|| CatalogError::NotFound { what: "node", key: node.0.to_string() })?;
            get(&r, 0, op)
        })
    }

    fn set_node_key(&self, node: NodeId, key_file: &[u8]) -> Result<()> {
        let n = self.write(|c| {
            c.exec(
                "UPDATE nodes SET key_file = $1 WHERE id = $2",
                &[&key_file, &node.0],
                "storing a node's key",
            )
        })?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        Ok(())
    }

    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        let mut lease = self.pool.get().map_err(|e| self.named(e))?;
        lease.batch("BEGIN", "starting a transaction")?;
        Ok(Box::new(PgTxn { lease, done: false, chunks_gone: false, changed: BTreeSet::new() }))
    }

    fn for_each_active(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        // In pages after the last path seen, as on SQLite: versions committed meanwhile at
        // paths already passed (the backup's own) do not show up.
        let first = format!(
            "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = $1 AND state = 1 ORDER BY path LIMIT $2"
        );
        let next = format!(
            "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = $1 AND state = 1 AND path > $3 ORDER BY path LIMIT $2"
        );
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut page = Vec::new();
            self.read(|c| {
                page.clear();
                match &after {
                    None => query_objects(c, &first, &[&filespace.0, &PAGE], &mut page),
                    Some(a) => query_objects(c, &next, &[&filespace.0, &PAGE, a], &mut page),
                }
            })?;
            for v in &page {
                visit(v)?;
            }
            match page.pop() {
                Some(last) if page.len() + 1 == PAGE as usize => after = Some(last.path),
                _ => return Ok(()),
            }
        }
    }

    fn for_each_version(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        // In pages of whole paths, as on SQLite: a cursor would pin one connection and
        // snapshot for as long as the caller takes.
        crate::paging::for_each_in_pages(|after| self.versions_page(filespace, after), visit)
    }

    fn for_each_expirable(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&crate::expire::ExpiryRow) -> Result<()>,
    ) -> Result<()> {
        crate::expire::for_each_in_pages(
            PAGE as usize,
            |after| self.expirable_page(filespace, after),
            visit,
        )
    }

    fn versions(&self, filespace: FilespaceId, path: &[u8]) -> Result<Vec<ObjectVersion>> {
        let sql =
            format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = $1 AND path = $2");
        self.read(|c| {
            let mut out = Vec::new();
            query_objects(c, &sql, &[&filespace.0, &path], &mut out)?;
            out.sort_by_key(|v| std::cmp::Reverse((v.inserted, v.id)));
            Ok(out)
        })
    }

    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        let sql = format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE id = $1");
        self.read(|c| {
            let mut out = Vec::new();
            query_objects(c, &sql, &[&id.0], &mut out)?;
            Ok(out.pop())
        })
    }

    fn object_chunks(&self, object: ObjectId) -> Result<Vec<ChunkRef>> {
        let Some(obj) = self.object(object)? else {
            return Err(CatalogError::NotFound { what: "object", key: object.0.to_string() });
        };
        let op = "reading chunks";
        let ids: Vec<i64> = obj.chunks.iter().map(|c| c.0).collect();
        let sql = format!("SELECT {CHUNK_COLUMNS}, hash FROM chunks WHERE id = ANY($1)");
        let mut found: HashMap<i64, ChunkRef> = HashMap::new();
        self.read(|c| {
            found.clear();
            for r in c.query(&sql, &[&ids], op)? {
                let chunk = chunk_from_row(&r)?;
                let hash = match get::<Option<Vec<u8>>>(&r, 7, op)? {
                    None => None,
                    Some(h) => Some(<[u8; 32]>::try_from(h).map_err(|_| {
                        CatalogError::Damaged(format!(
                            "chunk {} has an id of the wrong length",
                            chunk.id.0
                        ))
                    })?),
                };
                found.insert(chunk.id.0, ChunkRef { id: chunk.id, location: chunk.location, hash });
            }
            Ok(())
        })?;
        obj.chunks
            .iter()
            .map(|id| {
                found.get(&id.0).cloned().ok_or_else(|| {
                    CatalogError::Damaged(format!(
                        "object {} refers to missing chunk {}",
                        object.0, id.0
                    ))
                })
            })
            .collect()
    }

    fn objects_using(
        &self,
        chunks: &HashSet<ChunkId>,
    ) -> Result<(Vec<crate::VersionRef>, ObjectId)> {
        let op = "finding the objects of chunks";
        let mut found = Vec::new();
        let mut after = 0i64;
        if chunks.is_empty() {
            return Ok((found, ObjectId(after)));
        }
        loop {
            let page = self.read(|c| {
                c.query(
                    "SELECT id, filespace_id, path, chunk_list FROM objects WHERE id > $1 ORDER BY id LIMIT $2",
                    &[&after, &PAGE],
                    op,
                )
            })?;
            let Some(last) = page.last() else { return Ok((found, ObjectId(after))) };
            after = get(last, 0, op)?;
            let full = page.len() == PAGE as usize;
            for r in &page {
                let id: i64 = get(r, 0, op)?;
                let blob: Vec<u8> = get(r, 3, op)?;
                let list = chunk_list::decode(&blob)
                    .map_err(|e| CatalogError::Damaged(format!("object {id}: {e}")))?;
                if list.iter().any(|c| chunks.contains(c)) {
                    found.push((ObjectId(id), FilespaceId(get(r, 1, op)?), get(r, 2, op)?));
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
        let op = "marking chunks and versions damaged";
        let mut t = PgTxn {
            lease: self.pool.get().map_err(|e| self.named(e))?,
            done: false,
            chunks_gone: !chunks.is_empty(),
            changed: BTreeSet::new(),
        };
        t.lease.batch("BEGIN", op)?;
        let ids: Vec<i64> = chunks.iter().map(|c| c.0).collect();
        t.lease.exec("UPDATE chunks SET damaged = 1 WHERE id = ANY($1)", &[&ids], op)?;
        // Versions committed since the scan that found `objects`: few, read in this
        // transaction after the chunks were marked, so a version committed later sees the
        // marks (its reference makes it damaged) and one committed earlier is read here.
        let wanted: HashSet<ChunkId> = chunks.iter().copied().collect();
        let mut later = Vec::new();
        for r in
            t.lease.query("SELECT id, chunk_list FROM objects WHERE id > $1", &[&after.0], op)?
        {
            let id: i64 = get(&r, 0, op)?;
            let blob: Vec<u8> = get(&r, 1, op)?;
            if chunk_list::decode(&blob)?.iter().any(|c| wanted.contains(c)) {
                later.push(id);
            }
        }
        let all: Vec<i64> = objects.iter().map(|o| o.0).chain(later).collect();
        for r in t.lease.query(
            "UPDATE objects SET damaged = 1 WHERE id = ANY($1) RETURNING filespace_id",
            &[&all],
            op,
        )? {
            t.changed.insert(get(&r, 0, op)?);
        }
        Box::new(t).commit()
    }

    fn state_value(&self, name: &str) -> Result<Option<i64>> {
        let op = "reading the catalog state";
        self.read(|c| {
            c.opt("SELECT value FROM catalog_state WHERE name = $1", &[&name], op)?
                .map(|r| get(&r, 0, op))
                .transpose()
        })
    }

    fn set_state_value(&self, name: &str, value: i64) -> Result<()> {
        self.write(|c| {
            c.exec(
                "INSERT INTO catalog_state (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                &[&name, &value],
                "writing the catalog state",
            )
        })
        .map(|_| ())
    }

    fn snapshot(&self, dest: &Path) -> Result<()> {
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

    fn check(&self) -> Result<ConsistencyReport> {
        let op = "checking";
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        // Both tables from one snapshot.
        c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", op)?;
        let result = (|| -> Result<ConsistencyReport> {
            let mut report = ConsistencyReport::default();
            let problem = |report: &mut ConsistencyReport, text: String| {
                if report.problems.len() < MAX_PROBLEMS {
                    report.problems.push(text);
                }
            };
            let mut refs: HashMap<i64, u64> = HashMap::new();
            // In pages by id: the table may not fit in memory as one result.
            let mut after = 0i64;
            loop {
                let rows = c.query(
                    "SELECT id, chunk_list FROM objects WHERE id > $1 ORDER BY id LIMIT $2",
                    &[&after, &PAGE],
                    op,
                )?;
                for r in &rows {
                    report.objects += 1;
                    let id: i64 = get(r, 0, op)?;
                    after = id;
                    let blob: Vec<u8> = get(r, 1, op)?;
                    match chunk_list::decode(&blob) {
                        Ok(list) => list.iter().for_each(|ch| *refs.entry(ch.0).or_default() += 1),
                        Err(e) => problem(&mut report, format!("object {id}: {e}")),
                    }
                }
                if rows.len() < PAGE as usize {
                    break;
                }
            }
            let mut after = 0i64;
            loop {
                let rows = c.query(
                    "SELECT c.id, c.refcount, c.container_id, k.id FROM chunks c \
                     LEFT JOIN containers k ON k.id = c.container_id WHERE c.id > $1 ORDER BY c.id LIMIT $2",
                    &[&after, &PAGE],
                    op,
                )?;
                for r in &rows {
                    report.chunks += 1;
                    let id: i64 = get(r, 0, op)?;
                    after = id;
                    let refcount: i64 = get(r, 1, op)?;
                    let container: i64 = get(r, 2, op)?;
                    let known: Option<i64> = get(r, 3, op)?;
                    let counted = refs.remove(&id).unwrap_or(0);
                    if refcount as u64 != counted {
                        problem(
                            &mut report,
                            format!(
                                "chunk {id}: reference count {refcount}, but {counted} references"
                            ),
                        );
                    }
                    if counted == 0 {
                        report.unreferenced_chunks += 1;
                    }
                    if known.is_none() {
                        problem(
                            &mut report,
                            format!(
                                "chunk {id}: container {:016x} is not recorded",
                                container as u64
                            ),
                        );
                    }
                }
                if rows.len() < PAGE as usize {
                    break;
                }
            }
            for (id, n) in refs {
                problem(&mut report, format!("chunk {id} is missing but referenced {n} times"));
            }
            Ok(report)
        })();
        let _ = c.batch("COMMIT", op);
        result
    }

    fn stats(&self) -> Result<CatalogStats> {
        let op = "counting";
        self.read(|c| {
            let mut n = |sql: &str| -> Result<u64> { Ok(count(c, sql, &[], op)? as u64) };
            Ok(CatalogStats {
                objects: n("SELECT count(*) FROM objects")?,
                chunks: n("SELECT count(*) FROM chunks")?,
                containers: n("SELECT count(*) FROM containers")?,
                database_bytes: n("SELECT pg_database_size(current_database())")?,
                damaged_chunks: n("SELECT count(*) FROM chunks WHERE damaged <> 0")?,
                damaged_objects: n("SELECT count(*) FROM objects WHERE damaged <> 0")?,
            })
        })
    }

    fn start_session(&self, node: NodeId) -> Result<SessionId> {
        let op = "starting a session";
        self.write(|c| {
            let r = c.one(
                "INSERT INTO sessions (node_id, started, state) VALUES ($1, $2, 'running') RETURNING id",
                &[&node.0, &crate::now()],
                op,
            )?;
            Ok(SessionId(get(&r, 0, op)?))
        })
    }

    fn update_session(&self, session: SessionId, bytes: u64, objects: u64) -> Result<()> {
        self.write(|c| {
            c.exec(
                "UPDATE sessions SET bytes = bytes + $1, objects = objects + $2 WHERE id = $3",
                &[&(bytes as i64), &(objects as i64), &session.0],
                "updating a session",
            )
        })
        .map(|_| ())
    }

    fn end_session(&self, session: SessionId, state: &str) -> Result<()> {
        self.write(|c| {
            c.exec(
                "UPDATE sessions SET ended = $1, state = $2 WHERE id = $3",
                &[&crate::now(), &state, &session.0],
                "ending a session",
            )
        })
        .map(|_| ())
    }

    fn running_sessions(&self) -> Result<Vec<Session>> {
        let op = "reading sessions";
        self.read(|c| {
            c.query(
                "SELECT id, node_id, started, ended, bytes, objects, state FROM sessions WHERE ended IS NULL ORDER BY id",
                &[],
                op,
            )?
            .iter()
            .map(|r| {
                Ok(Session {
                    id: SessionId(get(r, 0, op)?),
                    node: NodeId(get(r, 1, op)?),
                    started: get(r, 2, op)?,
                    ended: get(r, 3, op)?,
                    bytes: get::<i64>(r, 4, op)? as u64,
                    objects: get::<i64>(r, 5, op)? as u64,
                    state: get(r, 6, op)?,
                })
            })
            .collect()
        })
    }

    fn start_process(&self, kind: &str, detail: &str) -> Result<ProcessId> {
        let op = "starting a process";
        self.write(|c| {
            let r = c.one(
                "INSERT INTO processes (kind, started, state, detail) VALUES ($1, $2, 'running', $3) RETURNING id",
                &[&kind, &crate::now(), &detail],
                op,
            )?;
            Ok(ProcessId(get(&r, 0, op)?))
        })
    }

    fn end_process(&self, process: ProcessId, state: &str, detail: &str) -> Result<()> {
        self.write(|c| {
            c.exec(
                "UPDATE processes SET ended = $1, state = $2, detail = $3 WHERE id = $4",
                &[&crate::now(), &state, &detail, &process.0],
                "ending a process",
            )
        })
        .map(|_| ())
    }

    fn process(&self, process: ProcessId) -> Result<Option<Process>> {
        let op = "reading a process";
        self.read(|c| {
            c.opt(
                "SELECT id, kind, started, ended, state, detail FROM processes WHERE id = $1",
                &[&process.0],
                op,
            )?
            .map(|r| {
                Ok(Process {
                    id: ProcessId(get(&r, 0, op)?),
                    kind: get(&r, 1, op)?,
                    started: get(&r, 2, op)?,
                    ended: get(&r, 3, op)?,
                    state: get(&r, 4, op)?,
                    detail: get(&r, 5, op)?,
                })
            })
            .transpose()
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
        self.write(|c| {
            c.exec(
                "INSERT INTO activity_log (time, severity, message, node_id, session_id, process_id) VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &crate::now(),
                    &severity_code(severity),
                    &message,
                    &node.map(|n| n.0),
                    &session.map(|s| s.0),
                    &process.map(|p| p.0),
                ],
                "writing the activity log",
            )
        })
        .map(|_| ())
    }

    fn activity(&self, since: Timestamp, limit: u32) -> Result<Vec<ActivityEntry>> {
        let op = "reading the activity log";
        self.read(|c| {
            c.query(
                "SELECT id, time, severity, message, node_id, session_id, process_id FROM activity_log WHERE time >= $1 ORDER BY id LIMIT $2",
                &[&since, &i64::from(limit)],
                op,
            )?
            .iter()
            .map(|r| {
                Ok(ActivityEntry {
                    id: get(r, 0, op)?,
                    time: get(r, 1, op)?,
                    severity: match get::<i64>(r, 2, op)? {
                        0 => Severity::Info,
                        1 => Severity::Warning,
                        _ => Severity::Error,
                    },
                    message: get(r, 3, op)?,
                    node: get::<Option<i64>>(r, 4, op)?.map(NodeId),
                    session: get::<Option<i64>>(r, 5, op)?.map(SessionId),
                    process: get::<Option<i64>>(r, 6, op)?.map(ProcessId),
                })
            })
            .collect()
        })
    }
}

/// A write transaction on one connection of the pool, held for its whole life.
struct PgTxn<'a> {
    lease: Lease<'a>,
    done: bool,
    chunks_gone: bool,
    changed: BTreeSet<i64>,
}

impl Drop for PgTxn<'_> {
    fn drop(&mut self) {
        if !self.done && self.lease.batch("ROLLBACK", "rolling back").is_err() {
            self.lease.broken = true;
        }
    }
}

/// Deletes an object version and releases its chunk references; returns whether a chunk
/// lost its last one.
fn delete_object(c: &mut Conn, id: ObjectId) -> Result<bool> {
    let op = "deleting an object version";
    let r = c
        .opt("DELETE FROM objects WHERE id = $1 RETURNING chunk_list", &[&id.0], op)?
        .ok_or_else(|| CatalogError::NotFound { what: "object", key: id.0.to_string() })?;
    let blob: Vec<u8> = get(&r, 0, op)?;
    release(c, &chunk_list::decode(&blob)?)
}

/// Drops one reference to each of `chunks` (a chunk listed twice loses two); returns whether
/// one lost its last.
fn release(c: &mut Conn, chunks: &[ChunkId]) -> Result<bool> {
    let op = "releasing chunk references";
    // One statement for all of a version's chunks, a repeated chunk counted once per
    // occurrence. Two transactions locking shared chunks in opposite orders can deadlock;
    // PostgreSQL aborts one, and the error says it is worth retrying (`is_transient`).
    let mut counts: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
    for ch in chunks {
        *counts.entry(ch.0).or_default() += 1;
    }
    let ids: Vec<i64> = counts.keys().copied().collect();
    let by: Vec<i64> = counts.values().copied().collect();
    let rows = c.query(
        "UPDATE chunks k SET refcount = k.refcount - d.n FROM \
         (SELECT unnest($1::BIGINT[]) AS id, unnest($2::BIGINT[]) AS n) d \
         WHERE k.id = d.id RETURNING k.refcount",
        &[&ids, &by],
        op,
    )?;
    let mut gone = false;
    for r in &rows {
        gone |= get::<i64>(r, 0, op)? == 0;
    }
    Ok(gone)
}

fn enforce_versions_exist(c: &mut Conn, object: &NewObject) -> Result<bool> {
    let op = "applying versions-exist";
    let limit = count(
        c,
        "SELECT COALESCE(\
               (SELECT b.versions_exist FROM backup_copygroups b WHERE b.mgmt_class_id = $1), \
               (SELECT b.versions_exist FROM filespaces f JOIN nodes n ON n.id = f.node_id \
                  JOIN mgmt_classes m ON m.domain_id = n.domain_id AND m.name = 'standard' \
                  JOIN backup_copygroups b ON b.mgmt_class_id = m.id WHERE f.id = $2), \
               $3)",
        &[
            &object.mgmt_class.map(|m| m.0),
            &object.filespace.0,
            &i64::from(BackupCopyGroup::default().versions_exist),
        ],
        op,
    )?;
    if limit >= i64::from(crate::expire::NO_LIMIT) {
        return Ok(false);
    }
    let doomed: Vec<i64> = c
        .query(
            "SELECT id FROM objects WHERE filespace_id = $1 AND path = $2 AND state = 0 \
             ORDER BY inserted DESC, id DESC OFFSET $3",
            &[&object.filespace.0, &object.path, &(limit - 1).max(0)],
            op,
        )?
        .iter()
        .map(|r| get(r, 0, op))
        .collect::<Result<_>>()?;
    let mut gone = false;
    for id in doomed {
        gone |= delete_object(c, ObjectId(id))?;
    }
    Ok(gone)
}

impl Txn for PgTxn<'_> {
    fn add_container(&mut self, pool: PoolId, id: ContainerId) -> Result<()> {
        self.lease.exec(
            "INSERT INTO containers (id, pool_id, size, sealed) VALUES ($1, $2, 0, 0) ON CONFLICT DO NOTHING",
            &[&(id.0 as i64), &pool.0],
            "recording a container",
        )?;
        Ok(())
    }

    fn set_container(&mut self, id: ContainerId, size: u64, sealed: bool) -> Result<()> {
        let n = self.lease.exec(
            "UPDATE containers SET size = $1, sealed = $2 WHERE id = $3",
            &[&(size as i64), &i64::from(sealed), &(id.0 as i64)],
            "updating a container",
        )?;
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
        let c = &mut *self.lease;
        let state = match object.kind {
            ObjectKind::Backup => {
                let replaced = c.exec(
                    "UPDATE objects SET state = 0, deactivated = $1 WHERE filespace_id = $2 AND path = $3 AND state = 1",
                    &[&now, &object.filespace.0, &object.path],
                    "deactivating the previous version",
                )?;
                if replaced > 0 {
                    self.chunks_gone |= enforce_versions_exist(c, object)?;
                }
                STATE_ACTIVE
            }
            ObjectKind::Archive => STATE_ARCHIVE,
        };
        let missing_container = |n: &NewChunk| {
            let container = n.container.0;
            move |e: CatalogError| {
                if is_code(&e, &SqlState::FOREIGN_KEY_VIOLATION) {
                    CatalogError::NotFound { what: "container", key: format!("{container:016x}") }
                } else {
                    e
                }
            }
        };
        let mut ids = Vec::with_capacity(object.chunks.len());
        let mut damaged = false;
        for chunk in &object.chunks {
            match chunk {
                ObjectChunk::New(n) => {
                    let r = c
                        .one(
                            "INSERT INTO chunks (container_id, frame_offset, stored_len, raw_len, codec, refcount) VALUES ($1, $2, $3, $4, $5, 1) RETURNING id",
                            &[
                                &(n.container.0 as i64),
                                &(n.offset as i64),
                                &i64::from(n.stored_len),
                                &i64::from(n.raw_len),
                                &i64::from(n.codec),
                            ],
                            "inserting a chunk",
                        )
                        .map_err(missing_container(n))?;
                    ids.push(ChunkId(get(&r, 0, "inserting a chunk")?));
                }
                ObjectChunk::Keyed(n, key) => {
                    // As on SQLite: the unique index (scope, sealed, hash) decides who stored
                    // it first; a damaged first copy is replaced by this one.
                    let r = c
                        .one(
                            "INSERT INTO chunks AS k (container_id, frame_offset, stored_len, raw_len, codec, refcount, hash, scope, sealed) VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8) \
                             ON CONFLICT (scope, sealed, hash) WHERE scope IS NOT NULL DO UPDATE SET refcount = k.refcount + 1, \
                             container_id = CASE WHEN k.damaged <> 0 THEN excluded.container_id ELSE k.container_id END, \
                             frame_offset = CASE WHEN k.damaged <> 0 THEN excluded.frame_offset ELSE k.frame_offset END, \
                             stored_len = CASE WHEN k.damaged <> 0 THEN excluded.stored_len ELSE k.stored_len END, \
                             codec = CASE WHEN k.damaged <> 0 THEN excluded.codec ELSE k.codec END, \
                             damaged = 0 RETURNING id",
                            &[
                                &(n.container.0 as i64),
                                &(n.offset as i64),
                                &i64::from(n.stored_len),
                                &i64::from(n.raw_len),
                                &i64::from(n.codec),
                                &&key.hash[..],
                                &key.scope.map(|s| s.0),
                                &i64::from(key.sealed),
                            ],
                            "inserting a chunk",
                        )
                        .map_err(missing_container(n))?;
                    ids.push(ChunkId(get(&r, 0, "inserting a chunk")?));
                }
                ObjectChunk::Existing(id) => {
                    let found = c.opt(
                        "UPDATE chunks SET refcount = refcount + 1 WHERE id = $1 RETURNING damaged",
                        &[&id.0],
                        "referencing a chunk",
                    )?;
                    match found {
                        None => {
                            return Err(CatalogError::NotFound {
                                what: "chunk",
                                key: id.0.to_string(),
                            });
                        }
                        Some(r) => damaged |= get::<i64>(&r, 0, "referencing a chunk")? != 0,
                    }
                    ids.push(*id);
                }
            }
        }
        let a = &object.attrs;
        let r = c
            .one(
                "INSERT INTO objects (filespace_id, state, path, object_type, size, mtime_ns, ctime_ns, mode, uid, gid, inserted, mgmt_class_id, description, retain_until, link_target, chunk_list, ino, damaged, meta) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) RETURNING id",
                &[
                    &object.filespace.0,
                    &state,
                    &object.path,
                    &object.object_type.code(),
                    &(a.size as i64),
                    &a.mtime_ns,
                    &a.ctime_ns,
                    &i64::from(a.mode),
                    &i64::from(a.uid),
                    &i64::from(a.gid),
                    &now,
                    &object.mgmt_class.map(|m| m.0),
                    &object.description,
                    &object.retain_until,
                    &a.link_target,
                    &chunk_list::encode(&ids),
                    &(a.ino as i64),
                    &i64::from(damaged),
                    &crate::meta::encode(a),
                ],
                "inserting an object version",
            )
            .map_err(|e| {
                if is_code(&e, &SqlState::FOREIGN_KEY_VIOLATION) {
                    CatalogError::NotFound {
                        what: "filespace or management class",
                        key: format!("{} / {:?}", object.filespace.0, object.mgmt_class),
                    }
                } else {
                    e
                }
            })?;
        Ok(ObjectId(get(&r, 0, "inserting an object version")?))
    }

    fn deactivate(&mut self, filespace: FilespaceId, path: &[u8], now: Timestamp) -> Result<bool> {
        self.changed.insert(filespace.0);
        let n = self.lease.exec(
            "UPDATE objects SET state = 0, deactivated = $1 WHERE filespace_id = $2 AND path = $3 AND state = 1",
            &[&now, &filespace.0, &path],
            "deactivating a version",
        )?;
        Ok(n > 0)
    }

    fn deactivate_tree(
        &mut self,
        filespace: FilespaceId,
        path: &[u8],
        now: Timestamp,
    ) -> Result<u64> {
        self.changed.insert(filespace.0);
        let op = "deactivating a tree";
        if path.is_empty() {
            return self.lease.exec(
                "UPDATE objects SET state = 0, deactivated = $1 WHERE filespace_id = $2 AND state = 1",
                &[&now, &filespace.0],
                op,
            );
        }
        // Everything in `path/`: from "path/" up to, not including, "path0".
        let (mut low, mut high) = (path.to_vec(), path.to_vec());
        low.push(b'/');
        high.push(b'0');
        self.lease.exec(
            "UPDATE objects SET state = 0, deactivated = $1 WHERE filespace_id = $2 AND state = 1 \
             AND path >= $3 AND path < $4",
            &[&now, &filespace.0, &low, &high],
            op,
        )
    }

    fn delete_object(&mut self, id: ObjectId) -> Result<()> {
        self.chunks_gone |= delete_object(&mut self.lease, id)?;
        Ok(())
    }

    fn move_chunk(
        &mut self,
        id: ChunkId,
        from: (ContainerId, u64),
        container: ContainerId,
        offset: u64,
    ) -> Result<()> {
        let op = "moving a chunk";
        let n = self.lease.exec(
            "UPDATE chunks SET container_id = $1, frame_offset = $2 WHERE id = $3 \
             AND container_id = $4 AND frame_offset = $5",
            &[&(container.0 as i64), &(offset as i64), &id.0, &(from.0.0 as i64), &(from.1 as i64)],
            op,
        )?;
        if n == 0 {
            let exists =
                count(&mut self.lease, "SELECT count(*) FROM chunks WHERE id = $1", &[&id.0], op)?
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
        let op = "deleting a chunk";
        // One statement: a backup on another connection that references the chunk meanwhile
        // holds its row lock, and after it commits the condition no longer holds.
        let n =
            self.lease.exec("DELETE FROM chunks WHERE id = $1 AND refcount = 0", &[&id.0], op)?;
        if n == 0 {
            let r = self.lease.opt("SELECT refcount FROM chunks WHERE id = $1", &[&id.0], op)?;
            return Err(match r {
                None => CatalogError::NotFound { what: "chunk", key: id.0.to_string() },
                Some(r) => CatalogError::Refused(format!(
                    "chunk {} is still referenced {} times",
                    id.0,
                    get::<i64>(&r, 0, op)?
                )),
            });
        }
        self.chunks_gone = true;
        Ok(())
    }

    fn delete_container(&mut self, id: ContainerId) -> Result<()> {
        let op = "deleting a container";
        let chunks = count(
            &mut self.lease,
            "SELECT count(*) FROM chunks WHERE container_id = $1",
            &[&(id.0 as i64)],
            op,
        )?;
        if chunks > 0 {
            return Err(CatalogError::Refused(format!(
                "container {:016x} still holds {chunks} chunks",
                id.0
            )));
        }
        // A chunk inserted into it meanwhile makes this fail on the foreign key.
        self.lease.exec("DELETE FROM containers WHERE id = $1", &[&(id.0 as i64)], op).map_err(
            |e| {
                if constraint(&e) {
                    CatalogError::Refused(format!("container {:016x} just received chunks", id.0))
                } else {
                    e
                }
            },
        )?;
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        let op = "committing";
        if self.chunks_gone {
            self.lease.exec(
                "UPDATE catalog_state SET value = value + 1 WHERE name = 'dedup_epoch'",
                &[],
                "raising the dedup epoch",
            )?;
        }
        // In id order (a BTreeSet), so concurrent commits lock filespaces in one order.
        let changed: Vec<i64> = self.changed.iter().copied().collect();
        if !changed.is_empty() {
            self.lease.exec(
                "UPDATE filespaces SET generation = (random() * 9.2e18 - 4.6e18)::BIGINT WHERE id = ANY($1)",
                &[&changed],
                "renewing a filespace's generation",
            )?;
        }
        self.lease.batch("COMMIT", op)?;
        self.done = true;
        Ok(())
    }
}

fn to_param(v: &Value, kind: Kind) -> Box<dyn ToSql + Sync + Send> {
    match (v, kind) {
        (Value::Null, Kind::Int) => Box::new(None::<i64>),
        (Value::Null, Kind::Text) => Box::new(None::<String>),
        (Value::Null, Kind::Bytes) => Box::new(None::<Vec<u8>>),
        (Value::Int(i), _) => Box::new(*i),
        (Value::Text(s), _) => Box::new(s.clone()),
        (Value::Bytes(b), _) => Box::new(b.clone()),
    }
}

impl RawTables for PostgresCatalog {
    fn export(&self, sink: &mut copy::RowSink<'_>) -> Result<()> {
        let op = "reading the catalog for a copy";
        copy::check_version(self.schema_version()?)?;
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        // Every table from one snapshot; in pages by key so no table sits in memory whole.
        c.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", op)?;
        let result = (|| {
            for table in copy::TABLES {
                let cols: Vec<&str> = table.1.iter().map(|c| c.0).collect();
                let key = cols[0];
                let first = format!("{} LIMIT {PAGE}", copy::select_sql(table));
                let next = format!(
                    "SELECT {} FROM {} WHERE {key} > $1 ORDER BY {key} LIMIT {PAGE}",
                    cols.join(", "),
                    table.0
                );
                let mut after: Option<Value> = None;
                loop {
                    let rows = match &after {
                        None => c.query(&first, &[], op)?,
                        Some(Value::Int(i)) => c.query(&next, &[i], op)?,
                        Some(Value::Text(s)) => c.query(&next, &[s], op)?,
                        Some(other) => {
                            return Err(CatalogError::Damaged(format!(
                                "table {} keyed by {other:?}",
                                table.0
                            )));
                        }
                    };
                    let mut values = Vec::with_capacity(cols.len());
                    for r in &rows {
                        values.clear();
                        for (i, (_, kind)) in table.1.iter().enumerate() {
                            values.push(match kind {
                                Kind::Int => {
                                    get::<Option<i64>>(r, i, op)?.map_or(Value::Null, Value::Int)
                                }
                                Kind::Text => get::<Option<String>>(r, i, op)?
                                    .map_or(Value::Null, Value::Text),
                                Kind::Bytes => get::<Option<Vec<u8>>>(r, i, op)?
                                    .map_or(Value::Null, Value::Bytes),
                            });
                        }
                        sink(table, &values)?;
                        after = values.first().cloned();
                    }
                    if rows.len() < PAGE as usize {
                        break;
                    }
                }
            }
            Ok(())
        })();
        let _ = c.batch("COMMIT", op);
        result
    }

    fn import(&self, feed: &mut dyn FnMut(&mut copy::RowSink<'_>) -> Result<()>) -> Result<()> {
        let op = "writing a copy into the catalog";
        copy::check_version(self.schema_version()?)?;
        let mut c = self.pool.get().map_err(|e| self.named(e))?;
        c.batch("BEGIN", op)?;
        let result = (|| {
            // The servers running on the replaced content go with it (copy::EPHEMERAL).
            let names: Vec<&str> =
                copy::TABLES.iter().map(|t| t.0).chain(copy::EPHEMERAL.iter().copied()).collect();
            c.batch(&format!("TRUNCATE {}", names.join(", ")), op)?;
            feed(&mut |table, row| {
                let sql = copy::insert_sql(table, |i| format!("${i}"));
                let params: Vec<Box<dyn ToSql + Sync + Send>> =
                    row.iter().zip(table.1.iter()).map(|(v, (_, k))| to_param(v, *k)).collect();
                let refs: Vec<&(dyn ToSql + Sync)> =
                    params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
                c.exec(&sql, &refs, op)?;
                Ok(())
            })?;
            // The identity generators continue after the largest id copied.
            for table in copy::TABLES {
                if table.1.first().map(|c| c.0) == Some("id") && !matches!(table.0, "containers") {
                    c.batch(
                        &format!(
                            "SELECT setval(pg_get_serial_sequence('{t}', 'id'), \
                             COALESCE((SELECT max(id) FROM {t}), 0) + 1, false)",
                            t = table.0
                        ),
                        op,
                    )?;
                }
            }
            c.batch("COMMIT", op)
        })();
        if result.is_err() && c.batch("ROLLBACK", op).is_err() {
            c.broken = true;
        }
        result
    }

    fn describe(&self) -> String {
        self.url.clone()
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

/// The advisory lock that serializes the write transactions of [`crate::sql::Backend`]
/// across servers ("QSMc" in ASCII).
const COORDINATION_LOCK: i64 = 0x5153_4d63;

/// A [`Value`] bound as whatever type the statement wants: the statements written once bind
/// only integers to BIGINT, text to TEXT and bytes to BYTEA, and NULL to anything.
#[derive(Debug)]
struct Bind<'a>(&'a Value);

impl ToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        match self.0 {
            Value::Null => Ok(tokio_postgres::types::IsNull::Yes),
            Value::Int(i) => i.to_sql(ty, out),
            Value::Text(s) => s.to_sql(ty, out),
            Value::Bytes(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A connection of this catalog seen through [`crate::sql::Sql`].
struct PgSql<'a> {
    conn: &'a mut Conn,
    op: &'static str,
}

impl crate::sql::Sql for PgSql<'_> {
    fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let binds: Vec<Bind<'_>> = params.iter().map(Bind).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = binds.iter().map(|b| b as _).collect();
        self.conn.exec(&crate::sql::dollar_placeholders(sql), &refs, self.op)
    }

    fn rows(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        use tokio_postgres::types::Type;
        let binds: Vec<Bind<'_>> = params.iter().map(Bind).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = binds.iter().map(|b| b as _).collect();
        let op = self.op;
        let rows = self.conn.query(&crate::sql::dollar_placeholders(sql), &refs, op)?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| {
                        let ty = r.columns()[i].type_();
                        Ok(if *ty == Type::INT8 {
                            get::<Option<i64>>(r, i, op)?.map_or(Value::Null, Value::Int)
                        } else if *ty == Type::INT4 {
                            get::<Option<i32>>(r, i, op)?
                                .map_or(Value::Null, |v| Value::Int(i64::from(v)))
                        } else if *ty == Type::TEXT || *ty == Type::VARCHAR {
                            get::<Option<String>>(r, i, op)?.map_or(Value::Null, Value::Text)
                        } else if *ty == Type::BYTEA {
                            get::<Option<Vec<u8>>>(r, i, op)?.map_or(Value::Null, Value::Bytes)
                        } else {
                            return Err(CatalogError::Damaged(format!(
                                "{op}: column {i} has type {ty}, not one the catalog uses"
                            )));
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

impl crate::sql::Backend for PostgresCatalog {
    fn write_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn crate::sql::Sql) -> Result<()>,
    ) -> Result<()> {
        self.in_txn(op, |c| {
            c.exec("SELECT pg_advisory_xact_lock($1)", &[&COORDINATION_LOCK], op)?;
            f(&mut PgSql { conn: c, op })
        })
    }

    fn read_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn crate::sql::Sql) -> Result<()>,
    ) -> Result<()> {
        self.read(|c| f(&mut PgSql { conn: c, op }))
    }
}
