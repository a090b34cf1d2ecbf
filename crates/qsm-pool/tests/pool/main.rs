//! Integration tests of qsm-pool, in one binary: the conformance suite run against
//! `DirPool`, fault injection (damaged, truncated and foreign files, a full and a read-only
//! file system), and property tests of the write/scan/read round trip.

mod common;
mod conformance;
mod faults;
mod props;
