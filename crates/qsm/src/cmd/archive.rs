//! `qsm archive`: a described, retained copy of paths.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use qsm_client::report::ArchiveReport;
use qsm_client::server::Server;
use qsm_types::time::format_time;

use crate::conn::Conn;
use crate::render::{Text, emit, mb};

use super::Complete;
use super::send::*;

#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// Directories or files to archive (all of them, whatever the backups hold).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// What this archive is, to retrieve it by.
    #[arg(long, short = 'd')]
    description: String,
    /// Days to keep it, if longer than its management class keeps archives (the class's
    /// archive copy group decides otherwise: 365 days unless the administrator changed it), or
    /// nolimit.
    #[arg(long, value_parser = crate::usage::or_nolimit(0, "days"))]
    retain_days: Option<u32>,
    /// The management class of what no --mgmtclass binding names (TSM's ARCHMC; default: the
    /// domain's default class); its archive copy group's retention applies.
    #[arg(long, value_name = "CLASS")]
    archmc: Option<String>,
    /// Compression: auto (the default: adaptive per quantum, as for backup), auto:fast,
    /// auto:small, off, or CODEC[:LEVEL].
    #[arg(long)]
    compression: Option<String>,
    #[command(flatten)]
    patterns: Patterns,
    #[command(flatten)]
    protect: Protect,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Conn,
}

pub fn archive(args: ArchiveArgs) -> Result<Complete> {
    let connected = args.home.open()?;
    let mut server_options = server_options(&connected)?;
    let config = server_options.apply(args.home.config()?);
    server_options.flags_given(&args.protect.flags_given());
    if args.compression.is_some() {
        server_options.flags_given(&["compression"]);
    }
    let compression =
        unless_forced(&server_options, "compression", args.compression.as_deref(), "--compression");
    let mut options = backup_options(&config, compression, None, &args.patterns)?;
    options.default_class = args.archmc.clone();
    args.protect.apply(&config, &server_options, &connected, &args.home, &mut options)?;
    if !args.json {
        say_server_options(&server_options);
    }
    let server = connected.server();
    // The retention the server will enforce: the class's, lengthened by --retain-days only.
    let classes = server.mgmt_classes()?;
    let days =
        qsm_client::server::archive_retention(&classes, args.archmc.as_deref(), args.retain_days);
    let kept = match days {
        qsm_types::model::NO_LIMIT => "kept without limit".to_owned(),
        d => format!("kept {d} days"),
    };
    if let Some(asked) = args.retain_days.filter(|asked| *asked < days) {
        errln!(
            "qsm: warning: --retain-days {asked} cannot shorten the management class's archive retention: {kept}"
        );
    }
    let description = args.description.clone();
    for path in &args.paths {
        warn_reused(server.as_ref(), path, &args.description)?;
    }
    let summaries = each_path(
        &args.paths,
        args.json,
        "archiving",
        &mut |path, progress| {
            qsm_client::archive(
                server.as_ref(),
                path,
                &args.description,
                args.retain_days,
                &options,
                progress,
            )
        },
        &|s| ArchiveReport::new(s, &description, days).text(),
    )?;
    let reports: Vec<ArchiveReport> =
        summaries.iter().map(|s| ArchiveReport::new(s, &description, days)).collect();
    if args.json {
        emit(&reports[..], true)?;
    }
    crate::cmd::backup::note_backups(&summaries);
    Ok(summaries.iter().all(|s| s.failed == 0))
}

/// Warns when the filespace `path` will be archived into already holds archives described
/// `description`: `retrieve -d` then takes the newest alone, and `--id` is needed for another.
pub(crate) fn warn_reused(server: &dyn Server, path: &Path, description: &str) -> Result<()> {
    let (name, same) = qsm_client::archives::described(server, path, description)
        .with_context(|| format!("archiving {}", path.display()))?;
    if let Some(last) = same.last() {
        errln!(
            "qsm: warning: filespace {name} already holds {} archive(s) described {description:?} (the newest: archive {} of {}); `qsm retrieve -d` takes the newest only, `--id` another (ids in `qsm query archive`)",
            same.len(),
            last.id.0,
            format_time(last.date)
        );
    }
    Ok(())
}

impl Text for ArchiveReport {
    fn text(&self) {
        let kept = match self.retain_days {
            qsm_types::model::NO_LIMIT => "kept without limit".to_owned(),
            d => format!("kept {d} days"),
        };
        outln!(
            "Archive of {}{} ({:?}, {kept}): {} objects, {:.1} MB read, {:.1} MB stored, failed {}",
            self.filespace,
            self.subtree
                .as_deref()
                .map(|sub| format!("/{sub} (in filespace {})", self.filespace))
                .unwrap_or_default(),
            self.description,
            self.objects,
            mb(self.bytes_read),
            mb(self.bytes_stored),
            self.failed
        );
    }
}

impl Text for [ArchiveReport] {
    fn text(&self) {
        self.iter().for_each(Text::text);
    }
}
