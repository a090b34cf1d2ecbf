//! Every administrative operation as one Rust trait, [`AdminApi`]: the server core implements
//! it, the gRPC `Admin` service carries it, and a remote connection implements it again over
//! that service, so `qsm admin` runs the same code against the embedded server and a network
//! one. The one list of operations is [`admin_operations!`](crate::admin_operations).

use qsm_types::ServerError;

use crate::reports::{
    ActlogReport, AssociationRow, AuditReport, BackupDbReport, BackupRunRow, CloptsetRow,
    DeleteFilespaceReport, DomainRow, EventRow, ExpireReport, FilespaceRow, HoldRow, NodeRow,
    ProcessRow, ReclaimReport, RepairReport, ReplicateReport, ScheduleRow, ServerRow, SessionRow,
    StgpoolRow, VolhistRow,
};
use crate::v1;

/// Calls the macro `$m` with every admin operation, one `name(Request) -> Reply;` each (the
/// message types of [`crate::v1`]), so the trait, the gRPC service and the remote client are
/// all made from this one list.
#[macro_export]
macro_rules! admin_operations {
    ($m:ident) => {
        $m! {
            register_node(RegisterRequest) -> Empty;
            register_admin(RegisterRequest) -> Empty;
            set_node_locked(LockRequest) -> Empty;
            query_nodes(Empty) -> NodeList;
            query_sessions(Empty) -> SessionList;
            cancel_session(CancelRequest) -> Empty;
            expire_inventory(ExpireRequest) -> ExpireReply;
            query_processes(Empty) -> ProcessList;
            cancel_process(ProcessRequest) -> Empty;
            reclaim_stgpool(ReclaimRequest) -> ReclaimReply;
            define_domain(DomainRequest) -> Empty;
            delete_domain(DomainRequest) -> Empty;
            define_mgmt_class(MgmtClassRequest) -> Empty;
            update_mgmt_class(MgmtClassRequest) -> Empty;
            delete_mgmt_class(MgmtClassRequest) -> Empty;
            query_policy(Empty) -> PolicyList;
            update_node(UpdateNodeRequest) -> Empty;
            update_admin(PasswordRequest) -> Empty;
            set_admin_locked(LockRequest) -> Empty;
            remove_admin(NodeName) -> Empty;
            query_actlog(ActlogRequest) -> ActlogReply;
            set_dedup_scope(DedupScopeRequest) -> Empty;
            grant_authority(GrantRequest) -> Empty;
            backup_db(BackupDbRequest) -> BackupDbReply;
            query_volhist(Empty) -> VolhistReply;
            delete_filespace(DeleteFilespaceRequest) -> DeleteFilespaceReply;
            delete_node(NodeName) -> Empty;
            query_stgpool(Empty) -> StgpoolList;
            audit_stgpool(AuditRequest) -> AuditReply;
            query_filespaces(NodeName) -> NodeFilespaceList;
            query_backup_runs(BackupRunsRequest) -> BackupRunList;
            define_schedule(ScheduleRequest) -> Empty;
            update_schedule(ScheduleRequest) -> Empty;
            delete_schedule(ScheduleRequest) -> Empty;
            query_schedules(Empty) -> ScheduleList;
            query_events(EventRequest) -> EventList;
            define_association(AssociationRequest) -> Empty;
            delete_association(AssociationRequest) -> Empty;
            query_associations(Empty) -> AssociationList;
            define_cloptset(CloptsetRequest) -> Empty;
            delete_cloptset(CloptsetRequest) -> Empty;
            define_clientopt(ClientoptRequest) -> Empty;
            delete_clientopt(ClientoptRequest) -> Empty;
            query_cloptsets(Empty) -> CloptsetList;
            hold_node(HoldRequest) -> Empty;
            release_node(HoldRequest) -> Empty;
            query_holds(Empty) -> HoldList;
            define_server(ServerRequest) -> Empty;
            delete_server(ServerRequest) -> Empty;
            query_servers(Empty) -> ServerList;
            replicate_node(ReplicateRequest) -> ReplicateReply;
            repair_stgpool(RepairRequest) -> RepairReply;
        }
    };
}

