//! [`DirPool`]: a pool in a local directory.
//!
//! ```text
//! POOL                                  descriptor: magic, version, pool id, target size, name
//! containers/
//!   3f/3f9a0c41d2e87b65.qsmc            one file per container, named by its id in hex
//!   a0/a07c...                          fanned out by the id's first two hex digits, so no
//!                                       directory holds more than 1/256 of the containers
//! ```
//!
//! Files are written with `std::fs`, not through `object_store` (whose `LocalFileSystem` would
//! otherwise let one backend serve both a directory and S3): an object store writes whole
//! objects, or multipart uploads that become visible only when completed, and has neither
//! append nor a way to make the bytes written so far durable. A local container is appended
//! frame by frame and must be synced (`fdatasync` of the file, `fsync` of its directory) at
//! every commit while it stays open, so that the catalog can reference its frames at once;
//! that needs a file handle. The S3 pool of a later issue will instead build each container in
//! memory or in a local spool and write it whole (or in sealed segments) through `object_store`
//! when a writer syncs, and must pass the same [`crate::conformance`] suite. The container
//! parsers in [`crate::container`] work on ranged reads so that both backends share them.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use qsm_codec::FrameHeader;
use qsm_codec::frame::FRAME_HEADER_LEN;

use crate::audit::ReadErrors;
use crate::container::{
    self, CONTAINER_HEADER_LEN, ContainerHeader, ForwardEnd, IndexBuilder, MAX_FRAME_LEN, ReadAt,
    Sealing, TRAILER_LEN,
};
use crate::descriptor::{Descriptor, MAX_LEN, check_target, now_secs, random_container_id};
use crate::error::{PoolError, read_error, write_error};
use crate::frames::{Verifier, check_appended, check_frame};
use crate::{
    AuditReport, CatalogTag, ContainerId, ContainerInfo, FirstError, FrameLocation, Pool, PoolId,
    PoolWriter, ScanEnd, ScanStop,
};

/// The default target size of a container: 64 MiB. The design asks for "tens of MiB"; this is
/// not measured yet. At the default 1 MiB quantum it holds about 64 frames, so its index is
/// under 2 KiB; reclaiming one rewrites at most 64 MiB; 10 TB of data make about 150,000
/// containers, some 600 per fan-out directory; and an object store takes 64 MiB in a handful
/// of multipart parts.
pub const DEFAULT_TARGET_SIZE: u64 = 64 << 20;
/// The smallest target size accepted (tests use small containers to exercise rollover).
pub const MIN_TARGET_SIZE: u64 = 4 << 10;
/// The largest target size accepted.
pub const MAX_TARGET_SIZE: u64 = 1 << 40;

const DESCRIPTOR: &str = "POOL";
const DESCRIPTOR_TMP: &str = ".POOL.partial";
/// The record of the pool's catalog ([`crate::CatalogTag`]).
const CATALOG: &str = "CATALOG";
const CATALOG_TMP: &str = ".CATALOG.partial";
const CONTAINERS: &str = "containers";
const EXTENSION: &str = "qsmc";
/// Small frames are gathered into writes of this size; larger ones go to the file directly.
const WRITE_BUFFER: usize = 128 << 10;
/// Container ids whose header was verified by `read_frame`, before the cache starts over.
const MAX_CHECKED: usize = 1 << 16;
/// Containers kept open for `read_frame`. A restore reads a container's frames file after
/// file: opening, sizing and closing it for every frame cost three system calls per restored
/// file. A handful is enough, as restores read containers in order.
const READERS: usize = 16;

/// Options of a [`DirPool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPoolOptions {
    /// A writer seals its container and opens a new one before a frame would take the
    /// container past this many bytes (header and frames; the index adds 28 bytes per frame).
    /// A frame larger than the target gets a container of its own. `None`: for
    /// [`DirPool::create`], [`DEFAULT_TARGET_SIZE`], recorded in the pool; for
    /// [`DirPool::open_with`], the size recorded in the pool.
    pub target_size: Option<u64>,
    /// Sync files and directories to stable storage (default: on). Off, a crash of the
    /// machine (not of the process) can lose frames the catalog already references: only for
    /// tests and benchmarks that say so.
    pub fsync: bool,
}

