//! Restore of active versions. **Nothing is ever written outside the target directory,**
//! whatever names the catalog holds: every path component is checked (no `..`, `.`, empty
//! or NUL component, no absolute path), every parent directory on the way is created or
//! verified to be a real directory (a symlink planted in the target is refused, never
//! followed), and files are written to a new temporary name in their directory and renamed
//! into place, so an existing symlink is replaced rather than written through.
//!
//! **A file is whole or not there:** its frames must cover its data exactly, in order (see
//! `FrameSource`); a server that withholds, repeats, reorders or cuts short a file's data
//! fails that file by name, its temporary removed. **Nothing around the restore is changed:**
//! the target and every directory that exists keep their metadata unless replacing, and the
//! directories on the way to a subpath are created with their backed-up metadata. Temporaries
//! of earlier restores that were killed are removed where this one writes
//! (`sweep_leftovers`).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::ffi::OsString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use qsm_types::model::{ObjectId, ObjectKind, ObjectType, ObjectVersion, Timestamp};

use crate::dirs::Dirs;
use crate::error::{ClientError, Result};
use crate::fsmeta::{self, At};
use crate::server::{Fetch, Fetched, Scope, Server};

mod direct;
mod target;
use target::{Finished, Target};

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
    /// One archive: exactly these versions, the objects of one `qsm archive` run as
    /// [`crate::archives`] groups them (retrieve of a description or an archive id).
    Archive(Vec<ObjectId>),
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
    /// Include and exclude patterns, in the backup's pattern language ([`crate::filter`]),
    /// matched against paths relative to the filespace root and against the absolute paths
    /// they were backed up from.
    pub filter: crate::Filter,
    /// Make what was restored durable before returning (`syncfs` of the target's file
    /// system). Without it a restore returns, as `cp` and `tar -x` do, once the data is in
    /// the page cache; the kernel writes it back within about 30 s.
    pub sync: bool,
}

/// What a restore would restore, chosen before anything is written.
#[derive(Debug, Clone)]
pub struct Selected {
    /// The filespace.
    pub filespace: qsm_types::model::FilespaceId,
    /// The versions, in path order: what was asked, and the directories on the way to it.
    pub versions: Vec<ObjectVersion>,
    /// Those of `versions` that are only directories on the way (created, never changed).
    pub ancestors: HashSet<ObjectId>,
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
    /// Directories among the objects restored or skipped.
    pub dirs: u64,
    /// Temporary files of earlier restores that were killed mid-way, removed from the
    /// directories this one wrote into.
    pub leftovers: u64,
    /// Objects restored without some of their metadata (an owner, an extended attribute, a
    /// mode or a time that could not be set), each named in `warnings`.
    pub incomplete: u64,
    /// One line per problem.
    pub warnings: Vec<String>,
    /// The paths (below the filespace, as bytes) of the objects that failed, each also
    /// named in `warnings`.
    pub failed_paths: Vec<Vec<u8>>,
    /// Objects other than directories that were asked for.
    pub wanted_files: u64,
}

impl RestoreSummary {
    /// Counts the object at `path` (below `filespace`) as not restored, and says why.
    fn fail(&mut self, filespace: &str, path: &[u8], why: &str) {
        self.failed += 1;
        self.failed_paths.push(path.to_vec());
        let name = String::from_utf8_lossy(path);
        self.warnings.push(format!("{filespace}/{name}: not restored: {why}"));
    }

    /// Something failed and nothing else came of the restore: no file, symlink or other
    /// non-directory object restored or already there (directories alone are not a restore
    /// of files), or, when only directories were asked for, none of them.
    pub fn all_failed(&self) -> bool {
        let others = if self.wanted_files > 0 { self.dirs } else { 0 };
        self.failed > 0 && self.restored + self.skipped == others
    }
}

/// The temporary name a version is restored under, in its final directory: short (far below
/// NAME_MAX whatever the file's name), and unique per version id and process, so two files
/// in one directory never share one. [`sweep_leftovers`] recognises the pattern.
fn temp_name(id: ObjectId) -> String {
    // `std::process::id` is a system call each time, and this runs twice per restored file.
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    format!("{TEMP_PREFIX}{}-{}", PID.get_or_init(std::process::id), id.0)
}

const TEMP_PREFIX: &str = ".qsm-restore-";

/// The process id a name of [`temp_name`]'s pattern carries, exactly: `.qsm-restore-PID-ID`,
/// both decimal, nothing before or after.
fn temp_pid(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(TEMP_PREFIX.as_bytes())?;
    let dash = rest.iter().position(|&b| b == b'-')?;
    let (pid, id) = (&rest[..dash], &rest[dash + 1..]);
    let digits = |s: &[u8]| !s.is_empty() && s.len() <= 19 && s.iter().all(u8::is_ascii_digit);
    if !digits(pid) || !digits(id) {
        return None;
    }
    std::str::from_utf8(pid).ok()?.parse().ok()
}

/// The effective user id, read from the owner of `/proc/self`; `None` without `/proc`, when
/// no process can be told alive or dead (and nothing is swept).
fn current_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Removes from `dir` the temporary files of earlier restores that were killed before they
/// could remove them, and returns how many. Only what is provably such a leftover: a regular
/// file (never followed, never a directory or a symlink), owned by this user, named exactly as
/// [`temp_name`] names them, by a process that no longer runs (no `/proc/PID`). A live
/// process's files are never touched, even if its PID was reused by another program: leaving
/// a leftover is harmless, removing a running restore's file is not. (A restore running in
/// another PID namespace on the same directory would look dead from here; QSM does not support
/// sharing a restore target across containers.)
fn sweep_leftovers(dir: &OwnedFd, me: u32) -> u64 {
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_pid(name.to_bytes()) else { continue };
        // Dead only when /proc says there is no such process; any other answer means alive.
        let dead = matches!(fs::symlink_metadata(format!("/proc/{pid}")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        if pid == std::process::id() || !dead {
            continue;
        }
        let own_file = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
            FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_uid == me
        });
        if own_file && rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok() {
            removed += 1;
        }
    }
    removed
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

fn running_as_root() -> bool {
    current_uid() == Some(0)
}

/// Where a catalog path stands to the subpath a restore asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The subpath itself or below it: restored.
    Selected,
    /// A directory on the way to it (the filespace root included).
    Ancestor,
    /// Anything else.
    Outside,
}

/// Where `path` stands to `sub` (empty: the whole filespace), component-wise: `a/b` is below
/// `a` but not below `a/` or `a/bc`'s sibling `a/b2`.
fn place(path: &[u8], sub: &[u8]) -> Place {
    use crate::scan::within;
    if within(path, sub) {
        Place::Selected
    } else if within(sub, path) {
        Place::Ancestor
    } else {
        Place::Outside
    }
}

