//! The records of the catalog and of the node interface. Plain data: no behaviour, no database types.

/// Id of a node (a client machine or account).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub i64);
/// Id of a filespace (a file system or top-level directory of a node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FilespaceId(pub i64);
/// Id of one object version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub i64);
/// Id of a chunk's catalog row (one stored frame); not the keyed content hash a client
/// computes (`qsm_crypt::ChunkId`), which a chunk may carry in [`ChunkKey::hash`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkRowId(pub i64);
/// Id of a policy domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(pub i64);
/// Id of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScheduleId(pub i64);
/// Id of a management class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MgmtClassId(pub i64);
/// Id of a storage pool's catalog record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub i64);
/// Id of a container, as the pool chose it (a random 64-bit number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(pub u64);
/// Id of a client session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub i64);
/// Id of a server process (expiration, reclamation, audit...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(pub i64);

/// Seconds since the Unix epoch.
pub type Timestamp = i64;

/// A policy domain: the policy nodes in it follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// Id.
    pub id: DomainId,
    /// Unique name.
    pub name: String,
    /// Free text.
    pub description: String,
}

/// How many backup versions to keep and for how long (TSM's backup copy group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupCopyGroup {
    /// Versions kept while the file exists.
    pub versions_exist: u32,
    /// Versions kept after the file was deleted.
    pub versions_deleted: u32,
    /// Days an inactive version is kept (but the last one).
    pub retain_extra_days: u32,
    /// Days the last inactive version is kept.
    pub retain_only_days: u32,
}

impl Default for BackupCopyGroup {
    /// TSM's defaults: 2 / 1 / 30 / 60.
    fn default() -> Self {
        BackupCopyGroup {
            versions_exist: 2,
            versions_deleted: 1,
            retain_extra_days: 30,
            retain_only_days: 60,
        }
    }
}

/// How long archives are kept (TSM's archive copy group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveCopyGroup {
    /// Days an archive is kept.
    pub retain_version_days: u32,
}

impl Default for ArchiveCopyGroup {
    /// TSM's default: 365 days.
    fn default() -> Self {
        ArchiveCopyGroup { retain_version_days: 365 }
    }
}

/// A management class with its copy groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MgmtClass {
    /// Id.
    pub id: MgmtClassId,
    /// Domain it belongs to.
    pub domain: DomainId,
    /// Name, unique within the domain.
    pub name: String,
    /// Backup policy.
    pub backup: BackupCopyGroup,
    /// Archive policy.
    pub archive: ArchiveCopyGroup,
    /// Days every version bound to the class is kept at least, whoever asks for its deletion
    /// (0: no minimum). Stamped on each version when it is stored.
    pub retain_min_days: u32,
}

/// A registered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Id.
    pub id: NodeId,
    /// Unique name.
    pub name: String,
    /// Password hash (argon2id PHC string), never the password.
    pub password_hash: String,
    /// Policy domain.
    pub domain: DomainId,
    /// A locked node cannot open sessions.
    pub locked: bool,
    /// Registration time.
    pub registered: Timestamp,
    /// A node replicated here from another server: the replication account that made it,
    /// the only one that may update it; its versions are restored here, never backed up.
    pub replica_of: Option<String>,
}

/// A server this one replicates nodes to (`define server`): where it is, the certificate that
/// proves it, and the replication account this server logs in as there.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerServer {
    /// Unique name.
    pub name: String,
    /// `https://HOST:PORT` (or `http://` on loopback).
    pub address: String,
    /// PEM certificate(s) to trust for its TLS.
    pub ca: String,
    /// The account on it.
    pub account: String,
    /// That account's password, which this server must present (kept in the catalog, as the
    /// dedup scopes' secrets are: whoever reads the catalog holds every node's data anyway).
    pub password: String,
    /// When it was defined.
    pub created: Timestamp,
}

