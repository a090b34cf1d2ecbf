//! # qsm-client: the backup-archive client
//!
//! Scans a directory tree, decides what changed against the server's active inventory
//! (size, times, mode, owner, link target), sends changed files through the codec engine
//! (every core compresses independent quanta) into a [`qsm_store::Batch`], marks deleted
//! files inactive, and restores active versions without ever writing outside the target.
//!
//! Today the client talks to an [`Embedded`] server: the catalog and pool under `$QSM_HOME`,
//! in process, created on first use, so `qsm backup DIR` works with no set-up. The network
//! server of issue 4 will offer the same operations over the wire.

pub mod adaptive;
pub mod archives;
pub mod backup;
pub mod chunker;
pub mod dedup;
mod dirs;
pub mod embedded;
pub mod error;
pub mod filter;
pub mod fsmeta;
pub mod journal;
pub mod keys;
pub mod remote;
pub mod restore;
pub mod scan;
pub mod server;
pub mod throttle;

pub use backup::{BackupOptions, BackupSummary, Progress, archive, backup};
pub use embedded::Embedded;
pub use error::{ClientError, Result};
pub use filter::Filter;
pub use restore::{RestoreOptions, RestoreSummary, Selection, restore};
