//! The measurement: every block timed alone with the monotonic clock, or, when a block is too
//! fast for the clock to time alone, in batches of consecutive blocks just large enough for
//! the clock's cost to fall under 1% of a reading; every output verified.

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
    /// Per-block times: one sample per reading of the clock, divided by `blocks_per_reading`.
    pub stats: Stats,
    /// Blocks timed by one reading of the clock: 1, or the batch size of blocks too fast to
    /// time alone ([`batch_size`]). Reports written before batching existed lack it: 1.
    #[serde(default = "one")]
    pub blocks_per_reading: usize,
    /// Original bytes per second of block time, in MB/s (10^6).
    pub mb_per_s: f64,
    /// Original over compressed bytes, for compressors.
    pub ratio: Option<f64>,
}

fn one() -> usize {
    1
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
    /// What a reader must know to trust the figures: placement that cannot matter on this
    /// machine. (Cells too fast for the clock are batched, and [`Report::batching`] says so.)
    pub warnings: Vec<String>,
}

/// How many times the timer's overhead a reading must reach: 100 keeps the clock's own cost
/// under 1% of what is measured.
pub const OVERHEAD_FACTOR: u64 = 100;

/// The most blocks one reading may time. Each block of a batch has its own runner, and a
/// runner holds an algorithm's state and buffers (a zstd context, a plugin's 16 MiB pool):
/// 64 of them stay within memory, and with a clock of 20-40 ns reach the 100x line for any
/// block slower than 30-60 ns, which only the fastest hashes on the smallest blocks are not.
pub const MAX_BATCH: usize = 64;

/// The blocks per reading of a cell whose fastest single-block reading took `fastest_ns`
/// (clock included), with a timer overhead of `overhead_ns`: 1 when that reading reaches
/// [`OVERHEAD_FACTOR`] times the overhead, else the fewest consecutive blocks whose reading
/// would (each block costing `fastest_ns - overhead_ns`, the clock paid once per reading),
/// but never more than the cell's `blocks` nor [`MAX_BATCH`]. The fastest reading, not the
/// median, so that the batch is large enough for the fastest blocks too.
pub fn batch_size(fastest_ns: u64, overhead_ns: u64, blocks: usize) -> usize {
    let target = OVERHEAD_FACTOR.saturating_mul(overhead_ns);
    if fastest_ns >= target {
        return 1;
    }
    let per_block = fastest_ns.saturating_sub(overhead_ns).max(1);
    let needed = (target - overhead_ns).div_ceil(per_block);
    usize::try_from(needed).unwrap_or(usize::MAX).clamp(1, blocks.clamp(1, MAX_BATCH))
}