/// Chooses what a restore of `filespace` with `options` restores: the versions its
/// selection, subpath and patterns take, and the directories on the way to them. Nothing
/// chosen is an error saying why.
pub fn select(server: &dyn Server, filespace: &str, options: &RestoreOptions) -> Result<Selected> {
    let fs_id = server.open_filespace(filespace, false)?.ok_or_else(|| {
        ClientError::Invalid(format!(
            "no backup of {filespace} in the {} (see `qsm query filespace`)",
            server.describe()
        ))
    })?;
    let mut matched = 0u64;
    let mut versions: Vec<ObjectVersion> = Vec::new();
    let mut ancestors = HashSet::new();
    // What the subpath selects is restored; of its ancestors, only the directories themselves
    // (not their other children), so the directories on the way are created with their
    // backed-up metadata rather than owner-only.
    let sub = options.subpath.as_deref().unwrap_or_default();
    let mut keep = |v: ObjectVersion, versions: &mut Vec<ObjectVersion>| match place(&v.path, sub) {
        Place::Selected => {
            matched += 1;
            versions.push(v);
        }
        Place::Ancestor if v.object_type == ObjectType::Directory => {
            ancestors.insert(v.id);
            versions.push(v);
        }
        Place::Ancestor | Place::Outside => {}
    };
    match &options.select {
        Selection::Active => server.inventory(fs_id, Scope::Active, &mut |v| {
            keep(v, &mut versions);
            Ok(())
        })?,
        Selection::Version(id) => {
            let v = server.object(*id)?.filter(|v| v.filespace == fs_id).ok_or_else(|| {
                ClientError::Invalid(format!(
                    "version {} is not in the backup of {filespace}",
                    id.0
                ))
            })?;
            // The directories on its way as they are now (an archive's have no such state).
            if v.kind == ObjectKind::Backup && !v.path.is_empty() {
                server.inventory(fs_id, Scope::Active, &mut |a| {
                    if place(&a.path, &v.path) == Place::Ancestor
                        && a.object_type == ObjectType::Directory
                    {
                        ancestors.insert(a.id);
                        versions.push(a);
                    }
                    Ok(())
                })?;
            }
            versions.push(v);
            matched += 1;
        }
        // Versions arrive in path order, newest first: the first that qualifies wins.
        Selection::AsOf(t) => server.inventory(fs_id, Scope::All, &mut |v| {
            let was_active = v.kind == ObjectKind::Backup
                && v.inserted <= *t
                && v.deactivated.is_none_or(|d| d > *t);
            if was_active && versions.last().is_none_or(|last| last.path != v.path) {
                keep(v, &mut versions);
            }
            Ok(())
        })?,
        Selection::Archive(ids) => {
            let ids: HashSet<ObjectId> = ids.iter().copied().collect();
            server.inventory(fs_id, Scope::All, &mut |v| {
                if v.kind == ObjectKind::Archive && ids.contains(&v.id) {
                    keep(v, &mut versions);
                }
                Ok(())
            })?
        }
        Selection::Archives(description) => server.inventory(fs_id, Scope::All, &mut |v| {
            let matches = v.kind == ObjectKind::Archive
                && description
                    .as_ref()
                    .is_none_or(|d| v.description.as_deref() == Some(d.as_str()));
            if matches && versions.last().is_none_or(|last| last.path != v.path) {
                keep(v, &mut versions);
            }
            Ok(())
        })?,
    }
    if matched > 0 && !options.filter.is_empty() {
        matched = apply_filter(&options.filter, filespace, &mut versions, &ancestors);
        if matched == 0 {
            return Err(ClientError::Invalid(format!(
                "nothing to restore: the patterns (--include, --exclude) match nothing {}",
                match &options.subpath {
                    Some(p) => format!(
                        "below {}/{}",
                        filespace.trim_end_matches('/'),
                        String::from_utf8_lossy(p)
                    ),
                    None => format!("in the backup of {filespace}"),
                }
            )));
        }
    }
    if matched == 0 {
        // Said before anything is created: a restore of nothing leaves no empty target.
        let shown = match &options.subpath {
            Some(p) => {
                format!("{}/{}", filespace.trim_end_matches('/'), String::from_utf8_lossy(p))
            }
            None => filespace.to_owned(),
        };
        return Err(ClientError::Invalid(match &options.select {
            Selection::Archives(Some(d)) => {
                format!("nothing to retrieve: no archive of {shown} is described {d:?}")
            }
            Selection::Archives(None) => format!("nothing to retrieve: no archive of {shown}"),
            Selection::Archive(_) => format!("nothing to retrieve: that archive holds no {shown}"),
            Selection::AsOf(t) => {
                format!("nothing to restore: no backup version of {shown} was active at @{t}")
            }
            _ => format!(
                "nothing to restore: the backup of {filespace} holds no active version of \
                 {shown} (see `qsm query backup --inactive`)"
            ),
        }));
    }
    // Held for the whole restore: not with a growing vector's spare room, up to half again.
    versions.shrink_to_fit();
    Ok(Selected { filespace: fs_id, versions, ancestors })
}

/// Keeps of `versions` (not `ancestors`) what `filter` takes, as a backup with it would have:
/// an excluded directory takes nothing below it; with includes, only what matches one or lies
/// below a directory that does, and the directories on the way to those. Returns how many
/// asked-for versions are left.
fn apply_filter(
    filter: &crate::Filter,
    filespace: &str,
    versions: &mut Vec<ObjectVersion>,
    ancestors: &HashSet<ObjectId>,
) -> u64 {
    use crate::filter::Verdict;
    let root = Path::new(filespace);
    // Path order: a directory comes before what it holds.
    versions.sort_by(|a, b| a.path.cmp(&b.path));
    let mut excluded: HashSet<Vec<u8>> = HashSet::new();
    let mut included: HashSet<Vec<u8>> = HashSet::new();
    let parents = |path: &[u8]| -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut end = path.len();
        while let Some(i) = path[..end].iter().rposition(|&b| b == b'/') {
            out.push(path[..i].to_vec());
            end = i;
        }
        out.push(Vec::new());
        out
    };
    let mut keep = vec![false; versions.len()];
    let mut unmatched_dirs = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        if ancestors.contains(&v.id) {
            keep[i] = true;
            continue;
        }
        let up = parents(&v.path);
        if up.iter().any(|p| excluded.contains(p)) {
            continue;
        }
        let is_dir = v.object_type == ObjectType::Directory;
        let parent_included = up.iter().any(|p| included.contains(p));
        let abs = root.join(OsStr::from_bytes(&v.path));
        match filter.verdict(&v.path, &abs, is_dir, parent_included) {
            Verdict::Excluded if is_dir => {
                excluded.insert(v.path.clone());
            }
            Verdict::Excluded => {}
            Verdict::Included => {
                keep[i] = true;
                if is_dir {
                    included.insert(v.path.clone());
                }
            }
            Verdict::Unmatched if is_dir => unmatched_dirs.push(i),
            Verdict::Unmatched => {}
        }
    }
    // A directory no include matched is restored only on the way to something that is: the
    // parents of what is kept, each found once (linear in the entries, not their product).
    let mut on_the_way: HashSet<Vec<u8>> = HashSet::new();
    for (v, _) in versions.iter().zip(&keep).filter(|(_, k)| **k) {
        on_the_way.extend(parents(&v.path));
    }
    for i in unmatched_dirs {
        keep[i] = on_the_way.contains(&versions[i].path);
    }
    let mut asked = 0;
    let mut k = keep.iter();
    versions.retain(|v| {
        let kept = *k.next().unwrap_or(&false);
        asked += u64::from(kept && !ancestors.contains(&v.id) && !v.path.is_empty());
        kept
    });
    asked
}

