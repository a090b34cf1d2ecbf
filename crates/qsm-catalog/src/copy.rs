//! Copying a whole catalog between backends, table by table: `qsm admin migrate-catalog`
//! (SQLite to PostgreSQL and back), the PostgreSQL catalog's snapshot (a SQLite file, so
//! `backup db` writes one format whatever the backend) and a restore into PostgreSQL.
//!
//! Rows travel as [`Value`]s in each table's primary-key order, read from one snapshot of
//! the source and written in one transaction on the destination, so the copy is of one
//! moment and all or nothing. Ids are copied as they are (chunk lists and foreign keys refer
//! to them), and the destination's id generators continue after the largest. Each table's
//! row count and a BLAKE3 hash of its rows, in order, are computed on both sides: a copy whose
//! digests differ from its source's is reported, never trusted.

use crate::error::{CatalogError, Result};
use crate::migrations::{Dialect, LATEST};
use crate::sql::{self, Arg, Backend, Row};

/// One column value, as both backends store it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An integer (every number in the catalog is a 64-bit integer).
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

/// A column's type, which a NULL needs to be bound on PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// BIGINT.
    Int,
    /// TEXT.
    Text,
    /// BLOB / BYTEA.
    Bytes,
}

/// Tables that describe the servers running on the catalog (module `coord`), not its data:
/// a copy leaves them out, so a restored catalog starts with no server, session or lease.
pub const EPHEMERAL: &[&str] = &["servers", "open_sessions", "container_leases"];

