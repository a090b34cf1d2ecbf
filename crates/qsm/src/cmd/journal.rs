//! `qsm journal`: the change-journal daemon and its status.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use qsm_client::journal;
use qsm_types::time::format_time;

use crate::render::{Text, emit};

#[derive(Debug, Args)]
pub struct JournalArgs {
    #[command(subcommand)]
    command: JournalCommand,
    /// The journal database (default: $QSM_JOURNAL, or ~/.local/state/qsm/journal.db).
    #[arg(long, global = true)]
    journal: Option<PathBuf>,
}

// Parsed once per run: the size of the larger variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum JournalCommand {
    /// Watch these trees and record what changes in them, until stopped (SIGINT, SIGTERM).
    /// `qsm backup` of a watched tree then sends what the journal lists instead of scanning,
    /// from the second backup after the daemon started on.
    Start {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// The journaled trees: valid or why not, how many changes wait for a backup, and what
    /// the next backup will do (use the journal or scan, and why), asked of the configured
    /// server or embedded store; for a backup with other patterns, give them here too.
    Status {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        patterns: crate::cmd::Patterns,
        #[command(flatten)]
        home: crate::conn::Conn,
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
            let stop = Arc::new(AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(signal, Arc::clone(&stop))
                    .context("watching for SIGINT and SIGTERM")?;
            }
            journal::run_daemon(&path, &paths, &stop, |roots| {
                outln!("qsm journal: watching {} (journal {})", roots.join(", "), path.display());
            })?;
            Ok(true)
        }
        JournalCommand::Status { json, patterns, home } => {
            // Bad patterns or configuration are refused whether or not there is a journal.
            let fingerprint = crate::cmd::backup::patterns_fingerprint(&home.config()?, &patterns)?;
            if !path.exists() {
                outln!("No journal at {}.", path.display());
                return Ok(true);
            }
            let j = journal::Journal::open(&path)?;
            let running = journal::daemon_running(&path);
            // The server a backup would use, and the generations of its filespaces: not
            // opened (or created) when nothing is configured and no embedded store exists.
            let asked: Option<journal::Asked> = match home.has_store() {
                Ok(true) => Some(match home.open() {
                    Ok(connected) => {
                        let server = connected.server();
                        server
                            .filespaces()
                            .map(|f| (server.describe(), f))
                            .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(format!("{e:#}")),
                }),
                _ => None,
            };
            let roots = journal::status_report(&j, running, asked.as_ref(), &fingerprint)?;
            emit(&Status { path: &path, running, roots }, json)?;
            Ok(true)
        }
    }
}

/// `qsm journal status`: the roots, or in JSON just them.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Status<'a> {
    #[serde(skip)]
    path: &'a Path,
    #[serde(skip)]
    running: bool,
    roots: Vec<journal::RootReport>,
}

impl Text for Status<'_> {
    fn text(&self) {
        outln!(
            "Journal {}: daemon {}.",
            self.path.display(),
            if self.running { "running" } else { "not running" }
        );
        for r in &self.roots {
            let state = if !self.running {
                "stale".to_owned()
            } else if r.valid {
                "valid".to_owned()
            } else {
                format!("incomplete: {}", r.reason)
            };
            outln!(
                "  {}: {state}, since {}, {} changes pending",
                r.root,
                format_time(r.since),
                r.pending
            );
            for n in &r.next_backup {
                match n.changes {
                    Some(c) => outln!(
                        "    next backup to {}: uses the journal ({c} changes): {}",
                        n.server,
                        n.why
                    ),
                    None => outln!("    next backup to {}: scans: {}", n.server, n.why),
                }
            }
        }
    }
}