/// Restores versions of `filespace` from `server` into `target`.
pub fn restore(
    server: &dyn Server,
    filespace: &str,
    target: &Path,
    options: &RestoreOptions,
) -> Result<RestoreSummary> {
    let Selected { filespace: fs_id, mut versions, ancestors } =
        select(server, filespace, options)?;
    resolve_outside_links(server, fs_id, &mut versions)?;
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
    // A target that exists is the user's: its owner, mode and times stay as they are unless
    // replacing. One this restore creates gets the backed-up root's.
    let target_existed = fs::symlink_metadata(target).is_ok();
    fs::create_dir_all(target).map_err(ClientError::io("cannot create restore target", target))?;
    let mut summary = RestoreSummary {
        wanted_files: versions
            .iter()
            .filter(|v| v.object_type != ObjectType::Directory && !ancestors.contains(&v.id))
            .count() as u64,
        ..RestoreSummary::default()
    };
    let root = running_as_root();
    let meta = fsmeta::Context::new(root);
    // Other names of files restored here, linked once their files are in place.
    let mut links = Vec::new();
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
    let target_fd = Arc::new(target_fd);
    let tree = Dirs::new(Arc::clone(&target_fd), target);
    let mut dirs = Vec::new();
    let mut jobs =
        Vec::with_capacity(versions.iter().filter(|v| v.object_type == ObjectType::File).count());
    let me = current_uid();
    let mut swept = HashSet::new();
    for v in &versions {
        // The directories on the way to what was asked are created with their metadata,
        // but never changed when they exist, whatever `--replace` says: they were not asked.
        let ancestor = ancestors.contains(&v.id);
        let existing = if ancestor { Existing::Skip } else { options.existing };
        if v.path.is_empty() && v.object_type == ObjectType::Directory {
            // The filespace root is the target itself.
            if !target_existed || existing == Existing::Replace {
                dirs.push(v);
                summary.restored += u64::from(!ancestor);
            } else {
                summary.skipped += u64::from(!ancestor);
            }
            summary.dirs += u64::from(!ancestor);
            continue;
        }
        // Before the first entry goes into a directory, what killed restores left there.
        if let (Some(me), Ok(components), false) = (me, safe_components(&v.path), ancestor) {
            let parents = components.split_last().map_or(&[][..], |(_, p)| p);
            if swept.insert(parents.to_vec())
                && let Ok(dir) = tree.get(parents, false)
            {
                summary.leftovers += sweep_leftovers(&dir, me);
            }
        }
        if v.object_type == ObjectType::Hardlink {
            links.push((v, existing));
            continue;
        }
        match restore_one(v, target, &tree, existing, &meta) {
            Ok(Outcome::Restored(bytes, renamed)) => {
                summary.renamed += u64::from(renamed);
                summary.bytes += bytes;
                if !ancestor {
                    summary.restored += 1;
                }
                if v.object_type == ObjectType::Directory {
                    summary.dirs += u64::from(!ancestor);
                    dirs.push(v);
                }
            }
            Ok(Outcome::Skipped) => {
                summary.skipped += u64::from(!ancestor);
                if v.object_type == ObjectType::Directory {
                    summary.dirs += u64::from(!ancestor);
                }
            }
            Ok(Outcome::File(job)) => jobs.push(job),
            Err(Refusal::Warn(why)) => summary.fail(filespace, &v.path, &why),
        }
    }
    // Container order: chunk ids grow in the order frames were appended to the pool, so the
    // server reads its containers front to back instead of seeking between them.
    // In place: a stable sort's buffer would be half the job list again.
    jobs.sort_unstable_by_key(|j| {
        (j.version.chunks.first().map_or(i64::MIN, |c| c.0), j.version.id.0)
    });
    restore_files(
        server,
        &jobs,
        &tree,
        &meta,
        options.threads,
        &options.keys,
        options.require_sealed,
        &mut summary,
        filespace,
    )?;
    // Later names of link groups, now that their files are in place.
    restore_links(&links, &jobs, &tree, &mut summary, filespace);
    // Directory owner, mode and times last, deepest first: restoring their contents changed
    // them. Through a handle opened without following symlinks, so a directory swapped for a
    // symlink meanwhile is skipped, not followed.
    for v in dirs.iter().rev() {
        let Ok(components) = safe_components(&v.path) else { continue };
        if let Ok(fd) = tree.get(&components, false) {
            let problems = fsmeta::apply(At::Fd(fd.as_fd()), v.object_type, &v.attrs, &meta);
            meta.note(&format!("{filespace}/{}", String::from_utf8_lossy(&v.path)), problems);
        }
    }
    if options.sync {
        rustix::fs::syncfs(&*target_fd).map_err(|e| ClientError::Io {
            op: "writing the restored files to disk (syncfs)",
            path: target.to_path_buf(),
            source: e.into(),
        })?;
    }
    summary.incomplete += meta.incomplete.load(std::sync::atomic::Ordering::Relaxed);
    summary.warnings.append(&mut meta.take_notes());
    summary.warnings.extend(meta.setid_note());
    Ok(summary)
}

enum Outcome<'v> {
    /// Restored (bytes written), under a new name or not.
    Restored(u64, bool),
    Skipped,
    /// A file to restore through the pipeline.
    File(FileJob<'v>),
}

/// A file whose data the pipeline writes: into [`FileJob::tmp`] in its parent directory
/// (reached again from the target's descriptor, never by path), renamed to
/// [`FileJob::name`] when complete. Kept small, its names derived from the version when
/// needed: a restore holds one per file (issue 24's memory bound).
struct FileJob<'v> {
    version: &'v ObjectVersion,
    /// Restored beside an existing file, under this name: never replace what is there.
    renamed: Option<OsString>,
    /// Its data and metadata are in place under its name (hard links may point at it).
    done: std::sync::atomic::AtomicBool,
    /// Its temporary file and progress, shared by the workers that write it.
    target: Target,
}