macro_rules! define_trait {
    ($($name:ident($req:ident) -> $rep:ident;)*) => {
        /// What an administrator may ask of a server (`qsm admin`, docs/ADMIN.md), each
        /// operation checking the caller's privilege classes itself.
        pub trait AdminApi {
            $(
                #[doc = concat!("The `", stringify!($name), "` operation (docs/PROTOCOL.md).")]
                fn $name(&self, r: v1::$req) -> Result<v1::$rep, ServerError>;
            )*
        }
    };
}

admin_operations!(define_trait);

/// The administrative operations with typed arguments and [`reports`](crate::reports): what
/// a front end (`qsm admin`, a console) calls, so that none builds protocol requests itself.
#[derive(Clone, Copy)]
pub struct Admin<'a>(pub &'a dyn AdminApi);

impl std::fmt::Debug for Admin<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admin")
    }
}

type Result<T, E = ServerError> = std::result::Result<T, E>;

/// A management class's copy groups; `None` leaves a value as it is (update) or takes the
/// default (define).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyGroups {
    pub versions_exist: Option<u32>,
    pub versions_deleted: Option<u32>,
    pub retain_extra_days: Option<u32>,
    pub retain_only_days: Option<u32>,
    pub retain_archive_days: Option<u32>,
    pub retain_min_days: Option<u32>,
}

impl CopyGroups {
    fn request(&self, domain: &str, name: &str) -> v1::MgmtClassRequest {
        v1::MgmtClassRequest {
            domain: domain.to_owned(),
            name: name.to_owned(),
            versions_exist: self.versions_exist,
            versions_deleted: self.versions_deleted,
            retain_extra_days: self.retain_extra_days,
            retain_only_days: self.retain_only_days,
            retain_version_days: self.retain_archive_days,
            retain_min_days: self.retain_min_days,
        }
    }
}

