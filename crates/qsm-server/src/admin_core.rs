//! Every `qsm admin` operation, written once: the gRPC `Admin` service and the embedded
//! server call these methods ([`AdminApi`]), so an administrator's rights, the checks on
//! every argument and what the activity log records are the same whichever way the
//! operation arrives. The requests and replies are the protocol's messages, plain data.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use qsm_catalog::coord::SessionsOf;
use qsm_catalog::{Coordination, HoldKind, Privilege, Severity};
use qsm_proto::AdminApi;
use qsm_proto::v1;
use qsm_types::ServerError;

use crate::auth;
use crate::node_core::{catalog_error, store_error};
use crate::state::{Finished, State};

/// The most workers one expiration may run (`--resource`): each takes whole filespaces and
/// holds a catalog connection.
pub const MAX_EXPIRE_WORKERS: u32 = 64;
/// The most activity-log entries one query returns (`--limit`); a larger one is answered with
/// this many.
pub const MAX_ACTLOG_ENTRIES: u32 = 100_000;
/// The longest retention lock a class may give: a hundred years. A lock cannot be undone,
/// so a mistyped one must not keep data (and fill the pool) for ever.
pub const MAX_RETAIN_MIN_DAYS: u32 = 36_500;

/// Who asks for an administrative operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// Someone who can read the server's files anyway, and so holds system privilege: the
    /// local socket's peer running as the server's user or root, or the user of the embedded
    /// server. The text names them in the activity log.
    Owner(String),
    /// A logged-in administrator account, whose privilege classes the catalog holds.
    Admin(String),
}

/// A management class as the protocol carries it.
pub(crate) fn class_info(c: qsm_catalog::MgmtClass) -> v1::MgmtClassInfo {
    v1::MgmtClassInfo {
        name: c.name,
        versions_exist: c.backup.versions_exist,
        versions_deleted: c.backup.versions_deleted,
        retain_extra_days: c.backup.retain_extra_days,
        retain_only_days: c.backup.retain_only_days,
        retain_version_days: c.archive.retain_version_days,
        retain_min_days: c.retain_min_days,
    }
}

/// Privilege classes from their names.
fn privileges(names: &[String]) -> Result<Vec<Privilege>, ServerError> {
    Privilege::parse_list(&names.join(",")).map_err(ServerError::invalid)
}

/// Account names: what a shell and a log line can carry without quoting.
pub(crate) fn check_name(name: &str) -> Result<(), ServerError> {
    // Not only dots: "." and ".." cannot be a path segment of the HTTP API's URLs.
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.bytes().all(|b| b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ServerError::invalid(format!(
            "name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-' (not only dots)"
        )))
    }
}

fn check_password(password: &str) -> Result<(), ServerError> {
    if password.chars().count() < 8 || password.len() > 1024 {
        return Err(ServerError::invalid("a password has 8 to 1024 characters"));
    }
    Ok(())
}

/// Who may make a change: any administrator holding one of these classes (or system,
/// which holds them all). An empty list is a query: every administrator may.
type Need = &'static [Privilege];

const ANY: Need = &[];
const SYSTEM: Need = &[Privilege::System];
const POLICY: Need = &[Privilege::Policy];
const STORAGE: Need = &[Privilege::Storage];
const OPERATOR: Need = &[Privilege::Operator];
/// TSM's BACKUP DB: system, storage or operator.
const DB_BACKUP: Need = &[Privilege::Storage, Privilege::Operator];

fn schedule_named(
    catalog: &dyn qsm_catalog::Catalog,
    domain: &str,
    name: &str,
) -> Result<qsm_catalog::Schedule, ServerError> {
    let all = catalog.schedules().map_err(catalog_error)?;
    all.into_iter()
        .find(|s| s.domain_name == domain && s.name == name)
        .ok_or_else(|| ServerError::not_found(format!("no schedule {domain}/{name}")))
}

fn domain_named(
    catalog: &dyn qsm_catalog::Catalog,
    name: &str,
) -> Result<qsm_catalog::Domain, ServerError> {
    catalog
        .domain(name)
        .map_err(catalog_error)?
        .ok_or_else(|| ServerError::not_found(format!("no domain {name}")))
}

fn class_named(
    catalog: &dyn qsm_catalog::Catalog,
    domain: &str,
    name: &str,
) -> Result<qsm_catalog::MgmtClass, ServerError> {
    let d = domain_named(catalog, domain)?;
    catalog
        .mgmt_classes(d.id)
        .map_err(catalog_error)?
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| {
            ServerError::not_found(format!("no management class {name} in domain {domain}"))
        })
}

/// A catalog error naming a client option set that does not exist, said so.
fn no_set(e: qsm_catalog::CatalogError, name: &str) -> ServerError {
    match e {
        qsm_catalog::CatalogError::NotFound { what: "client option set", .. } => {
            ServerError::not_found(format!("no client option set {name}"))
        }
        e => catalog_error(e),
    }
}

/// Refuses a compression setting the client could not use: `auto`, its objectives and fixed
/// levels, or a codec of this build with a level it has.
fn check_compression(value: &str) -> Result<(), ServerError> {
    let v = value.to_ascii_lowercase();
    if v == "auto" || v == "auto:fast" || v == "auto:small" {
        return Ok(());
    }
    qsm_codec::Compression::parse(&v)
        .map(|_| ())
        .map_err(|e| ServerError::invalid(format!("compression {value:?}: {e}")))
}

/// A catalog refusal, with the name of what was refused.
fn named(e: qsm_catalog::CatalogError, what: &str, name: &str) -> ServerError {
    match e {
        qsm_catalog::CatalogError::Refused(why) => {
            ServerError::refused(format!("{what} {name}: {why}"))
        }
        qsm_catalog::CatalogError::Exists { .. } => {
            ServerError::exists(format!("{what} {name} exists"))
        }
        other => catalog_error(other),
    }
}

/// The copy groups a request asks for, over `base` for what it leaves unset.
pub(crate) fn copy_groups(
    r: &v1::MgmtClassRequest,
    base: (qsm_catalog::BackupCopyGroup, qsm_catalog::ArchiveCopyGroup),
) -> Result<(qsm_catalog::BackupCopyGroup, qsm_catalog::ArchiveCopyGroup), ServerError> {
    let (mut b, mut a) = base;
    b.versions_exist = r.versions_exist.unwrap_or(b.versions_exist);
    b.versions_deleted = r.versions_deleted.unwrap_or(b.versions_deleted);
    b.retain_extra_days = r.retain_extra_days.unwrap_or(b.retain_extra_days);
    b.retain_only_days = r.retain_only_days.unwrap_or(b.retain_only_days);
    a.retain_version_days = r.retain_version_days.unwrap_or(a.retain_version_days);
    if b.versions_exist == 0 {
        return Err(ServerError::invalid(
            "versions-exist must be at least 1: the active version is one of them",
        ));
    }
    Ok((b, a))
}

/// The node and filespace a hold request names, and how to say them.
fn hold_target(
    catalog: &dyn qsm_catalog::Catalog,
    r: &v1::HoldRequest,
) -> Result<(qsm_catalog::NodeId, Option<qsm_catalog::FilespaceId>, String), ServerError> {
    if r.filespace.is_empty() {
        let node = catalog
            .node(&r.node)
            .map_err(catalog_error)?
            .ok_or_else(|| ServerError::not_found(format!("no node {}", r.node)))?;
        return Ok((node.id, None, format!("node {}", r.node)));
    }
    let (node, fs) = node_filespace(catalog, &r.node, &r.filespace)?;
    Ok((node.id, Some(fs.id), format!("node {} filespace {}", r.node, r.filespace)))
}

