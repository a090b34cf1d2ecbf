//! Incremental backup: a file is sent when it is new or when its type, size, modification or
//! change time, mode, owner, inode or link target differ from the active version's; active
//! versions of paths that are gone are marked inactive. The walk comes in the catalog's path
//! order and is merged with the active inventory as both stream, so neither is held whole. A
//! file is read in quanta that all cores compress at once, and its frames stream into the pool
//! as they come.
//!
//! Memory is bounded whatever the number or size of files: the engine's `2N + 8` slots of two
//! quantum buffers (N workers), [`WALK_QUEUE`] entries between walker and reader,
//! [`INVENTORY_AHEAD`] versions read ahead, the upload's few messages of about 1 MiB, and the
//! walk's listings (see `scan::walk_sorted`), which grow with the width of the largest
//! directories only. Measured in docs/PERFORMANCE.md 4.1: 21 MB for an unchanged tree of
//! 300,000 files.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use qsm_codec::{Compression, FrameEncoder};
use qsm_crypt::{ChunkId, ChunkIdKey};
use qsm_types::ServerError;
use qsm_types::TxnLimits;
use qsm_types::model::{Attributes, FilespaceId, NewObject, ObjectKind, ObjectType};

use crate::adaptive::{Controller, Objective};
use crate::chunker::ChunkSizes;
use crate::dedup::DedupCache;
use crate::error::{ClientError, Result};
use crate::filter::Filter;
use crate::keys::NodeKeys;
use crate::scan::{self, Entry};
use crate::server::{Scope, Server, Upload, UploadKind};
use crate::throttle::Throttle;

/// How to back up.
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// Codec setting for every quantum (the starting one when `adaptive`).
    pub compression: Compression,
    /// Choose the setting per quantum from the pipeline's bottleneck, for this objective
    /// (`--compression auto`, `auto:fast`, `auto:small`; see [`crate::adaptive`]); `None`:
    /// every quantum uses `compression`.
    pub adaptive: Option<Objective>,
    /// Worker threads (`None`: one per core).
    pub threads: Option<usize>,
    /// Transaction limits.
    pub limits: TxnLimits,
    /// Send every file, changed or not (selective backup).
    pub full: bool,
    /// Do not descend into other file systems.
    pub one_file_system: bool,
    /// Send at most this many frame bytes per second (emulates a slow link).
    pub limit_upload: Option<u64>,
    /// Include and exclude patterns.
    pub filter: Filter,
    /// Do not compare inode numbers (for file systems that do not keep them stable, such as
    /// some FUSE and network file systems).
    pub ignore_inode: bool,
    /// Deduplicate: cut files by content and send only chunks the node's dedup scope lacks.
    pub dedup: bool,
    /// Encrypt every quantum on the client with these keys (chunk ids are keyed with them too).
    pub encryption: Option<Arc<NodeKeys>>,
    /// Where the dedup cache of this node and server is kept between backups (`None`: none).
    pub dedup_cache: Option<PathBuf>,
    /// The change journal to use instead of a scan when it is valid (`None`: always scan).
    pub journal: Option<PathBuf>,
    /// Management-class bindings of files by pattern.
    pub bindings: crate::filter::Bindings,
    /// The class of what no binding names (`None`: the domain's default; `--archmc`).
    pub default_class: Option<String>,
    /// How many times a file that changed while it was read is read again before it is
    /// reported and left out (TSM's `changingretries`).
    pub changing_retries: u32,
    /// The filespace to back up into (`--filespace`): the path's own name makes it a
    /// filespace of its own even below another; `None`: the existing filespace that contains
    /// the path, if any ([`target_filespace`]).
    pub filespace: Option<String>,
}

/// The default of [`BackupOptions::changing_retries`]: a few more reads catch a file written
/// now and then between two writes; a file written all the time (a busy log) costs at most
/// this many more reads before it is reported.
pub const CHANGING_RETRIES: u32 = 3;

/// The most [`BackupOptions::changing_retries`] that may be asked: each is another whole read
/// of the file, and a file still changing after this many will go on changing.
pub const MAX_CHANGING_RETRIES: u32 = 100;

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            compression: Compression::AUTO,
            adaptive: Some(Objective::Balanced),
            threads: None,
            limits: TxnLimits::default(),
            full: false,
            one_file_system: false,
            limit_upload: None,
            filter: Filter::default(),
            ignore_inode: false,
            dedup: false,
            encryption: None,
            dedup_cache: None,
            journal: None,
            bindings: Default::default(),
            default_class: None,
            changing_retries: CHANGING_RETRIES,
            filespace: None,
        }
    }
}

/// How long a backup waits before it reads again a file that changed while it was read, once
/// nothing else is left to read: long enough for a file written in bursts to settle, short
/// beside a backup (at most [`CHANGING_RETRIES`] times this per such file by default).
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Chunk ids the dedup cache keeps: 262,144 ids (about 25 MB of memory) cover 16 GiB of
/// distinct data at the 64 KiB average chunk; past that the oldest go, and the server is
/// asked about them again.
pub const DEDUP_CACHE_IDS: usize = 1 << 18;

/// What a backup did.
#[derive(Debug, Clone, Default)]
pub struct BackupSummary {
    /// The filespace (the absolute root path).
    pub filespace: String,
    /// The path backed up below the filespace's root (`/`-separated), when it is not the
    /// root itself: only this subtree was compared and could become inactive.
    pub subtree: Option<Vec<u8>>,
    /// Entries examined.
    pub examined: u64,
    /// Entries sent (new or changed).
    pub backed_up: u64,
    /// Entries unchanged since their active version.
    pub unchanged: u64,
    /// Entries that could not be read or changed while being read (not backed up).
    pub failed: u64,
    /// Reads of files that changed while being read and were read again (each counted once
    /// per time; a file that then came whole is in `backed_up`, one that never did in
    /// `failed`).
    pub retried: u64,
    /// Active versions marked inactive because their file is gone.
    pub deactivated: u64,
    /// Entries QSM does not back up (sockets), each named in `warnings`; not failures.
    pub skipped: u64,
    /// File bytes read.
    pub bytes_read: u64,
    /// Frame bytes stored.
    pub bytes_stored: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// User plus system CPU seconds of this process.
    pub cpu_seconds: f64,
    /// One line per problem, naming the file.
    pub warnings: Vec<String>,
    /// File bytes the walk has queued for sending so far (for progress: with `scan_done`, the
    /// total `bytes_read` is heading for, if no file changes size).
    pub queued_bytes: u64,
    /// The walk has ended: `examined` and `queued_bytes` are final.
    pub scan_done: bool,
    /// Chunks (quanta) of file data, sent or not.
    pub chunks: u64,
    /// Chunks not sent because the server holds them (deduplication).
    pub dedup_chunks: u64,
    /// File bytes those chunks hold.
    pub dedup_bytes: u64,
    /// Of the deduplicated chunks, those the local dedup cache knew (no question asked).
    pub cache_hits: u64,
    /// Chunk ids asked about the server.
    pub asked: u64,
    /// Why the dedup cache was not used, if it was not.
    pub cache_note: Option<String>,
    /// Plaintext bytes encrypted, and the CPU seconds spent encrypting them (all workers).
    pub encrypted_bytes: u64,
    /// See `encrypted_bytes`.
    pub encrypt_seconds: f64,
    /// The fingerprint of the key frames were sealed with.
    pub key_fingerprint: Option<String>,
    /// Files unchanged but sent again to be sealed with this key: stored in the clear, under
    /// another key, or before keys were recorded (encryption on only).
    pub resealed: u64,
    /// How the change journal served: "N changes" when it replaced the scan, or why not.
    pub journal: Option<String>,
    /// Whether the change journal replaced the scan.
    pub journal_used: bool,
    /// The journal note is routine: the tree is not journaled at all (a display shows it only
    /// when asked to be verbose).
    pub journal_routine: bool,
    /// The codec settings used, and (adaptive) what limited the backup.
    pub compression: crate::adaptive::Report,
}

/// What the walk has found so far, for progress displays while it runs.
#[derive(Default)]
struct ScanProgress {
    examined: AtomicU64,
    queued_bytes: AtomicU64,
    done: AtomicBool,
}

/// Progress is reported at most this often.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

fn now() -> i64 {
    qsm_types::model::now()
}

/// The filespace name of a root: its absolute, symlink-free path.
pub fn filespace_name(root: &Path) -> Result<String> {
    let abs = root.canonicalize().map_err(ClientError::io("cannot back up", root))?;
    abs.to_str().map(str::to_owned).ok_or_else(|| {
        ClientError::Invalid(format!(
            "{} is not valid UTF-8; filespace names must be",
            abs.display()
        ))
    })
}

