//! # qsm-pool: storage pools of append-only containers
//!
//! A **pool** is where a QSM server keeps the bytes of backed-up data: the quantum frames of
//! `qsm-codec`, stored unchanged (byte for byte as the client's compressor made them) in large
//! append-only files called **containers**, each tens of MiB and addressed by a random 64-bit
//! [`ContainerId`]. A frame is found by a [`FrameLocation`] (container, offset, length) that the
//! catalog records, and reading it back is one ranged read. Every container is
//! self-describing: its header names the pool ([`PoolId`]) and the container, and a sealed
//! container ends with an index of its frames, so every frame's location, codec, lengths and
//! data checksum can be recovered from the pool alone ([`Pool::scan`]). What the pool does not
//! know is what the frames mean: which object a frame belongs to, and its chunk id (a keyed
//! hash of the plaintext), are the catalog's. The byte layout is in `docs/FORMAT.md`, section
//! "Storage-pool containers".
//!
//! [`Pool`] is the one trait every backend implements; [`DirPool`] keeps a pool in a local
//! directory. An object-store pool (S3) follows in a later issue and must pass the same
//! [`conformance`] suite.
//!
//! ## The life of a container
//!
//! 1. **Open**: [`Pool::writer`] creates a new container with a fresh random id (never
//!    reusing or overwriting an existing one) and writes its header.
//! 2. **Appended**: [`PoolWriter::append`] adds complete frames at the end and returns their
//!    locations at once, but the bytes are not durable yet.
//! 3. **Synced**: [`PoolWriter::sync`] makes every frame appended so far durable. Only now may
//!    the catalog reference them.
//! 4. **Sealed**: when a container reaches the target size the writer seals it (writes the
//!    index of its frames and a trailer, syncs it) and continues in a new one;
//!    [`PoolWriter::finish`] seals the last. A sealed container never changes again. A
//!    container whose writer crashed stays **unsealed**: it is read by a forward scan that stops
//!    at the first incomplete frame, and every frame synced before the crash remains readable.
//! 5. **Reclaimed**: when expiration has left too few live frames in a container,
//!    [`reclaim::copy_frames`] copies the live ones into a new container; the caller repoints
//!    the catalog in one transaction.
//! 6. **Deleted**: [`Pool::delete`] then removes the old container.
//!
//! ## The durability contract (what the commit protocol relies on)
//!
//! - When [`PoolWriter::sync`] returns `Ok`, every frame appended through that writer before
//!   the call is on stable storage, and so is the directory entry of every container it
//!   created: after a crash of the process or the machine, [`Pool::read_frame`] returns those
//!   frames, verified. (With [`DirPoolOptions::fsync`] off this holds for a process crash only;
//!   that setting exists for tests and benchmarks.)
//! - A location returned by `append` but not yet synced may vanish or be partly written after
//!   a crash. The catalog therefore commits a transaction that references frames only after
//!   `sync` has returned, which is why a crash at any instant leaves at most unreferenced bytes
//!   behind: a crashed writer's tail, or a container nobody references, both of which
//!   reclamation removes.
//! - After any error, a writer refuses further work ([`PoolError::WriterFailed`]); its frames
//!   synced before the error stay valid and the others must not be referenced.
//! - Sealed containers are immutable; a frame keeps its location until its container is
//!   deleted, so locations in the catalog never go stale by themselves.
//!
//! ## Integrity
//!
//! [`Pool::read_frame`] checks that the location holds exactly one valid frame and decodes it to
//! verify its data checksum before returning its bytes; damage is reported as
//! [`PoolError::Corrupt`] naming the pool, container, offset and chunk, and damaged bytes are
//! never returned as data. [`Pool::audit`] re-verifies a whole container and lists every damaged
//! frame instead of stopping at the first.
//!
//! ## Concurrency
//!
//! A pool is shared by reference between threads (`Send + Sync`). Each [`PoolWriter`] owns one
//! open container at a time and no two writers ever share one, so writers append concurrently
//! without locking each other out; a writer itself is used by one thread at a time. Reads,
//! scans and audits may run at any time, also on containers that are being written: they see
//! at least the frames synced so far.

