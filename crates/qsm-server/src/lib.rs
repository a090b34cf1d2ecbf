//! # qsm-server: the QSM server
//!
//! Serves the protocol of `docs/PROTOCOL.md` (gRPC over HTTP/2) on TCP, with TLS unless told
//! otherwise, and on a local socket. Nodes log in with a password (argon2id hashes in the
//! catalog) and get a session token; every request acts only on the session's own node.
//! Frames arrive as the client made them and are appended to the pool unchanged; transactions
//! commit through the store's protocol (`qsm_store`), bounded by `txn_group_max` objects and
//! `txn_byte_limit` bytes.

pub mod admin;
pub mod admin_core;
pub mod alerts;
pub mod anomaly;
pub mod auth;
pub mod config;
pub mod conns;
pub mod dbcopy;
pub mod embedded;
pub mod http;
pub mod login;
pub mod logins;
pub mod metrics;
pub mod node;
pub mod node_core;
pub mod replica;
pub mod replica_core;
pub mod replication;
pub mod schedules;
pub mod state;
pub mod streams;
pub(crate) mod tls;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use qsm_catalog::Coordination;
use qsm_proto::v1::{
    admin_server::AdminServer, node_server::NodeServer, replica_server::ReplicaServer,
};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

pub use config::ServerConfig;
pub use embedded::Embedded;
pub use state::State;

pub use qsm_types::ServerError;

/// What a started server listens on, for the operator (and for tests that asked for port 0).
#[derive(Debug, Clone)]
pub struct Listening {
    /// `https://ADDR` or `http://ADDR` per TCP listener, then `unix:PATH`.
    pub urls: Vec<String>,
    /// The certificate clients must trust (for TLS listeners).
    pub certificate: Option<std::path::PathBuf>,
    /// `http://ADDR/metrics`, where Prometheus scrapes (`metrics_listen`).
    pub metrics: Option<String>,
    /// `https://ADDR/`, the web console and its API (`http_listen`).
    pub console: Option<String>,
}

/// How often ended sessions are looked for.
const REAP_EVERY: Duration = Duration::from_secs(3);
/// How often schedules' windows are looked at.
const SCHEDULE_EVERY: Duration = Duration::from_secs(2);
/// How often (in heartbeats) the pool's file system is checked for a `pool-full` alert.
const POOL_CHECK_BEATS: u64 = 20;
/// How long a session whose connection closed waits for its client to come back on another:
/// a client's channel reconnects within a second or two.
const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// Binds a listener of the HTTP front ends before the server says it is ready, so a taken
/// port fails the start; `what` names it in the error.
async fn bind(addr: &str, what: &str) -> Result<(TcpListener, std::net::SocketAddr), ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Failed(format!("cannot listen for {what} on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(|e| ServerError::Failed(e.to_string()))?;
    Ok((listener, local))
}

/// Opens the store, binds every listener, calls `ready`, and serves until SIGINT or SIGTERM.
pub fn run(config: ServerConfig, ready: impl FnOnce(&Listening)) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("qsm-server")
        .build()
        .map_err(|e| ServerError::Failed(format!("cannot start the runtime: {e}")))?;
    rt.block_on(serve(config, ready))
}

/// Creates `dir` owner-only if it does not exist: the pool holds every backed-up file
/// unencrypted, including ones that were private at the source.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), ServerError> {
    // Each new level is synced into its parent: the catalog and pool below it must not lose
    // their directory to a power cut.
    qsm_types::durable::create_dir_all(dir, 0o700)
        .map_err(|e| ServerError::Failed(format!("creating {}: {e}", dir.display())))
}

