//! The `Replica` service: who is calling (an administrator's session), then the target's half
//! of replication ([`crate::replica_core`]).

use std::sync::Arc;

use qsm_proto::status::to_status;
use qsm_proto::v1::{self, replica_server::Replica};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Session;
use crate::node::{Receiver, chunk_id, core_call, live_session};
use crate::replica_core::ReplicaSession;
use crate::state::State;

/// Origins per Held message: 16 bytes each at most, so well under a megabyte.
const HELD_BATCH: usize = 50_000;

/// The service.
#[derive(Debug, Clone)]
pub struct ReplicaService {
    pub(crate) state: Arc<State>,
}

type Frames = tokio_stream::Iter<std::vec::IntoIter<Result<v1::FrameBatch, Status>>>;
type Held = tokio_stream::Iter<std::vec::IntoIter<Result<v1::HeldBatch, Status>>>;

impl ReplicaService {
    /// The administrator session of a request, not cancelled (its privilege is checked by
    /// [`ReplicaSession::new`]).
    fn session<T>(&self, request: &Request<T>) -> Result<(Arc<Session>, String), Status> {
        let session = live_session(&self.state, request)?;
        if session.node.is_some() {
            return Err(Status::permission_denied("a node cannot replicate into the server"));
        }
        let account = session.account.clone();
        Ok((session, account))
    }
}

#[tonic::async_trait]
impl Replica for ReplicaService {
    async fn put_node(
        &self,
        request: Request<v1::ReplicaNode>,
    ) -> Result<Response<v1::Empty>, Status> {
        let (_, account) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        let r = request.into_inner();
        core_call(move || ReplicaSession::new(&state, &account)?.put_node(r))
            .await
            .map(|()| Response::new(v1::Empty {}))
    }

    type HeldStream = Held;

    async fn held(
        &self,
        request: Request<v1::HeldRequest>,
    ) -> Result<Response<Self::HeldStream>, Status> {
        let (_, account) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        let r = request.into_inner();
        let held = core_call(move || ReplicaSession::new(&state, &account)?.held(&r)).await?;
        let batches: Vec<Result<v1::HeldBatch, Status>> = held
            .chunks(HELD_BATCH)
            .map(|part| {
                Ok(v1::HeldBatch {
                    origins: part.iter().map(|(o, _)| o.0 as u64).collect(),
                    active: part.iter().map(|(_, a)| *a).collect(),
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(batches)))
    }

    async fn have_chunks(
        &self,
        request: Request<v1::ReplicaHaveRequest>,
    ) -> Result<Response<v1::HaveChunksReply>, Status> {
        let (_, account) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        let r = request.into_inner();
        let ids = r.ids.iter().map(|id| chunk_id(id)).collect::<Result<Vec<_>, Status>>()?;
        core_call(move || {
            let have =
                ReplicaSession::new(&state, &account)?.have_chunks(&r.node, &ids, r.sealed)?;
            Ok(v1::HaveChunksReply { have })
        })
        .await
        .map(Response::new)
    }

    async fn send(
        &self,
        request: Request<Streaming<v1::ReplicaBatch>>,
    ) -> Result<Response<v1::ReplicaSendReply>, Status> {
        let (session, account) = self.session(&request)?;
        let mut inbound = request.into_inner();
        let state = Arc::clone(&self.state);
        let handle = tokio::runtime::Handle::current();
        let idle = std::time::Duration::from_secs(state.config.idle_timeout_minutes.max(1) * 60);
        let done = tokio::task::spawn_blocking(move || {
            let mut receiver =
                Receiver { handle: &handle, inbound: &mut inbound, session: &session, idle };
            let replica = ReplicaSession::new(&state, &account)?;
            replica.receive(&mut || receiver.next())
        })
        .await
        .map_err(|e| Status::internal(format!("a server task failed: {e}")))?;
        done.map(Response::new).map_err(to_status)
    }

    type FramesStream = Frames;

    async fn frames(
        &self,
        request: Request<v1::ReplicaFramesRequest>,
    ) -> Result<Response<Self::FramesStream>, Status> {
        let (_, account) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        let r = request.into_inner();
        let frames = core_call(move || ReplicaSession::new(&state, &account)?.frames(&r)).await?;
        let batches: Vec<Result<v1::FrameBatch, Status>> =
            frames.into_iter().map(|f| Ok(v1::FrameBatch { frames: vec![f] })).collect();
        Ok(Response::new(tokio_stream::iter(batches)))
    }
}
