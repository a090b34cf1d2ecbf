//! The `Node` service: what a client node may do, each request checked against the node its
//! session belongs to. Catalog and pool calls block, so they run on tokio's blocking threads.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use qsm_catalog::{
    CatalogError, Coordination, FilespaceId, NewObject, NodeId, ObjectId, ObjectKind, Severity,
};
use qsm_proto::convert;
use qsm_proto::v1::{self, backup_op::Op, node_server::Node};
use qsm_store::{Store, StoreError, TxnLimits};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{self, NewSession, Session};
use crate::logins;
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
/// The longest path component list a client may send (bytes).
const MAX_PATH: usize = 64 * 1024;
/// Extended attribute bytes (names and values) one object may carry: Linux caps one value at
/// 64 KiB and most file systems a whole list far below this.
const MAX_XATTR_BYTES: usize = 1 << 20;

/// The service.
#[derive(Debug, Clone)]
pub struct NodeService {
    pub(crate) state: Arc<State>,
}

pub(crate) fn catalog_status(e: CatalogError) -> Status {
    match e {
        CatalogError::NotFound { .. } => Status::not_found(e.to_string()),
        CatalogError::Exists { .. } => Status::already_exists(e.to_string()),
        CatalogError::Refused(_) => Status::failed_precondition(e.to_string()),
        CatalogError::DiskFull { .. } => Status::resource_exhausted(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

pub(crate) fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::BadFrame { .. } => Status::invalid_argument(e.to_string()),
        StoreError::UnknownChunk { .. } | StoreError::Restored(_) => {
            Status::failed_precondition(e.to_string())
        }
        StoreError::Catalog(c) => catalog_status(c),
        StoreError::Pool(qsm_pool::PoolError::Full { .. }) => {
            Status::resource_exhausted(e.to_string())
        }
        _ => Status::internal(e.to_string()),
    }
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

/// The peer's address, for the session list.
pub(crate) fn peer<T>(request: &Request<T>) -> String {
    if let Some(addr) = request.remote_addr() {
        return addr.to_string();
    }
    match request.extensions().get::<tonic::transport::server::UdsConnectInfo>() {
        Some(info) => match &info.peer_cred {
            Some(c) => match c.pid() {
                Some(pid) => format!("local socket, pid {pid} uid {}", c.uid()),
                None => format!("local socket, uid {}", c.uid()),
            },
            None => "local socket".into(),
        },
        None => "unknown".into(),
    }
}

/// The token of a request.
pub(crate) fn token<T>(request: &Request<T>) -> Option<&str> {
    request.metadata().get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")
}

impl NodeService {
    /// The session of a request, which must be a node's and not cancelled.
    fn session<T>(&self, request: &Request<T>) -> Result<(Arc<Session>, NodeId), Status> {
        let session = token(request)
            .and_then(|t| self.state.sessions.get(t))
            .ok_or_else(|| Status::unauthenticated("not logged in, or the session expired"))?;
        if session.is_cancelled() {
            return Err(Status::cancelled(format!(
                "session {} was cancelled by an administrator",
                session.id
            )));
        }
        let node = session
            .node
            .ok_or_else(|| Status::permission_denied("an administrator owns no data"))?;
        Ok((session, node))
    }
}

/// The filespaces `node` owns.
fn owned(store: &Store, node: NodeId) -> Result<HashSet<FilespaceId>, Status> {
    Ok(store
        .catalog()
        .filespaces(node)
        .map_err(catalog_status)?
        .into_iter()
        .map(|f| f.id)
        .collect())
}

fn check_owner(store: &Store, node: NodeId, fs: FilespaceId) -> Result<(), Status> {
    if owned(store, node)?.contains(&fs) {
        Ok(())
    } else {
        // The same answer as for a filespace that does not exist: nothing leaks.
        Err(Status::not_found(format!("no filespace {}", fs.0)))
    }
}

/// A path a client sends: relative, `/`-separated, no empty, `.` or `..` component, no NUL.
/// The root of a filespace is the empty path.
fn check_path(path: &[u8]) -> Result<(), Status> {
    if path.len() > MAX_PATH {
        return Err(Status::invalid_argument(format!(
            "a path of {} bytes is too long",
            path.len()
        )));
    }
    if path.is_empty() {
        return Ok(());
    }
    let bad = path[0] == b'/'
        || path.contains(&0)
        || path.split(|&b| b == b'/').any(|c| c.is_empty() || c == b"." || c == b"..");
    if bad {
        return Err(Status::invalid_argument(format!(
            "path {:?} is not a clean relative path",
            String::from_utf8_lossy(path)
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn login(
        &self,
        request: Request<v1::LoginRequest>,
    ) -> Result<Response<v1::LoginReply>, Status> {
        let peer = peer(&request);
        let mut r = request.into_inner();
        if r.protocol != qsm_proto::PROTOCOL {
            return Err(Status::failed_precondition(format!(
                "the client speaks protocol {}, this server {}: upgrade the older one",
                r.protocol,
                qsm_proto::PROTOCOL
            )));
        }
        // Sizes first: nothing longer than an account can be is hashed, looked up or logged.
        if r.account.is_empty() || r.account.len() > logins::MAX_ACCOUNT {
            return Err(Status::invalid_argument(format!(
                "an account name is 1 to {} bytes",
                logins::MAX_ACCOUNT
            )));
        }
        if r.password.len() > logins::MAX_PASSWORD {
            return Err(Status::invalid_argument(format!(
                "a password is at most {} bytes",
                logins::MAX_PASSWORD
            )));
        }
        if r.client.len() > logins::MAX_CLIENT {
            let mut end = logins::MAX_CLIENT;
            while !r.client.is_char_boundary(end) {
                end -= 1;
            }
            r.client.truncate(end);
        }
        let account = if r.admin { format!("admin:{}", r.account) } else { r.account.clone() };
        let keys = [logins::Key::Account(account), logins::Key::Source(logins::source_of(&peer))];
        // Locked out: refused before any hash is computed, and not logged again.
        self.state
            .logins
            .check(&keys, std::time::Instant::now())
            .map_err(|locked| Status::unavailable(locked.to_string()))?;
        let turn = self.state.logins.turn(std::time::Duration::from_secs(10)).await;
        let Some(_turn) = turn else {
            return Err(Status::unavailable(
                "the server is busy checking other logins: try again in a few seconds",
            ));
        };
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let refused = || {
                for locked in state.logins.failed(&keys, std::time::Instant::now()) {
                    state.log(
                        Severity::Warning,
                        &format!(
                            "{} locked out for {} s after repeated failed logins (the last from {peer})",
                            locked.what,
                            locked.wait.as_secs().max(1)
                        ),
                        None,
                        None,
                    );
                }
                Status::unauthenticated("wrong account name or password")
            };
            let node = if r.admin {
                let Some(admin) = catalog.admin(&r.account).map_err(catalog_status)? else {
                    auth::verify_nothing(&r.password);
                    state.log(
                        Severity::Warning,
                        &format!(
                            "failed login of unknown administrator {:?} from {peer}",
                            r.account
                        ),
                        None,
                        None,
                    );
                    return Err(refused());
                };
                if !auth::verify_password(&r.password, &admin.password_hash) {
                    state.log(
                        Severity::Warning,
                        &format!(
                            "failed login of administrator {} from {peer}: wrong password",
                            r.account
                        ),
                        None,
                        None,
                    );
                    return Err(refused());
                }
                if admin.locked {
                    return Err(Status::permission_denied(format!(
                        "administrator {} is locked",
                        r.account
                    )));
                }
                None
            } else {
                let Some(node) = catalog.node(&r.account).map_err(catalog_status)? else {
                    auth::verify_nothing(&r.password);
                    state.log(
                        Severity::Warning,
                        &format!("failed login of unknown node {:?} from {peer}", r.account),
                        None,
                        None,
                    );
                    return Err(refused());
                };
                if !auth::verify_password(&r.password, &node.password_hash) {
                    state.log(
                        Severity::Warning,
                        &format!("failed login of node {} from {peer}: wrong password", r.account),
                        Some(node.id),
                        None,
                    );
                    return Err(refused());
                }
                if node.locked {
                    return Err(Status::permission_denied(format!(
                        "node {} is locked: ask an administrator",
                        r.account
                    )));
                }
                Some(node.id)
            };
            state.logins.succeeded(&keys);
            let token = auth::new_token().map_err(Status::internal)?;
            // Recorded where every server sharing the catalog sees it. A full catalog disk
            // still lets the node read (queries, restores): the session goes unrecorded, and
            // whatever it tries to write fails naming the full disk.
            let (id, record, in_catalog) =
                match catalog.open_session(state.server, &r.account, node, &r.client, &peer) {
                    Ok((id, record)) => (id, record, true),
                    Err(CatalogError::DiskFull { .. }) => (state.sessions.local_id(), None, false),
                    Err(e) => return Err(catalog_status(e)),
                };
            let new = NewSession {
                id,
                account: r.account.clone(),
                node,
                record,
                client: r.client,
                peer,
            };
            let session = match state.sessions.open(
                new,
                token.clone(),
                state.config.max_sessions,
                state.config.max_node_sessions,
            ) {
                Ok(session) => session,
                Err(why) => {
                    if in_catalog {
                        let _ = catalog.close_session(id, &format!("refused: {why}"));
                    }
                    return Err(Status::resource_exhausted(why));
                }
            };
            state.log(
                Severity::Info,
                &format!(
                    "session {}: {} {} logged in from {} ({})",
                    session.id,
                    if session.node.is_some() { "node" } else { "administrator" },
                    session.account,
                    session.peer,
                    session.client
                ),
                session.node,
                session.record,
            );
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
        let (_, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let list = state.store.catalog().filespaces(node).map_err(catalog_status)?;
            Ok(Response::new(v1::FilespaceList {
                filespaces: list
                    .into_iter()
                    .map(|f| v1::Filespace {
                        id: f.id.0 as u64,
                        name: f.name,
                        created: f.created,
                        generation: f.generation,
                    })
                    .collect(),
            }))
        })
        .await
    }

    async fn open_filespace(
        &self,
        request: Request<v1::OpenFilespaceRequest>,
    ) -> Result<Response<v1::Filespace>, Status> {
        let (_, node) = self.session(&request)?;
        let r = request.into_inner();
        if r.name.is_empty() || r.name.len() > 4096 || r.name.contains('\0') {
            return Err(Status::invalid_argument("a filespace name is 1 to 4096 bytes, no NUL"));
        }
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            if r.create {
                catalog.filespace(node, &r.name).map_err(catalog_status)?;
            }
            let f = catalog
                .filespaces(node)
                .map_err(catalog_status)?
                .into_iter()
                .find(|f| f.name == r.name)
                .ok_or_else(|| Status::not_found(format!("no filespace {}", r.name)))?;
            Ok(Response::new(v1::Filespace {
                id: f.id.0 as u64,
                name: f.name,
                created: f.created,
                generation: f.generation,
            }))
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
            let run = || -> Result<(), Status> {
                check_owner(&state.store, node, fs)?;
                let mut batch = Vec::with_capacity(INVENTORY_BATCH);
                let mut each = |v: &qsm_catalog::ObjectVersion| {
                    // A damaged active version is left out of what an incremental backup
                    // compares with, so the client sends the file again.
                    if v.damaged && !all {
                        return Ok(());
                    }
                    batch.push(convert::version_to_wire(v));
                    if batch.len() >= INVENTORY_BATCH {
                        let versions = std::mem::take(&mut batch);
                        if session.is_cancelled() {
                            return Err(CatalogError::Refused("cancelled".into()));
                        }
                        if tx.send_within(Ok(v1::VersionBatch { versions })).is_err() {
                            return Err(CatalogError::Refused("the client went away".into()));
                        }
                    }
                    Ok(())
                };
                let catalog = state.store.catalog();
                let result = if all {
                    catalog.for_each_version(fs, &mut each)
                } else {
                    catalog.for_each_active(fs, &mut each)
                };
                if session.is_cancelled() {
                    return Err(Status::cancelled(format!(
                        "session {} was cancelled by an administrator",
                        session.id
                    )));
                }
                result.map_err(catalog_status)?;
                if !batch.is_empty() {
                    let _ = tx.send_within(Ok(v1::VersionBatch { versions: batch }));
                }
                Ok(())
            };
            if let Err(status) = run() {
                let _ = tx.send_within(Err(status));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn object(
        &self,
        request: Request<v1::ObjectRequest>,
    ) -> Result<Response<v1::Version>, Status> {
        let (_, node) = self.session(&request)?;
        let id =
            ObjectId(convert::id_from_wire(request.get_ref().id, "object id").map_err(malformed)?);
        let state = Arc::clone(&self.state);
        blocking(move || {
            let v = state.store.catalog().object(id).map_err(catalog_status)?;
            match v {
                Some(v) if owned(&state.store, node)?.contains(&v.filespace) => {
                    Ok(Response::new(convert::version_to_wire(&v)))
                }
                _ => Err(Status::not_found(format!("no object {}", id.0))),
            }
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
            if let Err(status) = run_backup(&state, node, &session, &mut receiver, &tx) {
                let _ = tx.send_within(Err(status));
            }
            state.update_record(&session);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn dedup_info(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::DedupInfoReply>, Status> {
        let (_, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let scope = node_scope(&state.store, node)?;
            let epoch = state.store.catalog().dedup_epoch().map_err(catalog_status)?;
            Ok(Response::new(v1::DedupInfoReply {
                scope: scope.name,
                scope_secret: scope.secret.to_vec().into(),
                pool: state.store.pool().id().to_string().into_bytes().into(),
                epoch,
                dedup_default: state.config.dedup,
            }))
        })
        .await
    }

    async fn have_chunks(
        &self,
        request: Request<v1::HaveChunksRequest>,
    ) -> Result<Response<v1::HaveChunksReply>, Status> {
        let (_, node) = self.session(&request)?;
        let v1::HaveChunksRequest { ids, sealed } = request.into_inner();
        if ids.len() > HAVE_MAX {
            return Err(Status::invalid_argument(format!(
                "{} chunk ids in one call; at most {HAVE_MAX}",
                ids.len()
            )));
        }
        let hashes = ids.iter().map(|id| chunk_id(id)).collect::<Result<Vec<_>, _>>()?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let scope = node_scope(&state.store, node)?;
            let found = state
                .store
                .catalog()
                .find_chunks(scope.id, sealed, &hashes)
                .map_err(catalog_status)?;
            Ok(Response::new(v1::HaveChunksReply {
                have: found.iter().map(Option::is_some).collect(),
            }))
        })
        .await
    }

    async fn put_key(&self, request: Request<v1::KeyFile>) -> Result<Response<v1::Empty>, Status> {
        let (_, node) = self.session(&request)?;
        let key = request.into_inner().key_file;
        if key.is_empty() || key.len() > KEY_FILE_MAX {
            return Err(Status::invalid_argument(format!(
                "a key file of {} bytes; 1 to {KEY_FILE_MAX} are kept",
                key.len()
            )));
        }
        let state = Arc::clone(&self.state);
        blocking(move || {
            state.store.catalog().set_node_key(node, &key).map_err(catalog_status)?;
            Ok(Response::new(v1::Empty {}))
        })
        .await
    }

    async fn mgmt_classes(
        &self,
        request: Request<v1::Empty>,
    ) -> Result<Response<v1::ClassList>, Status> {
        let (_, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let catalog = state.store.catalog();
            let (domain, classes) =
                qsm_catalog::node_policy(catalog.as_ref(), node).map_err(catalog_status)?;
            let domain = domain.name;
            Ok(Response::new(v1::ClassList {
                domain,
                archive_days: classes.iter().map(|c| c.archive.retain_version_days).collect(),
                names: classes.into_iter().map(|c| c.name).collect(),
            }))
        })
        .await
    }

    async fn get_key(&self, request: Request<v1::Empty>) -> Result<Response<v1::KeyFile>, Status> {
        let (_, node) = self.session(&request)?;
        let state = Arc::clone(&self.state);
        blocking(move || {
            let key = state.store.catalog().node_key(node).map_err(catalog_status)?;
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
        let permit = self.state.streams.start(node, &session.account)?;
        let state = Arc::clone(&self.state);
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            if let Err(status) = run_fetch(&state, node, &session, &objects, &tx) {
                let _ = tx.send_within(Err(status));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Keyed ids one HaveChunks call may ask about.
const HAVE_MAX: usize = 10_000;
/// The largest key file the server keeps for a node (a QSM key file is 96 or 120 bytes).
const KEY_FILE_MAX: usize = 4096;

/// A new dedup scope secret, from the same generator as the node keys (`qsm-crypt`).
pub(crate) fn new_secret() -> Result<[u8; 32], Status> {
    qsm_crypt::random().map_err(|e| Status::internal(format!("no randomness for a secret: {e}")))
}

/// The dedup scope of `node`, made on first use.
fn node_scope(store: &Store, node: NodeId) -> Result<qsm_catalog::DedupScope, Status> {
    let secret = new_secret()?;
    store.catalog().dedup_scope(node, secret).map_err(catalog_status)
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
) -> Result<(), Status> {
    let header = qsm_codec::FrameHeader::parse(frame)
        .map_err(|e| Status::invalid_argument(format!("a chunk's frame is invalid: {e}")))?;
    if header.is_sealed() {
        return Ok(());
    }
    let header = decoder
        .decode(frame, raw)
        .map_err(|e| Status::invalid_argument(format!("a chunk's frame does not decode: {e}")))?;
    if ids.id(&raw[..header.raw_len as usize]).0 != *hash {
        return Err(Status::invalid_argument(
            "a shared chunk's data does not match its id: refused, so no node of the scope restores it in place of the data the id names",
        ));
    }
    Ok(())
}

/// A keyed chunk id from the wire: exactly 32 bytes.
fn chunk_id(bytes: &[u8]) -> Result<[u8; 32], Status> {
    bytes.try_into().map_err(|_| {
        Status::invalid_argument(format!("a chunk id of {} bytes; chunk ids have 32", bytes.len()))
    })
}

/// The backup stream's messages, read from a blocking thread.
struct Receiver<'a> {
    handle: &'a tokio::runtime::Handle,
    inbound: &'a mut Streaming<v1::BackupRequest>,
    session: &'a Session,
    /// How long the client may send nothing (a long scan of unchanged files sends nothing):
    /// the session's idle timeout.
    idle: std::time::Duration,
}

impl Receiver<'_> {
    fn next(&mut self) -> Result<v1::BackupRequest, Status> {
        // A stream in progress keeps its session alive, however long it runs.
        self.session.touch();
        if self.session.is_cancelled() {
            return Err(Status::cancelled(format!(
                "session {} was cancelled by an administrator; what was committed stays",
                self.session.id
            )));
        }
        let next = tokio::time::timeout(self.idle, self.inbound.message());
        let message = self.handle.block_on(next).map_err(|_| {
            Status::deadline_exceeded(format!(
                "nothing arrived on the backup stream for {} s: it is ended; what was committed stays",
                self.idle.as_secs()
            ))
        })?;
        match message? {
            Some(m) => Ok(m),
            None => Err(Status::aborted(
                "the client ended the backup stream without finishing it: its uncommitted objects are dropped",
            )),
        }
    }
}

fn run_backup(
    state: &State,
    node: NodeId,
    session: &Session,
    receiver: &mut Receiver<'_>,
    tx: &mpsc::Sender<Result<v1::BackupReply, Status>>,
) -> Result<(), Status> {
    let store = &state.store;
    let mut objects = 0u64;
    let mut bytes = 0u64;
    let mut started: Option<(FilespaceId, qsm_store::Batch<'_>)> = None;
    let mut in_object = false;
    // The current object's path and chunk count, for messages.
    let mut current: (Vec<u8>, usize) = (Vec::new(), 0);
    // The node's dedup scope and the key of its plaintext chunk ids, looked up on the first
    // chunk that needs them.
    let mut scope: Option<(qsm_catalog::DedupScopeId, qsm_crypt::ChunkIdKey)> = None;
    let (mut decoder, mut raw) = (qsm_codec::FrameDecoder::new(), Vec::new());
    // The node's management classes, read when an object first names one.
    let mut classes: Option<Vec<qsm_catalog::MgmtClass>> = None;
    let node_scope_ids = |store: &Store| -> Result<_, Status> {
        let s = node_scope(store, node)?;
        Ok((s.id, qsm_crypt::ChunkIdKey::from_scope_secret(&s.secret)))
    };
    let mut load = StreamLoad::new();
    loop {
        let message = receiver.next()?;
        let working = Instant::now();
        for op in message.ops {
            let op = op.op.ok_or_else(|| Status::invalid_argument("an empty backup operation"))?;
            if let Op::Start(s) = &op {
                if started.is_some() {
                    return Err(Status::invalid_argument("Start sent twice"));
                }
                let fs = FilespaceId(
                    convert::id_from_wire(s.filespace, "filespace id").map_err(malformed)?,
                );
                check_owner(store, node, fs)?;
                // The client may ask for smaller transactions, never larger ones.
                let cap = |asked: u64, max: u64| if asked == 0 { max } else { asked.min(max) };
                let limits = TxnLimits {
                    group_max: cap(s.txn_group_max, state.config.txn_group_max as u64) as usize,
                    byte_limit: cap(s.txn_byte_limit, state.config.txn_byte_limit),
                };
                started = Some((fs, store.batch(limits).map_err(store_status)?));
                continue;
            }
            let Some((fs, batch)) = started.as_mut() else {
                return Err(Status::invalid_argument("the backup stream must begin with Start"));
            };
            let mut count = |c: Option<qsm_store::Committed>| {
                if let Some(c) = c {
                    objects += c.objects.len() as u64;
                    bytes += c.bytes;
                    session.objects.fetch_add(c.objects.len() as u64, Ordering::Relaxed);
                    true
                } else {
                    false
                }
            };
            match op {
                Op::Start(_) => {}
                Op::Begin(b) => {
                    check_path(&b.path)?;
                    let kind = convert::kind_from_wire(b.kind).map_err(malformed)?;
                    let attrs =
                        convert::attributes_from_wire(b.attrs.as_ref()).map_err(malformed)?;
                    if attrs.link_target.as_ref().is_some_and(|t| t.len() > MAX_PATH) {
                        return Err(Status::invalid_argument("a symlink target is too long"));
                    }
                    let xattr_bytes: usize =
                        attrs.xattrs.iter().map(|(n, v)| n.len() + v.len()).sum();
                    if xattr_bytes > MAX_XATTR_BYTES {
                        return Err(Status::invalid_argument(format!(
                            "the extended attributes of an object hold {xattr_bytes} bytes, more \
                             than {MAX_XATTR_BYTES}"
                        )));
                    }
                    if attrs
                        .extents
                        .as_ref()
                        .is_some_and(|e| e.len() > qsm_catalog::meta::MAX_EXTENTS)
                    {
                        return Err(Status::invalid_argument(format!(
                            "a sparse file of more than {} data extents",
                            qsm_catalog::meta::MAX_EXTENTS
                        )));
                    }
                    if b.description.as_ref().is_some_and(|d| d.len() > 4096) {
                        return Err(Status::invalid_argument("a description is too long"));
                    }
                    let object = NewObject {
                        filespace: *fs,
                        path: b.path.to_vec(),
                        kind,
                        object_type: convert::type_from_wire(b.object_type).map_err(malformed)?,
                        attrs,
                        mgmt_class: match b.mgmt_class.as_deref() {
                            None => None,
                            Some(name) => {
                                if classes.is_none() {
                                    classes = Some(
                                        qsm_catalog::node_classes(store.catalog().as_ref(), node)
                                            .map_err(catalog_status)?,
                                    );
                                }
                                // A class the domain lacks (deleted meanwhile): the default.
                                classes.iter().flatten().find(|c| c.name == name).map(|c| c.id)
                            }
                        },
                        description: if kind == ObjectKind::Archive { b.description } else { None },
                        retain_until: if kind == ObjectKind::Archive {
                            b.retain_until
                        } else {
                            None
                        },
                        chunks: Vec::new(),
                    };
                    let size = object.attrs.size;
                    current = (object.path.clone(), 0);
                    let committed = batch
                        .begin_object(object, size, qsm_catalog::now())
                        .map_err(store_status)?;
                    in_object = true;
                    if count(committed) {
                        state.update_record(session);
                        let reply = load.reply(objects, bytes, false);
                        if tx.send_within(Ok(reply)).is_err() {
                            return Ok(());
                        }
                    }
                }
                Op::Frame(frame) => {
                    if !in_object {
                        return Err(Status::invalid_argument("a frame outside an object"));
                    }
                    batch.append_frame(&frame).map_err(store_status)?;
                    session.bytes.fetch_add(frame.len() as u64, Ordering::Relaxed);
                    load.bytes += frame.len() as u64;
                }
                Op::Chunk(chunk) => {
                    if !in_object {
                        return Err(Status::invalid_argument("a chunk outside an object"));
                    }
                    let hash = chunk_id(&chunk.id)?;
                    let shared = if chunk.shared {
                        let (id, ids) = match &scope {
                            Some(s) => s,
                            None => scope.insert(node_scope_ids(store)?),
                        };
                        check_plain_id(ids, &chunk.frame, &hash, &mut decoder, &mut raw).map_err(
                            |s| {
                                Status::new(
                                    s.code(),
                                    format!(
                                        "object {}: chunk {}: {}",
                                        String::from_utf8_lossy(&current.0),
                                        current.1,
                                        s.message()
                                    ),
                                )
                            },
                        )?;
                        Some(*id)
                    } else {
                        None
                    };
                    // The store reads `sealed` from the frame itself.
                    let key = qsm_catalog::ChunkKey { hash, scope: shared, sealed: false };
                    batch.append_chunk(&chunk.frame, key).map_err(store_status)?;
                    current.1 += 1;
                    session.bytes.fetch_add(chunk.frame.len() as u64, Ordering::Relaxed);
                    load.bytes += chunk.frame.len() as u64;
                }
                Op::Reference(r) => {
                    if !in_object {
                        return Err(Status::invalid_argument(
                            "a chunk reference outside an object",
                        ));
                    }
                    let hash = chunk_id(&r.id)?;
                    let s = match &scope {
                        Some((s, _)) => *s,
                        None => scope.insert(node_scope_ids(store)?).0,
                    };
                    batch.reference_chunk(hash, s, r.sealed).map_err(store_status)?;
                    current.1 += 1;
                }
                Op::End(_) => {
                    batch.end_object().map_err(store_status)?;
                    in_object = false;
                }
                Op::Abandon(_) => {
                    batch.abandon_object();
                    in_object = false;
                }
                Op::Deactivate(path) => {
                    check_path(&path)?;
                    batch.deactivate(*fs, &path);
                }
                Op::DeactivateTree(path) => {
                    if !path.is_empty() {
                        check_path(&path)?;
                    }
                    batch.deactivate_tree(*fs, &path);
                }
                Op::Finish(_) => {
                    if in_object {
                        return Err(Status::invalid_argument("Finish in the middle of an object"));
                    }
                    let Some((_, batch)) = started.take() else { return Ok(()) };
                    let c = batch.finish(qsm_catalog::now()).map_err(store_status)?;
                    count(Some(c));
                    load.busy += working.elapsed().as_secs_f64();
                    let _ = tx.send_within(Ok(load.reply(objects, bytes, true)));
                    return Ok(());
                }
            }
        }
        load.busy += working.elapsed().as_secs_f64();
        if load.reported.elapsed() >= LOAD_EVERY {
            load.reported = Instant::now();
            // Never waits: a client that does not read its replies only misses a report.
            let _ = tx.try_send(Ok(load.reply(objects, bytes, false)));
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

fn run_fetch(
    state: &State,
    node: NodeId,
    session: &Session,
    objects: &[u64],
    tx: &mpsc::Sender<Result<v1::FrameBatch, Status>>,
) -> Result<(), Status> {
    let store = &state.store;
    let catalog = store.catalog();
    let mine = owned(store, node)?;
    let mut batch = v1::FrameBatch::default();
    let mut size = 0usize;
    let send = |batch: &mut v1::FrameBatch, size: &mut usize| -> Result<bool, Status> {
        if session.is_cancelled() {
            return Err(Status::cancelled(format!(
                "session {} was cancelled by an administrator",
                session.id
            )));
        }
        *size = 0;
        session.touch();
        Ok(tx.send_within(Ok(std::mem::take(batch))).is_ok())
    };
    for &raw_id in objects {
        let id = ObjectId(convert::id_from_wire(raw_id, "object id").map_err(malformed)?);
        let version = catalog.object(id).map_err(catalog_status)?;
        if !version.is_some_and(|v| mine.contains(&v.filespace)) {
            return Err(Status::not_found(format!("no object {}", id.0)));
        }
        let chunks = catalog.object_chunks(id).map_err(catalog_status)?;
        let mut offset = 0u64;
        if chunks.is_empty() {
            batch.frames.push(v1::Frame { object: raw_id, last: true, ..Default::default() });
            if batch.frames.len() >= FETCH_MESSAGE_FRAMES && !send(&mut batch, &mut size)? {
                return Ok(());
            }
        }
        for (i, chunk) in chunks.iter().enumerate() {
            let mut data = Vec::new();
            let last = i + 1 == chunks.len();
            // Not decoded here: the client checks every frame as it decodes it.
            let read = store.read_chunk(chunk, &mut data);
            let error = read.err().map(|e| e.to_string());
            let failed = error.is_some();
            size += data.len();
            batch.frames.push(v1::Frame {
                object: raw_id,
                offset,
                raw_len: chunk.location.raw_len,
                data: if failed { Default::default() } else { data.into() },
                last: last || failed,
                error: error.unwrap_or_default(),
                chunk_id: chunk.hash.map(|h| h.to_vec().into()).unwrap_or_default(),
            });
            offset += u64::from(chunk.location.raw_len);
            let full = size >= FETCH_MESSAGE || batch.frames.len() >= FETCH_MESSAGE_FRAMES;
            if full && !send(&mut batch, &mut size)? {
                return Ok(());
            }
            if failed {
                break;
            }
        }
    }
    if !batch.frames.is_empty() {
        send(&mut batch, &mut size)?;
    }
    Ok(())
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
