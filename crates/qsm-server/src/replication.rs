//! The source's half of node replication (issue 30): the servers defined to replicate to,
//! `replicate node` (one run sends, per filespace, the versions the target lacks in the order
//! they were stored, their chunks as stored, as references where the target's copy of the
//! node's dedup scope holds them, then what the source has made inactive since), and
//! `repair stgpool` (damaged chunks fetched back from the target's copies).
//!
//! A run is resumable: the target commits as its transactions fill and says at the next run
//! which versions it holds, so a cut costs at most the transaction in flight. The target's
//! half is [`crate::replica_core`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prost::Message;
use qsm_catalog::{ChunkRef, Filespace, Node, ObjectId, ObjectKind, ObjectVersion, PeerServer};
use qsm_proto::Bearer;
use qsm_proto::v1::{self, node_client::NodeClient, replica_client::ReplicaClient, replica_op::Op};
use qsm_types::ServerError;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::admin_core::{AdminSession, class_info};
use crate::node_core::{HAVE_MAX, catalog_error, new_secret};
use crate::state::{Finished, State};

type Result<T> = std::result::Result<T, ServerError>;

/// Problems named in a run's report (all are in the activity log).
const PROBLEMS_TOLD: usize = 1_000;
/// Versions whose chunk lists are read, and whose chunks the target is asked about, at once.
const VERSIONS_AHEAD: usize = 256;
/// A message is sent once it holds this much; a bigger frame goes alone.
const MESSAGE_TARGET: usize = 1 << 20;
/// The largest message sent: a frame (at most 16 MiB and its header) always fits alone, well
/// within the protocol's limit.
const MESSAGE_MAX: usize = 4 * MESSAGE_TARGET;
/// Messages on their way to the target: a bound on the run's memory.
const QUEUE: usize = 4;

type Client = ReplicaClient<InterceptedService<Channel, Bearer>>;

/// A logged-in connection to a replication target.
struct Target {
    rt: tokio::runtime::Runtime,
    client: Client,
    name: String,
}

/// What a tonic status from `server` means here.
fn status(server: &str, s: tonic::Status) -> ServerError {
    let msg = if s.message().is_empty() { s.code().description() } else { s.message() };
    let text = format!("server {server}: {msg}");
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown => ServerError::Unreachable(text),
        code => qsm_proto::status::from_code(code, text),
    }
}

impl Target {
    /// Connects to `server` (its TLS checked against the certificate it was defined with)
    /// and logs in as its replication account.
    fn connect(server: &PeerServer) -> Result<Target> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("qsm-replicate")
            .enable_all()
            .build()
            .map_err(|e| ServerError::Failed(format!("cannot start a runtime: {e}")))?;
        let name = server.name.clone();
        let channel = rt.block_on(channel(server))?;
        let login = v1::LoginRequest {
            protocol: qsm_proto::PROTOCOL,
            account: server.account.clone(),
            password: server.password.clone(),
            admin: true,
            client: format!("qsm server {} replicating", env!("CARGO_PKG_VERSION")),
        };
        let reply = rt
            .block_on(NodeClient::new(channel.clone()).login(login))
            .map_err(|s| status(&name, s))?
            .into_inner();
        let token = format!("Bearer {}", reply.token)
            .parse()
            .map_err(|_| ServerError::Failed(format!("server {name} gave a malformed token")))?;
        let client = ReplicaClient::with_interceptor(channel, Bearer(Some(token)))
            .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
            .max_encoding_message_size(qsm_proto::MAX_MESSAGE);
        Ok(Target { rt, client, name })
    }

    fn call<T>(
        &self,
        f: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        self.rt.block_on(f).map(tonic::Response::into_inner).map_err(|s| status(&self.name, s))
    }

    /// The versions of `node`'s filespace `fs` the target holds: source id → active there.
    fn held(&self, node: &str, fs: &str) -> Result<HashMap<i64, bool>> {
        let r = v1::HeldRequest { node: node.to_owned(), filespace: fs.to_owned() };
        let mut stream = self.call(self.client.clone().held(r))?;
        let mut held = HashMap::new();
        while let Some(batch) =
            self.rt.block_on(stream.message()).map_err(|s| status(&self.name, s))?
        {
            if batch.origins.len() != batch.active.len() {
                return Err(ServerError::Failed(format!(
                    "server {} answered Held with {} versions and {} states",
                    self.name,
                    batch.origins.len(),
                    batch.active.len()
                )));
            }
            for (origin, active) in batch.origins.iter().zip(batch.active.iter()) {
                held.insert(*origin as i64, *active);
            }
        }
        Ok(held)
    }

    /// Which of `ids` (sealed or not) `node`'s scope holds on the target.
    fn have(&self, node: &str, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>> {
        let mut have = Vec::with_capacity(ids.len());
        for part in ids.chunks(HAVE_MAX) {
            let r = v1::ReplicaHaveRequest {
                node: node.to_owned(),
                ids: part.iter().map(|id| id.to_vec().into()).collect(),
                sealed,
            };
            let answer = self.call(self.client.clone().have_chunks(r))?.have;
            let peer = format!("server {}", self.name);
            qsm_proto::check_answers(&peer, answer.len(), part.len(), "chunk ids")?;
            have.extend(answer);
        }
        Ok(have)
    }
}

