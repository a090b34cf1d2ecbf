//! Several servers on one catalog (issue 23.7): what each server runs is recorded where the
//! others can see it, written once for both backends ([`crate::sql`]).
//!
//! - **Servers** register when they start and beat every few seconds; each declares the
//!   `lease` after which a silent server is taken for dead. The first live server to notice a
//!   dead one ends its sessions and processes and drops its container leases.
//! - **Sessions** of every server (node or administrator) are listed in `open_sessions`, whose
//!   id is the session's number on every server. A cancel or a lock made on one server marks
//!   the rows; the server holding them sees the mark at its next beat.
//! - **Processes** (expiration, reclamation, audit, ...) are started through a check made in
//!   the same serialized transaction as their insert, so one of each kind runs across servers.
//! - **Containers** being written are leased by their server when it opens them, and its
//!   leases are set to the containers it has open at every beat: orphan removal and
//!   reclamation leave a container alone while a live server holds its lease.
//!
//! Times are each server's clock in seconds: servers sharing a catalog must keep their clocks
//! within a few seconds of each other (NTP), as the leases are tens of seconds.

use std::collections::HashSet;

use crate::error::Result;
use crate::model::{ContainerId, NodeId, ProcessId, SessionId, Timestamp};
use crate::sql::{self, Sql, Value, int, opt_int, returned_id, text};
use crate::{Catalog, now};

/// A running server's id in the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerId(pub i64);

/// A session open on some server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSession {
    /// Its number, the same on every server.
    pub id: u64,
    /// The server it is open on.
    pub server: ServerId,
    /// That server's name.
    pub server_name: String,
    /// The node or administrator name.
    pub account: String,
    /// The node, for a node's session.
    pub node: Option<NodeId>,
    /// The session's record (history and accounting), for a node's session.
    pub record: Option<SessionId>,
    /// What the client said it is.
    pub client: String,
    /// Where it connects from.
    pub peer: String,
    /// Login time.
    pub started: Timestamp,
    /// Frame bytes received, as last recorded.
    pub bytes: u64,
    /// Objects committed, as last recorded.
    pub objects: u64,
    /// A cancel was asked and its server has not yet acted on it.
    pub cancelled: bool,
}

/// A process running on some server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningProcess {
    /// Its id.
    pub id: ProcessId,
    /// The server it runs on.
    pub server: ServerId,
    /// That server's name.
    pub server_name: String,
    /// What it is ("expire inventory", ...).
    pub kind: String,
    /// When it started.
    pub started: Timestamp,
    /// What it was started for.
    pub detail: String,
    /// Its progress as its server last wrote it.
    pub progress: String,
}

/// What a heartbeat brings back: what other servers asked of this one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Beat {
    /// Sessions of this server to cancel.
    pub cancel_sessions: Vec<u64>,
    /// Processes of this server to cancel.
    pub cancel_processes: Vec<ProcessId>,
    /// Servers found dead at this beat (their sessions, processes and leases are ended).
    pub lost: Vec<String>,
    /// This server had itself been taken for dead (it beat too late) and is live again.
    pub revived: bool,
}

/// Which sessions a cancel applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionsOf<'a> {
    /// One session, by number.
    Id(u64),
    /// Every session of a node.
    Node(NodeId),
    /// Every session of an administrator.
    Admin(&'a str),
}

/// A process that could not start because another runs that excludes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excluded {
    /// The running process.
    pub id: ProcessId,
    /// Its kind.
    pub kind: String,
    /// The server it runs on.
    pub server: String,
}

/// How a server that stopped answering ends what it held.
const LOST: &str = "failed: its server stopped answering";
/// Ended server rows are kept this long (seconds), for messages about them, then pruned.
const KEEP_ENDED: i64 = 7 * 86_400;

/// The condition "server `s` is live at `?NOW`" (the parameter's number is `now`).
fn live(s: &str, now: usize) -> String {
    format!("{s}.ended IS NULL AND {s}.heartbeat + {s}.lease >= ?{now}")
}

/// Coordination of the servers sharing a catalog; every [`Catalog`] has it.
pub trait Coordination {
    /// Records a server starting, named `name` (for messages), that will beat more often than
    /// every `lease` seconds.
    fn register_server(&self, name: &str, lease: i64) -> Result<ServerId>;

    /// A server's beat: refreshes its heartbeat, makes its container leases those it has open,
    /// writes its processes' progress, ends the servers whose lease lapsed, and returns what
    /// others asked of it.
    fn heartbeat(
        &self,
        server: ServerId,
        open: &[ContainerId],
        progress: &[(ProcessId, String)],
    ) -> Result<Beat>;

