//! The durability model: what the backing directory holds that a power cut would take away,
//! and how to take it away. Everything here runs under the one lock of [`State`]; the FUSE
//! adapter in `fs.rs` only translates requests into these calls.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::Errno;

use crate::{Fault, Lost, Op, Torn};

/// The granularity of saved originals and of tearing: the page size of every Linux
/// machine QSM runs on, and the unit in which a disk's volatile cache writes back.
pub(crate) const PAGE: u64 = 4096;

/// Where unlinked and replaced entries wait until their removal is durable. It sits in the
/// backing root and is hidden from the mount.
pub(crate) const STASH: &str = ".qsm-powercut-stash";

pub(crate) const ROOT_INO: u64 = 1;

/// Per-inode record of data changes that are not durable yet.
#[derive(Debug, Default)]
struct FileState {
    /// The size the file has after a reboot, if nothing else happens.
    durable_size: u64,
    /// Original bytes of pages below `durable_size` changed since the last sync: the page
    /// range clipped to `durable_size`, saved on first touch.
    saved: BTreeMap<u64, Vec<u8>>,
    /// Every page changed since the last sync (or failed sync).
    touched: BTreeSet<u64>,
    /// Whether anything changed since the last sync.
    dirty: bool,
    /// Pages lost to a failed sync: their bytes as of the last successful sync, clipped to
    /// the size then (the rest of the page reads as zeros). A later successful sync
    /// removes a page that was written again after the failure.
    doomed: BTreeMap<u64, Vec<u8>>,
    pending_ops: u64,
    pending_bytes: u64,
}

impl FileState {
    fn new(size: u64) -> Self {
        FileState { durable_size: size, ..FileState::default() }
    }
}

#[derive(Debug)]
enum NsOp {
    Created {
        parent: u64,
        name: OsString,
        dir: bool,
    },
    Removed {
        parent: u64,
        name: OsString,
        stash: OsString,
    },
    Renamed {
        parent: u64,
        name: OsString,
        newparent: u64,
        newname: OsString,
        replaced: Option<OsString>,
    },
}

#[derive(Debug)]
struct NsRecord {
    op: NsOp,
    /// Directories still to be fsynced before the record is durable.
    pending: Vec<u64>,
}

#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) file: Arc<File>,
    pub(crate) ino: u64,
    append: bool,
}

#[derive(Debug, Clone, Copy)]
struct LastWrite {
    ino: u64,
    offset: u64,
    len: u64,
}

#[derive(Debug)]
struct Armed {
    fault: Fault,
    left: u64,
}

#[derive(Debug)]
pub(crate) struct State {
    root: PathBuf,
    root_backing_ino: u64,
    /// FUSE inode -> path relative to `root` (one of its names when hard-linked).
    nodes: HashMap<u64, PathBuf>,
    by_backing: HashMap<u64, u64>,
    next_ino: u64,
    files: HashMap<u64, FileState>,
    log: Vec<NsRecord>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    stash_seq: u64,
    pub(crate) syncs: u64,
    pub(crate) cut_at: Option<u64>,
    pub(crate) cut: bool,
    /// Set once the mount is gone; every late request fails.
    pub(crate) dead: bool,
    pub(crate) tear: bool,
    pub(crate) direct_io: bool,
    faults: Vec<Armed>,
    last_write: Option<LastWrite>,
    doomed_ops: u64,
    doomed_bytes: u64,
}

fn eio() -> Errno {
    Errno::EIO
}

