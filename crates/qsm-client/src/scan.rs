//! The directory walk. Depth-first, entries of a directory in bytewise name order, symlinks
//! not followed, parents before children. (Not quite the catalog's bytewise path order:
//! `a/b` comes before `a.txt` here and after it there, so backup looks the inventory up by
//! path rather than merging the two streams.) Unreadable entries are reported to the caller
//! and skipped; they never stop the walk.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use qsm_catalog::{Attributes, ObjectType};

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
    /// Device, for one-file-system and to recognise the file when it is opened.
    pub dev: u64,
    /// Inode number, to recognise the file when it is opened.
    pub ino: u64,
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
        ino: meta.ino(),
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
    }
}

/// Walks `root`: calls `visit` for every entry (the root first) and `warn` for every entry
/// or directory that cannot be read, with its relative path: nothing at or below that path
/// was examined, so the caller must not take it for deleted. With `one_file_system`, directories on other devices are listed but
/// not entered.
pub fn walk(
    root: &Path,
    one_file_system: bool,
    visit: &mut dyn FnMut(&Entry) -> crate::Result<()>,
    warn: &mut dyn FnMut(&Path, &[u8], &std::io::Error),
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
    let dev = top.dev;
    visit(&top)?;
    if top.object_type == ObjectType::Directory {
        walk_dir(&top, dev, one_file_system, visit, warn)?;
    }
    Ok(())
}

fn walk_dir(
    dir: &Entry,
    dev: u64,
    one_file_system: bool,
    visit: &mut dyn FnMut(&Entry) -> crate::Result<()>,
    warn: &mut dyn FnMut(&Path, &[u8], &std::io::Error),
) -> crate::Result<()> {
    let mut names: Vec<std::ffi::OsString> = match fs::read_dir(&dir.path) {
        Ok(rd) => rd
            .filter_map(|e| match e {
                Ok(e) => Some(e.file_name()),
                Err(err) => {
                    warn(&dir.path, &dir.rel, &err);
                    None
                }
            })
            .collect(),
        Err(err) => {
            warn(&dir.path, &dir.rel, &err);
            return Ok(());
        }
    };
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let path = dir.path.join(&name);
        let rel = join_rel(&dir.rel, OsStr::new(&name));
        match entry(&path, rel) {
            Ok(Some(e)) => {
                visit(&e)?;
                if e.object_type == ObjectType::Directory && (!one_file_system || e.dev == dev) {
                    walk_dir(&e, dev, one_file_system, visit, warn)?;
                }
            }
            Ok(None) => {}
            // Vanished between listing and lstat: truly gone, nothing to keep.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => warn(&path, &join_rel(&dir.rel, OsStr::new(&name)), &err),
        }
    }
    Ok(())
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