impl Default for DirPoolOptions {
    fn default() -> Self {
        DirPoolOptions { target_size: None, fsync: true }
    }
}

/// A storage pool in a local directory. Cloning it is cheap and shares its state.
#[derive(Debug, Clone)]
pub struct DirPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    id: PoolId,
    name: String,
    /// How errors name the pool: its name and directory.
    label: String,
    target_size: u64,
    fsync: bool,
    /// Containers open in a writer of this process: `delete` refuses them.
    open: Mutex<HashSet<ContainerId>>,
    /// Containers whose header `read_frame` has verified, so that most reads are one read.
    checked: Mutex<HashSet<ContainerId>>,
    /// Containers open for reading frames ([`READERS`] at most, the oldest dropped first).
    readers: Mutex<Vec<(ContainerId, Arc<File>)>>,
    /// Checksum verification, its decoders reused between reads.
    verifier: Verifier,
}

/// A poisoned lock only means another thread panicked while holding it; the sets guarded
/// here are valid after every single operation, so the data is still good.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A directory builder for the pool's own directories: owner-only whatever the umask.
fn private_dir() -> fs::DirBuilder {
    let mut builder = fs::DirBuilder::new();
    builder.mode(0o700);
    builder
}

fn sync_dir(dir: &Path) -> Result<(), PoolError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| write_error("syncing directory", dir, e))
}

impl DirPool {
    /// Creates a new pool named `name` in `path`, which must not exist or be an empty
    /// directory, and returns it open. The descriptor is written to a temporary name, synced
    /// and renamed, so a crash leaves either a complete pool or no `POOL` file.
    pub fn create(
        path: impl AsRef<Path>,
        name: &str,
        options: &DirPoolOptions,
    ) -> Result<DirPool, PoolError> {
        let root = path.as_ref();
        let descriptor = Descriptor::new(name, options.target_size.unwrap_or(DEFAULT_TARGET_SIZE))?;
        match fs::read_dir(root) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    let what =
                        if root.join(DESCRIPTOR).exists() { "already a pool" } else { "not empty" };
                    return Err(PoolError::Invalid(format!(
                        "cannot create a pool in {}: the directory is {what} (a pool is created \
                         in a new or empty directory)",
                        root.display()
                    )));
                }
                // An empty directory made for the pool beforehand becomes the pool's own.
                fs::set_permissions(root, fs::Permissions::from_mode(0o700))
                    .map_err(|e| write_error("making owner-only", root, e))?;
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Owner-only whatever the umask: containers hold every file backed up.
                private_dir()
                    .recursive(true)
                    .create(root)
                    .map_err(|e| write_error("creating pool", root, e))?;
                if options.fsync
                    && let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty())
                {
                    sync_dir(parent)?;
                }
            }
            Err(e) => return Err(read_error("reading pool directory", root, e)),
        }
        let containers = root.join(CONTAINERS);
        private_dir()
            .create(&containers)
            .map_err(|e| write_error("creating directory", &containers, e))?;
        let tmp = root.join(DESCRIPTOR_TMP);
        let write = |file: &mut File| {
            file.write_all(&descriptor.to_bytes())?;
            if options.fsync { file.sync_all() } else { Ok(()) }
        };
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut file| write(&mut file))
            .map_err(|e| write_error("writing pool descriptor", &tmp, e))?;
        let final_path = root.join(DESCRIPTOR);
        fs::rename(&tmp, &final_path)
            .map_err(|e| write_error("writing pool descriptor", &final_path, e))?;
        if options.fsync {
            sync_dir(root)?;
        }
        DirPool::open_with(root, options)
    }

    /// Opens the pool in `path` with the default options (the pool's own target size, fsync
    /// on).
    pub fn open(path: impl AsRef<Path>) -> Result<DirPool, PoolError> {
        DirPool::open_with(path, &DirPoolOptions::default())
    }

    /// Opens the pool in `path`; `options.target_size`, if set, overrides the pool's own for
    /// this handle (it is not recorded).
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &DirPoolOptions,
    ) -> Result<DirPool, PoolError> {
        let root = path.as_ref();
        let not_a_pool = |detail: &str| PoolError::NotAPool {
            path: root.to_path_buf(),
            detail: detail.to_string(),
        };
        match fs::metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(not_a_pool("it is not a directory")),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(not_a_pool("the directory does not exist"));
            }
            Err(e) => return Err(read_error("opening pool", root, e)),
        }
        let path = root.join(DESCRIPTOR);
        let mut bytes = Vec::new();
        // A descriptor is at most 301 bytes; reading one more tells a big file from a
        // descriptor without reading all of it.
        let limit = MAX_LEN as u64 + 1;
        match File::open(&path).and_then(|f| f.take(limit).read_to_end(&mut bytes)) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(not_a_pool(
                    "it has no POOL descriptor file (create a pool with DirPool::create)",
                ));
            }
            Err(e) => return Err(read_error("reading pool descriptor", &path, e)),
        }
        let descriptor = Descriptor::parse(&bytes).map_err(|detail| not_a_pool(&detail))?;
        if !root.join(CONTAINERS).is_dir() {
            return Err(not_a_pool("its containers directory is missing"));
        }
        let target_size = match options.target_size {
            Some(size) => check_target(size)?,
            None => descriptor.target_size,
        };
        let label = format!("'{}' ({})", descriptor.name, root.display());
        Ok(DirPool {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                id: descriptor.id,
                name: descriptor.name,
                label,
                target_size,
                fsync: options.fsync,
                open: Mutex::default(),
                checked: Mutex::default(),
                readers: Mutex::default(),
                verifier: Verifier::default(),
            }),
        })
    }

    /// The pool's directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The file that holds (or would hold) container `id`.
    pub fn container_path(&self, id: ContainerId) -> PathBuf {
        self.inner.container_path(id)
    }

    /// The target size writers of this handle seal containers at.
    pub fn target_size(&self) -> u64 {
        self.inner.target_size
    }
}