/// Whether `entry`'s data must be sent again to be sealed with this backup's key: encryption
/// is on (the entry carries the key) and the active version was stored in the clear, under
/// another key, or before keys were recorded. With encryption off nothing is sent again for
/// this: data sealed earlier stays sealed.
fn needs_sealing(entry: &Entry, active: &(ObjectType, Attributes)) -> bool {
    entry.attrs.sealed_by.is_some() && active.1.sealed_by != entry.attrs.sealed_by
}

/// The filespace `root` goes into, and where below its root: the longest existing filespace
/// of the node that contains `root` (TSM backs a path up into the filespace holding it, so a
/// subdirectory of a backed-up tree is never a second, overlapping filespace), or `root`'s own
/// name when none does. `asked` (`--filespace`) overrides: `root`'s own name makes it a
/// filespace of its own, the name of a filespace containing `root` puts it there; any other
/// name is refused, as restore and query find filespaces by the paths they contain.
pub fn target_filespace(
    server: &dyn Server,
    root: &Path,
    asked: Option<&str>,
) -> Result<(String, Vec<u8>)> {
    let path = filespace_name(root)?;
    // The part of `path` below `name`, if `name` contains it ("/" contains every path).
    let below = |name: &str| -> Option<Vec<u8>> {
        if name == path {
            return Some(Vec::new());
        }
        let rest = path.strip_prefix(name)?;
        let rest = if name.ends_with('/') { rest } else { rest.strip_prefix('/')? };
        Some(rest.as_bytes().to_vec())
    };
    if let Some(name) = asked {
        return below(name).map(|rel| (name.to_owned(), rel)).ok_or_else(|| {
            ClientError::Invalid(format!(
                "--filespace {name}: {path} is not at or below it (name {path} itself for a \
                 filespace of its own, or a filespace that contains it)"
            ))
        });
    }
    let containing = server
        .filespaces()?
        .into_iter()
        .filter_map(|f| below(&f.name).map(|rel| (f.name, rel)))
        .max_by_key(|(name, _)| name.len());
    Ok(containing.unwrap_or((path, Vec::new())))
}

/// Whether a walk of the subtree `below` of the filespace `filespace` (at `walked`) takes
/// what a walk of the whole filespace takes there: no ancestor of it is excluded, and it is
/// included on its own merits. (A walk of the filespace decides below it from its ancestors'
/// verdicts, which the subtree's walk does not know; and it takes its own root whatever the
/// patterns say.)
fn filtered_alike(filter: &Filter, filespace: &str, below: &[u8], walked: &Path) -> bool {
    use crate::filter::Verdict;
    use std::os::unix::ffi::OsStrExt;
    let root = Path::new(filespace);
    let ancestors_kept = below.iter().enumerate().filter(|(_, b)| **b == b'/').all(|(i, _)| {
        let up = &below[..i];
        filter.verdict(up, &root.join(std::ffi::OsStr::from_bytes(up)), true, false)
            != Verdict::Excluded
    });
    ancestors_kept && filter.verdict(below, walked, walked.is_dir(), false) == Verdict::Included
}

/// Whether `entry` differs from its active version. An inode of 0 was not recorded (versions
/// from before it was) and is not compared.
fn changed(entry: &Entry, active: &(ObjectType, Attributes), ignore_inode: bool) -> bool {
    let (t, a) = active;
    let inode_differs = !ignore_inode && a.ino != 0 && a.ino != entry.attrs.ino;
    inode_differs
        || *t != entry.object_type
        || a.size != entry.attrs.size
        || a.mtime_ns != entry.attrs.mtime_ns
        || a.ctime_ns != entry.attrs.ctime_ns
        || a.mode != entry.attrs.mode
        || a.uid != entry.attrs.uid
        || a.gid != entry.attrs.gid
        || a.link_target != entry.attrs.link_target
        || a.rdev != entry.attrs.rdev
        || a.xattrs != entry.attrs.xattrs
}

/// Called after each object sent with the counts so far (for progress displays).
pub type Progress<'a> = dyn FnMut(&BackupSummary) + 'a;

/// Backs up `root` to `server`.
pub fn backup(
    server: &dyn Server,
    root: &Path,
    options: &BackupOptions,
    progress: &mut Progress<'_>,
) -> Result<BackupSummary> {
    run(server, root, options, None, progress)
}

/// Archives `root` for `node`: every entry is sent, whatever the backups hold, as an archive
/// with `description`, kept as its management class's archive copy group says, or for
/// `retain_days` if that is longer ([`crate::server::archive_retention`]).
pub fn archive(
    server: &dyn Server,
    root: &Path,
    description: &str,
    retain_days: Option<u32>,
    options: &BackupOptions,
    progress: &mut Progress<'_>,
) -> Result<BackupSummary> {
    // Only a requested retention is sent: the server keeps the class's unless this is longer.
    let until = retain_days.map(|d| now().saturating_add(i64::from(d) * 86_400));
    run(server, root, options, Some((description.to_owned(), until)), progress)
}

/// Active versions read ahead of the merge.
const INVENTORY_AHEAD: usize = 4096;

/// Entries the walker hands to the reader: a bounded queue, so the walk never runs far ahead.
const WALK_QUEUE: usize = 1024;

