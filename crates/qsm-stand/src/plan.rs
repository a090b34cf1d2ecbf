//! Plans: what to measure. A TOML file, or [`Plan::quick`] for `qsm stand quick`.
//!
//! ```toml
//! algorithms = ["lz4", "zstd:3", "lzo", "quicklz", "aes-256-gcm", "blake3"]
//! operations = ["compress", "decompress", "encrypt", "decrypt", "hash"]
//! block_sizes = ["4K", "16K", "64K"]
//! patterns = ["random", "zeros", "compressible:50", "recs4:../shared/corpus"]
//! bytes_per_cell = "8M"        # or iterations = 2000 (blocks per cell and repetition)
//! warmup = 1
//! repetitions = 3
//! loads = ["none", "cpu:1@other", "tlb:256", "memory:1"]
//! core = 0
//! memory_node = 0
//! ```
//!
//! Each algorithm runs the listed operations it supports (codecs compress and decompress,
//! ciphers encrypt and decrypt, hashes hash).

use std::path::PathBuf;

use serde::Deserialize;

use crate::algo::Algorithm;

use crate::load::Load;
use crate::pattern::Pattern;

/// An operation on blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Compress each block.
    Compress,
    /// Decompress each block (compressed beforehand, untimed).
    Decompress,
    /// Encrypt each block.
    Encrypt,
    /// Decrypt each block (encrypted beforehand, untimed).
    Decrypt,
    /// Hash each block.
    Hash,
}

const OPERATIONS: [Operation; 5] = [
    Operation::Compress,
    Operation::Decompress,
    Operation::Encrypt,
    Operation::Decrypt,
    Operation::Hash,
];

impl Operation {
    /// Its name in plans and reports.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Compress => "compress",
            Operation::Decompress => "decompress",
            Operation::Encrypt => "encrypt",
            Operation::Decrypt => "decrypt",
            Operation::Hash => "hash",
        }
    }
}

/// A checked plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Algorithms, each with its name as written in the plan (`zstd:3`).
    pub algorithms: Vec<(String, Algorithm)>,
    /// Operations.
    pub operations: Vec<Operation>,
    /// Block sizes in bytes.
    pub block_sizes: Vec<usize>,
    /// Data patterns.
    pub patterns: Vec<Pattern>,
    /// Bytes of data per cell and repetition (a whole number of blocks, at least one).
    pub bytes_per_cell: usize,
    /// Blocks per cell and repetition, whatever their size, instead of `bytes_per_cell`.
    pub iterations: Option<usize>,
    /// Untimed passes over a cell's blocks first.
    pub warmup: u32,
    /// Timed passes; every block of every pass is one sample.
    pub repetitions: u32,
    /// Times the whole plan is run, each cell's samples pooled over them.
    pub rounds: u32,
    /// Load scenarios, each cell measured under every one.
    pub loads: Vec<Load>,
    /// The core the measuring thread is pinned to.
    pub core: Option<usize>,
    /// The NUMA node whose memory holds the measured algorithm's data and buffers.
    pub memory_node: Option<usize>,
}

/// A plan that cannot be run, naming the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file is not valid TOML or has unknown or mistyped fields.
    #[error("plan {path}: {detail}")]
    Syntax {
        /// The plan file.
        path: String,
        /// What the parser said.
        detail: String,
    },
    /// A field holds a value that cannot be used.
    #[error("plan field {field}: {detail}")]
    Value {
        /// `block_sizes[2]` and the like.
        field: String,
        /// Why.
        detail: String,
    },
}

/// The most data one cell may hold.
pub const MAX_CELL: usize = 1 << 30;

/// The most passes over a cell's blocks a plan may ask for, untimed or timed: far past what a
/// measurement needs, and small enough that passes times rounds cannot overflow.
pub const MAX_PASSES: u32 = 10_000;
/// The most rounds a plan may ask for.
pub const MAX_ROUNDS: u32 = 1_000;
/// The most timed samples one cell may keep (8 bytes each): a plan asking for more would run
/// out of memory instead of measuring.
pub const MAX_SAMPLES: u64 = 1 << 26;

