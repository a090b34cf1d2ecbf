//! What administrative operations report, as plain values a front end renders: `qsm admin`
//! writes them as text or (`--json`) as they serialize here, so the two cannot drift, and a
//! JSON field's name is the same wherever it appears.
//!
//! They are made from the protocol's replies ([`crate::v1`]), which stay what the wire needs:
//! here an empty "stopped" reason is `null`, a container id is hex as every message prints it,
//! and rates and shares are worked out once.

use serde::{Serialize, Serializer};

use crate::v1;

/// Why a process stopped early (cancelled, its duration up), or `None` when it ran to its end.
fn stopped(reason: String) -> Option<String> {
    (!reason.is_empty()).then_some(reason)
}

/// A container id as the audit and the logs print it.
pub fn container_hex(id: u64) -> String {
    format!("{id:016x}")
}

/// One registered node.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct NodeRow {
    pub name: String,
    pub locked: bool,
    /// When it was registered (seconds since the epoch).
    pub registered: i64,
    /// A replica of another server's node: the replication account that made it.
    pub replica_of: Option<String>,
}

impl From<v1::NodeInfo> for NodeRow {
    fn from(n: v1::NodeInfo) -> NodeRow {
        let replica_of = Some(n.replica_of).filter(|r| !r.is_empty());
        NodeRow { name: n.name, locked: n.locked, registered: n.registered, replica_of }
    }
}

/// One filespace, with its node, its last backup and its last completed one (absent before
/// the first): what `qsm query filespace` and `qsm admin query filespace` show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FilespaceRow {
    /// Its node (empty where the node is the caller).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node: String,
    pub name: String,
    pub id: i64,
    pub created: i64,
    pub last_backup: Option<RunRow>,
    pub last_completed: Option<RunRow>,
}

/// How a backup of a filespace ended (seconds since the epoch, the server's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RunRow {
    pub started: i64,
    pub ended: i64,
    /// "completed", "completed with warnings" or "failed".
    pub result: &'static str,
    pub objects: u64,
    pub bytes: u64,
    /// Files skipped or not read whole.
    pub warnings: u64,
}

impl From<&qsm_types::BackupRun> for RunRow {
    fn from(r: &qsm_types::BackupRun) -> RunRow {
        RunRow {
            started: r.started,
            ended: r.ended,
            result: r.result.name(),
            objects: r.objects,
            bytes: r.bytes,
            warnings: r.warnings,
        }
    }
}

/// One backup run of a node's filespace, in its history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BackupRunRow {
    pub filespace: String,
    pub started: i64,
    pub ended: i64,
    /// "completed", "completed with warnings" or "failed".
    pub result: String,
    pub objects: u64,
    /// Frame bytes it stored.
    pub bytes: u64,
    /// Files skipped or not read whole.
    pub warnings: u64,
}

impl BackupRunRow {
    /// The row of a server's answer.
    pub fn from_wire(r: v1::FilespaceRun) -> Result<BackupRunRow, qsm_types::ServerError> {
        let run = r.run.ok_or_else(|| {
            qsm_types::ServerError::Failed(format!("a run of {} without its figures", r.filespace))
        })?;
        Ok(BackupRunRow {
            filespace: r.filespace,
            started: run.started,
            ended: run.ended,
            result: run.result,
            objects: run.objects,
            bytes: run.bytes,
            warnings: run.warnings,
        })
    }
}

impl FilespaceRow {
    /// The row of `node`'s filespace `f`.
    pub fn new(node: String, f: &qsm_types::Filespace) -> FilespaceRow {
        FilespaceRow {
            node,
            name: f.name.clone(),
            id: f.id.0,
            created: f.created,
            last_backup: f.last_backup.as_ref().map(RunRow::from),
            last_completed: f.last_completed.as_ref().map(RunRow::from),
        }
    }

    /// The row of a server's answer.
    pub fn from_wire(f: v1::NodeFilespace) -> Result<FilespaceRow, qsm_types::ServerError> {
        let wire = f.filespace.unwrap_or_default();
        let fs = crate::convert::filespace_from_wire(&wire, qsm_types::NodeId(0))
            .map_err(|e| qsm_types::ServerError::Failed(e.to_string()))?;
        Ok(FilespaceRow::new(f.node, &fs))
    }
}