async fn serve(config: ServerConfig, ready: impl FnOnce(&Listening)) -> Result<(), ServerError> {
    create_private_dir(&config.data_dir)?;
    let _lock = dbcopy::lock(&config.data_dir).map_err(ServerError::Failed)?;
    let opening = config.clone();
    let store = tokio::task::spawn_blocking(move || opening.open_store())
        .await
        .map_err(|e| ServerError::Failed(format!("opening the store: {e}")))?
        .map_err(|e| ServerError::Failed(format!("opening the store: {e}")))?;
    for warning in store.warnings() {
        eprintln!("qsm server: warning: {warning}");
        let _ = store.catalog().log(qsm_catalog::Severity::Warning, warning, None, None, None);
    }
    if let Ok(Some(t)) = store.catalog().state_value(qsm_store::RESTORED_AT)
        && t != 0
    {
        let warning = qsm_store::StoreError::Restored(t).to_string();
        eprintln!("qsm server: warning: {warning}");
        let _ = store.catalog().log(qsm_catalog::Severity::Warning, &warning, None, None, None);
    }
    // Registered where the servers sharing the catalog see it (module `qsm_catalog::coord`).
    let host = tls::hostname().unwrap_or_else(|| "localhost".into());
    let name = format!("{host} pid {}", std::process::id());
    let state = Arc::new(
        State::open(store, config.clone(), name, true, true).map_err(ServerError::Failed)?,
    );
    let node = NodeServer::new(node::NodeService { state: Arc::clone(&state) })
        .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
        .max_encoding_message_size(qsm_proto::MAX_MESSAGE);
    let admin = AdminServer::new(admin::AdminService { state: Arc::clone(&state) })
        .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
        .max_encoding_message_size(qsm_proto::MAX_MESSAGE);
    let replica = ReplicaServer::new(replica::ReplicaService { state: Arc::clone(&state) })
        .max_decoding_message_size(qsm_proto::MAX_MESSAGE)
        .max_encoding_message_size(qsm_proto::MAX_MESSAGE);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut listening =
        Listening { urls: Vec::new(), certificate: None, metrics: None, console: None };
    // Closed TCP connections orphan the sessions logged in over them (module `conns`).
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let orphaning = Arc::clone(&state);
    let orphaner = tokio::spawn(async move {
        while let Some(conn) = closed_rx.recv().await {
            orphaning.sessions.orphan(conn);
        }
    });
    let mut tasks = tokio::task::JoinSet::new();
    let tls = if config.plaintext || config.listen.is_empty() {
        None
    } else {
        let (identity, cert) = tls::identity(&config)?;
        listening.certificate = Some(cert);
        Some(tonic::transport::ServerTlsConfig::new().identity(identity))
    };
    for addr in &config.listen {
        let addr: SocketAddr =
            tokio::net::lookup_host(addr).await.ok().and_then(|mut a| a.next()).ok_or_else(
                || ServerError::Failed(format!("cannot resolve the listen address {addr}")),
            )?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::Failed(format!("cannot listen on {addr}: {e}")))?;
        let local = listener.local_addr().map_err(|e| ServerError::Failed(e.to_string()))?;
        let mut builder = Server::builder()
            .layer(metrics::Timed(Arc::clone(&state)))
            .tcp_nodelay(true)
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20)
            // A peer that vanished without closing (its machine lost, a cable pulled) is
            // found within 20 s: its connection then closes and its sessions end (`conns`).
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)));
        let scheme = match &tls {
            Some(t) => {
                builder = builder
                    .tls_config(t.clone())
                    .map_err(|e| ServerError::Failed(format!("TLS configuration: {e}")))?;
                "https"
            }
            None => "http",
        };
        listening.urls.push(format!("{scheme}://{local}"));
        let router = builder
            .add_service(node.clone())
            .add_service(admin.clone())
            .add_service(replica.clone());
        let closed = closed_tx.clone();
        let incoming = tokio_stream::StreamExt::map(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            move |accepted| accepted.map(|tcp| conns::tcp(tcp, closed.clone())),
        );
        let serving = router.serve_with_incoming_shutdown(incoming, stopped());
        tasks.spawn(async move { serving.await.map_err(|e| e.to_string()) });
    }
    if let Some(path) = config.socket_path() {
        if let Some(parent) = path.parent() {
            create_private_dir(parent)?;
        }
        // A socket left by a server that died; a live server holds the pool's lock, so it
        // cannot be running here.
        if path.exists() {
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path).map_err(|e| {
            ServerError::Failed(format!("cannot listen on {}: {e}", path.display()))
        })?;
        listening.urls.push(format!("unix:{}", path.display()));
        let router = Server::builder()
            .layer(metrics::Timed(Arc::clone(&state)))
            .add_service(node.clone())
            .add_service(admin.clone());
        let closed = closed_tx.clone();
        let incoming = tokio_stream::StreamExt::map(UnixListenerStream::new(listener), move |a| {
            a.map(|unix| conns::unix(unix, closed.clone()))
        });
        let serving = router.serve_with_incoming_shutdown(incoming, stopped());
        tasks.spawn(async move { serving.await.map_err(|e| e.to_string()) });
    }
    if listening.urls.is_empty() {
        return Err(ServerError::Failed("nothing to listen on: give --listen or --socket".into()));
    }
    if let Some(addr) = &config.metrics_listen {
        let (listener, local) = bind(addr, "metrics").await?;
        listening.metrics = Some(format!("http://{local}/metrics"));
        let serving = metrics::serve(listener, Arc::clone(&state), stopped());
        tasks.spawn(async move { serving.await.map_err(|e| e.to_string()) });
    }
    if let Some(addr) = &config.http_listen {
        let tls = tls::http_config(&config)?;
        let (listener, local) = bind(addr, "HTTPS").await?;
        listening.console = Some(format!("https://{local}/"));
        if listening.certificate.is_none() {
            listening.certificate = Some(config.tls_paths().0);
        }
        let serving = http::serve(listener, tls, Arc::clone(&state), stopped());
        tasks.spawn(async move { serving.await.map_err(|e| e.to_string()) });
    }
    ready(&listening);

    // Sessions left idle are ended, and those whose connection closed (a client killed, its
    // machine gone) within seconds unless a request reclaimed them.
    let idle = Duration::from_secs(config.idle_timeout_minutes.max(1) * 60);
    let reaper_state = Arc::clone(&state);
    let reaper = tokio::spawn(async move {
        loop {
            tokio::time::sleep(REAP_EVERY).await;
            let state = Arc::clone(&reaper_state);
            let _ = tokio::task::spawn_blocking(move || {
                for (s, how) in state.sessions.expire(idle, ORPHAN_GRACE) {
                    state.end_record(&s, how);
                }
            })
            .await;
        }
    });
    // The heartbeat apart from the reaper, so that neither waits for the other's catalog
    // writes (module `qsm_catalog::coord`).
    let beating = Arc::clone(&state);
    let heart = tokio::spawn(async move {
        for beat in 0u64.. {
            let state = Arc::clone(&beating);
            let _ = tokio::task::spawn_blocking(move || {
                if beat % POOL_CHECK_BEATS == 0 {
                    state.check_pool_space();
                }
                if beat > 0 {
                    state.beat();
                }
            })
            .await;
            tokio::time::sleep(REAP_EVERY).await;
        }
    });
    let alerting = tokio::spawn(alerts::deliver(Arc::clone(&state)));
    // Schedules' windows are looked at every few seconds (periods may be that short).
    let scheduling = Arc::clone(&state);
    let scheduler = tokio::spawn(async move {
        loop {
            tokio::time::sleep(SCHEDULE_EVERY).await;
            let state = Arc::clone(&scheduling);
            let _ = tokio::task::spawn_blocking(move || schedules::tick(&state)).await;
        }
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| ServerError::Failed(format!("cannot watch for SIGTERM: {e}")))?;
    let failure = tokio::select! {
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
        Some(done) = tasks.join_next() => Some(match done {
            Ok(Ok(())) => "a listener stopped".to_string(),
            Ok(Err(e)) => format!("a listener failed: {e}"),
            Err(e) => format!("a listener panicked: {e}"),
        }),
    };
    let _ = stop_tx.send(true);
    reaper.abort();
    heart.abort();
    scheduler.abort();
    orphaner.abort();
    // Expiration and reclamation stop at their next transaction boundary.
    state.processes.cancel_all();
    // Let running transactions see their streams end; what was committed stays committed.
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    for s in state.sessions.list() {
        state.end_record(&s, "server stopped");
    }
    let stopping = Arc::clone(&state);
    let _ = tokio::task::spawn_blocking(move || {
        stopping.store.catalog().stop_server(stopping.server, "failed: its server stopped")
    })
    .await;
    // Alerts raised by the stop (backups cut short) get a few seconds to go out.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while state.alerts.sending() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    alerting.abort();
    if let Some(path) = config.socket_path() {
        let _ = std::fs::remove_file(path);
    }
    match failure {
        Some(why) => Err(ServerError::Failed(why)),
        None => Ok(()),
    }
}