/// A channel to `server`: TLS against its certificate, or plaintext HTTP on loopback only.
async fn channel(server: &PeerServer) -> Result<Channel> {
    let url = &server.address;
    let mut endpoint = qsm_proto::endpoint(url)
        .map_err(|e| ServerError::invalid(format!("server address {url:?}: {e}")))?;
    if url.starts_with("https:") {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&server.ca));
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ServerError::invalid(format!("TLS for {url}: {e}")))?;
    }
    endpoint.connect().await.map_err(|e| {
        ServerError::Unreachable(format!("cannot reach server {} at {url}: {e}", server.name))
    })
}

/// Checks a server's definition: its name, an https address (http on loopback only), a
/// certificate that parses.
pub(crate) fn check_server(r: &v1::ServerRequest) -> Result<()> {
    crate::admin_core::check_name(&r.name)?;
    crate::admin_core::check_name(&r.account)?;
    let uri: tonic::transport::Uri = r
        .address
        .parse()
        .map_err(|e| ServerError::invalid(format!("--address {:?}: {e}", r.address)))?;
    match uri.scheme_str() {
        Some("https") => qsm_proto::pem::check_certificates(r.ca.as_bytes())
            .map_err(|why| ServerError::invalid(format!("--cert: {why}"))),
        Some("http") if uri.host().is_some_and(qsm_proto::is_loopback) => Ok(()),
        _ => Err(ServerError::invalid(format!(
            "--address {:?}: use https://HOST:PORT (http:// only to this machine's loopback)",
            r.address
        ))),
    }
}

