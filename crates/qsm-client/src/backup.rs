//! Incremental backup: a file is sent when it is new or when its size, modification or change
//! time, mode, owner or link target differ from the active version's; active versions of
//! paths that are gone are marked inactive. A file is read in quanta that all cores compress
//! at once, and its frames stream into the pool as they come, so memory does not grow with
//! file size.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use qsm_catalog::{Attributes, FilespaceId, NewObject, NodeId, ObjectKind, ObjectType};
use qsm_codec::{CompressOptions, Compression, FrameEncoder};
use qsm_store::{Store, TxnLimits};

use crate::error::{ClientError, Result};
use crate::scan::{self, Entry};

/// How to back up.
#[derive(Debug, Clone, Copy)]
pub struct BackupOptions {
    /// Codec setting for every quantum.
    pub compression: Compression,
    /// Worker threads (`None`: one per core).
    pub threads: Option<usize>,
    /// Transaction limits.
    pub limits: TxnLimits,
    /// Send every file, changed or not (selective backup).
    pub full: bool,
    /// Do not descend into other file systems.
    pub one_file_system: bool,
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            compression: Compression::AUTO,
            threads: None,
            limits: TxnLimits::default(),
            full: false,
            one_file_system: false,
        }
    }
}

/// What a backup did.
#[derive(Debug, Clone, Default)]
pub struct BackupSummary {
    /// The filespace (the absolute root path).
    pub filespace: String,
    /// Entries examined.
    pub examined: u64,
    /// Entries sent (new or changed).
    pub backed_up: u64,
    /// Entries unchanged since their active version.
    pub unchanged: u64,
    /// Entries that could not be read or changed while being read (not backed up).
    pub failed: u64,
    /// Active versions marked inactive because their file is gone.
    pub deactivated: u64,
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
}

