//! Auditing a storage pool against its catalog (TSM's `AUDIT VOLUME` / `AUDIT CONTAINER`):
//! every chunk the catalog places in the pool is read back and its checksum verified; the
//! chunks that fail, and the object versions that use them, are reported and can be marked
//! damaged. Containers and bytes the catalog does not know are reported too: after the
//! catalog was restored from a copy, that is where the data of every later backup lies,
//! and it must not be reclaimed before an administrator has seen it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use qsm_catalog::{ChunkRowId, FilespaceId, ObjectId};

use crate::{Result, Store, StoreError, location};

/// The catalog-state name set when the catalog is restored from a copy (its value is the
/// time of the restore): containers the catalog does not know may then hold newer data, so
/// orphan removal refuses to delete them until an audit releases them.
pub const RESTORED_AT: &str = "restored_at";

/// What an audit does besides reading.
#[derive(Debug, Default)]
pub struct AuditOptions<'a> {
    /// Mark the damaged chunks and their objects in the catalog.
    pub mark_damaged: bool,
    /// Let reclamation delete the containers the catalog does not know (after a catalog
    /// restore they are refused until then).
    pub release_unknown: bool,
    /// Only these containers (`None`: all of the pool).
    pub containers: Option<Vec<u64>>,
    /// Stop before the next container once set.
    pub stop: Option<&'a AtomicBool>,
    /// Chunks read so far, for progress.
    pub progress: Option<&'a AtomicU64>,
}

/// A chunk that failed its audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedChunk {
    /// The chunk.
    pub chunk: ChunkRowId,
    /// Its container and offset.
    pub container: u64,
    /// Offset of its frame.
    pub offset: u64,
    /// Why it failed.
    pub reason: String,
}

/// What an audit found.
#[derive(Debug, Clone, Default)]
pub struct AuditReport {
    /// Containers audited.
    pub containers: u64,
    /// Chunks read and verified.
    pub chunks_read: u64,
    /// Bytes of frames read.
    pub bytes_read: u64,
    /// Chunks that could not be read or failed their checksum.
    pub damaged: Vec<DamagedChunk>,
    /// The object versions using them: (id, filespace, path).
    pub damaged_objects: Vec<(ObjectId, FilespaceId, Vec<u8>)>,
    /// Whether they were marked damaged in the catalog.
    pub marked: bool,
    /// Containers in the pool that the catalog does not know, with their sizes.
    pub unknown_containers: Vec<(u64, u64)>,
    /// Containers holding more bytes than the catalog recorded, with the bytes beyond.
    pub unrecorded_tails: Vec<(u64, u64)>,
    /// When the catalog was restored from a copy, if it was and no audit released the
    /// unknown containers since.
    pub restored_at: Option<i64>,
    /// Whether this audit released them.
    pub released: bool,
    /// Why it stopped early, if it did.
    pub stopped: Option<String>,
}

impl Store {
    /// Audits the pool against the catalog; see the module documentation.
    pub fn audit(&self, options: &AuditOptions<'_>) -> Result<AuditReport> {
        let mut report = AuditReport::default();
        let listed: BTreeMap<u64, u64> =
            self.pool.containers()?.into_iter().map(|c| (c.id, c.size)).collect();
        let known = self.catalog.containers(self.pool_record)?;
        let known_ids: HashSet<u64> = known.iter().map(|c| c.id.0).collect();
        let wanted = |id: u64| options.containers.as_ref().is_none_or(|only| only.contains(&id));
        // Containers being written grow past their record until they commit; with a shared
        // catalog and no leases to go by, any may be.
        let busy = self.busy()?;
        let mut frame = Vec::new();
        for container in known.iter().filter(|c| wanted(c.id.0)) {
            if options.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                report.stopped = Some("cancelled".into());
                break;
            }
            report.containers += 1;
            let size = listed.get(&container.id.0).copied();
            // A container this process is writing grows past its record until it commits.
            let writing = busy.as_ref().is_none_or(|b| b.held(container.id));
            if let Some(size) = size.filter(|_| !writing)
                && size > container.size
            {
                report.unrecorded_tails.push((container.id.0, size - container.size));
            }
            for chunk in self.catalog.chunks_in_container(container.id)? {
                let at = location(&chunk.location);
                let failed = match size {
                    None => {
                        Some(format!("container {:016x} is missing from the pool", at.container))
                    }
                    Some(_) => self
                        .pool
                        .read_frame(&at, Some(chunk.id.0 as u64), &mut frame)
                        .err()
                        .map(|e| e.to_string()),
                };
                report.chunks_read += 1;
                report.bytes_read += u64::from(at.len);
                if let Some(p) = options.progress {
                    p.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(reason) = failed {
                    report.damaged.push(DamagedChunk {
                        chunk: chunk.id,
                        container: at.container,
                        offset: at.offset,
                        reason,
                    });
                }
            }
        }
        if options.containers.is_none() {
            report.unknown_containers = listed
                .iter()
                .filter(|(id, _)| {
                    let id = qsm_catalog::ContainerId(**id);
                    !known_ids.contains(&id.0) && busy.as_ref().is_some_and(|b| !b.held(id))
                })
                .map(|(id, size)| (*id, *size))
                .collect();
        }
        let ids: HashSet<ChunkRowId> = report.damaged.iter().map(|d| d.chunk).collect();
        let (objects, scanned) = self.catalog.objects_using(&ids)?;
        report.damaged_objects = objects;
        if options.mark_damaged && !ids.is_empty() {
            let chunks: Vec<ChunkRowId> = ids.into_iter().collect();
            let objects: Vec<ObjectId> = report.damaged_objects.iter().map(|o| o.0).collect();
            self.catalog.mark_damaged(&chunks, &objects, scanned)?;
            report.marked = true;
        }
        report.restored_at = self.catalog.state_value(RESTORED_AT)?.filter(|t| *t != 0);
        if options.release_unknown && report.restored_at.is_some() {
            self.catalog.set_state_value(RESTORED_AT, 0)?;
            report.released = true;
        }
        Ok(report)
    }

    /// The containers the catalog places in this pool that the pool does not have.
    pub fn missing_containers(&self) -> Result<Vec<u64>> {
        let listed: HashSet<u64> = self.pool.containers()?.into_iter().map(|c| c.id).collect();
        Ok(self
            .catalog
            .containers(self.pool_record)?
            .into_iter()
            .map(|c| c.id.0)
            .filter(|id| !listed.contains(id))
            .collect())
    }

    /// Refuses while the catalog was restored from a copy and no audit has released the
    /// data it does not know.
    pub(crate) fn check_not_restored(&self) -> Result<()> {
        match self.catalog.state_value(RESTORED_AT)?.filter(|t| *t != 0) {
            None => Ok(()),
            Some(t) => Err(StoreError::Restored(t)),
        }
    }
}
