//! `qsm backup`, `qsm restore`, `qsm archive`, `qsm retrieve` and `qsm query`, against a QSM
//! server or the embedded store (see `conn`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use qsm_client::backup::MAX_CHANGING_RETRIES;
use qsm_client::restore::Existing;
use qsm_client::server::Server;
use qsm_client::{BackupOptions, BackupSummary, RestoreOptions, Selection};
use qsm_types::TxnLimits;
use qsm_types::model::{ObjectId, ObjectKind, ObjectVersion};
use qsm_types::time::{format_time, parse_time};
use serde::Serialize;

use crate::conn::{ClientConfig, Conn, Connected, parse_rate};
use crate::key_cmd::KeyUse;
use crate::render::{Text, emit};
use qsm_client::report::{
    self, ArchiveReport, BackupReport, ExpiredReport, FilespaceRow, RestoreReport, VersionRow,
    absolute, locate,
};

/// Whether a command did all it was asked (`false`: some files were skipped).
pub type Complete = bool;

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Directories or files to back up (incrementally: only what changed is sent).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Compression: auto (the default: per quantum, the setting the bottleneck calls for, from
    /// none to zstd:19), off, or a fixed CODEC[:LEVEL] (e.g. lz4, zstd:3).
    #[arg(long)]
    compression: Option<String>,
    /// Worker threads compressing quanta (default: one per core).
    #[arg(short = 'T', long)]
    threads: Option<usize>,
    /// Send every file named, changed or not (selective backup).
    #[arg(long, alias = "full")]
    selective: bool,
    /// Send at most this rate: 10Mbit, 1Gbit, 5MB (per second); emulates a slow link.
    #[arg(long, value_parser = parse_rate)]
    limit_upload: Option<u64>,
    /// Objects per server transaction at most (the server may cap it lower).
    #[arg(long, value_parser = crate::usage::range(1, TxnLimits::MAX_GROUP, "objects"))]
    txn_group_max: Option<usize>,
    /// Frame bytes per server transaction at most.
    #[arg(long, value_parser = crate::usage::range(1, TxnLimits::MAX_BYTES, "bytes"))]
    txn_byte_limit: Option<u64>,
    /// Stay on the file system of each path.
    #[arg(long)]
    one_file_system: bool,
    /// Do not compare inode numbers (file systems whose inodes are not stable, e.g. some FUSE
    /// or network mounts, would otherwise send every file each time).
    #[arg(long)]
    ignore_inode: bool,
    /// The change journal to use instead of a scan when it is valid (default: the one
    /// `qsm journal start` keeps, if it exists).
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Scan, even if a valid change journal could replace the scan (wins over --journal).
    #[arg(long)]
    no_journal: bool,
    /// How many times a file that changed while it was read is read again, after the rest,
    /// before it is reported and left out (TSM's CHANGINGRETRIES; default 3, or
    /// `changing_retries` in client.toml).
    #[arg(long, value_name = "N", value_parser = crate::usage::range(0, MAX_CHANGING_RETRIES, "retries"))]
    changing_retries: Option<u32>,
    /// The filespace to back up into. By default a path below an existing filespace goes
    /// into it, as an incremental of that subtree; naming the path itself makes it a
    /// filespace of its own.
    #[arg(long, value_name = "NAME")]
    filespace: Option<PathBuf>,
    /// Say more: also why the change journal was not used for a tree that is not journaled.
    #[arg(long, short = 'v')]
    verbose: bool,
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

/// A `--filespace` name as filespaces are named: the absolute, symlink-free path when it
/// exists, else the path made absolute.
fn filespace_arg(given: &Path) -> Result<String> {
    let path = match given.canonicalize() {
        Ok(p) => p,
        Err(_) => absolute(given)?,
    };
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("--filespace {}: not valid UTF-8", given.display()))
}

