//! Plans: what to measure. A TOML file, or [`Plan::quick`] for `qsm stand quick`.
//!
//! ```toml
//! algorithms = ["lz4", "zstd:3", "lzo", "quicklz"]
//! operations = ["compress", "decompress"]
//! block_sizes = ["4K", "16K", "64K"]
//! patterns = ["random", "zeros", "compressible:50", "file:../shared/corpus/dickens.xz"]
//! bytes_per_cell = "8M"
//! warmup = 1
//! repetitions = 3
//! ```

use std::path::PathBuf;

use qsm_codec::Compression;
use serde::Deserialize;

use crate::load::Load;
use crate::pattern::Pattern;

/// An operation on blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Compress each block.
    Compress,
    /// Decompress each block (compressed beforehand, untimed).
    Decompress,
}

impl Operation {
    /// Its name in plans and reports.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Compress => "compress",
            Operation::Decompress => "decompress",
        }
    }
}

/// A checked plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Codec settings, as written in the plan (`zstd:3`).
    pub algorithms: Vec<(String, Compression)>,
    /// Operations.
    pub operations: Vec<Operation>,
    /// Block sizes in bytes.
    pub block_sizes: Vec<usize>,
    /// Data patterns.
    pub patterns: Vec<Pattern>,
    /// Bytes of data per cell and repetition (a whole number of blocks, at least one).
    pub bytes_per_cell: usize,
    /// Untimed passes over a cell's blocks first.
    pub warmup: u32,
    /// Timed passes; every block of every pass is one sample.
    pub repetitions: u32,
    /// Load scenarios, each cell measured under every one.
    pub loads: Vec<Load>,
    /// The core the measuring thread is pinned to.
    pub core: Option<usize>,
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
    #[serde(default = "default_warmup")]
    warmup: u32,
    #[serde(default = "default_repetitions")]
    repetitions: u32,
    #[serde(default = "default_loads")]
    loads: Vec<String>,
    core: Option<usize>,
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
        let algorithms = file
            .algorithms
            .iter()
            .enumerate()
            .map(|(i, a)| {
                Compression::parse(a)
                    .map(|c| (a.clone(), Compression { skip_incompressible: false, ..c }))
                    .map_err(|e| value(format!("algorithms[{i}]"), format!("{a:?}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        let operations = file
            .operations
            .iter()
            .enumerate()
            .map(|(i, o)| match o.as_str() {
                "compress" => Ok(Operation::Compress),
                "decompress" => Ok(Operation::Decompress),
                other => Err(value(
                    format!("operations[{i}]"),
                    format!("unknown operation {other:?} (known: compress, decompress)"),
                )),
            })
            .collect::<Result<_, _>>()?;
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
        if file.repetitions == 0 {
            return Err(value("repetitions".into(), "0: at least one timed pass"));
        }
        Ok(Plan {
            algorithms,
            operations,
            block_sizes,
            patterns,
            bytes_per_cell,
            warmup: file.warmup,
            repetitions: file.repetitions,
            loads,
            core: file.core,
        })
    }

    /// `qsm stand quick`: the fast codecs and zstd over the paper's 4 to 64 KiB blocks, on
    /// random, zero and half-compressible data, 2 MiB per cell: under a minute on 2 cores.
    pub fn quick() -> Plan {
        let text = r#"
            algorithms = ["lz4", "zstd:1", "zstd:3", "lzo", "quicklz"]
            block_sizes = ["4K", "16K", "64K"]
            patterns = ["random", "zeros", "compressible:50"]
            bytes_per_cell = "2M"
            warmup = 1
            repetitions = 3
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
        assert_eq!(p.operations, [Operation::Compress, Operation::Decompress]);
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
                &format!("{base}operations = [\"encrypt\"]"),
                "operations[0]: unknown operation \"encrypt\"",
            ),
            (&format!("{base}repetitions = 0"), "repetitions"),
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
