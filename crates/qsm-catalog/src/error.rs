//! Catalog errors. Every variant names the object it concerns; the underlying database error
//! is kept as the source.

use std::path::PathBuf;

/// An error of the catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The file exists but is not a database of any kind.
    #[error("{path} is not a QSM catalog (not an SQLite database): {detail}")]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
    /// The catalog was written by a newer program.
    #[error(
        "catalog {path} has schema version {found}, newer than this program's {supported}; upgrade qsm"
    )]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Newest version this program knows.
        supported: u32,
    },
    /// A name or key that must be unique already exists.
    #[error("{what} {name:?} already exists")]
    Exists {
        /// Kind of object ("node", "domain", ...).
        what: &'static str,
        /// Its name.
        name: String,
    },
    /// A referenced object does not exist.
    #[error("{what} {key} does not exist")]
    NotFound {
        /// Kind of object.
        what: &'static str,
        /// Its name or id.
        key: String,
    },
    /// An operation that would break an invariant (e.g. deleting a referenced chunk).
    #[error("{0}")]
    Refused(String),
    /// A version under a retention lock or a hold: nobody may delete it now.
    #[error("{0}")]
    Protected(String),
    /// Stored data that cannot be right (e.g. an undecodable chunk list).
    #[error("catalog is damaged: {0}")]
    Damaged(String),
    /// The file system holding the catalog has no space left: the operation was rolled back.
    #[error(
        "the disk holding the catalog {path} is full ({detail}) while {op}: the catalog was not changed; free space on that disk, or move the catalog"
    )]
    DiskFull {
        /// The catalog's database file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// What the database said, and the space left.
        detail: String,
    },
    /// The disk holding the catalog failed (an I/O error, not a full disk).
    #[error(
        "the disk holding the catalog {path} failed while {op}: {detail}; what was being done is not counted as done: check the disk (dmesg), then run `qsm admin audit stgpool`"
    )]
    DiskFailed {
        /// The catalog's database file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// Which I/O step failed, and what SQLite said.
        detail: String,
    },
    /// The database failed.
    #[error("catalog database error while {op}: {source}")]
    Db {
        /// What was being done.
        op: &'static str,
        /// The database error.
        source: rusqlite::Error,
    },
    /// PostgreSQL failed or refused.
    #[error("catalog database error while {op}: {}", pg_detail(source))]
    Pg {
        /// What was being done.
        op: &'static str,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// A file operation around the database failed (syncing its directory).
    #[error("catalog: {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The catalog's database cannot be reached.
    #[error("the catalog database {what} is unavailable: {detail}")]
    Unavailable {
        /// The database (a URL without password).
        what: String,
        /// Why.
        detail: String,
    },
}

/// PostgreSQL's own message and code, which the driver's Display leaves out ("db error").
pub(crate) fn pg_detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

impl CatalogError {
    /// Whether the same work may succeed if tried again: a deadlock or serialization failure
    /// between concurrent transactions, a connection lost and made again, or a new active
    /// version of a path that another transaction made active at the same time (on
    /// PostgreSQL two servers can back up one path at once; a transaction deactivates the
    /// active version before inserting its own, so the unique index `objects_active` fails
    /// only when a concurrent one inserted first, and run again it replaces that one).
    pub fn is_transient(&self) -> bool {
        match self {
            CatalogError::Pg { source, .. } => match source.code() {
                Some(code) => {
                    matches!(code.code(), "40001" | "40P01" | "57P01" | "57P02" | "57P03")
                        || code.code().starts_with("08")
                        || (code.code() == "23505"
                            && source.as_db_error().and_then(|d| d.constraint())
                                == Some("objects_active"))
                }
                None => source.is_closed(),
            },
            CatalogError::Unavailable { .. } => true,
            CatalogError::Db { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }

    /// A unique, foreign-key, check or not-null constraint refused a write.
    pub(crate) fn is_constraint(&self) -> bool {
        self.constraint().is_some()
    }

    /// A unique constraint (or primary key) refused a write: the name or key exists.
    pub(crate) fn is_unique(&self) -> bool {
        self.constraint() == Some(Constraint::Unique)
    }

    /// A foreign key refused a write: what it refers to does not exist (or, on a delete,
    /// something still refers to the row).
    pub(crate) fn is_foreign_key(&self) -> bool {
        self.constraint() == Some(Constraint::ForeignKey)
    }

    fn constraint(&self) -> Option<Constraint> {
        match self {
            CatalogError::Db { source, .. } => match source {
                rusqlite::Error::SqliteFailure(e, _)
                    if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    Some(match e.extended_code {
                        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                        | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY => Constraint::Unique,
                        rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => Constraint::ForeignKey,
                        _ => Constraint::Other,
                    })
                }
                _ => None,
            },
            CatalogError::Pg { source, .. } => {
                let code = source.code()?.code();
                match code {
                    "23505" => Some(Constraint::Unique),
                    "23503" => Some(Constraint::ForeignKey),
                    _ if code.starts_with("23") => Some(Constraint::Other),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    pub(crate) fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> CatalogError {
        move |source| CatalogError::Db { op, source }
    }
}

/// Which kind of constraint refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Constraint {
    Unique,
    ForeignKey,
    Other,
}

/// Result of catalog operations.
pub type Result<T> = std::result::Result<T, CatalogError>;