/// The smallest and largest block a plan may ask for.
pub const MIN_BLOCK: usize = 64;
/// The frame format's largest quantum.
pub const MAX_BLOCK: usize = 16 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    algorithms: Vec<String>,
    #[serde(default = "default_operations")]
    operations: Vec<String>,
    block_sizes: Vec<String>,
    patterns: Vec<String>,
    #[serde(default = "default_bytes")]
    bytes_per_cell: String,
    iterations: Option<usize>,
    #[serde(default = "default_warmup")]
    warmup: u32,
    #[serde(default = "default_repetitions")]
    repetitions: u32,
    #[serde(default = "default_rounds")]
    rounds: u32,
    #[serde(default = "default_loads")]
    loads: Vec<String>,
    core: Option<usize>,
    memory_node: Option<usize>,
}

fn default_loads() -> Vec<String> {
    vec!["none".into()]
}

fn default_operations() -> Vec<String> {
    vec!["compress".into(), "decompress".into()]
}
fn default_bytes() -> String {
    "4M".into()
}
fn default_warmup() -> u32 {
    1
}
fn default_repetitions() -> u32 {
    3
}
fn default_rounds() -> u32 {
    1
}

fn value(field: String, detail: impl Into<String>) -> PlanError {
    PlanError::Value { field, detail: detail.into() }
}