impl std::fmt::Debug for PeerServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerServer")
            .field("name", &self.name)
            .field("address", &self.address)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// An administrator account (it owns no data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// Unique name.
    pub name: String,
    /// Password hash (argon2id PHC string).
    pub password_hash: String,
    /// A locked administrator cannot log in.
    pub locked: bool,
    /// Registration time.
    pub registered: Timestamp,
    /// What the administrator may do beyond queries.
    pub privileges: Vec<Privilege>,
}

/// An administrator's privilege class (TSM's). Every administrator may query; each class
/// adds a kind of change, and `System` holds them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Privilege {
    /// Everything, including administrators, expiration and the catalog's restore.
    System,
    /// Policy domains, management classes and nodes.
    Policy,
    /// Storage pools: reclamation, audit, catalog backups.
    Storage,
    /// Sessions and processes: cancel them; catalog backups.
    Operator,
    /// Only the replication of nodes into this server (the account a source server logs in
    /// as): no queries, no other change.
    Replication,
}

impl Privilege {
    /// Every class, in the order they are listed.
    pub const ALL: [Privilege; 5] = [
        Privilege::System,
        Privilege::Policy,
        Privilege::Storage,
        Privilege::Operator,
        Privilege::Replication,
    ];

    /// The name used in commands and the catalog.
    pub fn name(self) -> &'static str {
        match self {
            Privilege::System => "system",
            Privilege::Policy => "policy",
            Privilege::Storage => "storage",
            Privilege::Operator => "operator",
            Privilege::Replication => "replication",
        }
    }

    /// The class called `name`.
    pub fn parse(name: &str) -> Option<Privilege> {
        Privilege::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }

    /// A comma-separated list (empty: none), as stored; unknown names are an error naming them.
    pub fn parse_list(text: &str) -> std::result::Result<Vec<Privilege>, String> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty() && *p != "none") {
            let p = Privilege::parse(part).ok_or_else(|| {
                format!(
                    "unknown privilege class {part:?}: use system, policy, storage, operator or \
                     replication"
                )
            })?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The list as stored and shown ("" for none).
    pub fn join(list: &[Privilege]) -> String {
        list.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
    }
}

/// A filespace of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filespace {
    /// Id.
    pub id: FilespaceId,
    /// Owner.
    pub node: NodeId,
    /// Name (e.g. the mount point).
    pub name: String,
    /// Creation time.
    pub created: Timestamp,
    /// Changes, to a new random value, whenever the active inventory changes.
    pub generation: i64,
    /// Its last backup, however it ended.
    pub last_backup: Option<BackupRun>,
    /// Its last backup that completed (with or without warnings).
    pub last_completed: Option<BackupRun>,
}

/// What a schedule says (TSM's DEFINE SCHEDULE): its action, and its windows, each
/// `duration` seconds from `start + k * period`, on `days` only when some are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpec {
    /// `expire`, `reclaim`, `audit` or `backup-db` (run by the server).
    pub action: String,
    /// What the action works on (paths, for client actions).
    pub objects: Vec<String>,
    /// The first window's start, seconds since the epoch (UTC).
    pub start: Timestamp,
    /// How long each window stays open for the action to start, seconds.
    pub duration: i64,
    /// Seconds from one window's start to the next.
    pub period: i64,
    /// Weekdays (`mon` ... `sun`, UTC) the windows fall on; empty: every day.
    pub days: Vec<String>,
}

/// A schedule of a policy domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub id: ScheduleId,
    pub domain: DomainId,
    pub domain_name: String,
    pub name: String,
    pub spec: ScheduleSpec,
    /// When it was defined or last updated: windows before are not missed.
    pub defined: Timestamp,
}

/// A node a client schedule runs for (TSM's DEFINE ASSOCIATION).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Association {
    pub schedule: ScheduleId,
    pub domain_name: String,
    pub schedule_name: String,
    pub node: NodeId,
    pub node_name: String,
    /// When it was made: the node misses no window before.
    pub since: Timestamp,
}

/// One option of a client option set (TSM's DEFINE CLIENTOPT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOpt {
    /// The option, as client.toml names it (`compression`, `exclude`, ...).
    pub name: String,
    pub value: String,
    /// Whether it overrides the node's own flags and configuration, rather than filling in
    /// what they leave unset.
    pub force: bool,
}

