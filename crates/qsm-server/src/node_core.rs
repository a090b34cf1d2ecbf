//! What a node may do, written once: the gRPC `Node` service and the embedded server both
//! call these methods, so a node's rights (its own filespaces only, its management classes,
//! its dedup scope, the checks on every path and frame) are the same whichever way it
//! reaches the server. Nothing here knows a transport; every call blocks on the catalog or
//! the pool.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use qsm_catalog::{
    BackupRun, CatalogError, ChunkKey, DedupScope, DedupScopeId, Filespace, FilespaceId, MgmtClass,
    NewObject, NodeId, ObjectId, ObjectKind, ObjectVersion, RunResult, Severity,
};
use qsm_store::{Batch, Committed, StoreError};
use qsm_types::ServerError;
use qsm_types::model::Timestamp;
use qsm_types::node::{ClassInfo, DedupInfo, Due, Fetched, Schedules, UploadKind, Uploaded};

use crate::anomaly;
use crate::auth::Session;
use crate::state::State;

/// Results of the server core.
pub type Result<T> = std::result::Result<T, ServerError>;

/// The longest path component list a client may send (bytes).
pub const MAX_PATH: usize = 64 * 1024;
/// Extended attribute bytes (names and values) one object may carry: Linux caps one value at
/// 64 KiB and most file systems a whole list far below this.
const MAX_XATTR_BYTES: usize = 1 << 20;
/// Keyed ids one HaveChunks call may ask about.
pub const HAVE_MAX: usize = 10_000;
/// The largest key file the server keeps for a node (a QSM key file is 96 or 120 bytes).
const KEY_FILE_MAX: usize = 4096;
/// The longest filespace name.
const MAX_FILESPACE_NAME: usize = 4096;
/// The longest outcome a node may report of a scheduled event (bytes).
const MAX_EVENT_DETAIL: usize = 4096;
/// Versions an inventory lists between two looks at whether its session was cancelled.
const CANCEL_CHECK_EVERY: u32 = 1000;

/// A catalog error as the core reports it.
pub fn catalog_error(e: CatalogError) -> ServerError {
    match e {
        CatalogError::NotFound { .. } => ServerError::NotFound(e.to_string()),
        CatalogError::Exists { .. } => ServerError::Exists(e.to_string()),
        CatalogError::Refused(_) | CatalogError::Protected(_) => {
            ServerError::Refused(e.to_string())
        }
        CatalogError::DiskFull { .. } => ServerError::Exhausted(e.to_string()),
        _ => ServerError::Failed(e.to_string()),
    }
}

/// A store error as the core reports it.
pub fn store_error(e: StoreError) -> ServerError {
    match e {
        StoreError::BadFrame { .. } => ServerError::Invalid(e.to_string()),
        StoreError::UnknownChunk { .. } | StoreError::Restored(_) => {
            ServerError::Refused(e.to_string())
        }
        StoreError::Catalog(c) => catalog_error(c),
        StoreError::Pool(qsm_pool::PoolError::Full { .. }) => ServerError::Exhausted(e.to_string()),
        _ => ServerError::Failed(e.to_string()),
    }
}

/// A path a client sends: relative, `/`-separated, no empty, `.` or `..` component, no NUL.
/// The root of a filespace is the empty path.
pub fn check_path(path: &[u8]) -> Result<()> {
    if path.len() > MAX_PATH {
        return Err(ServerError::Invalid(format!("a path of {} bytes is too long", path.len())));
    }
    if path.is_empty() {
        return Ok(());
    }
    let bad = path[0] == b'/'
        || path.contains(&0)
        || path.split(|&b| b == b'/').any(|c| c.is_empty() || c == b"." || c == b"..");
    if bad {
        return Err(ServerError::Invalid(format!(
            "path {:?} is not a clean relative path",
            String::from_utf8_lossy(path)
        )));
    }
    Ok(())
}

/// A new dedup scope secret, from the same generator as the node keys (`qsm-crypt`).
pub fn new_secret() -> Result<[u8; 32]> {
    qsm_crypt::random().map_err(|e| ServerError::Failed(format!("no randomness for a secret: {e}")))
}

/// One node's view of the server, for one session (none for the embedded server, whose only
/// client is its own process).
#[derive(Debug, Clone, Copy)]
pub struct NodeSession<'a> {
    core: &'a State,
    node: NodeId,
    session: Option<&'a Session>,
}