/// The whole backup (or archive) as one pipeline across files, the way ADSM's stages
/// overlapped: a walker thread decides what to send, the pipeline's reader cuts every file
/// into quanta, all cores encode them, and this thread appends frames to the batch in order,
/// beginning and ending objects as their first and last quanta arrive. Small files no longer
/// compress one at a time.
fn run(
    server: &dyn Server,
    root: &Path,
    options: &BackupOptions,
    archive: Option<(String, Option<i64>)>,
    progress: &mut Progress<'_>,
) -> Result<BackupSummary> {
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    // Walk what the path names: a root given through a symlink is walked where it points,
    // not recorded as one symlink (which would deactivate everything below).
    let canonical = std::path::PathBuf::from(filespace_name(root)?);
    // Into the filespace that contains it: `below` is where the walk sits in it.
    let (name, below) = target_filespace(server, root, options.filespace.as_deref())?;
    let fs = server.open_filespace(&name, true)?.ok_or_else(|| {
        ClientError::Invalid(format!("{}: no filespace {name}", server.describe()))
    })?;
    let setting = options.compression;
    FrameEncoder::new(setting).map_err(|e| ClientError::Invalid(e.to_string()))?;
    let quantum = qsm_codec::DEFAULT_QUANTUM;
    let mut summary = BackupSummary {
        filespace: name,
        subtree: (!below.is_empty()).then(|| below.clone()),
        ..BackupSummary::default()
    };
    let keys = options.encryption.as_deref();
    summary.key_fingerprint = keys.map(|k| k.fingerprint.clone());
    let dedup = if options.dedup { Some(Dedup::start(server, options, keys)?) } else { None };
    if let Some(d) = &dedup {
        summary.cache_note = d.note.clone();
    }
    // Chunk ids: keyed with the node key when encrypting, else with the dedup scope's secret.
    let ids = keys.map(|k| k.ids.clone()).or_else(|| dedup.as_ref().map(|d| d.ids.clone()));
    let sealer = keys.map(|k| crate::keys::TimedSealer::new(&k.frames));
    let sealer = sealer.as_ref();
    let ids_ref = ids.as_ref();
    let shared = dedup.is_some();
    // The journal's plan covers a whole filespace: a subtree's backup scans (the subtree
    // only), and leaves the journal's changes pending for the next backup of the filespace.
    if let Some(path) = options.journal.as_deref()
        && !below.is_empty()
        && !options.full
        && archive.is_none()
    {
        let watched = crate::journal::Journal::open(path)?.journaled(&summary.filespace)?;
        summary.journal_routine = !watched;
        summary.journal = Some(format!(
            "scanned: a subtree of filespace {}, whose journal (if any) serves backups of the \
             whole filespace",
            summary.filespace
        ));
    }
    // A subtree's backup that takes what a backup of the whole filespace would take there
    // keeps the journal serving: the filespace's generation before it, to move the journal's
    // record on once it has committed (`Journal::advanced`).
    let journal_kept = match options.journal.as_deref() {
        Some(path)
            if !below.is_empty()
                && !options.full
                && archive.is_none()
                && filtered_alike(
                    &options.filter,
                    &summary.filespace,
                    below.as_slice(),
                    &canonical,
                ) =>
        {
            Some((path, generation(server, &summary.filespace)?))
        }
        _ => None,
    };
    let journal = match (&options.journal, options.full || archive.is_some() || !below.is_empty()) {
        (Some(path), false) => Some(JournalUse::start(
            path,
            server,
            &summary.filespace,
            &crate::journal::selection(&options.filter, keys.map(|k| k.fingerprint.as_str())),
        )?),
        _ => None,
    };
    let journal_changes = match &journal {
        Some(j) => match &j.plan {
            crate::journal::Plan::Journal { changes, .. } => {
                summary.journal = Some(format!("{} changes from the journal", changes.len()));
                summary.journal_used = true;
                Some(changes.clone())
            }
            crate::journal::Plan::Scan { why, .. } => {
                summary.journal = Some(format!("scanned: {why}"));
                summary.journal_routine = !j.watched;
                None
            }
        },
        None => None,
    };
    // Bindings to classes the node's domain lacks would silently bind to the default: say so.
    let mut bindings = options.bindings.clone();
    let mut default_class = options.default_class.clone();
    if !bindings.is_empty() || default_class.is_some() {
        let known: Vec<String> = server.mgmt_classes()?.into_iter().map(|c| c.name).collect();
        let mut unknown = bindings.keep_known(&known);
        if let Some(c) = default_class.take_if(|c| !known.contains(c)) {
            unknown.push(c);
        }
        for class in unknown {
            summary.warnings.push(format!(
                "management class {class} is not in the node's policy domain (it has: {}): its files are bound to the default class",
                known.join(", ")
            ));
        }
    }
    let classes = Classes { bindings: &bindings, default: default_class.as_deref() };
    let kind = if archive.is_none() && below.is_empty() {
        UploadKind::Backup
    } else {
        UploadKind::Partial
    };
    let mut batch = server.upload(fs, options.limits, kind)?;
    let mut throttle = options.limit_upload.map(Throttle::new);
    let (tx, rx) = crossbeam_channel::bounded::<Work>(WALK_QUEUE);
    // Set when the pipeline stops on an error, so the walk stops too instead of finishing the
    // tree for nothing.
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let threads = options.threads.unwrap_or_else(qsm_codec::engine::default_threads);
    let controller = match options.adaptive {
        Some(objective) => Controller::adaptive(threads, objective),
        None => Controller::fixed(setting),
    }
    .with_link_limit(options.limit_upload)
    .storing_here(server.stores_here())
    .with_server_on_this_machine(server.shares_this_machine())
    .with_cpu_clock(cpu_seconds)
    .with_machine_clock(machine_cpu);
    let controller = &controller;
    let is_archive = archive.is_some();
    let scan = ScanProgress::default();
    let scan = &scan;
    let below = &below;
    let mut last_progress = Instant::now();

    let outcome = std::thread::scope(|scope| {
        // The inventory streams on its own thread, a bounded queue ahead of the merge, so
        // reading and decoding it overlaps the walk.
        let inventory = (!is_archive).then(|| {
            let (inv_tx, inv_rx) = crossbeam_channel::bounded(INVENTORY_AHEAD);
            let reader = scope.spawn(move || {
                // A subtree's backup compares (and may deactivate) only what is below it. The
                // whole inventory still streams past: the node interface has no prefix query.
                server.inventory(fs, Scope::Active, &mut |v| {
                    if !scan::within(&v.path, below) {
                        return Ok(());
                    }
                    inv_tx.send(v).map_err(|_| ServerError::Cancelled("backup stopped".into()))
                })
            });
            (inv_rx, reader)
        });
        let walker = scope.spawn(move || {
            let walk_options = scan::WalkOptions {
                one_file_system: options.one_file_system,
                filter: &options.filter,
                threads,
            };
            let mut merge = Merge {
                tx,
                stop,
                scan,
                selective: options.full || is_archive,
                ignore_inode: options.ignore_inode,
                next: None,
                last_inventory: None,
                kept: Vec::new(),
                unchanged: 0,
                warnings: Vec::new(),
                skipped: Vec::new(),
                links: HashMap::new(),
                sealed_by: keys.map(|k| k.key_id),
                resealed: 0,
            };
            if let Some(changes) = journal_changes {
                // The journal lists what changed: no scan, no inventory.
                drop(inventory);
                let result = merge.journal(&canonical, changes, &walk_options);
                scan.done.store(true, Ordering::Relaxed);
                let examined = scan.examined.load(Ordering::Relaxed);
                return (result, examined, 0, merge.warnings, merge.skipped, 0);
            }
            let result = scan::walk_sorted_at(&canonical, below.clone(), &walk_options, |events| {
                if let Some((versions, reader)) = inventory {
                    for v in versions.iter() {
                        merge.inventory(events, v)?;
                    }
                    // The queue ended: the whole inventory, or the reader failed. Only a
                    // complete inventory makes the rest of the walk new.
                    reader.join().map_err(|_| {
                        ClientError::Invalid("the inventory reader panicked".into())
                    })??;
                }
                merge.rest(events)
            })
            .and_then(|r| r);
            scan.done.store(true, Ordering::Relaxed);
            let examined = scan.examined.load(Ordering::Relaxed);
            (result, examined, merge.unchanged, merge.warnings, merge.skipped, merge.resealed)
        });

        let mut reader = Reader::new(rx, quantum, dedup, server, options.changing_retries);
        // Shared chunks sent in objects that ended: what the cache may learn once everything
        // is committed (chunks of an abandoned object never are).
        let mut ended = Ended { shared, sealed: keys.is_some(), ..Ended::default() };
        let mut store_error = None;
        // Every stage reports its busy time to the controller, which picks each quantum's
        // setting from them (adaptive), or only counts what was used (fixed).
        // The reader's and the sender's clocks, each made on its stage's own thread; they
        // count waits for a core with `auto` only, whose controller weighs them.
        let adaptive = controller.is_adaptive();
        let (mut reader_clock, mut sender_clock) = (None, None);
        let result = qsm_codec::pipeline::run(
            threads,
            |_, piece: &mut Piece| {
                let clock =
                    reader_clock.get_or_insert_with(|| StageClock::of_this_thread(adaptive));
                let began = Instant::now();
                let more = reader.next(piece)?;
                let seconds = clock.end(began, piece.has_data());
                if piece.has_data() {
                    controller.read(controller.now(), piece.raw_len, seconds);
                }
                if let Some(waited) = clock.waited() {
                    controller.read_waited(controller.now(), waited);
                }
                Ok(more)
            },
            || Ok(Encoders::new(controller)),
            |encoders, seq, piece| {
                // Chosen when the quantum is compressed, not when it is read: the reader runs
                // a dozen quanta ahead, and the decision should be as fresh as possible.
                piece.rung = controller.choose(controller.now(), seq);
                let started = Instant::now();
                let cpu = controller.is_adaptive().then(thread_cpu_seconds);
                piece.encode(encoders.get(piece.rung)?, ids_ref, sealer)?;
                if let Some(cpu) = cpu {
                    controller.compressing_cpu(thread_cpu_seconds() - cpu);
                }
                if let Some(h) = &piece.header {
                    controller.compressed(
                        controller.now(),
                        seq,
                        piece.rung,
                        piece.raw_len,
                        h.frame_len(),
                        h.is_raw(),
                        started.elapsed().as_secs_f64(),
                    );
                }
                Ok(())
            },
            |seq, piece| {
                let clock =
                    sender_clock.get_or_insert_with(|| StageClock::of_this_thread(adaptive));
                let began = Instant::now();
                piece
                    .commit_to(batch.as_mut(), fs, &archive, &classes, &mut ended, &mut summary)
                    .map_err(|e| {
                    store_error = Some(e);
                    qsm_codec::Error::Invalid("the server failed".into())
                })?;
                if let (Some(t), Some(h)) = (throttle.as_mut(), piece.header.as_ref()) {
                    t.pass(h.frame_len() as u64);
                }
                let seconds = clock.end(began, piece.header.is_some());
                if let Some(h) = &piece.header {
                    controller.sent(controller.now(), seq, piece.raw_len, h.frame_len(), seconds);
                }
                if let Some(waited) = clock.waited() {
                    controller.send_waited(controller.now(), waited);
                }
                if controller.is_adaptive()
                    && let Some(load) = batch.server_load()
                {
                    controller.server(controller.now(), load);
                }
                if last_progress.elapsed() >= PROGRESS_INTERVAL {
                    last_progress = Instant::now();
                    summary.examined = scan.examined.load(Ordering::Relaxed);
                    summary.queued_bytes = scan.queued_bytes.load(Ordering::Relaxed);
                    summary.scan_done = scan.done.load(Ordering::Relaxed);
                    progress(&summary);
                }
                Ok(())
            },
        );
        // Unblock the walker if the pipeline stopped early: dropping the reader closes the queue.
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let result = result.and_then(|n| match reader.failed.take() {
            Some(e) => {
                store_error = Some(e);
                Err(qsm_codec::Error::Invalid("the server failed".into()))
            }
            None => Ok(n),
        });
        let dedup = reader.dedup.take();
        drop(reader);
        let walked = walker.join();
        (walked, result, store_error, dedup, ended.ids)
    });
    let (walked, pipeline_result, store_error, dedup, ended) = outcome;
    if let Some(d) = &dedup {
        summary.cache_hits = d.cache_hits;
        summary.asked = d.asked;
    }
    if let Some(s) = sealer {
        summary.encrypted_bytes = s.bytes.load(Ordering::Relaxed);
        summary.encrypt_seconds = s.nanos.load(Ordering::Relaxed) as f64 / 1e9;
    }
    // A failed backup may leave the cache believing in chunks never committed: drop it.
    let forget_cache = || {
        if let Some(path) = options.dedup_cache.as_ref().filter(|_| options.dedup) {
            let _ = std::fs::remove_file(path);
        }
    };
    if let Some(e) = store_error {
        forget_cache();
        return Err(e);
    }
    let (walk_result, examined, unchanged, warnings, skipped, resealed) =
        walked.map_err(|_| ClientError::Invalid("the directory walk panicked".into()))?;
    // The pipeline's error first: when it fails, the walk only reports that it was stopped.
    if let Err(e) = pipeline_result {
        forget_cache();
        return Err(ClientError::Invalid(format!("backup of {}: {e}", root.display())));
    }
    walk_result?;
    summary.examined = examined;
    summary.unchanged = unchanged;
    summary.resealed = resealed;
    summary.failed += warnings.len() as u64;
    summary.warnings.extend(warnings);
    summary.skipped = skipped.len() as u64;
    summary.warnings.extend(skipped);
    if let Err(e) = batch.finish(summary.failed + summary.skipped) {
        forget_cache();
        return Err(e.into());
    }
    // Everything is committed: the journal's changes up to the backup's start are done.
    if let Some(j) = journal
        && let Err(e) = j.finish(server, &summary.filespace, summary.failed > 0)
    {
        summary.warnings.push(format!("change journal not updated: {e}"));
    }
    if let Some((path, before)) = journal_kept {
        let kept = generation(server, &summary.filespace).and_then(|after| {
            crate::journal::Journal::open(path)?.advanced(
                &summary.filespace,
                &server.describe(),
                before,
                after,
                &crate::journal::selection(&options.filter, keys.map(|k| k.fingerprint.as_str())),
            )
        });
        if let Err(e) = kept {
            summary.warnings.push(format!("change journal not updated: {e}"));
        }
    }
    // Everything is committed: what this backup sent is on the server now.
    if let (Some(d), Some(path)) = (dedup, &options.dedup_cache)
        && let Err(e) = d.save(path, &ended)
    {
        summary.warnings.push(format!("{}: dedup cache not saved: {e}", path.display()));
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.cpu_seconds = cpu_seconds() - cpu_start;
    summary.compression = controller.report();
    Ok(summary)
}

/// What the walker hands the reader: an entry to send, or the path of an active version whose
/// file is gone.
enum Work {
    /// Boxed: an entry is ten times the size of the other variants, and the queue holds many.
    Send(Box<Entry>),
    Gone(Vec<u8>),
    /// Everything below a path gone (journal-based backup).
    GoneBelow(Vec<u8>),
}

/// The walk merged with the active inventory, both in path order: one pass, and memory that
/// does not grow with the number of files (the inventory is never held whole).
struct Merge<'a> {
    tx: crossbeam_channel::Sender<Work>,
    stop: &'a AtomicBool,
    scan: &'a ScanProgress,
    /// Send every entry, changed or not.
    selective: bool,
    ignore_inode: bool,
    /// The walk's next entry, taken from the iterator but not yet merged.
    next: Option<scan::Event>,
    /// The last inventory path, to check the server keeps its order.
    last_inventory: Option<Vec<u8>>,
    /// Paths that could not be examined: their active versions, and those below, are kept.
    kept: Vec<Vec<u8>>,
    unchanged: u64,
    /// Entries that could not be examined or backed up whole: each a failure.
    warnings: Vec<String>,
    /// Entries not backed up by design (sockets): notes, not failures.
    skipped: Vec<String>,
    /// The first name (in path order) of each multiply linked file seen, by device and
    /// inode: later names of the group become `Hardlink` objects pointing at it.
    links: HashMap<(u64, u64), Vec<u8>>,
    /// The key this backup seals with (encryption on): recorded with every file with data.
    sealed_by: Option<[u8; 16]>,
    /// Files sent again only to be sealed with it.
    resealed: u64,
}

