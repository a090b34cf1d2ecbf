//! # qsm-store: the commit protocol between the storage pool and the catalog
//!
//! A backed-up object is bytes in the pool and records in the catalog. This crate is the only
//! place that writes both, and it always does so in this order (`docs/FORMAT.md`, "Commit
//! protocol", section 8.1):
//!
//! 1. frames are appended to the pool by a [`Batch`]'s writer;
//! 2. [`Batch::commit`] makes them durable ([`qsm_pool::PoolWriter::sync`]: fsync of the
//!    containers and, for new ones, of their directory);
//! 3. only then does one catalog transaction record the containers, chunks and object versions
//!    (and deactivate the versions they replace); nothing is visible before it commits.
//!
//! So a crash at any instant leaves every committed version restorable, and at most frames
//! that no catalog record points to, which [`Store::reclaim`] and [`Store::remove_orphans`]
//! remove. Reclamation keeps the same order: live frames are copied and synced first, the
//! catalog is repointed in one transaction, and the old container is deleted last.
//!
//! A transaction groups objects up to [`TxnLimits`] (TSM's `txngroupmax` and `txnbytelimit`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use qsm_catalog::{
    Catalog, CatalogError, ChunkKey, ContainerId, Coordination, DedupScopeId, FilespaceId,
    NewChunk, NewObject, ObjectChunk, ObjectId, PoolId, ServerId, Timestamp,
};
use qsm_codec::{FrameDecoder, FrameHeader};
use qsm_pool::{FrameLocation, Pool, PoolError, PoolWriter};

/// An error of the store: the pool's or the catalog's, or a broken invariant between them.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The pool failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A frame handed to a batch is not a valid frame.
    #[error("object {path}: frame {index} is invalid: {detail}")]
    BadFrame {
        /// Object path (lossy UTF-8).
        path: String,
        /// Frame number within the object.
        index: usize,
        /// What is wrong.
        detail: String,
    },
    /// A chunk referenced by id is not stored (any more) in the node's dedup scope.
    #[error(
        "object {path}: chunk {index} references stored chunk {hash}, which the server does not hold (any more); back up again"
    )]
    UnknownChunk {
        /// Object path (lossy UTF-8).
        path: String,
        /// Chunk number within the object.
        index: usize,
        /// The chunk's keyed id, in hex.
        hash: String,
    },
    /// Writing restored data failed.
    #[error("writing restored data: {0}")]
    Output(std::io::Error),
    /// The catalog names a pool that is not where it should be.
    #[error("{0}")]
    MissingPool(String),
    /// The pool holds containers, but the catalog has no record of the pool: it is a new
    /// catalog, or another pool's. Opening would make every container an orphan.
    #[error(
        "the storage pool {pool} holds {containers} containers ({bytes} bytes){}, but the catalog {catalog} does not know this pool: it is a new catalog, or another pool's. Nothing was changed. Use the pool's own catalog (check --catalog or QSM_HOME), or restore it from a catalog backup (`qsm server --data-dir DIR restore-db`)",
        recorded.as_ref().map(|t| format!(" written under catalog {} ({})", t.id, t.location)).unwrap_or_default()
    )]
    ForeignCatalog {
        /// The pool: name and id.
        pool: String,
        /// Containers it holds.
        containers: u64,
        /// Their bytes.
        bytes: u64,
        /// The catalog the pool last recorded, if any.
        recorded: Option<qsm_pool::CatalogTag>,
        /// The catalog that was refused.
        catalog: String,
    },
    /// Containers the catalog does not know may hold data newer than it.
    #[error(
        "the catalog was restored from a copy (at {0}, seconds since the epoch): containers it does not know may hold the data of later backups, so none is deleted; run `qsm admin audit stgpool`, then `qsm admin audit stgpool --release-unknown` to let reclamation delete them"
    )]
    Restored(i64),
}

mod audit;
mod local;
mod owner;
pub use audit::{AuditOptions, AuditReport, DamagedChunk, RESTORED_AT};
pub use local::{open_catalog, open_local, open_with_pool};
pub use owner::{CATALOG_ID, INCARNATION, incarnation, renew_incarnation};

/// Result of store operations.
pub type Result<T> = std::result::Result<T, StoreError>;

pub use qsm_types::TxnLimits;

