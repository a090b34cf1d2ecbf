//! The terminal table of `qsm stand run` and `quick`: one line per cell, printed as the cell
//! completes. Column widths come from the plan (every name is known before the first cell),
//! so a long algorithm, pattern or load name widens its column instead of shifting the rest.

use crate::measure::Cell;
use crate::plan::Plan;

/// Column widths for one run's table.
#[derive(Debug, Clone)]
pub struct Table {
    algorithm: usize,
    pattern: usize,
    load: usize,
}

/// Width of the operation column: the longest operation name, `decompress`.
const OPERATION: usize = 10;
/// Width of each time column: times print with at most 9 characters ([`us`]).
const TIME: usize = 9;

/// Nanoseconds as microseconds in at most 9 characters: two decimals below 10 ms (the
/// precision a clock of tens of ns gives), whole µs above.
fn us(ns: f64) -> String {
    let us = ns / 1e3;
    if us < 10_000.0 { format!("{us:.2}") } else { format!("{us:.0}") }
}

/// A percentile, or "–" when the cell has too few readings for it.
fn tail(ns: Option<u64>) -> String {
    ns.map_or_else(|| "–".to_owned(), |ns| us(ns as f64))
}

impl Table {
    /// The table for cells named by these algorithms, patterns and loads.
    pub fn new<'a>(
        algorithms: impl IntoIterator<Item = &'a str>,
        patterns: impl IntoIterator<Item = &'a str>,
        loads: impl IntoIterator<Item = &'a str>,
    ) -> Table {
        let widest = |names: &mut dyn Iterator<Item = &'a str>, header: &str| {
            names.map(|n| n.chars().count()).chain([header.chars().count()]).max().unwrap_or(0)
        };
        Table {
            algorithm: widest(&mut algorithms.into_iter(), "algorithm"),
            pattern: widest(&mut patterns.into_iter(), "pattern"),
            load: widest(&mut loads.into_iter(), "load"),
        }
    }

    /// The table for `plan`'s cells.
    pub fn of(plan: &Plan) -> Table {
        let patterns: Vec<String> = plan.patterns.iter().map(|p| p.name()).collect();
        let loads: Vec<String> = plan.loads.iter().map(|l| l.name()).collect();
        Table::new(
            plan.algorithms.iter().map(|(n, _)| n.as_str()),
            patterns.iter().map(String::as_str),
            loads.iter().map(String::as_str),
        )
    }

    fn line(&self, fields: [&str; 16]) -> String {
        let [alg, op, block, pattern, load, rest @ ..] = fields;
        let mut s = format!(
            "{alg:<a$} {op:<OPERATION$} {block:>6} {pattern:<p$} {load:<l$}",
            a = self.algorithm,
            p = self.pattern,
            l = self.load
        );
        // min, mean, p50, p99, p99.9, max; MB/s, ratio, slowdown; readings, blocks per reading.
        let widths = [TIME, TIME, TIME, TIME, TIME, TIME, 8, 8, 8, 8, 6];
        for (field, width) in rest.iter().zip(widths) {
            s.push_str(&format!(" {field:>width$}"));
        }
        s
    }

    /// The header line.
    pub fn header(&self) -> String {
        self.line([
            "algorithm",
            "operation",
            "block",
            "pattern",
            "load",
            "min µs",
            "mean µs",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
            "MB/s",
            "ratio",
            "slowdown",
            "readings",
            "blk/rd",
        ])
    }

    /// A cell's line.
    pub fn row(&self, c: &Cell) -> String {
        let s = &c.stats;
        self.line([
            &c.algorithm,
            &c.operation,
            &size(c.block_size),
            &c.pattern,
            &c.load,
            &us(s.min_ns as f64),
            &us(s.mean_ns),
            &us(s.p50_ns as f64),
            &tail(s.p99_ns),
            &tail(s.p999_ns),
            &us(s.max_ns as f64),
            &format!("{:.0}", c.mb_per_s),
            &c.ratio.map_or_else(|| "-".into(), |r| format!("{r:.2}")),
            &c.slowdown.map_or_else(|| "-".into(), |x| format!("{x:.2}x")),
            &s.samples.to_string(),
            &c.blocks_per_reading.to_string(),
        ])
    }
}

/// A block size as the plans write it: `4K`, `1M`, or bytes.
pub fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::stats::Stats;

    fn cell(algorithm: &str, min_ns: u64, max_ns: u64) -> Cell {
        let mut samples: Vec<u64> =
            (0..150).map(|i| min_ns + (max_ns - min_ns) * i / 149).collect();
        Cell {
            algorithm: algorithm.into(),
            operation: "decompress".into(),
            block_size: 65536,
            pattern: "compressible:50".into(),
            load: "none".into(),
            slowdown: Some(1.5),
            stats: Stats::of(&mut samples),
            blocks_per_reading: 1,
            mb_per_s: 1234.0,
            ratio: Some(2.0),
        }
    }

    #[test]
    fn columns_stay_aligned_whatever_the_names() {
        let long = "plugin:/a/very/long/path/to/libsomething-compressor.so";
        let table = Table::new(["lz4", long, "zstd:19"], ["compressible:50"], ["none"]);
        let rows = [
            table.header(),
            table.row(&cell("lz4", 200, 900)),
            table.row(&cell(long, 3, 4)),
            table.row(&cell("zstd:19", 1_000_000, 90_000_000_000)),
        ];
        let all = rows.join("\n");
        let header: Vec<char> = rows[0].chars().collect();
        let find = |title: &str| {
            let t: Vec<char> = title.chars().collect();
            header.windows(t.len()).position(|w| w == t.as_slice()).unwrap()
        };
        for r in &rows {
            let line: Vec<char> = r.chars().collect();
            assert_eq!(line.len(), header.len(), "every line as wide as the header:\n{all}");
            // Names are left-aligned: each starts where its title does.
            for title in ["algorithm", "operation", "pattern", "load"] {
                let at = find(title);
                assert!(line[at] != ' ' && (at == 0 || line[at - 1] == ' '), "{title}:\n{all}");
            }
            // Numbers are right-aligned: each ends where its title does.
            for title in ["min µs", "p99.9 µs", "max µs", "MB/s", "slowdown", "readings", "blk/rd"]
            {
                let end = find(title) + title.chars().count() - 1;
                let next = line.get(end + 1).copied().unwrap_or(' ');
                assert!(line[end] != ' ' && next == ' ', "{title}:\n{all}");
            }
        }
        assert!(rows[2].contains(" – "), "p99.9 of 150 readings is not shown:\n{all}");
    }
}
