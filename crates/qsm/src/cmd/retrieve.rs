//! `qsm retrieve`: one archive, by description or id.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use qsm_client::Selection;
use qsm_client::server::Server;
use qsm_types::time::format_time;

use crate::conn::Conn;

use super::Complete;
use super::restore::*;

#[derive(Debug, Args)]
pub struct RetrieveArgs {
    /// An archived directory or file.
    path: PathBuf,
    /// The archive with this description; of several, the newest (default, with no --id:
    /// the newest archive of each path, whatever its description).
    #[arg(long, short = 'd')]
    description: Option<String>,
    /// The archive with this id (the `archive` column of `qsm query archive`).
    #[arg(long, value_parser = crate::usage::range(1, i64::MAX, "(an archive id)"))]
    id: Option<i64>,
    /// Retrieve into this directory instead of the original location.
    #[arg(long)]
    to: Option<PathBuf>,
    /// The node's key file, for encrypted archives (as for restore).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Refuse any file whose data is not encrypted (as for restore).
    #[arg(long)]
    require_encryption: bool,
    #[command(flatten)]
    existing: ExistingArgs,
    /// Wait until what was retrieved is on disk before reporting success (`syncfs`).
    #[arg(long)]
    sync: bool,
    /// Worker threads decoding and writing (default: one per core).
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Conn,
}

/// The one archive `retrieve` takes for `-d` and `--id` (`qsm_client::archives::pick`),
/// saying which it took when there was a choice.
pub(crate) fn pick_archive(
    server: &dyn Server,
    path: &Path,
    description: Option<&str>,
    id: Option<i64>,
) -> Result<Selection> {
    let pick = qsm_client::archives::pick(server, path, description, id)?;
    if !pick.older.is_empty() {
        let older: Vec<String> =
            pick.older.iter().map(|a| format!("{} of {}", a.id.0, format_time(a.date))).collect();
        errln!(
            "qsm: {} archives of {} are described {:?}: retrieving the newest, archive {} of {} (older: {}; choose one with --id)",
            pick.older.len() + 1,
            path.display(),
            description.unwrap_or_default(),
            pick.archive.id.0,
            format_time(pick.archive.date),
            older.join(", ")
        );
    }
    Ok(Selection::Archive(pick.archive.objects))
}

pub fn retrieve(args: RetrieveArgs) -> Result<Complete> {
    let connected = args.home.open()?;
    let (keys, require_sealed) = restore_protection(
        &args.home,
        args.key_file.clone(),
        args.require_encryption,
        connected.server().as_ref(),
    )?;
    let select = if args.description.is_some() || args.id.is_some() {
        pick_archive(connected.server().as_ref(), &args.path, args.description.as_deref(), args.id)?
    } else {
        Selection::Archives(None)
    };
    restore_with(
        connected.server().as_ref(),
        RestoreRequest {
            path: &args.path,
            to: args.to.as_deref(),
            existing: args.existing.existing(),
            json: args.json,
            select,
            verb: "retrieving",
            keys,
            require_sealed,
            filter: qsm_client::Filter::default(),
            dry_run: false,
            tar: None,
            sync: args.sync,
            threads: crate::usage::threads(args.threads)?,
        },
    )
}
