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
    /// Stored data that cannot be right (e.g. an undecodable chunk list).
    #[error("catalog is damaged: {0}")]
    Damaged(String),
    /// The database failed.
    #[error("catalog database error while {op}: {source}")]
    Db {
        /// What was being done.
        op: &'static str,
        /// The database error.
        source: rusqlite::Error,
    },
}

impl CatalogError {
    pub(crate) fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> CatalogError {
        move |source| CatalogError::Db { op, source }
    }
}

/// Result of catalog operations.
pub type Result<T> = std::result::Result<T, CatalogError>;