/// A client option set (TSM's DEFINE CLOPTSET): options the server gives the nodes that use
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionSet {
    pub name: String,
    pub description: String,
    /// In the order they were defined (include and exclude patterns keep it).
    pub options: Vec<ClientOpt>,
}

/// The states an event is recorded in: a run under way, how it ended (a [`RunResult`]), or
/// why there was none (`missed`), or why it never reported (`severed`); a backup that
/// completed far outside its filespace's baseline is `suspect`. `query event` adds each next
/// window as `future`.
pub const EVENT_STATES: [&str; 7] =
    ["started", "completed", "completed with warnings", "failed", "missed", "severed", "suspect"];

/// A run of a schedule in one of its windows (TSM's event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: i64,
    pub schedule: ScheduleId,
    pub domain_name: String,
    pub schedule_name: String,
    pub action: String,
    /// The node it ran for; `None` for a server action.
    pub node: Option<String>,
    pub window_start: Timestamp,
    /// `started`, `completed`, `completed with warnings`, `failed`, `missed` or `severed`.
    pub state: String,
    pub started: Option<Timestamp>,
    pub ended: Option<Timestamp>,
    /// What the run reported, or why it failed.
    pub detail: String,
}

/// One backup of a filespace, as the server saw it end: a client that finishes its upload
/// says how many warnings it had (files skipped); a stream that breaks is a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupRun {
    /// When the client started it (its scan included), seconds since the epoch.
    pub started: Timestamp,
    /// When it ended.
    pub ended: Timestamp,
    /// How it ended.
    pub result: RunResult,
    /// Objects it committed.
    pub objects: u64,
    /// Frame bytes it committed.
    pub bytes: u64,
    /// Files the client skipped or could not read whole.
    pub warnings: u64,
}

/// How a backup ended (TSM's event results).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    /// Everything was backed up.
    Completed,
    /// Finished, with files skipped.
    CompletedWithWarnings,
    /// Stopped before the end: what it committed stays.
    Failed,
}

impl RunResult {
    /// Every result, in the order the metrics count them.
    pub const ALL: [RunResult; 3] =
        [RunResult::Completed, RunResult::CompletedWithWarnings, RunResult::Failed];

    /// The name stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            RunResult::Completed => "completed",
            RunResult::CompletedWithWarnings => "completed with warnings",
            RunResult::Failed => "failed",
        }
    }

    /// The result a name stands for.
    pub fn parse(name: &str) -> Option<RunResult> {
        RunResult::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// A storage pool's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoragePool {
    /// Id of the record.
    pub id: PoolId,
    /// Unique name.
    pub name: String,
    /// Backend kind ("dir", "s3").
    pub kind: String,
    /// Where it is (a directory, a bucket URL).
    pub location: String,
}

/// How a pool's space is used, as the catalog records it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Containers.
    pub containers: u64,
    /// Bytes the containers hold (as last recorded).
    pub bytes: u64,
    /// Chunks recorded.
    pub chunks: u64,
    /// Bytes of frames still referenced: what reclamation keeps.
    pub live_bytes: u64,
    /// Chunks an audit marked damaged.
    pub damaged_chunks: u64,
}

/// A container's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Container {
    /// Id chosen by the pool.
    pub id: ContainerId,
    /// Pool it lives in.
    pub pool: PoolId,
    /// Bytes written to it as last recorded.
    pub size: u64,
    /// Whether it is sealed (no more appends).
    pub sealed: bool,
}

/// Where a chunk's frame lives, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewChunk {
    /// Container of the frame.
    pub container: ContainerId,
    /// Offset of the frame in the container.
    pub offset: u64,
    /// Frame length (header and payload).
    pub stored_len: u32,
    /// Raw bytes the frame decodes to.
    pub raw_len: u32,
    /// Codec id of the frame.
    pub codec: u16,
}

/// A chunk record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Id.
    pub id: ChunkRowId,
    /// Location and sizes.
    pub location: NewChunk,
    /// Object versions that reference it.
    pub refcount: u64,
}