fn read_full(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; len];
    let mut done = 0;
    while done < len {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

impl State {
    pub(crate) fn new(root: PathBuf) -> io::Result<State> {
        let stash = root.join(STASH);
        match fs::remove_dir_all(&stash) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        fs::create_dir(&stash)?;
        let root_backing_ino = fs::metadata(&root)?.ino();
        let mut nodes = HashMap::new();
        nodes.insert(ROOT_INO, PathBuf::new());
        Ok(State {
            root,
            root_backing_ino,
            nodes,
            by_backing: HashMap::new(),
            next_ino: ROOT_INO + 1,
            files: HashMap::new(),
            log: Vec::new(),
            handles: HashMap::new(),
            next_fh: 1,
            stash_seq: 0,
            syncs: 0,
            cut_at: None,
            cut: false,
            dead: false,
            tear: false,
            direct_io: false,
            faults: Vec::new(),
            last_write: None,
            doomed_ops: 0,
            doomed_bytes: 0,
        })
    }

    pub(crate) fn alive(&self) -> Result<(), Errno> {
        if self.cut || self.dead { Err(eio()) } else { Ok(()) }
    }

    /// Reads of open files go on after the cut (not after the unmount): a read that failed
    /// would raise SIGBUS in a process that maps the file (SQLite's -shm), and kill the test
    /// process with its own file system still mounted, which then hangs in exit waiting for
    /// itself. A real power cut stops the reader anyway; what it read cannot persist.
    pub(crate) fn readable(&self) -> Result<(), Errno> {
        if self.dead { Err(eio()) } else { Ok(()) }
    }

    pub(crate) fn arm(&mut self, fault: Fault) {
        let left = fault.nth.max(1);
        self.faults.push(Armed { fault, left });
    }

    /// Fails the request if an armed fault matches it (each fault fires once).
    fn fire(&mut self, op: Op, ino: u64) -> Result<(), Errno> {
        if self.faults.is_empty() {
            return Ok(());
        }
        let path = self.rel(ino).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let mut hit = None;
        for (i, a) in self.faults.iter_mut().enumerate() {
            if a.fault.op == op && a.fault.path_contains.as_deref().is_none_or(|s| path.contains(s))
            {
                a.left -= 1;
                if a.left == 0 && hit.is_none() {
                    hit = Some(i);
                }
            }
        }
        // Two faults due on the same request: the first fires, the other the next time.
        for a in &mut self.faults {
            a.left = a.left.max(1);
        }
        match hit {
            Some(i) => Err(Errno::from_i32(self.faults.remove(i).fault.errno)),
            None => Ok(()),
        }
    }

    // ---- the inode table ----

    pub(crate) fn rel(&self, ino: u64) -> Result<&Path, Errno> {
        self.nodes.get(&ino).map(PathBuf::as_path).ok_or(Errno::ENOENT)
    }

    pub(crate) fn abs(&self, ino: u64) -> Result<PathBuf, Errno> {
        Ok(self.root.join(self.rel(ino)?))
    }

    /// The relative path of `name` in directory `parent`; the stash is not a name.
    pub(crate) fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        if parent == ROOT_INO && name == STASH {
            return Err(Errno::ENOENT);
        }
        Ok(self.rel(parent)?.join(name))
    }

    /// The relative path for a new entry `name` in `parent`; the stash's name is taken.
    pub(crate) fn new_child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        if parent == ROOT_INO && name == STASH {
            return Err(Errno::EPERM);
        }
        self.child(parent, name)
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The FUSE inode for a backing file found at `rel`.
    pub(crate) fn ino_for(&mut self, backing_ino: u64, rel: PathBuf) -> u64 {
        if backing_ino == self.root_backing_ino {
            return ROOT_INO;
        }
        let ino = match self.by_backing.get(&backing_ino) {
            Some(&ino) => ino,
            None => {
                let ino = self.next_ino;
                self.next_ino += 1;
                self.by_backing.insert(backing_ino, ino);
                ino
            }
        };
        self.nodes.insert(ino, rel);
        ino
    }

    /// Renames `from` to `to` in the inode table, descendants included.
    fn move_paths(&mut self, from: &Path, to: &Path) {
        for path in self.nodes.values_mut() {
            if let Ok(rest) = path.strip_prefix(from) {
                *path = if rest.as_os_str().is_empty() { to.to_path_buf() } else { to.join(rest) };
            }
        }
    }

    // ---- handles ----

    pub(crate) fn add_handle(&mut self, file: File, ino: u64, append: bool) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle { file: Arc::new(file), ino, append });
        fh
    }

    pub(crate) fn handle(&self, fh: u64) -> Result<&Handle, Errno> {
        self.handles.get(&fh).ok_or(Errno::EBADF)
    }

    pub(crate) fn release(&mut self, fh: u64) {
        self.handles.remove(&fh);
    }

    // ---- data ----

    /// Saves what a change of bytes `[start, end)` of `ino` would destroy, before it happens.
    fn before_change(
        &mut self,
        ino: u64,
        file: &File,
        start: u64,
        end: u64,
        bytes: u64,
    ) -> io::Result<()> {
        let st = match self.files.entry(ino) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(FileState::new(file.metadata()?.len()))
            }
        };
        if end > start {
            for page in start / PAGE..end.div_ceil(PAGE) {
                let from = page * PAGE;
                if from < st.durable_size && !st.saved.contains_key(&page) {
                    let len = (from + PAGE).min(st.durable_size) - from;
                    st.saved.insert(page, read_full(file, from, len as usize)?);
                }
                st.touched.insert(page);
            }
        }
        st.dirty = true;
        st.pending_ops += 1;
        st.pending_bytes += bytes;
        Ok(())
    }

    pub(crate) fn read(&mut self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let h = self.handle(fh)?;
        let (file, ino) = (h.file.clone(), h.ino);
        self.fire(Op::Read, ino)?;
        Ok(read_full(&file, offset, size as usize)?)
    }

    pub(crate) fn write(&mut self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let h = self.handle(fh)?;
        let (file, ino, append) = (h.file.clone(), h.ino, h.append);
        self.fire(Op::Write, ino)?;
        let offset = if append { file.metadata()?.len() } else { offset };
        let len = data.len() as u64;
        self.before_change(ino, &file, offset, offset + len, len)?;
        file.write_all_at(data, offset)?;
        self.last_write = Some(LastWrite { ino, offset, len });
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    pub(crate) fn truncate(&mut self, ino: u64, file: &File, size: u64) -> Result<(), Errno> {
        let cur = file.metadata()?.len();
        self.before_change(ino, file, size.min(cur), size.max(cur), 0)?;
        file.set_len(size)?;
        self.forget_last_write(ino);
        Ok(())
    }

    pub(crate) fn fallocate(
        &mut self,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let h = self.handle(fh)?;
        let (file, ino) = (h.file.clone(), h.ino);
        self.fire(Op::Write, ino)?;
        self.before_change(ino, &file, offset, offset + length, 0)?;
        let flags = nix::fcntl::FallocateFlags::from_bits_truncate(mode);
        let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        let len = i64::try_from(length).map_err(|_| Errno::EINVAL)?;
        nix::fcntl::fallocate(&*file, flags, off, len).map_err(|e| Errno::from_i32(e as i32))?;
        self.forget_last_write(ino);
        Ok(())
    }

    fn forget_last_write(&mut self, ino: u64) {
        if self.last_write.is_some_and(|w| w.ino == ino) {
            self.last_write = None;
        }
    }

    /// Counts a sync call and decides whether the power fails at it.
    fn sync_gate(&mut self, ino: u64) -> Result<(), Errno> {
        self.alive()?;
        self.syncs += 1;
        if self.cut_at == Some(self.syncs) {
            self.cut = true;
            return Err(eio());
        }
        self.fire(Op::Sync, ino)
    }

    /// fsync or fdatasync of a file: its data and size become durable.
    pub(crate) fn sync_file(&mut self, ino: u64, fh: Option<u64>) -> Result<(), Errno> {
        let gate = self.sync_gate(ino);
        if self.cut {
            return gate;
        }
        let size = match fh.and_then(|fh| self.handles.get(&fh)) {
            Some(h) => h.file.metadata()?.len(),
            None => fs::symlink_metadata(self.abs(ino)?)?.len(),
        };
        self.forget_last_write(ino);
        let Some(st) = self.files.get_mut(&ino) else { return gate };
        if gate.is_err() {
            // fsyncgate: the pages are marked clean although they never reached the disk.
            for &page in &st.touched {
                let old = st.saved.get(&page).cloned().unwrap_or_default();
                st.doomed.entry(page).or_insert(old);
            }
            self.doomed_ops += st.pending_ops;
            self.doomed_bytes += st.pending_bytes;
        } else {
            for page in &st.touched {
                st.doomed.remove(page);
            }
        }
        st.durable_size = size;
        st.saved.clear();
        st.touched.clear();
        st.dirty = false;
        st.pending_ops = 0;
        st.pending_bytes = 0;
        if st.doomed.is_empty() {
            self.files.remove(&ino);
        }
        gate
    }

    /// fsync of a directory: the namespace changes in it become durable.
    pub(crate) fn sync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        self.sync_gate(ino)?;
        for rec in &mut self.log {
            rec.pending.retain(|&d| d != ino);
        }
        self.log.retain(|r| !r.pending.is_empty());
        Ok(())
    }

    // ---- namespace ----

    pub(crate) fn created(&mut self, parent: u64, name: &OsStr, dir: bool) {
        let op = NsOp::Created { parent, name: name.to_owned(), dir };
        self.log.push(NsRecord { op, pending: vec![parent] });
    }

    fn stash_name(&mut self) -> OsString {
        self.stash_seq += 1;
        OsString::from(self.stash_seq.to_string())
    }

    fn stash_rel(name: &OsStr) -> PathBuf {
        Path::new(STASH).join(name)
    }

    /// unlink (`dir == false`) or rmdir (`dir == true`): the entry moves to the stash.
    pub(crate) fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let rel = self.child(parent, name)?;
        let abs = self.root.join(&rel);
        let md = fs::symlink_metadata(&abs)?;
        if dir {
            if !md.is_dir() {
                return Err(Errno::ENOTDIR);
            }
            if fs::read_dir(&abs)?.next().is_some() {
                return Err(Errno::ENOTEMPTY);
            }
        } else if md.is_dir() {
            return Err(Errno::EISDIR);
        }
        let stash = self.stash_name();
        let stash_rel = Self::stash_rel(&stash);
        fs::rename(&abs, self.root.join(&stash_rel))?;
        self.move_paths(&rel, &stash_rel);
        let op = NsOp::Removed { parent, name: name.to_owned(), stash };
        self.log.push(NsRecord { op, pending: vec![parent] });
        Ok(())
    }

    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        let (from_abs, to_abs) = (self.root.join(&from), self.root.join(&to));
        let src = fs::symlink_metadata(&from_abs)?;
        let dst = match fs::symlink_metadata(&to_abs) {
            Ok(md) => Some(md),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let mut replaced = None;
        if let Some(dst) = dst {
            if noreplace {
                return Err(Errno::EEXIST);
            }
            if dst.ino() == src.ino() && dst.dev() == src.dev() {
                return Ok(()); // POSIX: renaming onto another name of the same file does nothing
            }
            match (src.is_dir(), dst.is_dir()) {
                (false, true) => return Err(Errno::EISDIR),
                (true, false) => return Err(Errno::ENOTDIR),
                (true, true) if fs::read_dir(&to_abs)?.next().is_some() => {
                    return Err(Errno::ENOTEMPTY);
                }
                _ => {}
            }
            let stash = self.stash_name();
            fs::rename(&to_abs, self.root.join(Self::stash_rel(&stash)))?;
            replaced = Some(stash);
        }
        if let Err(e) = fs::rename(&from_abs, &to_abs) {
            if let Some(stash) = &replaced {
                // Put the target back: the failed rename must change nothing.
                fs::rename(self.root.join(Self::stash_rel(stash)), &to_abs)?;
            }
            return Err(e.into());
        }
        if let Some(stash) = &replaced {
            self.move_paths(&to, &Self::stash_rel(stash));
        }
        self.move_paths(&from, &to);
        let pending = if parent == newparent { vec![parent] } else { vec![parent, newparent] };
        let op = NsOp::Renamed {
            parent,
            name: name.to_owned(),
            newparent,
            newname: newname.to_owned(),
            replaced,
        };
        self.log.push(NsRecord { op, pending });
        Ok(())
    }

    // ---- the power cut ----

    /// Reverts the backing directory to its durable state. Called once the mount is gone.
    pub(crate) fn revert(&mut self) -> io::Result<Lost> {
        self.dead = true;
        self.handles.clear();
        let mut lost = Lost {
            writes: self.doomed_ops,
            bytes: self.doomed_bytes,
            namespace_ops: 0,
            torn: None,
        };

        // A torn write keeps the whole pages of its beginning: read them before reverting.
        let mut tear = None;
        if let Some(w) = self.last_write.filter(|_| self.tear)
            && w.len > 0
            && self.files.get(&w.ino).is_some_and(|st| st.dirty)
        {
            let boundary = (w.offset + w.len - 1) / PAGE * PAGE;
            if boundary > w.offset {
                let path = self.abs(w.ino).map_err(|_| io::Error::from(io::ErrorKind::NotFound))?;
                let file = File::open(&path)?;
                let kept = read_full(&file, w.offset, (boundary - w.offset) as usize)?;
                tear = Some((w, path, kept));
            }
        }

        let mut files: Vec<_> = self.files.drain().collect();
        files.sort_by_key(|(ino, _)| *ino);
        for (ino, st) in files {
            lost.writes += st.pending_ops;
            lost.bytes += st.pending_bytes;
            let Ok(path) = self.abs(ino) else { continue };
            let file = match OpenOptions::new().write(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(with_path(e, &path)),
            };
            if st.dirty {
                for (page, bytes) in &st.saved {
                    file.write_all_at(bytes, page * PAGE)?;
                }
                file.set_len(st.durable_size)?;
            }
            for (page, bytes) in &st.doomed {
                let from = page * PAGE;
                let end = (from + PAGE).min(st.durable_size);
                if from >= end {
                    continue;
                }
                let mut old = bytes.clone();
                old.resize((end - from) as usize, 0);
                file.write_all_at(&old, from)?;
            }
        }
        if let Some((w, path, kept)) = tear {
            let file = OpenOptions::new().write(true).open(&path)?;
            file.write_all_at(&kept, w.offset)?;
            lost.torn = Some(Torn {
                path: self.rel(w.ino).map(Path::to_path_buf).unwrap_or_default(),
                offset: w.offset,
                len: w.len,
                kept: kept.len() as u64,
            });
        }

        while let Some(rec) = self.log.pop() {
            lost.namespace_ops += 1;
            self.undo(rec.op)?;
        }
        fs::remove_dir_all(self.root.join(STASH))?;
        Ok(lost)
    }

    fn path_in(&self, parent: u64, name: &OsStr) -> io::Result<PathBuf> {
        let rel = self.rel(parent).map_err(|_| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(rel.join(name))
    }

    fn undo(&mut self, op: NsOp) -> io::Result<()> {
        match op {
            NsOp::Created { parent, name, dir } => {
                let abs = self.root.join(self.path_in(parent, &name)?);
                let res = if dir { fs::remove_dir_all(&abs) } else { fs::remove_file(&abs) };
                match res {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(with_path(e, &abs)),
                    _ => Ok(()),
                }
            }
            NsOp::Removed { parent, name, stash } => {
                let rel = self.path_in(parent, &name)?;
                self.move_back(&Self::stash_rel(&stash), &rel)
            }
            NsOp::Renamed { parent, name, newparent, newname, replaced } => {
                let from = self.path_in(parent, &name)?;
                let to = self.path_in(newparent, &newname)?;
                self.move_back(&to, &from)?;
                match replaced {
                    Some(stash) => self.move_back(&Self::stash_rel(&stash), &to),
                    None => Ok(()),
                }
            }
        }
    }

    fn move_back(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_abs, to_abs) = (self.root.join(from), self.root.join(to));
        fs::rename(&from_abs, &to_abs).map_err(|e| with_path(e, &from_abs))?;
        self.move_paths(from, to);
        Ok(())
    }
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("reverting {}: {e}", path.display()))
}
