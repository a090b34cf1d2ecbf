//! A QSM server across the network (gRPC, `docs/PROTOCOL.md`), behind the same [`Server`]
//! interface as the embedded one. The client's stages stay ordinary threads: a small tokio
//! runtime owned by the connection carries the gRPC streams, and the threads hand it messages
//! through bounded channels, so a slow network pushes back on the readers and compressors
//! instead of filling memory.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qsm_proto::convert;
use qsm_proto::v1::{self, admin_client::AdminClient, backup_op::Op, node_client::NodeClient};
use qsm_types::ServerError;
use qsm_types::model::{Filespace, FilespaceId, NewObject, ObjectId, ObjectVersion, TxnLimits};
use tokio::runtime::Runtime;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::error::{ClientError, Result};
use crate::server::{
    ClassInfo, DedupInfo, Fetch, Fetched, Scope, Server, ServerLoad, Upload, UploadKind, Uploaded,
};

/// Results of the node interface.
type NodeResult<T> = std::result::Result<T, ServerError>;

/// How to reach and log in to a server.
#[derive(Debug, Clone, Default)]
pub struct RemoteOptions {
    /// `https://HOST:PORT`, `http://HOST:PORT` (no TLS: tests, or a trusted link), or
    /// `unix:PATH` (the server's local socket).
    pub url: String,
    /// The node (or administrator) name.
    pub account: String,
    /// Its password.
    pub password: String,
    /// Log in as an administrator.
    pub admin: bool,
    /// PEM certificate(s) to trust for `https` (a self-signed server's `tls/cert.pem`);
    /// without it, none is trusted.
    pub ca: Option<PathBuf>,
    /// Allow `http://` (no TLS) to a host other than this machine's loopback: the password
    /// and every byte then cross the network in clear.
    pub insecure: bool,
}

pub use qsm_proto::Bearer;

type Authed = InterceptedService<Channel, Bearer>;

/// A logged-in connection to a QSM server.
#[derive(Debug)]
pub struct RemoteServer {
    rt: Runtime,
    channel: Channel,
    bearer: Bearer,
    url: String,
    account: String,
    /// The session number the server gave (for `qsm admin cancel session`).
    pub session: u64,
}

fn status(url: &str, s: tonic::Status) -> ServerError {
    let what = match s.code() {
        tonic::Code::Unavailable => "cannot reach the server",
        tonic::Code::Unauthenticated => "login refused by the server",
        tonic::Code::PermissionDenied => "refused by the server",
        tonic::Code::Cancelled => "cancelled",
        _ => "server error",
    };
    let msg = s.message();
    let msg = if msg.is_empty() { s.code().description() } else { msg };
    // A server that died mid-call shows as Unavailable, or as Unknown with the transport's
    // complaint (a reset stream, a closed connection).
    let lost = s.code() == tonic::Code::Unavailable
        || (s.code() == tonic::Code::Unknown
            && ["transport", "connection", "h2 protocol", "broken pipe", "reset"]
                .iter()
                .any(|w| msg.to_ascii_lowercase().contains(w)));
    if lost {
        return ServerError::Unreachable(format!("lost the server at {url}: {msg}"));
    }
    qsm_proto::status::from_code(s.code(), format!("{what} at {url}: {msg}"))
}

/// Objects per Fetch request: a request of 100,000 ids is well under a megabyte.
const FETCH_BATCH: usize = 100_000;

/// [`FETCH_BATCH`], or fewer when `QSM_FETCH_BATCH` says so: the tests cross batch boundaries
/// with a few files instead of 100,000.
fn fetch_batch() -> usize {
    let asked = std::env::var("QSM_FETCH_BATCH").ok().and_then(|v| v.parse::<usize>().ok());
    asked.filter(|&n| n > 0).map_or(FETCH_BATCH, |n| n.min(FETCH_BATCH))
}

/// Operations are batched into messages of about this many bytes: many small files then cost
/// one message, not one each, while a message stays far below the limit.
const MESSAGE_TARGET: usize = 1 << 20;
/// Messages in flight towards the network: a bound on the upload's memory (about 4 MiB).
const UPLOAD_QUEUE: usize = 4;

