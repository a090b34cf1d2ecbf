//! The directory walk: in the catalog's path order, so backup merges it with the server's
//! inventory in one pass; parallel underneath (threads list directories ahead of it); symlinks
//! not followed. Unreadable entries are reported to the caller and skipped; they never stop
//! the walk.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use qsm_types::model::{Attributes, ObjectType};

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
    /// Hard links to the inode: above 1, backup looks for the group's other names.
    pub nlink: u64,
    /// The extended attributes could not all be read, and why: the entry is backed up without
    /// them and the backup names it in a warning.
    pub xattr_error: Option<String>,
}

/// Metadata of `path` (not following a symlink) with its extended attributes, or `None` for a
/// socket (and any other type QSM cannot re-create), which the caller notes as skipped.
pub fn entry(path: &Path, rel: Vec<u8>) -> std::io::Result<Option<Entry>> {
    let reached = reach(path)?;
    let at = reached.path();
    let meta = fs::symlink_metadata(at)?;
    let ft = meta.file_type();
    let (object_type, link_target) = if ft.is_file() {
        (ObjectType::File, None)
    } else if ft.is_dir() {
        (ObjectType::Directory, None)
    } else if ft.is_symlink() {
        (ObjectType::Symlink, Some(fs::read_link(at)?.as_os_str().as_bytes().to_vec()))
    } else if ft.is_fifo() {
        (ObjectType::Fifo, None)
    } else if ft.is_char_device() {
        (ObjectType::CharDevice, None)
    } else if ft.is_block_device() {
        (ObjectType::BlockDevice, None)
    } else {
        return Ok(None);
    };
    let mut attrs = attributes(&meta, link_target);
    let xattr_error = match crate::fsmeta::read_xattrs(at) {
        Ok(x) => {
            attrs.xattrs = x;
            None
        }
        Err(why) => Some(why),
    };
    Ok(Some(Entry {
        rel,
        path: path.to_path_buf(),
        object_type,
        attrs,
        dev: meta.dev(),
        nlink: meta.nlink(),
        xattr_error,
    }))
}

/// Paths from this length on are reached through a descriptor ([`reach`]): below PATH_MAX
/// (4096, counting the NUL) with room to spare.
const LONG_PATH: usize = 3072;

/// A path that path-based calls accept whatever its length: a short one as it is; one longer
/// than PATH_MAX allows as `/proc/self/fd/N/NAME`, where N is a descriptor of its directory
/// reached one piece of the path at a time (`openat` from the previous piece), held open as
/// long as this value lives. So trees deeper than PATH_MAX are backed up.
#[derive(Debug)]
pub(crate) struct Reached<'a> {
    /// Borrowed for the common short path: the walk pays no copy for it.
    path: std::borrow::Cow<'a, Path>,
    _dir: Option<std::os::fd::OwnedFd>,
}

impl Reached<'_> {
    /// The path to use.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// See [`Reached`].
pub(crate) fn reach(path: &Path) -> std::io::Result<Reached<'_>> {
    use rustix::fs::{Mode, OFlags};
    use std::borrow::Cow;
    let as_is = Reached { path: Cow::Borrowed(path), _dir: None };
    if path.as_os_str().len() < LONG_PATH {
        return Ok(as_is);
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(as_is);
    };
    // The directory, in pieces of whole components each below LONG_PATH bytes.
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir: Option<std::os::fd::OwnedFd> = None;
    let mut piece = PathBuf::new();
    let open = |dir: &Option<std::os::fd::OwnedFd>, piece: &Path| match dir {
        None => rustix::fs::openat(rustix::fs::CWD, piece, flags, Mode::empty()),
        Some(d) => rustix::fs::openat(d, piece, flags, Mode::empty()),
    };
    for c in parent.components() {
        let c = c.as_os_str();
        if !piece.as_os_str().is_empty() && piece.as_os_str().len() + c.len() + 1 >= LONG_PATH {
            dir = Some(open(&dir, &piece)?);
            piece = PathBuf::new();
        }
        piece.push(c);
    }
    if !piece.as_os_str().is_empty() {
        dir = Some(open(&dir, &piece)?);
    }
    let Some(dir) = dir else {
        return Ok(as_is);
    };
    let mut short =
        PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)));
    short.push(name);
    Ok(Reached { path: Cow::Owned(short), _dir: Some(dir) })
}

