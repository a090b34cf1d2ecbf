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
//!
//! With encryption on, the node's key is [`keyring`]'s: which key file, when the server's copy
//! is fetched, made, given or left alone, and the key commands' decisions; it asks
//! passphrases through [`Passphrases`] and reports through [`keyring::Notice`], so that the
//! CLI only asks and words.

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
pub mod keyring;
pub mod keys;
mod private;
pub mod remote;
pub mod report;
pub mod restore;
pub mod scan;
pub mod sched;
pub mod server;
pub mod tar;
pub mod throttle;

pub use backup::{BackupOptions, BackupSummary, Progress, archive, backup};
pub use error::{ClientError, Result};
pub use filter::Filter;
pub use keyring::{KeyUse, Keyring, Passphrases};
pub use restore::{RestoreOptions, RestoreSummary, Selection, restore};