pub mod audit;
pub mod conformance;
pub mod container;
pub mod descriptor;
mod dir;
pub mod error;
pub mod frames;
pub mod reclaim;

use std::fmt;

pub use dir::{DEFAULT_TARGET_SIZE, DirPool, DirPoolOptions, MAX_TARGET_SIZE, MIN_TARGET_SIZE};
pub use error::PoolError;
pub use qsm_codec::FrameHeader;
pub use reclaim::copy_frames;

/// A container's id: a random 64-bit number chosen by the pool when it creates the container,
/// shown as 16 lower-case hexadecimal digits (its file name).
pub type ContainerId = u64;

/// Where a frame is stored: the catalog records this for every chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameLocation {
    /// The container holding the frame.
    pub container: ContainerId,
    /// Byte offset of the frame's first byte in the container.
    pub offset: u64,
    /// Length of the whole frame: its 28-byte header and the payload.
    pub len: u32,
}

/// A pool's identity: 16 random bytes chosen when the pool is created and written into every
/// container header, so a container copied into another pool is recognised and refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub [u8; 16]);

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolId({self})")
    }
}

/// A container as listed by [`Pool::containers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Its id.
    pub id: ContainerId,
    /// Its size in bytes.
    pub size: u64,
    /// Whether it ends with a well-formed trailer (magic, version, lengths that fit); false
    /// also for a container that cannot be read. The index check itself is verified by
    /// [`Pool::scan`] and [`Pool::audit`], not by listing.
    pub sealed: bool,
    /// When it was last written (Unix seconds), where the pool can say: a container written
    /// a moment ago may belong to a writer that has not yet leased it (servers sharing a pool).
    pub modified: Option<i64>,
}

/// How a scan of one container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanEnd {
    /// Frames visited.
    pub frames: u64,
    /// Offset just past the last frame visited (the end of the container header if none).
    pub end: u64,
    /// The container's size in bytes.
    pub size: u64,
    /// Why the scan ended.
    pub stop: ScanStop,
    /// Set when the container ends with a trailer magic but its trailer or index is invalid;
    /// the frames then came from a forward scan, and this says what was wrong.
    pub trailer_damage: Option<String>,
}

impl ScanEnd {
    /// Whether every frame came from a verified trailer index.
    pub fn is_sealed(&self) -> bool {
        self.stop == ScanStop::Sealed
    }
}

/// Why a scan ended; see [`ScanEnd`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    /// The container is sealed and its verified index listed every frame.
    Sealed,
    /// Unsealed, and its frames run exactly to the end of the container: an open container, or
    /// one whose writer stopped cleanly between frames.
    EndOfFile,
    /// A forward scan stopped at [`ScanEnd::end`], before the end of the container, because
    /// what follows is not a complete valid frame: the tail a crashed writer left, damage, or an
    /// index block without a valid trailer.
    Stopped {
        /// What was found there.
        detail: String,
    },
}

/// What an audit of one container found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditReport {
    /// The container audited.
    pub container: ContainerId,
    /// Frames read and verified without error.
    pub frames_ok: u64,
    /// Bytes in those frames.
    pub bytes_ok: u64,
    /// Every damaged frame or region, in offset order.
    pub damaged: Vec<Damage>,
    /// How the frames were found (index or forward scan) and where that ended. The
    /// incomplete tail of an unsealed container (see [`ScanStop::Stopped`]) is reported here,
    /// not in `damaged`: it is what a crashed writer leaves, and nothing references it.
    pub end: ScanEnd,
}

impl AuditReport {
    /// Whether no damage was found.
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty()
    }
}

/// One damaged frame or region found by an audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Where it starts in the container.
    pub offset: u64,
    /// Its length in bytes (the frame's, or the unreadable region's).
    pub len: u64,
    /// What is wrong.
    pub detail: String,
}