/// The catalog's attributes of a file from its metadata (`lstat` or `fstat`): size for
/// regular files only, times in nanoseconds, mode and owner, a device's number; no extended
/// attributes (see [`crate::fsmeta::read_xattrs`]).
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
        rdev: if meta.file_type().is_char_device() || meta.file_type().is_block_device() {
            meta.rdev()
        } else {
            0
        },
        xattrs: Vec::new(),
        extents: None,
        // Set by the backup when it seals the data.
        sealed_by: None,
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

/// What the walk yields, in the catalog's path order.
#[derive(Debug)]
pub enum Event {
    /// An entry to back up (or compare with its active version).
    Entry(Entry),
    /// A socket: QSM cannot re-create it, so it is not backed up (and an active version at its
    /// path is gone); the caller notes and counts it.
    Skipped {
        /// Where it is.
        path: PathBuf,
        /// Below the root, catalog form.
        rel: Vec<u8>,
    },
    /// Could not be read: nothing at or below `rel` was examined, so the caller must not take
    /// it for deleted.
    Unreadable {
        /// Where it is.
        path: PathBuf,
        /// Below the root, catalog form.
        rel: Vec<u8>,
        /// Why.
        error: std::io::Error,
    },
}

/// Listings done ahead of the walk and not yet consumed, at most, except for those the walk
/// needs before one of them: the walk's memory is this many directories' entries, plus the
/// listings of the directories on the current path and of their subdirectories.
const LISTINGS_AHEAD: usize = 64;

/// Walks `root` in the catalog's order (bytewise by relative path, the root first), so that a
/// backup can merge it with the server's inventory in one pass and constant memory. Threads list
/// directories ahead of the walk (readdir and lstat of every entry, in parallel, as ripgrep's
/// walker does), always the next ones in path order first; `consume` takes the events in
/// order on the calling thread. Returns what `consume` returns, or an error if the root
/// itself cannot be read.
pub fn walk_sorted<R>(
    root: &Path,
    options: &WalkOptions<'_>,
    consume: impl FnOnce(&mut dyn Iterator<Item = Event>) -> R,
) -> crate::Result<R> {
    walk_sorted_at(root, Vec::new(), options, consume)
}

