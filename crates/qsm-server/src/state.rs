//! What every request handler shares.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use qsm_catalog::{NodeId, SessionId, Severity};
use qsm_store::Store;
use tonic::Status;

use crate::auth::{Session, Sessions};
use crate::config::ServerConfig;
use crate::node::catalog_status;

/// The server's state: its store, configuration, open sessions and running processes.
#[derive(Debug)]
pub struct State {
    pub store: Store,
    pub config: ServerConfig,
    pub sessions: Sessions,
    pub processes: Processes,
    /// Failed logins, lockouts and the bound on concurrent password checks.
    pub logins: crate::logins::Logins,
    /// The streams running, bounded in all and per node.
    pub streams: Arc<crate::streams::Streams>,
}

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
    /// Runs `work` as the server process `kind`, for `actor`: one process of each kind at a
    /// time (a second is refused, naming the first); recorded in the catalog's process table
    /// and the activity log at its start and its end, with `work`'s detail and the time it
    /// took; listed with `progress` while it runs; cancelled through the flag `work` is given
    /// (by `CancelProcess`, or at shutdown).
    pub fn run_process<T>(
        &self,
        kind: &str,
        what: &str,
        actor: &str,
        progress: Arc<dyn Fn() -> String + Send + Sync>,
        work: impl FnOnce(&AtomicBool) -> Result<Finished<T>, Status>,
    ) -> Result<Ran<T>, Status> {
        let catalog = self.store.catalog();
        let process = catalog.start_process(kind, what).map_err(catalog_status)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let running = Running {
            kind: kind.to_owned(),
            started: qsm_catalog::now(),
            cancel: Arc::clone(&cancel),
            progress,
        };
        let guard = match self.processes.start(process.0, running) {
            Ok(guard) => guard,
            Err((other, running)) => {
                let why = if running == kind {
                    format!("{kind} is already running as process {other}")
                } else {
                    format!("{kind} cannot run beside {running}, running as process {other}")
                };
                let _ = catalog.end_process(process, "failed", &why);
                return Err(Status::failed_precondition(why));
            }
        };
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
            Err(status) => {
                let _ = catalog.end_process(process, "failed", status.message());
                say(Severity::Error, &format!("failed: {}", status.message()));
                Err(status)
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
const POOL_PROCESSES: &[&str] = &["reclaim stgpool", "audit stgpool"];

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

    /// Registers a running process, unless one of its kind runs (then its id is the error):
    /// one of each kind at a time, so two expirations never decide the same versions. The
    /// [`POOL_PROCESSES`] exclude each other too: an audit reading a container reclamation
    /// deletes would take its chunks for damaged.
    pub fn start(&self, id: i64, running: Running) -> Result<ProcessGuard<'_>, (i64, String)> {
        let mut map = self.lock();
        let pool = |kind: &str| POOL_PROCESSES.contains(&kind);
        if let Some((other, _)) = map
            .iter()
            .find(|(_, r)| r.kind == running.kind || (pool(&r.kind) && pool(&running.kind)))
        {
            return Err((*other, map[other].kind.clone()));
        }
        map.insert(id, running);
        Ok(ProcessGuard { processes: self, id })
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
    /// Copies a node session's counters into its catalog record (for history and accounting).
    pub fn update_record(&self, session: &Session) {
        if let Some(record) = session.record {
            let _ = self.store.catalog().update_session(
                record,
                session.bytes.load(Ordering::Relaxed),
                session.objects.load(Ordering::Relaxed),
            );
        }
    }

    /// Closes a node session's catalog record, and says so in the activity log.
    pub fn end_record(&self, session: &Session, how: &str) {
        self.update_record(session);
        if let Some(record) = session.record {
            let _ = self.store.catalog().end_session(record, how);
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
        let p = Processes::default();
        let reclaim = p.start(1, running("reclaim stgpool")).unwrap();
        assert_eq!(
            p.start(2, running("reclaim stgpool")).unwrap_err(),
            (1, "reclaim stgpool".into())
        );
        assert_eq!(p.start(3, running("audit stgpool")).unwrap_err().0, 1);
        let expire = p.start(4, running("expire inventory")).unwrap();
        let backup = p.start(5, running("backup db")).unwrap();
        drop(reclaim);
        let audit = p.start(6, running("audit stgpool")).unwrap();
        assert_eq!(p.list().len(), 3);
        drop((audit, expire, backup));
        assert!(p.list().is_empty());
    }
}