impl<'v> FileJob<'v> {
    fn new(version: &'v ObjectVersion, renamed: Option<OsString>) -> FileJob<'v> {
        FileJob { version, renamed, done: false.into(), target: Target::default() }
    }

    /// The directories from the target to the file (its path was checked when the job was
    /// made).
    fn parents(&self) -> Vec<&'v OsStr> {
        let mut c = safe_components(&self.version.path).unwrap_or_default();
        c.pop();
        c
    }

    /// The name it is restored under.
    fn name(&self) -> &OsStr {
        match &self.renamed {
            Some(name) => name,
            None => {
                Path::new(OsStr::from_bytes(&self.version.path)).file_name().unwrap_or_default()
            }
        }
    }

    fn tmp(&self) -> String {
        temp_name(self.version.id)
    }

    /// Its path below `target`, for messages.
    fn shown(&self, target: &Path) -> PathBuf {
        let mut p = self.parents().iter().fold(target.to_path_buf(), |p, c| p.join(c));
        p.push(self.name());
        p
    }
}

/// Why one object was not restored (the restore goes on with the others).
enum Refusal {
    Warn(String),
}

fn restore_one<'v>(
    v: &'v ObjectVersion,
    target: &Path,
    dirs: &Dirs,
    existing: Existing,
    meta: &fsmeta::Context,
) -> std::result::Result<Outcome<'v>, Refusal> {
    let components = safe_components(&v.path)
        .map_err(|why| Refusal::Warn(format!("unsafe name in the catalog ({why})")))?;
    let Some((last, parents)) = components.split_last() else {
        // The filespace root itself: the target.
        return Ok(Outcome::Restored(0, false));
    };
    let parent_path = parents.iter().fold(target.to_path_buf(), |p, c| p.join(c));
    let parent = dirs.get(parents, true).map_err(Refusal::Warn)?;
    let path = parent_path.join(last);
    let present = rustix::fs::statat(&parent, *last, AtFlags::SYMLINK_NOFOLLOW).ok();
    match v.object_type {
        ObjectType::Directory => {
            dirs.get(&components, true).map_err(Refusal::Warn)?;
            // An existing directory is used as it is, its owner, mode and times untouched,
            // unless replacing.
            if present.is_some() && existing != Existing::Replace {
                return Ok(Outcome::Skipped);
            }
            Ok(Outcome::Restored(0, false))
        }
        ObjectType::Symlink
        | ObjectType::File
        | ObjectType::Fifo
        | ObjectType::CharDevice
        | ObjectType::BlockDevice
        | ObjectType::Hardlink => {
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
            if v.object_type == ObjectType::File {
                return Ok(Outcome::File(FileJob::new(v, renamed.then(|| last.to_os_string()))));
            }
            let tmp = temp_name(v.id);
            if v.object_type == ObjectType::Symlink {
                let link = v.attrs.link_target.as_deref().unwrap_or_default();
                rustix::fs::symlinkat(OsStr::from_bytes(link), &parent, tmp.as_str())
                    .map_err(|e| Refusal::Warn(format!("cannot create symlink: {e}")))?;
            } else {
                fsmeta::make_node(parent.as_fd(), OsStr::new(&tmp), v.object_type, v.attrs.rdev)
                    .map_err(Refusal::Warn)?;
            }
            // Metadata on the temporary name: a rename changes neither mtime nor owner.
            let at = At::Name(parent.as_fd(), OsStr::new(&tmp));
            meta.note(
                &path.display().to_string(),
                fsmeta::apply(at, v.object_type, &v.attrs, meta),
            );
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

/// Quanta of consecutive files on their way through the pipeline together. One piece per
/// quantum cost a small file three hand-offs between threads (reader, worker, writer), each a
/// wake-up when the other side sleeps: on the kernel tree most of a restore's system calls
/// were those wake-ups and crossbeam's `sched_yield`s before them (issue 24). A piece takes
/// up to [`PIECE_QUANTA`] quanta or [`PIECE_BYTES`] of data, so a large file's quanta still
/// go one per piece to all workers, and small files go by the dozen.
#[derive(Default)]
struct Piece {
    /// The quanta's frames as read from the pool, one after another.
    frames: Vec<u8>,
    /// Their decoded data, one after another, when it is streamed; a restore to files writes
    /// each quantum as it is decoded and keeps none.
    raw: Vec<u8>,
    quanta: Vec<Quantum>,
}

/// Quanta a piece takes at most, and the data (decoded) after which it takes no more.
const PIECE_QUANTA: usize = 64;
const PIECE_BYTES: u64 = 512 << 10;

/// One quantum of a restored file.
#[derive(Default)]
struct Quantum {
    /// Index of the file in the job list.
    job: usize,
    /// Its frame in [`Piece::frames`], if it has one.
    frame: std::ops::Range<usize>,
    has_frame: bool,
    /// Its data in [`Piece::raw`], when streamed.
    raw: std::ops::Range<usize>,
    /// Where this quantum's data goes in the file.
    offset: u64,
    /// Its length according to the catalog, which the frame must agree with.
    expected_len: u32,
    /// The chunk's keyed id according to the catalog.
    chunk_id: Option<[u8; 32]>,
    /// The file's last quantum.
    last: bool,
    /// The file cannot be restored, and why.
    failed: Option<String>,
    /// What became of the file, if this quantum was the last a worker wrote of it.
    finished: Option<Finished>,
}

/// Pieces in flight for `threads` workers: two per worker and a reserve, but no more than
/// 64 MiB of them, so a restore's memory does not grow with the core count (issue 24: at
/// most 150 MB on the kernel tree, whatever `--threads` says).
fn piece_slots(threads: usize) -> usize {
    const PIECES_BUDGET: usize = 64 << 20;
    // A piece's frames and decoded data stop growing once past PIECE_BYTES, by at most a
    // quantum each.
    let piece_bytes = 2 * (PIECE_BYTES as usize + qsm_codec::DEFAULT_QUANTUM);
    qsm_codec::pipeline::slots_within(threads, piece_bytes, PIECES_BUDGET)
}

/// The length of a version's data as its frames carry it, which the frames must cover exactly:
/// the file's size. This is the one place that says so (a version whose frames carry only
/// part of the file, such as the data extents of a sparse file, changes it here).
pub(crate) fn expected_data_len(v: &ObjectVersion) -> u64 {
    v.attrs.data_len()
}

/// The file the reader is on: how far its data has come.
struct OpenFile {
    /// Where the next frame must start: frames must run on from byte 0 without gap, overlap
    /// or reordering, so each one's offset is exactly the end of the one before.
    next_offset: u64,
    /// The data the frames must cover ([`expected_data_len`]).
    expected: u64,
    /// The file cannot be restored, and why: its later frames are read and dropped, and its
    /// temporary file is removed at its last one.
    failed: Option<String>,
}

/// The reader side: walks the jobs and takes their frames from the server's stream, which
/// brings them job by job in the order asked.
///
/// The server is not trusted to bring them whole: a file is written only if its frames run
/// from byte 0 to its expected length, each starting where the one before ended, each holding
/// data, the last marked last and nothing after it. Anything else (a frame withheld,
/// repeated, reordered, past the end, without data; a file ended early or never begun; data
/// after the end) fails that file by name, and the restore goes on with the others.
struct FrameSource<'a> {
    fetch: Box<dyn Fetch + 'a>,
    jobs: &'a [FileJob<'a>],
    /// Each job's index by object id, to tell a frame of a later file (the current one was
    /// cut short) from one nobody asked for.
    index: HashMap<ObjectId, usize>,
    next_job: usize,
    current: Option<OpenFile>,
    /// A frame read ahead (to see that nothing follows a file's last frame, or because it
    /// begins a later file), with the buffer holding it.
    ahead: Option<(Fetched, Vec<u8>)>,
    /// A spare frame buffer for the next read-ahead.
    spare: Vec<u8>,
    /// The frame being read, before it joins its piece.
    frame: Vec<u8>,
    /// The server's stream has ended: every file still to come fails without being created.
    ended: bool,
    /// Set when the stream itself failed (the server is gone): the restore stops.
    broken: Option<ClientError>,
}