impl Merge<'_> {
    /// Readies a walked entry for comparison and sending: a later name of a link group
    /// becomes a `Hardlink` to the group's first name (so the data is stored once), and
    /// attributes that could not be read become a warning.
    ///
    /// The first name in path order holds the data. The walk is in path order, so it is the
    /// same name backup after backup while the group is unchanged, and an incremental backup
    /// compares each name with its own active version as usual: a change of the inode's
    /// content or metadata changes its ctime, which every name shares, so every name is sent
    /// again (the later ones as small `Hardlink` records). If the first name goes, the next
    /// one becomes a `File` (its type changed, so it is sent with its data). A journal-based
    /// backup sees only the names the journal reports: a changed name whose first name is
    /// not among them is stored with its data and restored as a separate file until the next
    /// full scan.
    fn prepare(&mut self, mut e: Entry) -> Entry {
        if let Some(why) = e.xattr_error.take() {
            self.warnings.push(format!(
                "{}: backed up without its extended attributes: {why}",
                e.path.display()
            ));
        }
        if let Some(key) = self.sealed_by.filter(|_| e.object_type == ObjectType::File)
            && e.attrs.data_len() > 0
        {
            e.attrs.sealed_by = Some(key);
        }
        if e.object_type == ObjectType::File && e.nlink > 1 {
            match self.links.entry((e.dev, e.attrs.ino)) {
                std::collections::hash_map::Entry::Occupied(first) => {
                    e.object_type = ObjectType::Hardlink;
                    e.attrs.link_target = Some(first.get().clone());
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(e.rel.clone());
                }
            }
        }
        e
    }

    fn skip(&mut self, path: &Path) {
        self.skipped.push(format!("{}: a socket, not backed up", path.display()));
    }

    fn send(&self, work: Work) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(ClientError::Invalid("backup stopped".into()));
        }
        if let Work::Send(e) = &work {
            self.scan.queued_bytes.fetch_add(e.attrs.size, Ordering::Relaxed);
        }
        // The reader stopped (a fatal error): stop walking too.
        self.tx.send(work).map_err(|_| ClientError::Invalid("backup stopped".into()))
    }

    fn examine(&self) {
        self.scan.examined.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the walk's events up to the inventory path `upto` (all of them with `None`):
    /// entries before it are new, an unreadable path at or before it is remembered. Returns the
    /// walk's entry at exactly `upto`, if there is one.
    fn advance(
        &mut self,
        events: &mut dyn Iterator<Item = scan::Event>,
        upto: Option<&[u8]>,
    ) -> Result<Option<Entry>> {
        loop {
            let Some(event) = self.next.take().or_else(|| events.next()) else {
                return Ok(None);
            };
            match event {
                scan::Event::Unreadable { path, rel, error } => {
                    if upto.is_some_and(|p| rel.as_slice() > p) {
                        self.next = Some(scan::Event::Unreadable { path, rel, error });
                        return Ok(None);
                    }
                    self.warnings.push(format!("{}: not examined: {error}", path.display()));
                    self.kept.push(rel);
                }
                scan::Event::Skipped { path, rel } => {
                    if upto.is_some_and(|p| rel.as_slice() > p) {
                        self.next = Some(scan::Event::Skipped { path, rel });
                        return Ok(None);
                    }
                    // At `upto` too: the version there is of something else, now gone.
                    self.skip(&path);
                }
                scan::Event::Entry(e) => match upto.map(|p| e.rel.as_slice().cmp(p)) {
                    Some(std::cmp::Ordering::Equal) => return Ok(Some(e)),
                    Some(std::cmp::Ordering::Greater) => {
                        self.next = Some(scan::Event::Entry(e));
                        return Ok(None);
                    }
                    _ => {
                        self.examine();
                        let e = self.prepare(e);
                        self.send(Work::Send(Box::new(e)))?;
                    }
                },
            }
        }
    }

    /// Merges one active version: its file unchanged, changed, or gone.
    fn inventory(
        &mut self,
        events: &mut dyn Iterator<Item = scan::Event>,
        v: qsm_types::model::ObjectVersion,
    ) -> Result<()> {
        if self.last_inventory.as_ref().is_some_and(|last| last.as_slice() >= v.path.as_slice()) {
            return Err(ServerError::Failed(
                "the server's active inventory is not in path order".into(),
            )
            .into());
        }
        match self.advance(events, Some(&v.path))? {
            Some(e) => {
                self.examine();
                let e = self.prepare(e);
                let active = (v.object_type, v.attrs);
                let differs = changed(&e, &active, self.ignore_inode);
                let seal = needs_sealing(&e, &active);
                if !self.selective && !differs && !seal {
                    self.unchanged += 1;
                } else {
                    if seal && !differs && !self.selective {
                        self.resealed += 1;
                    }
                    self.send(Work::Send(Box::new(e)))?;
                }
            }
            None => {
                let kept = self.kept.iter().any(|k| {
                    k.is_empty()
                        || *k == v.path
                        || (v.path.starts_with(k) && v.path.get(k.len()) == Some(&b'/'))
                });
                if !kept {
                    self.send(Work::Gone(v.path.clone()))?;
                }
            }
        }
        self.last_inventory = Some(v.path);
        Ok(())
    }

    /// The rest of the walk, after the inventory's end: all new.
    fn rest(&mut self, events: &mut dyn Iterator<Item = scan::Event>) -> Result<()> {
        self.advance(events, None).map(|_| ())
    }

    /// A journal-based backup: each changed path is sent if it exists and deactivated (with
    /// everything below it) if it does not; a directory created or moved in is walked whole,
    /// after what was below its name before is deactivated. Whatever a path is now, what was
    /// below it (if it was a directory) is deactivated unless it is a directory still.
    fn journal(
        &mut self,
        root: &Path,
        changes: Vec<crate::journal::Change>,
        walk_options: &scan::WalkOptions<'_>,
    ) -> Result<()> {
        use crate::filter::Verdict;
        use std::os::unix::ffi::OsStrExt;
        let at = |rel: &[u8]| {
            if rel.is_empty() {
                root.to_path_buf()
            } else {
                root.join(std::ffi::OsStr::from_bytes(rel))
            }
        };
        // Directories walked whole: their contents are sent, nothing below them again.
        let mut walked: HashSet<Vec<u8>> = HashSet::new();
        'changes: for change in changes {
            let rel = change.rel;
            // Through its ancestors as they are now: below an excluded directory, or one that
            // is a directory no more (a symlink put in its place must not be followed), the
            // path is not backed up.
            let mut parent_included = false;
            let mut excluded = false;
            for (i, b) in rel.iter().enumerate() {
                if *b != b'/' {
                    continue;
                }
                let up = &rel[..i];
                if walked.contains(up) {
                    continue 'changes;
                }
                let p = at(up);
                let meta = scan::reach(&p).and_then(|r| std::fs::symlink_metadata(r.path()));
                if !meta.is_ok_and(|m| m.is_dir()) {
                    self.gone(&rel)?;
                    continue 'changes;
                }
                match walk_options.filter.verdict(up, &p, true, parent_included) {
                    Verdict::Excluded => excluded = true,
                    Verdict::Included => parent_included = true,
                    Verdict::Unmatched => {}
                }
            }
            if walked.contains(&rel) {
                continue;
            }
            let path = at(&rel);
            let entry = match scan::entry(&path, rel.clone()) {
                Ok(Some(e)) => self.prepare(e),
                // A socket now: not backed up, and what was there is gone.
                Ok(None) => {
                    self.skip(&path);
                    self.gone(&rel)?;
                    continue;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) =>
                {
                    self.gone(&rel)?;
                    continue;
                }
                Err(e) => {
                    self.warnings.push(format!("{}: not examined: {e}", path.display()));
                    continue;
                }
            };
            let is_dir = entry.object_type == ObjectType::Directory;
            let skipped = match walk_options.filter.verdict(&rel, &path, is_dir, parent_included) {
                Verdict::Excluded => true,
                // Includes are given and this matches none: only directories are recorded.
                Verdict::Unmatched => !is_dir,
                Verdict::Included => false,
            };
            // Not taken now: inactive, with everything below it, as a scan leaves it.
            if !rel.is_empty() && (excluded || skipped) {
                self.gone(&rel)?;
                continue;
            }
            if !is_dir {
                // It may have been a directory: its old contents go.
                self.send(Work::GoneBelow(rel))?;
                self.examine();
                self.send(Work::Send(Box::new(entry)))?;
                continue;
            }
            if !change.tree {
                self.examine();
                self.send(Work::Send(Box::new(entry)))?;
                continue;
            }
            self.send(Work::GoneBelow(rel.clone()))?;
            scan::walk_sorted_at(&path, rel.clone(), walk_options, |events| -> Result<()> {
                for event in events {
                    match event {
                        scan::Event::Entry(e) => {
                            self.examine();
                            let e = self.prepare(e);
                            self.send(Work::Send(Box::new(e)))?;
                        }
                        scan::Event::Skipped { path, .. } => self.skip(&path),
                        scan::Event::Unreadable { path, error, .. } => {
                            self.warnings
                                .push(format!("{}: not examined: {error}", path.display()));
                        }
                    }
                }
                Ok(())
            })??;
            walked.insert(rel);
        }
        Ok(())
    }

    /// `rel` and everything below it are gone.
    fn gone(&self, rel: &[u8]) -> Result<()> {
        self.send(Work::Gone(rel.to_vec()))?;
        self.send(Work::GoneBelow(rel.to_vec()))
    }
}