/// Parses `4096`, `64K`, `1M` (binary units).
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (digits, shift) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 10),
        Some('m') => (&t[..t.len() - 1], 20),
        _ => (t, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

impl Plan {
    /// Parses and checks a plan; `path` is for messages, and relative `file:` patterns are
    /// read relative to the directory holding the plan.
    pub fn parse(text: &str, path: &str) -> Result<Plan, PlanError> {
        let file: PlanFile = toml::from_str(text)
            .map_err(|e| PlanError::Syntax { path: path.into(), detail: e.to_string() })?;
        let base = PathBuf::from(path).parent().map(PathBuf::from).unwrap_or_default();
        if file.algorithms.is_empty() {
            return Err(value("algorithms".into(), "empty: name at least one"));
        }
        let algorithms: Vec<(String, Algorithm)> = file
            .algorithms
            .iter()
            .enumerate()
            .map(|(i, a)| {
                Algorithm::parse(a, &base)
                    .map(|alg| (a.clone(), alg))
                    .map_err(|e| value(format!("algorithms[{i}]"), e))
            })
            .collect::<Result<_, _>>()?;
        let operations: Vec<Operation> = file
            .operations
            .iter()
            .enumerate()
            .map(|(i, o)| {
                OPERATIONS.into_iter().find(|op| op.name() == o).ok_or_else(|| {
                    value(
                        format!("operations[{i}]"),
                        format!(
                            "unknown operation {o:?} (known: {})",
                            OPERATIONS.map(Operation::name).join(", ")
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        // Every algorithm must be measured by something, and every operation measure something:
        // a plan that silently drops half of itself would mislead.
        for (i, (name, alg)) in algorithms.iter().enumerate() {
            if !alg.operations().iter().any(|op| operations.contains(op)) {
                return Err(value(
                    format!("algorithms[{i}]"),
                    format!(
                        "{name:?} supports {}, and operations lists none of them",
                        alg.operations().iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        for (i, op) in operations.iter().enumerate() {
            if !algorithms.iter().any(|(_, a)| a.operations().contains(op)) {
                return Err(value(
                    format!("operations[{i}]"),
                    format!("no algorithm of the plan can {}", op.name()),
                ));
            }
        }
        let block_sizes = file
            .block_sizes
            .iter()
            .enumerate()
            .map(|(i, b)| match parse_size(b) {
                Some(n) if (MIN_BLOCK..=MAX_BLOCK).contains(&n) => Ok(n),
                _ => Err(value(
                    format!("block_sizes[{i}]"),
                    format!("{b:?} is not a block size from {MIN_BLOCK} bytes to 16M"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if block_sizes.is_empty() {
            return Err(value("block_sizes".into(), "empty: name at least one"));
        }
        let patterns = file
            .patterns
            .iter()
            .enumerate()
            .map(|(i, p)| Pattern::parse(p, &base).map_err(|e| value(format!("patterns[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        if patterns.is_empty() {
            return Err(value("patterns".into(), "empty: name at least one"));
        }
        let bytes_per_cell = parse_size(&file.bytes_per_cell)
            .filter(|&n| n > 0 && n <= 1 << 30)
            .ok_or_else(|| {
                value(
                    "bytes_per_cell".into(),
                    format!("{:?} is not a size from 1 byte to 1G", file.bytes_per_cell),
                )
            })?;
        let loads = file
            .loads
            .iter()
            .enumerate()
            .map(|(i, l)| Load::parse(l).map_err(|e| value(format!("loads[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;
        if loads.is_empty() {
            return Err(value("loads".into(), "empty: name at least one (none for no load)"));
        }
        if let Some(core) = file.core {
            let cpus = crate::load::cpus();
            if !cpus.contains(&core) {
                return Err(value(
                    "core".into(),
                    format!("{core}: this machine has cores {cpus:?}"),
                ));
            }
        }
        if let Some(node) = file.memory_node {
            let nodes = crate::numa::nodes();
            if !nodes.iter().any(|n| n.id == node) {
                return Err(value(
                    "memory_node".into(),
                    format!(
                        "{node}: this machine has NUMA node{} {:?}",
                        if nodes.len() == 1 { "" } else { "s" },
                        nodes.iter().map(|n| n.id).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        match file.iterations {
            Some(0) => return Err(value("iterations".into(), "0: at least one block")),
            Some(n) => {
                let largest = block_sizes.iter().copied().max().unwrap_or(0);
                if n.saturating_mul(largest) > MAX_CELL {
                    return Err(value(
                        "iterations".into(),
                        format!("{n} blocks of {largest} bytes exceed the 1G a cell may hold"),
                    ));
                }
            }
            None => {}
        }
        if file.rounds == 0 {
            return Err(value("rounds".into(), "0: at least one round"));
        }
        if file.repetitions == 0 {
            return Err(value("repetitions".into(), "0: at least one timed pass"));
        }
        for (field, n, max, unit) in [
            ("rounds", file.rounds, MAX_ROUNDS, "rounds"),
            ("repetitions", file.repetitions, MAX_PASSES, "timed passes"),
            ("warmup", file.warmup, MAX_PASSES, "untimed passes"),
        ] {
            if n > max {
                return Err(value(field.into(), format!("{n}: at most {max} {unit}")));
            }
        }
        // The smallest block makes the most samples.
        let smallest = block_sizes.iter().copied().min().unwrap_or(MIN_BLOCK);
        let blocks = match file.iterations {
            Some(n) => n,
            None => bytes_per_cell.max(smallest) / smallest,
        } as u64;
        let samples = blocks.saturating_mul(u64::from(file.repetitions));
        if samples > MAX_SAMPLES {
            return Err(value(
                "repetitions".into(),
                format!(
                    "{} timed passes over {blocks} blocks of {smallest} bytes are {samples} samples, \
                     more than the {MAX_SAMPLES} a cell may keep",
                    file.repetitions
                ),
            ));
        }
        Ok(Plan {
            algorithms,
            operations,
            block_sizes,
            patterns,
            bytes_per_cell,
            warmup: file.warmup,
            repetitions: file.repetitions,
            rounds: file.rounds,
            loads,
            core: file.core,
            iterations: file.iterations,
            memory_node: file.memory_node,
        })
    }

    /// The bytes one cell of `block_size` measures per repetition: `iterations` blocks, or
    /// the whole blocks of `bytes_per_cell` (one at least).
    pub fn cell_bytes(&self, block_size: usize) -> usize {
        match self.iterations {
            Some(n) => n * block_size,
            None => self.bytes_per_cell.max(block_size) / block_size * block_size,
        }
    }

    /// `qsm stand quick`: the fast codecs and zstd, the AEAD ciphers and two hashes, over the
    /// paper's 4 to 64 KiB blocks, on random, zero and half-compressible data. 512 blocks per
    /// cell and pass whatever their size, two timed passes: 1,024 readings per cell timed
    /// block by block, enough for a p99.9 even at 64 KiB (cells too fast to time alone get
    /// fewer readings, of batches, and only the percentiles those hold).
    pub fn quick() -> Plan {
        let text = r#"
            algorithms = ["lz4", "zstd:1", "zstd:3", "lzo", "quicklz", "aes-256-gcm",
                          "chacha20-poly1305", "crc32c", "blake3"]
            operations = ["compress", "decompress", "encrypt", "decrypt", "hash"]
            block_sizes = ["4K", "16K", "64K"]
            patterns = ["random", "zeros", "compressible:50"]
            iterations = 256
            warmup = 1
            repetitions = 2
            rounds = 2
        "#;
        // The text above is fixed and valid; a test parses it.
        Plan::parse(text, "quick").unwrap_or_else(|e| unreachable!("built-in plan: {e}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_quick_plan_is_valid() {
        let p = Plan::quick();
        assert_eq!(p.block_sizes, [4096, 16384, 65536]);
        assert_eq!(p.operations, OPERATIONS);
        assert_eq!(p.algorithms.len(), 9);
        // Readings of a cell timed block by block: enough for its p99.9 at every block size.
        let readings = p.iterations.unwrap() as u64 * u64::from(p.repetitions * p.rounds);
        assert!(crate::stats::enough_for(readings as usize, 0.999), "{readings}");
    }

    #[test]
    fn bad_plans_name_the_field_and_the_value() {
        let base = "algorithms = [\"lz4\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]\n";
        let cases = [
            (
                "algorithms = [\"lz4\", \"brotli\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]",
                "algorithms[1]: \"brotli\"",
            ),
            (
                "algorithms = [\"zstd:99\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]",
                "algorithms[0]: \"zstd:99\"",
            ),
            (
                "algorithms = [\"lz4\"]\nblock_sizes = [\"4K\", \"0\"]\npatterns = [\"random\"]",
                "block_sizes[1]: \"0\" is not a block size",
            ),
            (
                "algorithms = [\"lz4\"]\nblock_sizes = [\"32M\"]\npatterns = [\"random\"]",
                "block_sizes[0]: \"32M\"",
            ),
            (
                "algorithms = [\"lz4\"]\nblock_sizes = [\"4K\"]\npatterns = [\"purple\"]",
                "patterns[0]: unknown pattern \"purple\"",
            ),
            (
                "algorithms = [\"lz4\"]\nblock_sizes = [\"4K\"]\npatterns = [\"compressible:101\"]",
                "patterns[0]",
            ),
            (
                "algorithms = [\"lz4\"]\nblock_sizes = [\"4K\"]\npatterns = [\"file:/nonexistent/x\"]",
                "/nonexistent/x",
            ),
            (
                &format!("{base}operations = [\"sing\"]"),
                "operations[0]: unknown operation \"sing\"",
            ),
            (
                &format!("{base}operations = [\"encrypt\"]"),
                "algorithms[0]: \"lz4\" supports compress, decompress",
            ),
            (
                "algorithms = [\"lz4\", \"blake3\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]\noperations = [\"compress\", \"hash\", \"decrypt\"]",
                "operations[2]: no algorithm of the plan can decrypt",
            ),
            (&format!("{base}memory_node = 4096"), "memory_node: 4096"),
            (&format!("{base}iterations = 0"), "iterations: 0"),
            (&format!("{base}iterations = 1000000"), "exceed the 1G"),
            (
                "algorithms = [\"plugin:/nonexistent/libx.so\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]",
                "algorithms[0]: plugin /nonexistent/libx.so: no such file",
            ),
            (&format!("{base}repetitions = 0"), "repetitions"),
            (&format!("{base}rounds = 0"), "rounds: 0"),
            (&format!("{base}repetitions = 4000000000"), "at most 10000 timed passes"),
            (&format!("{base}warmup = 4000000000"), "at most 10000 untimed passes"),
            (
                "algorithms = [\"lz4\"]\nblock_sizes = [\"64\"]\npatterns = [\"random\"]\nbytes_per_cell = \"1024M\"\nrepetitions = 10",
                "more than the 67108864 a cell may keep",
            ),
            (&format!("{base}colour = 1"), "unknown field `colour`"),
            (&format!("{base}loads = [\"none\", \"disk:1\"]"), "loads[1]: unknown load \"disk:1\""),
            (&format!("{base}core = 4096"), "core: 4096"),
        ];
        for (text, expected) in cases {
            let e = Plan::parse(text, "p.toml").unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
        }
        assert!(Plan::parse(base, "p.toml").is_ok());
    }
}
