//! Restore of active versions. **Nothing is ever written outside the target directory,**
//! whatever names the catalog holds: every path component is checked (no `..`, `.`, empty
//! or NUL component, no absolute path), every parent directory on the way is created or
//! verified to be a real directory (a symlink planted in the target is refused, never
//! followed), and files are written to a new temporary name in their directory and renamed
//! into place, so an existing symlink is replaced rather than written through.

use std::ffi::OsStr;
use std::ffi::OsString;
use std::fs::{self, File, FileTimes};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use qsm_catalog::{NodeId, ObjectId, ObjectKind, ObjectType, ObjectVersion, Timestamp};
use qsm_store::Store;

use crate::error::{ClientError, Result};

/// What to do with a file that already exists at the restore location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Existing {
    /// Leave it and count it as skipped (the default).
    #[default]
    Skip,
    /// Replace it.
    Replace,
}

/// Which versions to bring back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Selection {
    /// The active backup versions (the default).
    #[default]
    Active,
    /// The backup versions that were active at this time (point-in-time restore).
    AsOf(Timestamp),
    /// One version, active or not, by id (from `qsm query backup --inactive`).
    Version(ObjectId),
    /// Archives, newest per path, optionally only those with this description (retrieve).
    Archives(Option<String>),
}

/// How to restore.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Only paths below this one (relative to the filespace root, `/`-separated).
    pub subpath: Option<Vec<u8>>,
    /// Existing files.
    pub existing: Existing,
    /// Which versions.
    pub select: Selection,
    /// Worker threads decoding quanta (`None`: one per core).
    pub threads: Option<usize>,
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreSummary {
    /// Objects restored.
    pub restored: u64,
    /// Objects skipped because they exist.
    pub skipped: u64,
    /// Objects refused or failed, each with a warning.
    pub failed: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    /// One line per problem.
    pub warnings: Vec<String>,
}

/// The temporary name a version is restored under, in its final directory: short (far below
/// NAME_MAX whatever the file's name), and unique per version id and process, so two files
/// in one directory never share one. A leftover from a crashed restore is never removed: it
/// makes only that file fail.
fn temp_name(id: ObjectId) -> String {
    format!(".qsm-restore-{}-{}", std::process::id(), id.0)
}

/// Checks a catalog path and returns its components.
pub fn safe_components(rel: &[u8]) -> std::result::Result<Vec<&OsStr>, String> {
    if rel.is_empty() {
        return Ok(Vec::new());
    }
    if rel.first() == Some(&b'/') {
        return Err("absolute path".into());
    }
    rel.split(|&b| b == b'/')
        .map(|c| match c {
            b"" => Err("empty path component".to_string()),
            b"." | b".." => Err(format!("path component {:?}", String::from_utf8_lossy(c))),
            c if c.contains(&0) => Err("NUL in a path component".into()),
            c => Ok(OsStr::from_bytes(c)),
        })
        .collect()
}