impl FrameSource<'_> {
    /// The next frame into `frame`: the one read ahead, or the next of the stream (`None` at
    /// its end). A failed stream stops the restore.
    fn take(
        &mut self,
        frame: &mut Vec<u8>,
    ) -> std::result::Result<Option<Fetched>, qsm_codec::Error> {
        if let Some((fetched, mut buf)) = self.ahead.take() {
            std::mem::swap(frame, &mut buf);
            self.spare = buf;
            return Ok(Some(fetched));
        }
        if self.ended {
            return Ok(None);
        }
        match self.fetch.next(frame) {
            Ok(Some(f)) => Ok(Some(f)),
            Ok(None) => {
                self.ended = true;
                Ok(None)
            }
            Err(e) => {
                self.broken = Some(e.into());
                Err(qsm_codec::Error::Invalid("restore stopped".into()))
            }
        }
    }

    /// Reads the next frame ahead, to be taken by the next call.
    fn peek(&mut self) -> std::result::Result<Option<&Fetched>, qsm_codec::Error> {
        if self.ahead.is_none() {
            let mut buf = std::mem::take(&mut self.spare);
            if let Some(f) = self.take(&mut buf)? {
                self.ahead = Some((f, buf));
            } else {
                self.spare = buf;
            }
        }
        Ok(self.ahead.as_ref().map(|(f, _)| f))
    }

    /// Starts `job` (its file is made by the worker with its first data: [`Target`]). Not
    /// when the stream has ended: the file fails without being made.
    fn open(&self, job: &FileJob) -> OpenFile {
        let expected = expected_data_len(job.version);
        let failed = (self.ended && self.ahead.is_none())
            .then(|| "the server's data ended before this file's began".to_owned());
        OpenFile { next_offset: 0, expected, failed }
    }

    /// The next piece (`false`: none, the restore is at its end), each quantum counted on its
    /// file's [`Target`] (whose last quantum the workers must know).
    fn next(&mut self, piece: &mut Piece) -> std::result::Result<bool, qsm_codec::Error> {
        piece.frames.clear();
        piece.raw.clear();
        piece.quanta.clear();
        let mut frame = std::mem::take(&mut self.frame);
        let gathered = self.gather(piece, &mut frame);
        self.frame = frame;
        gathered?;
        Ok(!piece.quanta.is_empty())
    }

    fn gather(
        &mut self,
        piece: &mut Piece,
        frame: &mut Vec<u8>,
    ) -> std::result::Result<(), qsm_codec::Error> {
        let mut bytes = 0u64;
        while piece.quanta.len() < PIECE_QUANTA && bytes < PIECE_BYTES {
            let mut q = Quantum::default();
            if !self.fill(&mut q, frame)? {
                break;
            }
            self.jobs[q.job].target.sent(q.last);
            if q.has_frame {
                let start = piece.frames.len();
                piece.frames.extend_from_slice(frame);
                q.frame = start..piece.frames.len();
            }
            bytes += u64::from(q.expected_len);
            piece.quanta.push(q);
        }
        Ok(())
    }

    /// The next quantum into `piece`, its frame into `frame`.
    fn fill(
        &mut self,
        q: &mut Quantum,
        frame: &mut Vec<u8>,
    ) -> std::result::Result<bool, qsm_codec::Error> {
        if self.current.is_none() {
            let Some(job) = self.jobs.get(self.next_job) else { return Ok(false) };
            self.current = Some(self.open(job));
            self.next_job += 1;
        }
        q.job = self.next_job - 1;
        let jobs = self.jobs;
        let job = &jobs[q.job];
        let fetched = self.take(frame)?;
        let Some(cur) = self.current.as_mut() else { return Ok(false) };
        let short = |cur: &OpenFile| {
            format!(
                "the server's data for it ended at byte {} of {}: the rest is missing",
                cur.next_offset, cur.expected
            )
        };
        let fetched = match fetched {
            Some(f) if f.object == job.version.id => f,
            // The end of the stream, or a later file's frame: this file ends here, whole or
            // not (a later file's frame is kept for it).
            end => {
                let later = end.as_ref().and_then(|f| self.index.get(&f.object).copied());
                match (end, later) {
                    (None, _) => {}
                    (Some(f), Some(k)) if k > q.job => {
                        let buf = std::mem::take(frame);
                        self.ahead = Some((f, buf));
                    }
                    // An object not asked for, or a file already ended: dropped, and this
                    // file, whose frames it came among, fails.
                    (Some(f), _) => {
                        cur.failed.get_or_insert_with(|| {
                            format!(
                                "the server sent data of object {} among this file's",
                                f.object.0
                            )
                        });
                        q.failed = cur.failed.clone();
                        return Ok(true);
                    }
                }
                if cur.failed.is_none() {
                    cur.failed = Some(if cur.next_offset == cur.expected {
                        "the server never marked the end of its data".into()
                    } else {
                        short(cur)
                    });
                }
                q.failed = cur.failed.clone();
                q.last = true;
                self.current = None;
                return Ok(true);
            }
        };
        q.offset = fetched.offset;
        q.expected_len = fetched.raw_len;
        q.chunk_id = fetched.chunk_id;
        q.has_frame = fetched.has_frame;
        let end = fetched.offset.checked_add(u64::from(fetched.raw_len));
        if cur.failed.is_none() {
            cur.failed = if let Some(why) = fetched.error {
                Some(why)
            } else if fetched.offset < cur.next_offset {
                Some(format!(
                    "the server sent data from byte {} again or out of order, where byte {} \
                     was due",
                    fetched.offset, cur.next_offset
                ))
            } else if fetched.offset > cur.next_offset {
                Some(format!(
                    "bytes {} to {} are missing: the server skipped them (withheld or out of \
                     order)",
                    cur.next_offset, fetched.offset
                ))
            } else if end.is_none_or(|end| end > cur.expected) {
                // A frame past the expected length would grow the file beyond what was
                // backed up.
                Some(format!(
                    "the server sent data up to byte {} of a file of {} bytes",
                    u128::from(fetched.offset) + u128::from(fetched.raw_len),
                    cur.expected
                ))
            } else if !fetched.has_frame && fetched.raw_len > 0 {
                Some(format!(
                    "the server sent no data for bytes {} to {}",
                    fetched.offset,
                    end.unwrap_or(u64::MAX)
                ))
            } else {
                None
            };
        }
        if let Some(end) = end.filter(|_| cur.failed.is_none()) {
            cur.next_offset = end;
        }
        if fetched.last {
            if cur.failed.is_none() && cur.next_offset != cur.expected {
                cur.failed = Some(short(cur));
            }
            // Nothing of this file may follow its last frame: it would be data the file
            // was written without.
            let id = job.version.id;
            if self.peek()?.is_some_and(|f| f.object == id) {
                if let Some(cur) = self.current.as_mut() {
                    cur.failed.get_or_insert_with(|| {
                        "the server sent more of its data after its last frame".into()
                    });
                }
                // Its frames after the end are skipped here, so the next file starts clean.
                while self.peek()?.is_some_and(|f| f.object == id) {
                    self.ahead = None;
                }
            }
            q.last = true;
        }
        q.failed = self.current.as_ref().and_then(|c| c.failed.clone());
        if q.last {
            self.current = None;
        }
        Ok(true)
    }
}

