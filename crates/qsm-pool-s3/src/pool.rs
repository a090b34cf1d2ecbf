//! [`S3Pool`]: creating and opening a pool, and the reading side of [`Pool`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use qsm_codec::FrameHeader;
use qsm_codec::frame::FRAME_HEADER_LEN;
use qsm_pool::container::{
    self, CONTAINER_HEADER_LEN, ContainerHeader, ForwardEnd, MAX_FRAME_LEN, MIN_SEALED_LEN, ReadAt,
    Sealing, TRAILER_LEN,
};
use qsm_pool::{
    AuditReport, CatalogTag, ContainerId, ContainerInfo, DEFAULT_TARGET_SIZE, FrameLocation,
    MIN_TARGET_SIZE, Pool, PoolError, PoolId, PoolWriter, ScanEnd, ScanStop,
};

use crate::client::{self, Client, is_not_found};
use crate::config::S3PoolConfig;
use crate::writer::S3Writer;
use qsm_pool::audit::ReadErrors;
pub(crate) use qsm_pool::descriptor::now_secs;
use qsm_pool::descriptor::{self, Descriptor};
use qsm_pool::frames::{Verifier, check_frame};

/// The largest container target size of an S3 pool: a writer holds its whole open container
/// in memory (S3 objects cannot be appended to), so this bounds a writer's memory.
pub const S3_MAX_TARGET_SIZE: u64 = 1 << 30;

const DESCRIPTOR: &str = "POOL";
/// The record of the pool's catalog ([`CatalogTag`]).
const CATALOG: &str = "CATALOG";
const CONTAINERS: &str = "containers";
/// Container ids whose header `read_frame` has verified, before the cache starts over.
const MAX_CHECKED: usize = 1 << 16;
/// Trailer reads of a listing in flight at once.
const LIST_CONCURRENCY: usize = 16;
/// Scans and audits read a container in ranged GETs that start at this size and double with
/// every further GET up to `READ_WINDOW_MAX`: a sealed scan reads little (header, trailer,
/// index), an audit or forward scan soon reads in large pieces.
const READ_WINDOW_MIN: usize = 16 << 10;
const READ_WINDOW_MAX: usize = 8 << 20;

/// A storage pool in an S3 bucket. Cloning it is cheap and shares its state (and its
/// connections and I/O threads).
#[derive(Debug, Clone)]
pub struct S3Pool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) id: PoolId,
    name: String,
    /// How errors name the pool: its name and location.
    pub(crate) label: String,
    pub(crate) target_size: u64,
    pub(crate) sync_seal_size: u64,
    /// Containers open in a writer of this process: `delete` refuses them.
    pub(crate) open: Mutex<HashSet<ContainerId>>,
    /// Containers whose header `read_frame` has verified, so that most reads are one GET.
    checked: Mutex<HashSet<ContainerId>>,
    /// Checksum verification, its decoders reused between reads.
    verifier: Verifier,
}

/// A poisoned lock only means another thread panicked while holding it; the sets guarded
/// here are valid after every single operation, so the data is still good.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn container_name(id: ContainerId) -> String {
    format!("{id:016x}")
}

