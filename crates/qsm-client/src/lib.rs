//! # qsm-client: the backup-archive client
//!
//! Scans a directory tree, decides what changed against the server's active inventory
//! (size, times, mode, owner, link target), sends changed files through the codec engine
//! (every core compresses independent quanta) to the server, marks deleted
//! files inactive, and restores active versions without ever writing outside the target.
//!
//! It knows no storage: it speaks to a server through the node interface
//! ([`server::Server`]), which the server core implements in this process (the embedded
//! default, `qsm_server::Embedded`) and [`remote::RemoteServer`] across the network.

pub mod adaptive;
pub mod archives;
pub mod backup;
pub mod chunker;
pub mod config;
pub mod dedup;
mod dirs;
pub mod error;
pub mod filter;
pub mod fsmeta;
pub mod journal;
pub mod keys;
pub mod remote;
pub mod report;
pub mod restore;
pub mod scan;
pub mod server;
pub mod throttle;

pub use backup::{BackupOptions, BackupSummary, Progress, archive, backup};
pub use error::{ClientError, Result};
pub use filter::Filter;
pub use restore::{RestoreOptions, RestoreSummary, Selection, restore};
