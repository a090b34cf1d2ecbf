//! The directories of a restore target, each opened once (issue 24).
//!
//! Every directory is reached from its parent's descriptor, one component at a time, with
//! `O_NOFOLLOW | O_DIRECTORY`: a symlink or a file anywhere on the way is refused, whenever it
//! was planted, and nothing is resolved by path. Walking the chain again from the target for
//! every file cost a restore of the Linux tree about a million `openat` and as many `close`;
//! [`Dirs`] keeps the descriptors it opened, by relative path, so each directory is opened
//! once while its files are restored (entries arrive in path order). A descriptor names the
//! directory it was opened on even if a path is swapped afterwards, so keeping it is as safe
//! as opening it again.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Descriptors kept at most: the chain of the directory being restored and its recent
/// siblings, far below the usual limit of 1,024 open files.
const KEEP: usize = 256;

/// Opens `name` in `parent` as a directory, never through a symlink; with `create`, a missing
/// one is made owner-only (the final pass of a restore sets its real mode). `shown` is its
/// path, for messages.
fn open_child(
    parent: &OwnedFd,
    name: &OsStr,
    create: bool,
    shown: &Path,
) -> std::result::Result<OwnedFd, String> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(e) if e == Errno::NOENT && create => {
            // Another thread may create it first: EEXIST is as good as our own mkdir.
            match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => {}
                Err(e) if e == Errno::EXIST => {}
                Err(e) => return Err(format!("cannot create {}: {e}", shown.display())),
            }
            rustix::fs::openat(parent, name, flags, Mode::empty()).map_err(|e| refusal(e, shown))
        }
        Err(e) => Err(refusal(e, shown)),
    }
}

fn refusal(e: Errno, shown: &Path) -> String {
    if e == Errno::LOOP || e == Errno::NOTDIR {
        format!(
            "{} is a symlink or not a directory: refusing to restore through it",
            shown.display()
        )
    } else {
        format!("{}: {e}", shown.display())
    }
}

/// The directories below one target, opened on demand and kept (see the module comment).
#[derive(Debug)]
pub(crate) struct Dirs {
    target: Arc<OwnedFd>,
    shown: PathBuf,
    /// By relative path, components joined with `/`.
    open: Mutex<HashMap<Vec<u8>, Arc<OwnedFd>>>,
}

impl Dirs {
    /// The directories below `target` (an open directory), shown as `shown` in messages.
    pub(crate) fn new(target: Arc<OwnedFd>, shown: &Path) -> Dirs {
        Dirs { target, shown: shown.to_path_buf(), open: Mutex::new(HashMap::new()) }
    }

    /// The target's path, for messages.
    pub(crate) fn shown(&self) -> &Path {
        &self.shown
    }

    /// The directory `components` below the target (checked by the caller with
    /// `restore::safe_components`); with `create`, missing ones are made.
    pub(crate) fn get(
        &self,
        components: &[&OsStr],
        create: bool,
    ) -> std::result::Result<Arc<OwnedFd>, String> {
        let key = |n: usize| -> Vec<u8> {
            let mut k = Vec::new();
            for (i, c) in components[..n].iter().enumerate() {
                if i > 0 {
                    k.push(b'/');
                }
                k.extend_from_slice(c.as_bytes());
            }
            k
        };
        // The deepest directory on the way that is open already.
        let (mut depth, mut fd) = (0, Arc::clone(&self.target));
        {
            let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            for n in (1..=components.len()).rev() {
                if let Some(found) = open.get(&key(n)) {
                    (depth, fd) = (n, Arc::clone(found));
                    break;
                }
            }
        }
        let mut shown = components[..depth].iter().fold(self.shown.clone(), |p, c| p.join(c));
        while depth < components.len() {
            let name = components[depth];
            shown.push(name);
            let next = Arc::new(open_child(&fd, name, create, &shown)?);
            depth += 1;
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            if open.len() >= KEEP {
                // Entries come in path order: what was kept is mostly behind us.
                open.clear();
            }
            open.insert(key(depth), Arc::clone(&next));
            fd = next;
        }
        Ok(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_opened_once_created_on_demand_and_never_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("a/link")).unwrap();
        std::fs::write(dir.path().join("a/file"), b"x").unwrap();
        let target = rustix::fs::open(dir.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        let dirs = Dirs::new(Arc::new(target), dir.path());
        let c = |s: &'static str| -> Vec<&'static OsStr> { s.split('/').map(OsStr::new).collect() };
        let b = dirs.get(&c("a/b"), false).unwrap();
        assert!(Arc::ptr_eq(&b, &dirs.get(&c("a/b"), false).unwrap()), "opened again");
        assert!(dirs.get(&c("a/new/deeper"), false).is_err(), "created without create");
        dirs.get(&c("a/new/deeper"), true).unwrap();
        assert!(dir.path().join("a/new/deeper").is_dir());
        let e = dirs.get(&c("a/link/tmp"), true).unwrap_err();
        assert!(e.contains("symlink or not a directory"), "{e}");
        assert!(dirs.get(&c("a/file"), true).unwrap_err().contains("not a directory"));
        assert!(dirs.get(&[], false).is_ok(), "the target itself");
        // More directories than are kept: the oldest are dropped, all still open correctly.
        for i in 0..(KEEP + 10) {
            dirs.get(&[OsStr::new("many"), OsStr::new(&i.to_string())], true).unwrap();
        }
        assert!(dirs.open.lock().unwrap().len() <= KEEP);
    }
}