impl S3Pool {
    /// Creates a new pool named `name` under `config.prefix` in `config.bucket` (which must
    /// exist, and hold nothing under the prefix) and returns it open. Its containers are sealed
    /// at `target_size` bytes ([`DEFAULT_TARGET_SIZE`] if `None`, at most
    /// [`S3_MAX_TARGET_SIZE`]). The descriptor object `PREFIX/POOL` is written with a
    /// put-if-absent, so of two servers creating the same pool at once exactly one succeeds.
    pub fn create(
        config: &S3PoolConfig,
        name: &str,
        target_size: Option<u64>,
    ) -> Result<S3Pool, PoolError> {
        descriptor::check_name(name)?;
        let target_size = target_size.unwrap_or(DEFAULT_TARGET_SIZE);
        if !(MIN_TARGET_SIZE..=S3_MAX_TARGET_SIZE).contains(&target_size) {
            return Err(PoolError::Invalid(format!(
                "container target size {target_size} is out of range for an S3 pool \
                 ({MIN_TARGET_SIZE} to {S3_MAX_TARGET_SIZE} bytes: a writer holds its open \
                 container in memory)"
            )));
        }
        let client = Client::new(config)?;
        let store = Arc::clone(&client.store);
        let prefix = client.prefix.clone();
        let listed = client.run("creating pool", &client.prefix, async move {
            store.list_with_delimiter(Some(&prefix)).await
        })?;
        let listed = listed.map_err(|e| client.error("creating pool", &client.prefix, e))?;
        if !listed.objects.is_empty() || !listed.common_prefixes.is_empty() {
            let pool = client.key(&[DESCRIPTOR]);
            let what = if listed.objects.iter().any(|o| o.location == pool) {
                "already a pool"
            } else {
                "not empty"
            };
            return Err(PoolError::Invalid(format!(
                "cannot create a pool at {}: the prefix is {what} (a pool is created under a \
                 new or empty prefix)",
                client.location
            )));
        }
        let descriptor = Descriptor::new(name, target_size)?;
        let key = client.key(&[DESCRIPTOR]);
        let (store, path) = (Arc::clone(&client.store), key.clone());
        let data = Bytes::from(descriptor.to_bytes());
        let put = client.run("writing pool descriptor", &key, async move {
            client::upload(store, path, data, true, 0).await
        })?;
        match put {
            Ok(()) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(PoolError::Invalid(format!(
                    "cannot create a pool at {}: another pool was created there at the same \
                     time",
                    client.location
                )));
            }
            Err(e) => return Err(client.error("writing pool descriptor", &key, e)),
        }
        S3Pool::open_with(client)
    }

    /// Opens the pool under `config.prefix` in `config.bucket`. A prefix without a `POOL`
    /// descriptor object is an error, never an empty pool.
    pub fn open(config: &S3PoolConfig) -> Result<S3Pool, PoolError> {
        S3Pool::open_with(Client::new(config)?)
    }

    fn open_with(client: Client) -> Result<S3Pool, PoolError> {
        let key = client.key(&[DESCRIPTOR]);
        let not_a_pool =
            |detail: String| PoolError::NotAPool { path: client.location.clone().into(), detail };
        let (store, path) = (Arc::clone(&client.store), key.clone());
        // One byte more than the longest descriptor tells a big object from a descriptor
        // without reading all of it.
        let limit = descriptor::MAX_LEN as u64 + 1;
        let got = client.run("reading pool descriptor", &key, async move {
            client::get_range(store, path, 0..limit).await
        })?;
        let bytes = match got {
            Ok((bytes, _)) => bytes,
            Err(e) if is_not_found(&e) => {
                // Some servers answer a GET in a missing bucket with NoSuchKey; listing tells.
                let (store, prefix) = (Arc::clone(&client.store), client.prefix.clone());
                let listed = client.run("opening pool", &client.prefix, async move {
                    store.list_with_delimiter(Some(&prefix)).await
                })?;
                listed.map_err(|e| client.error("opening pool", &client.prefix, e))?;
                return Err(not_a_pool(format!(
                    "there is no POOL descriptor object ({}); create a pool with S3Pool::create",
                    client.url(&key).display()
                )));
            }
            Err(e) => return Err(client.error("reading pool descriptor", &key, e)),
        };
        let descriptor = Descriptor::parse(&bytes).map_err(not_a_pool)?;
        let label = format!("'{}' ({})", descriptor.name, client.location);
        let sync_seal_size = client.sync_seal_size;
        Ok(S3Pool {
            inner: Arc::new(Inner {
                client,
                id: descriptor.id,
                name: descriptor.name,
                label,
                target_size: descriptor.target_size.min(S3_MAX_TARGET_SIZE),
                sync_seal_size,
                open: Mutex::default(),
                checked: Mutex::default(),
                verifier: Verifier::default(),
            }),
        })
    }

    /// Where the pool lives: `ENDPOINT/BUCKET/PREFIX` (or `s3://BUCKET/PREFIX`).
    pub fn location(&self) -> &str {
        &self.inner.client.location
    }

    /// The object key of container `id`.
    pub fn container_key(&self, id: ContainerId) -> String {
        self.inner.container_key(id).to_string()
    }

    /// The target size writers seal containers at.
    pub fn target_size(&self) -> u64 {
        self.inner.target_size
    }
}

/// A container opened for ranged reads: its size when opened, and the last range read.
///
/// A container object is only ever replaced by a longer version of itself (an unsealed
/// upload by a later sync's, or by the sealed container), so every byte below the size seen
/// when it was opened stays the same while it is read in several GETs.
struct ObjectReader<'a> {
    inner: &'a Inner,
    id: ContainerId,
    key: Path,
    size: u64,
    start: u64,
    block: Bytes,
    window: usize,
}