/// The connection's runtime: one thread is plenty to carry streams fed by the client's own
/// threads.
fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("qsm-net")
        .enable_all()
        .build()
        .map_err(|e| ServerError::Failed(format!("cannot start the network runtime: {e}")).into())
}

impl RemoteServer {
    /// Connects and logs in.
    pub fn connect(options: &RemoteOptions) -> Result<RemoteServer> {
        let rt = runtime()?;
        let url = options.url.clone();
        let channel = rt.block_on(connect_channel(options))?;
        let mut node = NodeClient::new(channel.clone())
            .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
            .max_encoding_message_size(qsm_proto::MAX_MESSAGE);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let request = v1::LoginRequest {
            protocol: qsm_proto::PROTOCOL,
            account: options.account.clone(),
            password: options.password.clone(),
            admin: options.admin,
            client: format!("qsm {} on {}", env!("CARGO_PKG_VERSION"), host.trim()),
        };
        let reply = rt
            .block_on(login_when_free(&mut node, request))
            .map_err(|s| {
                let mut why = wrong_scheme(&url, &format!("{}: {:?}", s.message(), s));
                // A TLS server may also just close a plaintext connection: ask the port.
                if why.is_none() && url.starts_with("http:") && rt.block_on(speaks_tls(&url)) {
                    why = Some(format!(
                        "{url}: the server speaks TLS: use https:// (with its certificate, --ca)"
                    ));
                }
                match why {
                    Some(why) => ClientError::Usage(why),
                    None => status(&url, s).into(),
                }
            })?
            .into_inner();
        // The server checked the protocol; a reply in another one means something between us
        // and it is not what it says. A server accepting less than a largest frame's message
        // could not take this client's uploads.
        if reply.protocol != qsm_proto::PROTOCOL {
            return Err(ServerError::Failed(format!(
                "{url}: the server answered in protocol {}, this client speaks {}",
                reply.protocol,
                qsm_proto::PROTOCOL
            ))
            .into());
        }
        if reply.max_message < qsm_proto::MAX_MESSAGE as u64 {
            return Err(ServerError::Failed(format!(
                "{url}: the server accepts messages of at most {} bytes, this client needs {}",
                reply.max_message,
                qsm_proto::MAX_MESSAGE
            ))
            .into());
        }
        let token = MetadataValue::try_from(format!("Bearer {}", reply.token)).map_err(|_| {
            ServerError::Failed(format!("{url}: the server sent an unusable token"))
        })?;
        Ok(RemoteServer {
            rt,
            channel,
            bearer: Bearer(Some(token)),
            url,
            account: options.account.clone(),
            session: reply.session,
        })
    }

    fn node(&self) -> NodeClient<Authed> {
        NodeClient::with_interceptor(self.channel.clone(), self.bearer.clone())
            .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
            .max_encoding_message_size(qsm_proto::MAX_MESSAGE)
    }

    /// The administrative interface on this connection (the login must be an administrator's,
    /// or the connection the server's local socket).
    pub fn admin(&self) -> AdminClient<Authed> {
        AdminClient::with_interceptor(self.channel.clone(), self.bearer.clone())
            .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
            .max_encoding_message_size(qsm_proto::MAX_MESSAGE)
    }

    /// Runs an administrative call.
    pub fn call<T>(
        &self,
        f: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        self.rt.block_on(f).map(tonic::Response::into_inner).map_err(|s| self.error(s).into())
    }

    fn error(&self, s: tonic::Status) -> ServerError {
        status(&self.url, s)
    }
}

/// An administrator's connection through the server's local socket, which needs no password:
/// the server checks that the peer process runs as the server's own user or as root.
pub fn connect_local_admin(url: &str) -> Result<RemoteServer> {
    let rt = runtime()?;
    let options = RemoteOptions { url: url.to_owned(), ..RemoteOptions::default() };
    let channel = rt.block_on(connect_channel(&options))?;
    Ok(RemoteServer {
        rt,
        channel,
        bearer: Bearer(None),
        url: url.to_owned(),
        account: "local administrator".into(),
        session: 0,
    })
}

