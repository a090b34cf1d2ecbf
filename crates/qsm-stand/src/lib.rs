//! `qsm stand`: measures block algorithms block by block, as the STAND paper's tool did
//! (`../shared/seeds/stand-block-algorithm-benchmark.txt`): every block is timed alone, so a
//! cell reports min, mean, percentiles and max rather than one average, and every output is
//! verified so a wrong algorithm cannot look fast.
//!
//! This first part measures the codec registry's algorithms (compress, decompress) over block
//! sizes, data patterns and emulated loads (CPU, TLB, memory) from a TOML plan. Ciphers and
//! hashes, plugins, histograms and plots come next (issue 5).

pub mod env;
pub mod load;
pub mod measure;
pub mod pattern;
pub mod plan;
pub mod stats;

pub use measure::{Cell, run};
pub use plan::{Plan, PlanError};
pub use stats::Stats;