/// Which management class each object is bound to.
struct Classes<'a> {
    bindings: &'a crate::filter::Bindings,
    default: Option<&'a str>,
}

/// The change journal of one backup: its plan, made before anything is read, and recorded as
/// consumed once the backup committed.
struct JournalUse {
    journal: crate::journal::Journal,
    plan: crate::journal::Plan,
    /// The root is journaled at all (otherwise scanning is the normal course).
    watched: bool,
    server: String,
    /// The backup's include/exclude patterns ([`Filter::fingerprint`]).
    patterns: String,
}

fn generation(server: &dyn Server, name: &str) -> Result<i64> {
    server
        .filespaces()?
        .into_iter()
        .find(|f| f.name == name)
        .map(|f| f.generation)
        .ok_or_else(|| ClientError::Invalid(format!("{}: no filespace {name}", server.describe())))
}

impl JournalUse {
    fn start(path: &Path, server: &dyn Server, name: &str, patterns: &str) -> Result<JournalUse> {
        let journal = crate::journal::Journal::open(path)?;
        let key = server.describe();
        let plan = journal.plan(name, &key, generation(server, name)?, patterns)?;
        let watched = journal.journaled(name)?;
        Ok(JournalUse { journal, plan, watched, server: key, patterns: patterns.to_owned() })
    }

    /// The backup committed; `skipped` files it could not read or that changed under it.
    fn finish(mut self, server: &dyn Server, name: &str, skipped: bool) -> Result<()> {
        let mark = match &self.plan {
            crate::journal::Plan::Journal { mark, .. } => mark,
            crate::journal::Plan::Scan { mark: Some(mark), .. } => mark,
            crate::journal::Plan::Scan { mark: None, .. } => return Ok(()),
        };
        if skipped {
            return self.journal.skipped(name, &self.server, mark);
        }
        let g = generation(server, name)?;
        self.journal.consumed(name, &self.server, mark, g, &self.patterns)
    }
}

/// What becomes of a chunk: decided by the reader, in stream order, before any worker sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Fate {
    /// Encoded and sent (the default, and every chunk without deduplication).
    #[default]
    Send,
    /// The server holds it, or this backup sent it earlier in the stream: referenced by id.
    Known,
}

/// A worker's encoders, one per rung of the controller's ladder, made when first used.
struct Encoders {
    ladder: Vec<Compression>,
    made: Vec<Option<FrameEncoder>>,
}

impl Encoders {
    fn new(controller: &Controller) -> Encoders {
        let ladder: Vec<Compression> = controller.ladder().iter().map(|r| r.compression).collect();
        let made = ladder.iter().map(|_| None).collect();
        Encoders { ladder, made }
    }

    fn get(&mut self, rung: usize) -> std::result::Result<&mut FrameEncoder, qsm_codec::Error> {
        let setting = *self
            .ladder
            .get(rung)
            .ok_or_else(|| qsm_codec::Error::Invalid(format!("no compression rung {rung}")))?;
        let slot = &mut self.made[rung];
        let encoder = match slot.take() {
            Some(encoder) => encoder,
            None => FrameEncoder::new(setting)?,
        };
        Ok(slot.insert(encoder))
    }
}

/// One quantum of one object on its way through the pipeline, with the object's metadata on
/// its first quantum. Buffers are reused from piece to piece.
#[derive(Default)]
struct Piece {
    /// Set on an object's first piece: the entry to begin.
    begin: Option<Entry>,
    /// Raw data of this quantum (`raw[..raw_len]`); empty for directories, symlinks, empty files.
    raw: Vec<u8>,
    raw_len: usize,
    /// Its keyed id (with deduplication or encryption).
    id: Option<[u8; 32]>,
    fate: Fate,
    /// The encoded frame (`frame[..header.frame_len()]`).
    frame: Vec<u8>,
    header: Option<qsm_codec::FrameHeader>,
    /// The object's last piece.
    last: bool,
    /// The file failed while being read: the object is dropped with this warning.
    failed: Option<String>,
    /// The file changed while being read and will be read again: the object is dropped
    /// without a warning (`failed` says why).
    retry: bool,
    /// The controller's rung for this quantum.
    rung: usize,
    /// Not an object: the active version of this path (or, when set, of everything below
    /// it) is to be marked inactive.
    gone: Option<(Vec<u8>, bool)>,
}