/// One container file opened for reading.
struct ContainerFile {
    file: Arc<File>,
    path: PathBuf,
    size: u64,
}

impl ReadAt for ContainerFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), PoolError> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| read_error("reading container", &self.path, e))
    }
}

impl Inner {
    fn container_path(&self, id: ContainerId) -> PathBuf {
        let hex = format!("{id:016x}");
        self.root.join(CONTAINERS).join(&hex[..2]).join(format!("{hex}.{EXTENSION}"))
    }

    fn corrupt(
        &self,
        container: ContainerId,
        offset: u64,
        chunk: Option<u64>,
        detail: impl Into<String>,
    ) -> PoolError {
        PoolError::Corrupt {
            pool: self.label.clone(),
            container,
            offset,
            chunk,
            detail: detail.into(),
        }
    }

    /// Whether container `id` ends with a well-formed trailer. Best effort: a container that
    /// cannot be read is listed as unsealed, and scanning or auditing it reports why, so that
    /// one bad file does not hide the others from a listing.
    fn has_trailer(&self, id: ContainerId) -> bool {
        self.open_container(id).is_ok_and(|mut c| {
            let mut t = [0u8; TRAILER_LEN];
            c.size >= container::MIN_SEALED_LEN
                && c.read_at(c.size - TRAILER_LEN as u64, &mut t).is_ok()
                && container::parse_trailer(&t, c.size, id).is_ok()
        })
    }

