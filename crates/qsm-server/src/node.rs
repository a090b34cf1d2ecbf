//! The `Node` service: the gRPC front end of the server core's node operations
//! ([`crate::node_core`]) and logins ([`crate::login`]). It finds the session a request's token
//! names, decodes the request, calls the core on tokio's blocking threads (catalog and pool
//! calls block) and encodes the answer; batching of inventory and fetch streams into messages
//! is its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use qsm_catalog::{FilespaceId, NodeId, ObjectId};
use qsm_proto::convert;
use qsm_proto::status::to_status;
use qsm_proto::v1::{self, backup_op::Op, node_server::Node};
use qsm_types::ServerError;
use qsm_types::node::UploadKind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Session;
use crate::conns;
use crate::login::LoginAttempt;
use crate::node_core::{self, NodeSession, NodeUpload};
use crate::state::State;
use crate::streams::SendWithin;

/// Versions per inventory message.
const INVENTORY_BATCH: usize = 1000;
/// Frame bytes per Fetch message (a single larger frame still goes alone).
const FETCH_MESSAGE: usize = 1 << 20;
/// Frames per Fetch message at most, so objects without data cannot pile up in one message.
const FETCH_MESSAGE_FRAMES: usize = 10_000;
/// Objects one Fetch request may name.
const FETCH_MAX_OBJECTS: usize = 1_000_000;

/// The service.
#[derive(Debug, Clone)]
pub struct NodeService {
    pub(crate) state: Arc<State>,
}

fn malformed(e: convert::Malformed) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Runs blocking catalog or pool work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("a server task failed: {e}")))?
}

/// Runs blocking work of the server core off the async threads; its error as a status.
pub(crate) async fn core_call<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServerError> + Send + 'static,
) -> Result<T, Status> {
    blocking(move || f().map_err(to_status)).await
}

/// Seconds a client told the server is busy with logins waits before it asks again.
const BUSY_RETRY_AFTER: u32 = 2;

/// The peer's address, for the session list.
pub(crate) fn peer<T>(request: &Request<T>) -> String {
    conns::of(request).map_or_else(|| "unknown".into(), |c| c.peer.clone())
}

/// The connection a request came over (module `conns`).
pub(crate) fn conn<T>(request: &Request<T>) -> Option<&conns::Conn> {
    conns::of(request)
}

/// The token of a request.
pub(crate) fn token<T>(request: &Request<T>) -> Option<&str> {
    request.metadata().get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")
}

/// The session a request's token names, if it is still open and not cancelled.
pub(crate) fn live_session<T>(state: &State, request: &Request<T>) -> Result<Arc<Session>, Status> {
    let session = token(request)
        .and_then(|t| state.sessions.get(t, conn(request)))
        .ok_or_else(|| Status::unauthenticated("not logged in, or the session expired"))?;
    if session.is_cancelled() {
        return Err(Status::cancelled(format!(
            "session {} was cancelled by an administrator",
            session.id
        )));
    }
    Ok(session)
}