/// Backup or archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A backup version (active or inactive).
    Backup,
    /// An archive copy, kept by its own retention.
    Archive,
}

/// What the object is on the client's file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (its target in `link_target`).
    Symlink,
    /// A named pipe (FIFO).
    Fifo,
    /// A character device (its device number in `rdev`).
    CharDevice,
    /// A block device (its device number in `rdev`).
    BlockDevice,
    /// Another name of a regular file backed up in the same backup: `link_target` is the path
    /// (within the filespace) of the group's first name in path order, whose version holds
    /// the data. It has no chunks of its own.
    Hardlink,
}

impl ObjectType {
    /// The type's permanent code, in the catalog and in meta encodings: never renumber.
    pub fn code(self) -> i64 {
        match self {
            ObjectType::File => 0,
            ObjectType::Directory => 1,
            ObjectType::Symlink => 2,
            ObjectType::Fifo => 3,
            ObjectType::CharDevice => 4,
            ObjectType::BlockDevice => 5,
            ObjectType::Hardlink => 6,
        }
    }
    /// The name `qsm query` shows.
    pub fn name(self) -> &'static str {
        match self {
            ObjectType::File => "file",
            ObjectType::Directory => "dir",
            ObjectType::Symlink => "symlink",
            ObjectType::Fifo => "fifo",
            ObjectType::CharDevice => "chardev",
            ObjectType::BlockDevice => "blockdev",
            ObjectType::Hardlink => "hardlink",
        }
    }
    /// The type of a code, `None` for codes this version does not know.
    pub fn from_code(code: i64) -> Option<ObjectType> {
        match code {
            0 => Some(ObjectType::File),
            1 => Some(ObjectType::Directory),
            2 => Some(ObjectType::Symlink),
            3 => Some(ObjectType::Fifo),
            4 => Some(ObjectType::CharDevice),
            5 => Some(ObjectType::BlockDevice),
            6 => Some(ObjectType::Hardlink),
            _ => None,
        }
    }
}

/// One extended attribute: its full name (`user.comment`) and its value, raw bytes.
pub type Xattr = (Vec<u8>, Vec<u8>);

/// File-system metadata of an object version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Inode change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
    /// Unix mode bits.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Symlink target.
    pub link_target: Option<Vec<u8>>,
    /// Inode number on the client (0: not recorded). Compared by incremental backup only, never
    /// restored.
    pub ino: u64,
    /// Device number of a character or block device (0 otherwise). Kept in the `meta`
    /// column ([`crate::meta`]).
    pub rdev: u64,
    /// Extended attributes, `(name, value)` in name order, of every namespace the backup
    /// could read (`user.`, `trusted.`, `security.`, and `system.` — POSIX ACLs are their
    /// `system.posix_acl_access` / `system.posix_acl_default` values, byte for byte). Kept in
    /// the `meta` column ([`crate::meta`]).
    pub xattrs: Vec<Xattr>,
    /// A sparse file's data extents, `(offset, length)` in file order, not overlapping, within
    /// `size`: its chunks hold only these bytes, one after the other, and everything else is
    /// a hole. `None`: an ordinary file, whose chunks hold all `size` bytes. Kept in the
    /// `meta` column ([`crate::meta`]).
    pub extents: Option<Vec<(u64, u64)>>,
    /// The key a file's data was sealed with (its fingerprint's 16 bytes), `None` for data
    /// stored in the clear or recorded before keys were (an incremental backup with
    /// encryption on sends a file again when this is not its key). Kept in the `meta`
    /// column ([`crate::meta`]).
    pub sealed_by: Option<[u8; 16]>,
}

impl Attributes {
    /// The bytes an object's chunks hold: its data extents' total for a sparse file, else its
    /// size.
    pub fn data_len(&self) -> u64 {
        match &self.extents {
            Some(extents) => extents.iter().map(|(_, len)| len).sum(),
            None => self.size,
        }
    }
}

/// A dedup scope's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupScopeId(pub i64);

