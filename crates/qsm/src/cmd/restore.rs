//! `qsm restore`: a backed-up tree or file, as it is now or as it was, into place or elsewhere.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use qsm_client::report::{RestorePlan, RestoreReport, absolute, locate};
use qsm_client::restore::Existing;
use qsm_client::server::Server;
use qsm_client::{RestoreOptions, Selection};
use qsm_types::model::ObjectId;
use qsm_types::time::parse_time;
use serde::Serialize;

use crate::cmd::key::KeyUse;
use crate::conn::Conn;
use crate::render::{Text, emit, mb};

use super::Complete;

/// What to do where a restored file exists.
#[derive(Debug, Args)]
pub struct ExistingArgs {
    /// Replace files that exist (default: skip them).
    #[arg(long, conflicts_with = "rename")]
    replace: bool,
    /// Keep files that exist and restore beside them as NAME.restored (NAME.restored.2, ...).
    #[arg(long)]
    rename: bool,
}

impl ExistingArgs {
    pub(crate) fn existing(&self) -> Existing {
        match (self.replace, self.rename) {
            (true, _) => Existing::Replace,
            (_, true) => Existing::Rename,
            _ => Existing::Skip,
        }
    }
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// A backed-up directory or file (its absolute path at backup time, or relative to here).
    path: PathBuf,
    /// Restore into this directory instead of the original location.
    #[arg(long)]
    to: Option<PathBuf>,
    #[command(flatten)]
    existing: ExistingArgs,
    /// Restore the versions that were active at this time (UTC): "2026-11-22 14:30",
    /// "2026-11-22T14:30:00", "2026-11-22", or "@SECONDS" since the epoch.
    #[arg(long, value_parser = parse_time, conflicts_with = "id")]
    pit: Option<i64>,
    /// Restore one version by id, active or not (ids from `qsm query backup --inactive`).
    #[arg(long, value_parser = crate::usage::range(1, i64::MAX, "(a version id)"))]
    id: Option<i64>,
    /// The node's key file, for encrypted backups (default: `key_file` in client.toml,
    /// $QSM_KEY_FILE, or ~/.config/qsm/key; fetched from the server if none is here).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Refuse any file whose data is not encrypted (`require_encryption` in client.toml): a
    /// server cannot then substitute plaintext of its choosing for encrypted data. Files
    /// backed up before encryption was turned on fail too.
    #[arg(long)]
    require_encryption: bool,
    /// Restore only what matches (repeatable), in the backup's pattern language: a name at
    /// any depth (`*.conf`), a path below the filespace root (`etc/ssh`), an absolute path
    /// (`/home/*/.ssh`); a trailing `/` matches directories only. Directories on the way are
    /// restored too.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Leave out what matches (repeatable; same patterns); an excluded directory takes
    /// everything below it. An exclude beats an include.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// List what would be restored, with sizes; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Conn,
}

pub(crate) struct RestoreRequest<'a> {
    pub(crate) path: &'a Path,
    pub(crate) to: Option<&'a Path>,
    pub(crate) existing: Existing,
    pub(crate) json: bool,
    pub(crate) select: Selection,
    pub(crate) verb: &'static str,
    pub(crate) keys: Option<std::sync::Arc<qsm_client::keys::NodeKeys>>,
    pub(crate) require_sealed: bool,
    /// `--include` and `--exclude`.
    pub(crate) filter: qsm_client::Filter,
    /// `--dry-run`.
    pub(crate) dry_run: bool,
}

/// The node's keys for a restore or retrieve: opened when there is a key (here or on the
/// server) and a passphrase can be had, before anything is written, so a wrong passphrase
/// stops it at once. Required when the configuration says encryption is on. Also whether
/// plaintext data is refused (`--require-encryption`, or `require_encryption`).
pub(crate) fn restore_protection(
    home: &Conn,
    key_file: Option<PathBuf>,
    require_flag: bool,
    server: &dyn Server,
) -> Result<(Option<std::sync::Arc<qsm_client::keys::NodeKeys>>, bool)> {
    let config = home.config()?;
    let required = config.encryption.unwrap_or(false);
    let keys = crate::cmd::key::node_keys(
        key_file.or(config.key_file),
        config.cipher.as_deref(),
        server,
        KeyUse::Restore { required },
    )?;
    Ok((keys, require_flag || config.require_encryption == Some(true)))
}