/// Deduplication and encryption, over the client configuration's `dedup` and `encryption`.
#[derive(Debug, Args)]
pub struct Protect {
    /// Deduplicate: cut files by content and send only chunks the node's dedup scope does not
    /// hold (on|off; default off, or `dedup` in client.toml).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    dedup: Option<bool>,
    /// Encrypt every quantum on this machine with the node's key, made on first use and
    /// protected by a passphrase from the terminal or QSM_PASSPHRASE_FILE (on|off; default
    /// off, or `encryption` in client.toml). The server keeps a copy of the wrapped key.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    encryption: Option<bool>,
    /// The node's key file (default: `key_file` in client.toml, $QSM_KEY_FILE, or
    /// ~/.config/qsm/key).
    #[arg(long)]
    key_file: Option<PathBuf>,
}

fn on_off(text: &str) -> std::result::Result<bool, String> {
    match text {
        "on" | "yes" | "true" => Ok(true),
        "off" | "no" | "false" => Ok(false),
        _ => Err(format!("{text:?}: on or off")),
    }
}

impl Protect {
    /// Sets `options.dedup`, `.encryption` and `.dedup_cache` from the flags, then the
    /// configuration; opens (or makes) the key before anything is read.
    fn apply(
        &self,
        config: &ClientConfig,
        connected: &Connected,
        home: &Conn,
        options: &mut BackupOptions,
    ) -> Result<()> {
        options.dedup = match self.dedup.or(config.dedup) {
            Some(on) => on,
            // A server older than deduplication has no default (and no dedup).
            None => connected.server().dedup_info().is_ok_and(|i| i.dedup_default),
        };
        options.dedup_cache = connected.dedup_cache(home);
        if self.encryption.or(config.encryption).unwrap_or(false) {
            let given = self.key_file.clone().or(config.key_file.clone());
            options.encryption = crate::key_cmd::node_keys(
                given,
                config.cipher.as_deref(),
                connected.server().as_ref(),
                KeyUse::Backup,
            )?;
        }
        Ok(())
    }
}

/// Include and exclude patterns, added to those of the client configuration.
#[derive(Debug, Args)]
pub struct Patterns {
    /// Skip what matches (repeatable): a name at any depth (`*.o`, `.cache`), a path below the
    /// root (`build/out`), an absolute path (`/home/*/.cache`); a trailing `/` matches
    /// directories only. Excluded directories are not entered; files excluded since the last
    /// backup are marked inactive, like deleted ones.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Take only what matches, or lies below a directory that does (repeatable; same pattern
    /// forms). Directories are still walked to find matches. An exclude beats an include.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Bind what matches PATTERN to the management class CLASS of the node's policy domain
    /// (repeatable; same pattern forms; the last match wins, as TSM reads include statements).
    #[arg(long, value_name = "PATTERN=CLASS")]
    mgmtclass: Vec<String>,
}

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
    fn existing(&self) -> Existing {
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
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Conn,
}

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
    /// Compression: auto (the default: adaptive per quantum, as for backup), off, or
    /// CODEC[:LEVEL].
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
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    home: Conn,
}

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

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The backup options from flags, then the client configuration, then the defaults.
fn backup_options(
    config: &ClientConfig,
    compression: Option<&str>,
    threads: Option<usize>,
    patterns: &Patterns,
) -> Result<BackupOptions> {
    let mut options = config.backup_options(&qsm_client::config::Given {
        compression,
        threads,
        include: &patterns.include,
        exclude: &patterns.exclude,
        mgmtclass: &patterns.mgmtclass,
    })?;
    options.threads = crate::usage::threads(options.threads)?;
    Ok(options)
}

/// What the change journal compares with the last backup's for a backup with `patterns` (and
/// the client configuration's): its patterns, and with `encryption = true` the key it would
/// seal with, as the key file states it (`qsm_client::journal::selection`).
pub fn patterns_fingerprint(config: &ClientConfig, patterns: &Patterns) -> Result<String> {
    let filter = backup_options(config, None, None, patterns)?.filter;
    let key = match config.encryption {
        Some(true) => crate::key_cmd::stated_fingerprint(config.key_file.clone()),
        _ => None,
    };
    Ok(qsm_client::journal::selection(&filter, key.as_deref()))
}