    fn open_container(&self, id: ContainerId) -> Result<ContainerFile, PoolError> {
        let path = self.container_path(id);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(PoolError::NotFound { pool: self.label.clone(), container: id });
            }
            Err(e) => return Err(read_error("opening container", &path, e)),
        };
        let size = file.metadata().map_err(|e| read_error("opening container", &path, e))?.len();
        Ok(ContainerFile { file: Arc::new(file), path, size })
    }

    /// Container `id` for reading a frame: kept open from an earlier read if it can be.
    /// A kept handle costs one `fstat`, which gives the size now (a container may still be
    /// growing) and tells whether the file was unlinked since (deleted, or replaced by a copy):
    /// then it is opened again by name, so a read never sees a file the pool no longer holds.
    fn reader(&self, id: ContainerId) -> Result<ContainerFile, PoolError> {
        let kept = lock(&self.readers).iter().find(|(c, _)| *c == id).map(|(_, f)| Arc::clone(f));
        if let Some(file) = kept {
            match file.metadata() {
                Ok(m) if m.nlink() > 0 => {
                    return Ok(ContainerFile {
                        file,
                        path: self.container_path(id),
                        size: m.len(),
                    });
                }
                _ => self.forget_reader(id),
            }
        }
        let c = self.open_container(id)?;
        let mut readers = lock(&self.readers);
        if readers.len() >= READERS {
            readers.remove(0);
        }
        readers.push((id, Arc::clone(&c.file)));
        Ok(c)
    }

    fn forget_reader(&self, id: ContainerId) {
        lock(&self.readers).retain(|(c, _)| *c != id);
    }

    /// Verifies the container header: a container of this pool, with this id. A file too
    /// short to hold a header but starting like one is what a writer leaves when it stops
    /// between creating the file and writing its header: `Ok(None)`, it holds no frames.
    fn check_header(
        &self,
        c: &mut ContainerFile,
        id: ContainerId,
        chunk: Option<u64>,
    ) -> Result<Option<ContainerHeader>, PoolError> {
        if c.size < CONTAINER_HEADER_LEN as u64 {
            let mut start = vec![0u8; c.size as usize];
            c.read_at(0, &mut start)?;
            let n = start.len().min(4);
            if start[..n] == container::CONTAINER_MAGIC[..n] {
                return Ok(None);
            }
        }
        let mut b = [0u8; CONTAINER_HEADER_LEN];
        let have = (c.size.min(CONTAINER_HEADER_LEN as u64)) as usize;
        c.read_at(0, &mut b[..have])?;
        let header = ContainerHeader::parse(&b[..have])
            .map_err(|e| self.corrupt(id, e.offset, chunk, e.detail))?;
        if header.pool != self.id {
            return Err(PoolError::WrongPool {
                pool: self.label.clone(),
                container: id,
                expected: self.id,
                found: header.pool,
            });
        }
        if header.container != id {
            return Err(self.corrupt(
                id,
                24,
                chunk,
                format!(
                    "the header names container {:016x}: the file was renamed or copied here",
                    header.container
                ),
            ));
        }
        Ok(Some(header))
    }

    fn read_frame_inner(
        &self,
        loc: &FrameLocation,
        chunk: Option<u64>,
        out: &mut Vec<u8>,
        decode: bool,
    ) -> Result<FrameHeader, PoolError> {
        let corrupt = |detail: String| self.corrupt(loc.container, loc.offset, chunk, detail);
        let len = u64::from(loc.len);
        if !(FRAME_HEADER_LEN as u64..=MAX_FRAME_LEN).contains(&len) {
            return Err(corrupt(format!(
                "a location of {len} bytes cannot hold a frame ({FRAME_HEADER_LEN} to \
                 {MAX_FRAME_LEN} bytes): the location is wrong"
            )));
        }
        if loc.offset < CONTAINER_HEADER_LEN as u64 {
            return Err(corrupt("the location points into the container header".into()));
        }
        let mut c = self.reader(loc.container)?;
        if !lock(&self.checked).contains(&loc.container) {
            if self.check_header(&mut c, loc.container, chunk)?.is_none() {
                return Err(corrupt("the container has no complete header".into()));
            }
            let mut checked = lock(&self.checked);
            if checked.len() >= MAX_CHECKED {
                checked.clear();
            }
            checked.insert(loc.container);
        }
        if loc.offset.checked_add(len).is_none_or(|end| end > c.size) {
            return Err(corrupt(format!(
                "the frame of {len} bytes runs past the end of the container ({} bytes): the \
                 container was truncated, or the location is wrong",
                c.size
            )));
        }
        out.resize(len as usize, 0);
        c.read_at(loc.offset, out).inspect_err(|_| self.forget_reader(loc.container))?;
        let header = if decode { self.verifier.verify(out) } else { check_frame(out) };
        header.map_err(|e| corrupt(e.to_string()))
    }

    /// Forward scan from the end of the header, mapping offsets to locations.
    fn forward(
        &self,
        c: &mut ContainerFile,
        id: ContainerId,
        start: u64,
        visit: &mut dyn FnMut(FrameLocation, &FrameHeader) -> Result<(), PoolError>,
    ) -> Result<ForwardEnd, PoolError> {
        container::scan_forward(c, start, &mut |offset, header| {
            let loc = FrameLocation { container: id, offset, len: header.frame_len() as u32 };
            visit(loc, header)
        })
    }
}

