//! File-system metadata beyond data: reading extended attributes at backup, and putting every
//! piece of an entry's metadata back at restore, in the one order that keeps each piece
//! (see [`apply`]). Everything is reached through a descriptor or a (directory descriptor,
//! name) pair, never by a path resolved again, and never through a symlink.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use qsm_types::model::{Attributes, ObjectType, Xattr};
use rustix::fs::{AtFlags, FileType, Gid, Mode, Timespec, Timestamps, Uid, XattrFlags};
use rustix::io::Errno;

/// The ACL xattrs: setting one rewrites the group bits of the mode from its mask.
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Reads every extended attribute of `path` (not following a symlink) the process may read,
/// sorted by name. A file system without xattr support has none. Errors name the attribute.
pub fn read_xattrs(path: &Path) -> Result<Vec<Xattr>, String> {
    // The walk asks this of every entry: the common case (no attributes) is one system call
    // and no allocation.
    let mut first = [0u8; 256];
    let names = match rustix::fs::llistxattr(path, &mut first[..]) {
        Ok(0) | Err(Errno::NOTSUP) => return Ok(Vec::new()),
        Ok(n) => first[..n].to_vec(),
        // More names than fit: ask their length, and again if they grew meanwhile.
        Err(Errno::RANGE) => loop {
            let list = |e| format!("listing extended attributes: {e}");
            let mut names = vec![0u8; rustix::fs::llistxattr_query(path).map_err(list)?];
            match rustix::fs::llistxattr(path, &mut names[..]) {
                Ok(n) => {
                    names.truncate(n);
                    break names;
                }
                Err(Errno::RANGE) => continue,
                Err(e) => return Err(list(e)),
            }
        },
        Err(e) => return Err(format!("listing extended attributes: {e}")),
    };
    let mut out = Vec::new();
    let mut value = vec![0u8; 4096];
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let os = OsStr::from_bytes(name);
        let len = loop {
            match rustix::fs::lgetxattr(path, os, &mut value[..]) {
                Ok(len) => break Some(len),
                // Removed since it was listed: it is not there to keep.
                Err(Errno::NODATA) => break None,
                Err(Errno::RANGE) => {
                    let need = rustix::fs::lgetxattr_query(path, os).map_err(|e| {
                        format!("reading extended attribute {}: {e}", name.escape_ascii())
                    })?;
                    value.resize(need.max(value.len() * 2), 0);
                }
                Err(e) => {
                    return Err(format!("reading extended attribute {}: {e}", name.escape_ascii()));
                }
            }
        };
        if let Some(len) = len {
            out.push((name.to_vec(), value[..len].to_vec()));
        }
    }
    out.sort();
    Ok(out)
}