async fn connect_channel(options: &RemoteOptions) -> Result<Channel> {
    let url = &options.url;
    let unreachable = |e: tonic::transport::Error| {
        ClientError::from(ServerError::Unreachable(format!(
            "cannot reach the server at {url}: {}",
            crate::error::chain(&e)
        )))
    };
    if let Some(path) = url.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        // The URI is not used: every connection goes to the socket.
        let endpoint =
            Endpoint::from_static("http://localhost").connect_timeout(Duration::from_secs(10));
        return endpoint
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(&path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(unreachable);
    }
    let mut endpoint = qsm_proto::endpoint(url)
        .map_err(|e| ClientError::Usage(format!("server address {url:?}: {e}")))?;
    if url.starts_with("https:") {
        let mut tls = ClientTlsConfig::new();
        match &options.ca {
            Some(ca) => {
                let pem = std::fs::read(ca).map_err(|e| {
                    ClientError::Usage(format!("the CA certificate {}: {e}", ca.display()))
                })?;
                qsm_proto::pem::check_certificates(&pem).map_err(|why| {
                    ClientError::Usage(format!("the CA certificate {}: {why}", ca.display()))
                })?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            None => {
                return Err(ClientError::Usage(format!(
                    "{url}: no certificate to trust: give the server's certificate with --ca \
                     (or QSM_CA, or `ca` in the client configuration)"
                )));
            }
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ClientError::Invalid(format!("TLS for {url}: {e}")))?;
    } else if !url.starts_with("http:") {
        return Err(ClientError::Usage(format!(
            "server address {url:?}: use https://HOST:PORT, http://HOST:PORT or unix:PATH"
        )));
    } else if !options.insecure && !endpoint.uri().host().is_some_and(qsm_proto::is_loopback) {
        return Err(ClientError::Usage(format!(
            "{url}: http:// sends the password and every file in clear to another machine: \
             use https:// (with the server's certificate, --ca), or say --insecure if the \
             link is private"
        )));
    }
    endpoint.connect().await.map_err(|e| match wrong_scheme(url, &crate::error::chain(&e)) {
        Some(why) => ClientError::Usage(why),
        None => unreachable(e),
    })
}

/// How long a login waits, in all, for a server busy with other logins.
const BUSY_PATIENCE: Duration = Duration::from_secs(120);

/// Logs in, asking again while the server says it is busy checking other logins (its
/// `retry-after`), each wait a little longer and jittered so a crowd of clients spreads out,
/// for up to [`BUSY_PATIENCE`]; any other answer is the answer.
async fn login_when_free(
    node: &mut NodeClient<Channel>,
    request: v1::LoginRequest,
) -> std::result::Result<tonic::Response<v1::LoginReply>, tonic::Status> {
    let deadline = tokio::time::Instant::now() + BUSY_PATIENCE;
    let mut tries = 0u32;
    loop {
        let status = match node.login(request.clone()).await {
            Err(s) if s.code() == tonic::Code::Unavailable => s,
            answer => return answer,
        };
        let after = status
            .metadata()
            .get(qsm_proto::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let Some(after) = after else { return Err(status) };
        tries += 1;
        let mut jitter = [0u8; 2];
        let _ = getrandom::fill(&mut jitter);
        let wait = Duration::from_secs(after.min(30) * u64::from(tries.min(4)))
            + Duration::from_millis(u64::from(u16::from_le_bytes(jitter)) % 2000);
        if tokio::time::Instant::now() + wait > deadline {
            return Err(status);
        }
        tokio::time::sleep(wait).await;
    }
}

/// Whether the server at `url` (an `http://` URL whose login failed) answers as TLS: the
/// HTTP/2 preface sent in clear gets a TLS alert, or the connection closed without a word,
/// where an HTTP/2 server answers with its SETTINGS frame. Loopback or not, one short probe.
async fn speaks_tls(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(uri) = url.parse::<tonic::transport::Uri>() else { return false };
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await.ok()?;
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.ok()?;
        let mut first = [0u8; 9];
        let n = tcp.read(&mut first).await.ok()?;
        // 0x15: a TLS alert record; 0x16: a handshake record.
        Some(n == 0 || matches!(first[0], 0x15 | 0x16))
    };
    tokio::time::timeout(Duration::from_secs(3), probe).await.ok().flatten().unwrap_or(false)
}

/// What a connection error means when the scheme does not match the server: plain HTTP/2 to
/// a TLS port reads the server's TLS alert as a broken HTTP/2 frame, and a TLS handshake with
/// a plaintext server reads its HTTP/2 frame as a corrupt TLS record.
fn wrong_scheme(url: &str, text: &str) -> Option<String> {
    if url.starts_with("http:")
        && (text.contains("protocol error") || text.contains("frame with invalid size"))
    {
        Some(format!("{url}: the server speaks TLS: use https:// (with its certificate, --ca)"))
    } else if url.starts_with("https:")
        && (text.contains("InvalidContentType")
            || text.contains("corrupt message")
            || text.contains("invalid content type")
            || text.contains("received corrupt"))
    {
        Some(format!(
            "{url}: the server does not speak TLS (it runs with --plaintext): use http://, on \
             this machine only"
        ))
    } else {
        None
    }
}

impl Drop for RemoteServer {
    fn drop(&mut self) {
        if self.bearer.0.is_some() {
            let mut node = self.node();
            // Best effort: the server also ends sessions that go idle.
            let _ = self.rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), node.logout(v1::Empty {})).await
            });
        }
    }
}