/// The defined server `name`, or the only one when `name` is empty.
pub(crate) fn peer(state: &State, name: &str) -> Result<PeerServer> {
    let mut all = state.store.catalog().peer_servers().map_err(catalog_error)?;
    if name.is_empty() {
        return match all.len() {
            1 => Ok(all.remove(0)),
            0 => Err(ServerError::not_found(
                "no server is defined to replicate to: qsm admin define server NAME --address \
                 https://HOST:PORT --cert PEM --account ACCOUNT \
                 --account-password-file FILE",
            )),
            _ => Err(ServerError::invalid(format!(
                "several servers are defined ({}): name one with --target",
                all.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        };
    }
    all.into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ServerError::not_found(format!("no server {name}")))
}

/// A replication run's counts, shared with its progress line.
#[derive(Debug, Default)]
struct Totals {
    nodes: AtomicU64,
    filespaces: AtomicU64,
    versions: AtomicU64,
    skipped: AtomicU64,
    chunks: AtomicU64,
    frame_bytes: AtomicU64,
    references: AtomicU64,
    wire_bytes: AtomicU64,
    deactivated: AtomicU64,
    /// Versions the target committed, and those it refused.
    committed: AtomicU64,
    refused: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Runs `replicate node`: the caller's privilege is checked.
pub(crate) fn replicate(
    session: &AdminSession<'_>,
    actor: &str,
    r: v1::ReplicateRequest,
) -> Result<v1::ReplicateReply> {
    let state = session.state();
    let catalog = state.store.catalog();
    if r.nodes.is_empty() {
        return Err(ServerError::invalid("name the nodes to replicate"));
    }
    let mut nodes = Vec::new();
    for name in &r.nodes {
        let node = catalog
            .node(name)
            .map_err(catalog_error)?
            .ok_or_else(|| ServerError::not_found(format!("no node {name}")))?;
        if let Some(by) = &node.replica_of {
            return Err(ServerError::refused(format!(
                "node {name} is itself a replica here (made by {by}): replicate it from its \
                 own server"
            )));
        }
        nodes.push(node);
    }
    let server = peer(state, &r.target)?;
    let totals = Arc::new(Totals::default());
    let shown = Arc::clone(&totals);
    let show = Arc::new(move || {
        format!(
            "{} versions ({} bytes) sent, {} there already, {} filespaces done",
            get(&shown.versions),
            get(&shown.wire_bytes),
            get(&shown.skipped),
            get(&shown.filespaces)
        )
    });
    let what = format!("nodes {} to server {}", r.nodes.join(", "), server.name);
    let ran = state.run_process("replicate node", &what, actor, show, |cancel| {
        let target = Target::connect(&server)?;
        let run = Run { state, target: &target, totals: &totals, cancel };
        let mut problems = Vec::new();
        for node in &nodes {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            run.node(node, &mut problems)?;
            add(&totals.nodes, 1);
        }
        let stopped = cancel.load(Ordering::Relaxed).then(|| "cancelled".to_owned());
        for p in &problems {
            state.log(qsm_catalog::Severity::Warning, &format!("replicate node: {p}"), None, None);
        }
        let left = problems.len();
        problems.truncate(PROBLEMS_TOLD);
        Ok(Finished {
            detail: format!(
                "{} versions, {} chunks ({} bytes stored, {} bytes sent) to {}; {} chunks \
                 there already, {} versions there already, {} made inactive{}",
                get(&totals.committed),
                get(&totals.chunks),
                get(&totals.frame_bytes),
                get(&totals.wire_bytes),
                server.name,
                get(&totals.references),
                get(&totals.skipped),
                get(&totals.deactivated),
                if left == 0 {
                    String::new()
                } else {
                    format!("; {left} versions or filespaces left for the next run (see the log)")
                }
            ),
            stopped,
            value: problems,
        })
    })?;
    Ok(v1::ReplicateReply {
        process: ran.process as u64,
        target: server.name,
        nodes: get(&totals.nodes),
        filespaces: get(&totals.filespaces),
        versions: get(&totals.committed),
        refused: get(&totals.refused),
        problems: ran.value,
        skipped: get(&totals.skipped),
        chunks: get(&totals.chunks),
        frame_bytes: get(&totals.frame_bytes),
        references: get(&totals.references),
        wire_bytes: get(&totals.wire_bytes),
        deactivated: get(&totals.deactivated),
        stopped: ran.stopped.unwrap_or_default(),
        seconds: ran.seconds,
    })
}

/// One replication run to one target.
struct Run<'a> {
    state: &'a State,
    target: &'a Target,
    totals: &'a Totals,
    cancel: &'a AtomicBool,
}

impl Run<'_> {
    /// Replicates `node`: its definition, then each filespace.
    fn node(&self, node: &Node, problems: &mut Vec<String>) -> Result<()> {
        let catalog = self.state.store.catalog();
        let scope = catalog.dedup_scope(node.id, new_secret()?).map_err(catalog_error)?;
        let domain = catalog
            .domains()
            .map_err(catalog_error)?
            .into_iter()
            .find(|d| d.id == node.domain)
            .ok_or_else(|| ServerError::not_found(format!("node {}'s domain", node.name)))?;
        let classes = catalog.mgmt_classes(domain.id).map_err(catalog_error)?;
        let names: HashMap<i64, String> =
            classes.iter().map(|c| (c.id.0, c.name.clone())).collect();
        let def = v1::ReplicaNode {
            name: node.name.clone(),
            password_hash: node.password_hash.clone(),
            key_file: catalog.node_key(node.id).map_err(catalog_error)?.map(Into::into),
            scope: scope.name,
            scope_secret: scope.secret.to_vec().into(),
            domain: domain.name,
            classes: classes.into_iter().map(class_info).collect(),
            locked: node.locked,
            incarnation: qsm_store::incarnation(catalog.as_ref())
                .map_err(crate::node_core::store_error)?,
        };
        self.target.call(self.target.client.clone().put_node(def))?;
        for fs in catalog.filespaces(node.id).map_err(catalog_error)? {
            if self.cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            // One filespace's failure is told and the others go on; a target lost ends all.
            match self.filespace(node, &fs, &names, problems) {
                Ok(()) => add(&self.totals.filespaces, 1),
                Err(e @ ServerError::Unreachable(_)) => return Err(e),
                Err(e) => problems.push(format!("node {} filespace {}: {e}", node.name, fs.name)),
            }
        }
        Ok(())
    }

    /// Sends what the target lacks of filespace `fs`, then the deactivations.
    fn filespace(
        &self,
        node: &Node,
        fs: &Filespace,
        classes: &HashMap<i64, String>,
        problems: &mut Vec<String>,
    ) -> Result<()> {
        let catalog = self.state.store.catalog();
        let held = self.target.held(&node.name, &fs.name)?;
        let now = qsm_types::now();
        let mut send: Vec<ObjectVersion> = Vec::new();
        let mut inactive: Vec<(ObjectId, i64, Vec<u8>)> = Vec::new();
        let mut seen = HashSet::new();
        let mut skipped = 0;
        catalog
            .for_each_version(fs.id, &mut |v| {
                seen.insert(v.id.0);
                match held.get(&v.id.0) {
                    // Active there, inactive here since: made inactive there too.
                    Some(true) if !v.active && v.kind == ObjectKind::Backup => {
                        inactive.push((v.id, v.deactivated.unwrap_or(now), v.path.clone()));
                        skipped += 1;
                    }
                    Some(_) => skipped += 1,
                    // Sent in the state it has here.
                    None => send.push(v.clone()),
                }
                Ok(())
            })
            .map_err(catalog_error)?;
        // A version sent replaces the older ones of its path there, as it did here: those
        // need no word.
        let replaced: HashSet<&[u8]> = send
            .iter()
            .filter(|v| v.kind == ObjectKind::Backup)
            .map(|v| v.path.as_slice())
            .collect();
        let mut inactive: Vec<(ObjectId, i64)> = inactive
            .into_iter()
            .filter(|(_, _, path)| !replaced.contains(path.as_slice()))
            .map(|(id, when, _)| (id, when))
            .collect();
        // Active there but gone here (expired or deleted with their filespace, which may have
        // been made again): no longer the files' current state, so inactive there, never
        // deleted there.
        inactive.extend(
            held.iter()
                .filter(|&(id, &active)| active && !seen.contains(id))
                .map(|(&id, _)| (ObjectId(id), now)),
        );
        add(&self.totals.skipped, skipped);
        if send.is_empty() && inactive.is_empty() {
            return Ok(());
        }
        // In the order they were stored: a path's versions replace each other as they did.
        send.sort_by_key(|v| v.id);
        let (tx, rx) = tokio::sync::mpsc::channel::<v1::ReplicaBatch>(QUEUE);
        let mut client = self.target.client.clone();
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let call = self.target.rt.spawn(async move { client.send(stream).await });
        let mut out = Outbox { tx, ops: Vec::new(), bytes: 0, wire: 0, lost: false };
        let start = v1::HeldRequest { node: node.name.clone(), filespace: fs.name.clone() };
        out.push(Op::Start(start));
        let sent = self.versions(&node.name, &send, classes, &mut out, problems);
        let cancelled = self.cancel.load(Ordering::Relaxed);
        if sent.is_ok() && !cancelled {
            for (origin, when) in &inactive {
                let when = *when;
                out.push(Op::Deactivate(v1::ReplicaDeactivate { origin: origin.0 as u64, when }));
            }
            out.push(Op::Finish(v1::Empty {}));
            out.flush();
        }
        add(&self.totals.wire_bytes, out.wire);
        // Dropping the sender ends the stream: without Finish, the target keeps what it
        // committed and drops the rest.
        drop(out);
        let reply = self.target.rt.block_on(call);
        sent?;
        if cancelled {
            return Ok(());
        }
        let reply = reply
            .map_err(|e| ServerError::Failed(format!("the replication stream failed: {e}")))?
            .map_err(|s| status(&self.target.name, s))?
            .into_inner();
        add(&self.totals.deactivated, reply.deactivated);
        add(&self.totals.committed, reply.versions);
        let refused = reply.refused.len() as u64;
        add(&self.totals.refused, refused);
        problems.extend(
            reply
                .refused
                .into_iter()
                .map(|r| format!("node {} filespace {}: {r}", node.name, fs.name)),
        );
        Ok(())
    }

    /// Queues `versions` with their chunks, asking the target which keyed chunks it holds a
    /// few hundred versions at a time. A version whose chunk cannot be read is abandoned
    /// there and named in `problems`; the next run tries it again.
    fn versions(
        &self,
        node: &str,
        versions: &[ObjectVersion],
        classes: &HashMap<i64, String>,
        out: &mut Outbox,
        problems: &mut Vec<String>,
    ) -> Result<()> {
        let store = &self.state.store;
        let mut sent: HashSet<([u8; 32], bool)> = HashSet::new();
        for part in versions.chunks(VERSIONS_AHEAD) {
            if self.cancel.load(Ordering::Relaxed) {
                return Ok(());
            }
            let ids: Vec<ObjectId> = part.iter().map(|v| v.id).collect();
            let lists = store.catalog().objects_chunks(&ids).map_err(catalog_error)?;
            let have = self.have(node, lists.iter().flatten().flat_map(|(_, l)| l), &sent)?;
            for (v, list) in part.iter().zip(lists) {
                // Expired since it was listed: nothing to send.
                let Some((_, chunks)) = list else { continue };
                if v.damaged {
                    problems.push(format!(
                        "version {} ({}) is damaged here; repair the pool, then replicate again",
                        v.id.0,
                        String::from_utf8_lossy(&v.path)
                    ));
                    continue;
                }
                out.push(Op::Begin(version(v, classes)));
                let mut whole = true;
                for c in &chunks {
                    if out.lost || self.cancel.load(Ordering::Relaxed) {
                        // The stream failed (its error is the call's), or the run is cancelled:
                        // the version is dropped with the stream.
                        return Ok(());
                    }
                    let key = c.hash.filter(|_| c.scoped).map(|h| (h, c.sealed));
                    if let Some(k) = key.filter(|k| have.contains(k) || sent.contains(k)) {
                        let r = v1::ChunkRef { id: k.0.to_vec().into(), sealed: k.1 };
                        out.push(Op::Reference(r));
                        add(&self.totals.references, 1);
                        continue;
                    }
                    let mut frame = Vec::new();
                    if let Err(e) = store.read_chunk(c, &mut frame) {
                        out.push(Op::Abandon(v1::Empty {}));
                        problems.push(format!(
                            "version {} ({}): chunk {}: {e}",
                            v.id.0,
                            String::from_utf8_lossy(&v.path),
                            c.id.0
                        ));
                        whole = false;
                        break;
                    }
                    let len = frame.len();
                    add(&self.totals.chunks, 1);
                    add(&self.totals.frame_bytes, len as u64);
                    let op = match c.hash {
                        Some(h) => {
                            if let Some(k) = key {
                                sent.insert(k);
                            }
                            let shared = c.scoped;
                            Op::Chunk(v1::Chunk {
                                id: h.to_vec().into(),
                                frame: frame.into(),
                                shared,
                            })
                        }
                        None => Op::Frame(frame.into()),
                    };
                    out.push(op);
                }
                if whole {
                    out.push(Op::End(v1::Empty {}));
                    add(&self.totals.versions, 1);
                }
                if out.lost {
                    // The stream failed: its error is the call's.
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Which of `chunks`' scoped keyed ids the target holds (those sent in this stream need
    /// no asking).
    fn have<'c>(
        &self,
        node: &str,
        chunks: impl Iterator<Item = &'c ChunkRef>,
        sent: &HashSet<([u8; 32], bool)>,
    ) -> Result<HashSet<([u8; 32], bool)>> {
        let mut ask: [Vec<[u8; 32]>; 2] = [Vec::new(), Vec::new()];
        let mut seen = HashSet::new();
        for c in chunks {
            if let Some(h) = c.hash.filter(|_| c.scoped)
                && !sent.contains(&(h, c.sealed))
                && seen.insert((h, c.sealed))
            {
                ask[usize::from(c.sealed)].push(h);
            }
        }
        let mut have = HashSet::new();
        for (sealed, ids) in [(false, &ask[0]), (true, &ask[1])] {
            if ids.is_empty() {
                continue;
            }
            let found = self.target.have(node, ids, sealed)?;
            have.extend(ids.iter().zip(found).filter(|(_, f)| *f).map(|(h, _)| (*h, sealed)));
        }
        Ok(have)
    }
}

/// A version as the Send stream carries it.
fn version(v: &ObjectVersion, classes: &HashMap<i64, String>) -> v1::ReplicaVersion {
    v1::ReplicaVersion {
        origin: v.id.0 as u64,
        path: v.path.clone().into(),
        kind: qsm_proto::convert::kind_to_wire(v.kind).into(),
        object_type: qsm_proto::convert::type_to_wire(v.object_type).into(),
        attrs: Some(qsm_proto::convert::attributes_to_wire(&v.attrs)),
        description: v.description.clone(),
        retain_until: v.retain_until,
        mgmt_class: v.mgmt_class.and_then(|c| classes.get(&c.0).cloned()).unwrap_or_default(),
        inserted: v.inserted,
        deactivated: (v.kind == ObjectKind::Backup && !v.active)
            .then(|| v.deactivated.unwrap_or(v.inserted)),
    }
}

/// Operations gathered into messages of about [`MESSAGE_TARGET`] bytes.
struct Outbox {
    tx: tokio::sync::mpsc::Sender<v1::ReplicaBatch>,
    ops: Vec<v1::ReplicaOp>,
    bytes: usize,
    /// Bytes of the messages sent.
    wire: u64,
    /// The stream is gone (the call failed): nothing more is sent.
    lost: bool,
}

impl Outbox {
    /// Queues `op`. A message never grows past [`MESSAGE_MAX`] however large a version's
    /// attributes are: each op is measured as encoded.
    fn push(&mut self, op: Op) {
        let op = v1::ReplicaOp { op: Some(op) };
        let size = op.encoded_len() + 8;
        if self.bytes > 0 && self.bytes + size > MESSAGE_MAX {
            self.flush();
        }
        self.ops.push(op);
        self.bytes += size;
        if self.bytes >= MESSAGE_TARGET {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.ops.is_empty() || self.lost {
            return;
        }
        let batch = v1::ReplicaBatch { ops: std::mem::take(&mut self.ops) };
        self.wire += batch.encoded_len() as u64;
        self.bytes = 0;
        self.lost = self.tx.blocking_send(batch).is_err();
    }
}

/// Runs `repair stgpool`: every chunk an audit marked damaged is fetched back from a version
/// replicated to `r.source` that uses it, verified, written anew and pointed at.
pub(crate) fn repair(
    session: &AdminSession<'_>,
    actor: &str,
    r: v1::RepairRequest,
) -> Result<v1::RepairReply> {
    let state = session.state();
    let catalog = state.store.catalog();
    let server = peer(state, &r.source)?;
    let damaged = catalog.damaged_chunks().map_err(catalog_error)?;
    let fixed = Arc::new(AtomicU64::new(0));
    let shown = Arc::clone(&fixed);
    let count = damaged.len();
    let show = Arc::new(move || format!("{} of {count} damaged chunks repaired", get(&shown)));
    let what = format!("from server {}", server.name);
    let ran = state.run_process("repair stgpool", &what, actor, show, |cancel| {
        let mut problems = Vec::new();
        if damaged.is_empty() {
            return Ok(Finished {
                detail: "no damaged chunks".into(),
                stopped: None,
                value: problems,
            });
        }
        let target = Target::connect(&server)?;
        let wanted: HashSet<_> = damaged.iter().map(|c| c.id).collect();
        let (users, _) = catalog.objects_using(&wanted).map_err(catalog_error)?;
        // Each filespace's node and name, for the target's questions.
        let mut names = HashMap::new();
        for node in catalog.nodes().map_err(catalog_error)? {
            for fs in catalog.filespaces(node.id).map_err(catalog_error)? {
                names.insert(fs.id, (node.name.clone(), fs.name));
            }
        }
        // Where each damaged chunk is used: a version and the chunk's place in it.
        let mut used: HashMap<qsm_catalog::ChunkRowId, Vec<Use<'_>>> = HashMap::new();
        for (object, fs, _) in &users {
            let Some(name) = names.get(fs) else { continue };
            let chunks = catalog.object_chunks(*object).map_err(catalog_error)?;
            for (index, c) in chunks.iter().enumerate().filter(|(_, c)| wanted.contains(&c.id)) {
                used.entry(c.id).or_default().push((*object, index, name));
            }
        }
        let mut good = Vec::new();
        let mut decoder = qsm_codec::FrameDecoder::new();
        let (mut scratch, mut damaged_frame) = (Vec::new(), Vec::new());
        let mut repaired = 0;
        for chunk in &damaged {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            // What is left of the damaged frame: its header, when intact, says which data the
            // copy must hold (its checksum).
            let was = state.store.read_chunk(chunk, &mut damaged_frame).ok();
            let mut why =
                format!("chunk {}: no version replicated to {} uses it", chunk.id.0, server.name);
            for (object, index, (node, fs)) in used.get(&chunk.id).into_iter().flatten() {
                let ask = v1::ReplicaFramesRequest {
                    node: node.clone(),
                    filespace: fs.clone(),
                    chunks: vec![v1::ReplicaChunkAt {
                        origin: object.0 as u64,
                        index: *index as u32,
                    }],
                };
                let copy = fetch_frame(&target, ask).and_then(|(frame, id)| {
                    let codec = check_copy(chunk, &frame, &id, was, &mut decoder, &mut scratch)?;
                    Ok((frame, codec))
                });
                match copy {
                    Ok((frame, codec)) => {
                        let users = used.get(&chunk.id).into_iter().flatten().map(|u| u.0);
                        good.push(qsm_store::Repair {
                            chunk: *chunk,
                            frame,
                            codec,
                            users: users.collect(),
                        });
                        why.clear();
                        break;
                    }
                    Err(e) => {
                        why = format!("chunk {}: the copy on {}: {e}", chunk.id.0, server.name)
                    }
                }
            }
            if !why.is_empty() {
                problems.push(why);
            }
            // Written a few at a time: a damaged container of gigabytes is not held in memory.
            if good.len() >= REPAIR_BATCH {
                repaired += write_repairs(state, &mut good, &mut problems)?;
                fixed.store(repaired, Ordering::Relaxed);
            }
        }
        repaired += write_repairs(state, &mut good, &mut problems)?;
        fixed.store(repaired, Ordering::Relaxed);
        let stopped = cancel.load(Ordering::Relaxed).then(|| "cancelled".to_owned());
        Ok(Finished {
            detail: format!(
                "{} of {} damaged chunks repaired from {}",
                repaired,
                damaged.len(),
                server.name
            ),
            stopped,
            value: problems,
        })
    })?;
    let repaired = get(&fixed);
    let problems = ran.value;
    for p in &problems {
        state.log(qsm_catalog::Severity::Warning, &format!("repair stgpool: {p}"), None, None);
    }
    Ok(v1::RepairReply {
        process: ran.process as u64,
        damaged: damaged.len() as u64,
        repaired,
        unrepaired: (damaged.len() as u64).saturating_sub(repaired),
        problems,
        seconds: ran.seconds,
    })
}

/// Where a chunk is used: the version, the chunk's place in it, its node's and filespace's
/// names.
type Use<'a> = (ObjectId, usize, &'a (String, String));

/// The one frame a Frames call asked for, and the chunk id the target holds with it.
fn fetch_frame(target: &Target, ask: v1::ReplicaFramesRequest) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut stream = target.call(target.client.clone().frames(ask))?;
    let batch = target
        .rt
        .block_on(stream.message())
        .map_err(|s| status(&target.name, s))?
        .ok_or_else(|| ServerError::Failed(format!("server {} sent no frame", target.name)))?;
    let frame = batch
        .frames
        .into_iter()
        .next()
        .ok_or_else(|| ServerError::Failed(format!("server {} sent no frame", target.name)))?;
    if !frame.error.is_empty() {
        return Err(ServerError::Failed(frame.error));
    }
    Ok((frame.data.to_vec(), frame.chunk_id.to_vec()))
}

/// Frames of a repair written and recorded at once.
const REPAIR_BATCH: usize = 64;

/// Writes the copies in `good` and points their chunks at them (emptying `good`); how many
/// were repaired. A chunk that moved or was repaired meanwhile is named in `problems`.
fn write_repairs(
    state: &State,
    good: &mut Vec<qsm_store::Repair>,
    problems: &mut Vec<String>,
) -> Result<u64> {
    if good.is_empty() {
        return Ok(0);
    }
    let repaired = state.store.repair_chunks(good).map_err(crate::node_core::store_error)?;
    for r in good.iter() {
        if !repaired.contains(&r.chunk.id) {
            problems.push(format!("chunk {}: moved or repaired meanwhile", r.chunk.id.0));
        }
    }
    good.clear();
    Ok(repaired.len() as u64)
}

/// A copy must be a whole frame of the chunk's raw and stored length whose checksum holds
/// (for a plaintext frame, over its decoded data), and provably this chunk's: the same data
/// checksum as the damaged frame's header says, when that header is intact, else the chunk's
/// keyed id. A chunk with neither is not repaired: a frame of the same sizes could be another
/// chunk's. Returns the copy's codec.
fn check_copy(
    chunk: &ChunkRef,
    frame: &[u8],
    id: &[u8],
    was: Option<qsm_codec::FrameHeader>,
    decoder: &mut qsm_codec::FrameDecoder,
    scratch: &mut Vec<u8>,
) -> Result<u16> {
    let header = decoder.verify(frame, scratch).map_err(|e| ServerError::Invalid(e.to_string()))?;
    if header.raw_len != chunk.location.raw_len || frame.len() != chunk.location.stored_len as usize
    {
        return Err(ServerError::Invalid(format!(
            "a frame of {} bytes holding {}, where the chunk's has {} holding {}",
            frame.len(),
            header.raw_len,
            chunk.location.stored_len,
            chunk.location.raw_len
        )));
    }
    let same = match (was, chunk.hash) {
        (Some(was), _) => was.checksum == header.checksum && was.is_sealed() == header.is_sealed(),
        (None, Some(hash)) => id == hash.as_slice(),
        (None, None) => {
            return Err(ServerError::Invalid(
                "the damaged frame's header is unreadable and the chunk has no id: nothing \
                 tells that the copy holds this chunk's data"
                    .into(),
            ));
        }
    };
    if !same {
        return Err(ServerError::Invalid("it holds other data than the chunk's".into()));
    }
    Ok(header.codec)
}