/// One schedule (`query schedule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ScheduleRow {
    pub domain: String,
    pub name: String,
    pub action: String,
    pub objects: Vec<String>,
    /// The first window's start, seconds since the epoch (UTC).
    pub start: i64,
    /// Seconds each window stays open, and from one window to the next.
    pub duration: i64,
    pub period: i64,
    /// Weekdays the windows fall on; empty: every day.
    pub days: Vec<String>,
    /// The next window's start, if any.
    pub next_window: Option<i64>,
}

impl From<v1::ScheduleInfo> for ScheduleRow {
    fn from(s: v1::ScheduleInfo) -> ScheduleRow {
        ScheduleRow {
            domain: s.domain,
            name: s.name,
            action: s.action,
            objects: s.objects,
            start: s.start,
            duration: s.duration,
            period: s.period,
            days: s.days,
            next_window: (s.next_window > 0).then_some(s.next_window),
        }
    }
}

/// One run of a schedule in one of its windows (`query event`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EventRow {
    pub domain: String,
    pub schedule: String,
    pub action: String,
    /// The node it is for; none for a server action.
    pub node: Option<String>,
    pub window_start: i64,
    /// future, started, completed, completed with warnings, failed, missed or severed.
    pub state: String,
    pub started: Option<i64>,
    pub ended: Option<i64>,
    pub detail: String,
}

impl From<v1::EventInfo> for EventRow {
    fn from(e: v1::EventInfo) -> EventRow {
        let when = |t: i64| (t > 0).then_some(t);
        EventRow {
            domain: e.domain,
            schedule: e.schedule,
            action: e.action,
            node: (!e.node.is_empty()).then_some(e.node),
            window_start: e.window_start,
            state: e.state,
            started: when(e.started),
            ended: when(e.ended),
            detail: e.detail,
        }
    }
}

/// A node a client schedule runs for (`query association`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct AssociationRow {
    pub domain: String,
    pub schedule: String,
    pub node: String,
    /// When it was made, seconds since the epoch: the node misses no window before.
    pub since: i64,
}

impl From<v1::AssociationInfo> for AssociationRow {
    fn from(a: v1::AssociationInfo) -> AssociationRow {
        AssociationRow { domain: a.domain, schedule: a.schedule, node: a.node, since: a.since }
    }
}

/// One option of a client option set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ClientOptionRow {
    pub name: String,
    pub value: String,
    /// It overrides the node's own flags and configuration.
    pub force: bool,
}

/// A client option set and its options (`query cloptset`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CloptsetRow {
    pub name: String,
    pub description: String,
    pub options: Vec<ClientOptionRow>,
}

impl From<v1::Cloptset> for CloptsetRow {
    fn from(c: v1::Cloptset) -> CloptsetRow {
        CloptsetRow {
            name: c.name,
            description: c.description,
            options: c
                .options
                .into_iter()
                .map(|o| ClientOptionRow { name: o.name, value: o.value, force: o.force })
                .collect(),
        }
    }
}

/// A hold on a node or a filespace (`query hold`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct HoldRow {
    pub node: String,
    /// Empty: the whole node.
    pub filespace: String,
    /// `hold` (an administrator's) or `suspect` (the server's, on a suspect backup).
    pub kind: String,
    pub since: i64,
    pub by: String,
    pub reason: String,
}

impl From<v1::HoldInfo> for HoldRow {
    fn from(h: v1::HoldInfo) -> HoldRow {
        HoldRow {
            node: h.node,
            filespace: h.filespace,
            kind: h.kind,
            since: h.since,
            by: h.by,
            reason: h.reason,
        }
    }
}

/// One open session.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SessionRow {
    pub id: u64,
    pub account: String,
    /// An administrator's session (else a node's).
    pub admin: bool,
    pub client: String,
    pub peer: String,
    pub started: i64,
    pub bytes: u64,
    pub objects: u64,
    /// Since the session started.
    pub bytes_per_second: f64,
    pub state: String,
    /// The server holding it (servers sharing a catalog list each other's sessions).
    pub server: String,
}

