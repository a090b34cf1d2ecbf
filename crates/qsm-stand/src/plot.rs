//! Plots as SVG and PNG: the paper's figures (time per block against block size, with min,
//! avg, max and no-load curves, one figure per algorithm, operation, pattern and load) and
//! the latency distribution of a cell as a histogram.
//!
//! Text needs a TrueType font (plotters draws it itself, without fontconfig): the first of
//! `$QSM_STAND_FONT` and the usual DejaVu and Liberation paths that exists.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;

use crate::measure::{Cell, Report};

/// Why plots could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No font for the labels.
    #[error(
        "no TrueType font for the plots' labels: set QSM_STAND_FONT to a .ttf file (on Debian, apt-get install fonts-dejavu-core)"
    )]
    NoFont,
    /// Drawing or writing failed.
    #[error("{path}: {detail}")]
    Draw { path: PathBuf, detail: String },
}

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// Registers a font once per process.
fn font() -> Result<(), PlotError> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        let from_env = std::env::var_os("QSM_STAND_FONT").map(PathBuf::from);
        let candidates = from_env.into_iter().chain(FONT_PATHS.iter().map(PathBuf::from));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // plotters keeps fonts for the process's life: leaking one is what it asks.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    });
    if ok { Ok(()) } else { Err(PlotError::NoFont) }
}

/// A file-name-safe form of a cell's label.
fn slug(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| {
            p.chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
                .collect()
        })
        .collect::<Vec<String>>()
        .join("-")
}

const SIZE: (u32, u32) = (800, 500);

/// Draws one figure as `DIR/NAME.svg` and `DIR/NAME.png`.
macro_rules! render {
    ($written:ident, $dir:expr, $name:expr, |$a:ident| $body:expr) => {{
        let svg = $dir.join(format!("{}.svg", $name));
        {
            let $a = &SVGBackend::new(&svg, SIZE).into_drawing_area();
            $body.and_then(|()| $a.present().map_err(|e| e.to_string()))
        }
        .map_err(|detail| PlotError::Draw { path: svg.clone(), detail })?;
        $written.push(svg);
        let png = $dir.join(format!("{}.png", $name));
        {
            let $a = &BitMapBackend::new(&png, SIZE).into_drawing_area();
            $body.and_then(|()| $a.present().map_err(|e| e.to_string()))
        }
        .map_err(|detail| PlotError::Draw { path: png.clone(), detail })?;
        $written.push(png);
    }};
}

/// Writes every figure of `report` into `dir` as SVG and PNG; returns the files written.
pub fn all(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    font()?;
    std::fs::create_dir_all(dir)
        .map_err(|e| PlotError::Draw { path: dir.into(), detail: e.to_string() })?;
    let mut written = Vec::new();
    // A report read back from JSON may hold anything: only cells that can be drawn are.
    let drawable = |c: &&Cell| {
        c.block_size > 0
            && c.stats.min_ns > 0
            && c.stats.mean_ns.is_finite()
            && c.stats.histogram.iter().all(|b| b[0] > 0)
    };
    let cells: Vec<&Cell> = report.cells.iter().filter(drawable).collect();
    let mut groups: Vec<(&str, &str, &str, &str)> = Vec::new();
    for c in &cells {
        let g = (c.algorithm.as_str(), c.operation.as_str(), c.pattern.as_str(), c.load.as_str());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    for (alg, op, pattern, load) in groups {
        let mut group: Vec<&Cell> = cells
            .iter()
            .copied()
            .filter(|c| (c.algorithm.as_str(), c.operation.as_str()) == (alg, op))
            .filter(|c| (c.pattern.as_str(), c.load.as_str()) == (pattern, load))
            .collect();
        group.sort_by_key(|c| c.block_size);
        // The no-load curve compares a load with none: under no load it is the avg again,
        // drawn over it.
        let baseline: Vec<&Cell> = cells
            .iter()
            .copied()
            .filter(|c| (c.algorithm.as_str(), c.operation.as_str()) == (alg, op))
            .filter(|c| c.pattern == pattern && c.load == "none" && load != "none")
            .collect();
        let name = slug(&[alg, op, pattern, load]);
        let title = format!("{alg} {op}, {pattern}, load {load}");
        render!(written, dir, name, |a| block_sizes(a, &title, &group, &baseline));
        // The distribution of the smallest block size's cell: the paper's 4 KiB focus.
        if let Some(first) = group.first() {
            let name = format!("{name}-{}-histogram", first.block_size);
            let title = format!("{title}, {}-byte blocks", first.block_size);
            render!(written, dir, name, |a| histogram(a, &title, first));
        }
    }
    Ok(written)
}

fn text<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

/// The fewest labelled ticks an axis gets: two could be read as a range, not a scale.
const MIN_TICKS: usize = 3;

/// One axis's scale. Log axes are drawn as linear axes of log10 values (labelled with the
/// values themselves), so the ticks are chosen here rather than by plotters, whose log scale
/// labels only powers of ten and so leaves an axis spanning less than a decade unlabelled.
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    log: bool,
    /// The drawn range, in plotted units (log10 of the value on a log axis).
    lo: f64,
    hi: f64,
    /// Labelled positions, in plotted units.
    ticks: Vec<f64>,
    /// Digits after the decimal point of a linear axis's labels.
    decimals: usize,
}