/// Whether `url` names this machine (its host by [`qsm_proto::is_loopback`]).
fn is_loopback(url: &str) -> bool {
    url.parse::<tonic::transport::Uri>()
        .is_ok_and(|uri| uri.host().is_some_and(qsm_proto::is_loopback))
}

impl Server for RemoteServer {
    fn describe(&self) -> String {
        format!("server {} (node {})", self.url, self.account)
    }

    fn shares_this_machine(&self) -> bool {
        is_loopback(&self.url)
    }

    fn filespaces(&self) -> NodeResult<Vec<Filespace>> {
        let mut node = self.node();
        let list = self.rt.block_on(node.filespaces(v1::Empty {})).map_err(|s| self.error(s))?;
        list.into_inner()
            .filespaces
            .into_iter()
            .map(|f| {
                convert::filespace_from_wire(&f, qsm_types::model::NodeId(0)).map_err(malformed)
            })
            .collect()
    }

    fn open_filespace(&self, name: &str, create: bool) -> NodeResult<Option<FilespaceId>> {
        let mut node = self.node();
        let request = v1::OpenFilespaceRequest { name: name.to_owned(), create };
        match self.rt.block_on(node.open_filespace(request)) {
            Ok(f) => Ok(Some(FilespaceId(
                convert::id_from_wire(f.into_inner().id, "filespace id").map_err(malformed)?,
            ))),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.error(s)),
        }
    }

    fn inventory(
        &self,
        filespace: FilespaceId,
        scope: Scope,
        f: &mut dyn FnMut(ObjectVersion) -> NodeResult<()>,
    ) -> NodeResult<()> {
        let mut node = self.node();
        let scope = match scope {
            Scope::Active => v1::Scope::Active,
            Scope::All => v1::Scope::All,
        };
        let request = v1::InventoryRequest { filespace: filespace.0 as u64, scope: scope as i32 };
        let mut stream =
            self.rt.block_on(node.inventory(request)).map_err(|s| self.error(s))?.into_inner();
        while let Some(batch) = self.rt.block_on(stream.message()).map_err(|s| self.error(s))? {
            for v in &batch.versions {
                f(convert::version_from_wire(v).map_err(malformed)?)?;
            }
        }
        Ok(())
    }

    fn object(&self, id: ObjectId) -> NodeResult<Option<ObjectVersion>> {
        let mut node = self.node();
        match self.rt.block_on(node.object(v1::ObjectRequest { id: id.0 as u64 })) {
            Ok(v) => Ok(Some(convert::version_from_wire(&v.into_inner()).map_err(malformed)?)),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.error(s)),
        }
    }

    fn upload(
        &self,
        filespace: FilespaceId,
        limits: TxnLimits,
        kind: UploadKind,
    ) -> NodeResult<Box<dyn Upload + '_>> {
        let (tx, rx) = tokio::sync::mpsc::channel::<v1::BackupRequest>(UPLOAD_QUEUE);
        let state = Arc::new(Mutex::new(UploadState::default()));
        let mut node = self.node();
        let replies = Arc::clone(&state);
        let url = self.url.clone();
        let task = self.rt.spawn(async move {
            let outcome = async {
                let mut stream = node
                    .backup(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await?
                    .into_inner();
                while let Some(reply) = stream.message().await? {
                    let mut s = replies.lock().unwrap_or_else(|p| p.into_inner());
                    s.committed = Uploaded { objects: reply.objects, bytes: reply.bytes };
                    s.finished |= reply.finished;
                    // A server older than the load fields sends zeros: no load then.
                    if reply.stream_seconds > 0.0 {
                        s.load = Some(ServerLoad {
                            busy: reply.store_seconds,
                            bytes: reply.store_bytes,
                            elapsed: reply.stream_seconds,
                        });
                    }
                }
                Ok::<(), tonic::Status>(())
            }
            .await;
            if let Err(s) = outcome {
                replies.lock().unwrap_or_else(|p| p.into_inner()).failed = Some(status(&url, s));
            }
        });
        let mut upload = RemoteUpload {
            server: self,
            tx: Some(tx),
            task: Some(task),
            state,
            ops: Vec::new(),
            size: 0,
        };
        upload.push(
            Op::Start(v1::Start {
                filespace: filespace.0 as u64,
                txn_group_max: limits.group_max as u64,
                txn_byte_limit: limits.byte_limit,
                whole: kind == UploadKind::Backup,
            }),
            0,
        )?;
        Ok(Box::new(upload))
    }

    fn fetch(&self, objects: Vec<ObjectId>) -> NodeResult<Box<dyn Fetch + '_>> {
        Ok(Box::new(RemoteFetch {
            server: self,
            pending: objects,
            sent: 0,
            batch: fetch_batch(),
            stream: None,
            next: None,
            frames: VecDeque::new(),
        }))
    }

    fn dedup_info(&self) -> NodeResult<DedupInfo> {
        let mut node = self.node();
        let r = self.rt.block_on(node.dedup_info(v1::Empty {})).map_err(|s| self.error(s))?;
        let r = r.into_inner();
        let scope_secret = r.scope_secret.as_ref().try_into().map_err(|_| {
            ServerError::Failed(format!("{}: a dedup scope secret of the wrong length", self.url))
        })?;
        Ok(DedupInfo {
            scope: r.scope,
            scope_secret,
            pool: String::from_utf8_lossy(&r.pool).into_owned(),
            epoch: r.epoch,
            dedup_default: r.dedup_default,
        })
    }

    fn have_chunks(&self, ids: &[[u8; 32]], sealed: bool) -> NodeResult<Vec<bool>> {
        let mut have = Vec::with_capacity(ids.len());
        // The server answers at most HAVE_BATCH ids a call.
        for part in ids.chunks(HAVE_BATCH) {
            let mut node = self.node();
            let ids = part.iter().map(|id| id.to_vec().into()).collect();
            let request = v1::HaveChunksRequest { ids, sealed };
            let r = self.rt.block_on(node.have_chunks(request)).map_err(|s| self.error(s))?;
            let answer = r.into_inner().have;
            qsm_proto::check_answers(&self.url, answer.len(), part.len(), "chunk ids")?;
            have.extend(answer);
        }
        Ok(have)
    }

    fn put_key(&self, key_file: &[u8]) -> NodeResult<()> {
        let mut node = self.node();
        let request = v1::KeyFile { key_file: key_file.to_vec().into() };
        self.rt.block_on(node.put_key(request)).map_err(|s| self.error(s))?;
        Ok(())
    }

    fn schedules(&self, fresh: bool) -> NodeResult<qsm_types::node::Schedules> {
        let mut node = self.node();
        let request = v1::SchedulesRequest { fresh };
        let r = self.rt.block_on(node.schedules(request)).map_err(|s| self.error(s))?;
        Ok(convert::schedules_from_wire(r.into_inner()))
    }

    fn start_event(&self, schedule: &str, window: i64) -> NodeResult<Option<i64>> {
        let mut node = self.node();
        let request = v1::StartEventRequest { schedule: schedule.to_owned(), window_start: window };
        let r = self.rt.block_on(node.start_event(request)).map_err(|s| self.error(s))?;
        let event = r.into_inner().event;
        Ok((event != 0).then_some(event))
    }

    fn end_event(&self, event: i64, result: qsm_types::RunResult, detail: &str) -> NodeResult<()> {
        let mut node = self.node();
        let request = v1::EndEventRequest {
            event,
            state: result.name().to_owned(),
            detail: detail.to_owned(),
        };
        self.rt.block_on(node.end_event(request)).map_err(|s| self.error(s))?;
        Ok(())
    }

    fn client_options(&self) -> NodeResult<Option<qsm_types::model::OptionSet>> {
        let mut node = self.node();
        let r = self.rt.block_on(node.client_options(v1::Empty {}));
        match r {
            Ok(r) => Ok(convert::cloptset_from_wire(r.into_inner())),
            // A server older than option sets gives none.
            Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
            Err(s) => Err(self.error(s)),
        }
    }

    fn mgmt_classes(&self) -> NodeResult<Vec<ClassInfo>> {
        let mut node = self.node();
        let r = self.rt.block_on(node.mgmt_classes(v1::Empty {})).map_err(|s| self.error(s))?;
        let r = r.into_inner();
        // A server older than `archive_days` sends none: TSM's default then.
        let default = qsm_types::model::ArchiveCopyGroup::default().retain_version_days;
        let days = r.archive_days.into_iter().chain(std::iter::repeat(default));
        Ok(r.names
            .into_iter()
            .zip(days)
            .map(|(name, archive_days)| ClassInfo { name, archive_days })
            .collect())
    }

    fn get_key(&self) -> NodeResult<Option<Vec<u8>>> {
        let mut node = self.node();
        let r = match self.rt.block_on(node.get_key(v1::Empty {})) {
            Ok(r) => r,
            // A server older than client-side encryption holds no key.
            Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(None),
            Err(s) => return Err(self.error(s)),
        };
        let key = r.into_inner().key_file;
        Ok((!key.is_empty()).then(|| key.to_vec()))
    }
}

