//! `qsm backup`: incremental or selective backup of paths, to a server or the embedded store,
//! resuming on another server sharing the catalog when one is lost.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use qsm_client::backup::MAX_CHANGING_RETRIES;
use qsm_client::report::{BackupReport, ExpiredReport, absolute};
use qsm_types::TxnLimits;

use crate::conn::{ClientConfig, Conn, Connected, parse_rate};
use crate::render::mb;

use super::Complete;
use super::send::*;

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Directories or files to back up (incrementally: only what changed is sent).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Compression: auto (the default: per quantum, from none to zstd:19 as the bottleneck
    /// calls for; below zstd:3 only when that makes the backup at least 1.25x as fast),
    /// auto:fast (throughput only), auto:small (the smallest within 1.1x of the fastest), off,
    /// or a fixed CODEC[:LEVEL] (e.g. lz4, zstd:3).
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
pub(crate) fn filespace_arg(given: &Path) -> Result<String> {
    let path = match given.canonicalize() {
        Ok(p) => p,
        Err(_) => absolute(given)?,
    };
    path.to_str()
        .map(str::to_owned)
        .with_context(|| format!("--filespace {}: not valid UTF-8", given.display()))
}

/// What the change journal compares with the last backup's for a backup with `patterns` (and
/// the client configuration's): its patterns, and with `encryption = true` the key it would
/// seal with, as the key file states it (`qsm_client::journal::selection`).
pub fn patterns_fingerprint(config: &ClientConfig, patterns: &Patterns) -> Result<String> {
    let filter = backup_options(config, None, None, patterns)?.filter;
    let key = match config.encryption {
        Some(true) => crate::cmd::key::stated_fingerprint(config.key_file.clone()),
        _ => None,
    };
    Ok(qsm_client::journal::selection(&filter, key.as_deref()))
}

pub fn backup(args: BackupArgs) -> Result<Complete> {
    let mut which = 0;
    let mut connected = args.home.open_from(&mut which)?;
    let mut server_options = server_options(&connected)?;
    let config = server_options.apply(args.home.config()?);
    server_options.flags_given(&args.protect.flags_given());
    let flags = [
        ("compression", args.compression.is_some()),
        ("threads", args.threads.is_some()),
        ("limit_upload", args.limit_upload.is_some()),
        ("txn_group_max", args.txn_group_max.is_some()),
        ("txn_byte_limit", args.txn_byte_limit.is_some()),
    ];
    server_options.flags_given(&flags.iter().filter(|f| f.1).map(|f| f.0).collect::<Vec<_>>());
    let so = &server_options;
    let compression =
        unless_forced(so, "compression", args.compression.as_deref(), "--compression");
    let threads = unless_forced(so, "threads", args.threads, "-T");
    let mut options = backup_options(&config, compression, threads, &args.patterns)?;
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
    if let Some(rate) = unless_forced(so, "limit_upload", args.limit_upload, "--limit-upload") {
        options.limit_upload = Some(rate);
    }
    if let Some(n) = unless_forced(so, "txn_group_max", args.txn_group_max, "--txn-group-max") {
        options.limits.group_max = n;
    }
    if let Some(n) = unless_forced(so, "txn_byte_limit", args.txn_byte_limit, "--txn-byte-limit") {
        options.limits.byte_limit = n;
    }
    args.protect.apply(&config, &server_options, &connected, &args.home, &mut options)?;
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
    let mut reports: Vec<BackupReport> = summaries
        .iter()
        .map(|s| BackupReport { server_options: server_options.given.clone(), ..s.into() })
        .collect();
    if let (Some(last), Some(x)) = (reports.last_mut(), &expired) {
        last.expired =
            Some(ExpiredReport { backups: x.backups, archives: x.archives, seconds: x.seconds });
    }
    if !args.json {
        say_server_options(&server_options);
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
    note_backups(&summaries);
    Ok(summaries.iter().all(|s| s.failed == 0))
}

/// A backup's or an archive's figures, for `--metrics-file`.
pub(crate) fn note_backups(summaries: &[qsm_client::BackupSummary]) {
    use crate::metrics_file::note;
    for s in summaries {
        note("examined", "Entries examined.", s.examined as f64);
        note("sent_objects", "Entries sent (new or changed).", s.backed_up as f64);
        note("failed_files", "Entries not backed up (unreadable, changing).", s.failed as f64);
        note("read_bytes", "File bytes read.", s.bytes_read as f64);
        note("stored_bytes", "Frame bytes stored.", s.bytes_stored as f64);
    }
}

/// Expiration of the embedded store's node after a backup; a failure is said, never fatal:
/// the backup itself is committed.
pub(crate) fn expire_embedded(e: &qsm_server::Embedded) -> Option<qsm_proto::v1::ExpireReply> {
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

pub(crate) fn print_backup(s: &BackupReport, verbose: bool) {
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
pub(crate) fn lost_server(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref(),
            Some(qsm_client::ClientError::Server(qsm_types::ServerError::Unreachable(_)))
        )
    })
}

/// Connects to the next server that answers, waiting a little between rounds: servers
/// restarting behind one name take a moment.
pub(crate) fn reconnect(
    home: &crate::conn::Conn,
    which: &mut usize,
) -> Result<crate::conn::Connected> {
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