/// A storage pool: containers of frames, written by [`PoolWriter`]s and read by location.
/// Every implementation passes the [`conformance`] suite.
pub trait Pool: Send + Sync + fmt::Debug {
    /// The pool's id, written into every container header.
    fn id(&self) -> PoolId;

    /// The pool's name, as the administrator gave it.
    fn name(&self) -> &str;

    /// The kind of storage it is on, as the catalog records it ("dir", "s3").
    fn kind(&self) -> &'static str;

    /// A writer with a new open container of its own. Several writers append concurrently.
    fn writer(&self) -> Result<Box<dyn PoolWriter>, PoolError>;

    /// Reads the frame at `loc` with one ranged read, checks that it is exactly one valid
    /// frame of `loc.len` bytes, decodes it to verify its data checksum, and leaves the frame
    /// bytes (header and payload, as stored) in `out`, resized to the frame. On any error `out`
    /// is left empty: damaged bytes are never returned. `chunk` (the catalog's chunk id, if the
    /// caller has one) only names the chunk in error messages.
    fn read_frame(
        &self,
        loc: &FrameLocation,
        chunk: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<FrameHeader, PoolError>;

    /// [`Pool::read_frame`] without the decode: the frame's header, its check and its length
    /// are verified, the data checksum is left to the caller, which must decode the frame
    /// anyway and so verifies it there (restore does, with `qsm_codec::FrameDecoder`). Saves
    /// decoding every restored frame twice.
    fn read_frame_for_decode(
        &self,
        loc: &FrameLocation,
        chunk: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<FrameHeader, PoolError>;

    /// Every container of the pool, sorted by id.
    fn containers(&self) -> Result<Vec<ContainerInfo>, PoolError>;

    /// Container `id` as [`Pool::containers`] would list it, or `None` if it does not exist.
    /// Backends answer from the one container (a stat, a HEAD), not by listing the pool.
    fn container(&self, id: ContainerId) -> Result<Option<ContainerInfo>, PoolError> {
        Ok(self.containers()?.into_iter().find(|c| c.id == id))
    }

    /// Visits every frame of container `id`, in offset order, from the container alone: from its
    /// index when sealed, else by a forward scan over the frame headers that stops at the first
    /// incomplete or invalid frame (which is how a crashed writer's tail is handled). Payloads
    /// are not verified here; [`Pool::audit`] does that. An error from `visit` ends the scan and
    /// is returned.
    fn scan(
        &self,
        id: ContainerId,
        visit: &mut dyn FnMut(FrameLocation, &FrameHeader) -> Result<(), PoolError>,
    ) -> Result<ScanEnd, PoolError>;

    /// Re-reads and verifies every frame of container `id` (header, length, data checksum) and
    /// reports every damaged one, never stopping at the first.
    fn audit(&self, id: ContainerId) -> Result<AuditReport, PoolError>;

    /// Deletes container `id`. The caller makes sure the catalog no longer references it.
    fn delete(&self, id: ContainerId) -> Result<(), PoolError>;

    /// The catalog this pool belongs to, as [`Pool::set_catalog`] last recorded it (`None`:
    /// never recorded, as in pools made before the record existed). The store compares it with
    /// the catalog it is opened with, so that a lost, replaced or mistyped catalog never makes
    /// the pool's containers look like orphans.
    fn catalog(&self) -> Result<Option<CatalogTag>, PoolError>;

    /// Records `tag` as the pool's catalog, durably, replacing any earlier record.
    fn set_catalog(&self, tag: &CatalogTag) -> Result<(), PoolError>;
}

/// The identity of a pool's catalog as the pool records it: the catalog's random id, and where
/// it was when recorded (for messages only: a catalog may move, its id does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogTag {
    /// The catalog's id (16 hex digits).
    pub id: String,
    /// Where it was (`sqlite:/srv/qsm/catalog.db`, a PostgreSQL URL without its password).
    pub location: String,
}

impl CatalogTag {
    /// The longest record read back: anything longer is not one.
    pub const MAX_LEN: usize = 4096;

    /// The record's bytes: `QSMC1`, the id and the location, one per line.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!("QSMC1\n{}\n{}\n", self.id, self.location.replace('\n', " ")).into_bytes()
    }