/// Chunk ids per HaveChunks call (the server's limit is 10,000).
const HAVE_BATCH: usize = 4096;

fn malformed(e: convert::Malformed) -> ServerError {
    ServerError::Failed(format!("the server sent a {e}"))
}

#[derive(Debug, Default)]
struct UploadState {
    committed: Uploaded,
    finished: bool,
    failed: Option<ServerError>,
    load: Option<ServerLoad>,
}

struct RemoteUpload<'a> {
    server: &'a RemoteServer,
    tx: Option<tokio::sync::mpsc::Sender<v1::BackupRequest>>,
    task: Option<tokio::task::JoinHandle<()>>,
    state: Arc<Mutex<UploadState>>,
    ops: Vec<v1::BackupOp>,
    size: usize,
}

impl RemoteUpload<'_> {
    fn push(&mut self, op: Op, size: usize) -> NodeResult<()> {
        self.ops.push(v1::BackupOp { op: Some(op) });
        self.size += size + 16;
        if self.size >= MESSAGE_TARGET {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> NodeResult<()> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let request = v1::BackupRequest { ops: std::mem::take(&mut self.ops) };
        self.size = 0;
        let sent = self.tx.as_ref().map(|tx| tx.blocking_send(request));
        if !matches!(sent, Some(Ok(()))) {
            return Err(self.failure());
        }
        Ok(())
    }

    /// Why the stream stopped: the server's reason once the reply task has it.
    fn failure(&mut self) -> ServerError {
        self.tx = None;
        if let Some(task) = self.task.take() {
            let _ = self.server.rt.block_on(task);
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.failed.take().unwrap_or_else(|| {
            ServerError::Failed(format!(
                "the server at {} closed the backup stream",
                self.server.url
            ))
        })
    }
}

impl Upload for RemoteUpload<'_> {
    fn begin_object(
        &mut self,
        object: NewObject,
        _size_hint: u64,
        class: Option<&str>,
    ) -> NodeResult<()> {
        // Everything variable-length counts towards the message size.
        let path_len = object.path.len()
            + object.attrs.link_target.as_ref().map_or(0, Vec::len)
            + object.description.as_ref().map_or(0, String::len);
        let begin = v1::Begin {
            path: object.path.into(),
            kind: convert::kind_to_wire(object.kind) as i32,
            object_type: convert::type_to_wire(object.object_type) as i32,
            attrs: Some(convert::attributes_to_wire(&object.attrs)),
            description: object.description,
            retain_until: object.retain_until,
            mgmt_class: class.map(str::to_owned),
        };
        self.push(Op::Begin(begin), 64 + path_len)
    }

    fn append_frame(&mut self, frame: &[u8]) -> NodeResult<()> {
        self.push(Op::Frame(Bytes::copy_from_slice(frame)), frame.len())
    }

    fn append_chunk(&mut self, frame: &[u8], id: &[u8; 32], shared: bool) -> NodeResult<()> {
        let chunk =
            v1::Chunk { id: id.to_vec().into(), frame: Bytes::copy_from_slice(frame), shared };
        self.push(Op::Chunk(chunk), frame.len() + 40)
    }

    fn reference_chunk(&mut self, id: &[u8; 32], sealed: bool) -> NodeResult<()> {
        self.push(Op::Reference(v1::ChunkRef { id: id.to_vec().into(), sealed }), 34)
    }

    fn end_object(&mut self) -> NodeResult<()> {
        self.push(Op::End(v1::Empty {}), 0)
    }

    fn abandon_object(&mut self) -> NodeResult<()> {
        self.push(Op::Abandon(v1::Empty {}), 0)
    }

    fn deactivate(&mut self, path: &[u8]) -> NodeResult<()> {
        self.push(Op::Deactivate(Bytes::copy_from_slice(path)), path.len())
    }

    fn deactivate_tree(&mut self, path: &[u8]) -> NodeResult<()> {
        self.push(Op::DeactivateTree(Bytes::copy_from_slice(path)), path.len())
    }

    fn server_load(&self) -> Option<ServerLoad> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).load
    }

    fn finish(mut self: Box<Self>, warnings: u64) -> NodeResult<Uploaded> {
        self.ops.push(v1::BackupOp { op: Some(Op::Finish(v1::Finish { warnings })) });
        self.flush()?;
        // Close the request stream and wait for the server's last reply.
        self.tx = None;
        if let Some(task) = self.task.take() {
            let _ = self.server.rt.block_on(task);
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = state.failed.take() {
            return Err(e);
        }
        if !state.finished {
            return Err(ServerError::Failed(format!(
                "the server at {} ended the backup stream before committing it",
                self.server.url
            )));
        }
        Ok(state.committed)
    }
}