/// Candidate tick steps within a decade: 1, 2 and 5 times a power of ten read as round.
const NICE: [f64; 3] = [1.0, 2.0, 5.0];

impl Axis {
    /// The axis for positive values from `min` to `max`: logarithmic when they span a decade
    /// or more (a linear axis would squash the small ones into its floor), else linear.
    /// `from_zero` starts a linear axis at 0 (counts).
    fn of(min: f64, max: f64, from_zero: bool) -> Axis {
        let (min, max) = if min <= max { (min, max) } else { (max, min) };
        if min > 0.0 && max / min >= 10.0 && !from_zero {
            Axis::log(min, max)
        } else {
            Axis::linear(min, max, from_zero)
        }
    }

    fn linear(min: f64, max: f64, from_zero: bool) -> Axis {
        // A flat or single-valued series still gets a scale around it.
        let span = (max - min).max(max.abs() * 0.1).max(1e-9);
        let lo = if from_zero { 0.0 } else { min - span * 0.08 };
        let hi = max + span * 0.08;
        // Counts (the axes that start at zero) are whole: at least 0, 1 and 2 on the axis.
        let hi = if from_zero { hi.max(MIN_TICKS as f64 - 0.9) } else { hi };
        // The largest 1-2-5 step that still gives MIN_TICKS + 1 labels (a few more read better).
        let mut exp = (hi - lo).log10().ceil() as i32;
        let step = 'found: loop {
            for &m in NICE.iter().rev() {
                let step = m * 10f64.powi(exp);
                let whole = !from_zero || step >= 1.0;
                if whole && ticks_between(lo, hi, step).len() > MIN_TICKS {
                    break 'found step;
                }
            }
            exp -= 1;
            // Reached only for counts below MIN_TICKS + 1 (step 1 is the finest whole one),
            // or a range no finite data gives.
            if exp < -40 || (from_zero && exp < 0) {
                break if from_zero { 1.0 } else { (hi - lo) / 4.0 };
            }
        };
        let decimals = (-step.log10().floor()).max(0.0) as usize;
        Axis { log: false, lo, hi, ticks: ticks_between(lo, hi, step), decimals }
    }

    fn log(min: f64, max: f64) -> Axis {
        let (a, b) = (min.log10(), max.log10());
        let pad = (b - a) * 0.06;
        let (lo, hi) = (a - pad, b + pad);
        // Over four decades 2 and 5 crowd the axis; a decade holds 1, 2 and 5 otherwise, and
        // the span is at least a decade, so either way there are MIN_TICKS labels.
        let multiples: &[f64] = if hi - lo > 4.0 { &[1.0] } else { &NICE };
        let mut ticks = Vec::new();
        for exp in lo.floor() as i32..=hi.ceil() as i32 {
            for &m in multiples {
                let t = (m * 10f64.powi(exp)).log10();
                if (lo..=hi).contains(&t) {
                    ticks.push(t);
                }
            }
        }
        // Unused: each log label takes its own decade's decimals (`label`).
        Axis { log: true, lo, hi, ticks, decimals: 0 }
    }

    /// A value's plotted position.
    fn to(&self, v: f64) -> f64 {
        if self.log { v.max(f64::MIN_POSITIVE).log10() } else { v }
    }

    /// The label of a plotted position.
    fn label(&self, p: f64) -> String {
        if self.log {
            // As many decimals as the tick's own decade needs: 0.2, 0.5, 1, 20.
            format!("{:.*}", (-p.floor()).max(0.0) as usize, 10f64.powf(p))
        } else {
            format!("{p:.*}", self.decimals)
        }
    }

    /// The axis title: what, in which unit, and the scale when it is not linear.
    fn title(&self, what: &str) -> String {
        if self.log { format!("{what} (log scale)") } else { what.to_owned() }
    }
}

