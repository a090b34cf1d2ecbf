//! The directory walk: parallel, symlinks not followed, parents before children, entries of
//! one directory in bytewise name order. Across directories the order depends on thread
//! timing, so backup looks the inventory up by path rather than merging two sorted streams.
//! Unreadable entries are reported to the caller and skipped; they never stop the walk.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use qsm_catalog::{Attributes, ObjectType};

use crate::filter::{Filter, Verdict};

/// One file-system entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Path below the walk's root, `/`-separated, without a leading `/` (empty for the root).
    pub rel: Vec<u8>,
    /// Where it is.
    pub path: PathBuf,
    /// File, directory or symlink.
    pub object_type: ObjectType,
    /// Metadata as the catalog records it.
    pub attrs: Attributes,
    /// Device, for one-file-system and, with the inode in `attrs`, to recognise the file when
    /// it is opened.
    pub dev: u64,
}

/// Metadata of `path` (not following a symlink), or `None` for a type QSM does not back up
/// (sockets, FIFOs, devices).
pub fn entry(path: &Path, rel: Vec<u8>) -> std::io::Result<Option<Entry>> {
    let meta = fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    let (object_type, link_target) = if ft.is_file() {
        (ObjectType::File, None)
    } else if ft.is_dir() {
        (ObjectType::Directory, None)
    } else if ft.is_symlink() {
        (ObjectType::Symlink, Some(fs::read_link(path)?.as_os_str().as_bytes().to_vec()))
    } else {
        return Ok(None);
    };
    Ok(Some(Entry {
        rel,
        path: path.to_path_buf(),
        object_type,
        attrs: attributes(&meta, link_target),
        dev: meta.dev(),
    }))
}

/// The catalog's attributes of a file from its metadata (`lstat` or `fstat`): size for
/// regular files only, times in nanoseconds, mode and owner.
pub fn attributes(meta: &fs::Metadata, link_target: Option<Vec<u8>>) -> Attributes {
    let nanos = |s: i64, ns: i64| s.saturating_mul(1_000_000_000).saturating_add(ns);
    Attributes {
        size: if meta.is_file() { meta.len() } else { 0 },
        mtime_ns: nanos(meta.mtime(), meta.mtime_nsec()),
        ctime_ns: nanos(meta.ctime(), meta.ctime_nsec()),
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        link_target,
        ino: meta.ino(),
    }
}

/// How to walk.
#[derive(Debug, Clone, Copy)]
pub struct WalkOptions<'a> {
    /// Do not enter directories on other devices (they are still visited).
    pub one_file_system: bool,
    /// Which entries to take.
    pub filter: &'a Filter,
    /// Threads listing directories and reading metadata at once.
    pub threads: usize,
}

/// Walks `root` with several threads at once, as ripgrep's walker does: a directory is the unit
/// of work, threads take the most recently found one (depth first, so the queue stays short),
/// and each calls `visit` for the entries of its directory, in name order, a directory before
/// anything below it. `visit` is called for the root first. `warn` gets every entry or
/// directory that cannot be read, with its relative path: nothing at or below that path was
/// examined, so the caller must not take it for deleted. The first error `visit` returns stops
/// the walk and is returned.
///
/// Memory: the queue holds the directories found and not yet listed (a path each), plus one
/// directory's names per thread.
pub fn walk(
    root: &Path,
    options: &WalkOptions<'_>,
    visit: &(dyn Fn(Entry) -> crate::Result<()> + Sync),
    warn: &(dyn Fn(&Path, &[u8], &std::io::Error) + Sync),
) -> crate::Result<()> {
    let top = match entry(root, Vec::new()) {
        Ok(Some(e)) => e,
        Ok(None) => {
            return Err(crate::ClientError::Invalid(format!(
                "{} is not a file or directory",
                root.display()
            )));
        }
        Err(e) => {
            return Err(crate::ClientError::Io {
                op: "cannot back up",
                path: root.to_path_buf(),
                source: e,
            });
        }
    };
    // The root is taken whatever the patterns say: the user named it.
    let is_dir = top.object_type == ObjectType::Directory;
    let included = options.filter.verdict(&top.rel, &top.path, is_dir, false) == Verdict::Included;
    let first = Dir { path: top.path.clone(), rel: top.rel.clone(), included };
    let dev = top.dev;
    visit(top)?;
    if !is_dir {
        return Ok(());
    }
    let queue = Queue {
        state: Mutex::new(QueueState { dirs: vec![first], busy: 0, error: None }),
        changed: Condvar::new(),
    };
    let walker = Walker { queue: &queue, dev, options, visit, warn };
    std::thread::scope(|s| {
        for _ in 1..options.threads.max(1) {
            s.spawn(|| walker.work());
        }
        walker.work();
    });
    match queue.state.into_inner() {
        Ok(state) => state.error.map_or(Ok(()), Err),
        Err(_) => Err(crate::ClientError::Invalid("the directory walk panicked".into())),
    }
}

