//! # qsm-catalog: the server's metadata
//!
//! The catalog records which node backed up which object, which versions are active, where
//! every chunk lives, and the policy, sessions, processes and activity log around them. One
//! [`Catalog`] interface has a SQLite implementation ([`SqliteCatalog`], bundled, WAL mode),
//! the embedded default, and a PostgreSQL implementation ([`PostgresCatalog`]) for sites past
//! one machine and servers sharing one catalog. Both pass the same [`conformance`] suite, so
//! callers never see which one they talk to; [`copy`] moves a whole catalog between them.
//! Their SQL is written once, over the small interface each backend provides ([`sql`]): a
//! catalog change is made in one place.
//!
//! Writes go through a [`Txn`]: the server groups many objects in one transaction (TSM's
//! `txngroupmax` / `txnbytelimit`), and nothing is visible before [`Txn::commit`]. The commit
//! protocol that orders pool writes before catalog commits lives with the pool (`qsm-store`).
//!
//! Reads of the active inventory stream in path order through a callback, so a filespace of
//! millions of objects never sits in memory.

mod chunk_list;
pub mod conformance;
pub mod coord;
pub mod copy;
pub mod error;
pub mod expire;
mod imp;
pub mod meta;
pub mod migrations;
mod paging;
mod pg_pool;
mod pg_tls;
mod postgres;
pub mod sql;
mod sqlite;
#[doc(hidden)]
pub mod testing;

pub use coord::{Coordination, ServerId};
pub use error::{CatalogError, Result};
pub use postgres::{PostgresCatalog, redact};
pub use qsm_types::model;
pub use qsm_types::model::*;
pub use sqlite::{SqliteCatalog, Upgrade};

/// How many backup runs a filespace's history keeps ([`Catalog::backup_runs`]): more than a
/// year of daily backups.
pub const RUNS_KEPT: usize = 400;

/// Whether `spec` names a PostgreSQL database (`postgres://` or `postgresql://`) rather than a
/// SQLite file.
pub fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// An open catalog of either backend, for the tools that accept both.
#[derive(Debug)]
pub enum AnyCatalog {
    /// A SQLite file.
    Sqlite(SqliteCatalog),
    /// A PostgreSQL database.
    Postgres(Box<PostgresCatalog>),
}

impl AnyCatalog {
    /// Opens `spec`: a `postgres://` URL, or the path of a SQLite file (created if missing).
    pub fn open(spec: &str) -> Result<AnyCatalog> {
        if is_postgres(spec) {
            Ok(AnyCatalog::Postgres(Box::new(PostgresCatalog::open(spec)?)))
        } else {
            Ok(AnyCatalog::Sqlite(SqliteCatalog::open(std::path::Path::new(
                spec.strip_prefix("sqlite:").unwrap_or(spec),
            ))?))
        }
    }

    /// The catalog.
    pub fn catalog(&self) -> &dyn Catalog {
        match self {
            AnyCatalog::Sqlite(c) => c,
            AnyCatalog::Postgres(c) => c.as_ref(),
        }
    }

    /// Its rows, for whole-catalog copies.
    pub fn tables(&self) -> &dyn copy::RawTables {
        match self {
            AnyCatalog::Sqlite(c) => c,
            AnyCatalog::Postgres(c) => c.as_ref(),
        }
    }

    /// Into a shared catalog.
    pub fn into_shared(self) -> std::sync::Arc<dyn Catalog> {
        match self {
            AnyCatalog::Sqlite(c) => std::sync::Arc::new(c),
            AnyCatalog::Postgres(c) => std::sync::Arc::new(*c),
        }
    }
}

/// An object's filespace and its chunks in order ([`Catalog::objects_chunks`]).
pub type ObjectChunks = (FilespaceId, Vec<ChunkRef>);

/// The catalog interface. Implementations are shared between threads; each call is its own
/// transaction unless made through a [`Txn`].
pub trait Catalog: Send + Sync + std::fmt::Debug {
    /// The schema version of the open catalog.
    fn schema_version(&self) -> Result<u32>;

