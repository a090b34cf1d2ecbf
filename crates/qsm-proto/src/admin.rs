//! Every administrative operation as one Rust trait, [`AdminApi`]: the server core implements
//! it, the gRPC `Admin` service carries it, and a remote connection implements it again over
//! that service, so `qsm admin` runs the same code against the embedded server and a network
//! one. The one list of operations is [`admin_operations!`](crate::admin_operations).

use qsm_types::ServerError;

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
