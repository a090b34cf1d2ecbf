//! Statistics of one cell's per-block times.

use serde::{Deserialize, Serialize};

/// Summary of a cell's samples: one per reading of the clock, in nanoseconds per block (a
/// reading of a batch of blocks counts as one sample of its time divided by the batch).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Samples (readings of the clock).
    pub samples: usize,
    /// Fastest block.
    pub min_ns: u64,
    /// Mean.
    pub mean_ns: f64,
    /// Percentiles, nearest-rank. The tail ones are `None` when there are too few samples
    /// for them ([`enough_for`]): with 96 samples the "p99.9" would be the maximum.
    pub p50_ns: u64,
    #[serde(default)]
    pub p90_ns: Option<u64>,
    #[serde(default)]
    pub p99_ns: Option<u64>,
    #[serde(default)]
    pub p999_ns: Option<u64>,
    /// Slowest block.
    pub max_ns: u64,
    /// Population standard deviation.
    pub stddev_ns: f64,
    /// The latency distribution: `[upper bound ns, samples]` for each non-empty bucket of an
    /// HDR histogram (3 significant digits), buckets growing by 2^(1/8) (about 9%).
    pub histogram: Vec<[u64; 2]>,
}

/// Whether `samples` are enough for the `q` quantile to be more than the maximum: at least
/// 1/(1 - q) of them (10 for p90, 100 for p99, 1,000 for p99.9), so that at least one sample
/// lies above it.
pub fn enough_for(samples: usize, q: f64) -> bool {
    // Rounded, so 0.999's binary error does not ask for 1,001.
    samples as f64 * (1.0 - q) >= 1.0 - 1e-9
}

/// HDR histogram buckets of `sorted` samples.
fn histogram(sorted: &[u64]) -> Vec<[u64; 2]> {
    let Ok(mut h) = hdrhistogram::Histogram::<u64>::new(3) else { return Vec::new() };
    for &s in sorted {
        // Auto-resizing: recording fails only for values beyond u64's range.
        let _ = h.record(s.max(1));
    }
    h.iter_log(1, 2f64.powf(0.125))
        .filter(|v| v.count_since_last_iteration() > 0)
        .map(|v| [v.value_iterated_to(), v.count_since_last_iteration()])
        .collect()
}

impl Stats {
    /// The statistics of `samples` (reordered in place); all zero when empty.
    pub fn of(samples: &mut [u64]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / n as f64;
        let var = samples.iter().map(|&s| (s as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        // Nearest rank: the smallest sample with at least q of the samples at or below it.
        let rank = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let tail = |q: f64| enough_for(n, q).then(|| rank(q));
        Stats {
            samples: n,
            min_ns: samples[0],
            mean_ns: mean,
            p50_ns: rank(0.50),
            p90_ns: tail(0.90),
            p99_ns: tail(0.99),
            p999_ns: tail(0.999),
            max_ns: samples[n - 1],
            stddev_ns: var.sqrt(),
            histogram: histogram(samples),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_moments_exact() {
        let mut s: Vec<u64> = (1..=1000).rev().collect();
        let st = Stats::of(&mut s);
        assert_eq!((st.min_ns, st.max_ns, st.samples), (1, 1000, 1000));
        assert_eq!(
            (st.p50_ns, st.p90_ns, st.p99_ns, st.p999_ns),
            (500, Some(900), Some(990), Some(999))
        );
        assert!((st.mean_ns - 500.5).abs() < 1e-9);
        assert!((st.stddev_ns - 288.674_990_1).abs() < 1e-6, "{}", st.stddev_ns);
        let one = Stats::of(&mut [42]);
        assert_eq!((one.p50_ns, one.p90_ns, one.stddev_ns), (42, None, 0.0));
        let few = Stats::of(&mut (1..=999).collect::<Vec<u64>>());
        assert_eq!((few.p99_ns, few.p999_ns), (Some(990), None), "p99.9 needs 1,000 samples");
        let fewer = Stats::of(&mut (1..=99).collect::<Vec<u64>>());
        assert_eq!((fewer.p90_ns, fewer.p99_ns), (Some(90), None), "p99 needs 100");
        assert_eq!(Stats::of(&mut []), Stats::default());
        let total: u64 = st.histogram.iter().map(|b| b[1]).sum();
        assert_eq!(total, 1000, "every sample in one bucket");
        assert!(st.histogram.windows(2).all(|w| w[0][0] < w[1][0]));
        let last = st.histogram.last().unwrap()[0];
        assert!((1000..1100).contains(&last), "the top bucket holds 1000: {last}");
    }
}