    /// The backend under SQL written once for both ([`sql`], [`coord`]).
    fn sql(&self) -> &dyn sql::Backend;

    // --- policy ---
    /// Creates a policy domain.
    fn define_domain(&self, name: &str, description: &str) -> Result<DomainId>;
    /// The domain called `name`.
    fn domain(&self, name: &str) -> Result<Option<Domain>>;
    /// Creates a management class with its copy groups in `domain`.
    fn define_mgmt_class(
        &self,
        domain: DomainId,
        name: &str,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<MgmtClassId>;
    /// The management classes of `domain`, by name.
    fn mgmt_classes(&self, domain: DomainId) -> Result<Vec<MgmtClass>>;
    /// Every domain, by name.
    fn domains(&self) -> Result<Vec<Domain>>;
    /// Deletes a domain and its management classes; refused while nodes belong to it or
    /// versions are bound to one of its classes.
    fn delete_domain(&self, domain: DomainId) -> Result<()>;
    /// Replaces a management class's copy groups.
    fn update_mgmt_class(
        &self,
        class: MgmtClassId,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<()>;
    /// Deletes a management class; refused while versions are bound to it.
    fn delete_mgmt_class(&self, class: MgmtClassId) -> Result<()>;
    /// Moves a node to another policy domain.
    fn set_node_domain(&self, node: NodeId, domain: DomainId) -> Result<()>;

    // --- nodes and filespaces ---
    /// Registers a node; its name must be new.
    fn register_node(&self, name: &str, password_hash: &str, domain: DomainId) -> Result<NodeId>;
    /// The node called `name`.
    fn node(&self, name: &str) -> Result<Option<Node>>;
    /// Every node, by name.
    fn nodes(&self) -> Result<Vec<Node>>;
    /// Locks or unlocks a node.
    fn set_node_locked(&self, node: NodeId, locked: bool) -> Result<()>;
    /// Registers an administrator with `privileges` (none: queries only); `Exists` if the
    /// name is taken.
    fn register_admin(
        &self,
        name: &str,
        password_hash: &str,
        privileges: &[Privilege],
    ) -> Result<()>;
    /// Replaces an administrator's privilege classes.
    fn set_admin_privileges(&self, name: &str, privileges: &[Privilege]) -> Result<()>;
    /// Replaces the password hash of the node (`admin` false) or administrator `name`.
    fn set_password(&self, admin: bool, name: &str, password_hash: &str) -> Result<()>;
    /// Locks or unlocks administrator `name`: a locked one cannot log in.
    fn set_admin_locked(&self, name: &str, locked: bool) -> Result<()>;
    /// Removes administrator `name` (it owns no data).
    fn remove_admin(&self, name: &str) -> Result<()>;
    /// An administrator by name.
    fn admin(&self, name: &str) -> Result<Option<Admin>>;
    /// The filespace `name` of `node`, created if new.
    fn filespace(&self, node: NodeId, name: &str) -> Result<FilespaceId>;
    /// The filespaces of `node`, by name.
    fn filespaces(&self, node: NodeId) -> Result<Vec<Filespace>>;
    /// Deletes every version of `filespace` (releasing their chunks), in transactions of at
    /// most `batch` versions, then the filespace; `stop` is checked between transactions
    /// (the filespace stays, with what is left, when it stops). Returns the versions deleted.
    fn delete_filespace(
        &self,
        filespace: FilespaceId,
        batch: usize,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<u64>;
    /// Records how a backup of `filespace` ended: its last backup, and its last completed one
    /// unless it failed.
    fn record_backup(&self, filespace: FilespaceId, run: &BackupRun) -> Result<()>;
    /// `filespace`'s recorded backup runs that ended at or after `since`, oldest first: at
    /// most its newest [`RUNS_KEPT`].
    fn backup_runs(&self, filespace: FilespaceId, since: Timestamp) -> Result<Vec<BackupRun>>;
    /// Defines schedule `name` in `domain` (`Exists` if the domain has one of that name).
    fn define_schedule(
        &self,
        domain: DomainId,
        name: &str,
        spec: &ScheduleSpec,
    ) -> Result<ScheduleId>;
    /// Replaces what a schedule says; its windows count as new from now (none before is
    /// missed).
    fn update_schedule(&self, id: ScheduleId, spec: &ScheduleSpec) -> Result<()>;
    /// Deletes a schedule and its events.
    fn delete_schedule(&self, id: ScheduleId) -> Result<()>;
    /// Every schedule, by domain and name.
    fn schedules(&self) -> Result<Vec<Schedule>>;
    /// Records the event of `schedule` for `node` (`None`: a server action) in the window
    /// starting at `window_start`, in `state` (`started`, or `missed`), unless it has one:
    /// its id when this call made it, so one server runs it.
    fn claim_event(
        &self,
        schedule: ScheduleId,
        node: Option<NodeId>,
        window_start: Timestamp,
        state: &str,
        now: Timestamp,
    ) -> Result<Option<i64>>;
    /// Ends a started event in `state` (`completed`, `failed`, `severed`) with what it
    /// reported (`NotFound` if it is not started).
    fn end_event(&self, id: i64, state: &str, detail: &str, now: Timestamp) -> Result<()>;
    /// The events of windows starting at `since` or later, oldest first.
    fn events(&self, since: Timestamp) -> Result<Vec<Event>>;
    /// `node`'s events of windows starting at `since` or later, oldest first.
    fn node_events(&self, node: NodeId, since: Timestamp) -> Result<Vec<Event>>;
    /// The nodes' events still started, oldest first (a scheduler's that may never report).
    fn started_node_events(&self) -> Result<Vec<Event>>;
    /// Ends `node`'s started event `id` in `state` with what it reported (`NotFound` if it is
    /// another's, or not started).
    fn end_node_event(
        &self,
        node: NodeId,
        id: i64,
        state: &str,
        detail: &str,
        now: Timestamp,
    ) -> Result<()>;
    /// Has `schedule` run for `node` from now on; `false` if it did already.
    fn associate(&self, schedule: ScheduleId, node: NodeId) -> Result<bool>;
    /// Stops `schedule` running for `node`.
    fn dissociate(&self, schedule: ScheduleId, node: NodeId) -> Result<()>;
    /// Every association, by domain, schedule and node.
    fn associations(&self) -> Result<Vec<Association>>;
    /// Defines client option set `name` (`Exists` if there is one).
    fn define_cloptset(&self, name: &str, description: &str) -> Result<()>;
    /// Deletes an option set and its options; its nodes keep their own options only.
    fn delete_cloptset(&self, name: &str) -> Result<()>;
    /// Adds `opt` to option set `set`, after those of the same name unless `replace`.
    fn add_clientopt(&self, set: &str, opt: &ClientOpt, replace: bool) -> Result<()>;
    /// Deletes every value of option `name` from `set`; how many there were.
    fn delete_clientopt(&self, set: &str, name: &str) -> Result<u64>;
    /// Every option set with its options, by name.
    fn cloptsets(&self) -> Result<Vec<OptionSet>>;
    /// Has `node` use option set `set` (`None`: none).
    fn set_node_cloptset(&self, node: NodeId, set: Option<&str>) -> Result<()>;
    /// The option set `node` uses, if any.
    fn node_cloptset(&self, node: NodeId) -> Result<Option<OptionSet>>;
    /// Deletes a node and its session history; refused while it has filespaces.
    fn delete_node(&self, node: NodeId) -> Result<()>;

    // --- protection from deletion (retention locks, holds, suspect backups) ---
    /// Sets a management class's minimum retention: versions stored from now on are kept at
    /// least `days` (0: no minimum); versions stored before keep the lock they were given.
    fn set_retain_min(&self, class: MgmtClassId, days: u32) -> Result<()>;
    /// Places a hold of `kind` on `node` (`filespace` `None`) or one of its filespaces: no
    /// version under it is deleted until it is released. False if there is one already.
    fn hold(
        &self,
        node: NodeId,
        filespace: Option<FilespaceId>,
        kind: HoldKind,
        by: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool>;
    /// Releases the hold of `kind` on `node` or its filespace; false if there was none.
    fn release(&self, node: NodeId, filespace: Option<FilespaceId>, kind: HoldKind)
    -> Result<bool>;
    /// Every hold, by node name, filespace name and kind.
    fn holds(&self) -> Result<Vec<Hold>>;
    /// What keeps `filespace`'s versions from deletion at `now`.
    fn protection(&self, filespace: FilespaceId, now: Timestamp) -> Result<Protection>;
    /// Judges the figures of an upload into `filespace` and records them, keeping the newest
    /// `keep`: its `files` counted from the active inventory, then `judge`d against the
    /// figures recorded before (oldest first): an answer (why) marks it suspect. Figures not
    /// part of the `baseline` (a partial backup's) are recorded only when suspect. Returns the
    /// figures, and the answer.
    fn add_backup_stats(
        &self,
        filespace: FilespaceId,
        stats: &BackupStats,
        keep: usize,
        baseline: bool,
        judge: &dyn Fn(&[BackupStats], &BackupStats) -> Option<String>,
    ) -> Result<(BackupStats, Option<String>)>;
    /// The recorded figures of `filespace`'s recent whole backups, oldest first.
    fn backup_stats(&self, filespace: FilespaceId) -> Result<Vec<BackupStats>>;

    // --- pools and containers ---
    /// Records a storage pool.
    fn define_pool(&self, name: &str, kind: &str, location: &str) -> Result<PoolId>;
    /// Every pool, by name.
    fn pools(&self) -> Result<Vec<StoragePool>>;
    /// The containers of `pool`.
    fn containers(&self, pool: PoolId) -> Result<Vec<Container>>;
    /// How `pool`'s space is used (aggregates: no chunk list is read).
    fn pool_usage(&self, pool: PoolId) -> Result<PoolUsage>;
    /// The chunks stored in `container`, by offset.
    fn chunks_in_container(&self, container: ContainerId) -> Result<Vec<Chunk>>;

    // --- deduplication and keys ---
    /// The dedup scope of `node`: its own (`node:NAME`, created with `new_secret` on first
    /// use) unless an administrator put it in another.
    fn dedup_scope(&self, node: NodeId, new_secret: [u8; 32]) -> Result<DedupScope>;
    /// Puts `node` in the scope `name` (created with `new_secret` if new), so it
    /// deduplicates against the other nodes there from now on. Chunks already stored stay
    /// in the scope they were stored in.
    fn set_dedup_scope(&self, node: NodeId, name: &str, new_secret: [u8; 32])
    -> Result<DedupScope>;
    /// For each of `hashes`, the live chunk (reference count above 0) of `scope` with that
    /// keyed id and kind (`sealed` or plaintext), if any.
    fn find_chunks(
        &self,
        scope: DedupScopeId,
        sealed: bool,
        hashes: &[[u8; 32]],
    ) -> Result<Vec<Option<ChunkRowId>>>;
    /// A number that rises whenever chunks may have gone (expiration, reclamation): a client's
    /// cache of what the server holds is valid only at the epoch it was made at.
    fn dedup_epoch(&self) -> Result<u64>;
    /// The server's copy of `node`'s wrapped key file, if it stored one.
    fn node_key(&self, node: NodeId) -> Result<Option<Vec<u8>>>;
    /// Stores (replaces) the server's copy of `node`'s wrapped key file.
    fn set_node_key(&self, node: NodeId, key_file: &[u8]) -> Result<()>;

    // --- objects ---
    /// Starts a write transaction.
    fn begin(&self) -> Result<Box<dyn Txn + '_>>;
    /// Calls `visit` with each active backup version of `filespace`, in path order (bytewise),
    /// streaming: memory does not grow with the filespace. An error from `visit` stops the walk.
    fn for_each_active(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()>;
    /// Calls `visit` with every version of `filespace` (active, inactive and archives), in
    /// path order and newest first within a path, streaming: point-in-time restore, inactive
    /// listings and retrieve select from it.
    fn for_each_version(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()>;
    /// Calls `visit` with the inactive backup versions and archives of `filespace` in path
    /// order (any order within a path), each with whether its path has an active version:
    /// what expiration decides on, without chunk lists or attributes.
    fn for_each_expirable(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&expire::ExpiryRow) -> Result<()>,
    ) -> Result<()>;
    /// Every version of `path` (backups and archives), newest first.
    fn versions(&self, filespace: FilespaceId, path: &[u8]) -> Result<Vec<ObjectVersion>>;
    /// One object version.
    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>>;
    /// The chunks of `object` in order, with their locations.
    fn object_chunks(&self, object: ObjectId) -> Result<Vec<ChunkRef>>;
    /// For each of `objects`, in order, its filespace and chunks ([`Catalog::object_chunks`]),
    /// or `None` if there is no such object; read in one transaction.
    fn objects_chunks(&self, objects: &[ObjectId]) -> Result<Vec<Option<ObjectChunks>>>;

    // --- replication ---
    /// Creates node `name` as a replica made by replication account `account` in `domain`
    /// from the source catalog's `incarnation`, or updates the password hash of the one
    /// `account` made before from the same incarnation. A node of this server's own, or
    /// another account's replica, is refused (`Exists`); one from another incarnation of the
    /// source's catalog (restored since: its ids mean other versions now) too (`Refused`).
    fn put_replica_node(
        &self,
        name: &str,
        account: &str,
        password_hash: &str,
        domain: DomainId,
        incarnation: i64,
    ) -> Result<NodeId>;
    /// The replicated versions of `filespace`: their ids on their source, in order, and
    /// whether each is active here.
    fn replica_versions(&self, filespace: FilespaceId) -> Result<Vec<(ObjectId, bool)>>;
    /// Marks inactive (at the time given with each) the active replicated versions of
    /// `filespace` with these source ids; how many there were.
    fn deactivate_origins(
        &self,
        filespace: FilespaceId,
        origins: &[(ObjectId, Timestamp)],
    ) -> Result<u64>;
    /// The version of `filespace` replicated from source id `origin`, if any.
    fn object_by_origin(
        &self,
        filespace: FilespaceId,
        origin: ObjectId,
    ) -> Result<Option<ObjectId>>;
    /// Points damaged chunk `id`, read at `from`, at a good copy of its frame at `to` and
    /// clears the damage of the chunk and of those of `users` (the versions using it) it
    /// leaves whole; false (nothing changed) if the chunk moved since or is not damaged.
    fn repair_chunk(
        &self,
        id: ChunkRowId,
        from: (ContainerId, u64),
        to: &NewChunk,
        users: &[ObjectId],
    ) -> Result<bool>;
    /// The chunks an audit marked damaged that versions still use.
    fn damaged_chunks(&self) -> Result<Vec<ChunkRef>>;
    /// Defines a server to replicate to.
    fn define_peer_server(&self, server: &PeerServer) -> Result<()>;
    /// Deletes a defined server.
    fn delete_peer_server(&self, name: &str) -> Result<()>;
    /// The servers defined, by name.
    fn peer_servers(&self) -> Result<Vec<PeerServer>>;

    // --- integrity, audit and size ---
    /// The versions (id, filespace, path) whose chunk lists hold any of `chunks`: the objects
    /// an audit's damaged chunks belong to. Reads every version, in pages.
    /// Also returns the last id it read: versions committed later have larger ids.
    fn objects_using(
        &self,
        chunks: &std::collections::HashSet<ChunkRowId>,
    ) -> Result<(Vec<VersionRef>, ObjectId)>;
    /// Marks `chunks` and `objects` damaged in one transaction: the chunks are no longer
    /// offered for deduplication (the next copy stored replaces them), the objects leave the
    /// active inventory (the next incremental backup sends their files again), and the dedup
    /// epoch rises so clients drop what they cached of the chunks. Versions after `after`
    /// (committed since [`Catalog::objects_using`] read) that use the chunks are marked too.
    fn mark_damaged(
        &self,
        chunks: &[ChunkRowId],
        objects: &[ObjectId],
        after: ObjectId,
    ) -> Result<()>;
    /// A named number of the catalog's own state (`None` if never set).
    fn state_value(&self, name: &str) -> Result<Option<i64>>;
    /// Sets a named number of the catalog's own state.
    fn set_state_value(&self, name: &str, value: i64) -> Result<()>;
    /// Writes a consistent copy of the whole catalog, as of one moment, to the new file
    /// `dest`, while other connections keep reading and writing.
    fn snapshot(&self, dest: &std::path::Path) -> Result<()>;
    /// Checks every invariant the catalog can check alone: reference counts equal the
    /// references from object versions, every referenced chunk and container exists, at most
    /// one active version per path.
    fn check(&self) -> Result<ConsistencyReport>;
    /// Counts and database size.
    fn stats(&self) -> Result<CatalogStats>;

    // --- sessions, processes, activity log ---
    /// Adds to a session's counters.
    fn update_session(&self, session: SessionId, bytes: u64, objects: u64) -> Result<()>;
    /// Sessions still running.
    fn running_sessions(&self) -> Result<Vec<Session>>;
    /// Ends a process with `state` and a final `detail`.
    fn end_process(&self, process: ProcessId, state: &str, detail: &str) -> Result<()>;
    /// A process by id.
    fn process(&self, process: ProcessId) -> Result<Option<Process>>;
    /// Appends to the activity log.
    fn log(
        &self,
        severity: Severity,
        message: &str,
        node: Option<NodeId>,
        session: Option<SessionId>,
        process: Option<ProcessId>,
    ) -> Result<()>;
    /// Activity-log entries at or after `since`, oldest first, at most `limit`.
    fn activity(&self, since: Timestamp, limit: u32) -> Result<Vec<ActivityEntry>>;

    /// Whether other servers may share this catalog (and so its pool): then no server knows
    /// every container being written, and pool maintenance must not assume it does.
    fn is_shared(&self) -> bool {
        false
    }
}

/// A version named by id, filespace and path (what an audit reports).
pub type VersionRef = (ObjectId, FilespaceId, Vec<u8>);

/// A write transaction. Dropping it without [`Txn::commit`] rolls everything back.
pub trait Txn {
    /// Records a container of `pool` (nothing if already recorded).
    fn add_container(&mut self, pool: PoolId, id: ContainerId) -> Result<()>;
    /// Updates a container's recorded size and sealed flag.
    fn set_container(&mut self, id: ContainerId, size: u64, sealed: bool) -> Result<()>;
    /// Inserts an object version with its chunks (new chunks are created; existing ones gain
    /// a reference). A backup version becomes the active one: the previous active version of
    /// the same path, if any, becomes inactive at `now`.
    fn insert_object(&mut self, object: &NewObject, now: Timestamp) -> Result<ObjectId>;
    /// Marks the active version of `path` inactive (the file was deleted on the client).
    /// Returns whether there was one.
    fn deactivate(&mut self, filespace: FilespaceId, path: &[u8], now: Timestamp) -> Result<bool>;
    /// Marks the active versions of everything below `path` (`path/...`; for "" everything but
    /// the root itself) inactive: a directory's contents gone from the client. Returns how
    /// many there were.
    fn deactivate_tree(
        &mut self,
        filespace: FilespaceId,
        path: &[u8],
        now: Timestamp,
    ) -> Result<u64>;
    /// Deletes an object version and releases its chunk references (expiration).
    /// [`CatalogError::Protected`] if a retention lock or a hold keeps it at `now`.
    fn delete_object(&mut self, id: ObjectId, now: Timestamp) -> Result<()>;
    /// Moves a chunk's frame to a new location (reclamation).
    /// `from` is where the mover read it: if the chunk moved since (a damaged chunk repaired
    /// by a new copy), the move is refused and nothing is repointed.
    fn move_chunk(
        &mut self,
        id: ChunkRowId,
        from: (ContainerId, u64),
        container: ContainerId,
        offset: u64,
    ) -> Result<()>;
    /// Deletes a chunk no object refers to.
    fn delete_chunk(&mut self, id: ChunkRowId) -> Result<()>;
    /// Deletes a container no chunk lives in.
    fn delete_container(&mut self, id: ContainerId) -> Result<()>;
    /// Makes every change visible at once, durably.
    fn commit(self: Box<Self>) -> Result<()>;
}

/// The loop of [`Catalog::delete_filespace`], shared by the backends: `ids(limit)` lists up to
/// `limit` versions of the filespace, `remove()` deletes the filespace if it has no versions
/// (false if a backup added one meanwhile) and `exists()` says whether it is still there.
pub(crate) fn delete_filespace_in_batches(
    catalog: &dyn Catalog,
    filespace: FilespaceId,
    batch: usize,
    stop: &std::sync::atomic::AtomicBool,
    ids: &dyn Fn(i64) -> Result<Vec<i64>>,
    remove: &dyn Fn() -> Result<bool>,
    exists: &dyn Fn() -> Result<bool>,
) -> Result<u64> {
    // Refused whole rather than left half deleted: nothing under a hold or a running lock
    // may go, so nothing of the filespace goes.
    let now = model::now();
    if let Some(why) = catalog.protection(filespace, now)?.why() {
        return Err(CatalogError::Protected(format!("{why}; nothing was deleted")));
    }
    let mut deleted = 0u64;
    let limit = batch.max(1);
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(deleted);
        }
        let mut page = ids(limit as i64)?;
        page.truncate(limit);
        if page.is_empty() {
            // Gone only if still empty: a backup may have added to it meanwhile.
            if remove()? {
                return Ok(deleted);
            }
            if !exists()? {
                return Err(CatalogError::NotFound {
                    what: "filespace",
                    key: filespace.0.to_string(),
                });
            }
            continue;
        }
        let mut t = catalog.begin()?;
        for id in &page {
            match t.delete_object(ObjectId(*id), now) {
                Ok(()) => deleted += 1,
                Err(CatalogError::NotFound { what: "object", .. }) => {}
                Err(e) => return Err(e),
            }
        }
        t.commit()?;
    }
}

/// The standard policy domain, created on first use.
pub fn standard_domain(catalog: &dyn Catalog) -> Result<DomainId> {
    match catalog.domain(STANDARD_DOMAIN)? {
        Some(d) => Ok(d.id),
        None => catalog.define_domain(STANDARD_DOMAIN, "the default policy domain"),
    }
}

/// The management classes of `node`'s policy domain.
pub fn node_classes(catalog: &dyn Catalog, node: NodeId) -> Result<Vec<MgmtClass>> {
    Ok(node_policy(catalog, node)?.1)
}

/// `node`'s policy domain and its management classes.
pub fn node_policy(catalog: &dyn Catalog, node: NodeId) -> Result<(Domain, Vec<MgmtClass>)> {
    let not_found = |what| CatalogError::NotFound { what, key: node.0.to_string() };
    let id = catalog.nodes()?.into_iter().find(|n| n.id == node).ok_or(not_found("node"))?.domain;
    let domain =
        catalog.domains()?.into_iter().find(|d| d.id == id).ok_or(not_found("domain of node"))?;
    let classes = catalog.mgmt_classes(id)?;
    Ok((domain, classes))
}

/// The policy domain nodes join unless an administrator says otherwise (TSM's STANDARD).
pub const STANDARD_DOMAIN: &str = "standard";
