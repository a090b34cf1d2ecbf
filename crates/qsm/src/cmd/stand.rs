//! `qsm stand run PLAN.toml`, `qsm stand quick`, `qsm stand compare A.json B.json` and
//! `qsm stand plot REPORT.json`: block algorithms measured block by block.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use qsm_stand::Plan;
use qsm_stand::compare::Comparison;
use qsm_stand::measure::{Cell, Report};

#[derive(Debug, Subcommand)]
pub enum StandCommand {
    /// Run a plan file (see examples/stand/).
    Run {
        /// The plan (TOML).
        plan: PathBuf,
        #[command(flatten)]
        out: Outputs,
    },
    /// Run the built-in plan: lz4, zstd:1, zstd:3, lzo, quicklz, AES-256-GCM,
    /// ChaCha20-Poly1305, CRC32C and BLAKE3 over 4, 16 and 64 KiB blocks of random, zero and
    /// half-compressible data.
    Quick {
        #[command(flatten)]
        out: Outputs,
    },
    /// Show what changed between two runs (their --json reports), cell by cell.
    Compare {
        /// The earlier run.
        a: PathBuf,
        /// The later run.
        b: PathBuf,
        /// Cells whose median moved by more than this percentage are listed.
        #[arg(long, default_value_t = 5.0, value_parser = crate::usage::range(0.0, 10_000.0, "percent"))]
        threshold: f64,
        /// Exit with status 1 when a cell got slower by more than the threshold.
        #[arg(long)]
        fail_on_slower: bool,
    },
    /// Keep one of STAND's load emulators running (`cpu:N`, `tlb[:MIB]`, `memory:N[@nodeK]`)
    /// until interrupted or for --seconds: a competing load for something else on this
    /// machine, such as a backup.
    Load {
        /// The load, as a plan's `loads` name it.
        load: String,
        /// Stop after this many seconds (default: run until killed).
        #[arg(long, value_parser = crate::usage::range(0.001, 31_536_000.0, "seconds"))]
        seconds: Option<f64>,
    },
    /// Draw the plots of a run from its --json report.
    Plot {
        /// The report.
        report: PathBuf,
        /// The directory for the SVG and PNG files.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct Outputs {
    /// Also write every cell as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write every cell as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Also draw the plots (SVG and PNG) into this directory: time per block against block
    /// size for each algorithm, operation, pattern and load, and latency histograms.
    #[arg(long)]
    plots: Option<PathBuf>,
}

/// `qsm stand load`: the emulator's threads run until the time is up or the process is killed.
fn run_load(text: &str, seconds: Option<f64>) -> Result<()> {
    let load = qsm_stand::load::Load::parse(text)
        .map_err(|e| crate::usage::usage(format!("load {text}: {e}")))?;
    // No measured thread: CPU threads float over every core the process may use.
    let running = qsm_stand::load::start(&load, None, &qsm_stand::load::cpus())
        .map_err(|e| anyhow::anyhow!("load {text}: {e}"))?;
    errln!("load {} running (pid {}); stop it with Ctrl-C", load.name(), std::process::id());
    match seconds {
        Some(s) => std::thread::sleep(std::time::Duration::from_secs_f64(s)),
        None => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
    }
    running.stop();
    Ok(())
}

/// A report named on the command line: one that cannot be read, or is not a report, is bad
/// usage.
fn read_report(path: &std::path::Path) -> Result<Report> {
    let bad = |why: String| crate::usage::usage(format!("{}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not a qsm stand --json report: {e}")))
}

fn plots(report: &Report, dir: &std::path::Path) -> Result<()> {
    let files = qsm_stand::plot::all(report, dir)?;
    outln!("{} plot files written to {}", files.len(), dir.display());
    Ok(())
}

