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

use qsm_catalog::{ObjectId, ObjectKind, ObjectType, ObjectVersion, Timestamp};

use crate::error::{ClientError, Result};
use crate::server::{Fetch, Scope, Server};

/// What to do with a file that already exists at the restore location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Existing {
    /// Leave it and count it as skipped (the default).
    #[default]
    Skip,
    /// Replace it.
    Replace,
    /// Keep it and restore beside it, as `NAME.restored` (or `NAME.restored.2`, ...), never
    /// over anything. Existing directories are merged into.
    Rename,
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
    /// The node's keys, to open encrypted frames (without them, encrypted files fail).
    pub keys: Option<Arc<crate::keys::NodeKeys>>,
    /// Refuse plaintext frames: every file must have been encrypted. Without it, a server
    /// that replaces an encrypted file's frames with plaintext ones of its choosing is not
    /// caught (the client cannot tell them from files backed up before encryption was on).
    pub require_sealed: bool,
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreSummary {
    /// Objects restored.
    pub restored: u64,
    /// Objects skipped because they exist.
    pub skipped: u64,
    /// Objects restored under a new name because their name was taken (counted in `restored`
    /// too).
    pub renamed: u64,
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

/// Restores versions of `filespace` from `server` into `target`.
pub fn restore(
    server: &dyn Server,
    filespace: &str,
    target: &Path,
    options: &RestoreOptions,
) -> Result<RestoreSummary> {
    let fs_id = server.open_filespace(filespace, false)?.ok_or_else(|| {
        ClientError::Invalid(format!(
            "no backup of {filespace} in the {} (see `qsm query filespace`)",
            server.describe()
        ))
    })?;
    let below = |path: &[u8]| match &options.subpath {
        None => true,
        Some(p) => {
            path == p.as_slice() || (path.starts_with(p) && path.get(p.len()) == Some(&b'/'))
        }
    };
    let mut versions: Vec<ObjectVersion> = Vec::new();
    match &options.select {
        Selection::Active => server.inventory(fs_id, Scope::Active, &mut |v| {
            if below(&v.path) {
                versions.push(v);
            }
            Ok(())
        })?,
        Selection::Version(id) => {
            let v = server.object(*id)?.filter(|v| v.filespace == fs_id).ok_or_else(|| {
                ClientError::Invalid(format!(
                    "version {} is not in the backup of {filespace}",
                    id.0
                ))
            })?;
            versions.push(v);
        }
        // Versions arrive in path order, newest first: the first that qualifies wins.
        Selection::AsOf(t) => server.inventory(fs_id, Scope::All, &mut |v| {
            let was_active = v.kind == ObjectKind::Backup
                && v.inserted <= *t
                && v.deactivated.is_none_or(|d| d > *t);
            if was_active
                && below(&v.path)
                && versions.last().is_none_or(|last| last.path != v.path)
            {
                versions.push(v);
            }
            Ok(())
        })?,
        Selection::Archives(description) => server.inventory(fs_id, Scope::All, &mut |v| {
            let matches = v.kind == ObjectKind::Archive
                && description
                    .as_ref()
                    .is_none_or(|d| v.description.as_deref() == Some(d.as_str()));
            if matches && below(&v.path) && versions.last().is_none_or(|last| last.path != v.path) {
                versions.push(v);
            }
            Ok(())
        })?,
    }
    // A filespace whose root is a file (a single file was backed up) restores like `cp`: into
    // the target if it is a directory, as the target otherwise.
    let file_root =
        versions.iter().any(|v| v.path.is_empty() && v.object_type != ObjectType::Directory);
    let (target, root_name) = if !file_root {
        (target.to_path_buf(), None)
    } else if target.is_dir() {
        let name = Path::new(filespace).file_name().unwrap_or(OsStr::new("restored"));
        (target.to_path_buf(), Some(name.to_os_string()))
    } else {
        match (target.parent(), target.file_name()) {
            (Some(parent), Some(name)) => (parent.to_path_buf(), Some(name.to_os_string())),
            _ => {
                return Err(ClientError::Invalid(format!(
                    "cannot restore the file {filespace} as {}",
                    target.display()
                )));
            }
        }
    };
    let target = target.as_path();
    if let Some(name) = &root_name {
        for v in versions.iter_mut().filter(|v| v.path.is_empty()) {
            v.path = name.as_bytes().to_vec();
        }
    }
    fs::create_dir_all(target).map_err(ClientError::io("cannot create restore target", target))?;
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
            Ok(Outcome::Restored(bytes, renamed)) => {
                summary.renamed += u64::from(renamed);
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
    // Container order: chunk ids grow in the order frames were appended to the pool, so the
    // server reads its containers front to back instead of seeking between them.
    jobs.sort_by_key(|j| j.version.chunks.first().map_or(i64::MIN, |c| c.0));
    restore_files(
        server,
        &jobs,
        &target_fd,
        target,
        root,
        options.threads,
        &options.keys,
        options.require_sealed,
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
    /// Restored (bytes written), under a new name or not.
    Restored(u64, bool),
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
    /// Restored beside an existing file: never replace what is at `name`.
    renamed: bool,
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
        return Ok(Outcome::Restored(0, false));
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
            if present.is_some() && existing != Existing::Replace {
                return Ok(Outcome::Skipped);
            }
            Ok(Outcome::Restored(0, false))
        }
        ObjectType::Symlink | ObjectType::File => {
            if present.is_some() && existing == Existing::Skip {
                return Ok(Outcome::Skipped);
            }
            let renamed = present.is_some() && existing == Existing::Rename;
            let (last, path) = if renamed {
                let free = free_name(&parent, last).map_err(Refusal::Warn)?;
                let path = parent_path.join(&free);
                (free, path)
            } else {
                (last.to_os_string(), path)
            };
            let last = last.as_os_str();
            if !renamed
                && present
                    .is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            {
                return Err(Refusal::Warn(format!("{} is a directory", path.display())));
            }
            let tmp = temp_name(v.id);
            if v.object_type == ObjectType::File {
                return Ok(Outcome::File(Box::new(FileJob {
                    version: v.clone(),
                    parents: parents.iter().map(|c| c.to_os_string()).collect(),
                    name: last.to_os_string(),
                    renamed,
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
            into_place(&parent, &tmp, last, renamed).map_err(|e| {
                let _ = rustix::fs::unlinkat(&parent, tmp.as_str(), AtFlags::empty());
                Refusal::Warn(format!("cannot rename into place: {e}"))
            })?;
            Ok(Outcome::Restored(0, renamed))
        }
    }
}

/// Moves a finished temporary file or symlink to its name. `renameat` replaces a symlink
/// itself, never the file it points to; beside an existing file (`keep`), nothing already at
/// the name is ever replaced, even if it appeared since the name was chosen.
fn into_place(parent: &OwnedFd, tmp: &str, name: &OsStr, keep: bool) -> rustix::io::Result<()> {
    if keep {
        rustix::fs::renameat_with(parent, tmp, parent, name, rustix::fs::RenameFlags::NOREPLACE)
    } else {
        rustix::fs::renameat(parent, tmp, parent, name)
    }
}

/// The first of `NAME.restored`, `NAME.restored.2`, ... that nothing in `parent` holds.
fn free_name(parent: &OwnedFd, name: &OsStr) -> std::result::Result<OsString, String> {
    for n in 1..=1000u32 {
        let mut candidate = name.to_os_string();
        candidate.push(if n == 1 { ".restored".to_owned() } else { format!(".restored.{n}") });
        match rustix::fs::statat(parent, candidate.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(e) if e == Errno::NOENT => return Ok(candidate),
            Err(e) => return Err(format!("{}: {e}", candidate.to_string_lossy())),
            Ok(_) => {}
        }
    }
    Err(format!("{}.restored.1000 and all names before it exist", name.to_string_lossy()))
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
    /// The chunk's keyed id according to the catalog.
    chunk_id: Option<[u8; 32]>,
    /// The file's last piece.
    last: bool,
    /// The file cannot be restored, and why.
    failed: Option<String>,
}

/// The file the reader is on: its temporary file and its directory, unless they could not be
/// made (its frames are then read and dropped).
struct OpenFile {
    file: Option<Arc<File>>,
    parent: Option<Arc<OwnedFd>>,
}

/// The reader side: walks the jobs, creates each temporary file, and takes their frames from
/// the server's stream, which brings them job by job in the order asked.
struct FrameSource<'a> {
    fetch: Box<dyn Fetch + 'a>,
    jobs: &'a [FileJob],
    target_fd: &'a OwnedFd,
    target: &'a Path,
    next_job: usize,
    current: Option<OpenFile>,
    /// Set when the stream itself failed (the server is gone): the restore stops.
    broken: Option<ClientError>,
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
            // The directory again from the target's descriptor (it was checked in the pre-pass,
            // but could have been swapped since), then the file with O_EXCL | O_NOFOLLOW: never an
            // existing file, never through a symlink, and nothing already there is removed.
            let parents: Vec<&OsStr> = job.parents.iter().map(|c| c.as_os_str()).collect();
            let opened = open_dirs(self.target_fd, &parents, false, self.target).and_then(|p| {
                let flags = OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::WRONLY
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC;
                rustix::fs::openat(&p, job.tmp.as_str(), flags, Mode::from_raw_mode(0o600))
                    .map(|fd| (Arc::new(p), Arc::new(File::from(fd))))
                    .map_err(|e| format!("cannot create {}: {e}", job.tmp))
            });
            self.current = Some(match opened {
                Ok((parent, file)) => OpenFile { file: Some(file), parent: Some(parent) },
                Err(why) => {
                    piece.failed = Some(why);
                    OpenFile { file: None, parent: None }
                }
            });
        } else {
            piece.job = self.next_job - 1;
        }
        let job = &self.jobs[piece.job];
        if let Some(OpenFile { file, parent }) = &self.current {
            piece.file = file.clone();
            piece.parent = parent.clone();
        }
        let fetched = match self.fetch.next(&mut piece.frame) {
            Ok(Some(f)) if f.object == job.version.id => f,
            Ok(other) => {
                let what = match other {
                    Some(f) => format!("data of object {}", f.object.0),
                    None => "the end of the data".into(),
                };
                self.broken = Some(ClientError::Server(format!(
                    "the server sent {what} where object {} was expected",
                    job.version.id.0
                )));
                return Err(qsm_codec::Error::Invalid("restore stopped".into()));
            }
            Err(e) => {
                self.broken = Some(e);
                return Err(qsm_codec::Error::Invalid("restore stopped".into()));
            }
        };
        piece.offset = fetched.offset;
        piece.expected_len = fetched.raw_len;
        piece.chunk_id = fetched.chunk_id;
        piece.has_frame = fetched.has_frame;
        if piece.failed.is_none() {
            piece.failed = fetched.error;
        }
        // A frame past the version's size would grow the file beyond what was backed up.
        let end = fetched.offset.saturating_add(u64::from(fetched.raw_len));
        if piece.failed.is_none() && end > job.version.attrs.size {
            piece.failed = Some(format!(
                "the server sent data up to byte {end} of a file of {} bytes",
                job.version.attrs.size
            ));
        }
        if fetched.last {
            piece.last = true;
            self.current = None;
        }
        Ok(true)
    }
}

/// Restores the files' data on all cores: frames are read in order by one thread, decoded by
/// every worker and written at their offsets (`pwrite`), and each file is finished (mode,
/// times, owner, rename into place) once its last quantum is written.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
fn restore_files(
    server: &dyn Server,
    jobs: &[FileJob],
    target_fd: &OwnedFd,
    target: &Path,
    root: bool,
    threads: Option<usize>,
    keys: &Option<Arc<crate::keys::NodeKeys>>,
    require_sealed: bool,
    summary: &mut RestoreSummary,
    filespace: &str,
) -> Result<()> {
    let keys = keys.as_deref();
    let fetch = server.fetch(jobs.iter().map(|j| j.version.id).collect())?;
    let mut source =
        FrameSource { fetch, jobs, target_fd, target, next_job: 0, current: None, broken: None };
    let mut failed_job = None;
    let result = qsm_codec::pipeline::run(
        threads.unwrap_or_else(qsm_codec::engine::default_threads),
        |_, piece: &mut Piece| source.next(piece),
        || Ok(qsm_codec::FrameDecoder::new()),
        |decoder, _, piece| {
            if !piece.has_frame || piece.failed.is_some() {
                return Ok(());
            }
            let sealer = keys.map(|k| &k.frames as &dyn qsm_codec::PayloadSealer);
            let context = piece.chunk_id.as_ref().map_or(&[][..], |id| &id[..]);
            let decoded = decoder.decode_sealed(&piece.frame, &mut piece.raw, sealer, context);
            match decoded {
                Ok(header) if require_sealed && !header.is_sealed() => {
                    piece.failed = Some(format!(
                        "the data at byte {} of the file is not encrypted, and encryption is \
                         required: it was backed up before encryption was on, or replaced",
                        piece.offset
                    ));
                }
                Ok(header) if header.raw_len != piece.expected_len => {
                    piece.failed = Some(format!(
                        "the catalog says {} bytes at byte {} of the file, the stored frame holds {}",
                        piece.expected_len, piece.offset, header.raw_len
                    ));
                }
                // A sealed frame opened under its id; the data must also hash to that id
                // (the catalog's id is what deduplication trusts).
                Ok(header)
                    if header.is_sealed()
                        && keys.map(|k| k.ids.id(&piece.raw[..header.raw_len as usize]).0)
                            != piece.chunk_id =>
                {
                    piece.failed = Some(format!(
                        "the data at byte {} of the file does not match its chunk id: the \
                         frame belongs elsewhere",
                        piece.offset
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
                Err(qsm_codec::FrameError::Encrypted) => {
                    piece.failed = Some(
                        "it is encrypted, and no key was opened: give the passphrase \
                         (QSM_PASSPHRASE_FILE, or run on a terminal)"
                            .into(),
                    )
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
                    let _ = std::os::unix::fs::fchown(
                        file.as_ref(),
                        Some(v.attrs.uid),
                        Some(v.attrs.gid),
                    );
                }
                let _ = file.set_permissions(fs::Permissions::from_mode(v.attrs.mode & 0o7777));
                let _ =
                    file.set_times(FileTimes::new().set_modified(system_time(v.attrs.mtime_ns)));
            }
            match into_place(parent, &job.tmp, &job.name, job.renamed) {
                Ok(()) => {
                    summary.restored += 1;
                    summary.renamed += u64::from(job.renamed);
                    summary.bytes += v.attrs.size;
                }
                Err(e) => {
                    let _ = rustix::fs::unlinkat(&**parent, job.tmp.as_str(), AtFlags::empty());
                    summary.failed += 1;
                    summary.warnings.push(format!(
                        "{}: not restored: cannot rename into place: {e}",
                        job.path.display()
                    ));
                }
            }
            Ok(())
        },
    );
    if let Some(e) = source.broken {
        return Err(e);
    }
    result.map_err(|e| ClientError::Invalid(format!("restore of {filespace}: {e}")))?;
    Ok(())
}
