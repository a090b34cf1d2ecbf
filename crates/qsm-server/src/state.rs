//! What every request handler shares.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use qsm_catalog::coord::{Excluded, SessionsOf};
use qsm_catalog::{Coordination, NodeId, ProcessId, ServerId, SessionId, Severity};
use qsm_store::Store;
use qsm_types::ServerError;

use crate::auth::{Session, Sessions};
use crate::config::ServerConfig;
use crate::node_core::catalog_error;

/// The server's state: its store, configuration, open sessions and running processes.
#[derive(Debug)]
pub struct State {
    pub store: Store,
    /// This server's id in the catalog (module `coord`): its sessions, processes and leases
    /// are recorded under it, for the servers sharing the catalog.
    pub server: ServerId,
    pub config: ServerConfig,
    pub sessions: Sessions,
    pub processes: Processes,
    /// Failed logins, lockouts and the bound on concurrent password checks.
    pub logins: crate::logins::Logins,
    /// The streams running, bounded in all and per node.
    pub streams: Arc<crate::streams::Streams>,
    /// This server's name in the catalog: host and process id.
    pub name: String,
    /// The last heartbeat failed (said once, not every 3 s, and again when it recovers).
    pub beat_failing: AtomicBool,
    /// Whether a shared plaintext chunk's data is checked against its id (module
    /// `node_core`): always on a network server, whose nodes may plant data for each other;
    /// not in the embedded server, whose one node is the process itself.
    pub verify_shared_chunks: bool,
    /// What the metrics count from the server's start (module `metrics`).
    pub counters: crate::metrics::Counters,
    /// Alerts on their way to the webhooks (module `alerts`).
    pub alerts: crate::alerts::Alerts,
}

/// The id of a core that could not register (no catalog row has it: ids start at 1).
const UNREGISTERED: ServerId = ServerId(0);

/// What a process's work reports when it ends: its result, a line for the process table and
/// the activity log, and why it stopped early, if it did.
#[derive(Debug)]
pub struct Finished<T> {
    pub value: T,
    pub detail: String,
    pub stopped: Option<String>,
}

/// A process that ran to its end (or stopped early, as `stopped` says).
#[derive(Debug)]
pub struct Ran<T> {
    pub process: i64,
    pub value: T,
    pub stopped: Option<String>,
    pub seconds: f64,
}

impl State {
    /// The core over `store`, registered in its catalog as `name` (module `coord`) with the
    /// lease `config` gives; `verify_shared_chunks` as [`State::verify_shared_chunks`]. When
    /// the registration cannot be written and `required` is false (the embedded server on a
    /// full catalog disk, which must still restore), the core runs unregistered: it holds no
    /// leases, and no process can start.
    pub fn open(
        store: Store,
        config: ServerConfig,
        name: String,
        verify_shared_chunks: bool,
        required: bool,
    ) -> Result<State, String> {
        let lease = i64::try_from(config.lease_seconds).unwrap_or(i64::MAX);
        let server = match store.catalog().register_server(&name, lease) {
            Ok(server) => {
                store.hold_leases(server, lease);
                server
            }
            Err(e) if required => {
                return Err(format!("registering the server in its catalog: {e}"));
            }
            Err(_) => UNREGISTERED,
        };
        Ok(State {
            store,
            server,
            name,
            beat_failing: AtomicBool::new(false),
            sessions: Default::default(),
            processes: Default::default(),
            logins: Default::default(),
            streams: crate::streams::Streams::new(config.max_streams, config.max_node_streams),
            alerts: crate::alerts::Alerts::new(config.alerts.clone()),
            config,
            verify_shared_chunks,
            counters: Default::default(),
        })
    }

    /// Whether the core is registered in its catalog (see [`State::open`]).
    pub fn registered(&self) -> bool {
        self.server != UNREGISTERED
    }

