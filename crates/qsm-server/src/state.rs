//! What every request handler shares.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use qsm_catalog::{NodeId, SessionId, Severity};
use qsm_store::Store;

use crate::auth::{Session, Sessions};
use crate::config::ServerConfig;

/// The server's state: its store, configuration, open sessions and running processes.
#[derive(Debug)]
pub struct State {
    pub store: Store,
    pub config: ServerConfig,
    pub sessions: Sessions,
    pub processes: Processes,
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

    /// The id of the running process of `kind`, if one runs: one of each kind at a time, so
    /// two expirations never decide the same versions.
    pub fn running(&self, kind: &str) -> Option<i64> {
        self.lock().iter().find(|(_, r)| r.kind == kind).map(|(id, _)| *id)
    }

    /// Registers a running process, unless one of its kind runs (then its id is the error).
    pub fn start(&self, id: i64, running: Running) -> Result<ProcessGuard<'_>, i64> {
        let mut map = self.lock();
        if let Some((other, _)) = map.iter().find(|(_, r)| r.kind == running.kind) {
            return Err(*other);
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