impl<'a> NodeSession<'a> {
    /// `node`'s view of `core`, for `session`.
    pub fn new(core: &'a State, node: NodeId, session: Option<&'a Session>) -> NodeSession<'a> {
        NodeSession { core, node, session }
    }

    /// Refuses work for a session an administrator cancelled.
    pub fn check_cancelled(&self) -> Result<()> {
        match self.session {
            Some(s) if s.is_cancelled() => Err(ServerError::Cancelled(format!(
                "session {} was cancelled by an administrator",
                s.id
            ))),
            _ => Ok(()),
        }
    }

    /// The node's filespaces.
    pub fn filespaces(&self) -> Result<Vec<Filespace>> {
        self.core.store.catalog().filespaces(self.node).map_err(catalog_error)
    }

    /// The ids of the node's filespaces.
    pub fn owned(&self) -> Result<HashSet<FilespaceId>> {
        Ok(self.filespaces()?.into_iter().map(|f| f.id).collect())
    }

    fn check_owner(&self, fs: FilespaceId) -> Result<()> {
        if self.owned()?.contains(&fs) {
            Ok(())
        } else {
            // The same answer as for a filespace that does not exist: nothing leaks.
            Err(ServerError::NotFound(format!("no filespace {}", fs.0)))
        }
    }

    /// The node's filespace `name`, created first when `create` is set; `None` if it does not
    /// exist.
    pub fn open_filespace(&self, name: &str, create: bool) -> Result<Option<Filespace>> {
        if name.is_empty() || name.len() > MAX_FILESPACE_NAME || name.contains('\0') {
            return Err(ServerError::Invalid(format!(
                "a filespace name is 1 to {MAX_FILESPACE_NAME} bytes, no NUL"
            )));
        }
        let catalog = self.core.store.catalog();
        if create {
            catalog.filespace(self.node, name).map_err(catalog_error)?;
        }
        Ok(self.filespaces()?.into_iter().find(|f| f.name == name))
    }

    /// Calls `f` with each version of `fs` (every version when `all`, else the active ones
    /// that are not damaged), in path order. Stops at `f`'s first error, and when the
    /// session is cancelled.
    pub fn inventory(
        &self,
        fs: FilespaceId,
        all: bool,
        f: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        self.check_owner(fs)?;
        let mut stopped = None;
        let mut seen = 0u32;
        let mut each = |v: &ObjectVersion| {
            // A damaged active version is left out of what an incremental backup compares
            // with, so the client sends the file again.
            if v.damaged && !all {
                return Ok(());
            }
            seen += 1;
            let checked = if seen.is_multiple_of(CANCEL_CHECK_EVERY) {
                self.check_cancelled()
            } else {
                Ok(())
            };
            match checked.and_then(|()| f(v)) {
                Ok(()) => Ok(()),
                Err(e) => {
                    stopped = Some(e);
                    Err(CatalogError::Refused("stopped".into()))
                }
            }
        };
        let catalog = self.core.store.catalog();
        let listed = if all {
            catalog.for_each_version(fs, &mut each)
        } else {
            catalog.for_each_active(fs, &mut each)
        };
        if let Some(e) = stopped {
            return Err(e);
        }
        self.check_cancelled()?;
        listed.map_err(catalog_error)
    }

    /// Version `id`, if it is the node's.
    pub fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        match self.core.store.catalog().object(id).map_err(catalog_error)? {
            Some(v) if self.owned()?.contains(&v.filespace) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// The node's dedup scope, made on first use.
    fn scope(&self) -> Result<DedupScope> {
        let secret = new_secret()?;
        self.core.store.catalog().dedup_scope(self.node, secret).map_err(catalog_error)
    }

    /// What deduplication needs to know.
    pub fn dedup_info(&self) -> Result<DedupInfo> {
        let scope = self.scope()?;
        Ok(DedupInfo {
            scope: scope.name,
            scope_secret: scope.secret,
            pool: self.core.store.pool().id().to_string(),
            epoch: self.core.store.catalog().dedup_epoch().map_err(catalog_error)?,
            dedup_default: self.core.config.dedup,
        })
    }

    /// Which of `ids` the node's dedup scope holds, sealed or plaintext.
    pub fn have_chunks(&self, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>> {
        if ids.len() > HAVE_MAX {
            return Err(ServerError::Invalid(format!(
                "{} chunk ids in one call; at most {HAVE_MAX}",
                ids.len()
            )));
        }
        let scope = self.scope()?;
        let found =
            self.core.store.catalog().find_chunks(scope.id, sealed, ids).map_err(catalog_error)?;
        Ok(found.iter().map(Option::is_some).collect())
    }

    /// Keeps the node's wrapped key file (a replicated node's is its source's, kept as sent).
    pub fn put_key(&self, key_file: &[u8]) -> Result<()> {
        if let Some(by) = self.record()?.replica_of {
            return Err(ServerError::Refused(format!(
                "this node is a replica (made by replication account {by}): its key file is \
                 its source server's"
            )));
        }
        if key_file.is_empty() || key_file.len() > KEY_FILE_MAX {
            return Err(ServerError::Invalid(format!(
                "a key file of {} bytes; 1 to {KEY_FILE_MAX} are kept",
                key_file.len()
            )));
        }
        self.core.store.catalog().set_node_key(self.node, key_file).map_err(catalog_error)
    }

    /// The node's wrapped key file, if the server keeps one.
    pub fn get_key(&self) -> Result<Option<Vec<u8>>> {
        self.core.store.catalog().node_key(self.node).map_err(catalog_error)
    }

    /// The node's policy domain and its management classes.
    pub fn policy(&self) -> Result<(String, Vec<ClassInfo>)> {
        let catalog = self.core.store.catalog();
        let (domain, classes) =
            qsm_catalog::node_policy(catalog.as_ref(), self.node).map_err(catalog_error)?;
        let classes = classes
            .into_iter()
            .map(|c| ClassInfo { name: c.name, archive_days: c.archive.retain_version_days })
            .collect();
        Ok((domain.name, classes))
    }

    /// The node's record.
    fn record(&self) -> Result<qsm_catalog::Node> {
        let nodes = self.core.store.catalog().nodes().map_err(catalog_error)?;
        nodes
            .into_iter()
            .find(|n| n.id == self.node)
            .ok_or_else(|| ServerError::not_found("this node was deleted"))
    }

    /// The node's client schedules, each with the window it is due to run in; `fresh` (a
    /// scheduler's first call) severs the node's events still started: the scheduler that
    /// ran them is gone (one runs per node), and would otherwise hold them started while the
    /// new one's session lives.
    pub fn schedules(&self, fresh: bool) -> Result<Schedules> {
        let now = qsm_types::now();
        let node = self.record()?;
        if fresh {
            let catalog = self.core.store.catalog();
            let started = catalog.started_node_events().map_err(catalog_error)?;
            let why = "a new scheduler of the node started: the one running this is gone";
            for e in started.into_iter().filter(|e| e.node.as_ref() == Some(&node.name)) {
                if catalog.end_event(e.id, "severed", why, now).is_ok() {
                    let what = format!(
                        "schedule {}/{} of node {} severed: {why}",
                        e.domain_name, e.schedule_name, node.name
                    );
                    let session = self.session.and_then(|x| x.record);
                    self.core.log(Severity::Warning, &what, Some(self.node), session);
                    self.core.alert("failed", &what, Some(self.node), None, None);
                }
            }
        }
        let due = crate::schedules::due(self.core, &node, now)?;
        Ok(Schedules {
            now,
            due: due
                .into_iter()
                .map(|(s, w)| Due {
                    domain: s.domain_name,
                    schedule: s.name,
                    window_end: w + s.spec.duration,
                    action: s.spec.action,
                    objects: s.spec.objects,
                    window_start: w,
                })
                .collect(),
        })
    }

    /// Starts the node's event of `schedule` in its window open now, which starts at
    /// `window`; `None` if the node has that event already.
    pub fn start_event(&self, schedule: &str, window: Timestamp) -> Result<Option<i64>> {
        let node = self.record()?;
        let now = qsm_types::now();
        let due = crate::schedules::due(self.core, &node, now)?;
        let Some((s, _)) = due.into_iter().find(|(s, _)| s.name == schedule) else {
            return Err(ServerError::not_found(format!(
                "node {} has no schedule {schedule}",
                node.name
            )));
        };
        let open = crate::schedules::last_window(&s.spec, now)
            .filter(|&w| w == window && now < w + s.spec.duration);
        if open.is_none() {
            return Err(ServerError::refused(format!(
                "the window of {} of schedule {schedule} is not open",
                qsm_types::time::format_time(window)
            )));
        }
        let catalog = self.core.store.catalog();
        let event = catalog
            .claim_event(s.id, Some(self.node), window, "started", now)
            .map_err(catalog_error)?;
        if event.is_some() {
            self.core.log(
                Severity::Info,
                &format!(
                    "node {} started schedule {}/{} ({})",
                    node.name, s.domain_name, s.name, s.spec.action
                ),
                Some(self.node),
                self.session.and_then(|x| x.record),
            );
        }
        Ok(event)
    }

    /// Ends the node's started event `event` with its outcome (what a node reports is cut to
    /// [`MAX_EVENT_DETAIL`] bytes).
    pub fn end_event(&self, event: i64, result: RunResult, reported: &str) -> Result<()> {
        // What a node reports is shown on administrators' terminals.
        let mut detail = qsm_types::printable(reported);
        qsm_types::truncate_utf8(&mut detail, MAX_EVENT_DETAIL);
        let catalog = self.core.store.catalog();
        let now = qsm_types::now();
        let suspect = if result == RunResult::Failed { None } else { self.suspect_since(event)? };
        if let Some(why) = &suspect {
            detail = format!("suspect backup: {why}; reported: {detail}");
            qsm_types::truncate_utf8(&mut detail, MAX_EVENT_DETAIL);
        }
        let state = if suspect.is_some() { "suspect" } else { result.name() };
        let detail = detail.as_str();
        catalog.end_node_event(self.node, event, state, detail, now).map_err(|e| match e {
            CatalogError::NotFound { .. } => {
                ServerError::not_found(format!("the node has no started event {event}"))
            }
            e => catalog_error(e),
        })?;
        let name = self.record().map(|n| n.name).unwrap_or_default();
        let what = format!("node {name}'s scheduled event {event} {state}: {detail}");
        let severity = match result {
            _ if suspect.is_some() => Severity::Warning,
            RunResult::Completed => Severity::Info,
            RunResult::CompletedWithWarnings => Severity::Warning,
            RunResult::Failed => Severity::Error,
        };
        self.core.log(severity, &what, Some(self.node), self.session.and_then(|x| x.record));
        if result == RunResult::Failed {
            self.core.alert("failed", &what, Some(self.node), None, None);
        }
        Ok(())
    }

    /// Why a backup the node made during its started event `event` was found suspect, if
    /// one was: a suspect figure of one of its filespaces recorded since the event started.
    fn suspect_since(&self, event: i64) -> Result<Option<String>> {
        let catalog = self.core.store.catalog();
        // Events of windows that began in the last 31 days: no window is longer.
        let since = qsm_types::now() - 31 * 86_400;
        let events = catalog.node_events(self.node, since).map_err(catalog_error)?;
        let Some(started) = events.iter().find(|e| e.id == event).and_then(|e| e.started) else {
            return Ok(None);
        };
        for fs in catalog.filespaces(self.node).map_err(catalog_error)? {
            let stats = catalog.backup_stats(fs.id).map_err(catalog_error)?;
            if !stats.iter().any(|s| s.suspect && s.ended >= started) {
                continue;
            }
            let holds = catalog.holds().map_err(catalog_error)?;
            let why = holds
                .into_iter()
                .find(|h| h.kind == qsm_catalog::HoldKind::Suspect && h.filespace == Some(fs.id))
                .map_or_else(|| "its figures were far from the usual".to_owned(), |h| h.reason);
            return Ok(Some(format!("filespace {}: {why}", fs.name)));
        }
        Ok(None)
    }

    /// The client option set the node uses, if any.
    pub fn client_options(&self) -> Result<Option<qsm_catalog::OptionSet>> {
        self.core.store.catalog().node_cloptset(self.node).map_err(catalog_error)
    }

    /// Starts sending objects into `fs`, in transactions no larger than `asked` (zero: the
    /// server's limits) nor than the server's limits.
    pub fn upload(
        &self,
        fs: FilespaceId,
        asked: qsm_types::TxnLimits,
        kind: UploadKind,
    ) -> Result<NodeUpload<'a>> {
        self.check_owner(fs)?;
        let replica = kind == UploadKind::Replica;
        if !replica && let Some(by) = self.record()?.replica_of {
            return Err(ServerError::Refused(format!(
                "this node is a replica (made by replication account {by}): restore from it \
                 here, back it up on its own server"
            )));
        }
        let config = &self.core.config;
        // The client may ask for smaller transactions, never larger ones.
        let cap = |asked: u64, max: u64| if asked == 0 { max } else { asked.min(max) };
        let limits = qsm_types::TxnLimits {
            group_max: cap(asked.group_max as u64, config.txn_group_max as u64) as usize,
            byte_limit: cap(asked.byte_limit, config.txn_byte_limit),
        };
        Ok(NodeUpload {
            batch: self.core.store.batch(limits).map_err(store_error)?,
            in_object: false,
            current: (Vec::new(), 0),
            scope: None,
            classes: None,
            decoder: qsm_codec::FrameDecoder::new(),
            raw: Vec::new(),
            replica,
            run: RunRecord {
                node: *self,
                fs,
                started: (kind == UploadKind::Backup).then(qsm_types::now),
                committed: Uploaded::default(),
                stats: Default::default(),
                unjudged: true,
                counting: false,
            },
        })
    }

    /// The frames of `objects`, in that order. An object that is not the node's fails the
    /// whole fetch, as one that does not exist.
    pub fn fetch(&self, objects: Vec<ObjectId>) -> Result<NodeFetch<'a>> {
        Ok(NodeFetch {
            node: *self,
            mine: self.owned()?,
            objects,
            next: 0,
            ahead: std::collections::VecDeque::new(),
            current: None,
        })
    }
}

