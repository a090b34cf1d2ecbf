//! The FUSE adapter: each request checks the power is on, then is passed through to the
//! backing directory by [`State`], which records what a power cut would undo.

use std::ffi::OsStr;
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::model::{ROOT_INO, STASH, State};

/// How long the kernel may cache names and attributes. Every change goes through this
/// file system, so the kernel's caches stay coherent; one second saves a lookup per path
/// component on every open without letting a stale entry live long.
const TTL: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in one request must not wedge the mount: the state stays consistent
        // because every mutation records its undo before it touches the backing dir.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
pub(crate) struct Fs(pub(crate) Arc<Shared>);

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = Duration::from_nanos(u64::try_from(nsecs).unwrap_or(0));
    match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s) + nanos,
        Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos,
    }
}

fn kind(md: &fs::FileType) -> FileType {
    FileType::from_std(*md).unwrap_or(FileType::RegularFile)
}

fn attr(ino: u64, md: &Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: time(md.atime(), md.atime_nsec()),
        mtime: time(md.mtime(), md.mtime_nsec()),
        ctime: time(md.ctime(), md.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(&md.file_type()),
        perm: (md.mode() & 0o7777) as u16,
        nlink: md.nlink() as u32,
        uid: md.uid(),
        gid: md.gid(),
        rdev: md.rdev() as u32,
        blksize: md.blksize() as u32,
        flags: 0,
    }
}

fn timespec(t: Option<TimeOrNow>) -> nix::sys::time::TimeSpec {
    use nix::sys::time::TimeSpec;
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSpec::from_duration(d),
            Err(_) => TimeSpec::new(0, 0),
        },
    }
}

fn nix_err(e: nix::errno::Errno) -> Errno {
    Errno::from_i32(e as i32)
}

fn open_backing(path: &Path, flags: i32) -> io::Result<File> {
    // Always read-write when possible: saving the original of a page needs to read it,
    // and the kernel already enforces the caller's access mode.
    let custom = flags & libc::O_NOFOLLOW;
    match OpenOptions::new().read(true).write(true).custom_flags(custom).open(path) {
        Ok(f) => Ok(f),
        Err(_) => OpenOptions::new().read(true).custom_flags(custom).open(path),
    }
}