/// Restores the files' data on all cores: frames are read in order by one thread; the
/// workers decode them, make each file, write its quanta at their offsets (`pwrite`) and
/// finish it (metadata, rename into place) once its last quantum is written ([`Target`]);
/// the in-order writer only counts.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
fn restore_files(
    server: &dyn Server,
    jobs: &[FileJob],
    dirs: &Dirs,
    meta: &fsmeta::Context,
    threads: Option<usize>,
    keys: &Option<Arc<crate::keys::NodeKeys>>,
    require_sealed: bool,
    summary: &mut RestoreSummary,
    filespace: &str,
) -> Result<()> {
    let keys = keys.as_deref();
    let fetch = server.fetch(jobs.iter().map(|j| j.version.id).collect())?;
    let mut source = FrameSource {
        fetch,
        jobs,
        index: jobs.iter().enumerate().map(|(i, j)| (j.version.id, i)).collect(),
        next_job: 0,
        current: None,
        ahead: None,
        spare: Vec::new(),
        frame: Vec::new(),
        ended: false,
        broken: None,
    };
    let threads = threads.unwrap_or_else(qsm_codec::engine::default_threads);
    let result = qsm_codec::pipeline::run_with_slots(
        threads,
        piece_slots(threads),
        |_, piece: &mut Piece| source.next(piece),
        || Ok((qsm_codec::FrameDecoder::new(), direct::Buffer::default())),
        |(decoder, raw), _, piece| {
            for q in &mut piece.quanta {
                let frame = &piece.frames[q.frame.clone()];
                decode_quantum(decoder, frame, raw, q, keys, require_sealed, jobs, Some(dirs));
                let job = &jobs[q.job];
                q.finished = job.target.written(q.failed.as_deref(), job, dirs, meta);
            }
            Ok(())
        },
        |_, piece| {
            for q in &piece.quanta {
                let job = &jobs[q.job];
                match &q.finished {
                    None => {}
                    Some(Finished::Restored) => {
                        summary.restored += 1;
                        summary.renamed += u64::from(job.renamed.is_some());
                        summary.bytes += job.version.attrs.data_len();
                    }
                    Some(Finished::Failed(why)) => summary.fail(filespace, &job.version.path, why),
                }
            }
            Ok(())
        },
    );
    // A restore that stopped leaves no temporaries of the files it was writing.
    for job in jobs {
        job.target.abandon(job);
    }
    if let Some(e) = source.broken {
        return Err(e);
    }
    result.map_err(|e| ClientError::Invalid(format!("restore of {filespace}: {e}")))?;
    Ok(())
}

/// Decodes and checks a quantum's frame (decryption, length, chunk id, encryption required)
/// into `raw` and writes its data to its temporary file, if it has one; a quantum that fails
/// says why. Restoring to files and streaming share it, so both check alike.
#[allow(clippy::too_many_arguments)] // the restore's settings, passed through
fn decode_quantum(
    decoder: &mut qsm_codec::FrameDecoder,
    frame: &[u8],
    raw: &mut direct::Buffer,
    q: &mut Quantum,
    keys: Option<&crate::keys::NodeKeys>,
    require_sealed: bool,
    jobs: &[FileJob],
    dirs: Option<&Dirs>,
) {
    if !q.has_frame || q.failed.is_some() {
        return;
    }
    let sealer = keys.map(|k| &k.frames as &dyn qsm_codec::PayloadSealer);
    let context = q.chunk_id.as_ref().map_or(&[][..], |id| &id[..]);
    // A damaged header finds no room and is refused by the decoder, naming the damage.
    let len = qsm_codec::FrameHeader::parse(frame).map_or(0, |h| h.raw_len as usize);
    let decoded = decoder.decode_sealed_into(frame, raw.room(len), sealer, context);
    match decoded {
        Ok(header) if require_sealed && !header.is_sealed() => {
            q.failed = Some(format!(
                "the data at byte {} of the file is not encrypted, and encryption is \
                 required: it was backed up before encryption was on, or replaced",
                q.offset
            ));
        }
        Ok(header) if header.raw_len != q.expected_len => {
            q.failed = Some(format!(
                "the catalog says {} bytes at byte {} of the file, the stored frame holds {}",
                q.expected_len, q.offset, header.raw_len
            ));
        }
        // A sealed frame opened under its id; the data must also hash to that id
        // (the catalog's id is what deduplication trusts).
        Ok(header)
            if header.is_sealed()
                && keys.map(|k| k.ids.id(raw.data(header.raw_len as usize)).0) != q.chunk_id =>
        {
            q.failed = Some(format!(
                "the data at byte {} of the file does not match its chunk id: the \
                 frame belongs elsewhere",
                q.offset
            ));
        }
        Ok(header) => {
            let n = header.raw_len as usize;
            let job = &jobs[q.job];
            let written = dirs.map(|dirs| {
                let file = job.target.file(job, dirs)?;
                job.target.write(&file, raw, n, q.offset, job).map_err(|e| format!("writing: {e}"))
            });
            if let Some(Err(why)) = written {
                q.failed = Some(why);
            }
        }
        Err(qsm_codec::FrameError::Encrypted) => {
            q.failed = Some(
                "it is encrypted, and no key was opened: give the passphrase \
                 (QSM_PASSPHRASE_FILE, or run on a terminal)"
                    .into(),
            )
        }
        Err(e) => q.failed = Some(format!("damaged data at byte {} of the file: {e}", q.offset)),
    }
}

