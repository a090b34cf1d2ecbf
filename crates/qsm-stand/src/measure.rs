//! The measurement: every block timed alone with the monotonic clock, every output verified.

use std::time::Instant;

use qsm_codec::{Codec, CodecError};
use serde::Serialize;

use crate::load::{self, Load};
use crate::plan::{Operation, Plan};
use crate::stats::Stats;

/// One cell's result: an algorithm, an operation, a block size and a pattern.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// As written in the plan (`zstd:3`).
    pub algorithm: String,
    /// `compress` or `decompress`.
    pub operation: &'static str,
    /// Bytes per block.
    pub block_size: usize,
    /// Pattern name.
    pub pattern: String,
    /// Load scenario.
    pub load: String,
    /// Mean time per block over the same cell's with no load, when that was measured.
    pub slowdown: Option<f64>,
    /// Per-block times.
    pub stats: Stats,
    /// Original bytes per second of block time, in MB/s (10^6).
    pub mb_per_s: f64,
    /// Original over compressed bytes.
    pub ratio: f64,
}

/// A run's results.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine.
    pub environment: crate::env::Environment,
    /// The median cost of reading the clock twice, in ns: part of every sample.
    pub timer_overhead_ns: u64,
    /// Cells in plan order.
    pub cells: Vec<Cell>,
    /// Cells whose fastest block took less than 100 times the timer's overhead, where the
    /// clock's own cost exceeds 1% of the measurement.
    pub warnings: Vec<String>,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The algorithm failed.
    #[error("{cell}, block {block}: {source}")]
    Codec {
        /// Algorithm, operation, pattern and block size.
        cell: String,
        block: usize,
        source: CodecError,
    },
    /// An output did not decode back to its input: the algorithm is wrong, and its times
    /// mean nothing.
    #[error("{cell}, block {block}: verification failed, the output does not give back the input")]
    Verify {
        /// Algorithm, operation, pattern and block size.
        cell: String,
        block: usize,
    },
    /// A load could not be started, or the measuring thread not pinned.
    #[error("{0}")]
    Load(String),
    /// A pattern's data could not be read.
    #[error("pattern {pattern}: {source}")]
    Pattern { pattern: String, source: std::io::Error },
}

/// The median cost, in ns, of two consecutive clock reads.
pub fn timer_overhead() -> u64 {
    let mut samples: Vec<u64> = (0..10_001)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    Stats::of(&mut samples).p50_ns
}

