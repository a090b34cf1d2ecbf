//! The measurement: every block timed alone with the monotonic clock, every output verified.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::algo::{Algorithm, Failure, Runner};

use crate::load::{self, Load};
use crate::plan::{Operation, Plan};
use crate::stats::Stats;

/// One cell's result: an algorithm, an operation, a block size, a pattern and a load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// As written in the plan (`zstd:3`).
    pub algorithm: String,
    /// `compress`, `decrypt`, `hash`...
    pub operation: String,
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
    /// Original over compressed bytes, for compressors.
    pub ratio: Option<f64>,
}

/// A run's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The machine.
    pub environment: crate::env::Environment,
    /// The median cost of reading the clock twice, in ns: part of every sample.
    pub timer_overhead_ns: u64,
    /// Cells in plan order.
    pub cells: Vec<Cell>,
    /// What a reader must know to trust the figures: cells whose fastest block took less than
    /// 100 times the timer's overhead (where the clock's own cost exceeds 1%), placement that
    /// cannot matter on this machine.
    pub warnings: Vec<String>,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The algorithm reported an error.
    #[error("{cell}, block {block}: {detail}")]
    Failed {
        /// Algorithm, operation, pattern and block size.
        cell: String,
        block: usize,
        detail: String,
    },
    /// An output was wrong: the algorithm is broken, and its times mean nothing.
    #[error("{cell}, block {block}: verification failed, {detail}")]
    Verify {
        /// Algorithm, operation, pattern and block size.
        cell: String,
        block: usize,
        detail: String,
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

/// Runs `make` on a thread pinned to a CPU of `node` (when given), so that the memory it
/// allocates and touches lives on that node (first touch), and returns what it made.
fn placed<T: Send>(node: Option<(usize, usize)>, make: impl FnOnce() -> T + Send) -> T {
    match node {
        None => make(),
        Some((_, cpu)) => std::thread::scope(|s| {
            let t = s.spawn(move || {
                let _ = load::pin(cpu);
                make()
            });
            match t.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }),
    }
}

/// Runs `plan`, calling `on_cell` as each cell completes.
pub fn run(plan: &Plan, on_cell: &mut dyn FnMut(&Cell)) -> Result<Report, MeasureError> {
    run_with(plan, on_cell, &mut |_, _| {})
}

/// [`run`], also calling `on_round(round, cells)` as each round starts (rounds count from 1),
/// so a caller can show progress through the rounds that report no cell yet.
pub fn run_with(
    plan: &Plan,
    on_cell: &mut dyn FnMut(&Cell),
    on_round: &mut dyn FnMut(u32, usize),
) -> Result<Report, MeasureError> {
    // Before pinning: a pinned thread sees one core.
    let cpus = load::cpus();
    let environment = crate::env::Environment::probe();
    let mut warnings = Vec::new();
    // The node and the CPU whose first touches place the measured memory.
    let node = match plan.memory_node {
        None => None,
        Some(n) => {
            let on_node = crate::numa::cpus_of(n, &cpus);
            // Placing by first touch needs a thread on the node.
            let Some(&first) = on_node.first() else {
                return Err(MeasureError::Load(format!(
                    "memory_node {n}: none of its CPUs is one this process may run on"
                )));
            };
            Some((n, on_node.iter().copied().find(|&c| Some(c) != plan.core).unwrap_or(first)))
        }
    };
    if let Some((n, _)) = node
        && crate::numa::nodes().len() == 1
    {
        warnings.push(format!(
            "memory_node {n}: this machine has one NUMA node, so placement changes nothing"
        ));
    }
    if let Some(core) = plan.core {
        load::pin(core).map_err(|e| MeasureError::Load(format!("pinning to core {core}: {e}")))?;
    }
    let overhead = timer_overhead();
    // Each block size takes a whole number of blocks from the front of one buffer per
    // pattern (a pattern's bytes do not depend on the length asked), so a file is read once.
    let longest = plan.block_sizes.iter().map(|&b| plan.cell_bytes(b)).max().unwrap_or(0);
    let mut data = Vec::with_capacity(plan.patterns.len());
    for pattern in &plan.patterns {
        data.push(
            placed(node, || pattern.generate(longest, 0x5741_4e44))
                .map_err(|source| MeasureError::Pattern { pattern: pattern.name(), source })?,
        );
    }
    let mut pending = Vec::new();
    for (pattern, all) in plan.patterns.iter().zip(&data) {
        for &block_size in &plan.block_sizes {
            let data = &all[..plan.cell_bytes(block_size)];
            for (label, alg) in &plan.algorithms {
                let ops = plan.operations.iter().filter(|op| alg.operations().contains(op));
                for (&op, load) in ops.flat_map(|op| plan.loads.iter().map(move |l| (op, l))) {
                    let spec = CellSpec {
                        algorithm: label,
                        alg,
                        operation: op,
                        pattern: pattern.name(),
                        block_size,
                        warmup: plan.warmup,
                        repetitions: plan.repetitions,
                        node: node.map_or(0, |(n, _)| n as u32),
                    };
                    pending.push((spec, load, data, Vec::new(), 0usize));
                }
            }
        }
    }
    // Rounds run the whole plan again, so a slow minute on a shared machine is spread over
    // every cell rather than landing on a few; a cell's samples are pooled over the rounds.
    let mut cells: Vec<Cell> = Vec::new();
    for round in 0..plan.rounds {
        on_round(round + 1, pending.len());
        for (spec, load, data, samples, stored) in &mut pending {
            let blocks: Vec<&[u8]> = data.chunks(spec.block_size).collect();
            let mut runner = placed(node, || spec.alg.runner(spec.operation, &blocks, spec.node))
                .map_err(|f| spec.error(0, f))?;
            let running = load::start(load, plan.core, &cpus).map_err(MeasureError::Load)?;
            if **load != Load::None {
                // Let the load reach its steady state before the first block.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let taken = spec.samples(runner.as_mut(), data);
            running.stop();
            samples.extend(taken?);
            *stored = runner.stored();
            if round + 1 < plan.rounds {
                continue;
            }
            let passes = plan.repetitions * plan.rounds;
            let mut cell = spec.cell(std::mem::take(samples), data.len(), *stored, passes);
            cell.load = load.name();
            cell.slowdown = cells
                .iter()
                .find(|c| {
                    c.load == "none"
                        && c.algorithm == cell.algorithm
                        && c.operation == cell.operation
                        && c.block_size == cell.block_size
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
    Ok(Report { environment, timer_overhead_ns: overhead, cells, warnings })
}

/// One cell to measure.
#[derive(Debug)]
pub struct CellSpec<'a> {
    pub algorithm: &'a str,
    pub alg: &'a Algorithm,
    pub operation: Operation,
    pub pattern: String,
    pub block_size: usize,
    pub warmup: u32,
    pub repetitions: u32,
    /// The NUMA node handed to plugins.
    pub node: u32,
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

    fn error(&self, block: usize, f: Failure) -> MeasureError {
        match f {
            Failure::Failed(detail) => {
                MeasureError::Failed { cell: self.describe(), block, detail }
            }
            Failure::Wrong(detail) => MeasureError::Verify { cell: self.describe(), block, detail },
        }
    }

    /// Times every block of `data` (a whole number of blocks) `warmup + repetitions` times,
    /// keeping the timed passes; verifies every output of every pass.
    pub fn measure(&self, data: &[u8]) -> Result<Cell, MeasureError> {
        let blocks: Vec<&[u8]> = data.chunks(self.block_size).collect();
        let mut runner =
            self.alg.runner(self.operation, &blocks, self.node).map_err(|f| self.error(0, f))?;
        self.measure_with(runner.as_mut(), data)
    }

    /// [`CellSpec::measure`] with a runner made beforehand (on the chosen node).
    pub fn measure_with(&self, r: &mut dyn Runner, data: &[u8]) -> Result<Cell, MeasureError> {
        let samples = self.samples(r, data)?;
        Ok(self.cell(samples, data.len(), r.stored(), self.repetitions))
    }

    /// The timed passes' samples of every block of `data`, each output verified.
    fn samples(&self, r: &mut dyn Runner, data: &[u8]) -> Result<Vec<u64>, MeasureError> {
        let blocks = data.len().div_ceil(self.block_size);
        let mut samples = Vec::with_capacity(blocks * self.repetitions as usize);
        for pass in 0..self.warmup + self.repetitions {
            for i in 0..blocks {
                r.stage(i).map_err(|f| self.error(i, f))?;
                let t = Instant::now();
                let done = r.run(i);
                let ns = t.elapsed().as_nanos() as u64;
                done.map_err(|f| self.error(i, f))?;
                r.check(i).map_err(|f| self.error(i, f))?;
                if pass >= self.warmup {
                    samples.push(ns);
                }
            }
        }
        Ok(samples)
    }

    /// The cell of `samples` taken over `passes` timed passes of `data_len` bytes, stored as
    /// `stored` bytes.
    fn cell(&self, mut samples: Vec<u64>, data_len: usize, stored: usize, passes: u32) -> Cell {
        let total_ns: u64 = samples.iter().sum();
        let bytes = data_len as f64 * f64::from(passes);
        Cell {
            algorithm: self.algorithm.to_owned(),
            operation: self.operation.name().into(),
            block_size: self.block_size,
            pattern: self.pattern.clone(),
            load: "none".into(),
            slowdown: None,
            stats: Stats::of(&mut samples),
            mb_per_s: if total_ns > 0 { bytes / total_ns as f64 * 1e3 } else { 0.0 },
            ratio: self.alg.compresses().then(|| data_len as f64 / stored.max(1) as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use qsm_codec::{Codec, CodecError, Compression, Compressor, Decompressor, LevelRange};

    /// How a test codec's decompressor goes wrong.
    #[derive(Debug, Clone, Copy)]
    enum Fault {
        /// Gets the last byte wrong: it must never produce a result.
        OffByOne,
        /// Writes nothing: on zeros, a buffer left from an earlier block (or freshly zeroed)
        /// would hold the right answer.
        Silent,
    }

    /// A codec that stores blocks as they are and decodes them wrongly.
    #[derive(Debug)]
    struct Faulty(Fault);
    struct Copy;
    struct FaultyDecoder(Fault);
    impl Codec for Faulty {
        fn id(&self) -> u16 {
            999
        }
        fn name(&self) -> &'static str {
            "faulty"
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
            Ok(Box::new(FaultyDecoder(self.0)))
        }
    }
    impl Compressor for Copy {
        fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
            dst[..src.len()].copy_from_slice(src);
            Ok(src.len())
        }
    }
    impl Decompressor for FaultyDecoder {
        fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
            if let Fault::OffByOne = self.0 {
                dst.copy_from_slice(src);
                if let Some(b) = dst.last_mut() {
                    *b ^= 1;
                }
            }
            Ok(())
        }
    }

    static OFF_BY_ONE: Faulty = Faulty(Fault::OffByOne);
    static LAZY: Faulty = Faulty(Fault::Silent);

    #[test]
    fn rounds_pool_their_samples_and_loads_get_a_slowdown() {
        let text = "algorithms = [\"lz4\", \"crc32c\"]\noperations = [\"compress\", \"hash\"]\nblock_sizes = [\"4K\"]\npatterns = [\"random\"]\nbytes_per_cell = \"16K\"\nwarmup = 0\nrepetitions = 2\nrounds = 3\nloads = [\"none\", \"cpu:1\"]\n";
        let plan = Plan::parse(text, "p.toml").unwrap();
        let (mut seen, mut rounds) = (0, Vec::new());
        let report = run_with(&plan, &mut |_| seen += 1, &mut |r, n| rounds.push((r, n))).unwrap();
        assert_eq!((report.cells.len(), seen), (4, 4), "each cell reported once");
        assert_eq!(rounds, [(1, 4), (2, 4), (3, 4)]);
        for c in &report.cells {
            assert_eq!(c.stats.samples, 4 * 2 * 3, "4 blocks, 2 passes, 3 rounds: {c:?}");
            assert_eq!(c.slowdown.is_some(), c.load != "none", "{c:?}");
            assert_eq!(c.ratio.is_some(), c.algorithm == "lz4", "{c:?}");
        }
    }

    #[test]
    fn a_decoder_that_writes_nothing_is_caught_even_on_zeros() {
        let data = crate::pattern::Pattern::Zeros.generate(16384, 1).unwrap();
        let alg =
            Algorithm::Codec(Compression { codec: &LAZY, level: 0, skip_incompressible: false });
        for op in [Operation::Compress, Operation::Decompress] {
            let e = spec(&alg, op).measure(&data).unwrap_err();
            assert!(matches!(e, MeasureError::Verify { block: 0, .. }), "{op:?}: {e}");
        }
    }

    fn spec(alg: &Algorithm, operation: Operation) -> CellSpec<'_> {
        CellSpec {
            algorithm: "x",
            alg,
            operation,
            pattern: "random".into(),
            block_size: 4096,
            warmup: 0,
            repetitions: 2,
            node: 0,
        }
    }

    #[test]
    fn a_wrong_algorithm_never_gets_a_time() {
        let data = crate::pattern::Pattern::Random.generate(16384, 1).unwrap();
        let alg = Algorithm::Codec(Compression {
            codec: &OFF_BY_ONE,
            level: 0,
            skip_incompressible: false,
        });
        for op in [Operation::Compress, Operation::Decompress] {
            let e = spec(&alg, op).measure(&data).unwrap_err();
            assert!(matches!(e, MeasureError::Verify { block: 0, .. }), "{e}");
            assert!(e.to_string().contains("verification failed"), "{e}");
        }
    }

    #[test]
    fn every_block_of_every_timed_pass_is_a_sample() {
        let data = crate::pattern::Pattern::Compressible(50).generate(16384, 1).unwrap();
        let lz4 = Algorithm::parse("lz4", std::path::Path::new(".")).unwrap();
        for op in [Operation::Compress, Operation::Decompress] {
            let cell = spec(&lz4, op).measure(&data).unwrap();
            assert_eq!(cell.stats.samples, 8, "4 blocks, 2 passes");
            assert!(cell.stats.min_ns > 0 && cell.stats.min_ns <= cell.stats.max_ns);
            let ratio = cell.ratio.unwrap();
            assert!(ratio > 1.5 && ratio < 2.5, "half zeros: {ratio}");
            assert!(cell.mb_per_s > 0.0);
        }
    }
}