/// A dedup scope: the nodes in it deduplicate against each other's chunks, and only they.
#[derive(Clone, PartialEq, Eq)]
pub struct DedupScope {
    /// Id.
    pub id: DedupScopeId,
    /// Name (`node:NAME` for a node's own scope).
    pub name: String,
    /// The secret chunk ids are keyed with by nodes that back up without encryption (nodes
    /// with encryption key ids with their own master key instead).
    pub secret: [u8; 32],
}

impl std::fmt::Debug for DedupScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupScope").field("id", &self.id).field("name", &self.name).finish()
    }
}

/// A new chunk's keyed id, and the scope it is offered to for deduplication (`None`: kept only
/// so restore can check it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkKey {
    /// The keyed id.
    pub hash: [u8; 32],
    /// The dedup scope.
    pub scope: Option<DedupScopeId>,
    /// Whether the frame is sealed (encrypted): sealed and plaintext chunks of one id are
    /// different chunks.
    pub sealed: bool,
}

/// A chunk of a new object: a frame stored in this transaction, or one already in the catalog
/// (deduplication).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectChunk {
    /// A new chunk; it is created with this object as its first reference.
    New(NewChunk),
    /// A new chunk with its keyed id. If its scope already holds a chunk of that id (another
    /// session stored the same content first), that chunk gains the reference instead and
    /// this frame is left unreferenced: the unique constraint decides, not a race.
    Keyed(NewChunk, ChunkKey),
    /// An existing chunk; its reference count grows by one.
    Existing(ChunkRowId),
}

/// An object version to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewObject {
    /// Filespace.
    pub filespace: FilespaceId,
    /// Path within the filespace, as raw bytes (Unix names need not be UTF-8).
    pub path: Vec<u8>,
    /// Backup or archive.
    pub kind: ObjectKind,
    /// File, directory or symlink.
    pub object_type: ObjectType,
    /// File-system metadata.
    pub attrs: Attributes,
    /// Management class bound to it.
    pub mgmt_class: Option<MgmtClassId>,
    /// Archive description.
    pub description: Option<String>,
    /// For archives: the time after which it may be expired.
    pub retain_until: Option<Timestamp>,
    /// Its chunks, in order.
    pub chunks: Vec<ObjectChunk>,
    /// A version replicated from another server (`None` for one stored here).
    pub replica: Option<Replicated>,
}

/// Where a replicated version comes from, and its state there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicated {
    /// Its id on the source server.
    pub origin: ObjectId,
    /// When the source stored it: it keeps that time (never later than its arrival).
    pub inserted: Timestamp,
    /// When the source made it inactive, if it did: it arrives inactive.
    pub deactivated: Option<Timestamp>,
}

/// A stored object version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    /// Id.
    pub id: ObjectId,
    /// Filespace.
    pub filespace: FilespaceId,
    /// Path within the filespace.
    pub path: Vec<u8>,
    /// Backup or archive.
    pub kind: ObjectKind,
    /// Active (the newest backup of an existing file) or not; archives are never active.
    pub active: bool,
    /// File, directory or symlink.
    pub object_type: ObjectType,
    /// File-system metadata.
    pub attrs: Attributes,
    /// Management class.
    pub mgmt_class: Option<MgmtClassId>,
    /// Archive description.
    pub description: Option<String>,
    /// Archive retention limit.
    pub retain_until: Option<Timestamp>,
    /// When the server committed it.
    pub inserted: Timestamp,
    /// When it became inactive.
    pub deactivated: Option<Timestamp>,
    /// Its chunks, in order.
    pub chunks: Vec<ChunkRowId>,
    /// An audit found one of its chunks unreadable or corrupt.
    pub damaged: bool,
}

/// A chunk of an object with where to read it, for restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    /// Chunk id.
    pub id: ChunkRowId,
    /// Location and sizes.
    pub location: NewChunk,
    /// Its keyed id, if the client gave one: restore checks the data against it.
    pub hash: Option<[u8; 32]>,
    /// Offered for deduplication in a dedup scope (a keyed chunk only).
    pub scoped: bool,
    /// Its frame is sealed (encrypted).
    pub sealed: bool,
}

