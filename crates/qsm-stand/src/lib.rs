//! `qsm stand`: measures block algorithms block by block, as the STAND paper's tool did
//! (`../shared/seeds/stand-block-algorithm-benchmark.txt`): every block is timed alone, so a
//! cell reports min, mean, percentiles and max rather than one average, and every output is
//! verified so a wrong algorithm cannot look fast.
//!
//! A TOML plan names algorithms (codecs, ciphers, hashes, plugins), operations, block sizes,
//! data patterns and emulated loads (CPU, TLB, memory); [`run`] measures every cell and
//! returns a [`Report`](measure::Report) that [`plot`] draws and [`compare`] diffs.

pub mod algo;
pub mod compare;
pub mod env;
pub mod load;
pub mod measure;
pub mod numa;
pub mod pattern;
pub mod plan;
pub mod plot;
pub mod plugin;
pub mod stats;
pub mod table;

pub use measure::{Cell, run};
pub use plan::{Plan, PlanError};
pub use stats::Stats;