    /// Runs `work` as the server process `kind`, for `actor`: one process of each kind at a
    /// time across the servers sharing the catalog (a second is refused, naming the first and
    /// its server); recorded in the catalog's process table
    /// and the activity log at its start and its end, with `work`'s detail and the time it
    /// took; listed with `progress` while it runs; cancelled through the flag `work` is given
    /// (by `CancelProcess`, or at shutdown).
    pub fn run_process<T>(
        &self,
        kind: &str,
        what: &str,
        actor: &str,
        progress: Arc<dyn Fn() -> String + Send + Sync>,
        work: impl FnOnce(&AtomicBool) -> Result<Finished<T>, ServerError>,
    ) -> Result<Ran<T>, ServerError> {
        let catalog = self.store.catalog();
        let process = match catalog
            .start_process_on(self.server, kind, what, &excluded_by(kind))
            .map_err(catalog_error)?
        {
            Ok(process) => process,
            Err(Excluded { id, kind: running, server }) => {
                let here =
                    if server == self.name { String::new() } else { format!(" on {server}") };
                return Err(ServerError::Refused(if running == kind {
                    format!("{kind} is already running as process {}{here}", id.0)
                } else {
                    format!("{kind} cannot run beside {running}, running as process {}{here}", id.0)
                }));
            }
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let running = Running {
            kind: kind.to_owned(),
            started: qsm_catalog::now(),
            cancel: Arc::clone(&cancel),
            progress,
        };
        let guard = self.processes.start(process.0, running);
        let say = |severity, text: &str| {
            let message = format!("process {}: {kind} {text}", process.0);
            let _ = catalog.log(severity, &message, None, None, Some(process));
        };
        say(Severity::Info, &format!("started by {actor} ({what})"));
        let started = std::time::Instant::now();
        let result = work(&cancel);
        drop(guard);
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(f) => {
                let why = f.stopped.as_ref().map(|w| format!("; {w}")).unwrap_or_default();
                let detail = format!("{}, {seconds:.1} s{why}", f.detail);
                let how = if f.stopped.is_some() { "cancelled" } else { "ended" };
                let _ = catalog.end_process(process, how, &detail);
                say(Severity::Info, &format!("{how}: {detail}"));
                Ok(Ran { process: process.0, value: f.value, stopped: f.stopped, seconds })
            }
            Err(e) => {
                let _ = catalog.end_process(process, "failed", e.message());
                say(Severity::Error, &format!("failed: {}", e.message()));
                Err(e)
            }
        }
    }
}

/// A server process running now (expiration, ...): what it is and how to stop it.
pub struct Running {
    pub kind: String,
    pub started: i64,
    pub cancel: Arc<AtomicBool>,
    /// Progress text, called when listed.
    pub progress: Arc<dyn Fn() -> String + Send + Sync>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("kind", &self.kind).field("started", &self.started).finish()
    }
}

/// Processes that read or rewrite the pool's containers: one of them at a time.
const POOL_PROCESSES: &[&str] = &["reclaim stgpool", "audit stgpool", "repair stgpool"];

/// The kinds of process that keep `kind` from starting while one runs: its own (two
/// expirations would decide the same versions), and for the [`POOL_PROCESSES`] each other (an
/// audit reading a container reclamation deletes would take its chunks for damaged; orphan
/// removal would delete a repair's new container before the repair records it).
pub fn excluded_by(kind: &str) -> Vec<&str> {
    if POOL_PROCESSES.contains(&kind) { POOL_PROCESSES.to_vec() } else { vec![kind] }
}

/// The processes running now, by their catalog id.
#[derive(Debug, Default)]
pub struct Processes(Mutex<BTreeMap<i64, Running>>);

/// A running process's place in [`Processes`]: it is forgotten when this drops, however the
/// process ended (a panic included).
#[derive(Debug)]
pub struct ProcessGuard<'a> {
    processes: &'a Processes,
    id: i64,
}