/// Objects on their way into the store for one node: see [`qsm_types::node::Upload`].
pub struct NodeUpload<'a> {
    batch: Batch<'a>,
    in_object: bool,
    /// The current object's path and chunk count, for messages.
    current: (Vec<u8>, usize),
    /// The node's dedup scope and the key of its plaintext chunk ids, looked up on the first
    /// chunk that needs them.
    scope: Option<(DedupScopeId, qsm_crypt::ChunkIdKey)>,
    /// The node's management classes, read when an object first names one.
    classes: Option<Vec<MgmtClass>>,
    decoder: qsm_codec::FrameDecoder,
    raw: Vec<u8>,
    /// Replicated versions: not counted for anomaly detection.
    replica: bool,
    run: RunRecord<'a>,
}

/// A backup's end, recorded in its filespace (`Catalog::record_backup`) and the activity log:
/// completed when its upload finishes, failed when the upload is dropped unfinished (its
/// stream broke, its client died or gave up, the server stopped). It holds the upload's
/// node, filespace and counts, which its `Drop` needs.
struct RunRecord<'a> {
    node: NodeSession<'a>,
    fs: FilespaceId,
    /// When the backup started; `None` for a partial one or an archive, or once recorded.
    started: Option<qsm_types::Timestamp>,
    committed: Uploaded,
    /// The figures anomaly detection reads, counted from the backup versions and frames
    /// received (archives are not counted).
    stats: qsm_catalog::BackupStats,
    /// Whether the figures are still to be judged.
    unjudged: bool,
    /// Whether the current object is a backup version (its frames are counted).
    counting: bool,
}

