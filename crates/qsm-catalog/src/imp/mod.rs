//! The catalog written once over [`crate::sql`], for every [`Backend`]: the one
//! implementation of [`Catalog`] and [`Txn`] that [`crate::SqliteCatalog`] and
//! [`crate::PostgresCatalog`] share, by concern. The backends keep only their connections,
//! locking, error mapping, migrations and snapshots; whole-catalog copies are written once
//! too ([`crate::copy`]).
//!
//! Where the backends differ in what is fastest (one statement over an array on
//! PostgreSQL, where every statement is a round trip; a cached statement per element on
//! SQLite, where arrays cannot be bound), the code asks [`crate::sql::Dialect::arrays`].

mod accounts;
mod chunks;
mod filespaces;
mod holds;
mod integrity;
mod inventory;
mod options;
mod policy;
mod pools;
mod replicas;
mod schedules;
mod sessions;
mod txn;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::chunk_list;
use crate::error::{CatalogError, Result};
use crate::expire::ExpiryRow;
use crate::migrations::{STATE_ACTIVE, STATE_ARCHIVE};
use crate::model::*;
use crate::sql::{Arg, Backend, Row};
use crate::{Catalog, Txn, VersionRef};

/// Rows per page of the long reads (inventories, expiration scan, audits, checks).
const PAGE: usize = 10_000;

const CHUNK_COLUMNS: &str = "id, container_id, frame_offset, stored_len, raw_len, codec, refcount";

/// A container id as stored: the BIGINT of the same bits.
fn container(id: ContainerId) -> Arg<'static> {
    Arg::Int(id.0 as i64)
}

/// A constraint's refusal replaced by `instead()`, other errors passed through.
fn on_constraint(
    instead: impl FnOnce() -> CatalogError,
) -> impl FnOnce(CatalogError) -> CatalogError {
    move |e| if e.is_constraint() { instead() } else { e }
}

/// An object version from a row of [`crate::migrations::OBJECT_COLUMNS`].
fn object_from_row(row: &dyn Row) -> Result<ObjectVersion> {
    let state = row.int(2)?;
    let code = row.int(4)?;
    let id = row.int(0)?;
    let object_type = ObjectType::from_code(code)
        .ok_or_else(|| CatalogError::Damaged(format!("object {id} has unknown type {code}")))?;
    let blob = row.bytes(17)?;
    let meta = row.opt_bytes(20)?;
    let mut v = ObjectVersion {
        id: ObjectId(id),
        filespace: FilespaceId(row.int(1)?),
        path: row.bytes(3)?,
        kind: if state == STATE_ARCHIVE { ObjectKind::Archive } else { ObjectKind::Backup },
        active: state == STATE_ACTIVE,
        object_type,
        attrs: Attributes {
            size: row.int(5)? as u64,
            mtime_ns: row.int(6)?,
            ctime_ns: row.int(7)?,
            mode: row.int(8)? as u32,
            uid: row.int(9)? as u32,
            gid: row.int(10)? as u32,
            link_target: row.opt_bytes(16)?,
            ino: row.int(18)? as u64,
            // The rest is in the `meta` column, read below.
            ..Attributes::default()
        },
        inserted: row.int(11)?,
        deactivated: row.opt_int(12)?,
        mgmt_class: row.opt_int(13)?.map(MgmtClassId),
        description: row.opt_text(14)?,
        retain_until: row.opt_int(15)?,
        chunks: chunk_list::decode(&blob)
            .map_err(|e| CatalogError::Damaged(format!("object {id}: {e}")))?,
        damaged: row.int(19)? != 0,
    };
    crate::meta::apply(id, meta.as_deref(), &mut v.attrs)?;
    Ok(v)
}

/// A chunk from a row of [`CHUNK_COLUMNS`].
fn chunk_from_row(row: &dyn Row) -> Result<Chunk> {
    Ok(Chunk {
        id: ChunkRowId(row.int(0)?),
        location: NewChunk {
            container: ContainerId(row.int(1)? as u64),
            offset: row.int(2)? as u64,
            stored_len: row.int(3)? as u32,
            raw_len: row.int(4)? as u32,
            codec: row.int(5)? as u16,
        },
        refcount: row.int(6)? as u64,
    })
}