/// Checks that `frame` is exactly one valid frame and decodes it to verify its data checksum,
/// with a decoder and buffer borrowed from the pool.
/// The frame's header and length, without decoding it.
impl Pool for DirPool {
    fn id(&self) -> PoolId {
        self.inner.id
    }

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn kind(&self) -> &'static str {
        "dir"
    }

    fn writer(&self) -> Result<Box<dyn PoolWriter>, PoolError> {
        let mut writer = DirWriter {
            pool: Arc::clone(&self.inner),
            open: None,
            last: 0,
            dirs_to_sync: Vec::new(),
            failed: FirstError::default(),
        };
        writer.open_new()?;
        Ok(Box::new(writer))
    }

    fn read_frame(
        &self,
        loc: &FrameLocation,
        chunk: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<FrameHeader, PoolError> {
        let result = self.inner.read_frame_inner(loc, chunk, out, true);
        if result.is_err() {
            out.clear();
        }
        result
    }

    fn read_frame_for_decode(
        &self,
        loc: &FrameLocation,
        chunk: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<FrameHeader, PoolError> {
        let result = self.inner.read_frame_inner(loc, chunk, out, false);
        if result.is_err() {
            out.clear();
        }
        result
    }

    fn containers(&self) -> Result<Vec<ContainerInfo>, PoolError> {
        let dir = self.inner.root.join(CONTAINERS);
        let is_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let mut out = Vec::new();
        for sub in fs::read_dir(&dir).map_err(|e| read_error("listing containers in", &dir, e))? {
            let sub = sub.map_err(|e| read_error("listing containers in", &dir, e))?;
            let prefix = sub.file_name().to_string_lossy().into_owned();
            if prefix.len() != 2 || !is_hex(&prefix) || !sub.path().is_dir() {
                continue;
            }
            let sub_path = sub.path();
            let entries = match fs::read_dir(&sub_path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(read_error("listing containers in", &sub_path, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| read_error("listing containers in", &sub_path, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(hex) = name.strip_suffix(".qsmc") else { continue };
                if hex.len() != 16 || !is_hex(hex) || !hex.starts_with(&prefix) {
                    continue;
                }
                let Ok(id) = u64::from_str_radix(hex, 16) else { continue };
                let (size, modified) = match entry.metadata() {
                    Ok(m) if m.is_file() => (m.len(), unix_seconds(&m)),
                    Ok(_) => continue,
                    // Deleted since the directory was listed.
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(read_error("listing containers in", &sub_path, e)),
                };
                out.push(ContainerInfo { id, size, sealed: self.inner.has_trailer(id), modified });
            }
        }
        out.sort_by_key(|info| info.id);
        Ok(out)
    }

    fn container(&self, id: ContainerId) -> Result<Option<ContainerInfo>, PoolError> {
        let path = self.inner.container_path(id);
        match fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(Some(ContainerInfo {
                id,
                size: m.len(),
                sealed: self.inner.has_trailer(id),
                modified: unix_seconds(&m),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(read_error("reading container", &path, e)),
        }
    }

    fn scan(
        &self,
        id: ContainerId,
        visit: &mut dyn FnMut(FrameLocation, &FrameHeader) -> Result<(), PoolError>,
    ) -> Result<ScanEnd, PoolError> {
        let inner = &self.inner;
        let mut c = inner.open_container(id)?;
        let size = c.size;
        if inner.check_header(&mut c, id, None)?.is_none() {
            return Ok(no_header_end(size));
        }
        let mut trailer_damage = None;
        match container::read_sealing(&mut c, id)? {
            Sealing::Sealed(entries) => {
                let mut end = CONTAINER_HEADER_LEN as u64;
                for e in &entries {
                    let len = e.header.frame_len() as u64;
                    visit(
                        FrameLocation { container: id, offset: e.offset, len: len as u32 },
                        &e.header,
                    )?;
                    end = e.offset + len;
                }
                let frames = entries.len() as u64;
                return Ok(ScanEnd { frames, end, size, stop: ScanStop::Sealed, trailer_damage });
            }
            Sealing::Unsealed => {}
            Sealing::Damaged(e) => {
                trailer_damage = Some(format!("at byte offset {}: {}", e.offset, e.detail));
            }
        }
        let fwd = inner.forward(&mut c, id, CONTAINER_HEADER_LEN as u64, visit)?;
        let stop = match fwd.stop {
            None => ScanStop::EndOfFile,
            Some(detail) => ScanStop::Stopped { detail },
        };
        Ok(ScanEnd { frames: fwd.frames, end: fwd.end, size, stop, trailer_damage })
    }

    fn audit(&self, id: ContainerId) -> Result<AuditReport, PoolError> {
        let inner = &self.inner;
        let mut c = inner.open_container(id)?;
        let size = c.size;
        let report = AuditReport {
            container: id,
            frames_ok: 0,
            bytes_ok: 0,
            damaged: Vec::new(),
            end: no_header_end(size),
        };
        if inner.check_header(&mut c, id, None)?.is_none() {
            return Ok(report);
        }
        crate::audit::audit_frames(&mut c, id, &inner.verifier, ReadErrors::Damage, report)
    }

    fn delete(&self, id: ContainerId) -> Result<(), PoolError> {
        let inner = &self.inner;
        if lock(&inner.open).contains(&id) {
            return Err(PoolError::Busy { pool: inner.label.clone(), container: id });
        }
        let path = inner.container_path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(PoolError::NotFound { pool: inner.label.clone(), container: id });
            }
            Err(e) => return Err(write_error("deleting container", &path, e)),
        }
        lock(&inner.checked).remove(&id);
        inner.forget_reader(id);
        if inner.fsync
            && let Some(dir) = path.parent()
        {
            sync_dir(dir)?;
        }
        Ok(())
    }

    fn catalog(&self) -> Result<Option<CatalogTag>, PoolError> {
        let path = self.inner.root.join(CATALOG);
        let mut bytes = Vec::new();
        let limit = CatalogTag::MAX_LEN as u64 + 1;
        match File::open(&path).and_then(|f| f.take(limit).read_to_end(&mut bytes)) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(read_error("reading the pool's catalog record", &path, e)),
        }
        CatalogTag::parse(&bytes).map(Some).ok_or_else(|| {
            PoolError::Invalid(format!(
                "{} is damaged: it is not a catalog record (it names the catalog the pool \
                 belongs to; move it aside to have it written again)",
                path.display()
            ))
        })
    }

    fn set_catalog(&self, tag: &CatalogTag) -> Result<(), PoolError> {
        // Written aside, synced and renamed, as the descriptor: a crash leaves the old record
        // or the new one, never a torn one.
        let root = &self.inner.root;
        let (tmp, path) = (root.join(CATALOG_TMP), root.join(CATALOG));
        let _ = fs::remove_file(&tmp);
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&tag.to_bytes())?;
                if self.inner.fsync { f.sync_all() } else { Ok(()) }
            })
            .map_err(|e| write_error("writing the pool's catalog record", &tmp, e))?;
        fs::rename(&tmp, &path)
            .map_err(|e| write_error("writing the pool's catalog record", &path, e))?;
        if self.inner.fsync {
            sync_dir(root)?;
        }
        Ok(())
    }
}