pub fn backup(args: BackupArgs) -> Result<Complete> {
    let config = args.home.config()?;
    let mut options =
        backup_options(&config, args.compression.as_deref(), args.threads, &args.patterns)?;
    options.full = args.selective;
    options.one_file_system = args.one_file_system;
    if let Some(n) = args.changing_retries {
        options.changing_retries = n;
    }
    options.ignore_inode = args.ignore_inode;
    options.filespace = args.filespace.as_deref().map(filespace_arg).transpose()?;
    options.journal = if args.no_journal {
        None
    } else {
        match args.journal.or(config.journal.clone()) {
            Some(p) => Some(p),
            None => qsm_client::journal::default_path().filter(|p| p.exists()),
        }
    };
    if args.limit_upload.is_some() {
        options.limit_upload = args.limit_upload;
    }
    if let Some(n) = args.txn_group_max {
        options.limits.group_max = n;
    }
    if let Some(n) = args.txn_byte_limit {
        options.limits.byte_limit = n;
    }
    let mut which = 0;
    let mut connected = args.home.open_from(&mut which)?;
    args.protect.apply(&config, &connected, &args.home, &mut options)?;
    // Servers sharing one catalog and pool take over from each other: a backup whose server
    // is lost starts again on the next, as an incremental against the shared inventory, so
    // what the lost one committed is not sent again.
    let addresses = args.home.servers()?.len();
    let mut failovers = 0;
    let mut summaries = Vec::with_capacity(args.paths.len());
    for path in &args.paths {
        loop {
            let server = connected.server();
            let done = each_path(
                std::slice::from_ref(path),
                args.json,
                "backing up",
                &mut |path, progress| qsm_client::backup(server.as_ref(), path, &options, progress),
                &|s| print_backup(&BackupReport::from(s), args.verbose),
            );
            drop(server);
            match done {
                Err(e) if addresses > 1 && failovers < 2 * addresses && lost_server(&e) => {
                    failovers += 1;
                    errln!("qsm: warning: {e:#}; resuming on another server");
                    which += 1;
                    connected = reconnect(&args.home, &mut which)?;
                }
                done => {
                    summaries.extend(done?);
                    break;
                }
            }
        }
    }
    // The embedded store has no administrator or schedule to expire what its policy no
    // longer keeps: the backup does, once its versions are committed.
    let expired = match &connected {
        Connected::Embedded(e) => expire_embedded(e),
        Connected::Remote(_) => None,
    };
    let mut reports: Vec<BackupReport> = summaries.iter().map(BackupReport::from).collect();
    if let (Some(last), Some(x)) = (reports.last_mut(), &expired) {
        last.expired =
            Some(ExpiredReport { backups: x.backups, archives: x.archives, seconds: x.seconds });
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&reports)?);
    } else if let Some(x) = expired.filter(|x| x.backups + x.archives > 0) {
        outln!(
            "Expired {} backup versions and {} archives past the embedded store's policy ({:.2} s).",
            x.backups,
            x.archives,
            x.seconds
        );
    }
    Ok(summaries.iter().all(|s| s.failed == 0))
}

/// Expiration of the embedded store's node after a backup; a failure is said, never fatal:
/// the backup itself is committed.
fn expire_embedded(e: &qsm_server::Embedded) -> Option<qsm_proto::v1::ExpireReply> {
    match e.expire() {
        Ok(r) => Some(r),
        // Another expiration is running (a second backup's, or an administrator's).
        Err(qsm_types::ServerError::Refused(why)) => {
            errln!("qsm: note: expiration after the backup left to the one running: {why}");
            None
        }
        Err(err) => {
            errln!("qsm: warning: expiration after the backup failed: {err}");
            None
        }
    }
}

