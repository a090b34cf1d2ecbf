//! What every request handler shares.

use std::sync::atomic::Ordering;

use qsm_store::Store;

use crate::auth::{Session, Sessions};
use crate::config::ServerConfig;

/// The server's state: its store, configuration and open sessions.
#[derive(Debug)]
pub struct State {
    pub store: Store,
    pub config: ServerConfig,
    pub sessions: Sessions,
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

    /// Closes a node session's catalog record.
    pub fn end_record(&self, session: &Session, how: &str) {
        self.update_record(session);
        if let Some(record) = session.record {
            let _ = self.store.catalog().end_session(record, how);
        }
    }
}