/// Severity of an activity-log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Information.
    Info,
    /// Something an administrator should look at.
    Warning,
    /// A failure.
    Error,
}

/// One activity-log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityEntry {
    /// Id, increasing.
    pub id: i64,
    /// When.
    pub time: Timestamp,
    /// How serious.
    pub severity: Severity,
    /// What happened.
    pub message: String,
    /// Node concerned.
    pub node: Option<NodeId>,
    /// Session concerned.
    pub session: Option<SessionId>,
    /// Process concerned.
    pub process: Option<ProcessId>,
}

/// A client session's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Id.
    pub id: SessionId,
    /// Node.
    pub node: NodeId,
    /// Start time.
    pub started: Timestamp,
    /// End time, once ended.
    pub ended: Option<Timestamp>,
    /// Bytes received.
    pub bytes: u64,
    /// Objects committed.
    pub objects: u64,
    /// "running", "ended", "cancelled", "failed".
    pub state: String,
}

/// A server process's record (expiration, reclamation, audit...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Id.
    pub id: ProcessId,
    /// What it does ("expire inventory", ...).
    pub kind: String,
    /// Start time.
    pub started: Timestamp,
    /// End time, once ended.
    pub ended: Option<Timestamp>,
    /// "running", "ended", "cancelled", "failed".
    pub state: String,
    /// Progress or result text.
    pub detail: String,
}

/// What a consistency check found. Empty `problems` means consistent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsistencyReport {
    /// Object versions examined.
    pub objects: u64,
    /// Chunks examined.
    pub chunks: u64,
    /// Chunks no object refers to (reclaimable, not an error).
    pub unreferenced_chunks: u64,
    /// Violations, each naming the record.
    pub problems: Vec<String>,
}

/// Counts and size of the catalog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatalogStats {
    /// Object versions.
    pub objects: u64,
    /// Chunks.
    pub chunks: u64,
    /// Containers.
    pub containers: u64,
    /// Bytes the database occupies.
    pub database_bytes: u64,
    /// Chunks an audit marked damaged.
    pub damaged_chunks: u64,
    /// Object versions with a damaged chunk.
    pub damaged_objects: u64,
    /// The sizes of every version kept, summed: the data the catalog protects.
    pub version_bytes: u64,
    /// The chunks' bytes before compression: the data stored once deduplicated.
    pub chunk_raw_bytes: u64,
    /// The chunks' bytes as stored (compressed, encrypted).
    pub chunk_stored_bytes: u64,
}

/// TSM's `NOLIMIT`: a count or number of days of a copy group that never expires anything.
pub const NO_LIMIT: u32 = u32::MAX;

/// The most data extents a sparse file is recorded with (1 MiB of them): a client stores a file
/// more fragmented than this as an ordinary file, holes read as zeros, and a server refuses
/// more.
pub const MAX_EXTENTS: usize = 1 << 16;

/// Checks a sparse file's extents against its size: in file order, not overlapping, none
/// empty, all within the size. A restore writes data only where they say, so a catalog or a
/// server must not be able to place it elsewhere.
pub fn check_extents(size: u64, extents: &[(u64, u64)]) -> Result<(), String> {
    let mut end = 0u64;
    for (i, &(offset, len)) in extents.iter().enumerate() {
        let stop = offset.checked_add(len).filter(|s| *s <= size);
        match stop {
            Some(stop) if len > 0 && offset >= end => end = stop,
            _ => {
                return Err(format!(
                    "data extent {i} ({len} bytes at {offset}) overlaps the one before, is \
                     empty, or ends past the file's {size} bytes"
                ));
            }
        }
    }
    Ok(())
}

/// The current time in seconds since the epoch.
pub fn now() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// How many objects and bytes one transaction may group (TSM's `txngroupmax` and
/// `txnbytelimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnLimits {
    /// Objects per transaction (TSM's `TXNGROUPMAX`).
    pub group_max: usize,
    /// Bytes of frames per transaction (TSM's `TXNBYTELIMIT`).
    pub byte_limit: u64,
}