impl RunRecord<'_> {
    /// The run ended `result`: a whole backup is recorded in its filespace, and every
    /// upload's figures are judged, once.
    fn end(&mut self, result: RunResult, warnings: u64) {
        let whole = self.started.is_some();
        if let Some(started) = self.started.take() {
            self.record(started, result, warnings);
        }
        if std::mem::take(&mut self.unjudged) {
            self.judge(whole);
        }
    }

    fn record(&mut self, started: Timestamp, result: RunResult, warnings: u64) {
        let run = BackupRun {
            started,
            ended: qsm_types::now(),
            result,
            objects: self.committed.objects,
            bytes: self.committed.bytes,
            warnings,
        };
        let core = self.node.core;
        core.counters.backup_ended(result);
        let catalog = core.store.catalog();
        let recorded = catalog.record_backup(self.fs, &run);
        let name = catalog
            .filespaces(self.node.node)
            .ok()
            .and_then(|all| all.into_iter().find(|f| f.id == self.fs))
            .map_or_else(|| format!("{}", self.fs.0), |f| f.name);
        let severity = match result {
            RunResult::Completed => Severity::Info,
            RunResult::CompletedWithWarnings => Severity::Warning,
            RunResult::Failed => Severity::Error,
        };
        let mut message = format!(
            "backup of filespace {name} {}: {} objects, {} bytes in {} s",
            result.name(),
            run.objects,
            run.bytes,
            run.ended - run.started
        );
        if warnings > 0 {
            message += &format!(", {warnings} files skipped");
        }
        if let Err(e) = recorded {
            message += &format!(" (not recorded in the filespace: {e})");
        }
        core.log(
            severity,
            &message,
            Some(self.node.node),
            self.node.session.and_then(|s| s.record),
        );
        if result == RunResult::Failed {
            core.alert("failed", &message, Some(self.node.node), Some(&name), None);
        }
    }

    /// Compares the upload's figures with its filespace's usual ones ([`crate::anomaly`]),
    /// whatever the upload claims to be and however it ended (what it committed stays, and
    /// its roll-off happened): a suspect one holds its filespace, so no version of it expires
    /// or rolls off until an administrator acknowledges. A whole backup's figures join the
    /// baseline; a partial one's, which says nothing of what is usual, only when suspect.
    fn judge(&self, whole: bool) {
        if self.stats.changed == 0 {
            return;
        }
        let core = self.node.core;
        let catalog = core.store.catalog();
        let stats = qsm_catalog::BackupStats { ended: qsm_types::now(), ..self.stats };
        let session = self.node.session.and_then(|s| s.record);
        let fs_name = || {
            catalog
                .filespaces(self.node.node)
                .ok()
                .and_then(|all| all.into_iter().find(|f| f.id == self.fs))
                .map_or_else(|| format!("{}", self.fs.0), |f| f.name)
        };
        let judged =
            catalog.add_backup_stats(self.fs, &stats, anomaly::KEEP, whole, &anomaly::judge);
        let why = match judged {
            Ok((_, why)) => why,
            Err(e) => {
                let said = format!(
                    "backup of filespace {}: its figures were not recorded: {e}",
                    fs_name()
                );
                core.log(Severity::Warning, &said, Some(self.node.node), session);
                return;
            }
        };
        let Some(why) = why else { return };
        let (node, name) = (self.node.record().map(|n| n.name).unwrap_or_default(), fs_name());
        let held = catalog.hold(
            self.node.node,
            Some(self.fs),
            qsm_catalog::HoldKind::Suspect,
            "server",
            &why,
            stats.ended,
        );
        let kept = match held {
            Ok(_) => format!(
                "its versions are kept (no expiration, no roll-off) until an administrator \
                 acknowledges: qsm admin release node {node} --filespace '{name}' --suspect"
            ),
            Err(e) => format!("its filespace could not be held: {e}"),
        };
        let what = if whole { "backup" } else { "partial backup" };
        let message = format!("{what} of node {node} filespace {name} is suspect: {why}; {kept}");
        core.log(Severity::Warning, &message, Some(self.node.node), session);
        core.alert("suspect", &message, Some(self.node.node), Some(&name), None);
    }
}