impl Fs {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock()
    }

    fn fopen_flags(st: &State) -> FopenFlags {
        // Direct I/O sends every read to us (so a cut or an injected fault is seen by the
        // caller) while still allowing SQLite's shared mmap of its -shm file.
        if st.direct_io { FopenFlags::FOPEN_DIRECT_IO } else { FopenFlags::empty() }
    }

    /// Looks up `rel` in the backing dir and returns its inode and attributes.
    fn entry(st: &mut State, rel: std::path::PathBuf) -> Result<FileAttr, Errno> {
        let md = fs::symlink_metadata(st.root().join(&rel))?;
        let ino = st.ino_for(md.ino(), rel);
        Ok(attr(ino, &md))
    }

    fn getattr_inner(st: &mut State, ino: u64, fh: Option<u64>) -> Result<FileAttr, Errno> {
        st.alive()?;
        let md = match fh.and_then(|fh| st.handle(fh).ok()) {
            Some(h) => h.file.metadata()?,
            None => fs::symlink_metadata(st.abs(ino)?)?,
        };
        Ok(attr(ino, &md))
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr_inner(
        st: &mut State,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<u64>,
    ) -> Result<FileAttr, Errno> {
        st.alive()?;
        let path = st.abs(ino)?;
        if let Some(size) = size {
            let file = match fh.and_then(|fh| st.handle(fh).ok()) {
                Some(h) => h.file.clone(),
                None => Arc::new(OpenOptions::new().read(true).write(true).open(&path)?),
            };
            st.truncate(ino, &file, size)?;
        }
        if let Some(mode) = mode {
            fs::set_permissions(&path, Permissions::from_mode(mode & 0o7777))?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid)?;
        }
        if atime.is_some() || mtime.is_some() {
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                &path,
                &timespec(atime),
                &timespec(mtime),
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            )
            .map_err(nix_err)?;
        }
        Self::getattr_inner(st, ino, fh)
    }

    fn make(
        &self,
        parent: INodeNo,
        name: &OsStr,
        dir: bool,
        reply: ReplyEntry,
        make: impl FnOnce(&Path) -> io::Result<()>,
    ) {
        let mut st = self.lock();
        let res = (|| {
            st.alive()?;
            let rel = st.new_child(parent.0, name)?;
            make(&st.root().join(&rel))?;
            st.created(parent.0, name, dir);
            Self::entry(&mut st, rel)
        })();
        match res {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create_inner(
        st: &mut State,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        st.alive()?;
        let rel = st.new_child(parent, name)?;
        let abs = st.root().join(&rel);
        let existed = fs::symlink_metadata(&abs).is_ok();
        let mut oo = OpenOptions::new();
        oo.read(true).write(true).mode(mode & 0o7777).custom_flags(flags & libc::O_NOFOLLOW);
        if flags & libc::O_EXCL != 0 {
            oo.create_new(true);
        } else {
            oo.create(true);
        }
        let file = oo.open(&abs)?;
        if !existed {
            st.created(parent, name, false);
        }
        let md = file.metadata()?;
        let ino = st.ino_for(md.ino(), rel);
        if existed && flags & libc::O_TRUNC != 0 {
            st.truncate(ino, &file, 0)?;
        }
        let md = file.metadata()?;
        let fh = st.add_handle(file, ino, flags & libc::O_APPEND != 0);
        Ok((attr(ino, &md), fh))
    }
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let direct_io = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_ok();
        self.lock().direct_io = direct_io;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock();
        let res = st.alive().and_then(|()| {
            let rel = st.child(parent.0, name)?;
            Self::entry(&mut st, rel)
        });
        match res {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut st = self.lock();
        match Self::getattr_inner(&mut st, ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock();
        let fh = fh.map(|f| f.0);
        match Self::setattr_inner(&mut st, ino.0, mode, uid, gid, size, atime, mtime, fh) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let st = self.lock();
        let res = st.alive().and_then(|()| Ok(fs::read_link(st.abs(ino.0)?)?));
        match res {
            Ok(target) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str())),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        use nix::sys::stat::{Mode, SFlag};
        self.make(parent, name, false, reply, |path| {
            let kind = SFlag::from_bits_truncate(mode & libc::S_IFMT);
            let perm = Mode::from_bits_truncate(mode & 0o7777);
            nix::sys::stat::mknod(path, kind, perm, u64::from(rdev)).map_err(io::Error::from)
        });
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.make(parent, name, true, reply, |path| {
            DirBuilder::new().mode(mode & 0o7777).create(path)
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.make(parent, link_name, false, reply, |path| std::os::unix::fs::symlink(target, path));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let src = self.lock().abs(ino.0);
        match src {
            Ok(src) => {
                self.make(newparent, newname, false, reply, |path| fs::hard_link(&src, path))
            }
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.lock();
        match st.alive().and_then(|()| st.remove(parent.0, name, false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.lock();
        match st.alive().and_then(|()| st.remove(parent.0, name, true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        let res = st.alive().and_then(|()| {
            if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
                return Err(Errno::EINVAL);
            }
            let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
            st.rename(parent.0, name, newparent.0, newname, noreplace)
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        let res = st.alive().and_then(|()| {
            let file = open_backing(&st.abs(ino.0)?, flags.0)?;
            Ok(st.add_handle(file, ino.0, flags.0 & libc::O_APPEND != 0))
        });
        match res {
            Ok(fh) => reply.opened(FileHandle(fh), Self::fopen_flags(&st)),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.lock();
        match st.readable().and_then(|()| st.read(fh.0, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.lock();
        match st.alive().and_then(|()| st.write(fh.0, offset, data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() is not a sync: nothing becomes durable.
        match self.lock().alive() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.lock().sync_file(ino.0, Some(fh.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let st = self.lock();
        match st.alive().and_then(|()| st.abs(ino.0).map(drop)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.lock();
        let res = (|| {
            st.alive()?;
            let rel = st.rel(ino.0)?.to_path_buf();
            let mut entries = vec![
                (ino.0, FileType::Directory, OsStr::new(".").to_owned()),
                (ino.0, FileType::Directory, OsStr::new("..").to_owned()),
            ];
            for entry in fs::read_dir(st.root().join(&rel))? {
                let entry = entry?;
                let name = entry.file_name();
                if ino.0 == ROOT_INO && name == STASH {
                    continue;
                }
                let kind = kind(&entry.file_type()?);
                let child = st.ino_for(entry.ino(), rel.join(&name));
                entries.push((child, kind, name));
            }
            Ok::<_, Errno>(entries)
        })();
        match res {
            Ok(entries) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.lock().sync_dir(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.lock();
        let res = st.alive().and_then(|()| nix::sys::statvfs::statvfs(st.root()).map_err(nix_err));
        match res {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock();
        match Self::create_inner(&mut st, parent.0, name, mode, flags) {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), Self::fopen_flags(&st));
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        match st.alive().and_then(|()| st.fallocate(fh.0, offset, length, mode)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