impl SessionRow {
    /// The row of `s`, its rate worked out at `now`.
    pub fn new(s: v1::SessionInfo, now: i64) -> SessionRow {
        let bytes_per_second = s.bytes as f64 / (now - s.started).max(1) as f64;
        SessionRow {
            id: s.id,
            account: s.account,
            admin: s.admin,
            client: s.client,
            peer: s.peer,
            started: s.started,
            bytes: s.bytes,
            objects: s.objects,
            bytes_per_second,
            state: s.state,
            server: s.server,
        }
    }
}

/// One server process running now.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ProcessRow {
    pub id: u64,
    pub kind: String,
    pub started: i64,
    pub progress: String,
    pub server: String,
}

impl From<v1::ProcessInfo> for ProcessRow {
    fn from(p: v1::ProcessInfo) -> ProcessRow {
        ProcessRow {
            id: p.id,
            kind: p.kind,
            started: p.started,
            progress: p.progress,
            server: p.server,
        }
    }
}

/// `expire inventory`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ExpireReport {
    pub process: u64,
    /// Versions looked at.
    pub examined: u64,
    /// Backup versions deleted.
    pub backups: u64,
    /// Archives deleted.
    pub archives: u64,
    /// Versions due that a retention lock or a hold kept.
    pub protected: u64,
    pub filespaces: u64,
    pub stopped: Option<String>,
    pub seconds: f64,
}

impl From<v1::ExpireReply> for ExpireReport {
    fn from(r: v1::ExpireReply) -> ExpireReport {
        ExpireReport {
            process: r.process,
            examined: r.examined,
            backups: r.backups,
            archives: r.archives,
            protected: r.protected,
            filespaces: r.filespaces,
            stopped: stopped(r.stopped),
            seconds: r.seconds,
        }
    }
}

/// `delete filespace`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeleteFilespaceReport {
    pub process: u64,
    pub versions: u64,
    pub stopped: Option<String>,
    pub seconds: f64,
}

impl From<v1::DeleteFilespaceReply> for DeleteFilespaceReport {
    fn from(r: v1::DeleteFilespaceReply) -> DeleteFilespaceReport {
        DeleteFilespaceReport {
            process: r.process,
            versions: r.versions,
            stopped: stopped(r.stopped),
            seconds: r.seconds,
        }
    }
}

/// A management class's copy groups; [`qsm_types::model::NO_LIMIT`] is "nolimit".
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ClassRow {
    pub name: String,
    pub versions_exist: u32,
    pub versions_deleted: u32,
    pub retain_extra_days: u32,
    pub retain_only_days: u32,
    pub retain_version_days: u32,
    /// Days every version is kept at least, whoever asks (0: no minimum).
    pub retain_min_days: u32,
}

/// A policy domain with its nodes and classes.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DomainRow {
    pub name: String,
    pub description: String,
    pub nodes: Vec<String>,
    pub classes: Vec<ClassRow>,
}

impl From<v1::DomainInfo> for DomainRow {
    fn from(d: v1::DomainInfo) -> DomainRow {
        DomainRow {
            name: d.name,
            description: d.description,
            nodes: d.nodes,
            classes: d
                .classes
                .into_iter()
                .map(|c| ClassRow {
                    name: c.name,
                    versions_exist: c.versions_exist,
                    versions_deleted: c.versions_deleted,
                    retain_extra_days: c.retain_extra_days,
                    retain_only_days: c.retain_only_days,
                    retain_version_days: c.retain_version_days,
                    retain_min_days: c.retain_min_days,
                })
                .collect(),
        }
    }
}

/// `reclaim stgpool`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReclaimReport {
    pub process: u64,
    /// Containers rewritten.
    pub containers: u64,
    /// Containers no catalog record names, deleted.
    pub orphans: u64,
    /// Orphans were left alone: servers may share the pool.
    pub orphans_skipped: bool,
    pub stopped: Option<String>,
    pub seconds: f64,
}

