//! The embedded server: the server core opened in this process on `$QSM_HOME` (default
//! `~/.local/share/qsm`), catalog and pool created on first use, with one node, `local`. It
//! is the same core a network server runs, reached without a socket, so a node's rights and
//! every check are the same by construction.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use qsm_catalog::{Coordination, NodeId};
use qsm_types::ServerError;
use qsm_types::model::{Filespace, FilespaceId, NewObject, ObjectId, ObjectVersion, TxnLimits};
use qsm_types::node::{self, ClassInfo, DedupInfo, Fetched, Scope, Uploaded};

use qsm_proto::{AdminApi, v1};

use crate::admin_core::{Actor, AdminSession};
use crate::config::ServerConfig;
use crate::node_core::{NodeFetch, NodeSession, NodeUpload, Result};
use crate::state::State;

/// The node an embedded server backs up as.
pub const LOCAL_NODE: &str = "local";
/// How often the embedded core renews its leases, as a network server does.
const BEAT_EVERY: Duration = Duration::from_secs(3);

/// `$QSM_HOME`, or `$XDG_DATA_HOME/qsm`, or `~/.local/share/qsm`.
pub fn default_home() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os("QSM_HOME") {
        return Ok(PathBuf::from(home));
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    base.map(|b| b.join("qsm")).ok_or_else(|| {
        ServerError::Invalid(
            "neither QSM_HOME nor HOME is set: say where to keep the data with QSM_HOME".into(),
        )
    })
}

/// The configuration of the embedded core in `home`: the layout of a server's data directory
/// (so `qsm server --data-dir` can serve the same store), no listener, and transaction limits
/// as large as a client may ask (the client's own options decide).
pub fn config(home: &Path) -> ServerConfig {
    ServerConfig {
        data_dir: home.to_path_buf(),
        listen: Vec::new(),
        socket: Some(PathBuf::new()),
        txn_group_max: TxnLimits::MAX_GROUP,
        txn_byte_limit: TxnLimits::MAX_BYTES,
        ..ServerConfig::default()
    }
}

/// The server core opened in this process.
#[derive(Debug)]
pub struct Embedded {
    core: Arc<State>,
    node: NodeId,
    place: String,
    /// Dropped to stop the heartbeat.
    stop_beat: Option<mpsc::Sender<()>>,
    beat: Option<std::thread::JoinHandle<()>>,
}

impl Embedded {
    /// Opens the embedded server in `home`, creating catalog, pool and node on first use.
    pub fn open(home: &Path) -> Result<Embedded> {
        crate::create_private_dir(home)?;
        let store = qsm_store::open_local(&home.join("catalog.db"), &home.join("pool"), "local")
            .map_err(crate::node_core::store_error)?;
        let catalog = store.catalog();
        let node = match catalog.node(LOCAL_NODE).map_err(crate::node_core::catalog_error)? {
            Some(n) => n.id,
            // The embedded node never authenticates: it is this machine's own store.
            None => catalog
                .register_node(
                    LOCAL_NODE,
                    "!embedded",
                    qsm_catalog::standard_domain(catalog.as_ref())
                        .map_err(crate::node_core::catalog_error)?,
                )
                .map_err(crate::node_core::catalog_error)?,
        };
        let host = crate::tls::hostname().unwrap_or_else(|| "localhost".into());
        let name = format!("{host} pid {} (embedded)", std::process::id());
        // The client of the embedded core is this process: its shared chunks are its own.
        let core = Arc::new(
            State::open(store, config(home), name, false, false).map_err(ServerError::Failed)?,
        );
        let (stop_beat, beat) = if core.registered() { start_beat(&core) } else { (None, None) };
        Ok(Embedded {
            core,
            node,
            place: format!("embedded store in {}", home.display()),
            stop_beat,
            beat,
        })
    }

    /// The core, for administration.
    pub fn core(&self) -> &Arc<State> {
        &self.core
    }

    /// Warnings about the store as it was opened (a pool directory others can read, a full
    /// catalog disk), for the user's stderr.
    pub fn warnings(&self) -> &[String] {
        self.core.store.warnings()
    }

    /// An administrator's view of the store: its owner's, with every privilege (whoever can
    /// read `$QSM_HOME` holds the data anyway). `who` names them in the activity log.
    pub fn admin(&self, who: impl Into<String>) -> AdminSession<'_> {
        AdminSession::new(&self.core, Actor::Owner(who.into()))
    }

    /// Runs expiration for the local node as its policy says. A network server runs it when
    /// an administrator or a schedule asks; the embedded store has neither, so a backup runs
    /// it when it ends, and its pool does not only grow.
    pub fn expire(&self) -> Result<v1::ExpireReply> {
        self.admin("the embedded store, after a backup").expire_inventory(v1::ExpireRequest {
            nodes: vec![LOCAL_NODE.into()],
            ..v1::ExpireRequest::default()
        })
    }

    /// The local node's view, as the client's server interface.
    pub fn server(&self) -> EmbeddedNode<'_> {
        EmbeddedNode { session: NodeSession::new(&self.core, self.node, None), place: &self.place }
    }
}