pub fn stand(cmd: StandCommand) -> Result<bool> {
    let (plan, out) = match cmd {
        StandCommand::Run { plan, out } => {
            // A plan that cannot be read or is not a valid plan: bad usage, before any work.
            let text = std::fs::read_to_string(&plan).map_err(|e| {
                crate::usage::usage(format!("reading the plan {}: {e}", plan.display()))
            })?;
            let parsed = Plan::parse(&text, &plan.to_string_lossy())
                .map_err(|e| crate::usage::usage(e.to_string()))?;
            (parsed, out)
        }
        StandCommand::Quick { out } => (Plan::quick(), out),
        StandCommand::Compare { a, b, threshold, fail_on_slower } => {
            return compare(&read_report(&a)?, &read_report(&b)?, threshold, fail_on_slower);
        }
        StandCommand::Plot { report, out } => {
            plots(&read_report(&report)?, &out)?;
            return Ok(true);
        }
        StandCommand::Load { load, seconds } => {
            run_load(&load, seconds)?;
            return Ok(true);
        }
    };
    let table = qsm_stand::table::Table::of(&plan);
    outln!("{}", table.header());
    let rounds = plan.rounds;
    let mut on_round = |round: u32, cells: usize| {
        if rounds > 1 {
            // Cells are printed in the last round; say what the earlier ones are doing.
            errln!("qsm stand: round {round} of {rounds}, {cells} cells");
        }
    };
    let report = qsm_stand::measure::run_with(
        &plan,
        &mut |c: &Cell| {
            outln!("{}", table.row(c));
        },
        &mut on_round,
    )?;
    outln!(
        "timer overhead {} ns per reading (two clock reads); every output verified",
        report.timer_overhead_ns
    );
    outln!("machine: {}", report.environment.line());
    // One line for every cell too fast to time alone, rather than one warning per cell.
    if let Some(line) = report.batching() {
        outln!("{line}");
    }
    for w in &report.warnings {
        errln!("qsm: warning: {w}");
    }
    if let Some(path) = &out.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &out.csv {
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let mut csv = String::from(
            "algorithm,operation,block_size,pattern,load,slowdown,samples,min_ns,mean_ns,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,stddev_ns,mb_per_s,ratio,blocks_per_reading\n",
        );
        for c in &report.cells {
            let s = &c.stats;
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{},{:.1},{},{},{},{},{},{:.1},{:.2},{},{}\n",
                c.algorithm,
                c.operation,
                c.block_size,
                c.pattern,
                c.load,
                c.slowdown.map(|x| format!("{x:.4}")).unwrap_or_default(),
                s.samples,
                s.min_ns,
                s.mean_ns,
                s.p50_ns,
                // Empty where there are too few readings for the percentile.
                opt(s.p90_ns),
                opt(s.p99_ns),
                opt(s.p999_ns),
                s.max_ns,
                s.stddev_ns,
                c.mb_per_s,
                c.ratio.map(|r| format!("{r:.4}")).unwrap_or_default(),
                c.blocks_per_reading
            ));
        }
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &out.plots {
        plots(&report, dir)?;
    }
    Ok(true)
}

fn compare(a: &Report, b: &Report, threshold: f64, fail_on_slower: bool) -> Result<bool> {
    let c = Comparison::of(a, b);
    for e in &c.environment {
        outln!("machine changed: {e}");
    }
    let beyond = c.beyond(threshold);
    if !beyond.is_empty() {
        outln!("{:<56} {:>10} {:>10} {:>8}", "cell (median per block)", "A µs", "B µs", "change");
    }
    for ch in &beyond {
        outln!(
            "{:<56} {:>10.2} {:>10.2} {:>+7.1}%",
            ch.cell,
            ch.p50.0 as f64 / 1e3,
            ch.p50.1 as f64 / 1e3,
            ch.p50_change_pct
        );
    }
    for k in &c.only_a {
        outln!("only in A: {k}");
    }
    for k in &c.only_b {
        outln!("only in B: {k}");
    }
    let (median, max) = c.spread();
    let (min_median, min_max) = c.min_spread();
    let slower = beyond.iter().filter(|ch| ch.p50_change_pct > 0.0).count();
    outln!(
        "{} cells in both: {} slower and {} faster by more than {threshold}%; medians moved by {median:.1}% (median) and {max:.1}% (largest)",
        c.changes.len(),
        slower,
        beyond.len() - slower
    );
    outln!(
        "fastest blocks moved by {min_median:.1}% (median) and {min_max:.1}% (largest): medians that moved while these did not point at a busy machine, not a change"
    );
    if fail_on_slower && slower > 0 {
        anyhow::bail!("{slower} cells slower by more than {threshold}% (--fail-on-slower)");
    }
    Ok(true)
}