/// Node `node` and its filespace `filespace`; `NOT_FOUND` naming the one missing.
fn node_filespace(
    catalog: &dyn qsm_catalog::Catalog,
    node: &str,
    filespace: &str,
) -> Result<(qsm_catalog::Node, qsm_catalog::Filespace), ServerError> {
    let n = catalog
        .node(node)
        .map_err(catalog_error)?
        .ok_or_else(|| ServerError::not_found(format!("no node {node}")))?;
    let fs = catalog
        .filespaces(n.id)
        .map_err(catalog_error)?
        .into_iter()
        .find(|f| f.name == filespace)
        .ok_or_else(|| {
            ServerError::not_found(format!("node {node} has no filespace {filespace}"))
        })?;
    Ok((n, fs))
}

/// The privilege a class definition needs: a retention lock, which nobody can undo once
/// given, is a system administrator's to set or change (up to [`MAX_RETAIN_MIN_DAYS`]).
fn retain_min_need(r: &v1::MgmtClassRequest) -> Result<Need, ServerError> {
    match r.retain_min_days {
        None => Ok(POLICY),
        Some(d) if d > MAX_RETAIN_MIN_DAYS => Err(ServerError::invalid(format!(
            "--retain-min {d}: at most {MAX_RETAIN_MIN_DAYS} days (a lock cannot be undone)"
        ))),
        Some(_) => Ok(SYSTEM),
    }
}

/// A class's minimum retention as the activity log says it (nothing when there is none).
fn retain_min(days: u32) -> String {
    if days == 0 {
        String::new()
    } else {
        format!(", retain-min {days} (versions stored from now on)")
    }
}

fn describe(b: qsm_catalog::BackupCopyGroup, a: qsm_catalog::ArchiveCopyGroup) -> String {
    let n = |v: u32| {
        if v == qsm_types::model::NO_LIMIT { "nolimit".to_owned() } else { v.to_string() }
    };
    format!(
        "versions-exist {}, versions-deleted {}, retain-extra {}, retain-only {}, retain-archive {}",
        n(b.versions_exist),
        n(b.versions_deleted),
        n(b.retain_extra_days),
        n(b.retain_only_days),
        n(a.retain_version_days)
    )
}

/// Records a new account in the catalog, given its name and password hash.
type Record = fn(
    &dyn qsm_catalog::Catalog,
    &str,
    &str,
    &[Privilege],
) -> Result<(), qsm_catalog::CatalogError>;

/// An administrator's view of the server core.
#[derive(Debug)]
pub struct AdminSession<'a> {
    core: &'a State,
    actor: Actor,
}

impl<'a> AdminSession<'a> {
    /// `actor`'s view of `core`.
    pub fn new(core: &'a State, actor: Actor) -> AdminSession<'a> {
        AdminSession { core, actor }
    }

    /// The server core.
    pub(crate) fn state(&self) -> &'a State {
        self.core
    }

    /// Who is asking, for the activity log, if they may do what needs `need`. An
    /// administrator's classes are read from the catalog at every call, so a revocation takes
    /// effect at once.
    fn need(&self, need: Need) -> Result<String, ServerError> {
        let account = match &self.actor {
            Actor::Owner(who) => return Ok(who.clone()),
            Actor::Admin(account) => account,
        };
        let actor = format!("administrator {account}");
        let admin = self
            .core
            .store
            .catalog()
            .admin(account)
            .map_err(catalog_error)?
            .ok_or_else(|| ServerError::denied(format!("{actor} no longer exists")))?;
        if admin.locked {
            return Err(ServerError::denied(format!("{actor} is locked")));
        }
        let held = &admin.privileges;
        // The account a source server logs in as, whose password that server keeps: it can
        // add replicated nodes' data here and nothing else, not even look.
        if held == &[Privilege::Replication] {
            return Err(ServerError::denied(format!(
                "{actor} is a replication account: it replicates nodes into this server and \
                 administers nothing"
            )));
        }
        if need.is_empty()
            || held.contains(&Privilege::System)
            || need.iter().any(|p| held.contains(p))
        {
            return Ok(actor);
        }
        let mut wanted: Vec<&str> =
            std::iter::once("system").chain(need.iter().map(|p| p.name())).collect();
        wanted.dedup();
        Err(ServerError::denied(format!(
            "{actor} has {} privilege; this needs {}",
            if held.is_empty() { "no".to_owned() } else { Privilege::join(held) },
            wanted.join(" or ")
        )))
    }

    /// A policy change: `change` returns what the activity log should say.
    fn policy(
        &self,
        change: impl FnOnce(&State) -> Result<String, ServerError>,
    ) -> Result<v1::Empty, ServerError> {
        let said = change(self.core)?;
        self.core.log(Severity::Info, &said, None, None);
        Ok(v1::Empty {})
    }

    /// A registration: authorized, name and password checked, the password hashed, then
    /// `record`.
    fn register(
        &self,
        r: v1::RegisterRequest,
        what: &'static str,
        need: Need,
        record: Record,
    ) -> Result<v1::Empty, ServerError> {
        let actor = self.need(need)?;
        check_name(&r.name)?;
        check_password(&r.password)?;
        let privileges = privileges(&r.privileges)?;
        let hash = auth::hash_password(&r.password).map_err(ServerError::failed)?;
        record(self.core.store.catalog().as_ref(), &r.name, &hash, &privileges)
            .map_err(catalog_error)?;
        let with = if privileges.is_empty() {
            String::new()
        } else {
            format!(" with {} privilege", Privilege::join(&privileges))
        };
        self.core.log(
            Severity::Info,
            &format!("{actor} registered {what} {}{with}", r.name),
            None,
            None,
        );
        Ok(v1::Empty {})
    }
}

