//! The PostgreSQL catalog's connections: made on demand, kept while idle, dropped when
//! broken, each with its prepared statements.
//!
//! ## Why tokio-postgres, driven this way
//! The [`crate::Catalog`] interface is synchronous (the server calls it from blocking threads, the
//! embedded server and the tools from plain ones) but some calls come from threads of the
//! server's async runtime. The blocking `postgres` wrapper panics there ("cannot start a
//! runtime from within a runtime"), and so does any `Runtime::block_on`. So the catalog owns
//! a small runtime of its own that drives the connections' sockets, and a call waits for its
//! query with `futures_executor::block_on`: a tokio-postgres client future only talks to its
//! connection task through channels, so it can be awaited from any thread. `sqlx` would have
//! meant moving the SQLite catalog to it too (its SQLite and rusqlite cannot coexist), and
//! `deadpool-postgres` spawns onto the caller's runtime; the pool here is a few lines.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_executor::block_on;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, NoTls, Row, Statement};

use crate::error::{CatalogError, Result};
use crate::sql;

/// Idle connections kept open for reuse.
const MAX_IDLE: usize = 8;
/// Connections open at once at most; a caller beyond waits, up to [`POOL_WAIT`].
const MAX_OPEN: usize = 32;
const POOL_WAIT: Duration = Duration::from_secs(60);
/// How long a new connection is retried (PostgreSQL restarting takes a few seconds).
const CONNECT_FOR: Duration = Duration::from_secs(15);

pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

pub(crate) fn pg(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CatalogError {
    move |source| CatalogError::Pg { op, source }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One connection with its prepared statements, by their text as written (`?N`).
pub(crate) struct Conn {
    pub(crate) client: Client,
    statements: HashMap<String, Statement>,
    /// The statements of [`Sql::insert`], each with `RETURNING id` appended.
    inserts: HashMap<String, Statement>,
    /// Set when a statement failed in a way that may leave the session unusable.
    pub(crate) broken: bool,
}

impl Conn {
    pub(crate) fn statement(&mut self, sql: &str, op: &'static str) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = block_on(self.client.prepare(&sql::dollar_placeholders(sql))).map_err(pg(op))?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    pub(crate) fn insert_statement(&mut self, sql: &str, op: &'static str) -> Result<Statement> {
        if let Some(s) = self.inserts.get(sql) {
            return Ok(s.clone());
        }
        let returning = format!("{} RETURNING id", sql::dollar_placeholders(sql));
        let s = block_on(self.client.prepare(&returning)).map_err(pg(op))?;
        self.inserts.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    pub(crate) fn note<T>(
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

    pub(crate) fn query(
        &mut self,
        sql: &str,
        params: Params<'_>,
        op: &'static str,
    ) -> Result<Vec<Row>> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.query(&s, params));
        self.note(r, op)
    }

    pub(crate) fn one(&mut self, sql: &str, params: Params<'_>, op: &'static str) -> Result<Row> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.query_one(&s, params));
        self.note(r, op)
    }

    pub(crate) fn exec(&mut self, sql: &str, params: Params<'_>, op: &'static str) -> Result<u64> {
        let s = self.statement(sql, op)?;
        let r = block_on(self.client.execute(&s, params));
        self.note(r, op)
    }

    pub(crate) fn batch(&mut self, sql: &str, op: &'static str) -> Result<()> {
        let r = block_on(self.client.batch_execute(sql));
        self.note(r, op)
    }
}

pub(crate) fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize, op: &'static str) -> Result<T> {
    row.try_get(i).map_err(pg(op))
}

/// The connections: made on demand, kept while idle, dropped when broken.
pub(crate) struct Connections {
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
pub(crate) struct Lease<'a> {
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
    /// A pool of connections to the database `config` names, over `tls`, driven by a
    /// runtime of its own.
    pub(crate) fn new(
        config: tokio_postgres::Config,
        tls: crate::pg_tls::Tls,
    ) -> Result<Connections> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("qsm-postgres")
            .enable_all()
            .build()
            .map_err(|e| CatalogError::Refused(format!("starting the PostgreSQL driver: {e}")))?;
        Ok(Connections {
            config,
            tls,
            runtime: Some(runtime),
            idle: Mutex::new(Vec::new()),
            open: Mutex::new(0),
            freed: std::sync::Condvar::new(),
        })
    }

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

    pub(crate) fn get(&self) -> Result<Lease<'_>> {
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
