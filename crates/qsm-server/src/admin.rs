//! The `Admin` service. A caller is an administrator when its session is an administrator's,
//! or when it comes through the local socket from the server's own user or root: whoever can
//! read the server's files can administer it anyway, and the first administrator needs a way in.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use qsm_catalog::coord::SessionsOf;
use qsm_catalog::{Coordination, Privilege, Severity};
use qsm_proto::v1::{self, admin_server::Admin};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::auth;
use crate::node::{blocking, catalog_status, store_status, token};
use crate::state::{Finished, State};

/// The most workers one expiration may run (`--resource`): each takes whole filespaces and
/// holds a catalog connection.
pub const MAX_EXPIRE_WORKERS: u32 = 64;
/// The most activity-log entries one query returns (`--limit`); a larger one is answered with
/// this many.
pub const MAX_ACTLOG_ENTRIES: u32 = 100_000;

/// The service.
#[derive(Debug, Clone)]
pub struct AdminService {
    pub(crate) state: Arc<State>,
}

/// Privilege classes from their names.
fn privileges(names: &[String]) -> Result<Vec<Privilege>, Status> {
    Privilege::parse_list(&names.join(",")).map_err(Status::invalid_argument)
}

/// Account names: what a shell and a log line can carry without quoting.
fn check_name(name: &str) -> Result<(), Status> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-'"
        )))
    }
}

