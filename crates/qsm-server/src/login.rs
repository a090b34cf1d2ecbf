//! Logins, written once for every front end: a node's or an administrator's password
//! checked (argon2id, refused alike for an unknown account and a wrong password), failures
//! counted towards lockouts, and the session opened where every server sharing the catalog
//! sees it. The front end checks sizes and lockouts before (module `logins`), and bounds how
//! many password checks run at once.

use std::sync::Arc;

use qsm_catalog::{CatalogError, Coordination, Severity};
use qsm_types::ServerError;

use crate::auth::{self, NewSession, Session};
use crate::logins;
use crate::node_core::catalog_error;
use crate::state::State;

/// A login as a front end received it.
#[derive(Debug)]
pub struct LoginAttempt {
    /// The node's or the administrator's name.
    pub account: String,
    /// Its password.
    pub password: String,
    /// An administrator's login.
    pub admin: bool,
    /// What the client says it is (host, version), for the session list.
    pub client: String,
    /// Where it comes from, for the session list and the activity log.
    pub peer: String,
    /// The connection it came over (module `conns`).
    pub conn: Option<crate::conns::Conn>,
}

/// What `a`'s failures are counted against: its account (an administrator's apart from a
/// node of the same name) and where it comes from.
pub fn login_keys(a: &LoginAttempt) -> [logins::Key; 2] {
    let account = if a.admin { format!("admin:{}", a.account) } else { a.account.clone() };
    [logins::Key::Account(account), logins::Key::Source(logins::source_of(&a.peer))]
}

impl State {
    /// Checks `a`'s sizes and whether its account or source is locked out: before any hash
    /// is computed, and without logging again. Returns the lockout keys for
    /// [`State::login`].
    pub fn login_allowed(&self, a: &mut LoginAttempt) -> Result<[logins::Key; 2], ServerError> {
        // Sizes first: nothing longer than an account can be is hashed, looked up or logged.
        if a.account.is_empty() || a.account.len() > logins::MAX_ACCOUNT {
            return Err(ServerError::invalid(format!(
                "an account name is 1 to {} bytes",
                logins::MAX_ACCOUNT
            )));
        }
        if a.password.len() > logins::MAX_PASSWORD {
            return Err(ServerError::invalid(format!(
                "a password is at most {} bytes",
                logins::MAX_PASSWORD
            )));
        }
        qsm_types::truncate_utf8(&mut a.client, logins::MAX_CLIENT);
        let keys = login_keys(a);
        self.logins
            .check(&keys, std::time::Instant::now())
            .map_err(|locked| ServerError::Busy(locked.to_string()))?;
        Ok(keys)
    }

    /// Checks `a`'s password and opens its session; returns it with its token. Blocks
    /// (argon2id takes tens of milliseconds by design, and the catalog is written).
    pub fn login(
        &self,
        a: LoginAttempt,
        keys: [logins::Key; 2],
    ) -> Result<(Arc<Session>, String), ServerError> {
        let peer = a.peer.clone();
        // Again, now that this login's turn came: guesses sent all at once passed the first
        // check together, and the failures of those before it count.
        self.logins
            .check(&keys, std::time::Instant::now())
            .map_err(|locked| ServerError::Busy(locked.to_string()))?;
        let catalog = self.store.catalog();
        let refused = || {
            self.counters.logins_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for locked in self.logins.failed(&keys, std::time::Instant::now()) {
                self.log(
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
            ServerError::unauthenticated("wrong account name or password")
        };
        // Administrators and nodes log in alike: an unknown account and a wrong password are
        // refused the same way, after the same work.
        let (what, found) = if a.admin {
            let admin = catalog.admin(&a.account).map_err(catalog_error)?;
            ("administrator", admin.map(|x| (x.password_hash, x.locked, None)))
        } else {
            let node = catalog.node(&a.account).map_err(catalog_error)?;
            ("node", node.map(|n| (n.password_hash, n.locked, Some(n.id))))
        };
        let Some((hash, locked, node)) = found else {
            auth::verify_nothing(&a.password);
            self.log(
                Severity::Warning,
                &format!("failed login of unknown {what} {:?} from {peer}", a.account),
                None,
                None,
            );
            return Err(refused());
        };
        if !auth::verify_password(&a.password, &hash) {
            self.log(
                Severity::Warning,
                &format!("failed login of {what} {} from {peer}: wrong password", a.account),
                node,
                None,
            );
            return Err(refused());
        }
        if locked {
            let ask = if a.admin { "" } else { ": ask an administrator" };
            return Err(ServerError::denied(format!("{what} {} is locked{ask}", a.account)));
        }
        self.logins.succeeded(&keys);
        self.counters.logins_succeeded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = auth::new_token().map_err(ServerError::failed)?;
        // Recorded where every server sharing the catalog sees it. A full catalog disk
        // still lets the node read (queries, restores): the session goes unrecorded, and
        // whatever it tries to write fails naming the full disk.
        let (id, record, in_catalog) =
            match catalog.open_session(self.server, &a.account, node, &a.client, &peer) {
                Ok((id, record)) => (id, record, true),
                Err(CatalogError::DiskFull { .. }) => (self.sessions.local_id(), None, false),
                Err(e) => return Err(catalog_error(e)),
            };
        let new = NewSession {
            id,
            account: a.account.clone(),
            node,
            record,
            client: a.client,
            peer,
            conn: a.conn,
        };
        let session = match self.sessions.open(
            new,
            token.clone(),
            self.config.max_sessions,
            self.config.max_node_sessions,
        ) {
            Ok(session) => session,
            Err(why) => {
                if in_catalog {
                    let _ = catalog.close_session(id, &format!("refused: {why}"));
                }
                return Err(ServerError::exhausted(why));
            }
        };
        self.log(
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
        Ok((session, token))
    }
}
