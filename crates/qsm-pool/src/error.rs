//! Errors of the storage pool.
//!
//! Policy: nothing in this crate panics on the content of a file, whatever its bytes. Every
//! error names the object it is about: the pool (its name and where it lives), the container
//! (as the 16 hexadecimal digits of its file name), the byte offset and, when the caller
//! knows it, the chunk. Two conditions an administrator must act on get their own variants
//! instead of a generic I/O error: a full file system ([`PoolError::Full`]) and a pool that
//! cannot be written ([`PoolError::ReadOnly`]).

use std::io;
use std::path::{Path, PathBuf};

use qsm_codec::FrameError;

use crate::{ContainerId, PoolId};

/// An error of a storage pool operation.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// An I/O operation failed for a reason other than those below.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("reading container", "syncing directory").
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file system holding the pool is full (ENOSPC, or a quota: EDQUOT).
    #[error(
        "{op} {}: no space left on the file system holding the pool ({source}); frames synced \
         before this error are safe, later ones are not: free space or add a pool",
        path.display()
    )]
    Full {
        /// What was being done.
        op: &'static str,
        /// The file or directory being written.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The pool cannot be written: a read-only file system (EROFS) or no permission (EACCES).
    #[error(
        "{op} {}: the pool is read-only ({source}); reading still works, writing needs a \
         writable file system and write permission",
        path.display()
    )]
    ReadOnly {
        /// What was being done.
        op: &'static str,
        /// The file or directory being written.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Stored bytes are damaged, truncated or not where the caller said: never returned as
    /// data.
    #[error(
        "pool {pool}: container {container:016x} at byte offset {offset}{}: {detail} (the data \
         is not returned; an audit of the container lists all its damage)",
        chunk.map(|c| format!(" (chunk {c})")).unwrap_or_default()
    )]
    Corrupt {
        /// The pool (name and location).
        pool: String,
        /// The container.
        container: ContainerId,
        /// Where in the container the damage was found.
        offset: u64,
        /// The chunk the caller was reading, if it said.
        chunk: Option<u64>,
        /// What is wrong.
        detail: String,
    },
    /// The container does not exist (never written, or deleted).
    #[error("pool {pool}: container {container:016x} does not exist")]
    NotFound {
        /// The pool (name and location).
        pool: String,
        /// The container asked for.
        container: ContainerId,
    },
    /// The container's header names another pool: it was copied or moved here.
    #[error(
        "pool {pool}: container {container:016x} belongs to another pool (pool id {found}, this \
         pool is {expected}); it was copied or moved here and is not read"
    )]
    WrongPool {
        /// The pool (name and location).
        pool: String,
        /// The container.
        container: ContainerId,
        /// This pool's id.
        expected: PoolId,
        /// The id in the container header.
        found: PoolId,
    },
    /// The directory is not a pool, or its descriptor is damaged or of an unknown version.
    #[error("{} is not a QSM pool: {detail}", path.display())]
    NotAPool {
        /// The directory given.
        path: PathBuf,
        /// Why not.
        detail: String,
    },
    /// A frame given to [`crate::PoolWriter::append`] is not one complete, valid frame.
    #[error("pool {pool}: frame rejected before writing: {source}")]
    InvalidFrame {
        /// The pool (name and location).
        pool: String,
        /// What is wrong with the frame.
        source: FrameError,
    },
    /// The writer failed earlier and refuses further work, since what it wrote after its last
    /// successful sync is in an unknown state.
    #[error(
        "pool {pool}: the writer of container {container:016x} failed earlier ({detail}); \
         frames appended since its last successful sync are lost: drop it and start a new writer"
    )]
    WriterFailed {
        /// The pool (name and location).
        pool: String,
        /// The container the writer was on.
        container: ContainerId,
        /// The first error.
        detail: String,
    },
    /// The container is open for writing by a writer of this process.
    #[error("pool {pool}: container {container:016x} is open for writing and cannot be deleted")]
    Busy {
        /// The pool (name and location).
        pool: String,
        /// The container.
        container: ContainerId,
    },
    /// A request that cannot be carried out as asked (a bad option or name).
    #[error("{0}")]
    Invalid(String),
}

impl PoolError {
    /// Whether this error reports damaged or misplaced stored data (as opposed to an
    /// operation that could not run).
    pub fn is_corruption(&self) -> bool {
        matches!(self, PoolError::Corrupt { .. } | PoolError::WrongPool { .. })
    }
}

// errno values, identical on Linux, the BSDs and macOS; named here instead of pulling in
// `libc` for three constants.
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;
const EACCES: i32 = 13;
// Disk quota exceeded; its number differs between systems (69 on the BSDs and macOS).
#[cfg(target_os = "linux")]
const EDQUOT: i32 = 122;
#[cfg(not(target_os = "linux"))]
const EDQUOT: i32 = 69;

/// The error of an operation that writes: a full or read-only file system gets its own
/// variant.
pub(crate) fn write_error(op: &'static str, path: &Path, source: io::Error) -> PoolError {
    let path = path.to_path_buf();
    match source.raw_os_error() {
        Some(ENOSPC | EDQUOT) => PoolError::Full { op, path, source },
        Some(EROFS | EACCES) => PoolError::ReadOnly { op, path, source },
        _ => PoolError::Io { op, path, source },
    }
}

/// The error of an operation that only reads. EACCES here is not "read-only", so it stays an
/// I/O error naming the file.
pub(crate) fn read_error(op: &'static str, path: &Path, source: io::Error) -> PoolError {
    PoolError::Io { op, path: path.to_path_buf(), source }
}