/// Links the later names of link groups (`Hardlink` versions) to their group's file once it is
/// in place, so the group comes back as one inode. A name whose file was not restored by this
/// run (it failed, or existed and was skipped) is not linked to whatever is there: it fails,
/// named.
fn restore_links(
    links: &[(&ObjectVersion, Existing)],
    jobs: &[FileJob],
    dirs: &Dirs,
    summary: &mut RestoreSummary,
    filespace: &str,
) {
    if links.is_empty() {
        return;
    }
    let by_path: HashMap<&[u8], &FileJob> =
        jobs.iter().map(|j| (j.version.path.as_slice(), j)).collect();
    for (v, existing) in links {
        match link_one(v, *existing, &by_path, dirs) {
            Ok(Outcome::Restored(_, renamed)) => {
                summary.restored += 1;
                summary.renamed += u64::from(renamed);
            }
            Ok(Outcome::Skipped) => summary.skipped += 1,
            Ok(Outcome::File(_)) => {}
            Err(Refusal::Warn(why)) => summary.fail(filespace, &v.path, &why),
        }
    }
}

fn link_one(
    v: &ObjectVersion,
    existing: Existing,
    by_path: &HashMap<&[u8], &FileJob>,
    dirs: &Dirs,
) -> std::result::Result<Outcome<'static>, Refusal> {
    let components = safe_components(&v.path)
        .map_err(|why| Refusal::Warn(format!("unsafe name in the catalog ({why})")))?;
    let Some((last, parents)) = components.split_last() else {
        return Err(Refusal::Warn("the filespace root cannot be another name of a file".into()));
    };
    let parent = dirs.get(parents, true).map_err(Refusal::Warn)?;
    let present = rustix::fs::statat(&*parent, *last, AtFlags::SYMLINK_NOFOLLOW).ok();
    if present.is_some() && existing == Existing::Skip {
        return Ok(Outcome::Skipped);
    }
    let first = v.attrs.link_target.as_deref().unwrap_or_default();
    let job = by_path
        .get(first)
        .filter(|j| j.done.load(std::sync::atomic::Ordering::Relaxed))
        .ok_or_else(|| {
            Refusal::Warn(format!(
                "it is another name of {}, which this restore did not restore",
                String::from_utf8_lossy(first)
            ))
        })?;
    let from = dirs.get(&job.parents(), false).map_err(Refusal::Warn)?;
    let renamed = present.is_some() && existing == Existing::Rename;
    if !renamed
        && present.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
    {
        return Err(Refusal::Warn(format!("{} is a directory", String::from_utf8_lossy(&v.path))));
    }
    let name = if renamed {
        free_name(&parent, last).map_err(Refusal::Warn)?
    } else {
        last.to_os_string()
    };
    let tmp = temp_name(v.id);
    // Without AT_SYMLINK_FOLLOW: whatever is at the file's name is linked itself, never
    // followed out of the target.
    rustix::fs::linkat(&from, job.name(), &parent, tmp.as_str(), AtFlags::empty()).map_err(
        |e| Refusal::Warn(format!("cannot link to {}: {e}", job.shown(dirs.shown()).display())),
    )?;
    into_place(&parent, &tmp, &name, renamed).map_err(|e| {
        let _ = rustix::fs::unlinkat(&parent, tmp.as_str(), AtFlags::empty());
        Refusal::Warn(format!("cannot rename into place: {e}"))
    })?;
    Ok(Outcome::Restored(0, renamed))
}