/// A pool with the catalog that indexes it.
#[derive(Debug)]
pub struct Store {
    catalog: Arc<dyn Catalog>,
    pool: Arc<dyn Pool>,
    pool_record: PoolId,
    /// Containers open for appending in this process: reclamation and orphan removal leave
    /// them alone. A server sharing its catalog and pool with others also leases them in the
    /// catalog ([`Store::hold_leases`]), so the others leave them alone too.
    open: Mutex<HashSet<ContainerId>>,
    /// The server this store leases its open containers for, and the lease's term (seconds).
    leases: std::sync::OnceLock<(ServerId, i64)>,
    /// Held shared by every append and exclusively by orphan removal: a writer rolling over
    /// creates its new container inside `append`, before it can register it as open, and
    /// orphan removal must not see that container in between.
    appending: RwLock<()>,
    /// What the operator should hear about the store as it was opened.
    warnings: Vec<String>,
}

/// Containers that may be being written, for reclamation, orphan removal and audits.
#[derive(Debug)]
struct Busy {
    /// Open in this process.
    here: HashSet<ContainerId>,
    /// Leased by a live server sharing the catalog (this one included).
    leased: HashSet<ContainerId>,
    /// On a shared catalog, the time (Unix seconds) after which a container last written may
    /// belong to a writer that has not leased it yet.
    recent: Option<i64>,
}

impl Busy {
    /// Whether a container, sealed or not, last written at `modified`, may be being written.
    /// A sealed container never changes again, whoever wrote it.
    fn writing(&self, id: ContainerId, sealed: bool, modified: Option<i64>) -> bool {
        self.here.contains(&id)
            || (!sealed
                && (self.leased.contains(&id)
                    || self.recent.is_some_and(|r| modified.is_none_or(|m| m >= r))))
    }

    /// Whether a container is open here or leased by a live server: what an audit, which
    /// deletes nothing, leaves out of its report.
    fn held(&self, id: ContainerId) -> bool {
        self.here.contains(&id) || self.leased.contains(&id)
    }
}

/// What one commit recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// The object versions, in the order they were added.
    pub objects: Vec<ObjectId>,
    /// Bytes of frames they hold.
    pub bytes: u64,
}

impl Store {
    /// A store over `pool`, recorded in `catalog` (at `location`, for messages and the pool's
    /// record of it) under the pool's name. A pool the catalog does not know is recorded if it
    /// holds nothing, and refused if it holds containers (module `owner`).
    pub fn new(catalog: Arc<dyn Catalog>, pool: Arc<dyn Pool>, location: &str) -> Result<Store> {
        let existing = catalog.pools()?.into_iter().find(|p| p.name == pool.name());
        let pool_record = match existing {
            // The same name must be the same pool: another pool under a known name would let
            // the catalog point at containers that are not there.
            Some(p) if p.location != pool.id().to_string() => {
                return Err(StoreError::Catalog(CatalogError::Refused(format!(
                    "storage pool {:?} has id {}, but the catalog recorded {} for that name",
                    pool.name(),
                    pool.id(),
                    p.location
                ))));
            }
            Some(p) => p.id,
            // The pool's own id (its Display form, 32 hex digits) ties the record to the pool.
            None => {
                owner::refuse_if_holding(pool.as_ref(), location)?;
                catalog.define_pool(pool.name(), pool.kind(), &pool.id().to_string())?
            }
        };
        owner::claim(catalog.as_ref(), pool.as_ref(), location)?;
        Ok(Store {
            catalog,
            pool,
            pool_record,
            open: Mutex::new(HashSet::new()),
            leases: std::sync::OnceLock::new(),
            appending: RwLock::new(()),
            warnings: Vec::new(),
        })
    }