fn print_backup(s: &BackupReport, verbose: bool) {
    match &s.subtree {
        Some(sub) => outln!(
            "Backup of {}/{sub} (in filespace {}):",
            s.filespace.trim_end_matches('/'),
            s.filespace
        ),
        None => outln!("Backup of {}:", s.filespace),
    }
    outln!(
        "  examined {}, backed up {}, unchanged {}, failed {}, marked inactive {}",
        s.examined,
        s.backed_up,
        s.unchanged,
        s.failed,
        s.deactivated
    );
    if s.skipped > 0 {
        outln!("  skipped {} sockets (QSM does not back up sockets)", s.skipped);
    }
    if s.retried > 0 {
        outln!("  read again {} times files that changed while being read", s.retried);
    }
    if s.resealed > 0 {
        outln!(
            "  sent again {} unchanged files to seal them with key {}: they were stored in the clear, under another key, or before keys were recorded",
            s.resealed,
            s.key_fingerprint.as_deref().unwrap_or("?")
        );
    }
    // Ratio only when something was stored; CPU only over runs long enough for its
    // 10 ms clock ticks to mean something.
    let ratio = if s.bytes_stored > 0 {
        format!("{:.2}:1", s.bytes_read as f64 / s.bytes_stored as f64)
    } else {
        "-".into()
    };
    let cpu = if s.seconds >= 0.5 {
        format!("{:.0}% ({:.2} s user+sys)", 100.0 * s.cpu_seconds / s.seconds, s.cpu_seconds)
    } else {
        format!("{:.2} s user+sys", s.cpu_seconds)
    };
    outln!(
        "  read {:.1} MB, stored {:.1} MB (ratio {ratio}), {:.2} s, {:.1} MB/s, client CPU {cpu}",
        mb(s.bytes_read),
        mb(s.bytes_stored),
        s.seconds,
        mb(s.bytes_read) / s.seconds.max(1e-9),
    );
    if !s.compression_mix.is_empty() {
        outln!("  compression: {}", s.compression);
    }
    if s.asked > 0 || s.dedup_chunks > 0 || s.cache_note.is_some() {
        outln!(
            "  dedup: {} of {} chunks ({:.1} MB) already stored, not sent; {} found in the local cache, {} ids asked of the server",
            s.dedup_chunks,
            s.chunks,
            mb(s.dedup_bytes),
            s.cache_hits,
            s.asked
        );
    }
    if let Some(note) = &s.cache_note {
        outln!("  dedup cache not used: {note}");
    }
    // A tree that is not journaled scans as always: not worth a line each time.
    if let Some(j) = s.journal.as_ref().filter(|_| verbose || !s.journal_routine) {
        outln!("  journal: {j}");
    }
    if let Some(fp) = &s.key_fingerprint {
        let rate = if s.encrypt_seconds > 0.0 {
            format!("{:.0} MB/s per core", mb(s.encrypted_bytes) / s.encrypt_seconds)
        } else {
            "-".into()
        };
        outln!(
            "  encrypted {:.1} MB with key {fp} ({rate}, {:.3} CPU s)",
            mb(s.encrypted_bytes),
            s.encrypt_seconds
        );
    }
}

/// Runs `op` on each path with a live progress line, prints each run's warnings and (unless
/// JSON) its summary through `on_done` as soon as it ends, and returns the summaries: the
/// loop `qsm backup` and `qsm archive` share.
/// Whether `e` says the server was lost (rather than refusing or failing).
fn lost_server(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref(),
            Some(qsm_client::ClientError::Server(qsm_types::ServerError::Unreachable(_)))
        )
    })
}

/// Connects to the next server that answers, waiting a little between rounds: servers
/// restarting behind one name take a moment.
fn reconnect(home: &crate::conn::Conn, which: &mut usize) -> Result<crate::conn::Connected> {
    let mut delay = std::time::Duration::from_millis(500);
    let mut round = 0;
    loop {
        match home.open_from(which) {
            Err(e) if round < 3 && lost_server(&e) => {
                std::thread::sleep(delay);
                delay *= 2;
                round += 1;
            }
            done => return done,
        }
    }
}