/// [`walk_sorted`] of a directory `rel` below the root of a backup (at `root`): entries are
/// named, and patterns matched, relative to the backup's root.
pub fn walk_sorted_at<R>(
    root: &Path,
    rel: Vec<u8>,
    options: &WalkOptions<'_>,
    consume: impl FnOnce(&mut dyn Iterator<Item = Event>) -> R,
) -> crate::Result<R> {
    let top = match entry(root, rel) {
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
    let mut first = vec![Item::Entry(top.clone())];
    if is_dir {
        first.push(Item::Subtree(Dir { path: top.path, rel: top.rel, included }));
    }
    let shared = Shared { state: Mutex::new(Ahead::default()), changed: Condvar::new() };
    let lister = Lister { dev: top.dev, options };
    Ok(std::thread::scope(|s| {
        for _ in 0..options.threads.max(1) {
            s.spawn(|| shared.work(&lister));
        }
        let mut walk = SortedWalk { shared: &shared, lister: &lister, stack: Vec::new() };
        walk.enter(first);
        let result = consume(&mut walk);
        shared.lock().done = true;
        shared.changed.notify_all();
        result
    }))
}

/// A directory to list.
#[derive(Debug, Clone)]
struct Dir {
    path: PathBuf,
    rel: Vec<u8>,
    /// It matched an include pattern (or one of its parents did).
    included: bool,
}

impl Dir {
    /// Where its contents sort: `rel/` (the root's: empty).
    fn key(&self) -> Vec<u8> {
        let mut key = self.rel.clone();
        if !key.is_empty() {
            key.push(b'/');
        }
        key
    }
}

/// One directory's contents, in walk order.
#[derive(Debug)]
enum Item {
    Entry(Entry),
    /// A subdirectory's contents, placed where `name/` sorts among its siblings: after
    /// `name.txt`, as the catalog orders `name/x` after `name.txt`.
    Subtree(Dir),
    Unreadable(PathBuf, Vec<u8>, std::io::Error),
    /// A socket, not backed up.
    Skipped(PathBuf, Vec<u8>),
}

/// Listings ahead of the walk.
#[derive(Default)]
struct Ahead {
    /// Directories to list, by key: the smallest is the walk's next.
    queue: BTreeMap<Vec<u8>, Dir>,
    listing: HashSet<Vec<u8>>,
    ready: BTreeMap<Vec<u8>, Vec<Item>>,
    done: bool,
}

struct Shared {
    state: Mutex<Ahead>,
    /// Signalled when a listing is ready or taken, a directory queued, or the walk done.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ahead> {
        // Nothing in the state is left half-changed by a panic; the scope reports the panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn work(&self, lister: &Lister<'_>) {
        loop {
            let (key, dir) = {
                let mut ahead = self.lock();
                loop {
                    if ahead.done {
                        return;
                    }
                    // Past the limit, only what the walk needs before a listing already made:
                    // the subdirectories of where it is now come before siblings listed ahead.
                    let room = ahead.ready.len() + ahead.listing.len() < LISTINGS_AHEAD;
                    let sooner = |key: &Vec<u8>| {
                        ahead.ready.last_key_value().is_some_and(|(last, _)| key < last)
                    };
                    if ahead.queue.first_key_value().is_some_and(|(key, _)| room || sooner(key))
                        && let Some((key, dir)) = ahead.queue.pop_first()
                    {
                        ahead.listing.insert(key.clone());
                        break (key, dir);
                    }
                    ahead = self.changed.wait(ahead).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let items = lister.list(&dir);
            let mut ahead = self.lock();
            ahead.listing.remove(&key);
            ahead.ready.insert(key, items);
            drop(ahead);
            self.changed.notify_all();
        }
    }
}

/// The consuming side: a stack of listings, the deepest last.
struct SortedWalk<'a> {
    shared: &'a Shared,
    lister: &'a Lister<'a>,
    stack: Vec<std::vec::IntoIter<Item>>,
}

impl SortedWalk<'_> {
    /// Pushes a listing and queues its subdirectories for listing ahead.
    fn enter(&mut self, items: Vec<Item>) {
        let mut ahead = self.shared.lock();
        let mut queued = false;
        for item in &items {
            if let Item::Subtree(dir) = item {
                ahead.queue.insert(dir.key(), dir.clone());
                queued = true;
            }
        }
        drop(ahead);
        if queued {
            self.shared.changed.notify_all();
        }
        self.stack.push(items.into_iter());
    }

    /// The listing of `dir`: taken when ready, awaited while being made, made here when no
    /// thread has started it (so the walk never waits behind listings further ahead).
    fn listing(&self, dir: &Dir) -> Vec<Item> {
        let key = dir.key();
        let mut ahead = self.shared.lock();
        loop {
            if let Some(items) = ahead.ready.remove(&key) {
                drop(ahead);
                self.shared.changed.notify_all();
                return items;
            }
            if !ahead.listing.contains(&key) {
                ahead.queue.remove(&key);
                drop(ahead);
                return self.lister.list(dir);
            }
            ahead = self.shared.changed.wait(ahead).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Iterator for SortedWalk<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            let item = match self.stack.last_mut()?.next() {
                Some(item) => item,
                None => {
                    self.stack.pop();
                    continue;
                }
            };
            match item {
                Item::Entry(e) => return Some(Event::Entry(e)),
                Item::Unreadable(path, rel, error) => {
                    return Some(Event::Unreadable { path, rel, error });
                }
                Item::Skipped(path, rel) => return Some(Event::Skipped { path, rel }),
                Item::Subtree(dir) => {
                    let items = self.listing(&dir);
                    self.enter(items);
                }
            }
        }
    }
}

/// Lists directories: what the walk's threads run.
struct Lister<'a> {
    dev: u64,
    options: &'a WalkOptions<'a>,
}