impl<B: Backend + std::fmt::Debug> Catalog for B {
    fn schema_version(&self) -> Result<u32> {
        self.read_schema_version()
    }

    fn sql(&self) -> &dyn Backend {
        self
    }

    fn is_shared(&self) -> bool {
        self.shared()
    }

    // --- policy ---
    fn define_domain(&self, name: &str, description: &str) -> Result<DomainId> {
        policy::define_domain(self, name, description)
    }
    fn domain(&self, name: &str) -> Result<Option<Domain>> {
        policy::domain(self, name)
    }
    fn define_mgmt_class(
        &self,
        domain: DomainId,
        name: &str,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<MgmtClassId> {
        policy::define_mgmt_class(self, domain, name, backup, archive)
    }
    fn mgmt_classes(&self, domain: DomainId) -> Result<Vec<MgmtClass>> {
        policy::mgmt_classes(self, domain)
    }
    fn domains(&self) -> Result<Vec<Domain>> {
        policy::domains(self)
    }
    fn delete_domain(&self, domain: DomainId) -> Result<()> {
        policy::delete_domain(self, domain)
    }
    fn update_mgmt_class(
        &self,
        class: MgmtClassId,
        backup: BackupCopyGroup,
        archive: ArchiveCopyGroup,
    ) -> Result<()> {
        policy::update_mgmt_class(self, class, backup, archive)
    }
    fn delete_mgmt_class(&self, class: MgmtClassId) -> Result<()> {
        policy::delete_mgmt_class(self, class)
    }
    fn set_node_domain(&self, node: NodeId, domain: DomainId) -> Result<()> {
        policy::set_node_domain(self, node, domain)
    }

    // --- nodes, administrators and filespaces ---
    fn register_node(&self, name: &str, password_hash: &str, domain: DomainId) -> Result<NodeId> {
        accounts::register_node(self, name, password_hash, domain)
    }
    fn node(&self, name: &str) -> Result<Option<Node>> {
        accounts::node(self, name)
    }
    fn nodes(&self) -> Result<Vec<Node>> {
        accounts::nodes(self)
    }
    fn set_node_locked(&self, node: NodeId, locked: bool) -> Result<()> {
        accounts::set_node_locked(self, node, locked)
    }
    fn register_admin(
        &self,
        name: &str,
        password_hash: &str,
        privileges: &[Privilege],
    ) -> Result<()> {
        accounts::register_admin(self, name, password_hash, privileges)
    }
    fn set_admin_privileges(&self, name: &str, privileges: &[Privilege]) -> Result<()> {
        accounts::set_admin_privileges(self, name, privileges)
    }
    fn set_password(&self, admin: bool, name: &str, password_hash: &str) -> Result<()> {
        accounts::set_password(self, admin, name, password_hash)
    }
    fn set_admin_locked(&self, name: &str, locked: bool) -> Result<()> {
        accounts::set_admin_locked(self, name, locked)
    }
    fn remove_admin(&self, name: &str) -> Result<()> {
        accounts::remove_admin(self, name)
    }
    fn admin(&self, name: &str) -> Result<Option<Admin>> {
        accounts::admin(self, name)
    }
    fn filespace(&self, node: NodeId, name: &str) -> Result<FilespaceId> {
        filespaces::filespace(self, node, name)
    }
    fn filespaces(&self, node: NodeId) -> Result<Vec<Filespace>> {
        filespaces::filespaces(self, node)
    }
    fn record_backup(&self, filespace: FilespaceId, run: &BackupRun) -> Result<()> {
        filespaces::record_backup(self, filespace, run)
    }
    fn backup_runs(&self, filespace: FilespaceId, since: Timestamp) -> Result<Vec<BackupRun>> {
        filespaces::backup_runs(self, filespace, since)
    }
    fn define_schedule(
        &self,
        domain: DomainId,
        name: &str,
        spec: &ScheduleSpec,
    ) -> Result<ScheduleId> {
        schedules::define_schedule(self, domain, name, spec)
    }
    fn update_schedule(&self, id: ScheduleId, spec: &ScheduleSpec) -> Result<()> {
        schedules::update_schedule(self, id, spec)
    }
    fn delete_schedule(&self, id: ScheduleId) -> Result<()> {
        schedules::delete_schedule(self, id)
    }
    fn schedules(&self) -> Result<Vec<Schedule>> {
        schedules::schedules(self)
    }
    fn claim_event(
        &self,
        schedule: ScheduleId,
        node: Option<NodeId>,
        window_start: Timestamp,
        state: &str,
        now: Timestamp,
    ) -> Result<Option<i64>> {
        schedules::claim_event(self, schedule, node, window_start, state, now)
    }
    fn end_event(&self, id: i64, state: &str, detail: &str, now: Timestamp) -> Result<()> {
        schedules::end_event(self, None, id, state, detail, now)
    }
    fn events(&self, since: Timestamp) -> Result<Vec<Event>> {
        schedules::events(self, since)
    }
    fn node_events(&self, node: NodeId, since: Timestamp) -> Result<Vec<Event>> {
        schedules::node_events(self, node, since)
    }
    fn started_node_events(&self) -> Result<Vec<Event>> {
        schedules::started_node_events(self)
    }
    fn end_node_event(
        &self,
        node: NodeId,
        id: i64,
        state: &str,
        detail: &str,
        now: Timestamp,
    ) -> Result<()> {
        schedules::end_event(self, Some(node), id, state, detail, now)
    }
    fn associate(&self, schedule: ScheduleId, node: NodeId) -> Result<bool> {
        schedules::associate(self, schedule, node)
    }
    fn dissociate(&self, schedule: ScheduleId, node: NodeId) -> Result<()> {
        schedules::dissociate(self, schedule, node)
    }
    fn associations(&self) -> Result<Vec<Association>> {
        schedules::associations(self)
    }
    fn define_cloptset(&self, name: &str, description: &str) -> Result<()> {
        options::define_cloptset(self, name, description)
    }
    fn delete_cloptset(&self, name: &str) -> Result<()> {
        options::delete_cloptset(self, name)
    }
    fn add_clientopt(&self, set: &str, opt: &ClientOpt, replace: bool) -> Result<()> {
        options::add_clientopt(self, set, opt, replace)
    }
    fn delete_clientopt(&self, set: &str, name: &str) -> Result<u64> {
        options::delete_clientopt(self, set, name)
    }
    fn cloptsets(&self) -> Result<Vec<OptionSet>> {
        options::cloptsets(self)
    }
    fn set_node_cloptset(&self, node: NodeId, set: Option<&str>) -> Result<()> {
        options::set_node_cloptset(self, node, set)
    }
    fn node_cloptset(&self, node: NodeId) -> Result<Option<OptionSet>> {
        options::node_cloptset(self, node)
    }
    fn delete_filespace(
        &self,
        filespace: FilespaceId,
        batch: usize,
        stop: &AtomicBool,
    ) -> Result<u64> {
        filespaces::delete_filespace(self, filespace, batch, stop)
    }
    fn delete_node(&self, node: NodeId) -> Result<()> {
        accounts::delete_node(self, node)
    }
    fn set_retain_min(&self, class: MgmtClassId, days: u32) -> Result<()> {
        policy::set_retain_min(self, class, days)
    }
    fn hold(
        &self,
        node: NodeId,
        filespace: Option<FilespaceId>,
        kind: HoldKind,
        by: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool> {
        holds::hold(self, node, filespace, kind, by, reason, now)
    }
    fn release(
        &self,
        node: NodeId,
        filespace: Option<FilespaceId>,
        kind: HoldKind,
    ) -> Result<bool> {
        holds::release(self, node, filespace, kind)
    }
    fn holds(&self) -> Result<Vec<Hold>> {
        holds::holds(self)
    }
    fn protection(&self, filespace: FilespaceId, now: Timestamp) -> Result<Protection> {
        holds::protection(self, filespace, now)
    }
    fn add_backup_stats(
        &self,
        filespace: FilespaceId,
        stats: &BackupStats,
        keep: usize,
        baseline: bool,
        judge: &dyn Fn(&[BackupStats], &BackupStats) -> Option<String>,
    ) -> Result<(BackupStats, Option<String>)> {
        holds::add_backup_stats(self, filespace, stats, keep, baseline, judge)
    }
    fn backup_stats(&self, filespace: FilespaceId) -> Result<Vec<BackupStats>> {
        holds::backup_stats(self, filespace)
    }

    // --- pools and containers ---
    fn define_pool(&self, name: &str, kind: &str, location: &str) -> Result<PoolId> {
        pools::define_pool(self, name, kind, location)
    }
    fn pools(&self) -> Result<Vec<StoragePool>> {
        pools::pools(self)
    }
    fn containers(&self, pool: PoolId) -> Result<Vec<Container>> {
        pools::containers(self, pool)
    }
    fn pool_usage(&self, pool: PoolId) -> Result<PoolUsage> {
        pools::pool_usage(self, pool)
    }
    fn chunks_in_container(&self, container: ContainerId) -> Result<Vec<Chunk>> {
        pools::chunks_in_container(self, container)
    }

    // --- deduplication and keys ---
    fn dedup_scope(&self, node: NodeId, new_secret: [u8; 32]) -> Result<DedupScope> {
        chunks::dedup_scope(self, node, new_secret)
    }
    fn set_dedup_scope(
        &self,
        node: NodeId,
        name: &str,
        new_secret: [u8; 32],
    ) -> Result<DedupScope> {
        chunks::set_dedup_scope(self, node, name, new_secret)
    }
    fn find_chunks(
        &self,
        scope: DedupScopeId,
        sealed: bool,
        hashes: &[[u8; 32]],
    ) -> Result<Vec<Option<ChunkRowId>>> {
        chunks::find_chunks(self, scope, sealed, hashes)
    }
    fn dedup_epoch(&self) -> Result<u64> {
        chunks::dedup_epoch(self)
    }
    fn node_key(&self, node: NodeId) -> Result<Option<Vec<u8>>> {
        accounts::node_key(self, node)
    }
    fn set_node_key(&self, node: NodeId, key_file: &[u8]) -> Result<()> {
        accounts::set_node_key(self, node, key_file)
    }

    // --- objects ---
    fn begin(&self) -> Result<Box<dyn Txn + '_>> {
        Ok(Box::new(txn::SqlTxn::begin(self)?))
    }
    fn for_each_active(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        inventory::for_each_active(self, filespace, visit)
    }
    fn for_each_version(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        inventory::for_each_version(self, filespace, visit)
    }
    fn for_each_expirable(
        &self,
        filespace: FilespaceId,
        visit: &mut dyn FnMut(&ExpiryRow) -> Result<()>,
    ) -> Result<()> {
        inventory::for_each_expirable(self, filespace, visit)
    }
    fn versions(&self, filespace: FilespaceId, path: &[u8]) -> Result<Vec<ObjectVersion>> {
        inventory::versions(self, filespace, path)
    }
    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        inventory::object(self, id)
    }
    fn object_chunks(&self, object: ObjectId) -> Result<Vec<ChunkRef>> {
        inventory::object_chunks(self, object)
    }
    fn objects_chunks(&self, objects: &[ObjectId]) -> Result<Vec<Option<crate::ObjectChunks>>> {
        inventory::objects_chunks(self, objects)
    }

