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
            let roots = j.status()?;
            let next = next_backups(&j, &roots, &home, &fingerprint)?;
            if json {
                let rows: Vec<_> = roots
                    .iter()
                    .zip(&next)
                    .map(|(r, next)| {
                        let next: Vec<_> = next.iter().map(|n| serde_json::json!({"server": n.server, "uses_journal": n.changes.is_some(), "changes": n.changes, "why": n.why})).collect();
                        serde_json::json!({"root": r.root, "valid": r.valid && running, "reason": if running { r.reason.clone() } else { "the journal daemon is not running".into() }, "since": r.since, "pending": r.pending, "next_backup": next})
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                outln!(
                    "Journal {}: daemon {}.",
                    path.display(),
                    if running { "running" } else { "not running" }
                );
                for (r, next) in roots.iter().zip(&next) {
                    let state = if !running {
                        "stale".to_owned()
                    } else if r.valid {
                        "valid".to_owned()
                    } else {
                        format!("incomplete: {}", r.reason)
                    };
                    outln!(
                        "  {}: {state}, since {}, {} changes pending",
                        r.root,
                        qsm_types::time::format_time(r.since),
                        r.pending
                    );
                    for n in next {
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
            Ok(true)
        }
    }
}

/// What the next backup of a journaled root to one server will do.
struct NextBackup {
    /// The server, as backups record it (`Server::describe`).
    server: String,
    /// The journal's changes it will send, if it uses the journal.
    changes: Option<usize>,
    /// Why it scans (or that it uses the journal).
    why: String,
}

/// What the next backup of each of `roots` will do, as `Journal::plan` decides it for that
/// backup: with the configured server's (or embedded store's) filespace generation when it
/// can be asked; otherwise for each server a backup consumed the journal for, assuming its
/// inventory is as that backup left it (said in `why`).
fn next_backups(
    j: &journal::Journal,
    roots: &[journal::RootStatus],
    home: &crate::conn::Conn,
    patterns: &str,
) -> Result<Vec<Vec<NextBackup>>> {
    let describe = |plan: journal::Plan, server: String, assumed: Option<&str>| match plan {
        journal::Plan::Journal { changes, .. } => NextBackup {
            server,
            changes: Some(changes.len()),
            why: match assumed {
                Some(a) => format!("the journal is valid, {a}"),
                None => "the journal is valid".into(),
            },
        },
        journal::Plan::Scan { why, .. } => NextBackup { server, changes: None, why },
    };
    // The server a backup would use, and the generations of its filespaces: not opened (or
    // created) when nothing is configured and no embedded store exists.
    let asked = match home.has_store() {
        Ok(true) => match home.open() {
            Ok(connected) => {
                let server = connected.server();
                let filespaces = server.filespaces().map_err(qsm_client::ClientError::from);
                Some(filespaces.map(|f| (server.describe(), f)))
            }
            Err(e) => Some(Err(qsm_client::ClientError::Invalid(format!("{e:#}")))),
        },
        _ => None,
    };
    let mut all = Vec::with_capacity(roots.len());
    for r in roots {
        let mut next = Vec::new();
        match &asked {
            Some(Ok((server, filespaces))) => match filespaces.iter().find(|f| f.name == r.root) {
                Some(f) => {
                    let plan = j.plan(&r.root, server, f.generation, patterns)?;
                    next.push(describe(plan, server.clone(), None));
                }
                None => next.push(NextBackup {
                    server: server.clone(),
                    changes: None,
                    why: format!("{} was never backed up there", r.root),
                }),
            },
            _ => {
                let cannot = match &asked {
                    Some(Err(e)) => format!("if its inventory is unchanged (cannot ask: {e})"),
                    _ => "if its inventory is unchanged (no server or store to ask)".into(),
                };
                let consumers = j.consumers(&r.root)?;
                if consumers.is_empty() {
                    let plan = j.plan(&r.root, "", 0, patterns)?;
                    next.push(describe(plan, "any server".into(), None));
                }
                for (server, generation) in consumers {
                    let plan = j.plan(&r.root, &server, generation, patterns)?;
                    next.push(describe(plan, server, Some(&cannot)));
                }
            }
        }
        all.push(next);
    }
    Ok(all)
}