impl Piece {
    fn has_data(&self) -> bool {
        self.raw_len > 0 && self.failed.is_none()
    }

    fn encode(
        &mut self,
        encoder: &mut FrameEncoder,
        ids: Option<&ChunkIdKey>,
        sealer: Option<&crate::keys::TimedSealer<'_>>,
    ) -> std::result::Result<(), qsm_codec::Error> {
        self.header = None;
        if !self.has_data() || self.fate == Fate::Known {
            return Ok(());
        }
        let raw = &self.raw[..self.raw_len];
        // Without deduplication the reader leaves ids to the workers, where they run on all
        // cores.
        if self.id.is_none() {
            self.id = ids.map(|k| k.id(raw).0);
        }
        let header = match (sealer, &self.id) {
            (Some(sealer), Some(id)) => encoder.encode_sealed(raw, &mut self.frame, sealer, id),
            _ => encoder.encode(raw, &mut self.frame),
        }
        .map_err(|source| qsm_codec::Error::Quantum { index: 0, offset: 0, source })?;
        self.header = Some(header);
        Ok(())
    }

    fn commit_to(
        &self,
        batch: &mut dyn Upload,
        fs: FilespaceId,
        archive: &Option<(String, Option<i64>)>,
        classes: &Classes<'_>,
        ended: &mut Ended,
        summary: &mut BackupSummary,
    ) -> Result<()> {
        let shared = ended.shared;
        if let Some((path, tree)) = &self.gone {
            if *tree {
                batch.deactivate_tree(path)?;
            } else {
                batch.deactivate(path)?;
                summary.deactivated += 1;
            }
            return Ok(());
        }
        if let Some(entry) = &self.begin {
            let object = NewObject {
                filespace: fs,
                path: entry.rel.clone(),
                kind: if archive.is_some() { ObjectKind::Archive } else { ObjectKind::Backup },
                object_type: entry.object_type,
                attrs: entry.attrs.clone(),
                mgmt_class: None,
                description: archive.as_ref().map(|(d, _)| d.clone()),
                retain_until: archive.as_ref().and_then(|(_, until)| *until),
                chunks: Vec::new(),
                replica: None,
            };
            let is_dir = entry.object_type == ObjectType::Directory;
            let class =
                classes.bindings.class_of(&entry.rel, &entry.path, is_dir).or(classes.default);
            batch.begin_object(object, entry.attrs.size, class)?;
        }
        if let Some(why) = &self.failed {
            batch.abandon_object()?;
            ended.current.clear();
            if self.retry {
                summary.retried += 1;
            } else {
                summary.failed += 1;
                summary.warnings.push(why.clone());
            }
            return Ok(());
        }
        if self.raw_len > 0 {
            summary.chunks += 1;
        }
        match (&self.header, self.fate, &self.id) {
            (Some(header), _, id) => {
                let frame = &self.frame[..header.frame_len()];
                match id {
                    Some(id) => {
                        batch.append_chunk(frame, id, shared)?;
                        if shared {
                            ended.current.push(*id);
                        }
                    }
                    None => batch.append_frame(frame)?,
                }
                summary.bytes_stored += header.frame_len() as u64;
            }
            (None, Fate::Known, Some(id)) if self.raw_len > 0 => {
                batch.reference_chunk(id, ended.sealed)?;
                summary.dedup_chunks += 1;
                summary.dedup_bytes += self.raw_len as u64;
            }
            _ => {}
        }
        summary.bytes_read += self.raw_len as u64;
        if !self.last {
            return Ok(());
        }
        batch.end_object()?;
        ended.ids.append(&mut ended.current);
        if ended.ids.len() > 2 * DEDUP_CACHE_IDS {
            // Only the newest can stay in the cache anyway.
            ended.ids.drain(..DEDUP_CACHE_IDS);
        }
        summary.backed_up += 1;
        Ok(())
    }
}

/// Shared chunks sent, by whether their object ended (committed with the batch) or is still
/// being sent (dropped if it is abandoned).
#[derive(Default)]
struct Ended {
    shared: bool,
    /// Chunks are sealed (encryption on): references name sealed chunks.
    sealed: bool,
    current: Vec<[u8; 32]>,
    ids: Vec<[u8; 32]>,
}

/// Deduplication state of one backup: the chunker's parameters, the cache of what the
/// server holds, and what this backup has sent.
struct Dedup {
    ids: ChunkIdKey,
    /// Chunks are sealed: the server is asked about sealed chunks.
    sealed: bool,
    seed: u64,
    sizes: ChunkSizes,
    /// Chunk ids the server has committed (loaded from the previous backups, grown by the
    /// server's answers).
    cache: DedupCache,
    /// Chunk ids this backup sent: referenced by later occurrences, added to the cache once
    /// everything is committed. Bounded like the cache; an id that falls out is sent again,
    /// and the server then keeps one copy all the same.
    sent: DedupCache,
    note: Option<String>,
    cache_hits: u64,
    asked: u64,
}

impl Dedup {
    fn start(
        server: &dyn Server,
        options: &BackupOptions,
        keys: Option<&NodeKeys>,
    ) -> Result<Dedup> {
        let info = server.dedup_info()?;
        let ids = match keys {
            Some(k) => k.ids.clone(),
            None => ChunkIdKey::from_scope_secret(&info.scope_secret),
        };
        // The cache is valid for one pool, scope and key: an id keyed otherwise means nothing.
        let owner = format!(
            "{}#{}#{}",
            info.pool,
            info.scope,
            keys.map_or("plain", |k| k.fingerprint.as_str())
        );
        let (cache, note) = match &options.dedup_cache {
            Some(path) => DedupCache::load(path, &owner, info.epoch, DEDUP_CACHE_IDS),
            None => (DedupCache::new(&owner, info.epoch, DEDUP_CACHE_IDS), None),
        };
        Ok(Dedup {
            sealed: keys.is_some(),
            seed: ids.chunker_seed(),
            ids,
            sizes: ChunkSizes::DEFAULT,
            sent: DedupCache::new(&owner, info.epoch, DEDUP_CACHE_IDS),
            cache,
            note,
            cache_hits: 0,
            asked: 0,
        })
    }

    /// Saves the cache with the chunks this backup committed (`ended`: those of objects that
    /// ended; a chunk sent for an object abandoned later was never committed).
    fn save(mut self, path: &Path, ended: &[[u8; 32]]) -> std::io::Result<()> {
        for id in ended {
            self.cache.insert(ChunkId(*id));
        }
        if let Some(dir) = path.parent() {
            // Owner-only, as the cache itself: what it lists tells what the node holds.
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(dir)?;
        }
        self.cache.save(path)
    }

    /// Decides the fate of every chunk of `window`, in order: ids the cache or the server
    /// knows, or that an earlier piece sends, are referenced; the rest are sent.
    fn decide(&mut self, server: &dyn Server, window: &mut VecDeque<Piece>) -> Result<()> {
        let mut ask: Vec<[u8; 32]> = Vec::new();
        let mut asking = HashSet::new();
        for p in window.iter().filter(|p| p.has_data()) {
            if let Some(id) = p.id {
                let known = self.cache.contains(&ChunkId(id)) || self.sent.contains(&ChunkId(id));
                if !known && asking.insert(id) {
                    ask.push(id);
                }
            }
        }
        if !ask.is_empty() {
            self.asked += ask.len() as u64;
            let have = server.have_chunks(&ask, self.sealed)?;
            for (id, have) in ask.iter().zip(have) {
                if have {
                    self.cache.insert(ChunkId(*id));
                }
            }
        }
        for p in window.iter_mut() {
            let Some(id) = p.id.filter(|_| p.has_data()) else { continue };
            let id = ChunkId(id);
            if self.cache.contains(&id) {
                // Asked or not: a cache hit saves a question only if it was not just asked.
                if !asking.contains(&id.0) {
                    self.cache_hits += 1;
                }
                p.fate = Fate::Known;
            } else if self.sent.contains(&id) {
                p.fate = Fate::Known;
            } else {
                p.fate = Fate::Send;
                self.sent.insert(id);
            }
        }
        Ok(())
    }
}

/// Pieces the reader prepares at a time with deduplication, so the server is asked about
/// their chunk ids in one call: 128 chunks or 8 MiB, whichever comes first. At the 64 KiB
/// average chunk that is one round trip per 8 MiB of new data.
const WINDOW_PIECES: usize = 128;
const WINDOW_BYTES: usize = 8 << 20;

