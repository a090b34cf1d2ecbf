//! The `Admin` service: who is calling, then the server core ([`crate::admin_core`]). A caller
//! is an administrator when its session is an administrator's, or when it comes through the
//! local socket from the server's own user or root: whoever can read the server's files can
//! administer it anyway, and the first administrator needs a way in.

use std::sync::Arc;

use qsm_proto::AdminApi;
use qsm_proto::v1::{self, admin_server::Admin};
use qsm_types::ServerError;
use tonic::{Request, Response, Status};

use crate::admin_core::{Actor, AdminSession};
use crate::conns;
use crate::node::{conn, core_call, token};
use crate::state::State;

pub use crate::admin_core::{MAX_ACTLOG_ENTRIES, MAX_EXPIRE_WORKERS};

/// The service.
#[derive(Debug, Clone)]
pub struct AdminService {
    pub(crate) state: Arc<State>,
}

/// One operation of the core, as the service calls it.
type Operation<Q, P> = fn(&AdminSession<'_>, Q) -> Result<P, ServerError>;

impl AdminService {
    /// Who sends `request`: the local socket's peer running as the server's user or root, or
    /// the administrator whose session the request's token names.
    fn actor<T>(&self, request: &Request<T>) -> Result<Actor, Status> {
        let me = rustix::process::geteuid().as_raw();
        if let Some(uid) = conns::of(request).and_then(|c| c.uid).filter(|&u| u == me || u == 0) {
            return Ok(Actor::Owner(format!("the local socket's uid {uid}")));
        }
        match token(request).and_then(|t| self.state.sessions.get(t, conn(request))) {
            Some(s) if s.is_cancelled() => Err(Status::cancelled("this session was cancelled")),
            Some(s) if s.node.is_none() => Ok(Actor::Admin(s.account.clone())),
            Some(_) => Err(Status::permission_denied("a node cannot administer the server")),
            None => Err(Status::unauthenticated(
                "log in as an administrator, or use the server's local socket as its user",
            )),
        }
    }

    /// Runs `op` for the request's caller off the async threads (catalog and pool calls
    /// block; argon2id takes tens of milliseconds by design).
    async fn call<Q: Send + 'static, P: Send + 'static>(
        &self,
        request: Request<Q>,
        op: Operation<Q, P>,
    ) -> Result<Response<P>, Status> {
        let actor = self.actor(&request)?;
        let state = Arc::clone(&self.state);
        let r = request.into_inner();
        core_call(move || op(&AdminSession::new(&state, actor), r)).await.map(Response::new)
    }
}

macro_rules! grpc_service {
    ($($name:ident($req:ident) -> $rep:ident;)*) => {
        #[tonic::async_trait]
        impl Admin for AdminService {
            $(
                async fn $name(
                    &self,
                    request: Request<v1::$req>,
                ) -> Result<Response<v1::$rep>, Status> {
                    self.call(request, |s, r| s.$name(r)).await
                }
            )*
        }
    };
}

qsm_proto::admin_operations!(grpc_service);