/// A directory to list.
struct Dir {
    path: PathBuf,
    rel: Vec<u8>,
    /// It matched an include pattern (or one of its parents did).
    included: bool,
}

struct Queue {
    state: Mutex<QueueState>,
    /// Signalled when directories are queued, when one is done, and on error.
    changed: Condvar,
}

struct QueueState {
    dirs: Vec<Dir>,
    /// Directories being listed: while any is, more work may come.
    busy: usize,
    error: Option<crate::ClientError>,
}

struct Walker<'a> {
    queue: &'a Queue,
    dev: u64,
    options: &'a WalkOptions<'a>,
    visit: &'a (dyn Fn(Entry) -> crate::Result<()> + Sync),
    warn: &'a (dyn Fn(&Path, &[u8], &std::io::Error) + Sync),
}

impl Walker<'_> {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A visitor that panicked poisons the lock; the panic itself is reported by the scope.
        self.queue.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn work(&self) {
        loop {
            let dir = {
                let mut state = self.lock();
                loop {
                    if state.error.is_some() {
                        return;
                    }
                    if let Some(dir) = state.dirs.pop() {
                        state.busy += 1;
                        break dir;
                    }
                    if state.busy == 0 {
                        return;
                    }
                    state = self.queue.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let result = self.list(&dir);
            let mut state = self.lock();
            state.busy -= 1;
            match result {
                Ok(found) => state.dirs.extend(found.into_iter().rev()),
                Err(e) => {
                    if state.error.is_none() {
                        state.error = Some(e);
                    }
                }
            }
            drop(state);
            self.queue.changed.notify_all();
        }
    }

    /// Visits the entries of `dir`; returns the directories to enter, in name order.
    fn list(&self, dir: &Dir) -> crate::Result<Vec<Dir>> {
        let mut names: Vec<std::ffi::OsString> = match fs::read_dir(&dir.path) {
            Ok(rd) => rd
                .filter_map(|e| match e {
                    Ok(e) => Some(e.file_name()),
                    Err(err) => {
                        (self.warn)(&dir.path, &dir.rel, &err);
                        None
                    }
                })
                .collect(),
            // Gone since it was visited: nothing below it exists any more.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => {
                (self.warn)(&dir.path, &dir.rel, &err);
                return Ok(Vec::new());
            }
        };
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let mut found = Vec::new();
        for name in names {
            let path = dir.path.join(&name);
            let rel = join_rel(&dir.rel, OsStr::new(&name));
            let e = match entry(&path, rel) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                // Vanished between listing and lstat: truly gone, nothing to keep.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    (self.warn)(&path, &join_rel(&dir.rel, OsStr::new(&name)), &err);
                    continue;
                }
            };
            let is_dir = e.object_type == ObjectType::Directory;
            let verdict = self.options.filter.verdict(&e.rel, &e.path, is_dir, dir.included);
            if verdict == Verdict::Excluded || (verdict == Verdict::Unmatched && !is_dir) {
                continue;
            }
            if is_dir && (!self.options.one_file_system || e.dev == self.dev) {
                found.push(Dir {
                    path: e.path.clone(),
                    rel: e.rel.clone(),
                    included: verdict == Verdict::Included,
                });
            }
            (self.visit)(e)?;
        }
        Ok(found)
    }
}

/// `parent/name` in catalog form.
pub fn join_rel(parent: &[u8], name: &OsStr) -> Vec<u8> {
    let mut rel = parent.to_vec();
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name.as_bytes());
    rel
}
