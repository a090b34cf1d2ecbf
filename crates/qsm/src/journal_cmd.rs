//! `qsm journal`: the change-journal daemon and its status.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use qsm_client::journal;

#[derive(Debug, Args)]
pub struct JournalArgs {
    #[command(subcommand)]
    command: JournalCommand,
    /// The journal database (default: $QSM_JOURNAL, or ~/.local/state/qsm/journal.db).
    #[arg(long, global = true)]
    journal: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum JournalCommand {
    /// Watch these trees and record what changes in them, until stopped (SIGINT, SIGTERM).
    /// `qsm backup` of a watched tree then sends what the journal lists instead of scanning,
    /// from the second backup after the daemon started on.
    Start { paths: Vec<PathBuf> },
    /// The journaled trees: valid or why not, and how many changes wait for a backup.
    Status {
        #[arg(long)]
        json: bool,
    },
}

/// The journal a command uses: the one given, or the default.
pub fn journal_path(given: Option<PathBuf>) -> Result<PathBuf> {
    given
        .or_else(journal::default_path)
        .context("no journal: give --journal FILE, or set QSM_JOURNAL or HOME")
}

pub fn journal(args: JournalArgs) -> Result<bool> {
    let path = journal_path(args.journal)?;
    match args.command {
        JournalCommand::Start { paths } => {
            anyhow::ensure!(!paths.is_empty(), "name at least one directory to journal");
            let stop = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(signal, Arc::clone(&stop))
                    .context("watching for SIGINT and SIGTERM")?;
            }
            journal::run_daemon(&path, &paths, &stop, |roots| {
                println!("qsm journal: watching {} (journal {})", roots.join(", "), path.display());
            })?;
            Ok(true)
        }
        JournalCommand::Status { json } => {
            if !path.exists() {
                println!("No journal at {}.", path.display());
                return Ok(true);
            }
            let j = journal::Journal::open(&path)?;
            let running = journal::daemon_running(&path);
            let roots = j.status()?;
            if json {
                let rows: Vec<_> = roots
                    .iter()
                    .map(|r| serde_json::json!({"root": r.root, "valid": r.valid && running, "reason": if running { r.reason.clone() } else { "the journal daemon is not running".into() }, "since": r.since, "pending": r.pending}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "Journal {}: daemon {}.",
                    path.display(),
                    if running { "running" } else { "not running" }
                );
                for r in roots {
                    let state = if !running {
                        "stale".to_owned()
                    } else if r.valid {
                        "valid".to_owned()
                    } else {
                        format!("incomplete: {}", r.reason)
                    };
                    println!(
                        "  {}: {state}, since {}, {} changes pending",
                        r.root,
                        crate::client_cmd::format_time(r.since),
                        r.pending
                    );
                }
            }
            Ok(true)
        }
    }
}