fn each_path(
    paths: &[PathBuf],
    json: bool,
    verb: &str,
    op: &mut dyn FnMut(&Path, &mut qsm_client::Progress<'_>) -> qsm_client::Result<BackupSummary>,
    on_done: &dyn Fn(&BackupSummary),
) -> Result<Vec<BackupSummary>> {
    let mut summaries = Vec::with_capacity(paths.len());
    for path in paths {
        let mut bar = ProgressLine::new(json);
        let s =
            op(path, &mut |s| bar.show(s)).with_context(|| format!("{verb} {}", path.display()))?;
        bar.finish();
        for w in &s.warnings {
            errln!("qsm: warning: {w}");
        }
        if !json {
            on_done(&s);
        }
        summaries.push(s);
    }
    Ok(summaries)
}

struct RestoreRequest<'a> {
    path: &'a Path,
    to: Option<&'a Path>,
    existing: Existing,
    json: bool,
    select: Selection,
    verb: &'static str,
    keys: Option<std::sync::Arc<qsm_client::keys::NodeKeys>>,
    require_sealed: bool,
}

/// The node's keys for a restore or retrieve: opened when there is a key (here or on the
/// server) and a passphrase can be had, before anything is written, so a wrong passphrase
/// stops it at once. Required when the configuration says encryption is on. Also whether
/// plaintext data is refused (`--require-encryption`, or `require_encryption`).
fn restore_protection(
    home: &Conn,
    key_file: Option<PathBuf>,
    require_flag: bool,
    server: &dyn Server,
) -> Result<(Option<std::sync::Arc<qsm_client::keys::NodeKeys>>, bool)> {
    let config = home.config()?;
    let required = config.encryption.unwrap_or(false);
    let keys = crate::key_cmd::node_keys(
        key_file.or(config.key_file),
        config.cipher.as_deref(),
        server,
        KeyUse::Restore { required },
    )?;
    Ok((keys, require_flag || config.require_encryption == Some(true)))
}

/// A restore's report with what was asked, for the text (the JSON is the report's).
#[derive(Serialize)]
struct Restored<'a> {
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

fn restore_with(server: &dyn Server, r: RestoreRequest<'_>) -> Result<Complete> {
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
    };
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
    let connected = args.home.open()?;
    let (keys, require_sealed) = restore_protection(
        &args.home,
        args.key_file.clone(),
        args.require_encryption,
        connected.server().as_ref(),
    )?;
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
        },
    )
}

/// The one archive `retrieve` takes for `-d` and `--id`: the one with that id, or the newest
/// of those with that description that hold something at or below `path`. Never several:
/// merging two archives path by path would make a tree that never existed. Says which it
/// took when there was a choice.
fn pick_archive(
    server: &dyn Server,
    path: &Path,
    description: Option<&str>,
    id: Option<i64>,
) -> Result<Selection> {
    let (filespace, sub) = locate(server, path)?;
    let sub = sub.unwrap_or_default();
    let fs = server
        .filespaces()?
        .into_iter()
        .find(|f| f.name == filespace)
        .with_context(|| format!("no filespace {filespace}"))?;
    let mut candidates: Vec<qsm_client::archives::Archive> =
        qsm_client::archives::list(server, fs.id)?
            .into_iter()
            .filter(|(a, paths)| {
                id.is_none_or(|id| a.id.0 == id)
                    && description.is_none_or(|d| a.description.as_deref() == Some(d))
                    && qsm_client::archives::covers(paths, &sub)
            })
            .map(|(a, _)| a)
            .collect();
    let shown = path.display();
    let Some(newest) = candidates.pop() else {
        match (id, description) {
            (Some(id), _) => bail!(
                "nothing to retrieve: no archive {id} of {shown}{} (see `qsm query archive`)",
                description.map(|d| format!(" described {d:?}")).unwrap_or_default()
            ),
            (None, d) => bail!(
                "nothing to retrieve: no archive of {shown} is described {:?} (see `qsm query archive`)",
                d.unwrap_or_default()
            ),
        }
    };
    if !candidates.is_empty() {
        let older: Vec<String> = candidates
            .iter()
            .rev()
            .map(|a| format!("{} of {}", a.id.0, format_time(a.date)))
            .collect();
        errln!(
            "qsm: {} archives of {shown} are described {:?}: retrieving the newest, archive {} of {} (older: {}; choose one with --id)",
            candidates.len() + 1,
            description.unwrap_or_default(),
            newest.id.0,
            format_time(newest.date),
            older.join(", ")
        );
    }
    Ok(Selection::Archive(newest.objects))
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
        },
    )
}

