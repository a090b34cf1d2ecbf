//! `qsm stand compare A.json B.json`: what changed between two runs, cell by cell, so a
//! regression (or a machine that drifted) is visible.

use crate::measure::{Cell, Report};

/// One cell present in both runs.
#[derive(Debug, Clone)]
pub struct Change {
    /// `algorithm operation block pattern load`.
    pub cell: String,
    /// Median time per block in A and B, ns.
    pub p50: (u64, u64),
    /// Mean time per block in A and B, ns.
    pub mean: (f64, f64),
    /// Fastest block in A and B, ns.
    pub min: (u64, u64),
    /// (B − A) / A of the median, in percent: positive is slower.
    pub p50_change_pct: f64,
}

/// Two runs compared.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// Cells in both, in A's order.
    pub changes: Vec<Change>,
    /// Cells only A has.
    pub only_a: Vec<String>,
    /// Cells only B has.
    pub only_b: Vec<String>,
    /// Differences between the machines (CPU, cores, governor, kernel, versions).
    pub environment: Vec<String>,
}

fn key(c: &Cell) -> String {
    format!("{} {} {} {} {}", c.algorithm, c.operation, c.block_size, c.pattern, c.load)
}

impl Comparison {
    /// Matches the cells of `a` and `b` by algorithm, operation, block size, pattern, load.
    pub fn of(a: &Report, b: &Report) -> Comparison {
        let mut out = Comparison::default();
        for ca in &a.cells {
            let k = key(ca);
            match b.cells.iter().find(|cb| key(cb) == k) {
                Some(cb) => {
                    let (pa, pb) = (ca.stats.p50_ns, cb.stats.p50_ns);
                    out.changes.push(Change {
                        cell: k,
                        p50: (pa, pb),
                        mean: (ca.stats.mean_ns, cb.stats.mean_ns),
                        min: (ca.stats.min_ns, cb.stats.min_ns),
                        p50_change_pct: if pa > 0 {
                            (pb as f64 - pa as f64) / pa as f64 * 100.0
                        } else {
                            0.0
                        },
                    });
                }
                None => out.only_a.push(k),
            }
        }
        out.only_b =
            b.cells.iter().map(key).filter(|k| !a.cells.iter().any(|c| key(c) == *k)).collect();
        let (ea, eb) = (&a.environment, &b.environment);
        let mut differs = |what: &str, x: String, y: String| {
            if x != y {
                out.environment.push(format!("{what}: {x} → {y}"));
            }
        };
        differs("CPU", ea.cpu_model.clone(), eb.cpu_model.clone());
        differs("cores", ea.cores.to_string(), eb.cores.to_string());
        differs("governor", ea.governor.clone(), eb.governor.clone());
        differs("kernel", ea.kernel.clone(), eb.kernel.clone());
        differs("qsm-stand", ea.version.clone(), eb.version.clone());
        for (name, va) in &ea.crates {
            differs(name, va.clone(), eb.crates.get(name).cloned().unwrap_or_default());
        }
        out
    }

    /// Cells whose median moved by more than `threshold_pct`, slower first.
    pub fn beyond(&self, threshold_pct: f64) -> Vec<&Change> {
        let mut v: Vec<&Change> =
            self.changes.iter().filter(|c| c.p50_change_pct.abs() > threshold_pct).collect();
        v.sort_by(|x, y| y.p50_change_pct.total_cmp(&x.p50_change_pct));
        v
    }

    /// The median and the largest absolute change of the medians, in percent: how well two
    /// runs of one plan agree.
    pub fn spread(&self) -> (f64, f64) {
        self.spread_of(|c| c.p50_change_pct)
    }

    /// [`Comparison::spread`] of the fastest blocks: on a shared machine a neighbour slows
    /// typical blocks for minutes at a time but rarely every one, so the minimums agree where
    /// the medians do not, which tells noise from a real change.
    pub fn min_spread(&self) -> (f64, f64) {
        self.spread_of(|c| {
            if c.min.0 == 0 {
                0.0
            } else {
                (c.min.1 as f64 - c.min.0 as f64) / c.min.0 as f64 * 100.0
            }
        })
    }

    fn spread_of(&self, change: impl Fn(&Change) -> f64) -> (f64, f64) {
        let mut abs: Vec<f64> = self.changes.iter().map(|c| change(c).abs()).collect();
        if abs.is_empty() {
            return (0.0, 0.0);
        }
        abs.sort_by(f64::total_cmp);
        (abs[(abs.len() - 1) / 2], abs[abs.len() - 1])
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::stats::Stats;

    fn cell(alg: &str, p50: u64) -> Cell {
        Cell {
            algorithm: alg.into(),
            operation: "compress".into(),
            block_size: 4096,
            pattern: "random".into(),
            load: "none".into(),
            slowdown: None,
            stats: Stats { p50_ns: p50, mean_ns: p50 as f64, ..Stats::default() },
            blocks_per_reading: 1,
            mb_per_s: 1.0,
            ratio: None,
        }
    }

    fn report(cells: Vec<Cell>) -> Report {
        Report {
            environment: crate::env::Environment::probe(),
            timer_overhead_ns: 20,
            cells,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn changes_are_matched_by_cell_and_measured_against_a() {
        let a = report(vec![cell("lz4", 1000), cell("zstd:1", 2000), cell("lzo", 500)]);
        let mut b = report(vec![cell("zstd:1", 2020), cell("lz4", 1500), cell("quicklz", 10)]);
        b.environment.kernel = "other".into();
        let c = Comparison::of(&a, &b);
        assert_eq!(c.changes.len(), 2);
        assert_eq!(c.changes[0].p50, (1000, 1500));
        assert!((c.changes[0].p50_change_pct - 50.0).abs() < 1e-9);
        assert_eq!(c.only_a, ["lzo compress 4096 random none"]);
        assert_eq!(c.only_b, ["quicklz compress 4096 random none"]);
        let beyond = c.beyond(5.0);
        assert_eq!(beyond.len(), 1, "zstd moved 1%");
        assert!(beyond[0].cell.starts_with("lz4"));
        let (median, max) = c.spread();
        assert!((max - 50.0).abs() < 1e-9 && (median - 1.0).abs() < 1e-9, "{median} {max}");
        assert!(c.environment.iter().any(|e| e.starts_with("kernel")), "{:?}", c.environment);
        // A report survives JSON, as compare reads it.
        let json = serde_json::to_string(&a).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(Comparison::of(&a, &back).spread(), (0.0, 0.0));
    }
}