    /// Warnings about the store as it was opened (a pool directory others can read, say),
    /// for the server's log and the client's stderr.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<dyn Pool> {
        &self.pool
    }

    fn open_set(&self) -> std::sync::MutexGuard<'_, HashSet<ContainerId>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes this store lease the containers it writes to `server` (for `term` seconds, renewed
    /// by the server's heartbeat), so that other servers on the same catalog and pool never
    /// take them for orphans; and lets it remove orphans and reclaim unsealed containers on a
    /// shared catalog, once no live server leases them.
    pub fn hold_leases(&self, server: ServerId, term: i64) {
        let _ = self.leases.set((server, term));
    }

    /// The containers open for appending in this process (for the server's heartbeat).
    pub fn open_containers(&self) -> Vec<ContainerId> {
        self.open_set().iter().copied().collect()
    }

    /// Registers container `id` as open in this process, and leases it if this store holds
    /// leases. A lease that cannot be written fails the write: without it, another server's
    /// orphan removal could delete the container.
    fn opened(&self, id: ContainerId) -> Result<()> {
        self.open_set().insert(id);
        if let Some((server, _)) = self.leases.get() {
            self.catalog.lease_container(*server, id)?;
        }
        Ok(())
    }

    /// What may be being written: see [`Busy`]. `None` when the catalog is shared but this
    /// store holds no leases: it cannot know what other servers write. A store without leases
    /// on a catalog of its own (the embedded store) is the pool's only writer.
    fn busy(&self) -> Result<Option<Busy>> {
        let here = self.open_set().clone();
        // A server always goes by leases: servers with data directories of their own can
        // share a SQLite catalog and a pool directory too, and nothing stops them.
        match self.leases.get() {
            Some((_, term)) => {
                let leased = self.catalog.leased_containers()?;
                Ok(Some(Busy { here, leased, recent: Some(qsm_catalog::now() - term) }))
            }
            None if self.catalog.is_shared() => Ok(None),
            None => Ok(Some(Busy { here, leased: HashSet::new(), recent: None })),
        }
    }

    /// Starts a batch of objects with its own pool writer.
    pub fn batch(&self, limits: TxnLimits) -> Result<Batch<'_>> {
        let appending = self.appending.read().unwrap_or_else(PoisonError::into_inner);
        let writer = self.pool.writer()?;
        self.opened(ContainerId(writer.container()))?;
        drop(appending);
        let mine = HashSet::from([writer.container()]);
        Ok(Batch {
            store: self,
            writer: Some(writer),
            pending: Vec::new(),
            deactivations: Vec::new(),
            bytes: 0,
            limits,
            touched: BTreeMap::new(),
            mine,
            recorded: HashSet::new(),
            sealed: HashSet::new(),
            current: None,
            appended: HashMap::new(),
        })
    }

    /// Reads the frame of `chunk` into `out` without decoding it (whoever decodes it verifies
    /// its checksum then): one ranged read, its header checked against the catalog's record.
    pub fn read_chunk(
        &self,
        chunk: &qsm_catalog::ChunkRef,
        out: &mut Vec<u8>,
    ) -> std::result::Result<FrameHeader, PoolError> {
        self.pool.read_frame_for_decode(&location(&chunk.location), Some(chunk.id.0 as u64), out)
    }

    /// Writes the data of object `id` to `out`, reading each frame with one ranged read and
    /// verifying it (the pool checks it, and decoding checks the data checksum again).
    pub fn restore(&self, id: ObjectId, out: &mut dyn Write) -> Result<u64> {
        let mut decoder = FrameDecoder::new();
        let (mut frame, mut raw) = (Vec::new(), Vec::new());
        let mut written = 0u64;
        for chunk in self.catalog.object_chunks(id)? {
            let loc = location(&chunk.location);
            // The decode below verifies the data checksum: the pool need not decode too.
            let header = self.read_chunk(&chunk, &mut frame)?;
            decoder.decode(&frame[..header.frame_len()], &mut raw).map_err(|e| {
                PoolError::Corrupt {
                    pool: self.pool.name().to_owned(),
                    container: loc.container,
                    offset: loc.offset,
                    chunk: Some(chunk.id.0 as u64),
                    detail: e.to_string(),
                }
            })?;
            out.write_all(&raw[..header.raw_len as usize]).map_err(StoreError::Output)?;
            written += u64::from(header.raw_len);
        }
        Ok(written)
    }

    /// The full consistency check: the catalog's own invariants, then every chunk it
    /// references read back from the pool with a valid checksum. Problems are listed, not
    /// stopped at.
    pub fn check(&self) -> Result<CheckReport> {
        let catalog = self.catalog.check()?;
        let mut report =
            CheckReport { problems: catalog.problems.clone(), catalog, ..CheckReport::default() };
        let mut frame = Vec::new();
        for container in self.catalog.containers(self.pool_record)? {
            for chunk in self.catalog.chunks_in_container(container.id)? {
                report.chunks_read += 1;
                if let Err(e) = self.pool.read_frame(
                    &location(&chunk.location),
                    Some(chunk.id.0 as u64),
                    &mut frame,
                ) {
                    report.problems.push(e.to_string());
                }
            }
        }
        Ok(report)
    }

    /// Rewrites every container (not open in this process) whose live bytes fell below
    /// `threshold` of its size: live frames are copied to a new container and synced, the
    /// catalog is repointed and dead chunks dropped in one transaction, then the old container
    /// is deleted. Returns the containers reclaimed.
    pub fn reclaim(&self, threshold: f64) -> Result<Vec<ContainerId>> {
        self.reclaim_until(threshold, &std::sync::atomic::AtomicBool::new(false))
    }

    /// [`Store::reclaim`], stopping before the next container once `stop` is set (what was
    /// reclaimed stays reclaimed: each container is its own transaction). Refused after a
    /// catalog restore until an audit released the data the catalog does not know.
    pub fn reclaim_until(
        &self,
        threshold: f64,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<Vec<ContainerId>> {
        // After a catalog restore, a container may hold frames written after the copy past
        // its recorded end: rewriting it would drop them before an audit has reported them.
        self.check_not_restored()?;
        // With a shared catalog another server may be appending to an unsealed container: it
        // is left alone while leased or recently written, and always without leases to go
        // by. A sealed one never changes again, whoever wrote it.
        //
        // The catalog is listed before what is being written is: a container reaches the
        // catalog only through a commit of its writer, which registered (and leased) it first,
        // so every container listed that is still being written is seen as such. The other
        // order let a backup start a container after the snapshot and commit into it before
        // the listing: reclamation took it for idle and deleted it under the writer.
        let known = self.catalog.containers(self.pool_record)?;
        let listed: BTreeMap<u64, (u64, bool, Option<i64>)> = self
            .pool
            .containers()?
            .into_iter()
            .map(|c| (c.id, (c.size, c.sealed, c.modified)))
            .collect();
        let busy = self.busy()?;
        let mut reclaimed = Vec::new();
        for container in known {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let Some(&(size, sealed, modified)) = listed.get(&container.id.0) else { continue };
            let writing = match &busy {
                Some(busy) => busy.writing(container.id, sealed, modified),
                None => !sealed,
            };
            if writing {
                continue;
            }
            let chunks = self.catalog.chunks_in_container(container.id)?;
            let live: Vec<_> = chunks.iter().filter(|c| c.refcount > 0).collect();
            let live_bytes: u64 = live.iter().map(|c| u64::from(c.location.stored_len)).sum();
            if size == 0 || live_bytes as f64 >= threshold * size as f64 {
                continue;
            }
            let moved = if live.is_empty() {
                Vec::new() // nothing to copy: no new container either
            } else {
                let mut writer = self.pool.writer()?;
                // Registered as open, so orphan removal leaves it alone until committed.
                self.opened(ContainerId(writer.container()))?;
                let locations: Vec<FrameLocation> =
                    live.iter().map(|c| location(&c.location)).collect();
                let moved = qsm_pool::copy_frames(self.pool.as_ref(), &locations, writer.as_mut())?;
                writer.finish()?;
                moved
            };
            // The copies are sealed: recorded at their whole size, index and trailer
            // included, as a batch records the containers it seals (else every audit reports
            // the index as bytes past the catalog's record).
            let mut ends = container_ends(&moved);
            for (id, end) in ends.iter_mut() {
                if let Some(info) = self.pool.container(*id)?.filter(|i| i.sealed) {
                    *end = info.size;
                }
            }
            let committed = (|| -> Result<()> {
                let mut t = self.catalog.begin()?;
                for new in &moved {
                    t.add_container(self.pool_record, ContainerId(new.container))?;
                }
                for (chunk, new) in live.iter().zip(&moved) {
                    let from = (chunk.location.container, chunk.location.offset);
                    t.move_chunk(chunk.id, from, ContainerId(new.container), new.offset)?;
                }
                for dead in chunks.iter().filter(|c| c.refcount == 0) {
                    t.delete_chunk(dead.id)?;
                }
                for (&id, &end) in &ends {
                    t.set_container(ContainerId(id), end, true)?;
                }
                t.delete_container(container.id)?;
                t.commit()?;
                Ok(())
            })();
            // Committed or not, the copy is no longer being written: if the commit was refused
            // (a chunk listed dead was referenced again meanwhile), it is an orphan that
            // `remove_orphans` may delete.
            {
                let mut open = self.open_set();
                for new in &moved {
                    open.remove(&ContainerId(new.container));
                }
            }
            committed?;
            self.pool.delete(container.id.0)?;
            reclaimed.push(container.id);
        }
        Ok(reclaimed)
    }

    /// Repairs damaged chunks with good copies of their frames (from a replica): the frames
    /// are written to new containers, recorded sealed, then each chunk is pointed at its copy
    /// and its damage cleared, with that of the versions it leaves whole
    /// ([`Catalog::repair_chunk`]). Returns the chunks repaired; one that moved or was
    /// repaired meanwhile is left, its copy dead space for reclamation.
    pub fn repair_chunks(&self, good: &[Repair]) -> Result<Vec<qsm_catalog::ChunkRowId>> {
        if good.is_empty() {
            return Ok(Vec::new());
        }
        let mut writer = self.pool.writer()?;
        let mut written = Vec::with_capacity(good.len());
        let mut opened = HashSet::new();
        // Every container the writer opens (it rolls over at its target size) is open until
        // recorded, so orphan removal leaves it alone.
        let appended = (|| -> Result<()> {
            for r in good {
                let at = writer.append(&r.frame)?;
                if opened.insert(at.container) {
                    self.opened(ContainerId(at.container))?;
                }
                written.push(at);
            }
            Ok(())
        })();
        let finished = appended.and_then(|()| writer.finish().map_err(StoreError::from));
        let recorded = finished.and_then(|()| {
            let mut ends = container_ends(&written);
            for (id, end) in ends.iter_mut() {
                if let Some(info) = self.pool.container(*id)?.filter(|i| i.sealed) {
                    *end = info.size;
                }
            }
            let mut t = self.catalog.begin()?;
            for (&id, &end) in &ends {
                t.add_container(self.pool_record, ContainerId(id))?;
                t.set_container(ContainerId(id), end, true)?;
            }
            t.commit()?;
            Ok(())
        });
        {
            let mut open = self.open_set();
            for id in &opened {
                open.remove(&ContainerId(*id));
            }
        }
        recorded?;
        let mut repaired = Vec::new();
        for (r, at) in good.iter().zip(&written) {
            let to = NewChunk {
                container: ContainerId(at.container),
                offset: at.offset,
                stored_len: at.len,
                raw_len: r.chunk.location.raw_len,
                codec: r.codec,
            };
            let from = (r.chunk.location.container, r.chunk.location.offset);
            if self.catalog.repair_chunk(r.chunk.id, from, &to, &r.users)? {
                repaired.push(r.chunk.id);
            }
        }
        Ok(repaired)
    }

    /// Deletes containers the pool holds but the catalog does not know, that are not open in
    /// this process: the leftovers of a crash between sync and catalog commit, or between a
    /// reclamation's commit and its delete. Only call it when no other process writes to the
    /// pool. Refused after a catalog restore until an audit released the unknown containers
    /// ([`AuditOptions::release_unknown`]). Returns the containers deleted.
    ///
    /// With a shared catalog ([`Catalog::is_shared`]: several servers on one pool) a container
    /// another server is writing, or has sealed but not yet committed, looks exactly like an
    /// orphan from here: it is deleted only once no live server leases it and it was last
    /// written more than a lease term ago (a server that crashed: its lease lapsed). Without
    /// leases ([`Store::hold_leases`]) nothing is deleted on a shared catalog.
    pub fn remove_orphans(&self) -> Result<Vec<u64>> {
        self.check_not_restored()?;
        // Pool first, then the catalog, then the open set and leases: a container created
        // after the pool listing is not considered, and one committed or opened before the
        // later snapshots is seen as known or open.
        let _no_appends = self.appending.write().unwrap_or_else(PoisonError::into_inner);
        let listed = self.pool.containers()?;
        let known: HashSet<u64> =
            self.catalog.containers(self.pool_record)?.iter().map(|c| c.id.0).collect();
        let Some(busy) = self.busy()? else { return Ok(Vec::new()) };
        let mut removed = Vec::new();
        for c in listed {
            // Sealed or not: a container sealed but not yet committed is no orphan either.
            let id = ContainerId(c.id);
            if !known.contains(&c.id) && !busy.writing(id, false, c.modified) {
                self.pool.delete(c.id)?;
                removed.push(c.id);
            }
        }
        Ok(removed)
    }
}