impl NodeService {
    /// The session of a request, which must be a node's and not cancelled.
    fn session<T>(&self, request: &Request<T>) -> Result<(Arc<Session>, NodeId), Status> {
        let session = live_session(&self.state, request)?;
        let node = session
            .node
            .ok_or_else(|| Status::permission_denied("an administrator owns no data"))?;
        Ok((session, node))
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn login(
        &self,
        request: Request<v1::LoginRequest>,
    ) -> Result<Response<v1::LoginReply>, Status> {
        let (peer, conn) = (peer(&request), conn(&request).cloned());
        let r = request.into_inner();
        if r.protocol != qsm_proto::PROTOCOL {
            return Err(Status::failed_precondition(format!(
                "the client speaks protocol {}, this server {}: upgrade the older one",
                r.protocol,
                qsm_proto::PROTOCOL
            )));
        }
        let mut attempt = LoginAttempt {
            account: r.account,
            password: r.password,
            admin: r.admin,
            client: r.client,
            peer,
            conn,
        };
        let keys = self.state.login_allowed(&mut attempt).map_err(to_status)?;
        let turn = self.state.logins.turn(std::time::Duration::from_secs(10)).await;
        let Some(_turn) = turn else {
            // Said as a gRPC `retry-after`: a flood of clients started at one moment (a
            // schedule's window, a whole site after a power cut) waits its turn and logs in.
            let mut busy = Status::unavailable(
                "the server is busy checking other logins: try again in a few seconds",
            );
            busy.metadata_mut().insert(qsm_proto::RETRY_AFTER, BUSY_RETRY_AFTER.into());
            return Err(busy);
        };
        let state = Arc::clone(&self.state);
        core_call(move || {
            let (session, token) = state.login(attempt, keys)?;
            Ok(Response::new(v1::LoginReply {
                protocol: qsm_proto::PROTOCOL,
                token,
                session: session.id,
                server: format!("qsm {}", env!("CARGO_PKG_VERSION")),
                max_message: qsm_proto::MAX_MESSAGE as u64,
            }))
        })
        .await
    }

    async fn logout(&self, request: Request<v1::Empty>) -> Result<Response<v1::Empty>, Status> {
        if let Some(session) = token(&request).and_then(|t| self.state.sessions.close(t)) {
            let state = Arc::clone(&self.state);
            blocking(move || {
                state.end_record(&session, "ended");
                Ok(())
            })
            .await?;
        }
        Ok(Response::new(v1::Empty {}))
    }

    async fn filespaces(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::FilespaceList>, Status> {
        let (session, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let list = NodeSession::new(&state, node, Some(&session)).filespaces()?;
            Ok(Response::new(v1::FilespaceList {
                filespaces: list.iter().map(convert::filespace_to_wire).collect(),
            }))
        })
        .await
    }

    async fn open_filespace(
        &self,
        request: Request<v1::OpenFilespaceRequest>,
    ) -> Result<Response<v1::Filespace>, Status> {
        let (session, node) = self.session(&request)?;
        let r = request.into_inner();
        let state = Arc::clone(&self.state);
        core_call(move || {
            let f = NodeSession::new(&state, node, Some(&session))
                .open_filespace(&r.name, r.create)?
                .ok_or_else(|| ServerError::NotFound(format!("no filespace {}", r.name)))?;
            Ok(Response::new(convert::filespace_to_wire(&f)))
        })
        .await
    }

    type InventoryStream = ReceiverStream<Result<v1::VersionBatch, Status>>;

    async fn inventory(
        &self,
        request: Request<v1::InventoryRequest>,
    ) -> Result<Response<Self::InventoryStream>, Status> {
        let (session, node) = self.session(&request)?;
        let r = request.into_inner();
        let fs =
            FilespaceId(convert::id_from_wire(r.filespace, "filespace id").map_err(malformed)?);
        let all = match v1::Scope::try_from(r.scope) {
            Ok(v1::Scope::All) => true,
            Ok(v1::Scope::Active) => false,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown inventory scope {}",
                    r.scope
                )));
            }
        };
        let permit = self.state.streams.start(node, &session.account)?;
        let state = Arc::clone(&self.state);
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut batch = Vec::with_capacity(INVENTORY_BATCH);
            let listed =
                NodeSession::new(&state, node, Some(&session)).inventory(fs, all, &mut |v| {
                    batch.push(convert::version_to_wire(v));
                    if batch.len() >= INVENTORY_BATCH {
                        let versions = std::mem::take(&mut batch);
                        if tx.send_within(Ok(v1::VersionBatch { versions })).is_err() {
                            return Err(ServerError::Aborted("the client went away".into()));
                        }
                    }
                    Ok(())
                });
            match listed {
                Ok(()) if !batch.is_empty() => {
                    let _ = tx.send_within(Ok(v1::VersionBatch { versions: batch }));
                }
                Ok(()) => {}
                Err(e) => {
                    let _ = tx.send_within(Err(to_status(e)));
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn object(
        &self,
        request: Request<v1::ObjectRequest>,
    ) -> Result<Response<v1::Version>, Status> {
        let (session, node) = self.session(&request)?;
        let id =
            ObjectId(convert::id_from_wire(request.get_ref().id, "object id").map_err(malformed)?);
        let state = Arc::clone(&self.state);
        core_call(move || match NodeSession::new(&state, node, Some(&session)).object(id)? {
            Some(v) => Ok(Response::new(convert::version_to_wire(&v))),
            None => Err(ServerError::NotFound(format!("no object {}", id.0))),
        })
        .await
    }

    type BackupStream = ReceiverStream<Result<v1::BackupReply, Status>>;

    async fn backup(
        &self,
        request: Request<Streaming<v1::BackupRequest>>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let (session, node) = self.session(&request)?;
        let permit = self.state.streams.start(node, &session.account)?;
        let mut inbound = request.into_inner();
        let state = Arc::clone(&self.state);
        let (tx, rx) = mpsc::channel(4);
        let handle = tokio::runtime::Handle::current();
        let idle = std::time::Duration::from_secs(state.config.idle_timeout_minutes.max(1) * 60);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut receiver =
                Receiver { handle: &handle, inbound: &mut inbound, session: &session, idle };
            let node = NodeSession::new(&state, node, Some(&session));
            if let Err(e) = run_backup(node, &mut receiver, &tx) {
                let _ = tx.send_within(Err(to_status(e)));
            }
            state.update_record(&session);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn dedup_info(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::DedupInfoReply>, Status> {
        let (session, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let info = NodeSession::new(&state, node, Some(&session)).dedup_info()?;
            Ok(Response::new(v1::DedupInfoReply {
                scope: info.scope,
                scope_secret: info.scope_secret.to_vec().into(),
                pool: info.pool.into_bytes().into(),
                epoch: info.epoch,
                dedup_default: info.dedup_default,
            }))
        })
        .await
    }

    async fn have_chunks(
        &self,
        request: Request<v1::HaveChunksRequest>,
    ) -> Result<Response<v1::HaveChunksReply>, Status> {
        let (session, node) = self.session(&request)?;
        let v1::HaveChunksRequest { ids, sealed } = request.into_inner();
        if ids.len() > node_core::HAVE_MAX {
            return Err(Status::invalid_argument(format!(
                "{} chunk ids in one call; at most {}",
                ids.len(),
                node_core::HAVE_MAX
            )));
        }
        let hashes = ids.iter().map(|id| chunk_id(id)).collect::<Result<Vec<_>, _>>()?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let have =
                NodeSession::new(&state, node, Some(&session)).have_chunks(&hashes, sealed)?;
            Ok(Response::new(v1::HaveChunksReply { have }))
        })
        .await
    }

    async fn put_key(&self, request: Request<v1::KeyFile>) -> Result<Response<v1::Empty>, Status> {
        let (session, node) = self.session(&request)?;
        let key = request.into_inner().key_file;
        let state = Arc::clone(&self.state);
        core_call(move || {
            NodeSession::new(&state, node, Some(&session)).put_key(&key)?;
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn schedules(
        &self,
        request: Request<v1::SchedulesRequest>,
    ) -> Result<Response<v1::DueList>, Status> {
        let (session, node) = self.session(&request)?;
        let fresh = request.into_inner().fresh;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let s = NodeSession::new(&state, node, Some(&session)).schedules(fresh)?;
            Ok(Response::new(qsm_proto::convert::schedules_to_wire(s)))
        })
        .await
    }

    async fn start_event(
        &self,
        request: Request<v1::StartEventRequest>,
    ) -> Result<Response<v1::StartEventReply>, Status> {
        let (session, node) = self.session(&request)?;
        let r = request.into_inner();
        let state = Arc::clone(&self.state);
        core_call(move || {
            let event = NodeSession::new(&state, node, Some(&session))
                .start_event(&r.schedule, r.window_start)?;
            Ok(Response::new(v1::StartEventReply { event: event.unwrap_or(0) }))
        })
        .await
    }

    async fn end_event(
        &self,
        request: Request<v1::EndEventRequest>,
    ) -> Result<Response<v1::Empty>, Status> {
        let (session, node) = self.session(&request)?;
        let r = request.into_inner();
        let result = qsm_catalog::RunResult::parse(&r.state).ok_or_else(|| {
            Status::invalid_argument(format!(
                "an event ends completed, completed with warnings or failed, not {:?}",
                r.state
            ))
        })?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            NodeSession::new(&state, node, Some(&session)).end_event(r.event, result, &r.detail)?;
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn client_options(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::Cloptset>, Status> {
        let (session, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let set = NodeSession::new(&state, node, Some(&session)).client_options()?;
            Ok(Response::new(
                set.as_ref().map(qsm_proto::convert::cloptset_to_wire).unwrap_or_default(),
            ))
        })
        .await
    }

    async fn mgmt_classes(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::ClassList>, Status> {
        let (session, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let (domain, classes) = NodeSession::new(&state, node, Some(&session)).policy()?;
            Ok(Response::new(v1::ClassList {
                domain,
                archive_days: classes.iter().map(|c| c.archive_days).collect(),
                names: classes.into_iter().map(|c| c.name).collect(),
            }))
        })
        .await
    }

    async fn get_key(&self, request: Request<v1::Empty>) -> Result<Response<v1::KeyFile>, Status> {
        let (session, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        core_call(move || {
            let key = NodeSession::new(&state, node, Some(&session)).get_key()?;
            Ok(Response::new(v1::KeyFile { key_file: key.unwrap_or_default().into() }))
        })
        .await
    }

    type FetchStream = ReceiverStream<Result<v1::FrameBatch, Status>>;

    async fn fetch(
        &self,
        request: Request<v1::FetchRequest>,
    ) -> Result<Response<Self::FetchStream>, Status> {
        let (session, node) = self.session(&request)?;
        let objects = request.into_inner().objects;
        if objects.len() > FETCH_MAX_OBJECTS {
            return Err(Status::invalid_argument(format!(
                "{} objects in one fetch; at most {FETCH_MAX_OBJECTS}",
                objects.len()
            )));
        }
        let objects = objects
            .into_iter()
            .map(|id| convert::id_from_wire(id, "object id").map(ObjectId))
            .collect::<Result<Vec<_>, _>>()
            .map_err(malformed)?;
        let permit = self.state.streams.start(node, &session.account)?;
        let state = Arc::clone(&self.state);
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let node = NodeSession::new(&state, node, Some(&session));
            if let Err(e) = run_fetch(node, &session, objects, &tx) {
                let _ = tx.send_within(Err(to_status(e)));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A keyed chunk id from the wire: exactly 32 bytes.
pub(crate) fn chunk_id(bytes: &[u8]) -> Result<[u8; 32], Status> {
    bytes.try_into().map_err(|_| {
        Status::invalid_argument(format!("a chunk id of {} bytes; chunk ids have 32", bytes.len()))
    })
}

/// A client stream's messages (a backup's, a replication's), read from a blocking thread.
pub(crate) struct Receiver<'a, M> {
    pub(crate) handle: &'a tokio::runtime::Handle,
    pub(crate) inbound: &'a mut Streaming<M>,
    pub(crate) session: &'a Session,
    /// How long the client may send nothing (a long scan of unchanged files sends nothing):
    /// the session's idle timeout.
    pub(crate) idle: std::time::Duration,
}

impl<M> Receiver<'_, M> {
    pub(crate) fn next(&mut self) -> Result<M, ServerError> {
        // A stream in progress keeps its session from idling, however long it runs.
        self.session.used();
        if self.session.is_cancelled() {
            return Err(ServerError::Cancelled(format!(
                "session {} was cancelled by an administrator; what was committed stays",
                self.session.id
            )));
        }
        let next = tokio::time::timeout(self.idle, self.inbound.message());
        let message = self.handle.block_on(next).map_err(|_| {
            ServerError::TimedOut(format!(
                "nothing arrived on the stream for {} s: it is ended; what was committed stays",
                self.idle.as_secs()
            ))
        })?;
        match message {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(ServerError::Aborted(
                "the client ended the stream without finishing it: its uncommitted objects are dropped"
                    .into(),
            )),
            Err(s) => Err(qsm_proto::status::from_code(s.code(), s.message().to_owned())),
        }
    }
}

/// A backup stream's operations, applied in order through the core until `Finish`.
fn run_backup(
    node: NodeSession<'_>,
    receiver: &mut Receiver<'_, v1::BackupRequest>,
    tx: &mpsc::Sender<Result<v1::BackupReply, Status>>,
) -> Result<(), ServerError> {
    let mut upload: Option<NodeUpload<'_>> = None;
    let mut load = StreamLoad::new();
    let invalid = |m: convert::Malformed| ServerError::Invalid(m.to_string());
    loop {
        let message = receiver.next()?;
        let working = Instant::now();
        for op in message.ops {
            let op =
                op.op.ok_or_else(|| ServerError::Invalid("an empty backup operation".into()))?;
            if let Op::Start(s) = &op {
                if upload.is_some() {
                    return Err(ServerError::Invalid("Start sent twice".into()));
                }
                let fs = FilespaceId(
                    convert::id_from_wire(s.filespace, "filespace id").map_err(invalid)?,
                );
                let asked = qsm_types::TxnLimits {
                    group_max: usize::try_from(s.txn_group_max).unwrap_or(usize::MAX),
                    byte_limit: s.txn_byte_limit,
                };
                let kind = if s.whole { UploadKind::Backup } else { UploadKind::Partial };
                upload = Some(node.upload(fs, asked, kind)?);
                continue;
            }
            let Some(up) = upload.as_mut() else {
                return Err(ServerError::Invalid("the backup stream must begin with Start".into()));
            };
            match op {
                Op::Start(_) => {}
                Op::Begin(b) => {
                    let kind = convert::kind_from_wire(b.kind).map_err(invalid)?;
                    let object = qsm_catalog::NewObject {
                        filespace: FilespaceId(0),
                        path: b.path.to_vec(),
                        kind,
                        object_type: convert::type_from_wire(b.object_type).map_err(invalid)?,
                        attrs: convert::attributes_from_wire(b.attrs.as_ref()).map_err(invalid)?,
                        mgmt_class: None,
                        description: b.description,
                        retain_until: b.retain_until,
                        chunks: Vec::new(),
                        replica: None,
                    };
                    let size = object.attrs.size;
                    if up.begin_object(object, size, b.mgmt_class.as_deref())? {
                        let c = up.committed();
                        if tx.send_within(Ok(load.reply(c.objects, c.bytes, false))).is_err() {
                            return Ok(());
                        }
                    }
                }
                Op::Frame(frame) => {
                    up.append_frame(&frame)?;
                    load.bytes += frame.len() as u64;
                }
                Op::Chunk(chunk) => {
                    let id = chunk_id(&chunk.id)
                        .map_err(|s| ServerError::Invalid(s.message().to_owned()))?;
                    up.append_chunk(&chunk.frame, &id, chunk.shared)?;
                    load.bytes += chunk.frame.len() as u64;
                }
                Op::Reference(r) => {
                    let id = chunk_id(&r.id)
                        .map_err(|s| ServerError::Invalid(s.message().to_owned()))?;
                    up.reference_chunk(&id, r.sealed)?;
                }
                Op::End(_) => up.end_object()?,
                Op::Abandon(_) => up.abandon_object(),
                Op::Deactivate(path) => up.deactivate(&path)?,
                Op::DeactivateTree(path) => up.deactivate_tree(&path)?,
                Op::Finish(f) => {
                    let Some(up) = upload.take() else { return Ok(()) };
                    let c = up.finish(f.warnings)?;
                    load.busy += working.elapsed().as_secs_f64();
                    let _ = tx.send_within(Ok(load.reply(c.objects, c.bytes, true)));
                    return Ok(());
                }
            }
        }
        load.busy += working.elapsed().as_secs_f64();
        if load.reported.elapsed() >= LOAD_EVERY {
            load.reported = Instant::now();
            let c = upload.as_ref().map(NodeUpload::committed).unwrap_or_default();
            // Never waits: a client that does not read its replies only misses a report.
            let _ = tx.try_send(Ok(load.reply(c.objects, c.bytes, false)));
        }
    }
}

/// How often a backup stream reports the server's load to the client.
const LOAD_EVERY: Duration = Duration::from_millis(100);

/// The server's work on one backup stream, reported to the client (`BackupReply`'s load
/// fields), which compresses harder when the server is what limits the backup.
struct StreamLoad {
    opened: Instant,
    reported: Instant,
    /// Seconds spent on the stream's operations (not waiting for them).
    busy: f64,
    /// Frame bytes stored.
    bytes: u64,
}

impl StreamLoad {
    fn new() -> StreamLoad {
        StreamLoad { opened: Instant::now(), reported: Instant::now(), busy: 0.0, bytes: 0 }
    }

    fn reply(&self, objects: u64, bytes: u64, finished: bool) -> v1::BackupReply {
        v1::BackupReply {
            objects,
            bytes,
            finished,
            store_seconds: self.busy,
            store_bytes: self.bytes,
            stream_seconds: self.opened.elapsed().as_secs_f64(),
        }
    }
}

/// A fetch's frames, batched into messages of about [`FETCH_MESSAGE`] bytes.
fn run_fetch(
    node: NodeSession<'_>,
    session: &Session,
    objects: Vec<ObjectId>,
    tx: &mpsc::Sender<Result<v1::FrameBatch, Status>>,
) -> Result<(), ServerError> {
    let mut fetch = node.fetch(objects)?;
    let mut batch = v1::FrameBatch::default();
    let mut size = 0usize;
    let send = |batch: &mut v1::FrameBatch, size: &mut usize| -> bool {
        *size = 0;
        session.used();
        tx.send_within(Ok(std::mem::take(batch))).is_ok()
    };
    loop {
        // A fresh buffer per frame: it moves into the message without a copy.
        let mut data = Vec::new();
        let Some(f) = fetch.next(&mut data)? else { break };
        size += data.len();
        batch.frames.push(v1::Frame {
            object: f.object.0 as u64,
            offset: f.offset,
            raw_len: f.raw_len,
            data: data.into(),
            last: f.last,
            error: f.error.unwrap_or_default(),
            chunk_id: f.chunk_id.map(|h| h.to_vec().into()).unwrap_or_default(),
        });
        let full = size >= FETCH_MESSAGE || batch.frames.len() >= FETCH_MESSAGE_FRAMES;
        if full && !send(&mut batch, &mut size) {
            return Ok(());
        }
    }
    if !batch.frames.is_empty() {
        node.check_cancelled()?;
        send(&mut batch, &mut size);
    }
    Ok(())
}