impl Drop for RunRecord<'_> {
    fn drop(&mut self) {
        self.end(RunResult::Failed, 0);
    }
}

impl std::fmt::Debug for NodeUpload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeUpload")
            .field("node", &self.run.node.node)
            .field("filespace", &self.run.fs)
            .field("committed", &self.run.committed)
            .finish_non_exhaustive()
    }
}

impl NodeUpload<'_> {
    /// What this upload committed so far.
    pub fn committed(&self) -> Uploaded {
        self.run.committed
    }

    /// Counts a commit; whether there was one.
    fn count(&mut self, c: Option<Committed>) -> bool {
        let Some(c) = c else { return false };
        record(self.run.node, &mut self.run.committed, c);
        true
    }

    fn scope(&mut self) -> Result<&(DedupScopeId, qsm_crypt::ChunkIdKey)> {
        if self.scope.is_none() {
            let s = self.run.node.scope()?;
            self.scope = Some((s.id, qsm_crypt::ChunkIdKey::from_scope_secret(&s.secret)));
        }
        self.scope.as_ref().ok_or_else(|| ServerError::Failed("no dedup scope".into()))
    }

    /// Counts a frame of `bytes` holding `raw` bytes of data, as the store took it.
    fn sent(&mut self, bytes: usize, raw: u32) {
        if self.run.counting {
            let stats = &mut self.run.stats;
            stats.chunks += 1;
            stats.stored_bytes += bytes as u64;
            stats.raw_bytes += u64::from(raw);
        }
        if let Some(s) = self.run.node.session {
            s.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            self.run.node.core.counters.received_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }

    fn in_object(&self, what: &str) -> Result<()> {
        if self.in_object {
            Ok(())
        } else {
            Err(ServerError::Invalid(format!("{what} outside an object")))
        }
    }

    /// Starts an object in the upload's filespace, bound to the management class named (one
    /// the node's domain lacks, or none: the default); whether a transaction committed.
    pub fn begin_object(
        &mut self,
        mut object: NewObject,
        size_hint: u64,
        class: Option<&str>,
    ) -> Result<bool> {
        check_path(&object.path)?;
        let attrs = &object.attrs;
        if attrs.link_target.as_ref().is_some_and(|t| t.len() > MAX_PATH) {
            return Err(ServerError::Invalid("a symlink target is too long".into()));
        }
        let xattr_bytes: usize = attrs.xattrs.iter().map(|(n, v)| n.len() + v.len()).sum();
        if xattr_bytes > MAX_XATTR_BYTES {
            return Err(ServerError::Invalid(format!(
                "the extended attributes of an object hold {xattr_bytes} bytes, more than \
                 {MAX_XATTR_BYTES}"
            )));
        }
        if attrs.extents.as_ref().is_some_and(|e| e.len() > qsm_types::model::MAX_EXTENTS) {
            return Err(ServerError::Invalid(format!(
                "a sparse file of more than {} data extents",
                qsm_types::model::MAX_EXTENTS
            )));
        }
        if object.description.as_ref().is_some_and(|d| d.len() > 4096) {
            return Err(ServerError::Invalid("a description is too long".into()));
        }
        object.filespace = self.run.fs;
        if object.kind != ObjectKind::Archive {
            object.description = None;
            object.retain_until = None;
        }
        object.mgmt_class = match class {
            None => None,
            Some(name) => {
                if self.classes.is_none() {
                    let catalog = self.run.node.core.store.catalog();
                    self.classes = Some(
                        qsm_catalog::node_classes(catalog.as_ref(), self.run.node.node)
                            .map_err(catalog_error)?,
                    );
                }
                // A class the domain lacks (deleted meanwhile): the default.
                self.classes.iter().flatten().find(|c| c.name == name).map(|c| c.id)
            }
        };
        self.current = (object.path.clone(), 0);
        self.run.counting = object.kind == ObjectKind::Backup && !self.replica;
        if self.run.counting {
            self.run.stats.changed += 1;
        }
        let committed =
            self.batch.begin_object(object, size_hint, qsm_types::now()).map_err(store_error)?;
        self.in_object = true;
        Ok(self.count(committed))
    }

    /// The next frame of the current object.
    pub fn append_frame(&mut self, frame: &[u8]) -> Result<()> {
        self.in_object("a frame")?;
        let raw = self.batch.append_frame(frame).map_err(store_error)?;
        self.sent(frame.len(), raw);
        Ok(())
    }

    /// The next frame of the current object with its keyed id; `shared` offers it to the
    /// node's dedup scope.
    pub fn append_chunk(&mut self, frame: &[u8], id: &[u8; 32], shared: bool) -> Result<()> {
        self.in_object("a chunk")?;
        let scope = if shared {
            let verify = self.run.node.core.verify_shared_chunks;
            let (scope, ids) = self.scope()?.clone();
            if verify {
                check_plain_id(&ids, frame, id, &mut self.decoder, &mut self.raw).map_err(|e| {
                    e.context(format!(
                        "object {}: chunk {}",
                        String::from_utf8_lossy(&self.current.0),
                        self.current.1
                    ))
                })?;
            }
            Some(scope)
        } else {
            None
        };
        // The store reads `sealed` from the frame itself.
        let key = ChunkKey { hash: *id, scope, sealed: false };
        let raw = self.batch.append_chunk(frame, key).map_err(store_error)?;
        self.current.1 += 1;
        self.sent(frame.len(), raw);
        Ok(())
    }

    /// The next chunk of the current object is one the scope holds (or this upload sent with
    /// `shared`).
    pub fn reference_chunk(&mut self, id: &[u8; 32], sealed: bool) -> Result<()> {
        self.in_object("a chunk reference")?;
        let scope = self.scope()?.0;
        self.batch.reference_chunk(*id, scope, sealed).map_err(store_error)?;
        self.current.1 += 1;
        if self.run.counting {
            self.run.stats.refs += 1;
        }
        Ok(())
    }

    /// Ends the current object.
    pub fn end_object(&mut self) -> Result<()> {
        self.batch.end_object().map_err(store_error)?;
        self.in_object = false;
        Ok(())
    }

    /// Drops the current object.
    pub fn abandon_object(&mut self) {
        self.batch.abandon_object();
        self.in_object = false;
    }

    /// Marks the active version of `path` inactive.
    pub fn deactivate(&mut self, path: &[u8]) -> Result<()> {
        check_path(path)?;
        self.batch.deactivate(self.run.fs, path);
        Ok(())
    }

    /// Marks the active versions below `path` inactive (the empty path: the whole filespace).
    pub fn deactivate_tree(&mut self, path: &[u8]) -> Result<()> {
        check_path(path)?;
        self.batch.deactivate_tree(self.run.fs, path);
        Ok(())
    }

    /// Commits the rest; what the whole upload committed. `warnings` files were skipped.
    pub fn finish(self, warnings: u64) -> Result<Uploaded> {
        if self.in_object {
            return Err(ServerError::Invalid("Finish in the middle of an object".into()));
        }
        let NodeUpload { batch, mut run, .. } = self;
        let c = batch.finish(qsm_types::now()).map_err(store_error)?;
        record(run.node, &mut run.committed, c);
        let result =
            if warnings > 0 { RunResult::CompletedWithWarnings } else { RunResult::Completed };
        run.end(result, warnings);
        Ok(run.committed)
    }
}