/// The pipeline's source: takes entries from the walker and cuts files into quanta (fixed
/// size, or content-defined with deduplication).
struct Reader<'s> {
    rx: crossbeam_channel::Receiver<Work>,
    /// The file being read, its entry, and the bytes read so far.
    file: Option<(Source, Entry, u64)>,
    quantum: usize,
    dedup: Option<Dedup>,
    server: &'s dyn Server,
    /// Content-defined chunking reads ahead: `ahead[pos..len]` is read but not yet cut.
    ahead: Vec<u8>,
    pos: usize,
    len: usize,
    /// The current file is read to its end (or its recorded size).
    eof: bool,
    /// Pieces prepared and decided, and spare ones to prepare into.
    window: VecDeque<Piece>,
    spare: Vec<Piece>,
    /// The server failed while asked about chunks.
    failed: Option<ClientError>,
    /// Files that changed while being read, to read again once the walk has sent everything
    /// else (time in which they may settle), with the reads they have had.
    again: VecDeque<(Entry, u32)>,
    /// The round of retries the last pause was for: one pause per round, not per file.
    retry_round: u32,
    /// The reads the current file has had before this one.
    reads: u32,
    /// [`BackupOptions::changing_retries`].
    retries: u32,
}

impl<'s> Reader<'s> {
    fn new(
        rx: crossbeam_channel::Receiver<Work>,
        quantum: usize,
        dedup: Option<Dedup>,
        server: &'s dyn Server,
        retries: u32,
    ) -> Reader<'s> {
        Reader {
            rx,
            file: None,
            quantum,
            dedup,
            server,
            ahead: Vec::new(),
            pos: 0,
            len: 0,
            eof: false,
            window: VecDeque::new(),
            spare: Vec::new(),
            failed: None,
            again: VecDeque::new(),
            retry_round: 0,
            reads: 0,
            retries,
        }
    }

    fn next(&mut self, piece: &mut Piece) -> std::result::Result<bool, qsm_codec::Error> {
        if self.dedup.is_none() {
            return self.produce(piece);
        }
        if self.window.is_empty() {
            let mut bytes = 0;
            while self.window.len() < WINDOW_PIECES && bytes < WINDOW_BYTES {
                let mut p = self.spare.pop().unwrap_or_default();
                if !self.produce(&mut p)? {
                    self.spare.push(p);
                    break;
                }
                bytes += p.raw_len;
                self.window.push_back(p);
            }
            if let Some(d) = &mut self.dedup
                && let Err(e) = d.decide(self.server, &mut self.window)
            {
                self.failed = Some(e);
                return Err(qsm_codec::Error::Invalid("the server failed".into()));
            }
        }
        let Some(mut ready) = self.window.pop_front() else { return Ok(false) };
        std::mem::swap(piece, &mut ready);
        self.spare.push(ready);
        Ok(true)
    }

    /// The next piece of the walk: an object without data, a deactivation, or the next
    /// quantum of the file being read.
    fn produce(&mut self, piece: &mut Piece) -> std::result::Result<bool, qsm_codec::Error> {
        piece.begin = None;
        piece.raw_len = 0;
        piece.last = false;
        piece.failed = None;
        piece.gone = None;
        piece.id = None;
        piece.fate = Fate::Send;
        piece.retry = false;

        if self.file.is_none() {
            let entry = match self.rx.recv() {
                Ok(Work::Send(entry)) => {
                    self.reads = 0;
                    *entry
                }
                Ok(Work::Gone(path)) => {
                    piece.gone = Some((path, false));
                    piece.last = true;
                    return Ok(true);
                }
                Ok(Work::GoneBelow(path)) => {
                    piece.gone = Some((path, true));
                    piece.last = true;
                    return Ok(true);
                }
                // The walk is over: the files that changed while read get their next read,
                // after a pause in which a file written now and then may settle.
                Err(_) => match self.again.pop_front() {
                    Some((entry, reads)) => {
                        // A file re-queued after `reads` reads is in round `reads`: the pause
                        // comes once when a round starts, so a thousand busy files do not wait
                        // a thousand pauses.
                        if reads > self.retry_round {
                            std::thread::sleep(RETRY_PAUSE);
                            self.retry_round = reads;
                        }
                        self.reads = reads;
                        entry
                    }
                    None => return Ok(false),
                },
            };
            if entry.object_type != ObjectType::File {
                piece.begin = Some(entry);
                piece.last = true;
                return Ok(true);
            }
            match open_same_file(&entry) {
                Ok((f, entry)) => {
                    piece.begin = Some(entry.clone());
                    let source =
                        Source { file: f, extents: entry.attrs.extents.clone(), next: 0, pos: 0 };
                    self.file = Some((source, entry, 0));
                    (self.pos, self.len, self.eof) = (0, 0, false);
                }
                Err(e) => {
                    // Never begun: the sink only counts and warns.
                    piece.failed = Some(e);
                    piece.last = true;
                    return Ok(true);
                }
            }
        }
        let error = match &self.dedup {
            None => self.read_quantum(piece),
            Some(d) => {
                let (sizes, seed) = (d.sizes, d.seed);
                self.read_chunk(piece, sizes, seed)
            }
        };
        let Some((file, entry, total)) = &mut self.file else { return Ok(false) };
        if let Some(d) = self.dedup.as_ref().filter(|_| piece.raw_len > 0) {
            piece.id = Some(d.ids.id(&piece.raw[..piece.raw_len]).0);
        }
        let failed = error.is_some();
        if let Some(e) = error {
            piece.failed = Some(format!("{}: not backed up: {e}", entry.path.display()));
        }
        // The last piece: read to the end, or the whole expected size read (a file that grew
        // is caught by the check at its end, which compares the bytes read with its size).
        let drained = self.pos >= self.len;
        if failed || (self.eof && drained) {
            piece.last = true;

            // Changed while being read (size, times, or bytes read differ from the stat at
            // open, on the same descriptor): stored torn otherwise, so drop it and say so.
            let still = file.file.metadata().ok().is_some_and(|m| same_content(&m, &entry.attrs));
            if !failed && (!still || *total != entry.attrs.data_len()) {
                let reads = self.reads + 1;
                piece.failed = Some(if reads > 1 {
                    format!(
                        "{}: not backed up: it changed while being read, {reads} times",
                        entry.path.display()
                    )
                } else {
                    format!("{}: not backed up: it changed while being read", entry.path.display())
                });
                if reads <= self.retries {
                    piece.retry = true;
                    self.again.push_back((entry.clone(), reads));
                }
            }
            self.file = None;
        }
        Ok(true)
    }

    /// Reads into `buf` until it is full or the file ends (or reaches its recorded size);
    /// returns the bytes read.
    fn fill(
        &mut self,
        into_ahead: bool,
        buf_end: usize,
        piece: &mut Piece,
    ) -> std::io::Result<usize> {
        let Some((file, entry, total)) = &mut self.file else { return Ok(0) };
        let (buf, start) =
            if into_ahead { (&mut self.ahead, self.len) } else { (&mut piece.raw, 0) };
        let mut n = start;
        while n < buf_end {
            match file.read(&mut buf[n..buf_end]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(k) => {
                    n += k;
                    *total += k as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if *total >= entry.attrs.data_len() {
            self.eof = true;
        }
        Ok(n - start)
    }

    /// A fixed-size quantum into `piece`.
    fn read_quantum(&mut self, piece: &mut Piece) -> Option<std::io::Error> {
        if piece.raw.len() < self.quantum {
            piece.raw.resize(self.quantum, 0);
        }
        let quantum = self.quantum;
        let result = self.fill(false, quantum, piece);
        let n = result.as_ref().map_or(0, |n| *n);
        piece.raw_len = n;
        // A short read is the end; so is a read that reached the recorded size.
        if n < quantum {
            self.eof = true;
        }
        (self.pos, self.len) = (0, 0);
        result.err()
    }

    /// The next content-defined chunk into `piece`: reads ahead until a whole maximum chunk
    /// is buffered (or the file ended), so the cut found is the one a whole-file chunker
    /// would find.
    fn read_chunk(
        &mut self,
        piece: &mut Piece,
        sizes: ChunkSizes,
        seed: u64,
    ) -> Option<std::io::Error> {
        if self.ahead.len() < 2 * sizes.max {
            self.ahead.resize(2 * sizes.max, 0);
        }
        let mut error = None;
        if self.len - self.pos < sizes.max && !self.eof {
            // Move the unread tail to the front, then fill up.
            self.ahead.copy_within(self.pos..self.len, 0);
            (self.len, self.pos) = (self.len - self.pos, 0);
            let cap = self.ahead.len();
            match self.fill(true, cap, piece) {
                Ok(n) => self.len += n,
                Err(e) => error = Some(e),
            }
        }
        let avail = &self.ahead[self.pos..self.len];
        let n = if error.is_some() {
            0
        } else {
            crate::chunker::chunks(avail, sizes, seed).next().map_or(0, |r| r.len())
        };
        if piece.raw.len() < n {
            piece.raw.resize(n, 0);
        }
        piece.raw[..n].copy_from_slice(&avail[..n]);
        piece.raw_len = n;
        self.pos += n;
        error
    }
}

/// Opens the file the walk saw, not whatever the path names now: no symlink is followed, a
/// FIFO swapped in cannot block (`O_NONBLOCK`), and the descriptor must be a regular file with
/// the walk's device and inode. Returns the entry with the attributes of that descriptor,
/// which are what gets recorded and what the end-of-read check compares with.
fn open_same_file(entry: &Entry) -> std::result::Result<(File, Entry), String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(
            scan::reach(&entry.path)
                .map_err(|e| format!("{}: not backed up: {e}", entry.path.display()))?
                .path(),
        )
        .map_err(|e| format!("{}: not backed up: {e}", entry.path.display()))?;
    let meta =
        file.metadata().map_err(|e| format!("{}: not backed up: {e}", entry.path.display()))?;
    if !meta.is_file() || meta.dev() != entry.dev || meta.ino() != entry.attrs.ino {
        return Err(format!(
            "{}: not backed up: it was replaced after the walk",
            entry.path.display()
        ));
    }
    let mut entry = entry.clone();
    // A file on fewer blocks than its size may have holes: only then is it probed, and only
    // its data extents are read and stored.
    let extents = if meta.blocks().saturating_mul(512) < meta.len() {
        crate::fsmeta::data_extents(&file, meta.len()).map_err(|e| {
            format!("{}: not backed up: finding its holes: {e}", entry.path.display())
        })?
    } else {
        None
    };
    // The extended attributes as the walk read them (a change to them since changes the
    // ctime, which the end-of-read check compares).
    // The stat fields as read now; what stat does not give stays as the walk set it.
    entry.attrs = Attributes {
        xattrs: std::mem::take(&mut entry.attrs.xattrs),
        sealed_by: entry.attrs.sealed_by,
        extents,
        ..scan::attributes(&meta, None)
    };
    Ok((file, entry))
}

/// A file's data as backup reads it, in order: all of it, or a sparse file's data extents
/// only, one after the other (what its chunks hold).
struct Source {
    file: File,
    extents: Option<Vec<(u64, u64)>>,
    /// The extent being read, and how far into it.
    next: usize,
    pos: u64,
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let Some(extents) = &self.extents else { return self.file.read(buf) };
        while let Some(&(offset, len)) = extents.get(self.next) {
            if self.pos >= len {
                (self.next, self.pos) = (self.next + 1, 0);
                continue;
            }
            let want = (len - self.pos).min(buf.len() as u64) as usize;
            // 0 when the file shrank since it was probed: the end-of-read check catches it.
            let n = self.file.read_at(&mut buf[..want], offset + self.pos)?;
            self.pos += n as u64;
            return Ok(n);
        }
        Ok(0)
    }
}