impl ReadAt for ObjectReader<'_> {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), PoolError> {
        if buf.is_empty() {
            // S3 has no empty ranges.
            return Ok(());
        }
        let len = buf.len() as u64;
        let end = offset.saturating_add(len);
        let block_end = self.start + self.block.len() as u64;
        if offset < self.start || end > block_end {
            let fetch_end = offset.saturating_add(self.window.max(buf.len()) as u64).min(self.size);
            if end > fetch_end {
                return Err(self.inner.io_error(
                    "reading container",
                    &self.key,
                    format!("a read of {len} bytes at {offset} runs past its end ({})", self.size),
                ));
            }
            let (block, _) = self.inner.get_range(self.id, &self.key, offset..fetch_end)?;
            if (block.len() as u64) < end - offset {
                return Err(self.inner.io_error(
                    "reading container",
                    &self.key,
                    format!(
                        "it shrank while being read (to {} bytes); it was replaced or damaged",
                        offset + block.len() as u64
                    ),
                ));
            }
            self.start = offset;
            self.block = block;
            self.window = (self.window * 2).min(READ_WINDOW_MAX);
        }
        let at = (offset - self.start) as usize;
        buf.copy_from_slice(&self.block[at..at + buf.len()]);
        Ok(())
    }
}

impl Inner {
    pub(crate) fn container_key(&self, id: ContainerId) -> Path {
        self.client.key(&[CONTAINERS, &container_name(id)])
    }

    fn not_found(&self, id: ContainerId) -> PoolError {
        PoolError::NotFound { pool: self.label.clone(), container: id }
    }

    pub(crate) fn io_error(&self, op: &'static str, key: &Path, detail: String) -> PoolError {
        PoolError::Io { op, path: self.client.url(key), source: std::io::Error::other(detail) }
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

    /// [`client::get_range`] of a container, with a missing object as `NotFound`.
    fn get_range(
        &self,
        id: ContainerId,
        key: &Path,
        range: std::ops::Range<u64>,
    ) -> Result<(Bytes, u64), PoolError> {
        let (store, path) = (Arc::clone(&self.client.store), key.clone());
        match self.client.run("reading container", key, client::get_range(store, path, range))? {
            Ok(got) => Ok(got),
            Err(e) if is_not_found(&e) => Err(self.not_found(id)),
            Err(e) => Err(self.client.error("reading container", key, e)),
        }
    }

    /// Opens container `id` for ranged reads. Its first GET (the header's region) also
    /// gives its size, so no HEAD is needed.
    fn open_reader(&self, id: ContainerId) -> Result<ObjectReader<'_>, PoolError> {
        let key = self.container_key(id);
        let (block, size) = self.get_range(id, &key, 0..READ_WINDOW_MIN as u64)?;
        Ok(ObjectReader {
            inner: self,
            id,
            key,
            size,
            start: 0,
            block,
            window: READ_WINDOW_MIN * 2,
        })
    }

    /// Verifies a container header, given the container's first `min(size, 48)` bytes: a
    /// container of this pool, with this id. An object too short to hold a header but
    /// starting like one holds no frames: `Ok(None)`.
    fn check_header(
        &self,
        start: &[u8],
        size: u64,
        id: ContainerId,
        chunk: Option<u64>,
    ) -> Result<Option<ContainerHeader>, PoolError> {
        if size < CONTAINER_HEADER_LEN as u64 {
            let n = start.len().min(4);
            if start[..n] == container::CONTAINER_MAGIC[..n] {
                return Ok(None);
            }
        }
        let header = ContainerHeader::parse(start)
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
                    "the header names container {:016x}: the object was renamed or copied here",
                    header.container
                ),
            ));
        }
        Ok(Some(header))
    }

    fn check_reader_header(
        &self,
        c: &mut ObjectReader<'_>,
    ) -> Result<Option<ContainerHeader>, PoolError> {
        let mut b = [0u8; CONTAINER_HEADER_LEN];
        let have = c.size.min(CONTAINER_HEADER_LEN as u64) as usize;
        c.read_at(0, &mut b[..have])?;
        self.check_header(&b[..have], c.size, c.id, None)
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
        let Some(end) = loc.offset.checked_add(len) else {
            return Err(corrupt("the location runs past the largest possible offset".into()));
        };
        let key = self.container_key(loc.container);
        if !lock(&self.checked).contains(&loc.container) {
            let (start, size) =
                self.get_range(loc.container, &key, 0..CONTAINER_HEADER_LEN as u64)?;
            if self.check_header(&start, size, loc.container, chunk)?.is_none() {
                return Err(corrupt("the container has no complete header".into()));
            }
            let mut checked = lock(&self.checked);
            if checked.len() >= MAX_CHECKED {
                checked.clear();
            }
            checked.insert(loc.container);
        }
        let (bytes, size) = self.get_range(loc.container, &key, loc.offset..end)?;
        if bytes.len() as u64 != len {
            return Err(corrupt(format!(
                "the frame of {len} bytes runs past the end of the container ({size} bytes): \
                 the container was truncated, or the location is wrong"
            )));
        }
        out.clear();
        out.extend_from_slice(&bytes);
        let header = if decode { self.verifier.verify(out) } else { check_frame(out) };
        header.map_err(|e| corrupt(e.to_string()))
    }

    /// Forward scan from `start`, mapping offsets to locations.
    fn forward(
        &self,
        c: &mut ObjectReader<'_>,
        start: u64,
        visit: &mut dyn FnMut(FrameLocation, &FrameHeader) -> Result<(), PoolError>,
    ) -> Result<ForwardEnd, PoolError> {
        let id = c.id;
        container::scan_forward(c, start, &mut |offset, header| {
            let loc = FrameLocation { container: id, offset, len: header.frame_len() as u32 };
            visit(loc, header)
        })
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
                "the container has only {size} of its {CONTAINER_HEADER_LEN} header bytes, and \
                 it holds no frames"
            ),
        },
        trailer_damage: None,
    }
}

