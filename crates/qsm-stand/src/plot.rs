//! Plots as SVG and PNG: the paper's figures (time per block against block size, with min,
//! avg, max and no-load curves, one figure per algorithm, operation, pattern and load) and
//! the latency distribution of a cell as a histogram.
//!
//! Text needs a TrueType font (plotters draws it itself, without fontconfig): the first of
//! `$QSM_STAND_FONT` and the usual DejaVu and Liberation paths that exists.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
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
        let baseline: Vec<&Cell> = cells
            .iter()
            .copied()
            .filter(|c| (c.algorithm.as_str(), c.operation.as_str()) == (alg, op))
            .filter(|c| c.pattern == pattern && c.load == "none")
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
    let (x0, x1) = all().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = all().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if all().next().is_none() {
        return Ok(());
    }
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0 - 0.3..x1 + 0.3, (y0 / 1.3..y1 * 1.3).log_scale())
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc("block size")
        .y_desc("time per 4 KiB, µs (log scale)")
        .x_labels(((x1 - x0).clamp(0.0, 64.0) as usize + 3) * 2)
        .x_label_formatter(&|&x| {
            if (x - x.round()).abs() > 1e-6 || !(0.0..=40.0).contains(&x) {
                return String::new();
            }
            let bytes = 1u64 << x.round() as u32;
            match bytes {
                b if b >= 1 << 20 => format!("{}M", b >> 20),
                b if b >= 1 << 10 => format!("{}K", b >> 10),
                b => b.to_string(),
            }
        })
        .y_labels(6)
        .light_line_style(WHITE)
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(text)?;
    let series = [("min", &min, GREEN), ("avg", &avg, BLUE), ("max", &max, RED)];
    for (label, points, colour) in series {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
            .map_err(text)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(text)?;
    }
    if !no_load.is_empty() {
        let grey = RGBColor(90, 90, 90);
        chart
            .draw_series(LineSeries::new(no_load.iter().copied(), grey.stroke_width(2)))
            .map_err(text)?
            .label("no load (avg)")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], grey.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(text)?;
    Ok(())
}

/// A cell's latency distribution: the HDR histogram's buckets on a logarithmic time axis.
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
    let x0 = us(buckets[0][0] as f64 / step);
    let x1 = us(last as f64);
    let top = buckets.iter().map(|b| b[1]).max().unwrap_or(1) as f64;
    let s = &cell.stats;
    let caption = format!(
        "{title}: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        us(s.p50_ns as f64),
        us(s.p99_ns as f64),
        us(s.max_ns as f64)
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x0 / 1.1..x1 * 1.1).log_scale(), 0f64..top * 1.1)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc("time per block, µs (log scale)")
        .y_desc("blocks")
        .x_labels(6)
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.1}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(text)?;
    chart
        .draw_series(buckets.iter().map(|&[upper, count]| {
            let hi = us(upper as f64);
            Rectangle::new([(hi / step, 0.0), (hi, count as f64)], BLUE.mix(0.7).filled())
        }))
        .map_err(text)?;
    Ok(())
}