/// The end of a scan of a container too short to hold its header.
fn no_header_end(size: u64) -> ScanEnd {
    ScanEnd {
        frames: 0,
        end: 0,
        size,
        stop: ScanStop::Stopped {
            detail: format!(
                "the container has only {size} of its {CONTAINER_HEADER_LEN} header bytes: its \
                 writer stopped before writing them, and it holds no frames"
            ),
        },
        trailer_damage: None,
    }
}

/// An open container of a writer.
#[derive(Debug)]
struct OpenContainer {
    pool: Arc<Inner>,
    id: ContainerId,
    path: PathBuf,
    file: BufWriter<File>,
    index: IndexBuilder,
    /// Set once the file is sealed or removed: dropping it then leaves it alone.
    closed: bool,
    /// Frames were appended since the last sync: a sync with nothing new costs no fsync.
    dirty: bool,
}

impl Drop for OpenContainer {
    fn drop(&mut self) {
        lock(&self.pool.open).remove(&self.id);
        // A container that never received a frame holds nothing anyone can reference; remove
        // it rather than leave an empty file behind. Errors cannot be reported from here, and
        // a leftover empty container is harmless.
        if !self.closed && self.index.is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The writer of a [`DirPool`].
#[derive(Debug)]
struct DirWriter {
    pool: Arc<Inner>,
    open: Option<OpenContainer>,
    /// The id of the last container opened, for `container()` when none is open.
    last: ContainerId,
    /// Directories whose entries changed (a container was created in them) since the last
    /// sync.
    dirs_to_sync: Vec<PathBuf>,
    /// The first error; after it the writer refuses to work.
    failed: FirstError,
}

impl DirWriter {
    fn check(&self) -> Result<(), PoolError> {
        self.failed.check(&self.pool.label, self.container())
    }

    /// Records the first error, which poisons the writer (after a failed fsync even the page
    /// cache cannot be trusted).
    fn fail(&mut self, e: PoolError) -> PoolError {
        self.failed.record(e)
    }

    /// Creates a container with a fresh random id and writes its header.
    fn open_new(&mut self) -> Result<(), PoolError> {
        let pool = Arc::clone(&self.pool);
        for _ in 0..16 {
            let id = random_container_id()?;
            let path = pool.container_path(id);
            let Some(dir) = path.parent().map(Path::to_path_buf) else { continue };
            match private_dir().create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(write_error("creating directory", &dir, e)),
            }
            // create_new: an id that exists is retried, never overwritten. Owner-only whatever
            // the umask or the pool directory's own mode: a container holds backed-up files.
            let created = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path);
            let mut file = match created {
                Ok(file) => file,
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(write_error("creating container", &path, e)),
            };
            let header = ContainerHeader { pool: pool.id, container: id, created: now_secs() };
            if let Err(e) = file.write_all(&header.to_bytes()) {
                // It holds no frame: remove it rather than leave a broken container behind.
                let _ = fs::remove_file(&path);
                return Err(write_error("writing container", &path, e));
            }
            lock(&pool.open).insert(id);
            let c = OpenContainer {
                pool: Arc::clone(&pool),
                id,
                path,
                file: BufWriter::with_capacity(WRITE_BUFFER, file),
                index: IndexBuilder::new(),
                closed: false,
                dirty: false,
            };
            // The new file's entry is in `dir`; `dir` itself may have just been created in the
            // containers directory, possibly by another writer that has not synced it yet, so
            // both are synced before any frame of this container counts as durable.
            for d in [dir, pool.root.join(CONTAINERS)] {
                if !self.dirs_to_sync.contains(&d) {
                    self.dirs_to_sync.push(d);
                }
            }
            self.last = id;
            self.open = Some(c);
            return Ok(());
        }
        let dir = pool.root.join(CONTAINERS);
        Err(PoolError::Io {
            op: "creating container in",
            path: dir,
            source: io::Error::new(
                ErrorKind::AlreadyExists,
                "16 random container ids in a row were taken: the random source is broken",
            ),
        })
    }