    // --- integrity, audit and size ---
    fn objects_using(&self, chunks: &HashSet<ChunkRowId>) -> Result<(Vec<VersionRef>, ObjectId)> {
        integrity::objects_using(self, chunks)
    }
    fn mark_damaged(
        &self,
        chunks: &[ChunkRowId],
        objects: &[ObjectId],
        after: ObjectId,
    ) -> Result<()> {
        integrity::mark_damaged(self, chunks, objects, after)
    }
    fn put_replica_node(
        &self,
        name: &str,
        account: &str,
        password_hash: &str,
        domain: DomainId,
        incarnation: i64,
    ) -> Result<NodeId> {
        replicas::put_replica_node(self, name, account, password_hash, domain, incarnation)
    }
    fn replica_versions(&self, filespace: FilespaceId) -> Result<Vec<(ObjectId, bool)>> {
        replicas::replica_versions(self, filespace)
    }
    fn deactivate_origins(
        &self,
        filespace: FilespaceId,
        origins: &[(ObjectId, Timestamp)],
    ) -> Result<u64> {
        replicas::deactivate_origins(self, filespace, origins)
    }
    fn object_by_origin(
        &self,
        filespace: FilespaceId,
        origin: ObjectId,
    ) -> Result<Option<ObjectId>> {
        replicas::object_by_origin(self, filespace, origin)
    }
    fn repair_chunk(
        &self,
        id: ChunkRowId,
        from: (ContainerId, u64),
        to: &NewChunk,
        users: &[ObjectId],
    ) -> Result<bool> {
        replicas::repair_chunk(self, id, from, to, users)
    }
    fn damaged_chunks(&self) -> Result<Vec<ChunkRef>> {
        replicas::damaged_chunks(self)
    }
    fn define_peer_server(&self, server: &PeerServer) -> Result<()> {
        replicas::define_peer_server(self, server)
    }
    fn delete_peer_server(&self, name: &str) -> Result<()> {
        replicas::delete_peer_server(self, name)
    }
    fn peer_servers(&self) -> Result<Vec<PeerServer>> {
        replicas::peer_servers(self)
    }
    fn state_value(&self, name: &str) -> Result<Option<i64>> {
        integrity::state_value(self, name)
    }
    fn set_state_value(&self, name: &str, value: i64) -> Result<()> {
        integrity::set_state_value(self, name, value)
    }
    fn snapshot(&self, dest: &Path) -> Result<()> {
        self.copy_to(dest)
    }
    fn check(&self) -> Result<ConsistencyReport> {
        integrity::check(self)
    }
    fn stats(&self) -> Result<CatalogStats> {
        integrity::stats(self)
    }