/// Runs `plan`, calling `on_cell` as each cell completes.
pub fn run(plan: &Plan, on_cell: &mut dyn FnMut(&Cell)) -> Result<Report, MeasureError> {
    let cpus = load::cpus();
    if let Some(core) = plan.core {
        load::pin(core).map_err(|e| MeasureError::Load(format!("pinning to core {core}: {e}")))?;
    }
    let overhead = timer_overhead();
    let mut cells = Vec::new();
    let mut warnings = Vec::new();
    // Each block size takes a whole number of blocks from the front of one buffer per
    // pattern (a pattern's bytes do not depend on the length asked), so a file is read once.
    let longest = plan.block_sizes.iter().map(|&b| plan.bytes_per_cell.max(b)).max().unwrap_or(0);
    for pattern in &plan.patterns {
        let all = pattern
            .generate(longest, 0x5741_4e44)
            .map_err(|source| MeasureError::Pattern { pattern: pattern.name(), source })?;
        for &block_size in &plan.block_sizes {
            let data = &all[..plan.bytes_per_cell.max(block_size) / block_size * block_size];
            for (label, setting) in &plan.algorithms {
                for (&op, load) in
                    plan.operations.iter().flat_map(|op| plan.loads.iter().map(move |l| (op, l)))
                {
                    let running =
                        load::start(load, plan.core, &cpus).map_err(MeasureError::Load)?;
                    if *load != Load::None {
                        // Let the load reach its steady state before the first block.
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    let cell = CellSpec {
                        algorithm: label,
                        codec: setting.codec,
                        level: setting.level,
                        operation: op,
                        pattern: pattern.name(),
                        block_size,
                        warmup: plan.warmup,
                        repetitions: plan.repetitions,
                    }
                    .measure(data);
                    running.stop();
                    let mut cell = cell?;
                    cell.load = load.name();
                    cell.slowdown = cells
                        .iter()
                        .find(|c: &&Cell| {
                            c.load == "none"
                                && (c.algorithm.as_str(), c.operation, c.block_size)
                                    == (cell.algorithm.as_str(), cell.operation, cell.block_size)
                                && c.pattern == cell.pattern
                        })
                        .filter(|base| base.stats.mean_ns > 0.0)
                        .map(|base| cell.stats.mean_ns / base.stats.mean_ns);
                    if (cell.stats.min_ns as f64) < 100.0 * overhead as f64 {
                        warnings.push(format!(
                            "{} {} {} B {}: fastest block {} ns, under 100 times the timer's {} ns",
                            cell.algorithm,
                            cell.operation,
                            cell.block_size,
                            cell.pattern,
                            cell.stats.min_ns,
                            overhead
                        ));
                    }
                    on_cell(&cell);
                    cells.push(cell);
                }
            }
        }
    }
    Ok(Report {
        environment: crate::env::Environment::probe(),
        timer_overhead_ns: overhead,
        cells,
        warnings,
    })
}

/// One cell to measure, on any codec (tests pass a broken one to prove verification).
#[derive(Debug)]
pub struct CellSpec<'a> {
    pub algorithm: &'a str,
    pub codec: &'a dyn Codec,
    pub level: i32,
    pub operation: Operation,
    pub pattern: String,
    pub block_size: usize,
    pub warmup: u32,
    pub repetitions: u32,
}