/// A partial restore may hold later names of a link group without its first name, whose
/// version holds the data (it is outside the subpath, or not selected): the first such name
/// in the restore takes the data itself (it becomes that version, under its own path), and
/// the group's other names in the restore link to it. The first name's version is the one
/// that was active when the link's version was stored (or, for archives, the newest archive
/// stored with it or before).
fn resolve_outside_links(
    server: &dyn Server,
    fs_id: qsm_types::model::FilespaceId,
    versions: &mut [ObjectVersion],
) -> Result<()> {
    let files: HashSet<&[u8]> = versions
        .iter()
        .filter(|v| v.object_type == ObjectType::File)
        .map(|v| v.path.as_slice())
        .collect();
    // Each missing first name, with the link version that decides which of its versions.
    let mut missing: HashMap<Vec<u8>, (ObjectKind, Timestamp)> = HashMap::new();
    for v in versions.iter().filter(|v| v.object_type == ObjectType::Hardlink) {
        if let Some(t) = v.attrs.link_target.as_deref().filter(|t| !files.contains(t)) {
            missing.entry(t.to_vec()).or_insert((v.kind, v.inserted));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut found: HashMap<Vec<u8>, ObjectVersion> = HashMap::new();
    // Newest first within a path: the first that qualifies is the one.
    server.inventory(fs_id, Scope::All, &mut |v| {
        if let Some((kind, at)) = missing.get(&v.path)
            && v.object_type == ObjectType::File
            && v.kind == *kind
            && v.inserted <= *at
            && (v.kind == ObjectKind::Archive || v.deactivated.is_none_or(|d| d > *at))
            && !found.contains_key(&v.path)
        {
            found.insert(v.path.clone(), v);
        }
        Ok(())
    })?;
    let mut taken: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for v in versions.iter_mut().filter(|v| v.object_type == ObjectType::Hardlink) {
        let Some(first) = v.attrs.link_target.clone() else { continue };
        if let Some(now) = taken.get(&first) {
            v.attrs.link_target = Some(now.clone());
        } else if let Some(data) = found.get(&first) {
            taken.insert(first, v.path.clone());
            let path = std::mem::take(&mut v.path);
            *v = ObjectVersion { path, ..data.clone() };
        }
    }
    Ok(())
}

/// Where [`stream`] writes what it restores: a tar stream, or one file's bytes.
pub trait Sink {
    /// An entry starts. A regular file's bytes follow through [`Sink::data`], all of them
    /// (holes as zeros), then [`Sink::end`]; other entries end at once.
    fn begin(&mut self, v: &ObjectVersion) -> std::io::Result<()>;
    /// The next bytes of the current file.
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// The entry is complete.
    fn end(&mut self, v: &ObjectVersion) -> std::io::Result<()>;
}

/// Restores what `options` select of `filespace` into `sink` instead of files: directories,
/// links and special files first (in path order), then every file's data in order, decoded
/// and checked on all cores exactly as a restore to files checks it, then hard links (after
/// the files they name). A file that fails stops the stream, naming it: a stream cannot leave
/// a hole for one file as a restore to files can. Returns the entries written.
pub fn stream(
    server: &dyn Server,
    filespace: &str,
    options: &RestoreOptions,
    sink: &mut dyn Sink,
) -> Result<u64> {
    let Selected { filespace: fs_id, mut versions, .. } = select(server, filespace, options)?;
    resolve_outside_links(server, fs_id, &mut versions)?;
    let out = |source: std::io::Error| ClientError::Io {
        op: "writing the restored stream to",
        path: PathBuf::from("the output"),
        source,
    };
    let mut count = 0u64;
    let data_less = |t: ObjectType| t != ObjectType::File && t != ObjectType::Hardlink;
    for v in versions.iter().filter(|v| data_less(v.object_type)) {
        sink.begin(v).and_then(|()| sink.end(v)).map_err(out)?;
        count += 1;
    }
    let jobs: Vec<FileJob> = versions
        .iter()
        .filter(|v| v.object_type == ObjectType::File)
        .map(|v| FileJob::new(v, None))
        .collect();
    if !jobs.is_empty() {
        let keys = options.keys.as_deref();
        let mut source = FrameSource {
            fetch: server.fetch(jobs.iter().map(|j| j.version.id).collect())?,
            jobs: &jobs,
            index: jobs.iter().enumerate().map(|(i, j)| (j.version.id, i)).collect(),
            next_job: 0,
            current: None,
            ahead: None,
            spare: Vec::new(),
            frame: Vec::new(),
            ended: false,
            broken: None,
        };
        // The file being written, and how far (a file offset: holes are filled with zeros).
        let mut current: Option<usize> = None;
        let mut pos = 0u64;
        let mut failure: Option<ClientError> = None;
        let zeros = [0u8; 64 * 1024];
        let fill = |sink: &mut dyn Sink, from: u64, to: u64| -> std::io::Result<()> {
            let mut left = to.saturating_sub(from);
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                sink.data(&zeros[..n])?;
                left -= n as u64;
            }
            Ok(())
        };
        let threads = options.threads.unwrap_or_else(qsm_codec::engine::default_threads);
        let result = qsm_codec::pipeline::run_with_slots(
            threads,
            piece_slots(threads),
            |_, piece: &mut Piece| source.next(piece),
            || Ok((qsm_codec::FrameDecoder::new(), direct::Buffer::default())),
            |(decoder, raw), _, piece| {
                let sealed = options.require_sealed;
                for q in &mut piece.quanta {
                    let frame = &piece.frames[q.frame.clone()];
                    decode_quantum(decoder, frame, raw, q, keys, sealed, &jobs, None);
                    if q.has_frame && q.failed.is_none() {
                        let start = piece.raw.len();
                        piece.raw.extend_from_slice(raw.data(q.expected_len as usize));
                        q.raw = start..piece.raw.len();
                    }
                }
                Ok(())
            },
            |_, piece| {
                for q in &piece.quanta {
                    let job = &jobs[q.job];
                    let v = &job.version;
                    let stop = |e: ClientError, failure: &mut Option<ClientError>| {
                        *failure = Some(e);
                        qsm_codec::Error::Invalid("the stream stopped".into())
                    };
                    if let Some(why) = &q.failed {
                        let e = ClientError::Invalid(format!(
                            "{}/{}: {why}",
                            filespace.trim_end_matches('/'),
                            String::from_utf8_lossy(&v.path)
                        ));
                        return Err(stop(e, &mut failure));
                    }
                    let written = (|| -> std::io::Result<()> {
                        if current != Some(q.job) {
                            sink.begin(v)?;
                            current = Some(q.job);
                            pos = 0;
                        }
                        if q.has_frame {
                            let n = q.expected_len as usize;
                            let extents = v.attrs.extents.as_deref();
                            let data = &piece.raw[q.raw.clone()][..n];
                            fsmeta::map_data(data, q.offset, extents, &mut |b, at| {
                                fill(sink, pos, at)?;
                                sink.data(b)?;
                                pos = at + b.len() as u64;
                                Ok(())
                            })?;
                        }
                        if q.last {
                            fill(sink, pos, v.attrs.size)?;
                            sink.end(v)?;
                        }
                        Ok(())
                    })();
                    match written {
                        Ok(()) => count += u64::from(q.last),
                        Err(e) => return Err(stop(out(e), &mut failure)),
                    }
                }
                Ok(())
            },
        );
        if let Some(e) = source.broken.or(failure) {
            return Err(e);
        }
        result.map_err(|e| ClientError::Invalid(format!("restore of {filespace}: {e}")))?;
    }
    for v in versions.iter().filter(|v| v.object_type == ObjectType::Hardlink) {
        sink.begin(v).and_then(|()| sink.end(v)).map_err(out)?;
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_is_component_wise() {
        assert_eq!(place(b"a/b", b""), Place::Selected, "no subpath: everything");
        assert_eq!(place(b"", b""), Place::Selected);
        assert_eq!(place(b"a/b", b"a/b"), Place::Selected);
        assert_eq!(place(b"a/b/c", b"a/b"), Place::Selected);
        assert_eq!(place(b"a", b"a/b"), Place::Ancestor);
        assert_eq!(place(b"", b"a/b"), Place::Ancestor, "the root is on the way");
        assert_eq!(place(b"a/bc", b"a/b"), Place::Outside, "a sibling sharing a prefix");
        assert_eq!(place(b"a/b2/c", b"a/b"), Place::Outside);
        assert_eq!(place(b"ab", b"a/b"), Place::Outside, "not an ancestor by prefix");
        assert_eq!(place(b"x", b"a/b"), Place::Outside);
    }

    #[test]
    fn a_restore_failed_when_nothing_but_directories_came_of_it() {
        let s = |restored, skipped, dirs, failed, wanted_files| RestoreSummary {
            restored,
            skipped,
            dirs,
            failed,
            wanted_files,
            ..RestoreSummary::default()
        };
        assert!(s(2, 1, 3, 2, 2).all_failed(), "only directories, every file failed");
        assert!(!s(3, 1, 3, 1, 2).all_failed(), "a file restored");
        assert!(!s(2, 2, 3, 1, 2).all_failed(), "a file already there");
        assert!(!s(3, 0, 3, 0, 2).all_failed(), "nothing failed");
        assert!(!s(3, 0, 3, 1, 0).all_failed(), "only directories asked, most restored");
        assert!(s(0, 0, 0, 2, 0).all_failed(), "only directories asked, none restored");
    }

    #[test]
    fn only_the_exact_temporary_pattern_names_a_process() {
        let ours = temp_name(ObjectId(42));
        assert_eq!(temp_pid(ours.as_bytes()), Some(std::process::id()));
        assert_eq!(temp_pid(b".qsm-restore-123-4"), Some(123));
        for other in [
            &b".qsm-restore-123-"[..],
            b".qsm-restore--4",
            b".qsm-restore-12a-4",
            b".qsm-restore-123-4x",
            b".qsm-restore-123-4-5",
            b"x.qsm-restore-123-4",
            b".qsm-restore-123",
            b".qsm-restore-99999999999-4",
            b"report.txt",
        ] {
            assert_eq!(temp_pid(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