fn deactivate(
    t: &mut dyn qsm_catalog::Txn,
    fs: FilespaceId,
    path: &[u8],
    tree: bool,
    now: Timestamp,
) -> Result<()> {
    if tree {
        t.deactivate_tree(fs, path, now)?;
    } else {
        t.deactivate(fs, path, now)?;
    }
    Ok(())
}

/// Lower-case hex of `bytes`, for messages.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The largest end offset written in each container.
fn container_ends(locations: &[FrameLocation]) -> BTreeMap<u64, u64> {
    let mut ends = BTreeMap::new();
    for l in locations {
        let end = ends.entry(l.container).or_insert(0);
        *end = (*end).max(l.offset + u64::from(l.len));
    }
    ends
}

fn location(chunk: &NewChunk) -> FrameLocation {
    FrameLocation { container: chunk.container.0, offset: chunk.offset, len: chunk.stored_len }
}

/// A good copy of a damaged chunk's frame, for [`Store::repair_chunks`].
#[derive(Debug, Clone)]
pub struct Repair {
    /// The damaged chunk, as the catalog has it.
    pub chunk: qsm_catalog::ChunkRef,
    /// The copy, verified by the caller to hold the chunk's data.
    pub frame: Vec<u8>,
    /// The copy's codec, from its header.
    pub codec: u16,
    /// The versions using the chunk: those it leaves whole are whole again.
    pub users: Vec<ObjectId>,
}