struct RemoteFetch<'a> {
    server: &'a RemoteServer,
    pending: Vec<ObjectId>,
    /// Objects already asked for.
    sent: usize,
    /// Objects per request.
    batch: usize,
    /// The batch being read.
    stream: Option<FetchBatch>,
    /// The next batch, asked for while the current one ends (see [`FetchBatch::nearly_done`]).
    next: Option<Asked>,
    frames: VecDeque<v1::Frame>,
}

/// A Fetch request on its way, and which of the objects it asks for.
type Asked = (
    tokio::task::JoinHandle<std::result::Result<tonic::Streaming<v1::FrameBatch>, tonic::Status>>,
    std::ops::Range<usize>,
);

/// One Fetch request's stream and how far it has come.
struct FetchBatch {
    stream: tonic::Streaming<v1::FrameBatch>,
    /// Objects it was asked for, and those whose last frame has arrived.
    objects: usize,
    ended: usize,
}

impl FetchBatch {
    /// Most of its objects have arrived: the next request goes out now, so the server has
    /// looked up and begun reading the next batch by the time this one ends, instead of the
    /// client's workers waiting a round trip and the server's start (issue 24). Not at the
    /// batch's start: a stream nobody reads for 10 minutes is ended by the server.
    fn nearly_done(&self) -> bool {
        self.ended * 10 >= self.objects * 9
    }
}