impl CellSpec<'_> {
    fn describe(&self) -> String {
        format!(
            "{} {} ({}, {}-byte blocks)",
            self.algorithm,
            self.operation.name(),
            self.pattern,
            self.block_size
        )
    }

    fn fail(&self, block: usize, source: CodecError) -> MeasureError {
        MeasureError::Codec { cell: self.describe(), block, source }
    }

    fn wrong(&self, block: usize) -> MeasureError {
        MeasureError::Verify { cell: self.describe(), block }
    }

    /// Times every block of `data` (a whole number of blocks) `warmup + repetitions` times,
    /// keeping the timed passes; verifies every output of every pass.
    pub fn measure(&self, data: &[u8]) -> Result<Cell, MeasureError> {
        let codec = self.codec;
        let mut c = codec.compressor(self.level).map_err(|e| self.fail(0, e))?;
        let mut d = codec.decompressor().map_err(|e| self.fail(0, e))?;
        let blocks: Vec<&[u8]> = data.chunks(self.block_size).collect();
        let mut packed_buf = vec![0u8; codec.max_compressed_len(self.block_size)];
        let mut raw_buf = vec![0u8; self.block_size];
        // Compressed forms, for decompression and for the ratio (untimed).
        let mut packed: Vec<Vec<u8>> = Vec::with_capacity(blocks.len());
        for (i, block) in blocks.iter().enumerate() {
            let n = c.compress(block, &mut packed_buf).map_err(|e| self.fail(i, e))?;
            packed.push(packed_buf[..n].to_vec());
        }
        let mut samples = Vec::with_capacity(blocks.len() * self.repetitions as usize);
        for pass in 0..self.warmup + self.repetitions {
            for (i, block) in blocks.iter().enumerate() {
                let raw = &mut raw_buf[..block.len()];
                let ns = match self.operation {
                    Operation::Compress => {
                        let t = Instant::now();
                        let n = c.compress(block, &mut packed_buf).map_err(|e| self.fail(i, e))?;
                        let ns = t.elapsed().as_nanos() as u64;
                        d.decompress(&packed_buf[..n], raw).map_err(|_| self.wrong(i))?;
                        ns
                    }
                    Operation::Decompress => {
                        let t = Instant::now();
                        d.decompress(&packed[i], raw).map_err(|e| self.fail(i, e))?;
                        t.elapsed().as_nanos() as u64
                    }
                };
                if raw != *block {
                    return Err(self.wrong(i));
                }
                if pass >= self.warmup {
                    samples.push(ns);
                }
            }
        }
        let total_ns: u64 = samples.iter().sum();
        let bytes = data.len() as f64 * f64::from(self.repetitions);
        let stored: usize = packed.iter().map(Vec::len).sum();
        Ok(Cell {
            algorithm: self.algorithm.to_owned(),
            operation: self.operation.name(),
            block_size: self.block_size,
            pattern: self.pattern.clone(),
            load: "none".into(),
            slowdown: None,
            stats: Stats::of(&mut samples),
            mb_per_s: if total_ns > 0 { bytes / total_ns as f64 * 1e3 } else { 0.0 },
            ratio: data.len() as f64 / stored.max(1) as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use qsm_codec::{Compressor, Decompressor, LevelRange};

    /// A codec whose decompressor gets one byte wrong: it must never produce a result.
    #[derive(Debug)]
    struct OffByOne;
    struct Copy;
    struct BadCopy;
    impl Codec for OffByOne {
        fn id(&self) -> u16 {
            999
        }
        fn name(&self) -> &'static str {
            "off-by-one"
        }
        fn levels(&self) -> LevelRange {
            LevelRange::NONE
        }
        fn max_compressed_len(&self, raw_len: usize) -> usize {
            raw_len
        }
        fn compressor(&self, _: i32) -> Result<Box<dyn Compressor>, CodecError> {
            Ok(Box::new(Copy))
        }
        fn decompressor(&self) -> Result<Box<dyn Decompressor>, CodecError> {
            Ok(Box::new(BadCopy))
        }
    }
    impl Compressor for Copy {
        fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
            dst[..src.len()].copy_from_slice(src);
            Ok(src.len())
        }
    }
    impl Decompressor for BadCopy {
        fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
            dst.copy_from_slice(src);
            if let Some(b) = dst.last_mut() {
                *b ^= 1;
            }
            Ok(())
        }
    }

    fn spec(codec: &dyn Codec, operation: Operation) -> CellSpec<'_> {
        CellSpec {
            algorithm: "x",
            codec,
            level: codec.levels().default,
            operation,
            pattern: "random".into(),
            block_size: 4096,
            warmup: 0,
            repetitions: 2,
        }
    }

    #[test]
    fn a_wrong_algorithm_never_gets_a_time() {
        let data = crate::pattern::Pattern::Random.generate(16384, 1).unwrap();
        for op in [Operation::Compress, Operation::Decompress] {
            let e = spec(&OffByOne, op).measure(&data).unwrap_err();
            assert!(matches!(e, MeasureError::Verify { block: 0, .. }), "{e}");
            assert!(e.to_string().contains("verification failed"), "{e}");
        }
    }

    #[test]
    fn every_block_of_every_timed_pass_is_a_sample() {
        let data = crate::pattern::Pattern::Compressible(50).generate(16384, 1).unwrap();
        let lz4 = qsm_codec::registry::by_name("lz4").unwrap();
        for op in [Operation::Compress, Operation::Decompress] {
            let cell = spec(lz4, op).measure(&data).unwrap();
            assert_eq!(cell.stats.samples, 8, "4 blocks, 2 passes");
            assert!(cell.stats.min_ns > 0 && cell.stats.min_ns <= cell.stats.max_ns);
            assert!(cell.ratio > 1.5 && cell.ratio < 2.5, "half zeros: {}", cell.ratio);
            assert!(cell.mb_per_s > 0.0);
        }
    }
}