fn check_password(password: &str) -> Result<(), Status> {
    if password.chars().count() < 8 || password.len() > 1024 {
        return Err(Status::invalid_argument("a password has 8 to 1024 characters"));
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

impl AdminService {
    /// Who is asking, for the activity log, if they may do what needs `need`. The local
    /// socket from the server's own user or root has system privilege. An administrator's
    /// classes are read from the catalog at every call, so a revocation takes effect at once.
    fn authorize<T>(&self, request: &Request<T>, need: Need) -> Result<String, Status> {
        if let Some(info) = request.extensions().get::<UdsConnectInfo>() {
            let me = rustix::process::geteuid().as_raw();
            if let Some(c) = info.peer_cred.filter(|c| c.uid() == me || c.uid() == 0) {
                return Ok(format!("the local socket's uid {}", c.uid()));
            }
        }
        let session = match token(request).and_then(|t| self.state.sessions.get(t)) {
            Some(s) if s.is_cancelled() => {
                return Err(Status::cancelled("this session was cancelled"));
            }
            Some(s) if s.node.is_none() => s,
            Some(_) => {
                return Err(Status::permission_denied("a node cannot administer the server"));
            }
            None => {
                return Err(Status::unauthenticated(
                    "log in as an administrator, or use the server's local socket as its user",
                ));
            }
        };
        let actor = format!("administrator {}", session.account);
        if need.is_empty() {
            return Ok(actor);
        }
        let admin = self
            .state
            .store
            .catalog()
            .admin(&session.account)
            .map_err(catalog_status)?
            .ok_or_else(|| Status::permission_denied(format!("{actor} no longer exists")))?;
        if admin.locked {
            return Err(Status::permission_denied(format!("{actor} is locked")));
        }
        let held = &admin.privileges;
        if held.contains(&Privilege::System) || need.iter().any(|p| held.contains(p)) {
            return Ok(actor);
        }
        let wanted: Vec<&str> =
            std::iter::once("system").chain(need.iter().map(|p| p.name())).collect();
        Err(Status::permission_denied(format!(
            "{actor} has {} privilege; this needs {}",
            if held.is_empty() { "no".to_owned() } else { Privilege::join(held) },
            wanted.join(" or ")
        )))
    }
}

fn domain_named(
    catalog: &dyn qsm_catalog::Catalog,
    name: &str,
) -> Result<qsm_catalog::Domain, Status> {
    catalog
        .domain(name)
        .map_err(catalog_status)?
        .ok_or_else(|| Status::not_found(format!("no domain {name}")))
}

fn class_named(
    catalog: &dyn qsm_catalog::Catalog,
    domain: &str,
    name: &str,
) -> Result<qsm_catalog::MgmtClass, Status> {
    let d = domain_named(catalog, domain)?;
    catalog
        .mgmt_classes(d.id)
        .map_err(catalog_status)?
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| Status::not_found(format!("no management class {name} in domain {domain}")))
}

/// A catalog refusal, with the name of what was refused.
fn named(e: qsm_catalog::CatalogError, what: &str, name: &str) -> Status {
    match e {
        qsm_catalog::CatalogError::Refused(why) => {
            Status::failed_precondition(format!("{what} {name}: {why}"))
        }
        qsm_catalog::CatalogError::Exists { .. } => {
            Status::already_exists(format!("{what} {name} exists"))
        }
        other => catalog_status(other),
    }
}

/// The copy groups a request asks for, over `base` for what it leaves unset.
fn copy_groups(
    r: &v1::MgmtClassRequest,
    base: (qsm_catalog::BackupCopyGroup, qsm_catalog::ArchiveCopyGroup),
) -> Result<(qsm_catalog::BackupCopyGroup, qsm_catalog::ArchiveCopyGroup), Status> {
    let (mut b, mut a) = base;
    b.versions_exist = r.versions_exist.unwrap_or(b.versions_exist);
    b.versions_deleted = r.versions_deleted.unwrap_or(b.versions_deleted);
    b.retain_extra_days = r.retain_extra_days.unwrap_or(b.retain_extra_days);
    b.retain_only_days = r.retain_only_days.unwrap_or(b.retain_only_days);
    a.retain_version_days = r.retain_version_days.unwrap_or(a.retain_version_days);
    if b.versions_exist == 0 {
        return Err(Status::invalid_argument(
            "versions-exist must be at least 1: the active version is one of them",
        ));
    }
    Ok((b, a))
}

fn describe(b: qsm_catalog::BackupCopyGroup, a: qsm_catalog::ArchiveCopyGroup) -> String {
    let n = |v: u32| {
        if v == qsm_catalog::expire::NO_LIMIT { "nolimit".to_owned() } else { v.to_string() }
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

impl AdminService {
    /// A policy change: `change` runs off the async threads and returns what the activity
    /// log should say.
    async fn policy(
        &self,
        change: impl FnOnce(&State) -> Result<String, Status> + Send + 'static,
    ) -> Result<Response<v1::Empty>, Status> {
        let state = Arc::clone(&self.state);
        blocking(move || {
            let said = change(&state)?;
            state.log(Severity::Info, &said, None, None);
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    /// A registration: authorized, name and password checked, the password hashed off the
    /// async threads (argon2id takes tens of milliseconds by design), then `record`.
    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
        what: &'static str,
        need: Need,
        record: Record,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, need)?;
        let r = request.into_inner();
        check_name(&r.name)?;
        check_password(&r.password)?;
        let privileges = privileges(&r.privileges)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let hash = auth::hash_password(&r.password).map_err(Status::internal)?;
            record(state.store.catalog().as_ref(), &r.name, &hash, &privileges)
                .map_err(catalog_status)?;
            let with = if privileges.is_empty() {
                String::new()
            } else {
                format!(" with {} privilege", Privilege::join(&privileges))
            };
            state.log(
                Severity::Info,
                &format!("{actor} registered {what} {}{with}", r.name),
                None,
                None,
            );
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn register_node(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        if !request.get_ref().privileges.is_empty() {
            return Err(Status::invalid_argument(
                "a node has no privilege classes: register an administrator",
            ));
        }
        self.register(request, "node", POLICY, |catalog, name, hash, _| {
            catalog.register_node(name, hash, qsm_catalog::standard_domain(catalog)?).map(|_| ())
        })
        .await
    }

    async fn register_admin(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        self.register(request, "administrator", SYSTEM, |catalog, name, hash, privileges| {
            catalog.register_admin(name, hash, privileges)
        })
        .await
    }

    async fn set_node_locked(
        &self,
        request: Request<v1::LockRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&r.name)
                .map_err(catalog_status)?
                .ok_or_else(|| Status::not_found(format!("no node {}", r.name)))?;
            catalog.set_node_locked(node.id, r.locked).map_err(catalog_status)?;
            if r.locked {
                // Here at once, on the servers sharing the catalog within a heartbeat.
                state.cancel_sessions(SessionsOf::Node(node.id), "cancelled: node locked")?;
            }
            let how = if r.locked { "locked" } else { "unlocked" };
            state.log(
                Severity::Info,
                &format!("{actor} {how} node {}", r.name),
                Some(node.id),
                None,
            );
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn query_nodes(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::NodeList>, Status> {
        self.authorize(&request, ANY)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let nodes = state.store.catalog().nodes().map_err(catalog_status)?;
            Ok(Response::new(v1::NodeList {
                nodes: nodes
                    .into_iter()
                    .map(|n| v1::NodeInfo {
                        name: n.name,
                        locked: n.locked,
                        registered: n.registered,
                    })
                    .collect(),
            }))
        })
        .await
    }

    async fn query_sessions(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::SessionList>, Status> {
        self.authorize(&request, ANY)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
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
            let elsewhere = state.store.catalog().open_sessions().map_err(catalog_status)?;
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
            Ok(Response::new(v1::SessionList { sessions }))
        })
        .await
    }

    async fn cancel_session(
        &self,
        request: Request<v1::CancelRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, OPERATOR)?;
        let id = request.get_ref().session;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let how = format!("cancelled by {actor}");
            if state.cancel_sessions(SessionsOf::Id(id), &how)? == 0 {
                return Err(Status::not_found(format!("no session {id}")));
            }
            state.log(Severity::Info, &format!("{actor} cancelled session {id}"), None, None);
            Ok(())
        })
        .await?;
        Ok(Response::new(v1::Empty {}))
    }

    async fn expire_inventory(
        &self,
        request: Request<v1::ExpireRequest>,
    ) -> Result<Response<v1::ExpireReply>, Status> {
        use qsm_catalog::expire::{ExpireOptions, ExpireProgress, expire_inventory};
        let actor = self.authorize(&request, SYSTEM)?;
        let r = request.into_inner();
        let resource = match r.resource {
            0 => 4,
            n if n > MAX_EXPIRE_WORKERS => {
                return Err(Status::invalid_argument(format!(
                    "--resource: at most {MAX_EXPIRE_WORKERS} workers"
                )));
            }
            n => n as usize,
        };
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let mut nodes = None;
            if !r.nodes.is_empty() {
                let mut ids = Vec::new();
                for name in &r.nodes {
                    let node = catalog
                        .node(name)
                        .map_err(catalog_status)?
                        .ok_or_else(|| Status::not_found(format!("no node {name}")))?;
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
                    duration: (r.duration_minutes > 0).then(|| {
                        std::time::Duration::from_secs(u64::from(r.duration_minutes) * 60)
                    }),
                    ..ExpireOptions::new(qsm_catalog::now(), cancel, &progress)
                };
                let report = expire_inventory(catalog.as_ref(), &options).map_err(catalog_status)?;
                Ok(Finished {
                    detail: format!(
                        "examined {}, deleted {} backup versions and {} archives in {} filespaces",
                        report.examined, report.backups, report.archives, report.filespaces
                    ),
                    stopped: report.stopped.clone(),
                    value: report,
                })
            })?;
            Ok(Response::new(v1::ExpireReply {
                process: ran.process as u64,
                examined: ran.value.examined,
                backups: ran.value.backups,
                archives: ran.value.archives,
                filespaces: ran.value.filespaces,
                stopped: ran.stopped.unwrap_or_default(),
                seconds: ran.seconds,
            }))
        })
        .await
    }

    async fn query_processes(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::ProcessList>, Status> {
        self.authorize(&request, ANY)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
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
            let elsewhere = state.store.catalog().running_processes().map_err(catalog_status)?;
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
            Ok(Response::new(v1::ProcessList { processes }))
        })
        .await
    }

    async fn cancel_process(
        &self,
        request: Request<v1::ProcessRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, OPERATOR)?;
        let id = request.get_ref().process;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let Ok(process) = i64::try_from(id) else {
                return Err(Status::not_found(format!("no process {id} is running")));
            };
            if !state.cancel_process(qsm_catalog::ProcessId(process))? {
                return Err(Status::not_found(format!("no process {id} is running")));
            }
            state.log(Severity::Info, &format!("{actor} cancelled process {id}"), None, None);
            Ok(())
        })
        .await?;
        Ok(Response::new(v1::Empty {}))
    }

    async fn reclaim_stgpool(
        &self,
        request: Request<v1::ReclaimRequest>,
    ) -> Result<Response<v1::ReclaimReply>, Status> {
        let actor = self.authorize(&request, STORAGE)?;
        let pct = match request.into_inner().threshold_percent {
            0 => 60,
            p if p > 100 => {
                return Err(Status::invalid_argument("--threshold is a percentage, 1 to 100"));
            }
            p => p,
        };
        let state = Arc::clone(&self.state);
        blocking(move || {
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
                        .map_err(store_status)?;
                    // Orphans are leftovers of crashes or refused reclamations. On a shared
                    // catalog, containers a live server leases or wrote within a lease term
                    // are kept (Store::remove_orphans): a crashed server's become orphans once
                    // its lease lapsed.
                    let orphans = state.store.remove_orphans().map_err(store_status)?;
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
            Ok(Response::new(v1::ReclaimReply {
                process: ran.process as u64,
                containers: ran.value.0,
                orphans: ran.value.1,
                orphans_skipped: ran.value.2,
                stopped: ran.stopped.unwrap_or_default(),
                seconds: ran.seconds,
            }))
        })
        .await
    }

    async fn define_domain(
        &self,
        request: Request<v1::DomainRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        check_name(&r.name)?;
        if r.description.len() > 4096 {
            return Err(Status::invalid_argument("a description has at most 4096 bytes"));
        }
        self.policy(move |state| {
            state.store.catalog().define_domain(&r.name, &r.description).map_err(catalog_status)?;
            Ok(format!("{actor} defined domain {}", r.name))
        })
        .await
    }

    async fn delete_domain(
        &self,
        request: Request<v1::DomainRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        self.policy(move |state| {
            let catalog = state.store.catalog();
            let d = domain_named(catalog.as_ref(), &r.name)?;
            catalog.delete_domain(d.id).map_err(|e| named(e, "domain", &r.name))?;
            Ok(format!("{actor} deleted domain {}", r.name))
        })
        .await
    }

    async fn define_mgmt_class(
        &self,
        request: Request<v1::MgmtClassRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        check_name(&r.name)?;
        self.policy(move |state| {
            let catalog = state.store.catalog();
            let d = domain_named(catalog.as_ref(), &r.domain)?;
            let (backup, archive) = copy_groups(&r, Default::default())?;
            catalog
                .define_mgmt_class(d.id, &r.name, backup, archive)
                .map_err(|e| named(e, "management class", &r.name))?;
            Ok(format!(
                "{actor} defined management class {}/{}: {}",
                r.domain,
                r.name,
                describe(backup, archive)
            ))
        })
        .await
    }

    async fn update_mgmt_class(
        &self,
        request: Request<v1::MgmtClassRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        self.policy(move |state| {
            let catalog = state.store.catalog();
            let class = class_named(catalog.as_ref(), &r.domain, &r.name)?;
            let (backup, archive) = copy_groups(&r, (class.backup, class.archive))?;
            catalog.update_mgmt_class(class.id, backup, archive).map_err(catalog_status)?;
            Ok(format!(
                "{actor} updated management class {}/{}: {}",
                r.domain,
                r.name,
                describe(backup, archive)
            ))
        })
        .await
    }

    async fn delete_mgmt_class(
        &self,
        request: Request<v1::MgmtClassRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        self.policy(move |state| {
            let catalog = state.store.catalog();
            let class = class_named(catalog.as_ref(), &r.domain, &r.name)?;
            catalog
                .delete_mgmt_class(class.id)
                .map_err(|e| named(e, "management class", &format!("{}/{}", r.domain, r.name)))?;
            Ok(format!("{actor} deleted management class {}/{}", r.domain, r.name))
        })
        .await
    }

    async fn query_policy(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::PolicyList>, Status> {
        self.authorize(&request, ANY)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let nodes = catalog.nodes().map_err(catalog_status)?;
            let mut domains = Vec::new();
            for d in catalog.domains().map_err(catalog_status)? {
                let classes = catalog
                    .mgmt_classes(d.id)
                    .map_err(catalog_status)?
                    .into_iter()
                    .map(|c| v1::MgmtClassInfo {
                        name: c.name,
                        versions_exist: c.backup.versions_exist,
                        versions_deleted: c.backup.versions_deleted,
                        retain_extra_days: c.backup.retain_extra_days,
                        retain_only_days: c.backup.retain_only_days,
                        retain_version_days: c.archive.retain_version_days,
                    })
                    .collect();
                domains.push(v1::DomainInfo {
                    nodes: nodes
                        .iter()
                        .filter(|n| n.domain == d.id)
                        .map(|n| n.name.clone())
                        .collect(),
                    name: d.name,
                    description: d.description,
                    classes,
                });
            }
            Ok(Response::new(v1::PolicyList { domains }))
        })
        .await
    }

    async fn update_node(
        &self,
        request: Request<v1::UpdateNodeRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        if r.domain.is_empty() && r.password.is_none() {
            return Err(Status::invalid_argument("nothing to change: give a domain or a password"));
        }
        if let Some(p) = &r.password {
            check_password(p)?;
        }
        self.policy(move |state| {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&r.name)
                .map_err(catalog_status)?
                .ok_or_else(|| Status::not_found(format!("no node {}", r.name)))?;
            let mut done = Vec::new();
            if let Some(password) = &r.password {
                let hash = auth::hash_password(password).map_err(Status::internal)?;
                catalog.set_password(false, &r.name, &hash).map_err(catalog_status)?;
                done.push("changed the password of".to_owned());
            }
            if !r.domain.is_empty() {
                let d = domain_named(catalog.as_ref(), &r.domain)?;
                catalog.set_node_domain(node.id, d.id).map_err(catalog_status)?;
                done.push(format!("moved to domain {}", r.domain));
            }
            Ok(format!("{actor} {} node {}", done.join(" and "), r.name))
        })
        .await
    }

    async fn update_admin(
        &self,
        request: Request<v1::PasswordRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        // Every administrator may change its own password; another's needs system privilege.
        let me = self.authorize(&request, ANY)?;
        let own = me == format!("administrator {}", request.get_ref().name);
        let actor = if own { me } else { self.authorize(&request, SYSTEM)? };
        let r = request.into_inner();
        check_password(&r.password)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let hash = auth::hash_password(&r.password).map_err(Status::internal)?;
            state.store.catalog().set_password(true, &r.name, &hash).map_err(catalog_status)?;
            state.log(
                Severity::Info,
                &format!("{actor} changed the password of administrator {}", r.name),
                None,
                None,
            );
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn set_admin_locked(
        &self,
        request: Request<v1::LockRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, SYSTEM)?;
        let r = request.into_inner();
        if r.locked && actor == format!("administrator {}", r.name) {
            return Err(Status::failed_precondition("an administrator cannot lock itself out"));
        }
        let state = Arc::clone(&self.state);
        blocking(move || {
            state.store.catalog().set_admin_locked(&r.name, r.locked).map_err(catalog_status)?;
            if r.locked {
                state.cancel_sessions(SessionsOf::Admin(&r.name), "cancelled: locked")?;
            }
            let how = if r.locked { "locked" } else { "unlocked" };
            state.log(
                Severity::Info,
                &format!("{actor} {how} administrator {}", r.name),
                None,
                None,
            );
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn remove_admin(
        &self,
        request: Request<v1::NodeName>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, SYSTEM)?;
        let r = request.into_inner();
        if actor == format!("administrator {}", r.name) {
            return Err(Status::failed_precondition("an administrator cannot remove itself"));
        }
        let state = Arc::clone(&self.state);
        blocking(move || {
            state.store.catalog().remove_admin(&r.name).map_err(catalog_status)?;
            state.cancel_sessions(SessionsOf::Admin(&r.name), "cancelled: removed")?;
            state.log(
                Severity::Info,
                &format!("{actor} removed administrator {}", r.name),
                None,
                None,
            );
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn query_actlog(
        &self,
        request: Request<v1::ActlogRequest>,
    ) -> Result<Response<v1::ActlogReply>, Status> {
        self.authorize(&request, ANY)?;
        let r = request.into_inner();
        let limit = if r.limit == 0 { 1000 } else { r.limit.min(MAX_ACTLOG_ENTRIES) } as usize;
        let search = r.search.to_lowercase();
        let state = Arc::clone(&self.state);
        blocking(move || {
            // Pages through the log from `since`, so a search scans all of it without holding
            // it in memory; only the newest `limit` matches are kept.
            let catalog = state.store.catalog();
            let mut kept = std::collections::VecDeque::new();
            let (mut since, mut last_id, mut truncated) = (r.since, 0i64, false);
            loop {
                let page = catalog.activity(since, 10_000).map_err(catalog_status)?;
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
            Ok(Response::new(v1::ActlogReply { entries, truncated }))
        })
        .await
    }

    async fn set_dedup_scope(
        &self,
        request: Request<v1::DedupScopeRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, SYSTEM)?;
        let r = request.into_inner();
        if r.scope.is_empty() || r.scope.len() > 256 {
            return Err(Status::invalid_argument("a dedup scope name has 1 to 256 bytes"));
        }
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&r.node)
                .map_err(catalog_status)?
                .ok_or_else(|| Status::not_found(format!("no node {}", r.node)))?;
            let secret = crate::node_core::new_secret().map_err(qsm_proto::status::to_status)?;
            catalog.set_dedup_scope(node.id, &r.scope, secret).map_err(catalog_status)?;
            state.log(
                Severity::Info,
                &format!("{actor} put node {} in dedup scope {}", r.node, r.scope),
                Some(node.id),
                None,
            );
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn grant_authority(
        &self,
        request: Request<v1::GrantRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, SYSTEM)?;
        let r = request.into_inner();
        let list = privileges(&r.privileges)?;
        self.policy(move |state| {
            state
                .store
                .catalog()
                .set_admin_privileges(&r.name, &list)
                .map_err(|e| named(e, "administrator", &r.name))?;
            let what = if list.is_empty() { "no".to_owned() } else { Privilege::join(&list) };
            Ok(format!("{actor} gave administrator {} {what} privilege", r.name))
        })
        .await
    }

    async fn backup_db(
        &self,
        request: Request<v1::BackupDbRequest>,
    ) -> Result<Response<v1::BackupDbReply>, Status> {
        // A copy written anywhere the server can write, holding every password hash, dedup
        // secret and wrapped key: system only. The default directory: storage or operator.
        let need = if request.get_ref().to.is_empty() { DB_BACKUP } else { SYSTEM };
        let actor = self.authorize(&request, need)?;
        let to = request.into_inner().to;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let to = (!to.is_empty()).then(|| std::path::PathBuf::from(&to));
            let what = match &to {
                Some(p) => format!("to {}", p.display()),
                None => format!(
                    "to {}",
                    state.config.data_dir.join(crate::dbcopy::BACKUP_DIR).display()
                ),
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
                    .map_err(Status::internal)?;
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
            Ok(Response::new(v1::BackupDbReply {
                process: ran.process as u64,
                path: e.path.display().to_string(),
                bytes: e.bytes,
                catalog_bytes: e.catalog_bytes,
                schema: e.schema,
                seconds: ran.seconds,
            }))
        })
        .await
    }

    async fn query_volhist(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::VolhistReply>, Status> {
        self.authorize(&request, ANY)?;
        let dir = self.state.config.data_dir.clone();
        blocking(move || {
            let entries = crate::dbcopy::volhist(&dir)
                .map_err(Status::internal)?
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
            Ok(Response::new(v1::VolhistReply { entries }))
        })
        .await
    }

    async fn delete_filespace(
        &self,
        request: Request<v1::DeleteFilespaceRequest>,
    ) -> Result<Response<v1::DeleteFilespaceReply>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let r = request.into_inner();
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&r.node)
                .map_err(catalog_status)?
                .ok_or_else(|| Status::not_found(format!("no node {}", r.node)))?;
            let fs = catalog
                .filespaces(node.id)
                .map_err(catalog_status)?
                .into_iter()
                .find(|f| f.name == r.filespace)
                .ok_or_else(|| {
                    Status::not_found(format!("node {} has no filespace {}", r.node, r.filespace))
                })?;
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
                    let n =
                        catalog.delete_filespace(fs.id, 2_000, cancel).map_err(catalog_status)?;
                    Ok(Finished {
                        detail: format!("{n} versions deleted"),
                        stopped: cancel.load(Ordering::Relaxed).then(|| "cancelled".to_owned()),
                        value: n,
                    })
                },
            )?;
            Ok(Response::new(v1::DeleteFilespaceReply {
                process: ran.process as u64,
                versions: ran.value,
                stopped: ran.stopped.unwrap_or_default(),
                seconds: ran.seconds,
            }))
        })
        .await
    }

    async fn delete_node(
        &self,
        request: Request<v1::NodeName>,
    ) -> Result<Response<v1::Empty>, Status> {
        let actor = self.authorize(&request, POLICY)?;
        let name = request.into_inner().name;
        self.policy(move |state| {
            let catalog = state.store.catalog();
            let node = catalog
                .node(&name)
                .map_err(catalog_status)?
                .ok_or_else(|| Status::not_found(format!("no node {name}")))?;
            state.cancel_sessions(SessionsOf::Node(node.id), "cancelled: node deleted")?;
            catalog.delete_node(node.id).map_err(|e| named(e, "node", &name))?;
            Ok(format!("{actor} deleted node {name}"))
        })
        .await
    }

    async fn query_stgpool(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::StgpoolList>, Status> {
        self.authorize(&request, ANY)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let mut pools = Vec::new();
            for p in catalog.pools().map_err(catalog_status)? {
                let u = catalog.pool_usage(p.id).map_err(catalog_status)?;
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
            Ok(Response::new(v1::StgpoolList { pools }))
        })
        .await
    }

    async fn audit_stgpool(
        &self,
        request: Request<v1::AuditRequest>,
    ) -> Result<Response<v1::AuditReply>, Status> {
        let actor = self.authorize(&request, STORAGE)?;
        let r = request.into_inner();
        let state = Arc::clone(&self.state);
        blocking(move || {
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
                let report = state.store.audit(&options).map_err(store_status)?;
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
            Ok(Response::new(v1::AuditReply {
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
            }))
        })
        .await
    }
}

/// "NODE FILESPACE PATH" of each version, for reports.
fn object_names(
    catalog: &dyn qsm_catalog::Catalog,
    objects: &[(qsm_catalog::ObjectId, qsm_catalog::FilespaceId, Vec<u8>)],
) -> Result<Vec<String>, Status> {
    let mut names = std::collections::HashMap::new();
    if !objects.is_empty() {
        for node in catalog.nodes().map_err(catalog_status)? {
            for fs in catalog.filespaces(node.id).map_err(catalog_status)? {
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