    /// A server stopping: what it still holds is ended `how`.
    fn stop_server(&self, server: ServerId, how: &str) -> Result<()>;

    /// Opens a session on `server`; a node's session gets a record too (in the same
    /// transaction). Returns its number and its record.
    fn open_session(
        &self,
        server: ServerId,
        account: &str,
        node: Option<NodeId>,
        client: &str,
        peer: &str,
    ) -> Result<(u64, Option<SessionId>)>;

    /// Closes session `id`, ending its record `how`.
    fn close_session(&self, id: u64, how: &str) -> Result<()>;

    /// Asks the servers holding `which` to cancel them; returns how many sessions were found.
    fn cancel_sessions(&self, which: SessionsOf<'_>) -> Result<u64>;

    /// The sessions open on live servers, by number.
    fn open_sessions(&self) -> Result<Vec<OpenSession>>;

    /// Starts process `kind` on `server`, unless one of `excluded_by` (its own kind among
    /// them) runs on a live server: then that one is the error.
    fn start_process_on(
        &self,
        server: ServerId,
        kind: &str,
        detail: &str,
        excluded_by: &[&str],
    ) -> Result<std::result::Result<ProcessId, Excluded>>;

    /// Asks the server running process `id` to cancel it; false if it is not running.
    fn cancel_process(&self, id: ProcessId) -> Result<bool>;

    /// The processes running on live servers, by id.
    fn running_processes(&self) -> Result<Vec<RunningProcess>>;

    /// Leases container `id` to `server` while it writes it.
    fn lease_container(&self, server: ServerId, id: ContainerId) -> Result<()>;

    /// The containers leased by live servers.
    fn leased_containers(&self) -> Result<HashSet<ContainerId>>;
}

/// Ends what server `id` holds: its sessions' records, its open sessions, its running
/// processes, its leases, and its own row.
fn end_server(s: &mut dyn Sql, id: i64, how: &str, at: Timestamp) -> Result<()> {
    let p = [Value::Int(at), Value::Text(how.to_owned()), Value::Int(id)];
    s.exec(
        "UPDATE sessions SET ended = ?1, state = ?2 WHERE ended IS NULL AND id IN \
         (SELECT record_id FROM open_sessions WHERE server_id = ?3)",
        &p,
    )?;
    s.exec(
        "UPDATE processes SET ended = ?1, state = 'failed', detail = detail || '; ' || ?2 \
         WHERE server_id = ?3 AND ended IS NULL",
        &p,
    )?;
    let server = [Value::Int(id)];
    s.exec("DELETE FROM open_sessions WHERE server_id = ?1", &server)?;
    s.exec("DELETE FROM container_leases WHERE server_id = ?1", &server)?;
    s.exec("UPDATE servers SET ended = ?1 WHERE id = ?2", &[Value::Int(at), Value::Int(id)])?;
    Ok(())
}

fn container(id: ContainerId) -> Value {
    // Stored as the BIGINT of the same bits, as everywhere in the catalog.
    Value::Int(id.0 as i64)
}

impl<C: Catalog + ?Sized> Coordination for C {
    fn register_server(&self, name: &str, lease: i64) -> Result<ServerId> {
        sql::write(self.sql(), "registering the server", |s| {
            let at = now();
            s.exec(
                "DELETE FROM servers WHERE ended IS NOT NULL AND ended < ?1",
                &[Value::Int(at - KEEP_ENDED)],
            )?;
            let row = s.rows(
                "INSERT INTO servers (name, started, heartbeat, lease) VALUES (?1, ?2, ?2, ?3) \
                 RETURNING id",
                &[Value::Text(name.to_owned()), Value::Int(at), Value::Int(lease.max(1))],
            )?;
            Ok(ServerId(returned_id(&row)?))
        })
    }