    fn sync_dirs(&mut self) -> Result<(), PoolError> {
        if self.pool.fsync {
            for dir in &self.dirs_to_sync {
                sync_dir(dir)?;
            }
        }
        self.dirs_to_sync.clear();
        Ok(())
    }

    fn sync_inner(&mut self) -> Result<(), PoolError> {
        if let Some(c) = self.open.as_mut().filter(|c| c.dirty) {
            c.file.flush().map_err(|e| write_error("writing container", &c.path, e))?;
            if self.pool.fsync {
                // fdatasync: the data and the file size, without the timestamps.
                c.file
                    .get_ref()
                    .sync_data()
                    .map_err(|e| write_error("syncing container", &c.path, e))?;
            }
            c.dirty = false;
        }
        self.sync_dirs()
    }

    /// Writes the index and trailer of the open container, syncs it and closes it.
    fn seal(&mut self) -> Result<(), PoolError> {
        let Some(mut c) = self.open.take() else { return Ok(()) };
        let tail = c.index.finish(c.id);
        c.file
            .write_all(&tail)
            .and_then(|()| c.file.flush())
            .map_err(|e| write_error("sealing container", &c.path, e))?;
        if self.pool.fsync {
            c.file
                .get_ref()
                .sync_data()
                .map_err(|e| write_error("syncing container", &c.path, e))?;
        }
        c.closed = true;
        drop(c);
        self.sync_dirs()
    }