impl From<v1::ReclaimReply> for ReclaimReport {
    fn from(r: v1::ReclaimReply) -> ReclaimReport {
        ReclaimReport {
            process: r.process,
            containers: r.containers,
            orphans: r.orphans,
            orphans_skipped: r.orphans_skipped,
            stopped: stopped(r.stopped),
            seconds: r.seconds,
        }
    }
}

/// A server replicated to (`query server`).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ServerRow {
    pub name: String,
    pub address: String,
    /// The replication account this server logs in as there.
    pub account: String,
    pub created: i64,
}

impl From<v1::ServerInfo> for ServerRow {
    fn from(s: v1::ServerInfo) -> ServerRow {
        ServerRow { name: s.name, address: s.address, account: s.account, created: s.created }
    }
}

/// `replicate node`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReplicateReport {
    pub process: u64,
    pub target: String,
    pub nodes: u64,
    pub filespaces: u64,
    /// Versions the target committed, and those it held already.
    pub versions: u64,
    pub skipped: u64,
    /// Versions it refused (named in the activity log; tried again at the next run).
    pub refused: u64,
    /// What was left for the next run, and why.
    pub problems: Vec<String>,
    /// Chunks sent with their frames, and their stored bytes.
    pub chunks: u64,
    pub frame_bytes: u64,
    /// Chunks the target held, sent as references.
    pub references: u64,
    /// Every byte of the messages sent.
    pub wire_bytes: u64,
    /// Versions the source made inactive since, made inactive there too.
    pub deactivated: u64,
    pub stopped: Option<String>,
    pub seconds: f64,
}

impl From<v1::ReplicateReply> for ReplicateReport {
    fn from(r: v1::ReplicateReply) -> ReplicateReport {
        ReplicateReport {
            process: r.process,
            target: r.target,
            nodes: r.nodes,
            filespaces: r.filespaces,
            versions: r.versions,
            skipped: r.skipped,
            refused: r.refused,
            problems: r.problems,
            chunks: r.chunks,
            frame_bytes: r.frame_bytes,
            references: r.references,
            wire_bytes: r.wire_bytes,
            deactivated: r.deactivated,
            stopped: stopped(r.stopped),
            seconds: r.seconds,
        }
    }
}

/// `repair stgpool`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RepairReport {
    pub process: u64,
    /// Damaged chunks found, repaired from a copy, and left.
    pub damaged: u64,
    pub repaired: u64,
    pub unrepaired: u64,
    /// Why each chunk left was left.
    pub problems: Vec<String>,
    pub seconds: f64,
}

impl From<v1::RepairReply> for RepairReport {
    fn from(r: v1::RepairReply) -> RepairReport {
        RepairReport {
            process: r.process,
            damaged: r.damaged,
            repaired: r.repaired,
            unrepaired: r.unrepaired,
            problems: r.problems,
            seconds: r.seconds,
        }
    }
}

/// `backup db`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BackupDbReport {
    pub process: u64,
    /// The backup file, on the server.
    pub path: String,
    /// Bytes of the backup file.
    pub bytes: u64,
    /// Bytes of catalog it holds.
    pub catalog_bytes: u64,
    pub schema: u32,
    pub seconds: f64,
}

impl From<v1::BackupDbReply> for BackupDbReport {
    fn from(r: v1::BackupDbReply) -> BackupDbReport {
        BackupDbReport {
            process: r.process,
            path: r.path,
            bytes: r.bytes,
            catalog_bytes: r.catalog_bytes,
            schema: r.schema,
            seconds: r.seconds,
        }
    }
}

/// One line of the volume history: a catalog backup or restore.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct VolhistRow {
    pub time: i64,
    /// "dbbackup" or "dbrestore".
    pub kind: String,
    pub path: String,
    pub bytes: u64,
    pub schema: u32,
    /// Bytes of catalog copied (known to the server's own history file only).
    pub catalog_bytes: u64,
    pub detail: String,
}