impl Lister<'_> {
    /// The items of `dir` in walk order: entries (metadata read, patterns applied), subtrees to
    /// enter, and what could not be read. A directory that cannot be listed is one
    /// `Unreadable`; one gone since it was seen is empty.
    fn list(&self, dir: &Dir) -> Vec<Item> {
        let mut keyed: Vec<(Vec<u8>, Item)> = Vec::new();
        let reached = match reach(&dir.path) {
            Ok(r) => r,
            Err(err) => return vec![Item::Unreadable(dir.path.clone(), dir.rel.clone(), err)],
        };
        let rd = match fs::read_dir(reached.path()) {
            Ok(rd) => rd,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(err) => return vec![Item::Unreadable(dir.path.clone(), dir.rel.clone(), err)],
        };
        for e in rd {
            let name = match e {
                Ok(e) => e.file_name(),
                // Listing broke off: what was read is used, and the directory as a whole is
                // kept (its key sorts before every entry in it).
                Err(err) => {
                    keyed.push((
                        Vec::new(),
                        Item::Unreadable(dir.path.clone(), dir.rel.clone(), err),
                    ));
                    break;
                }
            };
            let path = dir.path.join(&name);
            let rel = join_rel(&dir.rel, OsStr::new(&name));
            let e = match entry(&path, rel) {
                Ok(Some(e)) => e,
                Ok(None) => {
                    let rel = join_rel(&dir.rel, OsStr::new(&name));
                    if self.options.filter.verdict(&rel, &path, false, dir.included)
                        == Verdict::Included
                    {
                        keyed.push((name.as_bytes().to_vec(), Item::Skipped(path, rel)));
                    }
                    continue;
                }
                // Vanished between listing and lstat: truly gone, nothing to keep.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    let rel = join_rel(&dir.rel, OsStr::new(&name));
                    keyed.push((name.as_bytes().to_vec(), Item::Unreadable(path, rel, err)));
                    continue;
                }
            };
            let is_dir = e.object_type == ObjectType::Directory;
            let verdict = self.options.filter.verdict(&e.rel, &e.path, is_dir, dir.included);
            if verdict == Verdict::Excluded || (verdict == Verdict::Unmatched && !is_dir) {
                continue;
            }
            if is_dir && (!self.options.one_file_system || e.dev == self.dev) {
                let mut key = name.as_bytes().to_vec();
                key.push(b'/');
                let sub = Dir {
                    path: e.path.clone(),
                    rel: e.rel.clone(),
                    included: verdict == Verdict::Included,
                };
                keyed.push((key, Item::Subtree(sub)));
            }
            keyed.push((name.as_bytes().to_vec(), Item::Entry(e)));
        }
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        keyed.into_iter().map(|(_, item)| item).collect()
    }
}

/// Whether the catalog path `path` is `top` or below it, component-wise (`a/b` is below `a`,
/// `a/bc` is not; everything is below the root, `[]`).
pub fn within(path: &[u8], top: &[u8]) -> bool {
    top.is_empty() || path == top || (path.starts_with(top) && path.get(top.len()) == Some(&b'/'))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_walk_comes_in_catalog_order_on_any_number_of_threads() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Names around '/' (0x2F): '-' and '.' sort before it, '0' and 'b' after.
        for d in ["a", "a/b", "a/b/c", "a-b", "a0", "b", "b/a.d", "b/a.d/x"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["a.txt", "a/b.txt", "a/b/c/z", "a-b/f", "a0/g", "b/a", "b/a.d/x/y", "b/a.e"] {
            fs::write(root.join(f), f).unwrap();
        }
        std::os::unix::fs::symlink("a", root.join("a.link")).unwrap();
        // A FIFO is an entry; a socket is reported as skipped, in its place in the order.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("b/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(root.join("a/sock")).unwrap();
        for threads in [1, 2, 4] {
            let filter = Filter::default();
            let options = WalkOptions { one_file_system: false, filter: &filter, threads };
            let rels: Vec<Vec<u8>> = walk_sorted(root, &options, |events| {
                events
                    .map(|e| match e {
                        Event::Entry(e) => e.rel,
                        Event::Skipped { rel, .. } => [&rel[..], b" (skipped)"].concat(),
                        Event::Unreadable { path, error, .. } => panic!("{path:?}: {error}"),
                    })
                    .collect()
            })
            .unwrap();
            assert!(rels.contains(&b"a/sock (skipped)".to_vec()), "socket noted: {rels:?}");
            let mut sorted = rels.clone();
            sorted.sort();
            assert_eq!(rels, sorted, "{threads} threads");
            assert!(rels.contains(&b"b/fifo".to_vec()));
            assert_eq!(rels.len(), 20, "every entry once: {rels:?}");
            assert_eq!(rels[0], b"");
        }
    }

    #[test]
    fn a_missing_root_is_an_error_naming_it() {
        let filter = Filter::default();
        let options = WalkOptions { one_file_system: false, filter: &filter, threads: 2 };
        let e = walk_sorted(Path::new("/nonexistent/qsm"), &options, |_| ()).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/qsm"), "{e}");
    }
}