impl RemoteFetch<'_> {
    /// The request for the next batch of objects, sent on the connection's runtime; `None`
    /// when all have been asked for.
    fn ask(&mut self) -> Option<Asked> {
        if self.sent >= self.pending.len() {
            return None;
        }
        let range = self.sent..(self.sent + self.batch).min(self.pending.len());
        self.sent = range.end;
        Some(self.request(range))
    }

    fn request(&self, range: std::ops::Range<usize>) -> Asked {
        let objects = self.pending[range.clone()].iter().map(|id| id.0 as u64).collect();
        let mut node = self.server.node();
        let request = self.server.rt.spawn(async move {
            node.fetch(v1::FetchRequest { objects }).await.map(tonic::Response::into_inner)
        });
        (request, range)
    }

    /// Starts reading the batch `asked` for. One asked for ahead, while the node's other
    /// streams and this one's previous batch filled the node's share of streams, is asked
    /// again now that the previous batch has ended.
    fn open(&mut self, (request, range): Asked, ahead: bool) -> NodeResult<()> {
        let objects = range.len();
        let stream = match self.server.rt.block_on(request) {
            Ok(Ok(stream)) => stream,
            Ok(Err(s)) if ahead && s.code() == tonic::Code::ResourceExhausted => {
                return self.open(self.request(range), false);
            }
            Ok(Err(s)) => return Err(self.server.error(s)),
            Err(e) => {
                return Err(ServerError::Failed(format!(
                    "the fetch from {} stopped: {e}",
                    self.server.url
                )));
            }
        };
        self.stream = Some(FetchBatch { stream, objects, ended: 0 });
        Ok(())
    }
}

