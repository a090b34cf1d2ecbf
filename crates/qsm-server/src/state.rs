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

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Running>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a running process.
    pub fn start(&self, id: i64, running: Running) {
        self.lock().insert(id, running);
    }

    /// Forgets an ended process.
    pub fn end(&self, id: i64) {
        self.lock().remove(&id);
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
