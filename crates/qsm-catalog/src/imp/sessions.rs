//! The records of sessions and processes, and the activity log.

use super::*;
use crate::sql;

pub(super) fn update_session(
    b: &dyn Backend,
    session: SessionId,
    bytes: u64,
    objects: u64,
) -> Result<()> {
    sql::auto(b, "updating a session", |s| {
        s.execute(
            "UPDATE sessions SET bytes = bytes + ?1, objects = objects + ?2 WHERE id = ?3",
            &[(bytes as i64).into(), (objects as i64).into(), session.0.into()],
        )
    })
    .map(|_| ())
}

pub(super) fn running_sessions(b: &dyn Backend) -> Result<Vec<Session>> {
    sql::read(b, "reading sessions", |s| {
        s.all(
            "SELECT id, node_id, started, ended, bytes, objects, state FROM sessions \
             WHERE ended IS NULL ORDER BY id",
            &[],
            |r| {
                Ok(Session {
                    id: SessionId(r.int(0)?),
                    node: NodeId(r.int(1)?),
                    started: r.int(2)?,
                    ended: r.opt_int(3)?,
                    bytes: r.int(4)? as u64,
                    objects: r.int(5)? as u64,
                    state: r.text(6)?,
                })
            },
        )
    })
}

pub(super) fn end_process(
    b: &dyn Backend,
    process: ProcessId,
    state: &str,
    detail: &str,
) -> Result<()> {
    sql::auto(b, "ending a process", |s| {
        s.execute(
            "UPDATE processes SET ended = ?1, state = ?2, detail = ?3 WHERE id = ?4",
            &[crate::now().into(), state.into(), detail.into(), process.0.into()],
        )
    })
    .map(|_| ())
}

pub(super) fn process(b: &dyn Backend, process: ProcessId) -> Result<Option<Process>> {
    sql::read(b, "reading a process", |s| {
        s.opt(
            "SELECT id, kind, started, ended, state, detail FROM processes WHERE id = ?1",
            &[process.0.into()],
            |r| {
                Ok(Process {
                    id: ProcessId(r.int(0)?),
                    kind: r.text(1)?,
                    started: r.int(2)?,
                    ended: r.opt_int(3)?,
                    state: r.text(4)?,
                    detail: r.text(5)?,
                })
            },
        )
    })
}

fn severity_code(s: Severity) -> i64 {
    match s {
        Severity::Info => 0,
        Severity::Warning => 1,
        Severity::Error => 2,
    }
}

pub(super) fn log(
    b: &dyn Backend,
    severity: Severity,
    message: &str,
    node: Option<NodeId>,
    session: Option<SessionId>,
    process: Option<ProcessId>,
) -> Result<()> {
    sql::auto(b, "writing the activity log", |s| {
        s.execute(
            "INSERT INTO activity_log (time, severity, message, node_id, session_id, process_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            &[
                crate::now().into(),
                severity_code(severity).into(),
                message.into(),
                node.map(|n| n.0).into(),
                session.map(|s| s.0).into(),
                process.map(|p| p.0).into(),
            ],
        )
    })
    .map(|_| ())
}

pub(super) fn activity(
    b: &dyn Backend,
    since: Timestamp,
    limit: u32,
) -> Result<Vec<ActivityEntry>> {
    sql::read(b, "reading the activity log", |s| {
        s.all(
            "SELECT id, time, severity, message, node_id, session_id, process_id \
             FROM activity_log WHERE time >= ?1 ORDER BY id LIMIT ?2",
            &[since.into(), i64::from(limit).into()],
            |r| {
                Ok(ActivityEntry {
                    id: r.int(0)?,
                    time: r.int(1)?,
                    severity: match r.int(2)? {
                        0 => Severity::Info,
                        1 => Severity::Warning,
                        _ => Severity::Error,
                    },
                    message: r.text(3)?,
                    node: r.opt_int(4)?.map(NodeId),
                    session: r.opt_int(5)?.map(SessionId),
                    process: r.opt_int(6)?.map(ProcessId),
                })
            },
        )
    })
}