impl Fetch for RemoteFetch<'_> {
    fn next(&mut self, frame: &mut Vec<u8>) -> NodeResult<Option<Fetched>> {
        while self.frames.is_empty() {
            if let Some(batch) = &mut self.stream {
                match self.server.rt.block_on(batch.stream.message()) {
                    Ok(Some(message)) => {
                        batch.ended += message.frames.iter().filter(|f| f.last).count();
                        self.frames.extend(message.frames);
                        if self.next.is_none() && batch.nearly_done() {
                            self.next = self.ask();
                        }
                    }
                    Ok(None) => self.stream = None,
                    Err(s) => return Err(self.server.error(s)),
                }
                continue;
            }
            if let Some(asked) = self.next.take() {
                self.open(asked, true)?;
            } else if let Some(asked) = self.ask() {
                self.open(asked, false)?;
            } else {
                return Ok(None);
            }
        }
        let Some(f) = self.frames.pop_front() else { return Ok(None) };
        frame.clear();
        frame.extend_from_slice(&f.data);
        Ok(Some(Fetched {
            object: ObjectId(convert::id_from_wire(f.object, "object id").map_err(malformed)?),
            offset: f.offset,
            raw_len: f.raw_len,
            has_frame: !f.data.is_empty(),
            last: f.last,
            error: (!f.error.is_empty()).then_some(f.error),
            chunk_id: match f.chunk_id.len() {
                0 => None,
                _ => Some(f.chunk_id.as_ref().try_into().map_err(|_| {
                    ServerError::Failed(format!(
                        "{}: a chunk id of {} bytes",
                        self.server.url,
                        f.chunk_id.len()
                    ))
                })?),
            },
        }))
    }
}

/// The administrative operations over the connection's `Admin` service, one call each.
macro_rules! remote_admin {
    ($($name:ident($req:ident) -> $rep:ident;)*) => {
        impl qsm_proto::AdminApi for RemoteServer {
            $(
                fn $name(&self, r: v1::$req) -> NodeResult<v1::$rep> {
                    let mut admin = self.admin();
                    self.rt
                        .block_on(admin.$name(r))
                        .map(tonic::Response::into_inner)
                        .map_err(|s| self.error(s))
                }
            )*
        }
    };
}

qsm_proto::admin_operations!(remote_admin);

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn a_server_at_a_loopback_address_is_on_this_machine() {
        for url in ["http://127.0.0.1:1580", "https://localhost:1580", "http://[::1]:1580"] {
            assert!(is_loopback(url), "{url}");
        }
        for url in ["https://backup.example.org:1580", "http://10.0.0.7:1580", "not a url"] {
            assert!(!is_loopback(url), "{url}");
        }
    }
}