/// Adds a commit to what an upload committed, and to its session's record.
fn record(node: NodeSession<'_>, committed: &mut Uploaded, c: Committed) {
    committed.objects += c.objects.len() as u64;
    committed.bytes += c.bytes;
    if let Some(s) = node.session {
        s.objects.fetch_add(c.objects.len() as u64, Ordering::Relaxed);
        node.core.update_record(s);
    }
}

/// A shared plaintext chunk must hold what its id says. The server sees a plaintext frame's
/// data and holds the scope's secret, so it checks, at the cost of a decode and a BLAKE3 per
/// such chunk: otherwise a node could plant other data under an id the other nodes of its
/// scope will reference, and their restores would return it (the frame's XXH3 proves it
/// intact, not that it is the id's). Sealed chunks are keyed with their owner's master key,
/// which only nodes sharing that key hold; their restores check the id after opening.
fn check_plain_id(
    ids: &qsm_crypt::ChunkIdKey,
    frame: &[u8],
    hash: &[u8; 32],
    decoder: &mut qsm_codec::FrameDecoder,
    raw: &mut Vec<u8>,
) -> Result<()> {
    let header = qsm_codec::FrameHeader::parse(frame)
        .map_err(|e| ServerError::Invalid(format!("a chunk's frame is invalid: {e}")))?;
    if header.is_sealed() {
        return Ok(());
    }
    let header = decoder
        .decode(frame, raw)
        .map_err(|e| ServerError::Invalid(format!("a chunk's frame does not decode: {e}")))?;
    if ids.id(&raw[..header.raw_len as usize]).0 != *hash {
        return Err(ServerError::Invalid(
            "a shared chunk's data does not match its id: refused, so no node of the scope \
             restores it in place of the data the id names"
                .into(),
        ));
    }
    Ok(())
}