    fn append_inner(
        &mut self,
        frame: &[u8],
        header: &[u8; FRAME_HEADER_LEN],
    ) -> Result<FrameLocation, PoolError> {
        let len = frame.len() as u64;
        let full = self.open.as_ref().is_none_or(|c| {
            !c.index.is_empty() && c.index.next_offset().saturating_add(len) > self.pool.target_size
        });
        if full {
            self.seal()?;
            self.open_new()?;
        }
        let Some(c) = &mut self.open else {
            return Err(PoolError::Invalid("internal error: no open container".into()));
        };
        let offset = c.index.next_offset();
        c.file.write_all(frame).map_err(|e| write_error("writing container", &c.path, e))?;
        c.index.push(header, len);
        c.dirty = true;
        // MAX_FRAME_LEN is far below u32::MAX.
        Ok(FrameLocation { container: c.id, offset, len: len as u32 })
    }
}

impl PoolWriter for DirWriter {
    fn container(&self) -> ContainerId {
        self.open.as_ref().map_or(self.last, |c| c.id)
    }

    fn append(&mut self, frame: &[u8]) -> Result<FrameLocation, PoolError> {
        self.check()?;
        let header = check_appended(&self.pool.label, frame)?;
        self.append_inner(frame, &header).map_err(|e| self.fail(e))
    }

    fn sync(&mut self) -> Result<(), PoolError> {
        self.check()?;
        self.sync_inner().map_err(|e| self.fail(e))
    }

    fn finish(mut self: Box<Self>) -> Result<(), PoolError> {
        self.check()?;
        let Some(c) = &mut self.open else { return Ok(()) };
        if c.index.is_empty() {
            fs::remove_file(&c.path)
                .map_err(|e| write_error("removing empty container", &c.path, e))?;
            c.closed = true;
            return Ok(());
        }
        self.seal().map_err(|e| self.fail(e))
    }
}

/// A file's modification time in Unix seconds, if the file system keeps one.
fn unix_seconds(m: &fs::Metadata) -> Option<i64> {
    let since = m.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_secs()).ok()
}