/// Renews the core's leases while it is open: a backup that runs for hours keeps its
/// containers safe from another process's reclamation.
fn start_beat(
    core: &Arc<State>,
) -> (Option<mpsc::Sender<()>>, Option<std::thread::JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel::<()>();
    let core = Arc::clone(core);
    let beat = std::thread::Builder::new().name("qsm-heartbeat".into()).spawn(move || {
        while let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(BEAT_EVERY) {
            core.beat();
        }
    });
    match beat {
        Ok(handle) => (Some(tx), Some(handle)),
        // Without a heartbeat the lease lapses: other processes then go by the containers'
        // times (module `qsm_store`), as they do for any writer that has not leased yet.
        Err(_) => (None, None),
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.stop_beat = None;
        if let Some(beat) = self.beat.take() {
            let _ = beat.join();
        }
        if self.core.registered() {
            let _ = self.core.store.catalog().stop_server(self.core.server, "ended");
        }
    }
}

/// The embedded server's local node, behind the client's server interface.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedNode<'a> {
    session: NodeSession<'a>,
    place: &'a str,
}

impl node::Server for EmbeddedNode<'_> {
    fn describe(&self) -> String {
        self.place.to_owned()
    }

    fn stores_here(&self) -> bool {
        true
    }

    fn filespaces(&self) -> Result<Vec<Filespace>> {
        self.session.filespaces()
    }

    fn open_filespace(&self, name: &str, create: bool) -> Result<Option<FilespaceId>> {
        Ok(self.session.open_filespace(name, create)?.map(|f| f.id))
    }

    fn inventory(
        &self,
        filespace: FilespaceId,
        scope: Scope,
        f: &mut dyn FnMut(ObjectVersion) -> Result<()>,
    ) -> Result<()> {
        self.session.inventory(filespace, scope == Scope::All, &mut |v| f(v.clone()))
    }

    fn object(&self, id: ObjectId) -> Result<Option<ObjectVersion>> {
        self.session.object(id)
    }

    fn upload(
        &self,
        filespace: FilespaceId,
        limits: TxnLimits,
        kind: node::UploadKind,
    ) -> Result<Box<dyn node::Upload + '_>> {
        Ok(Box::new(self.session.upload(filespace, limits, kind)?))
    }

    fn fetch(&self, objects: Vec<ObjectId>) -> Result<Box<dyn node::Fetch + '_>> {
        Ok(Box::new(self.session.fetch(objects)?))
    }

    fn dedup_info(&self) -> Result<DedupInfo> {
        self.session.dedup_info()
    }

    fn have_chunks(&self, ids: &[[u8; 32]], sealed: bool) -> Result<Vec<bool>> {
        // The interface takes any number; the core answers a bounded number a call.
        let mut have = Vec::with_capacity(ids.len());
        for part in ids.chunks(crate::node_core::HAVE_MAX) {
            have.extend(self.session.have_chunks(part, sealed)?);
        }
        Ok(have)
    }

    fn put_key(&self, key_file: &[u8]) -> Result<()> {
        self.session.put_key(key_file)
    }

    fn get_key(&self) -> Result<Option<Vec<u8>>> {
        self.session.get_key()
    }

    fn mgmt_classes(&self) -> Result<Vec<ClassInfo>> {
        Ok(self.session.policy()?.1)
    }

    fn schedules(&self, fresh: bool) -> Result<node::Schedules> {
        self.session.schedules(fresh)
    }

    fn start_event(&self, schedule: &str, window: qsm_catalog::Timestamp) -> Result<Option<i64>> {
        self.session.start_event(schedule, window)
    }

    fn end_event(&self, event: i64, result: qsm_catalog::RunResult, detail: &str) -> Result<()> {
        self.session.end_event(event, result, detail)
    }

    fn client_options(&self) -> Result<Option<qsm_catalog::OptionSet>> {
        self.session.client_options()
    }
}

impl node::Upload for NodeUpload<'_> {
    fn begin_object(
        &mut self,
        object: NewObject,
        size_hint: u64,
        class: Option<&str>,
    ) -> Result<()> {
        NodeUpload::begin_object(self, object, size_hint, class).map(|_| ())
    }

    fn append_frame(&mut self, frame: &[u8]) -> Result<()> {
        NodeUpload::append_frame(self, frame)
    }

    fn append_chunk(&mut self, frame: &[u8], id: &[u8; 32], shared: bool) -> Result<()> {
        NodeUpload::append_chunk(self, frame, id, shared)
    }

    fn reference_chunk(&mut self, id: &[u8; 32], sealed: bool) -> Result<()> {
        NodeUpload::reference_chunk(self, id, sealed)
    }

    fn end_object(&mut self) -> Result<()> {
        NodeUpload::end_object(self)
    }

    fn abandon_object(&mut self) -> Result<()> {
        NodeUpload::abandon_object(self);
        Ok(())
    }

    fn deactivate(&mut self, path: &[u8]) -> Result<()> {
        NodeUpload::deactivate(self, path)
    }

    fn deactivate_tree(&mut self, path: &[u8]) -> Result<()> {
        NodeUpload::deactivate_tree(self, path)
    }

    fn finish(self: Box<Self>, warnings: u64) -> Result<Uploaded> {
        NodeUpload::finish(*self, warnings)
    }
}

impl node::Fetch for NodeFetch<'_> {
    fn next(&mut self, frame: &mut Vec<u8>) -> Result<Option<Fetched>> {
        NodeFetch::next(self, frame)
    }
}
