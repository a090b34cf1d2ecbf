//! `qsm stand run PLAN.toml` and `qsm stand quick`: block algorithms measured block by block.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use qsm_stand::Plan;
use qsm_stand::measure::Cell;

#[derive(Debug, Subcommand)]
pub enum StandCommand {
    /// Run a plan file (see examples/stand/).
    Run {
        /// The plan (TOML).
        plan: PathBuf,
        #[command(flatten)]
        out: Outputs,
    },
    /// Run the built-in plan: lz4, zstd:1, zstd:3, lzo and quicklz over 4, 16 and 64 KiB
    /// blocks of random, zero and half-compressible data.
    Quick {
        #[command(flatten)]
        out: Outputs,
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
}

pub fn stand(cmd: StandCommand) -> Result<bool> {
    let (plan, out) = match cmd {
        StandCommand::Run { plan, out } => {
            let text = std::fs::read_to_string(&plan)
                .with_context(|| format!("reading the plan {}", plan.display()))?;
            (Plan::parse(&text, &plan.to_string_lossy())?, out)
        }
        StandCommand::Quick { out } => (Plan::quick(), out),
    };
    println!(
        "{:<10} {:<10} {:>6} {:<16} {:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8}",
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
        "slowdown"
    );
    let us = |ns: f64| ns / 1e3;
    let report = qsm_stand::run(&plan, &mut |c: &Cell| {
        println!(
            "{:<10} {:<10} {:>6} {:<16} {:<14} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.0} {:>6.2} {:>8}",
            c.algorithm,
            c.operation,
            size(c.block_size),
            c.pattern,
            c.load,
            us(c.stats.min_ns as f64),
            us(c.stats.mean_ns),
            us(c.stats.p50_ns as f64),
            us(c.stats.p99_ns as f64),
            us(c.stats.p999_ns as f64),
            us(c.stats.max_ns as f64),
            c.mb_per_s,
            c.ratio,
            c.slowdown.map(|x| format!("{x:.2}x")).unwrap_or_else(|| "-".into())
        );
    })?;
    println!(
        "timer overhead {} ns per sample (two clock reads); every output verified",
        report.timer_overhead_ns
    );
    println!("machine: {}", report.environment.line());
    for w in &report.warnings {
        eprintln!("qsm: warning: {w}");
    }
    if let Some(path) = &out.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &out.csv {
        let mut csv = String::from(
            "algorithm,operation,block_size,pattern,load,slowdown,samples,min_ns,mean_ns,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,stddev_ns,mb_per_s,ratio\n",
        );
        for c in &report.cells {
            let s = &c.stats;
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{},{:.1},{},{},{},{},{},{:.1},{:.2},{:.4}\n",
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
                s.p90_ns,
                s.p99_ns,
                s.p999_ns,
                s.max_ns,
                s.stddev_ns,
                c.mb_per_s,
                c.ratio
            ));
        }
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(true)
}

fn size(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes.is_multiple_of(1024) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}