impl Admin<'_> {
    pub fn register_node(&self, name: &str, password: String) -> Result<()> {
        let privileges = Vec::new();
        self.0.register_node(v1::RegisterRequest {
            name: name.to_owned(),
            password,
            privileges,
        })?;
        Ok(())
    }

    pub fn register_admin(
        &self,
        name: &str,
        password: String,
        privileges: &[String],
    ) -> Result<()> {
        let privileges = privileges.to_vec();
        self.0.register_admin(v1::RegisterRequest {
            name: name.to_owned(),
            password,
            privileges,
        })?;
        Ok(())
    }

    pub fn set_node_locked(&self, name: &str, locked: bool) -> Result<()> {
        self.0.set_node_locked(v1::LockRequest { name: name.to_owned(), locked })?;
        Ok(())
    }

    pub fn set_admin_locked(&self, name: &str, locked: bool) -> Result<()> {
        self.0.set_admin_locked(v1::LockRequest { name: name.to_owned(), locked })?;
        Ok(())
    }

    pub fn remove_admin(&self, name: &str) -> Result<()> {
        self.0.remove_admin(v1::NodeName { name: name.to_owned() })?;
        Ok(())
    }

    /// Defines schedule `name` of `domain` (every field of `r` but the names is its own).
    pub fn define_schedule(&self, r: v1::ScheduleRequest) -> Result<()> {
        self.0.define_schedule(r)?;
        Ok(())
    }

    /// Changes what `r` sets of a schedule.
    pub fn update_schedule(&self, r: v1::ScheduleRequest) -> Result<()> {
        self.0.update_schedule(r)?;
        Ok(())
    }

    pub fn delete_schedule(&self, domain: &str, name: &str) -> Result<()> {
        let r = v1::ScheduleRequest {
            domain: domain.to_owned(),
            name: name.to_owned(),
            ..v1::ScheduleRequest::default()
        };
        self.0.delete_schedule(r)?;
        Ok(())
    }

    pub fn schedules(&self) -> Result<Vec<ScheduleRow>> {
        let list = self.0.query_schedules(v1::Empty {})?.schedules;
        Ok(list.into_iter().map(ScheduleRow::from).collect())
    }

    /// Has schedule `domain`/`schedule` run for `nodes` (of its domain).
    pub fn associate(&self, domain: &str, schedule: &str, nodes: &[String]) -> Result<()> {
        self.0.define_association(association(domain, schedule, nodes))?;
        Ok(())
    }

    /// Stops schedule `domain`/`schedule` running for `nodes`.
    pub fn dissociate(&self, domain: &str, schedule: &str, nodes: &[String]) -> Result<()> {
        self.0.delete_association(association(domain, schedule, nodes))?;
        Ok(())
    }

    pub fn associations(&self) -> Result<Vec<AssociationRow>> {
        let list = self.0.query_associations(v1::Empty {})?.associations;
        Ok(list.into_iter().map(AssociationRow::from).collect())
    }

    pub fn define_cloptset(&self, name: &str, description: &str) -> Result<()> {
        let r = v1::CloptsetRequest { name: name.to_owned(), description: description.to_owned() };
        self.0.define_cloptset(r)?;
        Ok(())
    }

    pub fn delete_cloptset(&self, name: &str) -> Result<()> {
        self.0
            .delete_cloptset(v1::CloptsetRequest { name: name.to_owned(), ..Default::default() })?;
        Ok(())
    }

    /// Adds option `name` = `value` to option set `set` (replacing a single-valued option's
    /// value); `force`d, it overrides the node's own.
    pub fn define_clientopt(&self, set: &str, name: &str, value: &str, force: bool) -> Result<()> {
        let option = v1::ClientOption { name: name.to_owned(), value: value.to_owned(), force };
        self.0
            .define_clientopt(v1::ClientoptRequest { set: set.to_owned(), option: Some(option) })?;
        Ok(())
    }

    /// Deletes every value of option `name` from option set `set`.
    pub fn delete_clientopt(&self, set: &str, name: &str) -> Result<()> {
        let option = v1::ClientOption { name: name.to_owned(), ..Default::default() };
        self.0
            .delete_clientopt(v1::ClientoptRequest { set: set.to_owned(), option: Some(option) })?;
        Ok(())
    }

    /// Holds `node`'s versions (`filespace` `None`: all of them) until released.
    pub fn hold(&self, node: &str, filespace: Option<&str>, reason: &str) -> Result<()> {
        let r = v1::HoldRequest {
            node: node.to_owned(),
            filespace: filespace.unwrap_or_default().to_owned(),
            reason: reason.to_owned(),
            suspect: false,
        };
        self.0.hold_node(r)?;
        Ok(())
    }

    /// Releases an administrator's hold, or with `suspect` acknowledges a suspect backup.
    pub fn release(&self, node: &str, filespace: Option<&str>, suspect: bool) -> Result<()> {
        let r = v1::HoldRequest {
            node: node.to_owned(),
            filespace: filespace.unwrap_or_default().to_owned(),
            reason: String::new(),
            suspect,
        };
        self.0.release_node(r)?;
        Ok(())
    }

    pub fn holds(&self) -> Result<Vec<HoldRow>> {
        Ok(self.0.query_holds(v1::Empty {})?.holds.into_iter().map(HoldRow::from).collect())
    }

    pub fn cloptsets(&self) -> Result<Vec<CloptsetRow>> {
        let list = self.0.query_cloptsets(v1::Empty {})?.sets;
        Ok(list.into_iter().map(CloptsetRow::from).collect())
    }

    /// The events of windows from `since` (default: the last day), of `node` or all.
    pub fn events(&self, node: Option<&str>, since: Option<i64>) -> Result<Vec<EventRow>> {
        let r = v1::EventRequest {
            node: node.unwrap_or_default().to_owned(),
            since: since.unwrap_or(0),
        };
        Ok(self.0.query_events(r)?.events.into_iter().map(EventRow::from).collect())
    }

    /// The filespaces of `node`, or of every node, with their last backups.
    pub fn filespaces(&self, node: Option<&str>) -> Result<Vec<FilespaceRow>> {
        let name = node.unwrap_or_default().to_owned();
        let list = self.0.query_filespaces(v1::NodeName { name })?.filespaces;
        list.into_iter().map(FilespaceRow::from_wire).collect()
    }

    /// `node`'s backup history (one filespace's, or all of them), runs that ended at or
    /// after `since`, oldest first.
    pub fn backup_runs(
        &self,
        node: &str,
        filespace: Option<&str>,
        since: i64,
    ) -> Result<Vec<BackupRunRow>> {
        let r = v1::BackupRunsRequest {
            node: node.to_owned(),
            filespace: filespace.unwrap_or_default().to_owned(),
            since,
        };
        self.0.query_backup_runs(r)?.runs.into_iter().map(BackupRunRow::from_wire).collect()
    }

    pub fn nodes(&self) -> Result<Vec<NodeRow>> {
        Ok(self.0.query_nodes(v1::Empty {})?.nodes.into_iter().map(NodeRow::from).collect())
    }

    pub fn sessions(&self) -> Result<Vec<SessionRow>> {
        let now = qsm_types::now();
        let list = self.0.query_sessions(v1::Empty {})?.sessions;
        Ok(list.into_iter().map(|s| SessionRow::new(s, now)).collect())
    }

    pub fn cancel_session(&self, session: u64) -> Result<()> {
        self.0.cancel_session(v1::CancelRequest { session })?;
        Ok(())
    }

    pub fn processes(&self) -> Result<Vec<ProcessRow>> {
        let list = self.0.query_processes(v1::Empty {})?.processes;
        Ok(list.into_iter().map(ProcessRow::from).collect())
    }

    pub fn cancel_process(&self, process: u64) -> Result<()> {
        self.0.cancel_process(v1::ProcessRequest { process })?;
        Ok(())
    }

    pub fn set_dedup_scope(&self, node: &str, scope: &str) -> Result<()> {
        let request = v1::DedupScopeRequest { node: node.to_owned(), scope: scope.to_owned() };
        self.0.set_dedup_scope(request)?;
        Ok(())
    }

    /// `resource` workers; only `nodes` if any; stopped after `duration_minutes` if given.
    pub fn expire_inventory(
        &self,
        resource: u32,
        nodes: Vec<String>,
        duration_minutes: Option<u32>,
    ) -> Result<ExpireReport> {
        let duration_minutes = duration_minutes.unwrap_or(0);
        let request = v1::ExpireRequest { resource, nodes, duration_minutes };
        Ok(self.0.expire_inventory(request)?.into())
    }

    pub fn reclaim_stgpool(&self, threshold_percent: u32) -> Result<ReclaimReport> {
        Ok(self.0.reclaim_stgpool(v1::ReclaimRequest { threshold_percent })?.into())
    }

    pub fn define_domain(&self, name: &str, description: &str) -> Result<()> {
        let request = v1::DomainRequest { name: name.to_owned(), description: description.into() };
        self.0.define_domain(request)?;
        Ok(())
    }

    pub fn delete_domain(&self, name: &str) -> Result<()> {
        self.0.delete_domain(v1::DomainRequest {
            name: name.to_owned(),
            description: String::new(),
        })?;
        Ok(())
    }

    pub fn define_mgmt_class(&self, domain: &str, name: &str, groups: &CopyGroups) -> Result<()> {
        self.0.define_mgmt_class(groups.request(domain, name))?;
        Ok(())
    }

    pub fn update_mgmt_class(&self, domain: &str, name: &str, groups: &CopyGroups) -> Result<()> {
        self.0.update_mgmt_class(groups.request(domain, name))?;
        Ok(())
    }

    pub fn delete_mgmt_class(&self, domain: &str, name: &str) -> Result<()> {
        self.0.delete_mgmt_class(CopyGroups::default().request(domain, name))?;
        Ok(())
    }

    pub fn policy(&self) -> Result<Vec<DomainRow>> {
        Ok(self.0.query_policy(v1::Empty {})?.domains.into_iter().map(DomainRow::from).collect())
    }

    /// Moves the node to `domain` and/or sets its password.
    /// Changes what is given of node `name`: its domain, its password, its client option set
    /// (`Some("")`: none).
    pub fn update_node(
        &self,
        name: &str,
        domain: Option<&str>,
        password: Option<String>,
        cloptset: Option<&str>,
    ) -> Result<()> {
        let domain = domain.unwrap_or_default().to_owned();
        let cloptset = cloptset.map(str::to_owned);
        self.0.update_node(v1::UpdateNodeRequest {
            name: name.to_owned(),
            domain,
            password,
            cloptset,
        })?;
        Ok(())
    }

    pub fn update_admin(&self, name: &str, password: String) -> Result<()> {
        self.0.update_admin(v1::PasswordRequest { name: name.to_owned(), password })?;
        Ok(())
    }

    /// The newest entries since `since`, containing `search` if given, at most `limit`.
    pub fn actlog(&self, since: i64, search: Option<String>, limit: u32) -> Result<ActlogReport> {
        let search = search.unwrap_or_default();
        Ok(self.0.query_actlog(v1::ActlogRequest { since, search, limit })?.into())
    }

    pub fn grant_authority(&self, name: &str, privileges: &[String]) -> Result<()> {
        let privileges = privileges.to_vec();
        self.0.grant_authority(v1::GrantRequest { name: name.to_owned(), privileges })?;
        Ok(())
    }

    /// To `to` on the server (a file or a directory), or to its default place.
    pub fn backup_db(&self, to: Option<&str>) -> Result<BackupDbReport> {
        let to = to.unwrap_or_default().to_owned();
        Ok(self.0.backup_db(v1::BackupDbRequest { to })?.into())
    }

    pub fn volhist(&self) -> Result<Vec<VolhistRow>> {
        Ok(self.0.query_volhist(v1::Empty {})?.entries.into_iter().map(VolhistRow::from).collect())
    }

    pub fn delete_filespace(&self, node: &str, filespace: &str) -> Result<DeleteFilespaceReport> {
        let request =
            v1::DeleteFilespaceRequest { node: node.to_owned(), filespace: filespace.to_owned() };
        Ok(self.0.delete_filespace(request)?.into())
    }

    pub fn delete_node(&self, name: &str) -> Result<()> {
        self.0.delete_node(v1::NodeName { name: name.to_owned() })?;
        Ok(())
    }

    pub fn stgpools(&self) -> Result<Vec<StgpoolRow>> {
        Ok(self.0.query_stgpool(v1::Empty {})?.pools.into_iter().map(StgpoolRow::from).collect())
    }

    /// Every container, or only `containers`.
    /// Defines `name`, a server to replicate to at `address` (its TLS proved by `ca`, PEM),
    /// where this server logs in as replication account `account`.
    pub fn define_server(
        &self,
        name: &str,
        address: &str,
        ca: &str,
        account: &str,
        password: &str,
    ) -> Result<()> {
        self.0.define_server(v1::ServerRequest {
            name: name.to_owned(),
            address: address.to_owned(),
            ca: ca.to_owned(),
            account: account.to_owned(),
            password: password.to_owned(),
        })?;
        Ok(())
    }

    pub fn delete_server(&self, name: &str) -> Result<()> {
        self.0.delete_server(v1::ServerRequest { name: name.to_owned(), ..Default::default() })?;
        Ok(())
    }

    pub fn servers(&self) -> Result<Vec<ServerRow>> {
        Ok(self.0.query_servers(v1::Empty {})?.servers.into_iter().map(ServerRow::from).collect())
    }

    /// Replicates `nodes` to server `target` (`None`: the only one defined).
    pub fn replicate_node(
        &self,
        nodes: Vec<String>,
        target: Option<&str>,
    ) -> Result<ReplicateReport> {
        let target = target.unwrap_or_default().to_owned();
        Ok(self.0.replicate_node(v1::ReplicateRequest { nodes, target })?.into())
    }

    /// Repairs the chunks an audit marked damaged from the copies on server `source` (`None`:
    /// the only one defined).
    pub fn repair_stgpool(&self, source: Option<&str>) -> Result<RepairReport> {
        let source = source.unwrap_or_default().to_owned();
        Ok(self.0.repair_stgpool(v1::RepairRequest { source })?.into())
    }

    pub fn audit_stgpool(
        &self,
        mark_damaged: bool,
        release_unknown: bool,
        containers: Vec<u64>,
    ) -> Result<AuditReport> {
        let request = v1::AuditRequest { mark_damaged, release_unknown, containers };
        Ok(self.0.audit_stgpool(request)?.into())
    }
}

fn association(domain: &str, schedule: &str, nodes: &[String]) -> v1::AssociationRequest {
    v1::AssociationRequest {
        domain: domain.to_owned(),
        schedule: schedule.to_owned(),
        nodes: nodes.to_vec(),
    }
}