fn same_content(meta: &std::fs::Metadata, attrs: &Attributes) -> bool {
    let now = scan::attributes(meta, None);
    (now.size, now.mtime_ns, now.ctime_ns) == (attrs.size, attrs.mtime_ns, attrs.ctime_ns)
}

/// What `clock` has counted so far, seconds, to the nanosecond; 0 where the kernel will not
/// say (a sandbox may refuse the CPU clocks). Not `rustix::time::clock_gettime`, which
/// asserts that the call succeeds.
fn clock_seconds(clock: rustix::time::ClockId) -> f64 {
    match rustix::time::clock_gettime_dynamic(rustix::time::DynamicClockId::Known(clock)) {
        Ok(t) => t.tv_sec as f64 + t.tv_nsec as f64 / 1e9,
        Err(_) => 0.0,
    }
}

/// User plus system CPU time of this process so far (`CLOCK_PROCESS_CPUTIME_ID`), seconds; 0
/// where unavailable. The summary's CPU time, and the adaptive controller's weighing of what
/// compressing costs against the rest of the work.
pub fn cpu_seconds() -> f64 {
    clock_seconds(rustix::time::ClockId::ProcessCPUTime)
}

/// This thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`), seconds; 0 where unavailable.
fn thread_cpu_seconds() -> f64 {
    clock_seconds(rustix::time::ClockId::ThreadCPUTime)
}

/// The machine's CPU time busy, and in all, all cores together, in clock ticks (the first
/// line of `/proc/stat`: a core waiting for the disk counts as idle, one the hypervisor took
/// as busy); `None` where the kernel does not say.
fn machine_cpu() -> Option<(f64, f64)> {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(File::open("/proc/stat").ok()?),
        &mut line,
    )
    .ok()?;
    let ticks: Vec<f64> =
        line.strip_prefix("cpu ")?.split_ascii_whitespace().map_while(|t| t.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is counted in user's).
    let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = ticks[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy, busy + idle + iowait))
}

/// A pipeline stage's busy time, and how much of it was spent waiting for a core. With every
/// core taken (another process busy on this machine) every stage's wall time grows alike, and
/// the reader's would make reading look like the limit when it is the cores, which a lighter
/// codec relieves: the controller takes these waits off the stage's busy time.
///
/// The kernel counts a thread's waits for a core (the run-queue wait of
/// `/proc/thread-self/schedstat`), but reading it per piece (a file of the kernel tree) would
/// cost the backup some percent; it is read every [`StageClock::EVERY`], with the thread's
/// CPU clock. Between two readings the thread also waited for a core on waking from the
/// pipeline's queues, outside the stage: what is taken off is at most the stage's own time
/// off the CPU (its busy time less the thread's CPU time: waits for a core, and the disk's).
struct StageClock {
    schedstat: Option<File>,
    at: Instant,
    /// The thread's waits and CPU time at the last reading, and the stage's busy time since.
    waited: f64,
    cpu: f64,
    busy: f64,
}

impl StageClock {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(5);

    /// For the calling thread (the file, opened once, follows that thread whoever reads it);
    /// with `waits` false, a wall clock only.
    fn of_this_thread(waits: bool) -> StageClock {
        let mut clock = StageClock {
            schedstat: waits.then(|| File::open("/proc/thread-self/schedstat").ok()).flatten(),
            at: Instant::now(),
            waited: 0.0,
            cpu: thread_cpu_seconds(),
            busy: 0.0,
        };
        clock.waited = clock.total_waited();
        clock
    }

    /// The wall seconds of the piece that began at `began`; counted (`counts`) as the stage's
    /// busy time when they are reported to the controller.
    fn end(&mut self, began: Instant, counts: bool) -> f64 {
        let wall = began.elapsed().as_secs_f64();
        if counts {
            self.busy += wall;
        }
        wall
    }

    /// The thread's waits for a core since the kernel started counting; 0 where it does not.
    fn total_waited(&self) -> f64 {
        use std::os::unix::fs::FileExt;
        let Some(file) = &self.schedstat else { return 0.0 };
        let mut buf = [0u8; 96];
        // A read at offset 0 makes procfs write the line afresh.
        let Ok(n) = file.read_at(&mut buf, 0) else { return 0.0 };
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|line| line.split_ascii_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0.0, |ns| ns as f64 / 1e9)
    }

    /// Seconds of the stage's counted busy time spent waiting for a core since the last
    /// answer, once [`StageClock::EVERY`] has passed; `None` before, or without the kernel's
    /// count.
    fn waited(&mut self) -> Option<f64> {
        if self.schedstat.is_none() || self.at.elapsed() < Self::EVERY {
            return None;
        }
        let (total, cpu) = (self.total_waited(), thread_cpu_seconds());
        self.at = Instant::now();
        let waited = (total - std::mem::replace(&mut self.waited, total)).max(0.0);
        let on_cpu = cpu - std::mem::replace(&mut self.cpu, cpu);
        Some(waited.min((std::mem::take(&mut self.busy) - on_cpu).max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(ino: u64) -> Entry {
        Entry {
            rel: b"f".to_vec(),
            path: "/nonexistent/qsm-test/f".into(),
            object_type: ObjectType::File,
            attrs: Attributes {
                size: 5,
                mtime_ns: 7,
                ctime_ns: 8,
                mode: 0o100644,
                ino,
                ..Default::default()
            },
            dev: 1,
            nlink: 1,
            xattr_error: None,
        }
    }

    #[test]
    fn a_file_replaced_by_another_inode_is_changed_unless_inodes_are_ignored() {
        let stored = (ObjectType::File, entry(42).attrs);
        assert!(!changed(&entry(42), &stored, false));
        assert!(changed(&entry(43), &stored, false), "same size and times, another file");
        assert!(!changed(&entry(43), &stored, true), "--ignore-inode");
        // Versions from before inodes were recorded are not all sent again.
        let old = (ObjectType::File, entry(0).attrs);
        assert!(!changed(&entry(43), &old, false));
        let mut moved = entry(42);
        moved.attrs.ctime_ns += 1;
        assert!(changed(&moved, &stored, true));
    }

    #[test]
    fn a_file_gone_before_it_is_opened_is_named_in_the_warning() {
        let e = open_same_file(&entry(1)).unwrap_err();
        assert!(e.starts_with("/nonexistent/qsm-test/f: not backed up: "), "{e}");
    }
}
