//! # qsm-types: the words every QSM crate shares
//!
//! Ids, object versions and their attributes, policy records, transaction limits ([`model`]),
//! and the node interface ([`node`]): what a client may ask of a server, whether the server
//! runs in the same process (the embedded default) or across a network. The catalog, the
//! protocol, the store, the client and the server all speak these; none of them owns them.
//!
//! Nothing here touches a disk, a database or a socket.

pub mod clientopts;
pub mod durable;
mod error;
pub mod model;
pub mod node;
pub mod time;

pub use error::{ServerError, error_chain, printable, truncate_utf8};
pub use model::*;
