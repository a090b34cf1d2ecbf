//! `qsm query filespace | backup | archive`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Subcommand;
use qsm_client::report::{self, FilespaceRow, VersionRow, absolute};
use qsm_types::model::{ObjectKind, ObjectVersion};
use qsm_types::time::format_time;

use crate::conn::Conn;
use crate::render::{Text, emit};

use super::Complete;

#[derive(Debug, Subcommand)]
pub enum QueryWhat {
    /// The archives of a filespace (all filespaces when none is named).
    Archive {
        /// An archived directory or file, or a path below one: the archives at and below it.
        filespace: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        home: Conn,
    },
    /// The filespaces backed up.
    Filespace {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        home: Conn,
    },
    /// The backup versions of a filespace (all filespaces when none is named): active ones,
    /// or with --inactive every version with its id, for `qsm restore --id`.
    Backup {
        /// A backed-up directory or file, or a path below one: the versions at and below it.
        filespace: Option<PathBuf>,
        /// List inactive versions too.
        #[arg(long)]
        inactive: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        home: Conn,
    },
}

pub fn query(what: QueryWhat) -> Result<Complete> {
    match what {
        QueryWhat::Filespace { json, home } => {
            let connected = home.open()?;
            emit(&report::filespaces(connected.server().as_ref())?[..], json)?;
        }
        QueryWhat::Backup { filespace, inactive, json, home } => {
            let none = if inactive {
                "no backup version"
            } else {
                "no active backup version (`--inactive` lists the others)"
            };
            list_versions(home, filespace, json, false, none, &|v| {
                v.kind == ObjectKind::Backup && (inactive || v.active)
            })?;
        }
        QueryWhat::Archive { filespace, json, home } => {
            let keep = |v: &ObjectVersion| v.kind == ObjectKind::Archive;
            list_versions(home, filespace, json, true, "no archive", &keep)?;
        }
    }
    Ok(true)
}

pub(crate) fn list_versions(
    home: Conn,
    path: Option<PathBuf>,
    json: bool,
    archives: bool,
    none: &str,
    keep: &dyn Fn(&ObjectVersion) -> bool,
) -> Result<()> {
    let connected = home.open()?;
    let rows = report::versions(connected.server().as_ref(), path.as_deref(), archives, keep)?;
    // A path that lists nothing says so: a typo must not look like an empty directory.
    if let (Some(path), true) = (&path, rows.is_empty()) {
        bail!("{none} at or below {}", absolute(path)?.display());
    }
    emit(&rows[..], json)
}

impl Text for [VersionRow] {
    fn text(&self) {
        for r in self {
            let mut note = r.description.as_deref().map(|d| format!("  [{d}]")).unwrap_or_default();
            if let (Some(id), Some(date)) = (r.archive, r.archived) {
                note.push_str(&format!("  archive {id} of {}", format_time(date)));
            }
            outln!(
                "{:>8}  {:<8} {:<8} {:>12}  {}/{}{note}",
                r.id,
                r.state,
                r.kind,
                r.size,
                r.filespace,
                r.path
            );
        }
    }
}

impl Text for [FilespaceRow] {
    fn text(&self) {
        for f in self {
            if f.node.is_empty() {
                outln!("{}", f.name);
            } else {
                outln!("{}: {}", f.node, f.name);
            }
            outln!("    last backup: {}", run_text(f.last_backup.as_ref()));
            if f.last_completed != f.last_backup {
                outln!("    last completed: {}", run_text(f.last_completed.as_ref()));
            }
        }
    }
}

/// A backup run on one line: when, how it ended, what it committed.
fn run_text(run: Option<&report::RunRow>) -> String {
    let Some(r) = run else { return "never".into() };
    let mut text = format!(
        "{} to {}, {}: {} objects, {} bytes",
        format_time(r.started),
        format_time(r.ended),
        r.result,
        r.objects,
        r.bytes
    );
    if r.warnings > 0 {
        text += &format!(", {} files skipped", r.warnings);
    }
    text
}