fn now() -> i64 {
    qsm_catalog::now()
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

fn changed(entry: &Entry, active: &(ObjectType, Attributes)) -> bool {
    let (t, a) = active;
    *t != entry.object_type
        || a.size != entry.attrs.size
        || a.mtime_ns != entry.attrs.mtime_ns
        || a.ctime_ns != entry.attrs.ctime_ns
        || a.mode != entry.attrs.mode
        || a.uid != entry.attrs.uid
        || a.gid != entry.attrs.gid
        || a.link_target != entry.attrs.link_target
}

/// Backs up `root` for `node` into `store`.
pub fn backup(
    store: &Store,
    node: NodeId,
    root: &Path,
    options: &BackupOptions,
) -> Result<BackupSummary> {
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    let name = filespace_name(root)?;
    let catalog = store.catalog();
    let fs = catalog.filespace(node, &name)?;
    let mut active: HashMap<Vec<u8>, (ObjectType, Attributes)> = HashMap::new();
    catalog.for_each_active(fs, &mut |v| {
        active.insert(v.path.clone(), (v.object_type, v.attrs.clone()));
        Ok(())
    })?;
    let mut summary = BackupSummary { filespace: name, ..BackupSummary::default() };
    let mut batch = store.batch(options.limits)?;
    let mut sender = Sender::new(options)?;
    let mut warnings = Vec::new();
    scan::walk(
        root,
        options.one_file_system,
        &mut |entry| {
            summary.examined += 1;
            let previous = active.remove(&entry.rel);
            if !options.full && previous.as_ref().is_some_and(|p| !changed(entry, p)) {
                summary.unchanged += 1;
                return Ok(());
            }
            match sender.send(&mut batch, fs, entry)? {
                Sent::Stored { read, stored } => {
                    summary.backed_up += 1;
                    summary.bytes_read += read;
                    summary.bytes_stored += stored;
                }
                Sent::Skipped(why) => {
                    summary.failed += 1;
                    summary.warnings.push(why);
                    // Keep the old active version: the file still exists.
                }
            }
            Ok(())
        },
        &mut |path, err| warnings.push(format!("{}: {err}", path.display())),
    )?;
    summary.failed += warnings.len() as u64;
    summary.warnings.extend(warnings);
    let mut gone: Vec<Vec<u8>> = active.into_keys().collect();
    gone.sort();
    for path in &gone {
        batch.deactivate(fs, path);
    }
    summary.deactivated = gone.len() as u64;
    batch.finish(now())?;
    summary.seconds = started.elapsed().as_secs_f64();
    summary.cpu_seconds = cpu_seconds() - cpu_start;
    Ok(summary)
}

/// Archives `root` for `node`: every entry is sent, whatever the backups hold, as an archive
/// with `description`, kept for `retain_days` (the archive copy group's retain-version).
pub fn archive(
    store: &Store,
    node: NodeId,
    root: &Path,
    description: &str,
    retain_days: u32,
    options: &BackupOptions,
) -> Result<BackupSummary> {
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    let name = filespace_name(root)?;
    let fs = store.catalog().filespace(node, &name)?;
    let mut summary = BackupSummary { filespace: name, ..BackupSummary::default() };
    let mut batch = store.batch(options.limits)?;
    let mut sender = Sender::new(options)?;
    sender.archive =
        Some((description.to_owned(), now().saturating_add(i64::from(retain_days) * 86_400)));
    let mut warnings = Vec::new();
    scan::walk(
        root,
        options.one_file_system,
        &mut |entry| {
            summary.examined += 1;
            match sender.send(&mut batch, fs, entry)? {
                Sent::Stored { read, stored } => {
                    summary.backed_up += 1;
                    summary.bytes_read += read;
                    summary.bytes_stored += stored;
                }
                Sent::Skipped(why) => {
                    summary.failed += 1;
                    summary.warnings.push(why);
                }
            }
            Ok(())
        },
        &mut |path, err| warnings.push(format!("{}: {err}", path.display())),
    )?;
    summary.failed += warnings.len() as u64;
    summary.warnings.extend(warnings);
    batch.finish(now())?;
    summary.seconds = started.elapsed().as_secs_f64();
    summary.cpu_seconds = cpu_seconds() - cpu_start;
    Ok(summary)
}

enum Sent {
    Stored { read: u64, stored: u64 },
    Skipped(String),
}

/// Turns entries into objects in a batch.
struct Sender {
    /// For archives: the description and the time until which they are kept.
    archive: Option<(String, i64)>,
    options: CompressOptions,
    /// For files of one quantum or less: no pipeline to start for them.
    encoder: FrameEncoder,
    buf: Vec<u8>,
    frame: Vec<u8>,
}

impl Sender {
    fn new(options: &BackupOptions) -> Result<Sender> {
        let options = CompressOptions {
            compression: options.compression,
            quantum_size: qsm_codec::DEFAULT_QUANTUM,
            threads: options.threads,
        };
        let encoder = FrameEncoder::new(options.compression)
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        Ok(Sender { archive: None, options, encoder, buf: Vec::new(), frame: Vec::new() })
    }

    fn send(
        &mut self,
        batch: &mut qsm_store::Batch<'_>,
        fs: FilespaceId,
        entry: &Entry,
    ) -> Result<Sent> {
        let object = NewObject {
            filespace: fs,
            path: entry.rel.clone(),
            kind: if self.archive.is_some() { ObjectKind::Archive } else { ObjectKind::Backup },
            object_type: entry.object_type,
            attrs: entry.attrs.clone(),
            mgmt_class: None,
            description: self.archive.as_ref().map(|(d, _)| d.clone()),
            retain_until: self.archive.as_ref().map(|(_, until)| *until),
            chunks: Vec::new(),
        };
        if entry.object_type != ObjectType::File {
            batch.add(object, &[], now())?;
            return Ok(Sent::Stored { read: 0, stored: 0 });
        }
        let file = match File::open(&entry.path) {
            Ok(f) => f,
            Err(e) => {
                return Ok(Sent::Skipped(format!("{}: not backed up: {e}", entry.path.display())));
            }
        };
        batch.begin_object(object, entry.attrs.size, now())?;
        let (mut read, mut stored) = (0u64, 0u64);
        let outcome = if entry.attrs.size <= self.options.quantum_size as u64 {
            self.send_small(batch, file, &mut read, &mut stored)
        } else {
            self.send_large(batch, file, &mut read, &mut stored)
        };
        if let Err(problem) = outcome {
            batch.abandon_object();
            return match problem {
                Problem::Fatal(e) => Err(e),
                Problem::File(e) => {
                    Ok(Sent::Skipped(format!("{}: not backed up: {e}", entry.path.display())))
                }
            };
        }
        // A file that changed while it was read would be stored torn: skip it and say so.
        match scan::entry(&entry.path, entry.rel.clone()) {
            Ok(Some(after))
                if after.attrs.size == entry.attrs.size
                    && after.attrs.mtime_ns == entry.attrs.mtime_ns
                    && read == entry.attrs.size =>
            {
                batch.end_object()?;
                Ok(Sent::Stored { read, stored })
            }
            _ => {
                batch.abandon_object();
                Ok(Sent::Skipped(format!(
                    "{}: not backed up: it changed while being read",
                    entry.path.display()
                )))
            }
        }
    }

    fn send_small(
        &mut self,
        batch: &mut qsm_store::Batch<'_>,
        mut file: File,
        read: &mut u64,
        stored: &mut u64,
    ) -> std::result::Result<(), Problem> {
        self.buf.clear();
        // Read one byte more than a quantum to notice a file that grew.
        (&mut file)
            .take(self.options.quantum_size as u64 + 1)
            .read_to_end(&mut self.buf)
            .map_err(Problem::File)?;
        *read = self.buf.len() as u64;
        if self.buf.is_empty() || self.buf.len() > self.options.quantum_size {
            return Ok(()); // empty: no chunks; grown: caught by the re-check
        }
        let header = self
            .encoder
            .encode(&self.buf, &mut self.frame)
            .map_err(|e| Problem::Fatal(ClientError::Invalid(e.to_string())))?;
        batch
            .append_frame(&self.frame[..header.frame_len()])
            .map_err(|e| Problem::Fatal(e.into()))?;
        *stored = header.frame_len() as u64;
        Ok(())
    }

    fn send_large(
        &mut self,
        batch: &mut qsm_store::Batch<'_>,
        file: File,
        read: &mut u64,
        stored: &mut u64,
    ) -> std::result::Result<(), Problem> {
        let mut store_error = None;
        let result = qsm_codec::encode_frames(
            std::io::BufReader::with_capacity(64 << 10, file),
            &self.options,
            &mut |frame, header| {
                *read += u64::from(header.raw_len);
                *stored += frame.len() as u64;
                batch.append_frame(frame).map_err(|e| {
                    store_error = Some(e);
                    qsm_codec::Error::Invalid("the store failed".into())
                })
            },
        );
        if let Some(e) = store_error {
            return Err(Problem::Fatal(e.into()));
        }
        match result {
            Ok(_) => Ok(()),
            Err(qsm_codec::Error::Io { source, .. }) => Err(Problem::File(source)),
            Err(e) => Err(Problem::Fatal(ClientError::Invalid(e.to_string()))),
        }
    }
}

enum Problem {
    /// Stop the backup.
    Fatal(ClientError),
    /// Skip this file.
    File(std::io::Error),
}

/// User plus system CPU time of this process so far, from `/proc/self/stat` (Linux reports
/// it in clock ticks of 1/100 s, `USER_HZ`); 0 where unavailable.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}