/// A table and its columns (name, kind), the first being the key the rows are ordered by.
pub type Table = (&'static str, &'static [(&'static str, Kind)]);

use Kind::{Bytes as B, Int as I, Text as T};

/// Every table of schema [`LATEST`], parents before children (foreign keys hold after each
/// table). A new migration that adds a table or column adds it here; the test
/// `tables_list_every_column` compares this list with the schema itself.
pub const TABLES: &[Table] = &[
    ("domains", &[("id", I), ("name", T), ("description", T)]),
    ("mgmt_classes", &[("id", I), ("domain_id", I), ("name", T), ("retain_min_days", I)]),
    (
        "backup_copygroups",
        &[
            ("mgmt_class_id", I),
            ("versions_exist", I),
            ("versions_deleted", I),
            ("retain_extra_days", I),
            ("retain_only_days", I),
        ],
    ),
    ("archive_copygroups", &[("mgmt_class_id", I), ("retain_version_days", I)]),
    ("dedup_scopes", &[("id", I), ("name", T), ("secret", B)]),
    (
        "nodes",
        &[
            ("id", I),
            ("name", T),
            ("password_hash", T),
            ("domain_id", I),
            ("locked", I),
            ("registered", I),
            ("dedup_scope", I),
            ("key_file", B),
            ("cloptset_id", I),
            ("replica_of", T),
            ("replica_incarnation", I),
        ],
    ),
    (
        "filespaces",
        &[
            ("id", I),
            ("node_id", I),
            ("name", T),
            ("created", I),
            ("generation", I),
            ("last_started", I),
            ("last_ended", I),
            ("last_result", T),
            ("last_objects", I),
            ("last_bytes", I),
            ("last_warnings", I),
            ("ok_started", I),
            ("ok_ended", I),
            ("ok_result", T),
            ("ok_objects", I),
            ("ok_bytes", I),
            ("ok_warnings", I),
        ],
    ),
    ("storage_pools", &[("id", I), ("name", T), ("kind", T), ("location", T)]),
    (
        "schedules",
        &[
            ("id", I),
            ("domain_id", I),
            ("name", T),
            ("action", T),
            ("objects", T),
            ("start_at", I),
            ("duration", I),
            ("period", I),
            ("days", T),
            ("defined", I),
        ],
    ),
    (
        "events",
        &[
            ("id", I),
            ("schedule_id", I),
            ("node_id", I),
            ("window_start", I),
            ("state", T),
            ("started", I),
            ("ended", I),
            ("detail", T),
        ],
    ),
    ("associations", &[("id", I), ("schedule_id", I), ("node_id", I), ("since", I)]),
    ("cloptsets", &[("id", I), ("name", T), ("description", T)]),
    ("clientopts", &[("id", I), ("set_id", I), ("name", T), ("value", T), ("force", I)]),
    (
        "holds",
        &[
            ("id", I),
            ("node_id", I),
            ("filespace_id", I),
            ("kind", T),
            ("since", I),
            ("by_whom", T),
            ("reason", T),
        ],
    ),
    (
        "backup_stats",
        &[
            ("id", I),
            ("filespace_id", I),
            ("ended", I),
            ("files", I),
            ("changed", I),
            ("raw_bytes", I),
            ("stored_bytes", I),
            ("chunks", I),
            ("refs", I),
            ("suspect", I),
        ],
    ),
    (
        "backup_runs",
        &[
            ("id", I),
            ("filespace_id", I),
            ("started", I),
            ("ended", I),
            ("result", T),
            ("objects", I),
            ("bytes", I),
            ("warnings", I),
        ],
    ),
    (
        "peer_servers",
        &[
            ("id", I),
            ("name", T),
            ("address", T),
            ("ca", T),
            ("account", T),
            ("password", T),
            ("created", I),
        ],
    ),
    ("containers", &[("id", I), ("pool_id", I), ("size", I), ("sealed", I)]),
    (
        "chunks",
        &[
            ("id", I),
            ("container_id", I),
            ("frame_offset", I),
            ("stored_len", I),
            ("raw_len", I),
            ("codec", I),
            ("refcount", I),
            ("hash", B),
            ("scope", I),
            ("sealed", I),
            ("damaged", I),
        ],
    ),
    (
        "objects",
        &[
            ("id", I),
            ("filespace_id", I),
            ("state", I),
            ("path", B),
            ("object_type", I),
            ("size", I),
            ("mtime_ns", I),
            ("ctime_ns", I),
            ("mode", I),
            ("uid", I),
            ("gid", I),
            ("inserted", I),
            ("deactivated", I),
            ("mgmt_class_id", I),
            ("description", T),
            ("retain_until", I),
            ("link_target", B),
            ("chunk_list", B),
            ("ino", I),
            ("damaged", I),
            ("meta", B),
            ("locked_until", I),
            ("origin", I),
        ],
    ),
    (
        "sessions",
        &[
            ("id", I),
            ("node_id", I),
            ("started", I),
            ("ended", I),
            ("bytes", I),
            ("objects", I),
            ("state", T),
        ],
    ),
    (
        "processes",
        &[
            ("id", I),
            ("kind", T),
            ("started", I),
            ("ended", I),
            ("state", T),
            ("detail", T),
            ("server_id", I),
            ("cancel", I),
            ("progress", T),
        ],
    ),
    (
        "activity_log",
        &[
            ("id", I),
            ("time", I),
            ("severity", I),
            ("message", T),
            ("node_id", I),
            ("session_id", I),
            ("process_id", I),
        ],
    ),
    (
        "admins",
        &[
            ("id", I),
            ("name", T),
            ("password_hash", T),
            ("locked", I),
            ("registered", I),
            ("privileges", T),
        ],
    ),
    ("catalog_state", &[("name", T), ("value", I)]),
];

/// Receives the rows of a copy: table by table in [`TABLES`] order, each table's rows in key
/// order, each row's values in the table's column order.
pub type RowSink<'a> = dyn FnMut(&Table, &[Value]) -> Result<()> + 'a;

/// What a backend provides for whole-catalog copies.
pub trait RawTables {
    /// Calls `sink` with every row of every table in [`TABLES`], all read from one snapshot.
    fn export(&self, sink: &mut RowSink<'_>) -> Result<()>;

    /// Replaces the whole content of the catalog, in one transaction, with the rows `feed`
    /// passes to the sink it is given (in [`export`](RawTables::export)'s order), then moves
    /// every id generator past the largest id copied.
    fn import(&self, feed: &mut dyn FnMut(&mut RowSink<'_>) -> Result<()>) -> Result<()>;

    /// A short name of the catalog for messages (a path or a URL without password).
    fn describe(&self) -> String;
}

/// Per-table row counts and digests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Digest {
    /// (table, rows, BLAKE3 of the rows) in [`TABLES`] order.
    pub tables: Vec<(&'static str, u64, [u8; 32])>,
}

impl Digest {
    /// Rows in all tables.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.1).sum()
    }
}

/// Computes [`Digest`]s of rows as they pass.
#[derive(Debug, Default)]
struct Digester {
    done: Vec<(&'static str, u64, [u8; 32])>,
    current: Option<(&'static str, u64, blake3::Hasher)>,
}

impl Digester {
    fn add(&mut self, table: &Table, row: &[Value]) {
        if self.current.as_ref().map(|c| c.0) != Some(table.0) {
            self.close();
            self.current = Some((table.0, 0, blake3::Hasher::new()));
        }
        if let Some((_, n, h)) = &mut self.current {
            *n += 1;
            for v in row {
                // Self-delimiting, so no two different rows hash alike.
                match v {
                    Value::Null => {
                        h.update(&[0]);
                    }
                    Value::Int(i) => {
                        h.update(&[1]);
                        h.update(&i.to_le_bytes());
                    }
                    Value::Text(s) => {
                        h.update(&[2]);
                        h.update(&(s.len() as u64).to_le_bytes());
                        h.update(s.as_bytes());
                    }
                    Value::Bytes(b) => {
                        h.update(&[3]);
                        h.update(&(b.len() as u64).to_le_bytes());
                        h.update(b);
                    }
                }
            }
        }
    }

    fn close(&mut self) {
        if let Some((t, n, h)) = self.current.take() {
            self.done.push((t, n, *h.finalize().as_bytes()));
        }
    }

    /// The digest, with empty tables listed too.
    fn finish(mut self) -> Digest {
        self.close();
        let tables = TABLES
            .iter()
            .map(|(name, _)| {
                self.done.iter().find(|d| d.0 == *name).copied().unwrap_or((
                    name,
                    0,
                    *blake3::Hasher::new().finalize().as_bytes(),
                ))
            })
            .collect();
        Digest { tables }
    }
}

/// The digest of a catalog's content as of one moment.
pub fn digest(catalog: &dyn RawTables) -> Result<Digest> {
    let mut d = Digester::default();
    catalog.export(&mut |t, row| {
        d.add(t, row);
        Ok(())
    })?;
    Ok(d.finish())
}

/// Copies everything in `from` into `to`, replacing what `to` held, and verifies the copy:
/// `to` is read back and its digest must equal that of what was read from `from`.
/// Returns that digest.
pub fn copy_catalog(from: &dyn RawTables, to: &dyn RawTables) -> Result<Digest> {
    let mut source = Digester::default();
    to.import(&mut |sink| {
        from.export(&mut |t, row| {
            source.add(t, row);
            sink(t, row)
        })
    })?;
    let source = source.finish();
    let copy = digest(to)?;
    if copy != source {
        let differ: Vec<String> = source
            .tables
            .iter()
            .zip(&copy.tables)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| format!("{}: {} rows read, {} rows in the copy", a.0, a.1, b.1))
            .collect();
        return Err(CatalogError::Damaged(format!(
            "the copy of {} in {} differs from what was read: {}",
            from.describe(),
            to.describe(),
            differ.join("; ")
        )));
    }
    Ok(source)
}

/// Rows per page of an export: no table sits in memory whole (PostgreSQL's driver reads a
/// result whole).
const EXPORT_PAGE: usize = 10_000;

/// Every catalog's rows, through the SQL written once ([`crate::sql`]).
impl<B: Backend> RawTables for B {
    fn export(&self, sink: &mut RowSink<'_>) -> Result<()> {
        check_version(self.read_schema_version()?)?;
        // Every table from one snapshot, in pages by key.
        sql::snapshot(self, "reading the catalog for a copy", |s| {
            let page = Arg::Int(EXPORT_PAGE as i64);
            for table in TABLES {
                let first = format!("{} LIMIT ?1", select_sql(table));
                let cols: Vec<&str> = table.1.iter().map(|c| c.0).collect();
                let next = format!(
                    "SELECT {} FROM {} WHERE {key} > ?2 ORDER BY {key} LIMIT ?1",
                    cols.join(", "),
                    table.0,
                    key = cols[0]
                );
                let mut values = Vec::with_capacity(cols.len());
                let mut after: Option<Value> = None;
                loop {
                    let mut n = 0;
                    let mut visit = |r: &dyn Row| {
                        values.clear();
                        for i in 0..cols.len() {
                            values.push(r.value(i)?);
                        }
                        n += 1;
                        sink(table, &values)
                    };
                    match &after {
                        None => s.each(&first, &[page], &mut visit)?,
                        Some(key) => s.each(&next, &[page, key.into()], &mut visit)?,
                    }
                    if n < EXPORT_PAGE {
                        break;
                    }
                    after = values.first().cloned();
                }
            }
            Ok(())
        })
    }

    fn import(&self, feed: &mut dyn FnMut(&mut RowSink<'_>) -> Result<()>) -> Result<()> {
        check_version(self.read_schema_version()?)?;
        sql::txn(self, "writing a copy into the catalog", |s| {
            // The servers running on the replaced content go with it (EPHEMERAL).
            let names: Vec<&str> =
                TABLES.iter().rev().map(|t| t.0).chain(EPHEMERAL.iter().copied()).collect();
            if s.dialect() == Dialect::Postgres {
                // One statement, however much it replaces.
                s.execute(&format!("TRUNCATE {}", names.join(", ")), &[])?;
            } else {
                for table in &names {
                    s.execute(&format!("DELETE FROM {table}"), &[])?;
                }
            }
            let mut insert: Option<(&str, String)> = None;
            feed(&mut |table, row| {
                let sql = match &insert {
                    Some((name, sql)) if *name == table.0 => sql,
                    _ => &insert.insert((table.0, insert_sql(table, |i| format!("?{i}")))).1,
                };
                let args: Vec<Arg<'_>> = row.iter().map(Arg::from).collect();
                s.execute(sql, &args).map(|_| ())
            })?;
            // The identity generators continue after the largest id copied (SQLite's
            // AUTOINCREMENT does by itself). Containers are numbered by their pools.
            if s.dialect() == Dialect::Postgres {
                for table in TABLES {
                    if table.1.first().map(|c| c.0) == Some("id") && table.0 != "containers" {
                        s.execute(
                            &format!(
                                "SELECT setval(pg_get_serial_sequence('{t}', 'id'), \
                                 COALESCE((SELECT max(id) FROM {t}), 0) + 1, false)",
                                t = table.0
                            ),
                            &[],
                        )?;
                    }
                }
            }
            Ok(())
        })
    }

    fn describe(&self) -> String {
        self.location()
    }
}

/// `INSERT INTO table (columns) VALUES (placeholders)`, with `placeholder(i)` for the
/// 1-based parameter `i`.
pub(crate) fn insert_sql(table: &Table, placeholder: impl Fn(usize) -> String) -> String {
    let cols: Vec<&str> = table.1.iter().map(|c| c.0).collect();
    let params: Vec<String> = (1..=cols.len()).map(placeholder).collect();
    format!("INSERT INTO {} ({}) VALUES ({})", table.0, cols.join(", "), params.join(", "))
}

/// `SELECT columns FROM table ORDER BY key`.
pub(crate) fn select_sql(table: &Table) -> String {
    let cols: Vec<&str> = table.1.iter().map(|c| c.0).collect();
    format!("SELECT {} FROM {} ORDER BY {}", cols.join(", "), table.0, cols[0])
}

/// The schema version the tables describe; a backend refuses copies at any other.
pub const TABLES_VERSION: u32 = LATEST;

/// Refuses to copy a catalog of another schema than [`TABLES`] describes.
pub(crate) fn check_version(found: u32) -> Result<()> {
    if found != TABLES_VERSION {
        return Err(CatalogError::Refused(format!(
            "a catalog of schema {found} cannot be copied by this program (schema \
             {TABLES_VERSION}): open it with this program first to upgrade it"
        )));
    }
    Ok(())
}

/// Why `qsm admin migrate-catalog` did not copy.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A catalog named that is not one (missing, not a database, newer than this program):
    /// named by mistake, so a usage error.
    #[error("{0}")]
    NotACatalog(String),
    /// The destination holds a catalog and replacing it was not asked.
    #[error("{dest} already holds a catalog ({rows} rows): give --replace to overwrite it")]
    NotEmpty {
        /// The destination, for messages.
        dest: String,
        /// Rows it holds.
        rows: u64,
    },
    /// Opening, reading or writing a catalog failed.
    #[error("{what}: {source}")]
    Catalog {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: CatalogError,
    },
}

/// One table of a verified copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TableCopy {
    pub table: &'static str,
    pub rows: u64,
    /// BLAKE3 of the table's rows, in hex: equal in source and copy.
    pub blake3: String,
}

/// A verified whole-catalog copy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Migration {
    pub from: String,
    pub to: String,
    pub rows: u64,
    pub seconds: f64,
    /// Always true: a copy whose digest differs is an error, not a report.
    pub verified: bool,
    pub tables: Vec<TableCopy>,
}

/// Copies the catalog `from` into `to` (each `sqlite:PATH`, a path, or a `postgres://` URL;
/// `to` is created or migrated if new) and verifies it; a destination holding rows of its
/// own is refused unless `replace`.
pub fn migrate(
    from: &str,
    to: &str,
    replace: bool,
) -> std::result::Result<Migration, MigrateError> {
    if !crate::is_postgres(from) {
        let path = std::path::Path::new(from.strip_prefix("sqlite:").unwrap_or(from));
        if !path.is_file() {
            let why = format!("the source catalog {} does not exist", path.display());
            return Err(MigrateError::NotACatalog(why));
        }
    }
    let open = |url: &str, what: &str| {
        crate::AnyCatalog::open(url).map_err(|e| {
            let what = format!("opening the {what} {}", crate::postgres::redact(url));
            match e {
                CatalogError::NotADatabase { .. } | CatalogError::TooNew { .. } => {
                    MigrateError::NotACatalog(format!("{what}: {e}"))
                }
                source => MigrateError::Catalog { what, source },
            }
        })
    };
    let source = open(from, "source catalog")?;
    let dest = open(to, "destination")?;
    let failed = |what: String| move |source| MigrateError::Catalog { what, source };
    let held =
        digest(dest.tables()).map_err(failed(format!("reading {}", dest.tables().describe())))?;
    // A new catalog holds only the rows its migrations insert (the catalog state).
    let rows: u64 = held.tables.iter().filter(|t| t.0 != "catalog_state").map(|t| t.1).sum();
    if rows > 0 && !replace {
        return Err(MigrateError::NotEmpty { dest: dest.tables().describe(), rows });
    }
    let started = std::time::Instant::now();
    let what = format!("copying {} to {}", source.tables().describe(), dest.tables().describe());
    let copied = copy_catalog(source.tables(), dest.tables()).map_err(failed(what))?;
    Ok(Migration {
        from: source.tables().describe(),
        to: dest.tables().describe(),
        rows: copied.rows(),
        seconds: started.elapsed().as_secs_f64(),
        verified: true,
        tables: copied
            .tables
            .iter()
            .map(|(table, rows, h)| TableCopy {
                table,
                rows: *rows,
                blake3: h.iter().map(|b| format!("{b:02x}")).collect(),
            })
            .collect(),
    })
}