/// Container `id` (object `path` of `size` bytes) as listed, or `None` if it is gone. Best
/// effort, as DirPool: one whose trailer cannot be read is listed as unsealed, and scanning or
/// auditing it says why.
async fn info(
    store: Arc<AmazonS3>,
    id: ContainerId,
    path: Path,
    size: u64,
    modified: Option<i64>,
) -> Option<ContainerInfo> {
    if size < MIN_SEALED_LEN {
        return Some(ContainerInfo { id, size, sealed: false, modified });
    }
    let range = size - TRAILER_LEN as u64..size;
    match client::get_range(store, path, range).await {
        Ok((t, _)) => Some(ContainerInfo { id, size, sealed: trailer_ok(&t, size, id), modified }),
        Err(e) if is_not_found(&e) => None,
        Err(_) => Some(ContainerInfo { id, size, sealed: false, modified }),
    }
}

/// Whether the `TRAILER_LEN` bytes `t` end a sealed container `id` of `size` bytes.
fn trailer_ok(t: &[u8], size: u64, id: ContainerId) -> bool {
    let mut trailer = [0u8; TRAILER_LEN];
    if t.len() != TRAILER_LEN {
        return false;
    }
    trailer.copy_from_slice(t);
    container::parse_trailer(&trailer, size, id).is_ok()
}