/// The data extents of an open regular file of `size` bytes, found with `SEEK_DATA` /
/// `SEEK_HOLE`, or `None` when it has no hole (or the file system cannot say). Only worth
/// asking when the file occupies fewer blocks than its size (`st_blocks * 512 < st_size`):
/// callers check that first, so ordinary files pay nothing.
pub fn data_extents(file: &std::fs::File, size: u64) -> std::io::Result<Option<Vec<(u64, u64)>>> {
    use rustix::fs::SeekFrom;
    let mut extents = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data past `pos`: the rest is hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if data >= size {
            break;
        }
        let hole = match rustix::fs::seek(file, SeekFrom::Hole(data)) {
            Ok(h) => h.min(size),
            Err(Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        if hole <= data {
            break;
        }
        extents.push((data, hole - data));
        if extents.len() > qsm_types::model::MAX_EXTENTS {
            // Too fragmented to list: read whole, its holes as zeros.
            rustix::fs::seek(file, SeekFrom::Start(0))?;
            return Ok(None);
        }
        pos = hole;
    }
    rustix::fs::seek(file, SeekFrom::Start(0))?;
    Ok(match extents.as_slice() {
        [(0, len)] if *len == size => None,
        _ if size == 0 => None,
        _ => Some(extents),
    })
}

/// Writes `data`, which starts at `stream_offset` of an object's data, into `file`: at that
/// offset for an ordinary file; through the data extents of a sparse file (the stream is its
/// extents' bytes one after the other), leaving holes unwritten.
pub(crate) fn write_data(
    file: &std::fs::File,
    data: &[u8],
    stream_offset: u64,
    extents: Option<&[(u64, u64)]>,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    map_data(data, stream_offset, extents, &mut |bytes, at| file.write_all_at(bytes, at))
}

/// Calls `write` with each part of `data` (at `stream_offset` of a file's data stream) and
/// the file offset it belongs at: the same, or, for a sparse file, within its `extents`
/// (file offset, length), which the data stream runs through one after the other.
pub(crate) fn map_data(
    data: &[u8],
    stream_offset: u64,
    extents: Option<&[(u64, u64)]>,
    write: &mut dyn FnMut(&[u8], u64) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let Some(extents) = extents else {
        return write(data, stream_offset);
    };
    let (mut data, mut at) = (data, stream_offset);
    let mut start = 0u64; // where the current extent starts in the stream
    for &(offset, len) in extents {
        if data.is_empty() {
            break;
        }
        let end = start + len;
        if at < end {
            let skip = at - start;
            let n = (len - skip).min(data.len() as u64) as usize;
            write(&data[..n], offset + skip)?;
            data = &data[n..];
            at += n as u64;
        }
        start = end;
    }
    if data.is_empty() {
        Ok(())
    } else {
        // The completeness check stops frames past the data's length before this.
        Err(std::io::Error::other("data past the file's last extent"))
    }
}

/// What [`apply`] works on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum At<'a> {
    /// An open regular file or directory.
    Fd(BorrowedFd<'a>),
    /// A symlink, FIFO or device: (its directory, its name). Never opened (opening a FIFO
    /// blocks, opening a device may act on the hardware) and never followed.
    Name(BorrowedFd<'a>, &'a OsStr),
}

/// What a whole restore shares across the entries it applies metadata to.
#[derive(Debug, Default)]
pub(crate) struct Context {
    /// Running as root: owners are set, setuid and setgid bits kept.
    pub root: bool,
    /// Entries whose setuid or setgid bits were dropped (not root), said once at the end.
    pub setid_dropped: AtomicU64,
    /// Entries restored without some of their metadata.
    pub incomplete: AtomicU64,
    /// What could not be put back, one line per entry, naming it.
    notes: Mutex<Vec<String>>,
}

impl Context {
    /// A context for a restore run as root or not.
    pub(crate) fn new(root: bool) -> Context {
        Context { root, ..Context::default() }
    }

    /// Records what [`apply`] could not put back on the entry `what` (nothing if empty).
    pub(crate) fn note(&self, what: &str, problems: Vec<String>) {
        if problems.is_empty() {
            return;
        }
        self.incomplete.fetch_add(1, Ordering::Relaxed);
        let line = format!("{what}: restored without some metadata: {}", problems.join("; "));
        self.notes.lock().unwrap_or_else(PoisonError::into_inner).push(line);
    }

    /// The lines recorded by [`Context::note`], in order.
    pub(crate) fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The one warning about dropped setuid/setgid bits, if any were.
    pub(crate) fn setid_note(&self) -> Option<String> {
        match self.setid_dropped.load(Ordering::Relaxed) {
            0 => None,
            n => Some(format!(
                "setuid/setgid bits of {n} entries not restored: only a restore as root puts \
                 them back (like tar without -p)"
            )),
        }
    }
}

fn timespec(ns: i64) -> Timespec {
    Timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) as _ }
}

