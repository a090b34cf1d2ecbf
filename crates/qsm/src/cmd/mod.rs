//! One module per verb: each reads its options, calls the libraries and renders their reports.

pub mod admin;
pub mod archive;
pub mod backup;
pub mod codec;
pub mod journal;
pub mod key;
pub mod query;
pub mod restore;
pub mod retrieve;
pub mod sched;
mod send;
pub mod server;
pub mod stand;

/// Whether a command did all it was asked (`false`: some files were skipped).
pub type Complete = bool;

pub use send::Patterns;