impl TxnLimits {
    /// The most objects a transaction may be asked to hold: TSM's largest `TXNGROUPMAX`.
    /// Past it a transaction only grows the catalog's lock time and what a crash loses.
    pub const MAX_GROUP: usize = 65_000;
    /// The most frame bytes a transaction may be asked to hold: TSM's largest `TXNBYTELIMIT`
    /// (32 GiB).
    pub const MAX_BYTES: u64 = 32 << 30;
}

impl Default for TxnLimits {
    /// TSM's defaults: 4,096 objects (`TXNGROUPMAX`) and 25,600 KiB (`TXNBYTELIMIT`). Each
    /// commit costs an fsync of the pool and one of the catalog; at these sizes that is
    /// under 1% of the time to move 25 MiB, while a crash loses at most one transaction.
    fn default() -> Self {
        TxnLimits { group_max: 4096, byte_limit: 25_600 * 1024 }
    }
}

/// What a hold is: an administrator's, or one the server placed on a backup far outside its
/// filespace's baseline (issue 30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// Placed and released by an administrator (`hold` / `release`).
    Hold,
    /// Placed by the server on a suspect backup; released when an administrator acknowledges.
    Suspect,
}

impl HoldKind {
    /// As stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            HoldKind::Hold => "hold",
            HoldKind::Suspect => "suspect",
        }
    }

    /// From [`HoldKind::name`].
    pub fn parse(s: &str) -> Option<HoldKind> {
        match s {
            "hold" => Some(HoldKind::Hold),
            "suspect" => Some(HoldKind::Suspect),
            _ => None,
        }
    }
}

/// A hold: no version under it (the node's, or the filespace's) is deleted while it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The node.
    pub node: NodeId,
    /// Its name.
    pub node_name: String,
    /// The filespace, or `None` for the whole node.
    pub filespace: Option<FilespaceId>,
    /// The filespace's name (empty for the whole node).
    pub filespace_name: String,
    /// Whose and why.
    pub kind: HoldKind,
    /// Since when.
    pub since: Timestamp,
    /// Who placed it (an administrator, or "server").
    pub by: String,
    /// Why.
    pub reason: String,
}

/// The figures of one whole backup of a filespace, counted by the server from what it
/// received (a client cannot talk its way out of them): what anomaly detection compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackupStats {
    /// When the backup ended.
    pub ended: Timestamp,
    /// Active versions in the filespace after it.
    pub files: u64,
    /// Versions it stored (files new or changed).
    pub changed: u64,
    /// Bytes of file data in the frames it sent.
    pub raw_bytes: u64,
    /// Bytes of those frames as stored.
    pub stored_bytes: u64,
    /// Chunks (frames) it sent.
    pub chunks: u64,
    /// Chunks it referenced instead, held already (deduplicated).
    pub refs: u64,
    /// Whether it was found suspect.
    pub suspect: bool,
}

/// What keeps the versions of one filespace from deletion now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    /// Its holds and its node's: each kind, and whether it is on the filespace (else the
    /// node).
    pub holds: Vec<(HoldKind, bool)>,
    /// Versions under a retention lock still running.
    pub locked: u64,
    /// When the last of those locks ends.
    pub locked_until: Timestamp,
}

impl Protection {
    /// What keeps the filespace's versions, said for an administrator, with how to see and
    /// release it (`None`: nothing does).
    pub fn why(&self) -> Option<String> {
        if let Some((kind, on_fs)) = self.holds.first() {
            let on = if *on_fs { "the filespace" } else { "its node" };
            return Some(match kind {
                HoldKind::Hold => format!("{on} is held (query hold; release node)"),
                HoldKind::Suspect => format!(
                    "{on} is under a suspect hold: a suspect backup not yet acknowledged \
                     (query hold; release node --suspect)"
                ),
            });
        }
        (self.locked > 0).then(|| {
            format!(
                "{} versions are retention-locked, the last until {} UTC",
                self.locked,
                crate::time::format_time(self.locked_until)
            )
        })
    }
}