/// What [`Store::check`] found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// The catalog's own check.
    pub catalog: qsm_catalog::ConsistencyReport,
    /// Chunks read back from the pool.
    pub chunks_read: u64,
    /// Every problem found, catalog's and pool's.
    pub problems: Vec<String>,
}

/// Objects on their way into the store: frames go to the pool at once, records to the
/// catalog at [`Batch::commit`], which also happens by itself when the limits are reached.
/// Dropping a batch without committing loses only its uncommitted objects.
pub struct Batch<'s> {
    store: &'s Store,
    writer: Option<Box<dyn PoolWriter>>,
    pending: Vec<NewObject>,
    /// Deactivations, each with the number of objects queued before it: they are applied in
    /// the order they were asked for, relative to the inserts, so "deactivate p, then back up
    /// p" leaves p's new version active.
    deactivations: Vec<(usize, FilespaceId, Vec<u8>, bool)>,
    bytes: u64,
    limits: TxnLimits,
    /// Containers written since the last commit, with the end of the last frame in each.
    touched: BTreeMap<u64, u64>,
    /// Every container this batch's writer opened (it rolls over at the target size).
    mine: HashSet<u64>,
    /// The containers this batch's commits recorded in the catalog.
    recorded: HashSet<u64>,
    /// The containers the writer filled and sealed whose seal a commit recorded.
    sealed: HashSet<u64>,
    /// The object whose frames are being appended, if any.
    current: Option<NewObject>,
    /// Shared chunks appended but not yet committed in an object, by keyed id, so later
    /// objects of this batch can reference them: those of pending objects until their commit,
    /// those of abandoned objects (whose frames are in the pool all the same) for the batch's
    /// life.
    appended: HashMap<([u8; 32], bool), NewChunk>,
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("pending", &self.pending.len())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Batch<'_> {
    fn writer(&mut self) -> Result<&mut Box<dyn PoolWriter>> {
        if self.writer.is_none() {
            return Err(self.misuse("batch used after finish"));
        }
        self.writer.as_mut().ok_or_else(|| StoreError::Pool(PoolError::Invalid("no writer".into())))
    }

    /// Adds an object whose frames are all at hand (complete frames from
    /// `qsm_codec::FrameEncoder`, in order); `object.chunks` is replaced by them. Commits first
    /// if the batch is full; returns what that commit recorded.
    pub fn add(
        &mut self,
        object: NewObject,
        frames: &[&[u8]],
        now: Timestamp,
    ) -> Result<Option<Committed>> {
        let size: u64 = frames.iter().map(|f| f.len() as u64).sum();
        let committed = self.begin_object(object, size, now)?;
        for frame in frames {
            self.append_frame(frame)?;
        }
        self.end_object()?;
        Ok(committed)
    }

    /// Starts an object whose frames will follow through [`Batch::append_frame`], so a file of
    /// any size streams through without being held in memory. `size_hint` (the bytes expected)
    /// decides whether the batch commits first to stay within its byte limit.
    pub fn begin_object(
        &mut self,
        mut object: NewObject,
        size_hint: u64,
        now: Timestamp,
    ) -> Result<Option<Committed>> {
        if self.current.is_some() {
            return Err(self.misuse("an object was begun before the previous one ended"));
        }
        let full = self.pending.len() >= self.limits.group_max
            || self.bytes.saturating_add(size_hint) > self.limits.byte_limit;
        let committed =
            if !self.pending.is_empty() && full { Some(self.commit(now)?) } else { None };
        object.chunks.clear();
        self.current = Some(object);
        Ok(committed)
    }

    /// Appends the next frame of the current object to the pool; the length of the raw data
    /// its header describes (checked here, so callers need not parse it again).
    pub fn append_frame(&mut self, frame: &[u8]) -> Result<u32> {
        self.append(frame, None)
    }

    /// Appends the next frame of the current object, a chunk with its keyed id: offered for
    /// deduplication in `key.scope` (if any) once committed, and checked by restore. Whether
    /// it is sealed is read from the frame, whatever `key.sealed` says. Returns the raw
    /// length, as [`Batch::append_frame`] does.
    pub fn append_chunk(&mut self, frame: &[u8], key: ChunkKey) -> Result<u32> {
        self.append(frame, Some(key))
    }

    /// The next chunk of the current object is the stored chunk `hash` of `scope`: committed
    /// and referenced, or appended earlier in this batch (an object abandoned after sending it
    /// still left its frame in the pool). Errors if neither holds, so a client's stale belief
    /// fails the backup rather than the restore.
    pub fn reference_chunk(
        &mut self,
        hash: [u8; 32],
        scope: DedupScopeId,
        sealed: bool,
    ) -> Result<()> {
        let Some(object) = &self.current else {
            return Err(self.misuse("a chunk was referenced outside an object"));
        };
        let chunk = match self.appended.get(&(hash, sealed)) {
            Some(at) => ObjectChunk::Keyed(*at, ChunkKey { hash, scope: Some(scope), sealed }),
            None => match self.store.catalog.find_chunks(scope, sealed, &[hash])?.first() {
                Some(Some(id)) => ObjectChunk::Existing(*id),
                _ => {
                    return Err(StoreError::UnknownChunk {
                        path: String::from_utf8_lossy(&object.path).into_owned(),
                        index: object.chunks.len(),
                        hash: hex(&hash),
                    });
                }
            },
        };
        if let Some(object) = &mut self.current {
            object.chunks.push(chunk);
        }
        Ok(())
    }

    fn append(&mut self, frame: &[u8], key: Option<ChunkKey>) -> Result<u32> {
        let Some(object) = &self.current else {
            return Err(self.misuse("a frame was appended outside an object"));
        };
        let path = String::from_utf8_lossy(&object.path).into_owned();
        let index = object.chunks.len();
        let header = FrameHeader::parse(frame).map_err(|e| StoreError::BadFrame {
            path: path.clone(),
            index,
            detail: e.to_string(),
        })?;
        if frame.len() != header.frame_len() {
            return Err(StoreError::BadFrame {
                path,
                index,
                detail: format!(
                    "{} bytes, but its header describes {}",
                    frame.len(),
                    header.frame_len()
                ),
            });
        }
        let store = self.store;
        let appending = store.appending.read().unwrap_or_else(PoisonError::into_inner);
        let loc = self.writer()?.append(frame)?;
        if self.mine.insert(loc.container) {
            store.opened(ContainerId(loc.container))?;
        }
        drop(appending);
        let end = self.touched.entry(loc.container).or_insert(0);
        *end = (*end).max(loc.offset + u64::from(loc.len));
        self.bytes += frame.len() as u64;
        let at = NewChunk {
            container: ContainerId(loc.container),
            offset: loc.offset,
            stored_len: loc.len,
            raw_len: header.raw_len,
            codec: header.codec,
        };
        let key = key.map(|k| ChunkKey { sealed: header.is_sealed(), ..k });
        if let Some(key) = key.filter(|k| k.scope.is_some()) {
            self.appended.insert((key.hash, key.sealed), at);
        }
        if let Some(object) = &mut self.current {
            object.chunks.push(match key {
                Some(key) => ObjectChunk::Keyed(at, key),
                None => ObjectChunk::New(at),
            });
        }
        Ok(header.raw_len)
    }

    /// Ends the current object: it joins the next commit.
    pub fn end_object(&mut self) -> Result<()> {
        let object =
            self.current.take().ok_or_else(|| self.misuse("end_object without an object"))?;
        self.pending.push(object);
        Ok(())
    }

    /// Drops the current object (its file vanished or failed mid-read). Its frames stay in
    /// the pool unreferenced, for reclamation.
    pub fn abandon_object(&mut self) {
        self.current = None;
    }

    fn misuse(&self, what: &str) -> StoreError {
        StoreError::Pool(PoolError::Invalid(format!("pool {}: {what}", self.store.pool.name())))
    }

    /// Queues the deactivation of the active version of `path` (deleted on the client).
    pub fn deactivate(&mut self, filespace: FilespaceId, path: &[u8]) {
        self.deactivations.push((self.pending.len(), filespace, path.to_vec(), false));
    }

    /// Queues the deactivation of the active versions of everything below `path` (a
    /// directory's contents gone from the client).
    pub fn deactivate_tree(&mut self, filespace: FilespaceId, path: &[u8]) {
        self.deactivations.push((self.pending.len(), filespace, path.to_vec(), true));
    }

    /// Objects waiting for the next commit.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The commit protocol: sync the pool, then record everything in one catalog transaction.
    pub fn commit(&mut self, now: Timestamp) -> Result<Committed> {
        if self.current.is_some() {
            return Err(self.misuse("commit in the middle of an object"));
        }
        if self.pending.is_empty() && self.deactivations.is_empty() {
            return Ok(Committed::default());
        }
        self.writer()?.sync()?;
        let seals = self.rolled_over()?;
        // A transaction that lost a deadlock or its connection to another server's is rolled
        // back whole; everything it recorded is still pending here, so it is tried again.
        let mut delay = std::time::Duration::from_millis(50);
        let mut attempt = 0;
        let objects = loop {
            match self.record(now, &seals) {
                Err(StoreError::Catalog(e)) if e.is_transient() && attempt < 5 => {
                    attempt += 1;
                    std::thread::sleep(delay);
                    delay *= 2;
                }
                done => break done?,
            }
        };
        // Committed chunks are found through the catalog from now on.
        for object in &self.pending {
            for chunk in &object.chunks {
                if let ObjectChunk::Keyed(_, key) = chunk {
                    self.appended.remove(&(key.hash, key.sealed));
                }
            }
        }
        let committed = Committed { objects, bytes: self.bytes };
        self.recorded.extend(self.touched.keys());
        self.sealed.extend(seals.iter().map(|&(id, _)| id));
        self.pending.clear();
        self.deactivations.clear();
        self.touched.clear();
        self.bytes = 0;
        Ok(committed)
    }

    /// The containers the writer filled and sealed when it rolled over (all it touched but its
    /// current one), with their sizes, whose seal the catalog does not know yet. The catalog
    /// records them sealed at their whole size, index included; before, only the last
    /// container of a batch was, and an audit reported every other one's index as bytes past
    /// the catalog's record.
    fn rolled_over(&self) -> Result<Vec<(u64, u64)>> {
        let current = self.writer.as_ref().map(|w| w.container());
        let mut seals: Vec<(u64, u64)> = Vec::new();
        for &id in self.recorded.iter().chain(self.touched.keys()) {
            if Some(id) == current || self.sealed.contains(&id) || seals.iter().any(|s| s.0 == id) {
                continue;
            }
            if let Some(info) = self.store.pool.container(id)?
                && info.sealed
            {
                seals.push((id, info.size));
            }
        }
        Ok(seals)
    }

    /// The catalog half of [`Batch::commit`]: one transaction recording everything pending,
    /// and the seals of the containers the writer left (`seals`, from [`Batch::rolled_over`]).
    fn record(&self, now: Timestamp, seals: &[(u64, u64)]) -> Result<Vec<ObjectId>> {
        let store = self.store;
        let mut t = store.catalog.begin()?;
        for (&container, &end) in &self.touched {
            t.add_container(store.pool_record, ContainerId(container))?;
            t.set_container(ContainerId(container), end, false)?;
        }
        for &(container, size) in seals {
            t.set_container(ContainerId(container), size, true)?;
        }
        let mut objects = Vec::with_capacity(self.pending.len());
        let mut deactivations = self.deactivations.iter().peekable();
        for (i, object) in self.pending.iter().enumerate() {
            while let Some((_, fs, path, tree)) = deactivations.next_if(|(before, ..)| *before <= i)
            {
                deactivate(t.as_mut(), *fs, path, *tree, now)?;
            }
            objects.push(t.insert_object(object, now)?);
        }
        for (_, fs, path, tree) in deactivations {
            deactivate(t.as_mut(), *fs, path, *tree, now)?;
        }
        t.commit()?;
        Ok(objects)
    }

    /// Commits what is pending and seals the writer's container.
    pub fn finish(mut self, now: Timestamp) -> Result<Committed> {
        let committed = self.commit(now)?;
        if let Some(writer) = self.writer.take() {
            let container = writer.container();
            writer.finish()?;
            // Record the seal only for a container the catalog knows (one whose frames a
            // commit recorded); its size from the pool's one container, never a listing of the
            // pool (on S3 a listing reads every container's trailer).
            if self.recorded.contains(&container) {
                let size = self.store.pool.container(container)?.map_or(0, |c| c.size);
                let mut t = self.store.catalog.begin()?;
                t.set_container(ContainerId(container), size, true)?;
                t.commit()?;
            }
        }
        Ok(committed)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let mut open = self.store.open_set();
        for c in &self.mine {
            open.remove(&ContainerId(*c));
        }
    }
}