/// An axis is its own plotters coordinate, so that its ticks, not plotters' own choice, are
/// the labelled ones.
impl Ranged for Axis {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn map(&self, &v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 || !span.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let along = ((v - self.lo) / span).clamp(-1.0, 2.0);
        limit.0 + (f64::from(limit.1 - limit.0) * along).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Light (unlabelled) grid lines are not drawn: only the labelled ticks.
        if hint.weight().allow_light_points() { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// The multiples of `step` from `lo` to `hi`.
fn ticks_between(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    // Bounded: a step too small for the range gives no ticks rather than millions.
    if last < first || last - first > 1000 {
        return Vec::new();
    }
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Draws a legend of `(label, colour)` lines in `area`, beside the plot rather than on it,
/// so it never hides a curve.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[(&str, RGBColor)],
) -> Result<(), String> {
    for (i, &(label, colour)) in series.iter().enumerate() {
        let y = 40 + 24 * i as i32;
        area.draw(&PathElement::new([(4, y), (26, y)], colour.stroke_width(2))).map_err(text)?;
        area.draw(&Text::new(label.to_owned(), (32, y - 8), ("sans-serif", 15))).map_err(text)?;
    }
    Ok(())
}

/// Width of the legend beside each plot, in pixels.
const LEGEND_WIDTH: u32 = 130;

/// Time per 4 KiB (µs) against block size, as the paper plots it: min, avg and max of this
/// load, and the no-load avg.
fn block_sizes<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    cells: &[&Cell],
    baseline: &[&Cell],
) -> Result<(), String> {
    area.fill(&WHITE).map_err(text)?;
    let per_4k = |ns: f64, bs: usize| ns * 4096.0 / bs as f64 / 1e3;
    // log2 of the block size, so each doubling is one step and every block size a label.
    let kib = |bs: usize| (bs as f64).log2();
    let curve = |f: &dyn Fn(&Cell) -> f64, cells: &[&Cell]| -> Vec<(f64, f64)> {
        cells.iter().map(|c| (kib(c.block_size), per_4k(f(c), c.block_size).max(1e-3))).collect()
    };
    let min = curve(&|c| c.stats.min_ns as f64, cells);
    let avg = curve(&|c| c.stats.mean_ns, cells);
    let max = curve(&|c| c.stats.max_ns as f64, cells);
    let no_load: Vec<(f64, f64)> = cells
        .iter()
        .filter_map(|c| baseline.iter().find(|b| b.block_size == c.block_size))
        .map(|b| (kib(b.block_size), per_4k(b.stats.mean_ns, b.block_size).max(1e-3)))
        .collect();
    let all = || min.iter().chain(&avg).chain(&max).chain(&no_load);
    if all().next().is_none() {
        return Ok(());
    }
    let (x0, x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let y = Axis::of(y0, y1, false);
    // Block sizes are powers of two at whole log2 steps: one label each, widened to
    // MIN_TICKS sizes when the plan has fewer, so the axis still reads as a scale.
    let widen = (MIN_TICKS as f64 - 1.0 - (x1 - x0)).max(0.0) / 2.0;
    let (xa, xb) = ((x0 - widen).round().max(0.0), (x1 + widen).round());
    let x = Axis {
        log: false,
        lo: xa - 0.3,
        hi: xb + 0.3,
        ticks: (xa as i64..=xb as i64).map(|k| k as f64).collect(),
        decimals: 0,
    };
    let area = area.titled(title, ("sans-serif", 20)).map_err(text)?;
    let (plot, side) = area.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y.clone())
        .map_err(text)?;
    let y_title = y.title("time per 4 KiB of data, µs");
    chart
        .configure_mesh()
        .x_desc("block size, bytes (K = 1024; log scale)")
        .y_desc(y_title.as_str())
        .light_line_style(WHITE)
        .x_label_formatter(&|&x| {
            let bytes = 2f64.powf(x).round() as u64;
            match bytes {
                b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}M", b >> 20),
                b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{}K", b >> 10),
                b => b.to_string(),
            }
        })
        .y_label_formatter(&|&v| y.label(v))
        .draw()
        .map_err(text)?;
    let grey = RGBColor(90, 90, 90);
    let mut series = vec![("min", &min, GREEN), ("avg", &avg, BLUE), ("max", &max, RED)];
    if !no_load.is_empty() {
        series.push(("no load (avg)", &no_load, grey));
    }
    for &(_, points, colour) in &series {
        let at = |&(x, v): &(f64, f64)| (x, y.to(v));
        chart
            .draw_series(LineSeries::new(points.iter().map(at), colour.stroke_width(2)))
            .map_err(text)?;
        chart
            .draw_series(points.iter().map(|p| Circle::new(at(p), 3, colour.filled())))
            .map_err(text)?;
    }
    let labels: Vec<(&str, RGBColor)> = series.iter().map(|&(l, _, c)| (l, c)).collect();
    legend(&side, &labels)
}

/// A cell's latency distribution: the HDR histogram's buckets on a time axis (logarithmic
/// when they span a decade or more).
fn histogram<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    cell: &Cell,
) -> Result<(), String> {
    area.fill(&WHITE).map_err(text)?;
    let buckets = &cell.stats.histogram;
    let Some(&[last, _]) = buckets.last() else { return Ok(()) };
    let step = 2f64.powf(0.125);
    let us = |ns: f64| ns / 1e3;
    let x = Axis::of(us(buckets[0][0] as f64 / step), us(last as f64), false);
    let top = buckets.iter().map(|b| b[1]).max().unwrap_or(1) as f64;
    let y = Axis::of(0.0, top, true);
    let s = &cell.stats;
    // Too few readings for a p99 leave it out rather than print the maximum under its name.
    let p99 = s.p99_ns.map_or_else(|| "–".to_owned(), |ns| format!("{:.2}", us(ns as f64)));
    let caption = format!(
        "{title}: p50 {:.2} µs, p99 {p99} µs, max {:.2} µs",
        us(s.p50_ns as f64),
        us(s.max_ns as f64)
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x.clone(), y.clone())
        .map_err(text)?;
    let x_title = x.title("time per block, µs");
    let y_title = if cell.blocks_per_reading > 1 {
        format!("readings (of {} blocks each)", cell.blocks_per_reading)
    } else {
        "readings (one block each)".to_owned()
    };
    chart
        .configure_mesh()
        .x_desc(x_title.as_str())
        .y_desc(y_title.as_str())
        .light_line_style(WHITE)
        .x_label_formatter(&|&v| x.label(v))
        .y_label_formatter(&|&v| y.label(v))
        .draw()
        .map_err(text)?;
    chart
        .draw_series(buckets.iter().map(|&[upper, count]| {
            let hi = us(upper as f64);
            Rectangle::new(
                [(x.to(hi / step), 0.0), (x.to(hi), count as f64)],
                BLUE.mix(0.7).filled(),
            )
        }))
        .map_err(text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::stats::Stats;

    /// A cell of `block_size` whose blocks took `ns` each, scaled by `spread` for the slowest.
    fn cell(block_size: usize, ns: u64, spread: u64) -> Cell {
        let mut samples: Vec<u64> = (0..200).map(|i| ns + ns * (spread - 1) * i / 199).collect();
        Cell {
            algorithm: "x".into(),
            operation: "hash".into(),
            block_size,
            pattern: "random".into(),
            load: "none".into(),
            slowdown: None,
            stats: Stats::of(&mut samples),
            blocks_per_reading: 1,
            mb_per_s: 1.0,
            ratio: None,
        }
    }

    /// The text of every `<text>` element of an SVG.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_owned()))
            .collect()
    }

    fn svg(draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), String>) -> String {
        font().unwrap();
        let mut out = String::new();
        {
            let area = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
            draw(&area).unwrap();
            area.present().unwrap();
        }
        out
    }

    /// The numeric labels among `texts`, as numbers.
    fn numbers(texts: &[String]) -> Vec<f64> {
        texts.iter().filter_map(|t| t.parse::<f64>().ok()).collect()
    }

    #[test]
    fn a_narrow_range_gets_a_linear_axis_with_labelled_ticks() {
        // Every block size within 20% of 0.25 µs per 4 KiB: well under a decade.
        let cells = [cell(4096, 250, 1), cell(16384, 1100, 1), cell(65536, 4000, 1)];
        let refs: Vec<&Cell> = cells.iter().collect();
        let out = svg(|a| block_sizes(a, "narrow", &refs, &[]));
        let t = texts(&out);
        let y = numbers(&t);
        assert!(y.len() >= MIN_TICKS, "y tick labels: {t:?}");
        assert!(y.iter().all(|v| (0.2..0.3).contains(v)), "ticks within the data's range: {y:?}");
        for label in ["4K", "16K", "64K", "time per 4 KiB of data, µs", "block size, bytes"] {
            assert!(t.iter().any(|x| x.contains(label)), "{label} missing: {t:?}");
        }
        assert!(!t.iter().any(|x| x.contains("log scale)") && x.contains("µs")), "linear: {t:?}");
        for legend in ["min", "avg", "max"] {
            assert!(t.iter().any(|x| x == legend), "legend {legend}: {t:?}");
        }
    }

    #[test]
    fn a_wide_range_gets_a_log_axis_with_labelled_ticks() {
        // From 0.1 µs to 5 ms per 4 KiB: nearly five decades, and one block size only.
        let cells = [cell(4096, 100, 50_000)];
        let refs: Vec<&Cell> = cells.iter().collect();
        let out = svg(|a| block_sizes(a, "wide", &refs, &[]));
        let t = texts(&out);
        let y = numbers(&t);
        assert!(y.len() >= MIN_TICKS, "y tick labels: {t:?}");
        assert!(t.iter().any(|x| x == "time per 4 KiB of data, µs (log scale)"), "{t:?}");
        // One block size still gets a scale of three sizes around it.
        for label in ["2K", "4K", "8K"] {
            assert!(t.iter().any(|x| x == label), "{label} missing: {t:?}");
        }
        // The histogram of the same cell: time on a log axis, counts on a linear one.
        let out = svg(|a| histogram(a, "wide", &cells[0]));
        let t = texts(&out);
        assert!(numbers(&t).len() >= 2 * MIN_TICKS, "x and y tick labels: {t:?}");
        assert!(t.iter().any(|x| x == "time per block, µs (log scale)"), "{t:?}");
        // A narrow histogram: linear time axis, still labelled.
        let narrow = cell(4096, 1000, 2);
        let t = texts(&svg(|a| histogram(a, "narrow", &narrow)));
        assert!(numbers(&t).len() >= 2 * MIN_TICKS, "x and y tick labels: {t:?}");
        assert!(t.iter().any(|x| x == "time per block, µs"), "{t:?}");
    }

    #[test]
    fn axes_have_at_least_three_distinct_ticks_whatever_the_range() {
        let ranges = [
            (1.0, 1.0),
            (0.25, 0.3),
            (1e-3, 1e-3 * 1.01),
            (3.0, 29.0),
            (0.5, 5.0),
            (9.0, 11.0),
            (1e-3, 1e4),
            (12345.0, 12346.0),
        ];
        for (lo, hi) in ranges {
            let axis = Axis::of(lo, hi, false);
            assert_eq!(axis.log, hi / lo >= 10.0, "{lo}..{hi}");
            let labels: Vec<String> = axis.ticks.iter().map(|&p| axis.label(p)).collect();
            assert!(labels.len() >= MIN_TICKS, "{lo}..{hi}: {labels:?}");
            let mut distinct = labels.clone();
            distinct.dedup();
            assert_eq!(distinct, labels, "{lo}..{hi}: labels tell the ticks apart");
            assert!(axis.ticks.iter().all(|t| (axis.lo..=axis.hi).contains(t)), "{axis:?}");
        }
        for top in [1.0, 2.0, 7.0, 1e6] {
            let counts = Axis::of(0.0, top, true);
            assert!(counts.ticks.len() >= MIN_TICKS, "{top}: {counts:?}");
            assert!(counts.ticks.iter().all(|t| t.fract() == 0.0), "whole counts: {counts:?}");
        }
    }
}