    fn heartbeat(
        &self,
        server: ServerId,
        open: &[ContainerId],
        progress: &[(ProcessId, String)],
    ) -> Result<Beat> {
        sql::write(self.sql(), "recording the server's heartbeat", |s| {
            let at = now();
            let me = Value::Int(server.0);
            let mut beat = Beat::default();
            let ended =
                s.rows("SELECT ended FROM servers WHERE id = ?1", std::slice::from_ref(&me))?;
            beat.revived = ended.first().is_some_and(|r| matches!(r.first(), Some(Value::Int(_))));
            s.exec(
                "UPDATE servers SET heartbeat = ?1, ended = NULL WHERE id = ?2",
                &[Value::Int(at), me.clone()],
            )?;
            // The leases become exactly the containers open now: those closed since the last
            // beat are released.
            s.exec("DELETE FROM container_leases WHERE server_id = ?1", std::slice::from_ref(&me))?;
            for id in open {
                s.exec(
                    "INSERT INTO container_leases (container_id, server_id) VALUES (?1, ?2) \
                     ON CONFLICT (container_id) DO NOTHING",
                    &[container(*id), me.clone()],
                )?;
            }
            for (id, text) in progress {
                s.exec(
                    "UPDATE processes SET progress = ?1 WHERE id = ?2",
                    &[Value::Text(text.clone()), Value::Int(id.0)],
                )?;
            }
            let lost = s.rows(
                "SELECT id, name FROM servers WHERE ended IS NULL AND id <> ?1 \
                 AND heartbeat + lease < ?2",
                &[me.clone(), Value::Int(at)],
            )?;
            for row in lost {
                end_server(s, int(&row, 0)?, LOST, at)?;
                beat.lost.push(text(&row, 1)?);
            }
            for row in s.rows(
                "SELECT id FROM open_sessions WHERE server_id = ?1 AND cancel = 1 ORDER BY id",
                std::slice::from_ref(&me),
            )? {
                beat.cancel_sessions.push(int(&row, 0)? as u64);
            }
            for row in s.rows(
                "SELECT id FROM processes WHERE server_id = ?1 AND ended IS NULL AND cancel = 1 \
                 ORDER BY id",
                std::slice::from_ref(&me),
            )? {
                beat.cancel_processes.push(ProcessId(int(&row, 0)?));
            }
            Ok(beat)
        })
    }

    fn stop_server(&self, server: ServerId, how: &str) -> Result<()> {
        sql::write(self.sql(), "recording the server's stop", |s| {
            end_server(s, server.0, how, now())
        })
    }

    fn open_session(
        &self,
        server: ServerId,
        account: &str,
        node: Option<NodeId>,
        client: &str,
        peer: &str,
    ) -> Result<(u64, Option<SessionId>)> {
        sql::write(self.sql(), "opening a session", |s| {
            let at = now();
            let record = match node {
                Some(n) => {
                    let row = s.rows(
                        "INSERT INTO sessions (node_id, started, state) VALUES (?1, ?2, 'running') \
                         RETURNING id",
                        &[Value::Int(n.0), Value::Int(at)],
                    )?;
                    Some(SessionId(returned_id(&row)?))
                }
                None => None,
            };
            let row = s.rows(
                "INSERT INTO open_sessions (server_id, account, node_id, record_id, client, peer, \
                 started) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
                &[
                    Value::Int(server.0),
                    Value::Text(account.to_owned()),
                    node.map_or(Value::Null, |n| Value::Int(n.0)),
                    record.map_or(Value::Null, |r| Value::Int(r.0)),
                    Value::Text(client.to_owned()),
                    Value::Text(peer.to_owned()),
                    Value::Int(at),
                ],
            )?;
            Ok((returned_id(&row)? as u64, record))
        })
    }

    fn close_session(&self, id: u64, how: &str) -> Result<()> {
        sql::write(self.sql(), "closing a session", |s| {
            let p = [Value::Int(now()), Value::Text(how.to_owned()), Value::Int(id as i64)];
            s.exec(
                "UPDATE sessions SET ended = ?1, state = ?2 WHERE ended IS NULL AND id IN \
                 (SELECT record_id FROM open_sessions WHERE id = ?3)",
                &p,
            )?;
            s.exec("DELETE FROM open_sessions WHERE id = ?1", &[Value::Int(id as i64)])?;
            Ok(())
        })
    }

    fn cancel_sessions(&self, which: SessionsOf<'_>) -> Result<u64> {
        sql::write(self.sql(), "cancelling sessions", |s| {
            let (condition, value) = match which {
                SessionsOf::Id(id) => ("id = ?1", Value::Int(id as i64)),
                SessionsOf::Node(n) => ("node_id = ?1", Value::Int(n.0)),
                SessionsOf::Admin(name) => {
                    ("node_id IS NULL AND account = ?1", Value::Text(name.to_owned()))
                }
            };
            s.exec(&format!("UPDATE open_sessions SET cancel = 1 WHERE {condition}"), &[value])
        })
    }