/// A restore's report with what was asked, for the text (the JSON is the report's).
#[derive(Serialize)]
pub(crate) struct Restored<'a> {
    #[serde(skip)]
    verb: &'a str,
    #[serde(skip)]
    path: &'a Path,
    #[serde(flatten)]
    report: RestoreReport,
}

impl Text for Restored<'_> {
    fn text(&self) {
        let s = &self.report;
        outln!(
            "{} of {} into {}: restored {}{}, skipped {} (existing), failed {}, {:.1} MB in \
             {:.1} s ({:.0} MB/s, {:.0} entries/s){}",
            if self.verb == "retrieving" { "Retrieve" } else { "Restore" },
            self.path.display(),
            s.target,
            s.restored,
            if s.renamed > 0 {
                format!(" ({} beside existing files)", s.renamed)
            } else {
                String::new()
            },
            s.skipped,
            s.failed,
            mb(s.bytes),
            s.seconds,
            mb(s.bytes_per_second as u64),
            s.entries_per_second,
            match s.leftovers_removed {
                0 => String::new(),
                n => format!("; removed {n} temporary files left by interrupted restores"),
            }
        );
        if s.incomplete > 0 {
            outln!("  {} restored without some of their metadata (see the warnings)", s.incomplete);
        }
    }
}

pub(crate) fn restore_with(server: &dyn Server, r: RestoreRequest<'_>) -> Result<Complete> {
    let (filespace, subpath) = locate(server, r.path)?;
    let target = match r.to {
        Some(t) => absolute(t)?,
        None => PathBuf::from(&filespace),
    };
    let options = RestoreOptions {
        subpath,
        existing: r.existing,
        select: r.select,
        threads: None,
        keys: r.keys,
        require_sealed: r.require_sealed,
        filter: r.filter,
    };
    if r.dry_run {
        let selected = qsm_client::restore::select(server, &filespace, &options)
            .with_context(|| format!("{} {}", r.verb, r.path.display()))?;
        emit(&RestorePlan::new(&selected, &filespace, &target), r.json)?;
        return Ok(true);
    }
    let started = std::time::Instant::now();
    let s = qsm_client::restore(server, &filespace, &target, &options)
        .with_context(|| format!("{} {}", r.verb, r.path.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    for w in &s.warnings {
        errln!("qsm: warning: {w}");
    }
    let report = RestoreReport::new(&s, &filespace, &target, seconds);
    emit(&Restored { verb: r.verb, path: r.path, report }, r.json)?;
    // Every file failed: the restore failed (exit 1), not partly succeeded (exit 4).
    if s.all_failed() {
        bail!(
            "{} {}: nothing restored, every file failed (see the warnings)",
            r.verb,
            r.path.display()
        );
    }
    Ok(s.failed == 0)
}

pub fn restore(args: RestoreArgs) -> Result<Complete> {
    // Patterns that cannot work are refused before anything is asked or opened.
    let filter = qsm_client::Filter::new(&args.include, &args.exclude)?;
    let connected = args.home.open()?;
    // A dry run reads no data: it needs no key.
    let (keys, require_sealed) = if args.dry_run {
        (None, false)
    } else {
        restore_protection(
            &args.home,
            args.key_file.clone(),
            args.require_encryption,
            connected.server().as_ref(),
        )?
    };
    let select = match (args.pit, args.id) {
        (Some(t), _) => Selection::AsOf(t),
        (None, Some(id)) => Selection::Version(ObjectId(id)),
        (None, None) => Selection::Active,
    };
    restore_with(
        connected.server().as_ref(),
        RestoreRequest {
            path: &args.path,
            to: args.to.as_deref(),
            existing: args.existing.existing(),
            json: args.json,
            select,
            verb: "restoring",
            keys,
            require_sealed,
            filter,
            dry_run: args.dry_run,
        },
    )
}

impl Text for RestorePlan {
    fn text(&self) {
        for e in &self.entries {
            let path = if e.name.path.is_empty() { "." } else { e.name.path.as_str() };
            outln!("{:<10} {:>12}  {path}", e.kind, e.size);
        }
        outln!(
            "Would restore {} entries ({:.1} MB of file data) of {} into {}; nothing was written.",
            self.count,
            mb(self.bytes),
            self.filespace,
            self.target
        );
    }
}