/// Puts `a` back on an entry whose data (if any) is in place, and returns what could not be
/// put back, one message each (the caller names the entry and counts it). The order matters:
/// 1. owner (root only): `chown` clears setuid/setgid bits and `security.capability`, so it
///    comes before both;
/// 2. extended attributes, ACLs included (writing the ACL xattr rewrites the mode's group
///    bits from the ACL's mask);
/// 3. mode, after the ACLs: `chmod` sets the mask from the group bits, which for a file with
///    an ACL were the mask at backup, so mode and mask both come back exactly. Not root:
///    setuid/setgid bits are dropped (counted in `ctx`);
/// 4. times last: every step above changes the ctime, and a symlink's through
///    `AT_SYMLINK_NOFOLLOW`.
pub(crate) fn apply(
    at: At<'_>,
    object_type: ObjectType,
    a: &Attributes,
    ctx: &Context,
) -> Vec<String> {
    let mut problems = Vec::new();
    let symlink = object_type == ObjectType::Symlink;
    if ctx.root {
        let (uid, gid) = (Some(Uid::from_raw(a.uid)), Some(Gid::from_raw(a.gid)));
        let r = match at {
            At::Fd(fd) => rustix::fs::fchown(fd, uid, gid),
            At::Name(dir, name) => {
                rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
            }
        };
        if let Err(e) = r {
            problems.push(format!("owner {}:{} not set: {e}", a.uid, a.gid));
        }
    }
    // An ACL the new entry inherited from a default ACL of the directory it was made in is
    // not the backed-up file's: it would widen access. Removed unless one is restored.
    if let At::Fd(fd) = at {
        for acl in [ACL_ACCESS, ACL_DEFAULT] {
            if acl == ACL_DEFAULT && object_type != ObjectType::Directory {
                continue;
            }
            if !a.xattrs.iter().any(|(n, _)| n == acl) {
                match rustix::fs::fremovexattr(fd, OsStr::from_bytes(acl)) {
                    Ok(()) | Err(Errno::NODATA) | Err(Errno::NOTSUP) => {}
                    Err(e) => problems
                        .push(format!("inherited ACL {} not removed: {e}", acl.escape_ascii())),
                }
            }
        }
    }
    for (name, value) in &a.xattrs {
        let os = OsStr::from_bytes(name);
        let r = match at {
            At::Fd(fd) => rustix::fs::fsetxattr(fd, os, value, XattrFlags::empty()),
            // No fsetxattr without opening the entry: the name below the directory's
            // descriptor through /proc, whose last component lsetxattr does not follow.
            At::Name(dir, entry) => {
                let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
                path.extend_from_slice(entry.as_bytes());
                rustix::fs::lsetxattr(OsStr::from_bytes(&path), os, value, XattrFlags::empty())
            }
        };
        if let Err(e) = r {
            let hint = match e {
                Errno::PERM if !ctx.root => " (only root may set this namespace)",
                Errno::NOTSUP => " (the file system does not support it)",
                _ => "",
            };
            problems.push(format!("extended attribute {} not set: {e}{hint}", name.escape_ascii()));
        }
    }
    // A symlink's mode cannot be set on Linux (and means nothing).
    if !symlink {
        let mut mode = a.mode & 0o7777;
        if !ctx.root && mode & 0o6000 != 0 {
            mode &= !0o6000;
            ctx.setid_dropped.fetch_add(1, Ordering::Relaxed);
        }
        let r = match at {
            At::Fd(fd) => rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)),
            At::Name(dir, name) => {
                rustix::fs::chmodat(dir, name, Mode::from_raw_mode(mode), AtFlags::empty())
            }
        };
        if let Err(e) = r {
            problems.push(format!("mode {mode:o} not set: {e}"));
        }
    }
    // The access time is not recorded: left as the restore made it.
    let times = Timestamps {
        last_access: Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
        last_modification: timespec(a.mtime_ns),
    };
    let r = match at {
        At::Fd(fd) => rustix::fs::futimens(fd, &times),
        At::Name(dir, name) => rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW),
    };
    if let Err(e) = r {
        problems.push(format!("modification time not set: {e}"));
    }
    problems
}