impl AdminApi for AdminSession<'_> {
    fn register_node(&self, r: v1::RegisterRequest) -> Result<v1::Empty, ServerError> {
        if !r.privileges.is_empty() {
            return Err(ServerError::invalid(
                "a node has no privilege classes: register an administrator",
            ));
        }
        self.register(r, "node", POLICY, |catalog, name, hash, _| {
            catalog.register_node(name, hash, qsm_catalog::standard_domain(catalog)?).map(|_| ())
        })
    }

    fn register_admin(&self, r: v1::RegisterRequest) -> Result<v1::Empty, ServerError> {
        self.register(r, "administrator", SYSTEM, |catalog, name, hash, privileges| {
            catalog.register_admin(name, hash, privileges)
        })
    }

    fn set_node_locked(&self, r: v1::LockRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        let state = self.core;
        let catalog = state.store.catalog();
        let node = catalog
            .node(&r.name)
            .map_err(catalog_error)?
            .ok_or_else(|| ServerError::not_found(format!("no node {}", r.name)))?;
        catalog.set_node_locked(node.id, r.locked).map_err(catalog_error)?;
        if r.locked {
            // Here at once, on the servers sharing the catalog within a heartbeat.
            state.cancel_sessions(SessionsOf::Node(node.id), "cancelled: node locked")?;
        }
        let how = if r.locked { "locked" } else { "unlocked" };
        state.log(Severity::Info, &format!("{actor} {how} node {}", r.name), Some(node.id), None);
        Ok(v1::Empty {})
    }

    fn query_nodes(&self, _: v1::Empty) -> Result<v1::NodeList, ServerError> {
        self.need(ANY)?;
        let state = self.core;
        let nodes = state.store.catalog().nodes().map_err(catalog_error)?;
        Ok(v1::NodeList {
            nodes: nodes
                .into_iter()
                .map(|n| v1::NodeInfo {
                    name: n.name,
                    locked: n.locked,
                    registered: n.registered,
                    replica_of: n.replica_of.unwrap_or_default(),
                })
                .collect(),
        })
    }

    fn query_filespaces(&self, r: v1::NodeName) -> Result<v1::NodeFilespaceList, ServerError> {
        self.need(ANY)?;
        let catalog = self.core.store.catalog();
        let nodes = if r.name.is_empty() {
            catalog.nodes().map_err(catalog_error)?
        } else {
            let node = catalog.node(&r.name).map_err(catalog_error)?;
            vec![node.ok_or_else(|| ServerError::not_found(format!("no node {}", r.name)))?]
        };
        let mut filespaces = Vec::new();
        for node in nodes {
            for f in catalog.filespaces(node.id).map_err(catalog_error)? {
                filespaces.push(v1::NodeFilespace {
                    node: node.name.clone(),
                    filespace: Some(qsm_proto::convert::filespace_to_wire(&f)),
                });
            }
        }
        Ok(v1::NodeFilespaceList { filespaces })
    }

    fn query_backup_runs(
        &self,
        r: v1::BackupRunsRequest,
    ) -> Result<v1::BackupRunList, ServerError> {
        self.need(ANY)?;
        let catalog = self.core.store.catalog();
        let node = catalog
            .node(&r.node)
            .map_err(catalog_error)?
            .ok_or_else(|| ServerError::not_found(format!("no node {}", r.node)))?;
        let mut filespaces = catalog.filespaces(node.id).map_err(catalog_error)?;
        if !r.filespace.is_empty() {
            filespaces.retain(|f| f.name == r.filespace);
            if filespaces.is_empty() {
                return Err(ServerError::not_found(format!(
                    "node {} has no filespace {}",
                    r.node, r.filespace
                )));
            }
        }
        let mut runs = Vec::new();
        for f in filespaces {
            for run in catalog.backup_runs(f.id, r.since).map_err(catalog_error)? {
                runs.push(v1::FilespaceRun {
                    filespace: f.name.clone(),
                    run: Some(qsm_proto::convert::run_to_wire(&run)),
                });
            }
        }
        runs.sort_by_key(|r| r.run.as_ref().map(|x| (x.ended, x.started)));
        Ok(v1::BackupRunList { runs })
    }

    fn define_schedule(&self, r: v1::ScheduleRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        check_name(&r.name)?;
        let missing = |what: &str| ServerError::invalid(format!("a schedule needs its {what}"));
        let spec = qsm_catalog::ScheduleSpec {
            action: r.action.ok_or_else(|| missing("action"))?,
            objects: r.objects,
            start: r.start.ok_or_else(|| missing("start"))?,
            duration: r.duration.ok_or_else(|| missing("duration"))?,
            period: r.period.ok_or_else(|| missing("period"))?,
            days: r.days,
        };
        crate::schedules::check(&spec)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let d = domain_named(catalog.as_ref(), &r.domain)?;
            catalog.define_schedule(d.id, &r.name, &spec).map_err(catalog_error)?;
            Ok(format!("{actor} defined schedule {}/{} ({})", r.domain, r.name, spec.action))
        })
    }

    fn update_schedule(&self, r: v1::ScheduleRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let s = schedule_named(catalog.as_ref(), &r.domain, &r.name)?;
            let mut spec = s.spec;
            if let Some(a) = r.action {
                spec.action = a;
            }
            if r.set_objects {
                spec.objects = r.objects;
            }
            spec.start = r.start.unwrap_or(spec.start);
            spec.duration = r.duration.unwrap_or(spec.duration);
            spec.period = r.period.unwrap_or(spec.period);
            if r.set_days {
                spec.days = r.days;
            }
            crate::schedules::check(&spec)?;
            catalog.update_schedule(s.id, &spec).map_err(catalog_error)?;
            Ok(format!("{actor} updated schedule {}/{}", r.domain, r.name))
        })
    }

    fn delete_schedule(&self, r: v1::ScheduleRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let s = schedule_named(catalog.as_ref(), &r.domain, &r.name)?;
            catalog.delete_schedule(s.id).map_err(catalog_error)?;
            Ok(format!("{actor} deleted schedule {}/{} and its events", r.domain, r.name))
        })
    }

    fn query_schedules(&self, _: v1::Empty) -> Result<v1::ScheduleList, ServerError> {
        self.need(ANY)?;
        let now = qsm_types::now();
        let schedules = self.core.store.catalog().schedules().map_err(catalog_error)?;
        Ok(v1::ScheduleList {
            schedules: schedules
                .into_iter()
                .map(|s| v1::ScheduleInfo {
                    next_window: crate::schedules::next_window(&s.spec, now).unwrap_or(0),
                    domain: s.domain_name,
                    name: s.name,
                    action: s.spec.action,
                    objects: s.spec.objects,
                    start: s.spec.start,
                    duration: s.spec.duration,
                    period: s.spec.period,
                    days: s.spec.days,
                })
                .collect(),
        })
    }

    fn query_events(&self, r: v1::EventRequest) -> Result<v1::EventList, ServerError> {
        self.need(ANY)?;
        let catalog = self.core.store.catalog();
        if !r.node.is_empty() && catalog.node(&r.node).map_err(catalog_error)?.is_none() {
            return Err(ServerError::not_found(format!("no node {}", r.node)));
        }
        let now = qsm_types::now();
        let since = if r.since > 0 { r.since } else { now - 86_400 };
        let mine = |node: &Option<String>| r.node.is_empty() || node.as_deref() == Some(&r.node);
        let mut events: Vec<v1::EventInfo> = catalog
            .events(since)
            .map_err(catalog_error)?
            .into_iter()
            .filter(|e| mine(&e.node))
            .map(|e| v1::EventInfo {
                domain: e.domain_name,
                schedule: e.schedule_name,
                action: e.action,
                node: e.node.unwrap_or_default(),
                window_start: e.window_start,
                state: e.state,
                started: e.started.unwrap_or(0),
                ended: e.ended.unwrap_or(0),
                detail: e.detail,
            })
            .collect();
        // Each schedule's next window, as a future event: the server's, and each associated
        // node's (a window open now that the node has not started yet, else the next).
        let associations = catalog.associations().map_err(catalog_error)?;
        let mut future = Vec::new();
        for s in catalog.schedules().map_err(catalog_error)? {
            let Some(next) = crate::schedules::next_window(&s.spec, now) else { continue };
            let open =
                crate::schedules::last_window(&s.spec, now).filter(|&w| now < w + s.spec.duration);
            let nodes: Vec<String> =
                if crate::schedules::CLIENT_ACTIONS.contains(&s.spec.action.as_str()) {
                    let of = associations.iter().filter(|a| a.schedule == s.id);
                    of.map(|a| a.node_name.clone()).filter(|n| mine(&Some(n.clone()))).collect()
                } else if r.node.is_empty() {
                    vec![String::new()]
                } else {
                    Vec::new()
                };
            for node in nodes {
                let ran = |w: i64| {
                    events.iter().any(|e| {
                        e.schedule == s.name
                            && e.domain == s.domain_name
                            && e.node == node
                            && e.window_start == w
                    })
                };
                let window = match open {
                    Some(w) if !node.is_empty() && !ran(w) => w,
                    _ => next,
                };
                future.push(v1::EventInfo {
                    domain: s.domain_name.clone(),
                    schedule: s.name.clone(),
                    action: s.spec.action.clone(),
                    node,
                    window_start: window,
                    state: "future".into(),
                    ..v1::EventInfo::default()
                });
            }
        }
        events.extend(future);
        events.sort_by_key(|e| e.window_start);
        Ok(v1::EventList { events })
    }

    fn define_association(&self, r: v1::AssociationRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        if r.nodes.is_empty() {
            return Err(ServerError::invalid("name the nodes the schedule is to run for"));
        }
        self.policy(|state| {
            let catalog = state.store.catalog();
            let s = schedule_named(catalog.as_ref(), &r.domain, &r.schedule)?;
            if !crate::schedules::CLIENT_ACTIONS.contains(&s.spec.action.as_str()) {
                return Err(ServerError::refused(format!(
                    "schedule {}/{} runs {} on the server: only client schedules have nodes",
                    r.domain, r.schedule, s.spec.action
                )));
            }
            let mut nodes = Vec::with_capacity(r.nodes.len());
            for name in &r.nodes {
                let node = catalog
                    .node(name)
                    .map_err(catalog_error)?
                    .ok_or_else(|| ServerError::not_found(format!("no node {name}")))?;
                // As TSM's DEFINE ASSOCIATION: a node follows its own domain's schedules.
                if node.domain != s.domain {
                    return Err(ServerError::refused(format!(
                        "node {name} is not in domain {}: move it there first",
                        r.domain
                    )));
                }
                nodes.push(node);
            }
            for node in &nodes {
                catalog.associate(s.id, node.id).map_err(catalog_error)?;
            }
            Ok(format!(
                "{actor} associated {} with schedule {}/{}",
                r.nodes.join(", "),
                r.domain,
                r.schedule
            ))
        })
    }

    fn delete_association(&self, r: v1::AssociationRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let s = schedule_named(catalog.as_ref(), &r.domain, &r.schedule)?;
            for name in &r.nodes {
                let node = catalog.node(name).map_err(catalog_error)?;
                let gone = || {
                    ServerError::not_found(format!(
                        "node {name} is not associated with schedule {}/{}",
                        r.domain, r.schedule
                    ))
                };
                let node = node.ok_or_else(gone)?;
                catalog.dissociate(s.id, node.id).map_err(|_| gone())?;
            }
            Ok(format!(
                "{actor} removed {} from schedule {}/{}",
                r.nodes.join(", "),
                r.domain,
                r.schedule
            ))
        })
    }

    fn query_associations(&self, _: v1::Empty) -> Result<v1::AssociationList, ServerError> {
        self.need(ANY)?;
        let all = self.core.store.catalog().associations().map_err(catalog_error)?;
        Ok(v1::AssociationList {
            associations: all
                .into_iter()
                .map(|a| v1::AssociationInfo {
                    domain: a.domain_name,
                    schedule: a.schedule_name,
                    node: a.node_name,
                    since: a.since,
                })
                .collect(),
        })
    }

    fn define_cloptset(&self, r: v1::CloptsetRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        check_name(&r.name)?;
        if r.description.len() > 1024 {
            return Err(ServerError::invalid("a description is at most 1024 bytes"));
        }
        self.policy(|state| {
            let catalog = state.store.catalog();
            catalog
                .define_cloptset(&r.name, &r.description)
                .map_err(|e| named(e, "client option set", &r.name))?;
            Ok(format!("{actor} defined client option set {}", r.name))
        })
    }

    fn delete_cloptset(&self, r: v1::CloptsetRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        self.policy(|state| {
            state.store.catalog().delete_cloptset(&r.name).map_err(|e| no_set(e, &r.name))?;
            Ok(format!("{actor} deleted client option set {}", r.name))
        })
    }

    fn define_clientopt(&self, r: v1::ClientoptRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        let o = r.option.ok_or_else(|| ServerError::invalid("no option given"))?;
        let kind = qsm_types::clientopts::check(&o.name, &o.value).map_err(ServerError::invalid)?;
        if kind == qsm_types::clientopts::Kind::Compression {
            check_compression(&o.value)?;
        }
        if o.name == "encryption"
            && o.force
            && qsm_types::clientopts::switch(&o.value) == Some(false)
        {
            return Err(ServerError::invalid(
                "encryption can be forced on, never off: a node's own encryption keeps its data \
                 from the server (without --force, off fills in for nodes that say nothing)",
            ));
        }
        // Patterns add up (every include and exclude applies); any other option has one value.
        let replace = kind != qsm_types::clientopts::Kind::Pattern;
        let opt = qsm_catalog::ClientOpt { name: o.name, value: o.value, force: o.force };
        self.policy(|state| {
            state
                .store
                .catalog()
                .add_clientopt(&r.set, &opt, replace)
                .map_err(|e| no_set(e, &r.set))?;
            let force = if opt.force { " (forced)" } else { "" };
            Ok(format!(
                "{actor} set {}={}{force} in client option set {}",
                opt.name, opt.value, r.set
            ))
        })
    }

    fn delete_clientopt(&self, r: v1::ClientoptRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        let name = r.option.map(|o| o.name).unwrap_or_default();
        self.policy(|state| {
            let n = state
                .store
                .catalog()
                .delete_clientopt(&r.set, &name)
                .map_err(|e| no_set(e, &r.set))?;
            if n == 0 {
                return Err(ServerError::not_found(format!(
                    "client option set {} has no option {name}",
                    r.set
                )));
            }
            Ok(format!("{actor} deleted {name} from client option set {}", r.set))
        })
    }

    fn query_cloptsets(&self, _: v1::Empty) -> Result<v1::CloptsetList, ServerError> {
        self.need(ANY)?;
        let sets = self.core.store.catalog().cloptsets().map_err(catalog_error)?;
        Ok(v1::CloptsetList {
            sets: sets.iter().map(qsm_proto::convert::cloptset_to_wire).collect(),
        })
    }

    fn hold_node(&self, r: v1::HoldRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        if r.suspect {
            return Err(ServerError::invalid(
                "only the server holds a suspect backup; an administrator's hold is a plain one",
            ));
        }
        if r.reason.len() > 1024 {
            return Err(ServerError::invalid("a reason is at most 1024 bytes"));
        }
        // Shown on other administrators' terminals: escaped, as a node's event report is.
        let reason = qsm_types::printable(&r.reason);
        let catalog = self.core.store.catalog();
        let (node, fs, what) = hold_target(catalog.as_ref(), &r)?;
        let placed = catalog
            .hold(node, fs, HoldKind::Hold, &actor, &reason, qsm_catalog::now())
            .map_err(catalog_error)?;
        if !placed {
            return Err(ServerError::exists(format!("{what} is held already")));
        }
        let why = if r.reason.is_empty() { String::new() } else { format!(": {}", reason) };
        self.core.log(Severity::Warning, &format!("{actor} held {what}{why}"), Some(node), None);
        Ok(v1::Empty {})
    }

    fn release_node(&self, r: v1::HoldRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        if r.suspect && r.filespace.is_empty() {
            return Err(ServerError::invalid(
                "a suspect backup is held on its filespace: name it (--filespace; query hold)",
            ));
        }
        let catalog = self.core.store.catalog();
        let (node, fs, what) = hold_target(catalog.as_ref(), &r)?;
        let kind = if r.suspect { HoldKind::Suspect } else { HoldKind::Hold };
        if !catalog.release(node, fs, kind).map_err(catalog_error)? {
            return Err(ServerError::not_found(if r.suspect {
                format!("{what} holds no suspect backup")
            } else {
                format!("{what} is not held")
            }));
        }
        let said = if r.suspect {
            format!(
                "{actor} acknowledged the suspect backup of {what}: its versions may expire again"
            )
        } else {
            format!("{actor} released {what}")
        };
        self.core.log(Severity::Warning, &said, Some(node), None);
        Ok(v1::Empty {})
    }

    fn define_server(&self, r: v1::ServerRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        crate::replication::check_server(&r)?;
        if r.password.is_empty() || r.password.len() > 1024 {
            return Err(ServerError::invalid("the account's password: 1 to 1024 bytes"));
        }
        let server = qsm_catalog::PeerServer {
            name: r.name.clone(),
            address: r.address.clone(),
            ca: r.ca,
            account: r.account.clone(),
            password: r.password,
            created: qsm_types::now(),
        };
        let catalog = self.core.store.catalog();
        catalog.define_peer_server(&server).map_err(|e| named(e, "server", &r.name))?;
        self.core.log(
            Severity::Info,
            &format!(
                "{actor} defined server {} at {} (replication account {})",
                r.name, r.address, r.account
            ),
            None,
            None,
        );
        Ok(v1::Empty {})
    }

    fn delete_server(&self, r: v1::ServerRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        let catalog = self.core.store.catalog();
        catalog.delete_peer_server(&r.name).map_err(|e| named(e, "server", &r.name))?;
        self.core.log(Severity::Info, &format!("{actor} deleted server {}", r.name), None, None);
        Ok(v1::Empty {})
    }

    fn query_servers(&self, _: v1::Empty) -> Result<v1::ServerList, ServerError> {
        self.need(ANY)?;
        let servers = self.core.store.catalog().peer_servers().map_err(catalog_error)?;
        Ok(v1::ServerList {
            servers: servers
                .into_iter()
                .map(|s| v1::ServerInfo {
                    name: s.name,
                    address: s.address,
                    account: s.account,
                    created: s.created,
                })
                .collect(),
        })
    }

    fn replicate_node(&self, r: v1::ReplicateRequest) -> Result<v1::ReplicateReply, ServerError> {
        let actor = self.need(SYSTEM)?;
        crate::replication::replicate(self, &actor, r)
    }

    fn repair_stgpool(&self, r: v1::RepairRequest) -> Result<v1::RepairReply, ServerError> {
        let actor = self.need(STORAGE)?;
        crate::replication::repair(self, &actor, r)
    }

    fn query_holds(&self, _: v1::Empty) -> Result<v1::HoldList, ServerError> {
        self.need(ANY)?;
        let holds = self.core.store.catalog().holds().map_err(catalog_error)?;
        Ok(v1::HoldList {
            holds: holds
                .into_iter()
                .map(|h| v1::HoldInfo {
                    node: h.node_name,
                    filespace: h.filespace_name,
                    kind: h.kind.name().to_owned(),
                    since: h.since,
                    by: h.by,
                    reason: h.reason,
                })
                .collect(),
        })
    }

    fn query_sessions(&self, _: v1::Empty) -> Result<v1::SessionList, ServerError> {
        self.need(ANY)?;
        let state = self.core;
        // This server's sessions as it knows them (live counters), then the other servers'
        // as the catalog has them.
        let mut sessions: Vec<v1::SessionInfo> = state
            .sessions
            .list()
            .into_iter()
            .map(|s| v1::SessionInfo {
                id: s.id,
                account: s.account.clone(),
                admin: s.node.is_none(),
                client: s.client.clone(),
                started: s.started,
                bytes: s.bytes.load(Ordering::Relaxed),
                objects: s.objects.load(Ordering::Relaxed),
                state: s.state().into(),
                peer: s.peer.clone(),
                server: state.name.clone(),
            })
            .collect();
        let elsewhere = state.store.catalog().open_sessions().map_err(catalog_error)?;
        sessions.extend(elsewhere.into_iter().filter(|s| s.server != state.server).map(|s| {
            v1::SessionInfo {
                id: s.id,
                admin: s.node.is_none(),
                account: s.account,
                client: s.client,
                started: s.started,
                bytes: s.bytes,
                objects: s.objects,
                state: if s.cancelled { "cancelled" } else { "running" }.into(),
                peer: s.peer,
                server: s.server_name,
            }
        }));
        sessions.sort_by_key(|s| s.id);
        Ok(v1::SessionList { sessions })
    }

    fn cancel_session(&self, r: v1::CancelRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(OPERATOR)?;
        let id = r.session;
        let state = self.core;
        let how = format!("cancelled by {actor}");
        if state.cancel_sessions(SessionsOf::Id(id), &how)? == 0 {
            return Err(ServerError::not_found(format!("no session {id}")));
        }
        state.log(Severity::Info, &format!("{actor} cancelled session {id}"), None, None);
        Ok(v1::Empty {})
    }

    fn expire_inventory(&self, r: v1::ExpireRequest) -> Result<v1::ExpireReply, ServerError> {
        use qsm_catalog::expire::{ExpireOptions, ExpireProgress, expire_inventory};
        let actor = self.need(SYSTEM)?;
        let resource = match r.resource {
            0 => 4,
            n if n > MAX_EXPIRE_WORKERS => {
                return Err(ServerError::invalid(format!(
                    "--resource: at most {MAX_EXPIRE_WORKERS} workers"
                )));
            }
            n => n as usize,
        };
        let state = self.core;
        let catalog = state.store.catalog();
        let mut nodes = None;
        if !r.nodes.is_empty() {
            let mut ids = Vec::new();
            for name in &r.nodes {
                let node = catalog
                    .node(name)
                    .map_err(catalog_error)?
                    .ok_or_else(|| ServerError::not_found(format!("no node {name}")))?;
                ids.push(node.id);
            }
            nodes = Some(ids);
        }
        let what = match &nodes {
            None => format!("all nodes, {resource} workers"),
            Some(_) => format!("nodes {}, {resource} workers", r.nodes.join(", ")),
        };
        let progress = Arc::new(ExpireProgress::default());
        let shown = Arc::clone(&progress);
        let show = Arc::new(move || {
            format!(
                "{} versions examined, {} backup versions and {} archives deleted, {} filespaces done",
                shown.examined.load(Ordering::Relaxed),
                shown.backups.load(Ordering::Relaxed),
                shown.archives.load(Ordering::Relaxed),
                shown.filespaces.load(Ordering::Relaxed)
            )
        });
        let ran = state.run_process("expire inventory", &what, &actor, show, |cancel| {
            let options = ExpireOptions {
                resource,
                nodes,
                duration: (r.duration_minutes > 0)
                    .then(|| std::time::Duration::from_secs(u64::from(r.duration_minutes) * 60)),
                ..ExpireOptions::new(qsm_catalog::now(), cancel, &progress)
            };
            let report = expire_inventory(catalog.as_ref(), &options).map_err(catalog_error)?;
            let kept = if report.protected > 0 {
                format!("; {} due kept by retention locks or holds", report.protected)
            } else {
                String::new()
            };
            Ok(Finished {
                detail: format!(
                    "examined {}, deleted {} backup versions and {} archives in {} filespaces{kept}",
                    report.examined, report.backups, report.archives, report.filespaces
                ),
                stopped: report.stopped.clone(),
                value: report,
            })
        })?;
        Ok(v1::ExpireReply {
            process: ran.process as u64,
            examined: ran.value.examined,
            backups: ran.value.backups,
            archives: ran.value.archives,
            filespaces: ran.value.filespaces,
            stopped: ran.stopped.unwrap_or_default(),
            seconds: ran.seconds,
            protected: ran.value.protected,
        })
    }

    fn query_processes(&self, _: v1::Empty) -> Result<v1::ProcessList, ServerError> {
        self.need(ANY)?;
        let state = self.core;
        // This server's processes with their progress now, then the other servers' with
        // the progress of their last heartbeat.
        let mut processes: Vec<v1::ProcessInfo> = state
            .processes
            .list()
            .into_iter()
            .map(|(id, kind, started, progress)| v1::ProcessInfo {
                id: id as u64,
                kind,
                started,
                progress,
                server: state.name.clone(),
            })
            .collect();
        let elsewhere = state.store.catalog().running_processes().map_err(catalog_error)?;
        processes.extend(elsewhere.into_iter().filter(|p| p.server != state.server).map(|p| {
            v1::ProcessInfo {
                id: p.id.0 as u64,
                kind: p.kind,
                started: p.started,
                progress: p.progress,
                server: p.server_name,
            }
        }));
        processes.sort_by_key(|p| p.id);
        Ok(v1::ProcessList { processes })
    }

    fn cancel_process(&self, r: v1::ProcessRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(OPERATOR)?;
        let id = r.process;
        let state = self.core;
        let Ok(process) = i64::try_from(id) else {
            return Err(ServerError::not_found(format!("no process {id} is running")));
        };
        if !state.cancel_process(qsm_catalog::ProcessId(process))? {
            return Err(ServerError::not_found(format!("no process {id} is running")));
        }
        state.log(Severity::Info, &format!("{actor} cancelled process {id}"), None, None);
        Ok(v1::Empty {})
    }

    fn reclaim_stgpool(&self, r: v1::ReclaimRequest) -> Result<v1::ReclaimReply, ServerError> {
        let actor = self.need(STORAGE)?;
        let pct = match r.threshold_percent {
            0 => 60,
            p if p > 100 => {
                return Err(ServerError::invalid("--threshold is a percentage, 1 to 100"));
            }
            p => p,
        };
        let state = self.core;
        let what = format!("containers at least {pct}% reclaimable");
        let shown = what.clone();
        let ran = state.run_process(
            "reclaim stgpool",
            &what,
            &actor,
            Arc::new(move || shown.clone()),
            |cancel| {
                // Live below (100 - pct)% of a container's bytes: at least pct% is reclaimable.
                let done = state
                    .store
                    .reclaim_until(f64::from(100 - pct) / 100.0, cancel)
                    .map_err(store_error)?;
                // Orphans are leftovers of crashes or refused reclamations. On a shared
                // catalog, containers a live server leases or wrote within a lease term
                // are kept (Store::remove_orphans): a crashed server's become orphans once
                // its lease lapsed.
                let orphans = state.store.remove_orphans().map_err(store_error)?;
                Ok(Finished {
                    detail: format!(
                        "{} containers reclaimed, {} orphan containers removed",
                        done.len(),
                        orphans.len()
                    ),
                    stopped: cancel.load(Ordering::Relaxed).then(|| "cancelled".to_owned()),
                    value: (done.len() as u64, orphans.len() as u64, false),
                })
            },
        )?;
        Ok(v1::ReclaimReply {
            process: ran.process as u64,
            containers: ran.value.0,
            orphans: ran.value.1,
            orphans_skipped: ran.value.2,
            stopped: ran.stopped.unwrap_or_default(),
            seconds: ran.seconds,
        })
    }

    fn define_domain(&self, r: v1::DomainRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        check_name(&r.name)?;
        if r.description.len() > 4096 {
            return Err(ServerError::invalid("a description has at most 4096 bytes"));
        }
        self.policy(|state| {
            state.store.catalog().define_domain(&r.name, &r.description).map_err(catalog_error)?;
            Ok(format!("{actor} defined domain {}", r.name))
        })
    }

    fn delete_domain(&self, r: v1::DomainRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let d = domain_named(catalog.as_ref(), &r.name)?;
            catalog.delete_domain(d.id).map_err(|e| named(e, "domain", &r.name))?;
            Ok(format!("{actor} deleted domain {}", r.name))
        })
    }

    fn define_mgmt_class(&self, r: v1::MgmtClassRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(retain_min_need(&r)?)?;
        check_name(&r.name)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let d = domain_named(catalog.as_ref(), &r.domain)?;
            let (backup, archive) = copy_groups(&r, Default::default())?;
            let id = catalog
                .define_mgmt_class(d.id, &r.name, backup, archive)
                .map_err(|e| named(e, "management class", &r.name))?;
            let min = r.retain_min_days.unwrap_or(0);
            if min > 0 {
                catalog.set_retain_min(id, min).map_err(catalog_error)?;
            }
            Ok(format!(
                "{actor} defined management class {}/{}: {}{}",
                r.domain,
                r.name,
                describe(backup, archive),
                retain_min(min)
            ))
        })
    }

    fn update_mgmt_class(&self, r: v1::MgmtClassRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(retain_min_need(&r)?)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let class = class_named(catalog.as_ref(), &r.domain, &r.name)?;
            let (backup, archive) = copy_groups(&r, (class.backup, class.archive))?;
            catalog.update_mgmt_class(class.id, backup, archive).map_err(catalog_error)?;
            let min = r.retain_min_days.unwrap_or(class.retain_min_days);
            if min != class.retain_min_days {
                catalog.set_retain_min(class.id, min).map_err(catalog_error)?;
            }
            Ok(format!(
                "{actor} updated management class {}/{}: {}{}",
                r.domain,
                r.name,
                describe(backup, archive),
                retain_min(min)
            ))
        })
    }

    fn delete_mgmt_class(&self, r: v1::MgmtClassRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let class = class_named(catalog.as_ref(), &r.domain, &r.name)?;
            catalog
                .delete_mgmt_class(class.id)
                .map_err(|e| named(e, "management class", &format!("{}/{}", r.domain, r.name)))?;
            Ok(format!("{actor} deleted management class {}/{}", r.domain, r.name))
        })
    }

    fn query_policy(&self, _: v1::Empty) -> Result<v1::PolicyList, ServerError> {
        self.need(ANY)?;
        let state = self.core;
        let catalog = state.store.catalog();
        let nodes = catalog.nodes().map_err(catalog_error)?;
        let mut domains = Vec::new();
        for d in catalog.domains().map_err(catalog_error)? {
            let classes = catalog
                .mgmt_classes(d.id)
                .map_err(catalog_error)?
                .into_iter()
                .map(class_info)
                .collect();
            domains.push(v1::DomainInfo {
                nodes: nodes.iter().filter(|n| n.domain == d.id).map(|n| n.name.clone()).collect(),
                name: d.name,
                description: d.description,
                classes,
            });
        }
        Ok(v1::PolicyList { domains })
    }

    fn update_node(&self, r: v1::UpdateNodeRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        if r.domain.is_empty() && r.password.is_none() && r.cloptset.is_none() {
            return Err(ServerError::invalid(
                "nothing to change: give a domain, a password or a client option set",
            ));
        }
        if let Some(p) = &r.password {
            check_password(p)?;
        }
        self.policy(|state| {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&r.name)
                .map_err(catalog_error)?
                .ok_or_else(|| ServerError::not_found(format!("no node {}", r.name)))?;
            let mut done = Vec::new();
            if let Some(password) = &r.password {
                let hash = auth::hash_password(password).map_err(ServerError::failed)?;
                catalog.set_password(false, &r.name, &hash).map_err(catalog_error)?;
                done.push("changed the password of".to_owned());
            }
            if !r.domain.is_empty() {
                let d = domain_named(catalog.as_ref(), &r.domain)?;
                catalog.set_node_domain(node.id, d.id).map_err(catalog_error)?;
                done.push(format!("moved to domain {}", r.domain));
            }
            if let Some(set) = &r.cloptset {
                let set = (!set.is_empty()).then_some(set.as_str());
                catalog.set_node_cloptset(node.id, set).map_err(|e| match e {
                    qsm_catalog::CatalogError::NotFound { what: "client option set", key } => {
                        ServerError::not_found(format!("no client option set {key}"))
                    }
                    e => catalog_error(e),
                })?;
                done.push(match set {
                    Some(set) => format!("gave client option set {set} to"),
                    None => "took the client option set from".to_owned(),
                });
            }
            Ok(format!("{actor} {} node {}", done.join(" and "), r.name))
        })
    }

    fn update_admin(&self, r: v1::PasswordRequest) -> Result<v1::Empty, ServerError> {
        // Every administrator may change its own password; another's needs system privilege.
        let me = self.need(ANY)?;
        let own = me == format!("administrator {}", r.name);
        let actor = if own { me } else { self.need(SYSTEM)? };
        check_password(&r.password)?;
        let state = self.core;
        let hash = auth::hash_password(&r.password).map_err(ServerError::failed)?;
        state.store.catalog().set_password(true, &r.name, &hash).map_err(catalog_error)?;
        state.log(
            Severity::Info,
            &format!("{actor} changed the password of administrator {}", r.name),
            None,
            None,
        );
        Ok(v1::Empty {})
    }

    fn set_admin_locked(&self, r: v1::LockRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        if r.locked && actor == format!("administrator {}", r.name) {
            return Err(ServerError::refused("an administrator cannot lock itself out"));
        }
        let state = self.core;
        state.store.catalog().set_admin_locked(&r.name, r.locked).map_err(catalog_error)?;
        if r.locked {
            state.cancel_sessions(SessionsOf::Admin(&r.name), "cancelled: locked")?;
        }
        let how = if r.locked { "locked" } else { "unlocked" };
        state.log(Severity::Info, &format!("{actor} {how} administrator {}", r.name), None, None);
        Ok(v1::Empty {})
    }

    fn remove_admin(&self, r: v1::NodeName) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        if actor == format!("administrator {}", r.name) {
            return Err(ServerError::refused("an administrator cannot remove itself"));
        }
        let state = self.core;
        state.store.catalog().remove_admin(&r.name).map_err(catalog_error)?;
        state.cancel_sessions(SessionsOf::Admin(&r.name), "cancelled: removed")?;
        state.log(Severity::Info, &format!("{actor} removed administrator {}", r.name), None, None);
        Ok(v1::Empty {})
    }

    fn query_actlog(&self, r: v1::ActlogRequest) -> Result<v1::ActlogReply, ServerError> {
        self.need(ANY)?;
        let limit = if r.limit == 0 { 1000 } else { r.limit.min(MAX_ACTLOG_ENTRIES) } as usize;
        let search = r.search.to_lowercase();
        let state = self.core;
        // Pages through the log from `since`, so a search scans all of it without holding
        // it in memory; only the newest `limit` matches are kept.
        let catalog = state.store.catalog();
        let mut kept = std::collections::VecDeque::new();
        let (mut since, mut last_id, mut truncated) = (r.since, 0i64, false);
        loop {
            let page = catalog.activity(since, 10_000).map_err(catalog_error)?;
            let full = page.len() == 10_000;
            let mut new = 0;
            for e in page {
                if e.id <= last_id {
                    continue;
                }
                new += 1;
                last_id = e.id;
                since = e.time;
                if search.is_empty() || e.message.to_lowercase().contains(&search) {
                    kept.push_back(e);
                    if kept.len() > limit {
                        kept.pop_front();
                        truncated = true;
                    }
                }
            }
            if !full {
                break;
            }
            if new == 0 {
                // More than a page of entries in one second: paging by time cannot pass
                // them. Say the answer is partial rather than loop.
                truncated = true;
                break;
            }
        }
        let entries = kept
            .into_iter()
            .map(|e| v1::ActlogEntry {
                time: e.time,
                severity: match e.severity {
                    Severity::Info => "info",
                    Severity::Warning => "warning",
                    Severity::Error => "error",
                }
                .into(),
                message: e.message,
            })
            .collect();
        Ok(v1::ActlogReply { entries, truncated })
    }

    fn set_dedup_scope(&self, r: v1::DedupScopeRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        if r.scope.is_empty() || r.scope.len() > 256 {
            return Err(ServerError::invalid("a dedup scope name has 1 to 256 bytes"));
        }
        let state = self.core;
        let catalog = state.store.catalog();
        let node = catalog
            .node(&r.node)
            .map_err(catalog_error)?
            .ok_or_else(|| ServerError::not_found(format!("no node {}", r.node)))?;
        let secret = crate::node_core::new_secret()?;
        catalog.set_dedup_scope(node.id, &r.scope, secret).map_err(catalog_error)?;
        state.log(
            Severity::Info,
            &format!("{actor} put node {} in dedup scope {}", r.node, r.scope),
            Some(node.id),
            None,
        );
        Ok(v1::Empty {})
    }

    fn grant_authority(&self, r: v1::GrantRequest) -> Result<v1::Empty, ServerError> {
        let actor = self.need(SYSTEM)?;
        let list = privileges(&r.privileges)?;
        self.policy(|state| {
            state
                .store
                .catalog()
                .set_admin_privileges(&r.name, &list)
                .map_err(|e| named(e, "administrator", &r.name))?;
            let what = if list.is_empty() { "no".to_owned() } else { Privilege::join(&list) };
            Ok(format!("{actor} gave administrator {} {what} privilege", r.name))
        })
    }

    fn backup_db(&self, r: v1::BackupDbRequest) -> Result<v1::BackupDbReply, ServerError> {
        // A copy written anywhere the server can write, holding every password hash, dedup
        // secret and wrapped key: system only. The default directory: storage or operator.
        let need = if r.to.is_empty() { DB_BACKUP } else { SYSTEM };
        let actor = self.need(need)?;
        let to = r.to;
        let state = self.core;
        let to = (!to.is_empty()).then(|| std::path::PathBuf::from(&to));
        let what = match &to {
            Some(p) => format!("to {}", p.display()),
            None => {
                format!("to {}", state.config.data_dir.join(crate::dbcopy::BACKUP_DIR).display())
            }
        };
        let shown = what.clone();
        let ran = state.run_process(
            "backup db",
            &what,
            &actor,
            Arc::new(move || shown.clone()),
            |_| {
                let made = crate::dbcopy::backup(
                    state.store.catalog().as_ref(),
                    &state.config,
                    to.as_deref(),
                )
                .map_err(ServerError::failed)?;
                let e = &made.entry;
                Ok(Finished {
                    detail: format!(
                        "{}: {} bytes of catalog (schema {}, {}) in {} bytes",
                        e.path.display(),
                        e.catalog_bytes,
                        e.schema,
                        e.detail,
                        e.bytes
                    ),
                    stopped: None,
                    value: made.entry,
                })
            },
        )?;
        let e = ran.value;
        Ok(v1::BackupDbReply {
            process: ran.process as u64,
            path: e.path.display().to_string(),
            bytes: e.bytes,
            catalog_bytes: e.catalog_bytes,
            schema: e.schema,
            seconds: ran.seconds,
        })
    }

    fn query_volhist(&self, _: v1::Empty) -> Result<v1::VolhistReply, ServerError> {
        self.need(ANY)?;
        let dir = self.core.config.data_dir.clone();
        let entries = crate::dbcopy::volhist(&dir)
            .map_err(ServerError::failed)?
            .into_iter()
            .map(|e| v1::VolhistEntry {
                time: e.time,
                kind: e.kind,
                path: e.path.display().to_string(),
                bytes: e.bytes,
                schema: e.schema,
                detail: e.detail,
            })
            .collect();
        Ok(v1::VolhistReply { entries })
    }

    fn delete_filespace(
        &self,
        r: v1::DeleteFilespaceRequest,
    ) -> Result<v1::DeleteFilespaceReply, ServerError> {
        let actor = self.need(POLICY)?;
        let state = self.core;
        let catalog = state.store.catalog();
        let (node, fs) = node_filespace(catalog.as_ref(), &r.node, &r.filespace)?;
        // Refused before the node's sessions are touched (the catalog refuses it again if a
        // hold comes meanwhile).
        let kept = catalog.protection(fs.id, qsm_catalog::now()).map_err(catalog_error)?;
        if let Some(why) = kept.why() {
            return Err(ServerError::refused(format!(
                "node {} filespace {}: {why}; nothing was deleted",
                r.node, r.filespace
            )));
        }
        // Its backups would race the deletion: the node's sessions end first (those on
        // other servers sharing the catalog at their next heartbeat).
        state.cancel_sessions(SessionsOf::Node(node.id), "cancelled: filespace deleted")?;
        let what = format!("node {} filespace {}", r.node, r.filespace);
        let shown = what.clone();
        let ran = state.run_process(
            "delete filespace",
            &what,
            &actor,
            Arc::new(move || shown.clone()),
            |cancel| {
                let n = catalog.delete_filespace(fs.id, 2_000, cancel).map_err(catalog_error)?;
                Ok(Finished {
                    detail: format!("{n} versions deleted"),
                    stopped: cancel.load(Ordering::Relaxed).then(|| "cancelled".to_owned()),
                    value: n,
                })
            },
        )?;
        Ok(v1::DeleteFilespaceReply {
            process: ran.process as u64,
            versions: ran.value,
            stopped: ran.stopped.unwrap_or_default(),
            seconds: ran.seconds,
        })
    }

    fn delete_node(&self, r: v1::NodeName) -> Result<v1::Empty, ServerError> {
        let actor = self.need(POLICY)?;
        let name = r.name;
        self.policy(|state| {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&name)
                .map_err(catalog_error)?
                .ok_or_else(|| ServerError::not_found(format!("no node {name}")))?;
            state.cancel_sessions(SessionsOf::Node(node.id), "cancelled: node deleted")?;
            catalog.delete_node(node.id).map_err(|e| named(e, "node", &name))?;
            Ok(format!("{actor} deleted node {name}"))
        })
    }

    fn query_stgpool(&self, _: v1::Empty) -> Result<v1::StgpoolList, ServerError> {
        self.need(ANY)?;
        let state = self.core;
        let catalog = state.store.catalog();
        let mut pools = Vec::new();
        for p in catalog.pools().map_err(catalog_error)? {
            let u = catalog.pool_usage(p.id).map_err(catalog_error)?;
            pools.push(v1::StgpoolInfo {
                name: p.name,
                kind: p.kind,
                location: p.location,
                containers: u.containers,
                bytes: u.bytes,
                chunks: u.chunks,
                live_bytes: u.live_bytes,
                damaged_chunks: u.damaged_chunks,
            });
        }
        Ok(v1::StgpoolList { pools })
    }

    fn audit_stgpool(&self, r: v1::AuditRequest) -> Result<v1::AuditReply, ServerError> {
        let actor = self.need(STORAGE)?;
        let state = self.core;
        let what = format!(
            "{}{}{}",
            if r.containers.is_empty() {
                "all containers".to_owned()
            } else {
                format!("{} containers", r.containers.len())
            },
            if r.mark_damaged { ", marking damaged chunks" } else { "" },
            if r.release_unknown { ", releasing unknown containers" } else { "" }
        );
        let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let shown = Arc::clone(&read);
        let show = Arc::new(move || format!("{} chunks verified", shown.load(Ordering::Relaxed)));
        let ran = state.run_process("audit stgpool", &what, &actor, show, |cancel| {
            let options = qsm_store::AuditOptions {
                mark_damaged: r.mark_damaged,
                release_unknown: r.release_unknown,
                containers: (!r.containers.is_empty()).then(|| r.containers.clone()),
                stop: Some(cancel),
                progress: Some(&read),
            };
            let report = state.store.audit(&options).map_err(store_error)?;
            for d in &report.damaged {
                state.log(
                    Severity::Error,
                    &format!(
                        "audit: chunk {} at container {:016x} offset {} is damaged: {}",
                        d.chunk.0, d.container, d.offset, d.reason
                    ),
                    None,
                    None,
                );
            }
            Ok(Finished {
                detail: format!(
                    "{} containers, {} chunks verified, {} damaged in {} object versions{}, {} containers unknown to the catalog",
                    report.containers,
                    report.chunks_read,
                    report.damaged.len(),
                    report.damaged_objects.len(),
                    if report.marked { " (marked)" } else { "" },
                    report.unknown_containers.len()
                ),
                stopped: report.stopped.clone(),
                value: report,
            })
        })?;
        let report = ran.value;
        let names = object_names(state.store.catalog().as_ref(), &report.damaged_objects)?;
        if !report.damaged.is_empty() {
            let mut message = format!(
                "audit found {} damaged chunks in {} object versions",
                report.damaged.len(),
                names.len()
            );
            if let Some(first) = names.first() {
                message += &format!(" (the first: {first})");
            }
            state.alert("damaged", &message, None, None, None);
        }
        Ok(v1::AuditReply {
            process: ran.process as u64,
            containers: report.containers,
            chunks_read: report.chunks_read,
            bytes_read: report.bytes_read,
            damaged: report
                .damaged
                .iter()
                .map(|d| v1::DamagedChunkInfo {
                    chunk: d.chunk.0 as u64,
                    container: d.container,
                    offset: d.offset,
                    reason: d.reason.clone(),
                })
                .collect(),
            damaged_objects: names,
            marked: report.marked,
            unknown_containers: report.unknown_containers.iter().map(|c| c.0).collect(),
            unknown_bytes: report.unknown_containers.iter().map(|c| c.1).sum(),
            unrecorded_bytes: report.unrecorded_tails.iter().map(|c| c.1).sum(),
            restored_at: report.restored_at.unwrap_or(0),
            released: report.released,
            stopped: report.stopped.unwrap_or_default(),
            seconds: ran.seconds,
        })
    }
}

/// "NODE FILESPACE PATH" of each version, for reports.
fn object_names(
    catalog: &dyn qsm_catalog::Catalog,
    objects: &[(qsm_catalog::ObjectId, qsm_catalog::FilespaceId, Vec<u8>)],
) -> Result<Vec<String>, ServerError> {
    let mut names = std::collections::HashMap::new();
    if !objects.is_empty() {
        for node in catalog.nodes().map_err(catalog_error)? {
            for fs in catalog.filespaces(node.id).map_err(catalog_error)? {
                names.insert(fs.id, format!("{} {}", node.name, fs.name));
            }
        }
    }
    Ok(objects
        .iter()
        .map(|(id, fs, path)| {
            let owner = names.get(fs).cloned().unwrap_or_else(|| format!("filespace {}", fs.0));
            format!("{owner} {} (version {})", String::from_utf8_lossy(path), id.0)
        })
        .collect())
}