pub fn archive(args: ArchiveArgs) -> Result<Complete> {
    let config = args.home.config()?;
    let mut options = backup_options(&config, args.compression.as_deref(), None, &args.patterns)?;
    options.default_class = args.archmc.clone();
    let connected = args.home.open()?;
    args.protect.apply(&config, &connected, &args.home, &mut options)?;
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
    Ok(summaries.iter().all(|s| s.failed == 0))
}

/// Warns when the filespace `path` will be archived into already holds archives described
/// `description`: `retrieve -d` then takes the newest alone, and `--id` is needed for another.
fn warn_reused(server: &dyn Server, path: &Path, description: &str) -> Result<()> {
    let (name, _) = qsm_client::backup::target_filespace(server, path, None)
        .with_context(|| format!("archiving {}", path.display()))?;
    let Some(fs) = server.filespaces()?.into_iter().find(|f| f.name == name) else {
        return Ok(());
    };
    let same: Vec<_> = qsm_client::archives::list(server, fs.id)?
        .into_iter()
        .filter(|(a, _)| a.description.as_deref() == Some(description))
        .map(|(a, _)| a)
        .collect();
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

pub fn query(what: QueryWhat) -> Result<Complete> {
    match what {
        QueryWhat::Filespace { json, home } => {
            let connected = home.open()?;
            emit(&report::filespaces(connected.server().as_ref())?[..], json)?;
        }
        QueryWhat::Backup { filespace, inactive, json, home } => {
            list_versions(home, filespace, json, false, &|v| {
                v.kind == ObjectKind::Backup && (inactive || v.active)
            })?;
        }
        QueryWhat::Archive { filespace, json, home } => {
            list_versions(home, filespace, json, true, &|v| v.kind == ObjectKind::Archive)?;
        }
    }
    Ok(true)
}

fn list_versions(
    home: Conn,
    path: Option<PathBuf>,
    json: bool,
    archives: bool,
    keep: &dyn Fn(&ObjectVersion) -> bool,
) -> Result<()> {
    let connected = home.open()?;
    let rows = report::versions(connected.server().as_ref(), path.as_deref(), archives, keep)?;
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

/// A live status line on a terminal while objects are sent: objects, bytes read and stored,
/// ratio and throughput. (No ETA: the walk runs beside the transfer, so the total is unknown
/// until the end.) Nothing when stderr is not a terminal or output is JSON.
struct ProgressLine {
    bar: Option<indicatif::ProgressBar>,
    started: std::time::Instant,
}

impl ProgressLine {
    fn new(json: bool) -> ProgressLine {
        use std::io::IsTerminal;
        let bar = (!json && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar
        });
        ProgressLine { bar, started: std::time::Instant::now() }
    }

    fn show(&mut self, s: &qsm_client::BackupSummary) {
        let Some(bar) = &self.bar else { return };
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = s.bytes_read as f64 / secs;
        // The total is known once the walk has ended; until then there is no honest ETA.
        let eta = if !s.scan_done {
            "scanning".to_owned()
        } else if rate > 0.0 {
            let left = s.queued_bytes.saturating_sub(s.bytes_read) as f64 / rate;
            format!("ETA {}:{:02}", left as u64 / 60, left as u64 % 60)
        } else {
            String::new()
        };
        bar.set_message(format!(
            "{} examined, {} sent, {:.1} of {:.1} MB read, {:.1} MB stored ({:.2}:1), {:.1} MB/s, {eta}",
            s.examined,
            s.backed_up,
            mb(s.bytes_read),
            mb(s.queued_bytes),
            mb(s.bytes_stored),
            s.bytes_read as f64 / s.bytes_stored.max(1) as f64,
            rate / 1e6
        ));
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
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

impl Text for [FilespaceRow] {
    fn text(&self) {
        for f in self {
            outln!("{}", f.name);
        }
    }
}