    /// Parses a record; `None` for anything that is not one (its caller names the object).
    pub fn parse(bytes: &[u8]) -> Option<CatalogTag> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.strip_suffix('\n')?.split('\n');
        let (magic, id, location) = (lines.next()?, lines.next()?, lines.next()?);
        let hex = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
        (magic == "QSMC1" && hex && lines.next().is_none())
            .then(|| CatalogTag { id: id.to_owned(), location: location.to_owned() })
    }
}

/// Appends frames to open containers of one pool; see the crate documentation for the
/// durability contract.
pub trait PoolWriter: Send + fmt::Debug {
    /// The container the writer is appending to now.
    fn container(&self) -> ContainerId;

    /// Appends one complete frame (as `qsm_codec::FrameEncoder` makes it; its header is
    /// validated and its length checked before anything is written) and returns its location.
    /// Not durable until [`PoolWriter::sync`]. If the frame would take the open container past
    /// the pool's target size, the writer first seals that container and opens a new one, so the
    /// locations returned by one writer may span several containers.
    fn append(&mut self, frame: &[u8]) -> Result<FrameLocation, PoolError>;

    /// Makes every frame appended so far durable, with the directory entries of the containers
    /// created since the last sync. Only after this returns may a catalog transaction reference
    /// those locations.
    fn sync(&mut self) -> Result<(), PoolError>;

    /// Seals the open container (writes its index and trailer, syncs it) and closes it. A
    /// container that never received a frame is removed instead. Dropping a writer without
    /// calling this leaves its container unsealed, as a crash would.
    fn finish(self: Box<Self>) -> Result<(), PoolError>;
}

/// A writer's first error, which poisons it: after a failed write, upload or sync, what the
/// storage holds is not known, so nothing more goes through that writer. Every backend's
/// writer keeps one.
#[derive(Debug, Default)]
pub struct FirstError(Option<String>);

impl FirstError {
    /// `Ok` until an error was recorded, then [`PoolError::WriterFailed`] naming it.
    pub fn check(&self, pool: &str, container: ContainerId) -> Result<(), PoolError> {
        match &self.0 {
            Some(detail) => Err(PoolError::WriterFailed {
                pool: pool.to_owned(),
                container,
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Records `e` if it is the first, and returns it.
    pub fn record(&mut self, e: PoolError) -> PoolError {
        if self.0.is_none() {
            self.0 = Some(e.to_string());
        }
        e
    }
}

/// The audit of one container in [`audit_pool`]: its report, or why it could not be audited.
pub type ContainerAudit = Result<AuditReport, PoolError>;

/// Audits every container of `pool`, in id order. A container that cannot be audited at all
/// (its header is damaged, it belongs to another pool) gets its error in the list and the audit
/// goes on; a container deleted while the audit runs is skipped. Only failing to list the
/// containers is an error of the whole audit.
pub fn audit_pool(pool: &dyn Pool) -> Result<Vec<(ContainerId, ContainerAudit)>, PoolError> {
    let mut reports = Vec::new();
    for info in pool.containers()? {
        match pool.audit(info.id) {
            Err(PoolError::NotFound { .. }) => {}
            result => reports.push((info.id, result)),
        }
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::CatalogTag;

    #[test]
    fn catalog_tags_round_trip_and_damage_is_refused() {
        let tag = CatalogTag { id: "00ff00ff00ff00ff".into(), location: "sqlite:/x y/c.db".into() };
        let bytes = tag.to_bytes();
        assert_eq!(CatalogTag::parse(&bytes), Some(tag));
        for cut in 0..bytes.len() {
            assert_eq!(CatalogTag::parse(&bytes[..cut]), None, "truncated at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[7] = b'g';
        assert_eq!(CatalogTag::parse(&flipped), None);
        assert_eq!(CatalogTag::parse(b"QSMC1\n0123\nx\n"), None, "short id");
        assert_eq!(CatalogTag::parse(b"QSMC2\n00ff00ff00ff00ff\nx\n"), None, "other version");
    }
}
