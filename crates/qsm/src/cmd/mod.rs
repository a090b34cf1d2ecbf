//! One module per verb: each reads its options, calls the libraries and renders their reports.

pub mod admin;
pub mod server;