impl From<v1::VolhistEntry> for VolhistRow {
    fn from(e: v1::VolhistEntry) -> VolhistRow {
        VolhistRow {
            time: e.time,
            kind: e.kind,
            path: e.path,
            bytes: e.bytes,
            schema: e.schema,
            catalog_bytes: 0,
            detail: e.detail,
        }
    }
}

/// One storage pool.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StgpoolRow {
    pub name: String,
    pub kind: String,
    pub location: String,
    pub containers: u64,
    pub bytes: u64,
    pub chunks: u64,
    pub live_bytes: u64,
    /// The share of its bytes no version uses.
    pub reclaimable_percent: f64,
    pub damaged_chunks: u64,
}

impl From<v1::StgpoolInfo> for StgpoolRow {
    fn from(p: v1::StgpoolInfo) -> StgpoolRow {
        let reclaimable_percent =
            if p.bytes == 0 { 0.0 } else { 100.0 * (1.0 - p.live_bytes as f64 / p.bytes as f64) };
        StgpoolRow {
            name: p.name,
            kind: p.kind,
            location: p.location,
            containers: p.containers,
            bytes: p.bytes,
            chunks: p.chunks,
            live_bytes: p.live_bytes,
            reclaimable_percent,
            damaged_chunks: p.damaged_chunks,
        }
    }
}

/// A chunk the audit found damaged.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DamagedRow {
    /// The chunk's row in the catalog.
    pub chunk: u64,
    /// In hex.
    pub container: String,
    pub offset: u64,
    pub reason: String,
}

/// `audit stgpool`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AuditReport {
    pub process: u64,
    pub containers: u64,
    pub chunks_read: u64,
    pub bytes_read: u64,
    pub damaged: Vec<DamagedRow>,
    /// The versions using damaged chunks.
    pub damaged_objects: Vec<String>,
    /// Damaged chunks and versions were marked (the next backup sends them again).
    pub marked: bool,
    /// Containers the catalog does not know, in hex.
    pub unknown_containers: Vec<String>,
    pub unknown_bytes: u64,
    /// Bytes in known containers past what the catalog recorded.
    pub unrecorded_bytes: u64,
    /// When the catalog was restored from a copy, if it was.
    pub restored_at: Option<i64>,
    /// Unknown containers were released to reclamation.
    pub released: bool,
    pub stopped: Option<String>,
    pub seconds: f64,
}

impl From<v1::AuditReply> for AuditReport {
    fn from(r: v1::AuditReply) -> AuditReport {
        AuditReport {
            process: r.process,
            containers: r.containers,
            chunks_read: r.chunks_read,
            bytes_read: r.bytes_read,
            damaged: r
                .damaged
                .into_iter()
                .map(|d| DamagedRow {
                    chunk: d.chunk,
                    container: container_hex(d.container),
                    offset: d.offset,
                    reason: d.reason,
                })
                .collect(),
            damaged_objects: r.damaged_objects,
            marked: r.marked,
            unknown_containers: r.unknown_containers.into_iter().map(container_hex).collect(),
            unknown_bytes: r.unknown_bytes,
            unrecorded_bytes: r.unrecorded_bytes,
            restored_at: (r.restored_at != 0).then_some(r.restored_at),
            released: r.released,
            stopped: stopped(r.stopped),
            seconds: r.seconds,
        }
    }
}

/// One activity log entry.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ActlogRow {
    pub time: i64,
    pub severity: String,
    pub message: String,
}

/// `query actlog`: serialized as its entries alone; `truncated` is a warning, not data.
#[derive(Debug, Clone, PartialEq)]
pub struct ActlogReport {
    pub entries: Vec<ActlogRow>,
    /// More entries matched than the limit let through.
    pub truncated: bool,
}

impl Serialize for ActlogReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.entries.serialize(s)
    }
}

impl From<v1::ActlogReply> for ActlogReport {
    fn from(r: v1::ActlogReply) -> ActlogReport {
        ActlogReport {
            entries: r
                .entries
                .into_iter()
                .map(|e| ActlogRow { time: e.time, severity: e.severity, message: e.message })
                .collect(),
            truncated: r.truncated,
        }
    }
}
