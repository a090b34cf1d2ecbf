//! Client errors: fatal ones stop the operation; per-file problems are counted and reported
//! as warnings instead (see the summaries).

use std::path::PathBuf;

pub use qsm_types::ServerError;

/// An error that stops a client operation.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused or failed, or could not be reached
    /// ([`ServerError::Unreachable`]: another server sharing its catalog and pool may take
    /// over, and `qsm backup` fails over).
    #[error(transparent)]
    Server(#[from] ServerError),
    /// A local file operation failed where the operation cannot go on without it.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The request is invalid (no such filespace, a path outside the target...).
    #[error("{0}")]
    Invalid(String),
    /// How the command was given cannot work: an option's value, or a file it names that is
    /// not what it should be (a CA that holds no certificate). The command exits 2.
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ClientError {
        let path = path.into();
        move |source| ClientError::Io { op, path, source }
    }
}

pub use qsm_types::error_chain as chain;

/// Result of client operations.
pub type Result<T> = std::result::Result<T, ClientError>;