/// Makes a FIFO or device node `name` in `dir` (owner-only until [`apply`] sets its mode).
/// Devices need root (`CAP_MKNOD`); the error says so.
pub(crate) fn make_node(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    object_type: ObjectType,
    rdev: u64,
) -> Result<(), String> {
    let (kind, what) = match object_type {
        ObjectType::Fifo => (FileType::Fifo, "FIFO"),
        ObjectType::CharDevice => (FileType::CharacterDevice, "character device"),
        ObjectType::BlockDevice => (FileType::BlockDevice, "block device"),
        other => return Err(format!("{other:?} is not a special file")),
    };
    rustix::fs::mknodat(dir, name, kind, Mode::from_raw_mode(0o600), rdev).map_err(|e| {
        let hint = if e == Errno::PERM { " (creating devices needs root)" } else { "" };
        format!("cannot create {what}: {e}{hint}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn xattrs_are_read_sorted_and_applied_through_a_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let big = vec![7u8; 5000]; // past the first read's buffer
        for (n, v) in [(&b"user.b"[..], &b"2"[..]), (b"user.a", b""), (b"user.big", &big)] {
            if let Err(e) =
                rustix::fs::setxattr(&path, OsStr::from_bytes(n), v, XattrFlags::empty())
            {
                eprintln!("skipped: no user xattrs on this file system ({e})");
                return;
            }
        }
        let got = read_xattrs(&path).unwrap();
        let names: Vec<&[u8]> = got.iter().map(|(n, _)| n.as_slice()).collect();
        assert_eq!(names, [&b"user.a"[..], b"user.b", b"user.big"]);
        assert_eq!(got[2].1, big);
        // More names than the first read's buffer holds.
        let many = dir.path().join("many");
        std::fs::write(&many, b"").unwrap();
        for i in 0..40 {
            let name = format!("user.attribute-{i:02}");
            rustix::fs::setxattr(&many, name.as_str(), b"v", XattrFlags::empty()).unwrap();
        }
        let got_many = read_xattrs(&many).unwrap();
        assert_eq!(got_many.len(), 40);
        assert_eq!(got_many[39].0, b"user.attribute-39");

        let to = dir.path().join("g");
        let file = std::fs::File::create(&to).unwrap();
        let a = Attributes {
            mode: 0o100640,
            mtime_ns: 1_234_567_891_123_456_789,
            xattrs: got.clone(),
            ..Attributes::default()
        };
        let ctx = Context::new(false);
        let problems = apply(At::Fd(file.as_fd()), ObjectType::File, &a, &ctx);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(read_xattrs(&to).unwrap(), got);
        let m = std::fs::metadata(&to).unwrap();
        assert_eq!(
            (m.mode() & 0o7777, m.mtime(), m.mtime_nsec()),
            (0o640, 1_234_567_891, 123_456_789)
        );
    }

    #[test]
    fn a_sparse_file_is_read_as_extents_and_written_back_with_its_holes() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let f = std::fs::File::create(&path).unwrap();
        let size = 64u64 << 20;
        f.set_len(size).unwrap();
        f.write_all_at(&[1u8; 5000], 1 << 20).unwrap();
        f.write_all_at(&[2u8; 10], size - 10).unwrap();
        f.sync_all().unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let Some(extents) = data_extents(&f, size).unwrap() else {
            eprintln!("skipped: this file system does not report holes");
            return;
        };
        // Block-granular: each extent holds its data, and the whole is far below the size.
        assert_eq!(extents.len(), 2, "{extents:?}");
        let total: u64 = extents.iter().map(|e| e.1).sum();
        assert!(total < 1 << 20, "{extents:?}");
        assert!(extents[0].0 <= 1 << 20 && extents[0].0 + extents[0].1 >= (1 << 20) + 5000);
        // The stream of extents, written back through them in two uneven pieces.
        let mut stream = Vec::new();
        for &(offset, len) in &extents {
            let mut b = vec![0u8; len as usize];
            f.read_exact_at(&mut b, offset).unwrap();
            stream.extend_from_slice(&b);
        }
        let out = std::fs::File::create(dir.path().join("out")).unwrap();
        let cut = 4097;
        write_data(&out, &stream[..cut], 0, Some(&extents)).unwrap();
        write_data(&out, &stream[cut..], cut as u64, Some(&extents)).unwrap();
        out.set_len(size).unwrap();
        assert!(write_data(&out, &[0], total, Some(&extents)).is_err(), "past the extents");
        let back = std::fs::read(dir.path().join("out")).unwrap();
        assert_eq!(back, std::fs::read(&path).unwrap());
        use std::os::unix::fs::MetadataExt;
        assert!(out.metadata().unwrap().blocks() * 512 < 1 << 20, "holes stay holes");
        // A file without holes is not sparse.
        std::fs::write(dir.path().join("dense"), [3u8; 10_000]).unwrap();
        let dense = std::fs::File::open(dir.path().join("dense")).unwrap();
        assert_eq!(data_extents(&dense, 10_000).unwrap(), None);
    }

    #[test]
    fn not_root_drops_setid_bits_once_and_sets_a_symlinks_time() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        std::os::unix::fs::symlink("nowhere", dir.path().join("l")).unwrap();
        let ctx = Context::default();
        let a = Attributes { mtime_ns: -1_500_000_000, mode: 0o120777, ..Attributes::default() };
        let problems = apply(At::Name(d.as_fd(), OsStr::new("l")), ObjectType::Symlink, &a, &ctx);
        assert!(problems.is_empty(), "{problems:?}");
        let m = std::fs::symlink_metadata(dir.path().join("l")).unwrap();
        assert_eq!((m.mtime(), m.mtime_nsec()), (-2, 500_000_000));

        std::fs::write(dir.path().join("s"), b"").unwrap();
        let f = std::fs::File::open(dir.path().join("s")).unwrap();
        let a = Attributes { mode: 0o106755, ..Attributes::default() };
        assert!(apply(At::Fd(f.as_fd()), ObjectType::File, &a, &ctx).is_empty());
        assert_eq!(std::fs::metadata(dir.path().join("s")).unwrap().mode() & 0o7777, 0o755);
        assert_eq!(ctx.setid_dropped.load(Ordering::Relaxed), 1);
        assert!(ctx.setid_note().unwrap().contains("1 entries"));
    }
}
