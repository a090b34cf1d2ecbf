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
use crate::output::Output;
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
    /// Restore into this directory instead of the original location; `-` writes the one
    /// file PATH names to stdout.
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
    /// Wait until what was restored is on disk before reporting success (`syncfs` of the
    /// target's file system). Without it the restore ends, as `cp` and `tar -x` do, with the
    /// last data still in the page cache: a power cut in the next half-minute can lose it.
    #[arg(long, conflicts_with_all = ["dry_run", "tar"])]
    sync: bool,
    /// Worker threads decoding and writing (default: one per core).
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Write what is selected as a tar stream (pax, with owners, modes, times, links,
    /// devices and extended attributes) to FILE, or to stdout with `-`, instead of restoring
    /// files: `qsm restore ~/docs --tar - | ssh host tar -xpf - --xattrs`.
    #[arg(long, value_name = "FILE|-", conflicts_with_all = ["to", "replace", "rename", "dry_run"])]
    tar: Option<PathBuf>,
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
    /// `--tar FILE|-`.
    pub(crate) tar: Option<&'a Path>,
    /// `--sync`.
    pub(crate) sync: bool,
    /// `--threads`.
    pub(crate) threads: Option<usize>,
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
    let to_stdout = r.to == Some(Path::new("-"));
    if !r.dry_run && (to_stdout || r.tar.is_some()) {
        let options = RestoreOptions {
            subpath,
            select: r.select,
            keys: r.keys,
            require_sealed: r.require_sealed,
            filter: r.filter,
            threads: r.threads,
            ..RestoreOptions::default()
        };
        return stream_out(server, &filespace, &options, r.path, r.tar, r.verb);
    }
    let target = match r.to {
        Some(t) => absolute(t)?,
        None => PathBuf::from(&filespace),
    };
    let options = RestoreOptions {
        subpath,
        existing: r.existing,
        select: r.select,
        threads: r.threads,
        keys: r.keys,
        require_sealed: r.require_sealed,
        filter: r.filter,
        sync: r.sync,
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
    crate::metrics_file::note("restored_objects", "Objects restored.", s.restored as f64);
    crate::metrics_file::note("failed_objects", "Objects refused or failed.", s.failed as f64);
    crate::metrics_file::note("written_bytes", "Bytes of file data written.", s.bytes as f64);
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
            tar: args.tar.as_deref(),
            sync: args.sync,
            threads: crate::usage::threads(args.threads)?,
        },
    )
}

/// `--to -` (one file's bytes) or `--tar FILE|-`: the selection streamed, checked as a
/// restore to files is, through an output that appears under its name only when complete.
fn stream_out(
    server: &dyn Server,
    filespace: &str,
    options: &RestoreOptions,
    path: &Path,
    tar: Option<&Path>,
    verb: &str,
) -> Result<Complete> {
    let file = tar.filter(|t| *t != Path::new("-"));
    if let Some(f) = file
        && f.exists()
        && std::fs::metadata(f).is_ok_and(|m| m.is_file())
    {
        return Err(crate::usage::usage(format!(
            "{} already exists: the tar is not written over it",
            f.display()
        )));
    }
    if file.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return Err(crate::usage::usage(
            "refusing to write restored data to a terminal: redirect stdout or pipe it",
        ));
    }
    let what = || format!("{verb} {}", path.display());
    let mut out = Output::open(file, false, false)?;
    let entries = if tar.is_some() {
        let mut sink = qsm_client::tar::TarSink::new(&mut out);
        let n = qsm_client::restore::stream(server, filespace, options, &mut sink)
            .with_context(what)?;
        sink.finish().context("writing the tar stream")?;
        n
    } else {
        // One file: what PATH names must be a file, checked before any byte is written.
        let selected =
            qsm_client::restore::select(server, filespace, options).with_context(what)?;
        let asked: Vec<_> =
            selected.versions.iter().filter(|v| !selected.ancestors.contains(&v.id)).collect();
        if !matches!(asked[..], [v] if v.object_type == qsm_types::model::ObjectType::File) {
            return Err(crate::usage::usage(format!(
                "--to - writes one file's content, and {} is not a file: use --tar - for a tree",
                path.display()
            )));
        }
        let mut sink = OneFile(&mut out);
        qsm_client::restore::stream(server, filespace, options, &mut sink).with_context(what)?
    };
    out.commit()?;
    if let Some(f) = file {
        errln!("qsm: {entries} entries of {} written to {}", path.display(), f.display());
    }
    Ok(true)
}

/// `--to -`: the file's bytes, nothing else.
struct OneFile<'a>(&'a mut Output);

impl qsm_client::restore::Sink for OneFile<'_> {
    fn begin(&mut self, _: &qsm_types::model::ObjectVersion) -> std::io::Result<()> {
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        std::io::Write::write_all(self.0, bytes)
    }

    fn end(&mut self, _: &qsm_types::model::ObjectVersion) -> std::io::Result<()> {
        Ok(())
    }
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