    fn open_sessions(&self) -> Result<Vec<OpenSession>> {
        sql::read(self.sql(), "reading the open sessions", |s| {
            let rows = s.rows(
                &format!(
                    "SELECT o.id, o.server_id, v.name, o.account, o.node_id, o.record_id, \
                     o.client, o.peer, o.started, r.bytes, r.objects, o.cancel \
                     FROM open_sessions o JOIN servers v ON v.id = o.server_id \
                     LEFT JOIN sessions r ON r.id = o.record_id WHERE {} ORDER BY o.id",
                    live("v", 1)
                ),
                &[Value::Int(now())],
            )?;
            rows.iter()
                .map(|r| {
                    Ok(OpenSession {
                        id: int(r, 0)? as u64,
                        server: ServerId(int(r, 1)?),
                        server_name: text(r, 2)?,
                        account: text(r, 3)?,
                        node: opt_int(r, 4)?.map(NodeId),
                        record: opt_int(r, 5)?.map(SessionId),
                        client: text(r, 6)?,
                        peer: text(r, 7)?,
                        started: int(r, 8)?,
                        bytes: opt_int(r, 9)?.unwrap_or(0) as u64,
                        objects: opt_int(r, 10)?.unwrap_or(0) as u64,
                        cancelled: int(r, 11)? != 0,
                    })
                })
                .collect()
        })
    }

    fn start_process_on(
        &self,
        server: ServerId,
        kind: &str,
        detail: &str,
        excluded_by: &[&str],
    ) -> Result<std::result::Result<ProcessId, Excluded>> {
        sql::write(self.sql(), "starting a process", |s| {
            let at = now();
            let kinds: Vec<String> =
                (0..excluded_by.len()).map(|i| format!("?{}", i + 2)).collect();
            let mut params = vec![Value::Int(at)];
            params.extend(excluded_by.iter().map(|k| Value::Text((*k).to_owned())));
            let running = s.rows(
                &format!(
                    "SELECT p.id, p.kind, v.name FROM processes p JOIN servers v \
                     ON v.id = p.server_id WHERE p.ended IS NULL AND {} AND p.kind IN ({}) \
                     ORDER BY p.id",
                    live("v", 1),
                    if kinds.is_empty() { "NULL".to_owned() } else { kinds.join(", ") }
                ),
                &params,
            )?;
            if let Some(r) = running.first() {
                return Ok(Err(Excluded {
                    id: ProcessId(int(r, 0)?),
                    kind: text(r, 1)?,
                    server: text(r, 2)?,
                }));
            }
            let row = s.rows(
                "INSERT INTO processes (kind, started, state, detail, server_id) \
                 VALUES (?1, ?2, 'running', ?3, ?4) RETURNING id",
                &[
                    Value::Text(kind.to_owned()),
                    Value::Int(at),
                    Value::Text(detail.to_owned()),
                    Value::Int(server.0),
                ],
            )?;
            Ok(Ok(ProcessId(returned_id(&row)?)))
        })
    }

    fn cancel_process(&self, id: ProcessId) -> Result<bool> {
        sql::write(self.sql(), "cancelling a process", |s| {
            let n = s.exec(
                "UPDATE processes SET cancel = 1 WHERE id = ?1 AND ended IS NULL \
                 AND server_id IS NOT NULL",
                &[Value::Int(id.0)],
            )?;
            Ok(n > 0)
        })
    }

    fn running_processes(&self) -> Result<Vec<RunningProcess>> {
        sql::read(self.sql(), "reading the running processes", |s| {
            let rows = s.rows(
                &format!(
                    "SELECT p.id, p.server_id, v.name, p.kind, p.started, p.detail, p.progress \
                     FROM processes p JOIN servers v ON v.id = p.server_id \
                     WHERE p.ended IS NULL AND {} ORDER BY p.id",
                    live("v", 1)
                ),
                &[Value::Int(now())],
            )?;
            rows.iter()
                .map(|r| {
                    Ok(RunningProcess {
                        id: ProcessId(int(r, 0)?),
                        server: ServerId(int(r, 1)?),
                        server_name: text(r, 2)?,
                        kind: text(r, 3)?,
                        started: int(r, 4)?,
                        detail: text(r, 5)?,
                        progress: text(r, 6)?,
                    })
                })
                .collect()
        })
    }

    fn lease_container(&self, server: ServerId, id: ContainerId) -> Result<()> {
        sql::write(self.sql(), "leasing a container", |s| {
            s.exec(
                "INSERT INTO container_leases (container_id, server_id) VALUES (?1, ?2) \
                 ON CONFLICT (container_id) DO NOTHING",
                &[container(id), Value::Int(server.0)],
            )
            .map(|_| ())
        })
    }

    fn leased_containers(&self) -> Result<HashSet<ContainerId>> {
        sql::read(self.sql(), "reading the container leases", |s| {
            let rows = s.rows(
                &format!(
                    "SELECT l.container_id FROM container_leases l JOIN servers v \
                     ON v.id = l.server_id WHERE {}",
                    live("v", 1)
                ),
                &[Value::Int(now())],
            )?;
            rows.iter().map(|r| Ok(ContainerId(int(r, 0)? as u64))).collect()
        })
    }
}