/// Objects a fetch looks up in the catalog at once: one read transaction for this many files
/// instead of two for each.
const FETCH_AHEAD: usize = 256;

/// Frames coming back for a restore: see [`qsm_types::node::Fetch`].
#[derive(Debug)]
pub struct NodeFetch<'a> {
    node: NodeSession<'a>,
    /// The node's filespaces, read once.
    mine: HashSet<FilespaceId>,
    objects: Vec<ObjectId>,
    /// The next object to look up in the catalog.
    next: usize,
    /// Objects looked up ahead, [`FETCH_AHEAD`] at a time: their filespace and chunks, or
    /// `None` if there is no such object.
    ahead: std::collections::VecDeque<(ObjectId, Option<qsm_catalog::ObjectChunks>)>,
    /// The object being read: its id, its chunks, the next chunk and the raw offset reached.
    current: Option<(ObjectId, Vec<qsm_catalog::ChunkRef>, usize, u64)>,
}

impl NodeFetch<'_> {
    /// The next frame into `frame` (cleared first) and its place, or `None` at the end. A
    /// chunk that cannot be read ends its object with the reason; the fetch goes on.
    pub fn next(&mut self, frame: &mut Vec<u8>) -> Result<Option<Fetched>> {
        self.node.check_cancelled()?;
        frame.clear();
        if self.current.is_none() {
            if self.ahead.is_empty() {
                let batch = &self.objects[self.next.min(self.objects.len())..];
                let batch = &batch[..batch.len().min(FETCH_AHEAD)];
                let found =
                    self.node.core.store.catalog().objects_chunks(batch).map_err(catalog_error)?;
                self.next += batch.len();
                self.ahead.extend(batch.iter().copied().zip(found));
            }
            let Some((id, found)) = self.ahead.pop_front() else { return Ok(None) };
            match found {
                Some((fs, chunks)) if self.mine.contains(&fs) => {
                    self.current = Some((id, chunks, 0, 0));
                }
                _ => return Err(ServerError::NotFound(format!("no object {}", id.0))),
            }
        }
        let Some((id, chunks, next, offset)) = &mut self.current else { return Ok(None) };
        let mut fetched = Fetched {
            object: *id,
            offset: *offset,
            raw_len: 0,
            has_frame: false,
            last: false,
            error: None,
            chunk_id: None,
        };
        if let Some(chunk) = chunks.get(*next) {
            // Not decoded here: the client checks every frame as it decodes it.
            match self.node.core.store.read_chunk(chunk, frame) {
                Ok(_) => fetched.has_frame = true,
                Err(e) => {
                    frame.clear();
                    fetched.error = Some(e.to_string());
                }
            }
            fetched.raw_len = chunk.location.raw_len;
            fetched.chunk_id = chunk.hash;
            *offset += u64::from(chunk.location.raw_len);
            *next += 1;
        }
        if *next >= chunks.len() || fetched.error.is_some() {
            fetched.last = true;
            self.current = None;
        }
        Ok(Some(fetched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_relative_paths_pass() {
        for good in [&b""[..], b"a", b"a/b", b"a/.b", b"..a", b"a\xff"] {
            assert!(check_path(good).is_ok(), "{good:?}");
        }
        for bad in [&b"/a"[..], b"a//b", b"a/", b"./a", b"a/../b", b"..", b"a\0b"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&vec![b'a'; MAX_PATH + 1]).is_err());
    }
}