impl Pool for S3Pool {
    fn id(&self) -> PoolId {
        self.inner.id
    }

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn kind(&self) -> &'static str {
        "s3"
    }

    fn writer(&self) -> Result<Box<dyn PoolWriter>, PoolError> {
        Ok(Box::new(S3Writer::new(Arc::clone(&self.inner))?))
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
        let inner = &self.inner;
        let dir = inner.client.key(&[CONTAINERS]);
        let store = Arc::clone(&inner.client.store);
        let list_dir = dir.clone();
        // Any failed page fails the listing: a partial list would make containers look
        // deleted to reclamation and audits.
        let listed = inner.client.run("listing containers in", &dir, async move {
            store.list(Some(&list_dir)).try_collect::<Vec<_>>().await
        })?;
        let listed = listed.map_err(|e| inner.client.error("listing containers in", &dir, e))?;
        let dir_prefix = format!("{dir}/");
        let found: Vec<(ContainerId, Path, u64, Option<i64>)> = listed
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.as_ref().strip_prefix(&dir_prefix)?;
                let valid = name.len() == 16
                    && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                let id = u64::from_str_radix(name, 16).ok().filter(|_| valid)?;
                Some((id, meta.location, meta.size, Some(meta.last_modified.timestamp())))
            })
            .collect();
        let store = Arc::clone(&inner.client.store);
        // Best effort per container, as DirPool: one whose trailer cannot be read is listed
        // as unsealed, and scanning or auditing it says why; one deleted since the listing is
        // left out.
        let checked = inner.client.run("listing containers in", &dir, async move {
            futures::stream::iter(found)
                .map(|(id, path, size, modified)| {
                    info(Arc::clone(&store), id, path, size, modified)
                })
                .buffer_unordered(LIST_CONCURRENCY)
                .filter_map(|info| async move { info })
                .collect::<Vec<_>>()
                .await
        })?;
        let mut out = checked;
        out.sort_by_key(|info| info.id);
        Ok(out)
    }

    fn container(&self, id: ContainerId) -> Result<Option<ContainerInfo>, PoolError> {
        let inner = &self.inner;
        let key = inner.container_key(id);
        let store = Arc::clone(&inner.client.store);
        let path = key.clone();
        let head =
            inner.client.run("reading container", &key, async move { store.head(&path).await })?;
        let (size, modified) = match head {
            Ok(meta) => (meta.size, Some(meta.last_modified.timestamp())),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(inner.client.error("reading container", &key, e)),
        };
        let store = Arc::clone(&inner.client.store);
        let path = key.clone();
        inner.client.run("reading container", &key, info(store, id, path, size, modified))
    }

    fn scan(
        &self,
        id: ContainerId,
        visit: &mut dyn FnMut(FrameLocation, &FrameHeader) -> Result<(), PoolError>,
    ) -> Result<ScanEnd, PoolError> {
        let inner = &self.inner;
        let mut c = inner.open_reader(id)?;
        let size = c.size;
        if inner.check_reader_header(&mut c)?.is_none() {
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
        let fwd = inner.forward(&mut c, CONTAINER_HEADER_LEN as u64, visit)?;
        let stop = match fwd.stop {
            None => ScanStop::EndOfFile,
            Some(detail) => ScanStop::Stopped { detail },
        };
        Ok(ScanEnd { frames: fwd.frames, end: fwd.end, size, stop, trailer_damage })
    }

    fn audit(&self, id: ContainerId) -> Result<AuditReport, PoolError> {
        let inner = &self.inner;
        let mut c = inner.open_reader(id)?;
        let size = c.size;
        let report = AuditReport {
            container: id,
            frames_ok: 0,
            bytes_ok: 0,
            damaged: Vec::new(),
            end: no_header_end(size),
        };
        if inner.check_reader_header(&mut c)?.is_none() {
            return Ok(report);
        }
        // Unlike a disk's bad sector, a failed GET says nothing about the stored bytes, so it
        // ends the audit instead of being reported as damage.
        qsm_pool::audit::audit_frames(&mut c, id, &inner.verifier, ReadErrors::Fail, report)
    }

    fn delete(&self, id: ContainerId) -> Result<(), PoolError> {
        let inner = &self.inner;
        if lock(&inner.open).contains(&id) {
            return Err(PoolError::Busy { pool: inner.label.clone(), container: id });
        }
        let key = inner.container_key(id);
        let (store, path) = (Arc::clone(&inner.client.store), key.clone());
        // S3 answers a DELETE of a missing key with success; the trait's contract (and
        // reclamation's bookkeeping) wants NotFound, so a HEAD comes first. Two deletes racing
        // may both succeed.
        let result = inner.client.run("deleting container", &key, async move {
            store.head(&path).await?;
            store.delete(&path).await
        })?;
        match result {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => return Err(inner.not_found(id)),
            Err(e) => return Err(inner.client.error("deleting container", &key, e)),
        }
        lock(&inner.checked).remove(&id);
        Ok(())
    }

    fn catalog(&self) -> Result<Option<CatalogTag>, PoolError> {
        let client = &self.inner.client;
        let key = client.key(&[CATALOG]);
        let (store, path) = (Arc::clone(&client.store), key.clone());
        let limit = CatalogTag::MAX_LEN as u64 + 1;
        let got = client.run("reading the pool's catalog record", &key, async move {
            client::get_range(store, path, 0..limit).await
        })?;
        let bytes = match got {
            Ok((bytes, _)) => bytes,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(client.error("reading the pool's catalog record", &key, e)),
        };
        CatalogTag::parse(&bytes).map(Some).ok_or_else(|| {
            PoolError::Invalid(format!(
                "{} is damaged: it is not a catalog record (it names the catalog the pool \
                 belongs to; delete it to have it written again)",
                client.url(&key).display()
            ))
        })
    }

    fn set_catalog(&self, tag: &CatalogTag) -> Result<(), PoolError> {
        // One small PUT: S3 replaces an object whole, never leaving a torn one.
        let client = &self.inner.client;
        let key = client.key(&[CATALOG]);
        let (store, path) = (Arc::clone(&client.store), key.clone());
        let data = Bytes::from(tag.to_bytes());
        let put = client.run("writing the pool's catalog record", &key, async move {
            client::upload(store, path, data, false, 0).await
        })?;
        put.map_err(|e| client.error("writing the pool's catalog record", &key, e))
    }
}