    // --- sessions, processes, activity log ---
    fn update_session(&self, session: SessionId, bytes: u64, objects: u64) -> Result<()> {
        sessions::update_session(self, session, bytes, objects)
    }
    fn running_sessions(&self) -> Result<Vec<Session>> {
        sessions::running_sessions(self)
    }
    fn end_process(&self, process: ProcessId, state: &str, detail: &str) -> Result<()> {
        sessions::end_process(self, process, state, detail)
    }
    fn process(&self, process: ProcessId) -> Result<Option<Process>> {
        sessions::process(self, process)
    }
    fn log(
        &self,
        severity: Severity,
        message: &str,
        node: Option<NodeId>,
        session: Option<SessionId>,
        process: Option<ProcessId>,
    ) -> Result<()> {
        sessions::log(self, severity, message, node, session, process)
    }
    fn activity(&self, since: Timestamp, limit: u32) -> Result<Vec<ActivityEntry>> {
        sessions::activity(self, since, limit)
    }
}

/// Runs one statement changing the row of `what` named `key`; not finding it is an error.
pub(super) fn update_one(
    b: &dyn Backend,
    op: &'static str,
    sql: &str,
    args: &[Arg<'_>],
    what: &'static str,
    key: &dyn ToString,
) -> Result<()> {
    let n = crate::sql::auto(b, op, |s| s.execute(sql, args))?;
    if n == 0 {
        return Err(CatalogError::NotFound { what, key: key.to_string() });
    }
    Ok(())
}