impl Drop for ProcessGuard<'_> {
    fn drop(&mut self) {
        self.processes.lock().remove(&self.id);
    }
}

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Running>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a running process (the catalog decided it may run: [`excluded_by`]).
    pub fn start(&self, id: i64, running: Running) -> ProcessGuard<'_> {
        self.lock().insert(id, running);
        ProcessGuard { processes: self, id }
    }

    /// Asks every running process to stop (the server is shutting down).
    pub fn cancel_all(&self) {
        for r in self.lock().values() {
            r.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Asks a process to stop; false if none runs with that id.
    pub fn cancel(&self, id: i64) -> bool {
        self.lock().get(&id).map(|r| r.cancel.store(true, Ordering::Relaxed)).is_some()
    }

    /// (id, kind, started, progress) of each running process.
    pub fn list(&self) -> Vec<(i64, String, i64, String)> {
        self.lock().iter().map(|(id, r)| (*id, r.kind.clone(), r.started, (r.progress)())).collect()
    }
}

impl State {
    /// Adds what a node session counted since the last call to its catalog record (for
    /// history, accounting, and `query session` on the other servers).
    pub fn update_record(&self, session: &Session) {
        let (bytes, objects) = session.unrecorded();
        if let Some(record) = session.record
            && (bytes, objects) != (0, 0)
        {
            let _ = self.store.catalog().update_session(record, bytes, objects);
        }
    }

    /// Ends a session `how`: closes it in the catalog (its record too), and for a node's,
    /// says so in the activity log. Once, whichever path ends it first.
    pub fn end_record(&self, session: &Session, how: &str) {
        if !session.end() {
            return;
        }
        self.update_record(session);
        if session.in_catalog() {
            let _ = self.store.catalog().close_session(session.id, how);
        }
        if let Some(record) = session.record {
            self.log(
                Severity::Info,
                &format!(
                    "session {} of node {} {how}: {} bytes, {} objects",
                    session.id,
                    session.account,
                    session.bytes.load(Ordering::Relaxed),
                    session.objects.load(Ordering::Relaxed)
                ),
                session.node,
                Some(record),
            );
        }
    }

    /// Cancels the sessions `which` selects, on this server at once and on the others sharing
    /// the catalog at their next heartbeat; returns how many were found.
    pub fn cancel_sessions(&self, which: SessionsOf<'_>, how: &str) -> Result<u64, ServerError> {
        let here = self.sessions.cancel(which);
        for s in &here {
            self.end_record(s, how);
        }
        let elsewhere = self.store.catalog().cancel_sessions(which).map_err(catalog_error)?;
        Ok(here.len() as u64 + elsewhere)
    }

    /// Asks process `id` to stop, here or on the server running it; whether it runs.
    pub fn cancel_process(&self, id: ProcessId) -> Result<bool, ServerError> {
        if self.processes.cancel(id.0) {
            return Ok(true);
        }
        self.store.catalog().cancel_process(id).map_err(catalog_error)
    }

    /// The server's heartbeat (module `coord`): renews its container leases and records its
    /// processes' progress, and does what other servers asked: cancel sessions and processes.
    /// Servers found dead are logged.
    pub fn beat(&self) {
        // A closed stderr loses the line rather than panicking the heartbeat.
        let say = |line: std::fmt::Arguments<'_>| {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "qsm: {}: {line}", self.name);
        };
        let progress: Vec<(ProcessId, String)> =
            self.processes.list().into_iter().map(|(id, _, _, p)| (ProcessId(id), p)).collect();
        let beat = match self.store.catalog().heartbeat(
            self.server,
            &self.store.open_containers(),
            &progress,
        ) {
            Ok(beat) => {
                if self.beat_failing.swap(false, Ordering::Relaxed) {
                    say(format_args!("the heartbeat is recorded again"));
                }
                beat
            }
            Err(e) => {
                if !self.beat_failing.swap(true, Ordering::Relaxed) {
                    say(format_args!(
                        "warning: the heartbeat could not be recorded: {e}; other servers on \
                         the catalog take this one for dead after {} s",
                        self.config.lease_seconds
                    ));
                }
                return;
            }
        };
        for id in beat.cancel_sessions {
            // A session ended meanwhile is closed in the catalog by its own end.
            for s in self.sessions.cancel(SessionsOf::Id(id)) {
                self.end_record(&s, "cancelled from another server");
            }
        }
        for id in beat.cancel_processes {
            self.processes.cancel(id.0);
        }
        for name in beat.lost {
            self.log(
                Severity::Warning,
                &format!(
                    "server {name} stopped answering (no heartbeat within its lease): its \
                     sessions and processes were ended and its containers left to orphan removal"
                ),
                None,
                None,
            );
        }
        if beat.revived {
            self.log(
                Severity::Error,
                &format!(
                    "this server ({}) had been taken for dead: its heartbeat came later than its \
                     lease of {} s; its sessions are no longer listed on other servers",
                    self.name, self.config.lease_seconds
                ),
                None,
                None,
            );
        }
    }

    /// Appends to the activity log. A log that cannot be written must not fail what it
    /// describes, so errors are dropped.
    pub fn log(
        &self,
        severity: Severity,
        message: &str,
        node: Option<NodeId>,
        session: Option<SessionId>,
    ) {
        let _ = self.store.catalog().log(severity, message, node, session, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(kind: &str) -> Running {
        Running {
            kind: kind.into(),
            started: 0,
            cancel: Arc::new(AtomicBool::new(false)),
            progress: Arc::new(String::new),
        }
    }

    #[test]
    fn one_process_of_a_kind_and_pool_processes_exclude_each_other() {
        assert_eq!(excluded_by("expire inventory"), ["expire inventory"]);
        assert_eq!(excluded_by("audit stgpool"), POOL_PROCESSES);
        assert_eq!(excluded_by("reclaim stgpool"), POOL_PROCESSES);
        let p = Processes::default();
        let reclaim = p.start(1, running("reclaim stgpool"));
        let expire = p.start(4, running("expire inventory"));
        assert_eq!(p.list().len(), 2);
        assert!(p.cancel(4) && !p.cancel(9));
        drop((reclaim, expire));
        assert!(p.list().is_empty());
    }
}