impl Report {
    /// The one line that says which cells were timed in batches and how large, or `None` when
    /// every block was timed alone; also the cells whose median reading is still under the
    /// 100× line (a cell with fewer blocks than a batch needs, or needing more than
    /// [`MAX_BATCH`]). The median, not the fastest:
    /// a cell calibrated just above the line may see one faster reading later, which says
    /// nothing about its figures.
    pub fn batching(&self) -> Option<String> {
        let batched: Vec<&Cell> = self.cells.iter().filter(|c| c.blocks_per_reading > 1).collect();
        let short = self
            .cells
            .iter()
            .filter(|c| {
                (c.stats.p50_ns as f64) * (c.blocks_per_reading as f64)
                    < (OVERHEAD_FACTOR * self.timer_overhead_ns) as f64
            })
            .count();
        if batched.is_empty() && short == 0 {
            return None;
        }
        let mut parts = Vec::new();
        if let (Some(lo), Some(hi)) = (
            batched.iter().map(|c| c.blocks_per_reading).min(),
            batched.iter().map(|c| c.blocks_per_reading).max(),
        ) {
            let range = if lo == hi { hi.to_string() } else { format!("{lo} to {hi}") };
            parts.push(format!(
                "{} of {} cells too fast to time block by block were timed in batches of {range} consecutive blocks per reading (column \"blk/rd\"), keeping the timer's {} ns under 1% of a reading; their percentiles are of batches",
                batched.len(),
                self.cells.len(),
                self.timer_overhead_ns
            ));
        }
        if short > 0 {
            parts.push(format!(
                "{short} cells' median reading is still under {OVERHEAD_FACTOR} times the timer's {} ns (fewer blocks in the cell than a batch needs, or more than {MAX_BATCH} needed)",
                self.timer_overhead_ns
            ));
        }
        Some(parts.join("; "))
    }
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
                    pending.push((spec, load, data, Vec::new(), 0usize, 0usize));
                }
            }
        }
    }
    // Rounds run the whole plan again, so a slow minute on a shared machine is spread over
    // every cell rather than landing on a few; a cell's samples are pooled over the rounds.
    let mut cells: Vec<Cell> = Vec::new();
    for round in 0..plan.rounds {
        on_round(round + 1, pending.len());
        for (spec, load, data, samples, stored, batch) in &mut pending {
            let running = load::start(load, plan.core, &cpus).map_err(MeasureError::Load)?;
            if **load != Load::None {
                // Let the load reach its steady state before the first block.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            // The batch is chosen once, under the cell's load, and kept over the rounds:
            // pooled samples must all be readings of the same number of blocks.
            let taken = (|| -> Result<(Vec<u64>, usize), MeasureError> {
                if *batch == 0 {
                    *batch = spec.calibrate(data, overhead, node)?;
                }
                let mut lanes = spec.lanes(data, *batch, node)?;
                let taken = spec.samples(&mut lanes, data)?;
                Ok((taken, lanes.iter().map(|r| r.stored()).sum()))
            })();
            running.stop();
            let (taken, bytes) = taken?;
            samples.extend(taken);
            *stored = bytes;
            if round + 1 < plan.rounds {
                continue;
            }
            let passes = plan.repetitions * plan.rounds;
            let mut cell = spec.cell(std::mem::take(samples), data.len(), *stored, passes, *batch);
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
    /// keeping the timed passes, in batches when blocks are too fast to time alone; verifies
    /// every output of every pass.
    pub fn measure(&self, data: &[u8]) -> Result<Cell, MeasureError> {
        let batch = self.calibrate(data, timer_overhead(), None)?;
        let mut lanes = self.lanes(data, batch, None)?;
        let samples = self.samples(&mut lanes, data)?;
        let stored = lanes.iter().map(|r| r.stored()).sum();
        Ok(self.cell(samples, data.len(), stored, self.repetitions, batch))
    }

    /// The blocks per reading for `data` ([`batch_size`]), from one untimed-for-the-report
    /// pass that reads the clock around each block alone (up to 256 blocks: enough for a
    /// fastest reading, few enough not to lengthen the cell), outputs verified.
    fn calibrate(
        &self,
        data: &[u8],
        overhead: u64,
        node: Option<(usize, usize)>,
    ) -> Result<usize, MeasureError> {
        let blocks = data.len().div_ceil(self.block_size);
        let head = &data[..data.len().min(256 * self.block_size)];
        let mut lanes = self.lanes(head, 1, node)?;
        let mut fastest = u64::MAX;
        for r in &mut lanes {
            for i in 0..head.len().div_ceil(self.block_size) {
                r.stage(i).map_err(|f| self.error(i, f))?;
                let t = Instant::now();
                let done = r.run(i);
                let ns = t.elapsed().as_nanos() as u64;
                done.map_err(|f| self.error(i, f))?;
                r.check(i).map_err(|f| self.error(i, f))?;
                fastest = fastest.min(ns);
            }
        }
        Ok(batch_size(fastest, overhead, blocks))
    }

    /// `batch` runners ("lanes") over `data`'s blocks, lane `j` holding blocks `j`,
    /// `j + batch`, `j + 2 batch`...: each block of a batch has its own buffers, so a batch of
    /// consecutive blocks runs with nothing staged or checked between its blocks, and each
    /// output is still there to verify afterwards. Made on `node` when given.
    fn lanes<'d>(
        &self,
        data: &'d [u8],
        batch: usize,
        node: Option<(usize, usize)>,
    ) -> Result<Vec<Box<dyn Runner + 'd>>, MeasureError> {
        let blocks: Vec<&[u8]> = data.chunks(self.block_size).collect();
        (0..batch.max(1))
            .map(|j| {
                let mine: Vec<&[u8]> =
                    blocks.iter().skip(j).step_by(batch.max(1)).copied().collect();
                placed(node, || self.alg.runner(self.operation, &mine, self.node))
                    .map_err(|f| self.error(j, f))
            })
            .collect()
    }

    /// The timed passes' samples over `data`, one per reading of the clock around a batch of
    /// `lanes.len()` consecutive blocks (block `b * batch + j` is lane `j`'s block `b`), as
    /// time per block; every output verified. Blocks left over after the last whole batch
    /// are run and verified untimed: a shorter batch would fall under the 100× line.
    fn samples(
        &self,
        lanes: &mut [Box<dyn Runner + '_>],
        data: &[u8],
    ) -> Result<Vec<u64>, MeasureError> {
        let blocks = data.len().div_ceil(self.block_size);
        let batch = lanes.len().max(1);
        let batches = blocks / batch;
        let mut samples = Vec::with_capacity(batches * self.repetitions as usize);
        for pass in 0..self.warmup + self.repetitions {
            for b in 0..batches {
                for (j, r) in lanes.iter_mut().enumerate() {
                    r.stage(b).map_err(|f| self.error(b * batch + j, f))?;
                }
                let mut failed = None;
                let t = Instant::now();
                for (j, r) in lanes.iter_mut().enumerate() {
                    if let Err(f) = r.run(b) {
                        failed = Some((j, f));
                        break;
                    }
                }
                let ns = t.elapsed().as_nanos() as u64;
                if let Some((j, f)) = failed {
                    return Err(self.error(b * batch + j, f));
                }
                for (j, r) in lanes.iter_mut().enumerate() {
                    r.check(b).map_err(|f| self.error(b * batch + j, f))?;
                }
                if pass >= self.warmup {
                    // Rounded to the nearest ns per block.
                    samples.push((ns + batch as u64 / 2) / batch as u64);
                }
            }
            for i in batches * batch..blocks {
                let (r, b) = (&mut lanes[i % batch], i / batch);
                r.stage(b).map_err(|f| self.error(i, f))?;
                r.run(b).map_err(|f| self.error(i, f))?;
                r.check(b).map_err(|f| self.error(i, f))?;
            }
        }
        Ok(samples)
    }

    /// The cell of `samples` (readings of `batch` blocks each, as time per block) taken over
    /// `passes` timed passes of `data_len` bytes, stored as `stored` bytes.
    fn cell(
        &self,
        mut samples: Vec<u64>,
        data_len: usize,
        stored: usize,
        passes: u32,
        batch: usize,
    ) -> Cell {
        let batch = batch.max(1);
        // Samples are per block: a reading is `batch` of them.
        let total_ns = samples.iter().sum::<u64>().saturating_mul(batch as u64);
        // The bytes timed: blocks left over after the last whole batch are not.
        let timed =
            (data_len.div_ceil(self.block_size) / batch * batch * self.block_size).min(data_len);
        let bytes = timed as f64 * f64::from(passes);
        Cell {
            algorithm: self.algorithm.to_owned(),
            operation: self.operation.name().into(),
            block_size: self.block_size,
            pattern: self.pattern.clone(),
            load: "none".into(),
            slowdown: None,
            stats: Stats::of(&mut samples),
            blocks_per_reading: batch,
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

    /// A codec that stores blocks as they are, correctly: a copy of 2 KiB takes tens of ns,
    /// far too fast for one reading of the clock.
    #[derive(Debug)]
    struct Stored;
    struct Unstore;
    impl Codec for Stored {
        fn id(&self) -> u16 {
            998
        }
        fn name(&self) -> &'static str {
            "stored"
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
            Ok(Box::new(Unstore))
        }
    }
    impl Decompressor for Unstore {
        fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
            dst.copy_from_slice(src);
            Ok(())
        }
    }

    static STORED: Stored = Stored;
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
            let per = c.blocks_per_reading;
            assert_eq!(c.stats.samples, 4 / per * 2 * 3, "4 blocks, 2 passes, 3 rounds: {c:?}");
            assert_eq!(c.slowdown.is_some(), c.load != "none", "{c:?}");
            assert_eq!(c.ratio.is_some(), c.algorithm == "lz4", "{c:?}");
        }
    }

    #[test]
    fn the_batch_is_the_fewest_blocks_that_reach_100_times_the_timer() {
        // Fast enough alone, exactly on the line, and far under it.
        assert_eq!(batch_size(5000, 20, 1000), 1);
        assert_eq!(batch_size(2000, 20, 1000), 1);
        // 40 ns a block beyond the clock's 20: 49.5 blocks and one clock reach 2,000 ns, so 50.
        assert_eq!(batch_size(60, 20, 1000), 50);
        // 200 ns a block: 9.9 blocks, so 10.
        assert_eq!(batch_size(220, 20, 1000), 10);
        // Never more blocks than the cell has, nor than MAX_BATCH (a reading as cheap as the
        // clock itself would need 1,980), and a clock that costs nothing needs no batch.
        assert_eq!(batch_size(60, 20, 16), 16);
        assert_eq!(batch_size(20, 20, 100_000), MAX_BATCH);
        assert_eq!(batch_size(5, 0, 16), 1);
    }

    #[test]
    fn a_synthetic_fast_algorithm_is_timed_in_batches_that_reach_the_line() {
        let data = crate::pattern::Pattern::Random.generate(64 * 4096, 1).unwrap();
        let alg =
            Algorithm::Codec(Compression { codec: &STORED, level: 0, skip_incompressible: false });
        let overhead = timer_overhead();
        for op in [Operation::Compress, Operation::Decompress] {
            let spec = CellSpec { block_size: 2048, ..spec(&alg, op) };
            let cell = spec.measure(&data).unwrap();
            let per = cell.blocks_per_reading;
            assert!(per > 1, "{op:?}: a 2 KiB copy is timed alone: {cell:?}");
            assert_eq!(cell.stats.samples, 128 / per * 2, "{op:?}: one sample per reading");
            // The median reading, back from time per block to time per batch, is at the line
            // (the batch is sized on the fastest reading, so most readings are above it).
            let reading = cell.stats.p50_ns * per as u64;
            assert!(
                reading >= OVERHEAD_FACTOR * overhead / 2,
                "{op:?}: readings of {reading} ns, timer {overhead} ns, {per} blocks each"
            );
            assert!(cell.mb_per_s > 0.0);
            let report = Report {
                environment: crate::env::Environment::probe(),
                timer_overhead_ns: overhead,
                cells: vec![cell],
                warnings: Vec::new(),
            };
            let line = report.batching().unwrap();
            assert!(line.starts_with("1 of 1 cells") && line.contains(&per.to_string()), "{line}");
        }
        // A wrong decoder is caught in batches too: every lane's output is checked.
        let wrong =
            Algorithm::Codec(Compression { codec: &LAZY, level: 0, skip_incompressible: false });
        let spec = CellSpec { block_size: 64, ..spec(&wrong, Operation::Decompress) };
        let mut lanes = spec.lanes(&data, 8, None).unwrap();
        let e = spec.samples(&mut lanes, &data).unwrap_err();
        assert!(matches!(e, MeasureError::Verify { block: 0, .. }), "{e}");
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
            let per = cell.blocks_per_reading;
            assert_eq!(cell.stats.samples, 4 / per * 2, "4 blocks, 2 passes, {per} per reading");
            assert!(cell.stats.min_ns > 0 && cell.stats.min_ns <= cell.stats.max_ns);
            let ratio = cell.ratio.unwrap();
            assert!(ratio > 1.5 && ratio < 2.5, "half zeros: {ratio}");
            assert!(cell.mb_per_s > 0.0);
        }
    }
}