/// Reaches the directory `components` below `base` one component at a time, each opened
/// relative to the previous one's descriptor with `O_NOFOLLOW | O_DIRECTORY`: a symlink or a
/// file anywhere on the way is refused, whenever it was planted, and nothing is resolved by
/// path. With `create`, missing directories are made, owner-only until the final pass sets
/// their real mode.
fn open_dirs(
    base: &OwnedFd,
    components: &[&OsStr],
    create: bool,
    shown: &Path,
) -> std::result::Result<OwnedFd, String> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut fd = rustix::fs::openat(base, ".", flags, Mode::empty())
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    let mut path = shown.to_path_buf();
    for c in components {
        path.push(c);
        let next = match rustix::fs::openat(&fd, *c, flags, Mode::empty()) {
            Ok(next) => next,
            Err(e) if e == Errno::NOENT && create => {
                rustix::fs::mkdirat(&fd, *c, Mode::from_raw_mode(0o700))
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                rustix::fs::openat(&fd, *c, flags, Mode::empty())
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
            Err(e) if e == Errno::LOOP || e == Errno::NOTDIR => {
                return Err(format!(
                    "{} is a symlink or not a directory: refusing to restore through it",
                    path.display()
                ));
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        fd = next;
    }
    Ok(fd)
}

fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn running_as_root() -> bool {
    // The owner of /proc/self is the process's effective user.
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Restores the active versions of filespace `filespace` of `node` into `target`.
pub fn restore(
    store: &Store,
    node: NodeId,
    filespace: &str,
    target: &Path,
    options: &RestoreOptions,
) -> Result<RestoreSummary> {
    let catalog = store.catalog();
    let fs_id = catalog
        .filespaces(node)?
        .into_iter()
        .find(|f| f.name == filespace)
        .map(|f| f.id)
        .ok_or_else(|| {
        ClientError::Invalid(format!("no backup of {filespace} (see `qsm query filespace`)"))
    })?;
    fs::create_dir_all(target).map_err(ClientError::io("cannot create restore target", target))?;
    let below = |path: &[u8]| match &options.subpath {
        None => true,
        Some(p) => {
            path == p.as_slice() || (path.starts_with(p) && path.get(p.len()) == Some(&b'/'))
        }
    };
    let mut versions: Vec<ObjectVersion> = Vec::new();
    match &options.select {
        Selection::Active => catalog.for_each_active(fs_id, &mut |v| {
            if below(&v.path) {
                versions.push(v.clone());
            }
            Ok(())
        })?,
        Selection::Version(id) => {
            let v = catalog.object(*id)?.filter(|v| v.filespace == fs_id).ok_or_else(|| {
                ClientError::Invalid(format!(
                    "version {} is not in the backup of {filespace}",
                    id.0
                ))
            })?;
            versions.push(v);
        }
        // Versions arrive in path order, newest first: the first that qualifies wins.
        Selection::AsOf(t) => catalog.for_each_version(fs_id, &mut |v| {
            let was_active = v.kind == ObjectKind::Backup
                && v.inserted <= *t
                && v.deactivated.is_none_or(|d| d > *t);
            if was_active
                && below(&v.path)
                && versions.last().is_none_or(|last| last.path != v.path)
            {
                versions.push(v.clone());
            }
            Ok(())
        })?,
        Selection::Archives(description) => catalog.for_each_version(fs_id, &mut |v| {
            let matches = v.kind == ObjectKind::Archive
                && description
                    .as_ref()
                    .is_none_or(|d| v.description.as_deref() == Some(d.as_str()));
            if matches && below(&v.path) && versions.last().is_none_or(|last| last.path != v.path) {
                versions.push(v.clone());
            }
            Ok(())
        })?,
    }
    let mut summary = RestoreSummary::default();
    let root = running_as_root();
    // Everything below is reached from this descriptor, never by path again.
    let target_fd = rustix::fs::openat(
        rustix::fs::CWD,
        target,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ClientError::Io {
        op: "cannot open restore target",
        path: target.to_path_buf(),
        source: e.into(),
    })?;
    let mut dirs = Vec::new();
    let mut jobs = Vec::new();
    for v in &versions {
        let name = String::from_utf8_lossy(&v.path).into_owned();
        match restore_one(v, target, &target_fd, options.existing, root) {
            Ok(Outcome::Restored(bytes)) => {
                summary.restored += 1;
                summary.bytes += bytes;
                if v.object_type == ObjectType::Directory {
                    dirs.push(v);
                }
            }
            Ok(Outcome::Skipped) => summary.skipped += 1,
            Ok(Outcome::File(job)) => jobs.push(*job),
            Err(Refusal::Warn(why)) => {
                summary.failed += 1;
                summary.warnings.push(format!("{filespace}/{name}: not restored: {why}"));
            }
        }
    }
    restore_files(
        store,
        &jobs,
        &target_fd,
        target,
        root,
        options.threads,
        &mut summary,
        filespace,
    )?;
    // Directory owner, mode and times last, deepest first: restoring their contents changed
    // them. Through a handle opened without following symlinks, so a directory swapped for a
    // symlink meanwhile is skipped, not followed.
    for v in dirs.iter().rev() {
        let Ok(components) = safe_components(&v.path) else { continue };
        if let Ok(fd) = open_dirs(&target_fd, &components, false, target) {
            let dir = File::from(fd);
            if root {
                let _ = std::os::unix::fs::fchown(&dir, Some(v.attrs.uid), Some(v.attrs.gid));
            }
            let _ = dir.set_permissions(fs::Permissions::from_mode(v.attrs.mode & 0o7777));
            let _ = dir.set_times(FileTimes::new().set_modified(system_time(v.attrs.mtime_ns)));
        }
    }
    Ok(summary)
}

enum Outcome {
    Restored(u64),
    Skipped,
    /// A file to restore through the pipeline.
    File(Box<FileJob>),
}

/// A file whose data the pipeline writes: into `tmp` in its parent directory (reached again
/// from the target's descriptor, never by path), renamed to `name` when complete.
struct FileJob {
    version: ObjectVersion,
    parents: Vec<OsString>,
    name: OsString,
    tmp: String,
    /// For messages only.
    path: PathBuf,
}

/// Why one object was not restored (the restore goes on with the others).
enum Refusal {
    Warn(String),
}

fn restore_one(
    v: &ObjectVersion,
    target: &Path,
    target_fd: &OwnedFd,
    existing: Existing,
    root: bool,
) -> std::result::Result<Outcome, Refusal> {
    let components = safe_components(&v.path)
        .map_err(|why| Refusal::Warn(format!("unsafe name in the catalog ({why})")))?;
    let Some((last, parents)) = components.split_last() else {
        // The filespace root itself: the target.
        return Ok(Outcome::Restored(0));
    };
    let parent_path = parents.iter().fold(target.to_path_buf(), |p, c| p.join(c));
    let parent = open_dirs(target_fd, parents, true, target).map_err(Refusal::Warn)?;
    let path = parent_path.join(last);
    let present = rustix::fs::statat(&parent, *last, AtFlags::SYMLINK_NOFOLLOW).ok();
    match v.object_type {
        ObjectType::Directory => {
            open_dirs(&parent, &[*last], true, &parent_path).map_err(Refusal::Warn)?;
            // An existing directory is used as it is, its owner, mode and times untouched,
            // unless replacing.
            if present.is_some() && existing == Existing::Skip {
                return Ok(Outcome::Skipped);
            }
            Ok(Outcome::Restored(0))
        }
        ObjectType::Symlink | ObjectType::File => {
            if present.is_some() && existing == Existing::Skip {
                return Ok(Outcome::Skipped);
            }
            if present.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            {
                return Err(Refusal::Warn(format!("{} is a directory", path.display())));
            }
            let tmp = temp_name(v.id);
            if v.object_type == ObjectType::File {
                return Ok(Outcome::File(Box::new(FileJob {
                    version: v.clone(),
                    parents: parents.iter().map(|c| c.to_os_string()).collect(),
                    name: last.to_os_string(),
                    tmp,
                    path,
                })));
            }
            let link = v.attrs.link_target.as_deref().unwrap_or_default();
            rustix::fs::symlinkat(OsStr::from_bytes(link), &parent, tmp.as_str())
                .map_err(|e| Refusal::Warn(format!("cannot create symlink: {e}")))?;
            if root {
                let owner = (Some(Uid::from_raw(v.attrs.uid)), Some(Gid::from_raw(v.attrs.gid)));
                let _ = rustix::fs::chownat(
                    &parent,
                    tmp.as_str(),
                    owner.0,
                    owner.1,
                    AtFlags::SYMLINK_NOFOLLOW,
                );
            }
            // renameat replaces a symlink itself, never the file it points to.
            rustix::fs::renameat(&parent, tmp.as_str(), &parent, *last).map_err(|e| {
                let _ = rustix::fs::unlinkat(&parent, tmp.as_str(), AtFlags::empty());
                Refusal::Warn(format!("cannot rename into place: {e}"))
            })?;
            Ok(Outcome::Restored(0))
        }
    }
}

/// One quantum of a restored file on its way through the pipeline.
#[derive(Default)]
struct Piece {
    /// Index of the file in the job list.
    job: usize,
    /// The file's temporary file, shared by its pieces (written with `pwrite`).
    file: Option<Arc<File>>,
    /// Its directory, where it is renamed into place.
    parent: Option<Arc<OwnedFd>>,
    /// The frame as read from the pool.
    frame: Vec<u8>,
    has_frame: bool,
    /// Decoded data (a buffer reused from piece to piece).
    raw: Vec<u8>,
    /// Where this quantum's data goes in the file.
    offset: u64,
    /// Its length according to the catalog, which the frame must agree with.
    expected_len: u32,
    /// The file's last piece.
    last: bool,
    /// The file cannot be restored, and why.
    failed: Option<String>,
}

/// The file the reader is on: its chunks, the next to read, the raw offset reached, the
/// temporary file and its directory.
struct OpenFile {
    chunks: Vec<qsm_catalog::ChunkRef>,
    next: usize,
    offset: u64,
    file: Arc<File>,
    parent: Arc<OwnedFd>,
}

/// The reader side: walks the jobs, creates each temporary file, and reads frames in order.
struct FrameSource<'a> {
    store: &'a Store,
    jobs: &'a [FileJob],
    target_fd: &'a OwnedFd,
    target: &'a Path,
    next_job: usize,
    /// The current file: its chunks, the next one to read, and the raw offset reached.
    current: Option<OpenFile>,
}

impl FrameSource<'_> {
    fn next(&mut self, piece: &mut Piece) -> std::result::Result<bool, qsm_codec::Error> {
        piece.has_frame = false;
        piece.last = false;
        piece.failed = None;
        if self.current.is_none() {
            let Some(job) = self.jobs.get(self.next_job) else { return Ok(false) };
            piece.job = self.next_job;
            self.next_job += 1;
            let chunks = match self.store.catalog().object_chunks(job.version.id) {
                Ok(c) => c,
                Err(e) => return Ok(self.fail(piece, e.to_string())),
            };
            // The directory again from the target's descriptor (it was checked in the pre-pass,
            // but could have been swapped since), then the file with O_EXCL | O_NOFOLLOW: never an
            // existing file, never through a symlink, and nothing already there is removed.
            let parents: Vec<&OsStr> = job.parents.iter().map(|c| c.as_os_str()).collect();
            let parent = match open_dirs(self.target_fd, &parents, false, self.target) {
                Ok(fd) => Arc::new(fd),
                Err(why) => return Ok(self.fail(piece, why)),
            };
            let flags =
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let file = match rustix::fs::openat(
                &*parent,
                job.tmp.as_str(),
                flags,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => Arc::new(File::from(fd)),
                Err(e) => return Ok(self.fail(piece, format!("cannot create {}: {e}", job.tmp))),
            };
            self.current = Some(OpenFile { chunks, next: 0, offset: 0, file, parent });
        } else {
            piece.job = self.next_job - 1;
        }
        let Some(OpenFile { chunks, next, offset, file, parent }) = &mut self.current else {
            return Ok(false);
        };
        piece.file = Some(Arc::clone(file));
        piece.parent = Some(Arc::clone(parent));
        piece.offset = *offset;
        if let Some(chunk) = chunks.get(*next) {
            let loc = qsm_pool::FrameLocation {
                container: chunk.location.container.0,
                offset: chunk.location.offset,
                len: chunk.location.stored_len,
            };
            if let Err(e) = self.store.pool().read_frame_for_decode(
                &loc,
                Some(chunk.id.0 as u64),
                &mut piece.frame,
            ) {
                piece.failed = Some(e.to_string());
            } else {
                piece.has_frame = true;
            }
            piece.expected_len = chunk.location.raw_len;
            *offset += u64::from(chunk.location.raw_len);
            *next += 1;
        }
        if *next >= chunks.len() || piece.failed.is_some() {
            piece.last = true;
            self.current = None;
        }
        Ok(true)
    }

    fn fail(&mut self, piece: &mut Piece, why: String) -> bool {
        piece.failed = Some(why);
        piece.last = true;
        piece.file = None;
        piece.parent = None;
        true
    }
}

/// Restores the files' data on all cores: frames are read in order by one thread, decoded by
/// every worker and written at their offsets (`pwrite`), and each file is finished (mode,
/// times, owner, rename into place) once its last quantum is written.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
fn restore_files(
    store: &Store,
    jobs: &[FileJob],
    target_fd: &OwnedFd,
    target: &Path,
    root: bool,
    threads: Option<usize>,
    summary: &mut RestoreSummary,
    filespace: &str,
) -> Result<()> {
    let mut source = FrameSource { store, jobs, target_fd, target, next_job: 0, current: None };
    let mut failed_job = None;
    qsm_codec::pipeline::run(
        threads.unwrap_or_else(qsm_codec::engine::default_threads),
        |_, piece: &mut Piece| source.next(piece),
        || Ok(qsm_codec::FrameDecoder::new()),
        |decoder, _, piece| {
            if !piece.has_frame || piece.failed.is_some() {
                return Ok(());
            }
            match decoder.decode(&piece.frame, &mut piece.raw) {
                Ok(header) if header.raw_len != piece.expected_len => {
                    piece.failed = Some(format!(
                        "the catalog says {} bytes at byte {} of the file, the stored frame holds {}",
                        piece.expected_len, piece.offset, header.raw_len
                    ));
                }
                Ok(header) => {
                    let n = header.raw_len as usize;
                    let written =
                        piece.file.as_ref().map(|f| f.write_all_at(&piece.raw[..n], piece.offset));
                    if let Some(Err(e)) = written {
                        piece.failed = Some(format!("writing: {e}"));
                    }
                }
                Err(e) => {
                    piece.failed =
                        Some(format!("damaged data at byte {} of the file: {e}", piece.offset))
                }
            }
            Ok(())
        },
        |_, piece| {
            let job = &jobs[piece.job];
            if let Some(why) = piece.failed.as_ref().filter(|_| failed_job != Some(piece.job)) {
                failed_job = Some(piece.job);
                summary.failed += 1;
                let name = String::from_utf8_lossy(&job.version.path);
                summary.warnings.push(format!("{filespace}/{name}: not restored: {why}"));
            }
            if !piece.last {
                return Ok(());
            }
            let Some(parent) = &piece.parent else {
                return Ok(()); // failed before its file existed
            };
            if failed_job == Some(piece.job) {
                let _ = rustix::fs::unlinkat(&**parent, job.tmp.as_str(), AtFlags::empty());
                return Ok(());
            }
            let v = &job.version;
            if let Some(file) = &piece.file {
                // Owner first: Linux clears setuid and setgid bits on any chown, so the mode
                // must be set after it. All three through the file handle, never the path.
                if root {
                    let _ = std::os::unix::fs::fchown(file.as_ref(), Some(v.attrs.uid), Some(v.attrs.gid));
                }
                let _ = file.set_permissions(fs::Permissions::from_mode(v.attrs.mode & 0o7777));
                let _ = file.set_times(FileTimes::new().set_modified(system_time(v.attrs.mtime_ns)));
            }
            // renameat replaces a symlink itself, never the file it points to.
            match rustix::fs::renameat(&**parent, job.tmp.as_str(), &**parent, job.name.as_os_str()) {
                Ok(()) => {
                    summary.restored += 1;
                    summary.bytes += v.attrs.size;
                }
                Err(e) => {
                    let _ = rustix::fs::unlinkat(&**parent, job.tmp.as_str(), AtFlags::empty());
                    summary.failed += 1;
                    summary
                        .warnings
                        .push(format!("{}: not restored: cannot rename into place: {e}", job.path.display()));
                }
            }
            Ok(())
        },
    )
    .map_err(|e| ClientError::Invalid(format!("restore of {filespace}: {e}")))?;
    Ok(())
}
