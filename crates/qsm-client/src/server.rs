//! What the client needs of a server: the node interface of `qsm-types`, which the embedded
//! server (the server core opened in this process) and [`crate::remote::RemoteServer`] both
//! implement. The client never opens a catalog or a pool itself.

pub use qsm_types::node::*;
