//! Schedules and their events (issue 26).

use super::*;
use crate::copy::Value;
use crate::sql;

const COLUMNS: &str = "s.id, s.domain_id, d.name, s.name, s.action, s.objects, s.start_at, \
                       s.duration, s.period, s.days, s.defined";

fn split(text: &str, by: char) -> Vec<String> {
    text.split(by).filter(|p| !p.is_empty()).map(str::to_owned).collect()
}

fn schedule_from_row(r: &dyn Row) -> Result<Schedule> {
    Ok(Schedule {
        id: ScheduleId(r.int(0)?),
        domain: DomainId(r.int(1)?),
        domain_name: r.text(2)?,
        name: r.text(3)?,
        spec: ScheduleSpec {
            action: r.text(4)?,
            objects: split(&r.text(5)?, '\n'),
            start: r.int(6)?,
            duration: r.int(7)?,
            period: r.int(8)?,
            days: split(&r.text(9)?, ','),
        },
        defined: r.int(10)?,
    })
}

/// A schedule's columns as stored, from `action` to `defined` (now), in the order of
/// [`SPEC_COLUMNS`].
fn spec_values(spec: &ScheduleSpec) -> Vec<Value> {
    vec![
        Value::Text(spec.action.clone()),
        // One path per line: paths may hold commas, never newlines (`check` refuses them).
        Value::Text(spec.objects.join("\n")),
        Value::Int(spec.start),
        Value::Int(spec.duration),
        Value::Int(spec.period),
        Value::Text(spec.days.join(",")),
        Value::Int(crate::now()),
    ]
}

/// The columns [`spec_values`] gives.
const SPEC_COLUMNS: [&str; 7] =
    ["action", "objects", "start_at", "duration", "period", "days", "defined"];

pub(super) fn define_schedule(
    b: &dyn Backend,
    domain: DomainId,
    name: &str,
    spec: &ScheduleSpec,
) -> Result<ScheduleId> {
    let mut values = vec![Value::Int(domain.0), Value::Text(name.to_owned())];
    values.extend(spec_values(spec));
    let args: Vec<Arg<'_>> = values.iter().map(Arg::from).collect();
    let params: Vec<String> = (1..=args.len()).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "INSERT INTO schedules (domain_id, name, {}) VALUES ({})",
        SPEC_COLUMNS.join(", "),
        params.join(", ")
    );
    sql::auto(b, "defining a schedule", |s| s.insert(&sql, &args))
        .map(ScheduleId)
        .map_err(on_constraint(|| CatalogError::Exists { what: "schedule", name: name.into() }))
}

pub(super) fn update_schedule(b: &dyn Backend, id: ScheduleId, spec: &ScheduleSpec) -> Result<()> {
    let mut values = spec_values(spec);
    values.push(Value::Int(id.0));
    let args: Vec<Arg<'_>> = values.iter().map(Arg::from).collect();
    let set: Vec<String> =
        SPEC_COLUMNS.iter().enumerate().map(|(i, c)| format!("{c} = ?{}", i + 1)).collect();
    let sql = format!("UPDATE schedules SET {} WHERE id = ?{}", set.join(", "), args.len());
    update_one(b, "updating a schedule", &sql, &args, "schedule", &id.0)
}

pub(super) fn delete_schedule(b: &dyn Backend, id: ScheduleId) -> Result<()> {
    sql::txn(b, "deleting a schedule", |s| {
        s.execute("DELETE FROM events WHERE schedule_id = ?1", &[id.0.into()])?;
        s.execute("DELETE FROM associations WHERE schedule_id = ?1", &[id.0.into()])?;
        if s.execute("DELETE FROM schedules WHERE id = ?1", &[id.0.into()])? == 0 {
            return Err(CatalogError::NotFound { what: "schedule", key: id.0.to_string() });
        }
        Ok(())
    })
}

pub(super) fn schedules(b: &dyn Backend) -> Result<Vec<Schedule>> {
    sql::read(b, "reading schedules", |s| {
        s.all(
            &format!(
                "SELECT {COLUMNS} FROM schedules s JOIN domains d ON d.id = s.domain_id \
                 ORDER BY d.name, s.name"
            ),
            &[],
            schedule_from_row,
        )
    })
}

pub(super) fn claim_event(
    b: &dyn Backend,
    schedule: ScheduleId,
    node: Option<NodeId>,
    window_start: Timestamp,
    state: &str,
    now: Timestamp,
) -> Result<Option<i64>> {
    let started = (state == "started").then_some(now);
    let ended = (state != "started").then_some(now);
    sql::auto(b, "recording an event", |s| {
        s.opt(
            "INSERT INTO events (schedule_id, node_id, window_start, state, started, ended, \
             detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, '') \
             ON CONFLICT (schedule_id, node_id, window_start) DO NOTHING RETURNING id",
            &[
                schedule.0.into(),
                node.map_or(0, |n| n.0).into(),
                window_start.into(),
                state.into(),
                started.into(),
                ended.into(),
            ],
            |r| r.int(0),
        )
    })
}

/// Ends started event `id` (of `node` only, when given: a node cannot rewrite another's
/// record). Only a started one: two servers severing it at once, or a severance racing the
/// node's own report, end it once.
pub(super) fn end_event(
    b: &dyn Backend,
    node: Option<NodeId>,
    id: i64,
    state: &str,
    detail: &str,
    now: Timestamp,
) -> Result<()> {
    let mut args: Vec<Arg<'_>> = vec![state.into(), detail.into(), now.into(), id.into()];
    let mine = match node {
        Some(n) => {
            args.push(n.0.into());
            " AND node_id = ?5"
        }
        None => "",
    };
    let sql = format!(
        "UPDATE events SET state = ?1, detail = ?2, ended = ?3 \
         WHERE id = ?4 AND state = 'started'{mine}"
    );
    let what = if node.is_some() { "started event of the node" } else { "started event" };
    update_one(b, "ending an event", &sql, &args, what, &id)
}

/// The columns and joins of an event read.
const EVENT_SELECT: &str = "SELECT e.id, e.schedule_id, d.name, s.name, s.action, n.name, \
     e.window_start, e.state, e.started, e.ended, e.detail FROM events e \
     JOIN schedules s ON s.id = e.schedule_id JOIN domains d ON d.id = s.domain_id \
     LEFT JOIN nodes n ON n.id = e.node_id";

fn event_from_row(r: &dyn Row) -> Result<Event> {
    Ok(Event {
        id: r.int(0)?,
        schedule: ScheduleId(r.int(1)?),
        domain_name: r.text(2)?,
        schedule_name: r.text(3)?,
        action: r.text(4)?,
        node: r.opt_text(5)?,
        window_start: r.int(6)?,
        state: r.text(7)?,
        started: r.opt_int(8)?,
        ended: r.opt_int(9)?,
        detail: r.text(10)?,
    })
}

pub(super) fn events(b: &dyn Backend, since: Timestamp) -> Result<Vec<Event>> {
    sql::read(b, "reading events", |s| {
        s.all(
            &format!(
                "{EVENT_SELECT} WHERE e.window_start >= ?1 \
                 ORDER BY e.window_start, d.name, s.name, n.name"
            ),
            &[since.into()],
            event_from_row,
        )
    })
}

pub(super) fn node_events(b: &dyn Backend, node: NodeId, since: Timestamp) -> Result<Vec<Event>> {
    sql::read(b, "reading a node's events", |s| {
        s.all(
            &format!(
                "{EVENT_SELECT} WHERE e.node_id = ?1 AND e.window_start >= ?2 \
                 ORDER BY e.window_start, d.name, s.name"
            ),
            &[node.0.into(), since.into()],
            event_from_row,
        )
    })
}

pub(super) fn started_node_events(b: &dyn Backend) -> Result<Vec<Event>> {
    sql::read(b, "reading the started events", |s| {
        s.all(
            &format!(
                "{EVENT_SELECT} WHERE e.state = 'started' AND e.node_id <> 0 \
                 ORDER BY e.window_start"
            ),
            &[],
            event_from_row,
        )
    })
}

pub(super) fn associate(b: &dyn Backend, schedule: ScheduleId, node: NodeId) -> Result<bool> {
    sql::auto(b, "associating a node with a schedule", |s| {
        s.execute(
            "INSERT INTO associations (schedule_id, node_id, since) VALUES (?1, ?2, ?3) \
             ON CONFLICT (schedule_id, node_id) DO NOTHING",
            &[schedule.0.into(), node.0.into(), crate::now().into()],
        )
    })
    .map(|n| n > 0)
}

pub(super) fn dissociate(b: &dyn Backend, schedule: ScheduleId, node: NodeId) -> Result<()> {
    update_one(
        b,
        "removing a node from a schedule",
        "DELETE FROM associations WHERE schedule_id = ?1 AND node_id = ?2",
        &[schedule.0.into(), node.0.into()],
        "association",
        &format!("of node {} with schedule {}", node.0, schedule.0),
    )
}

pub(super) fn associations(b: &dyn Backend) -> Result<Vec<Association>> {
    sql::read(b, "reading associations", |s| {
        s.all(
            "SELECT a.schedule_id, d.name, s.name, a.node_id, n.name, a.since \
             FROM associations a JOIN schedules s ON s.id = a.schedule_id \
             JOIN domains d ON d.id = s.domain_id JOIN nodes n ON n.id = a.node_id \
             ORDER BY d.name, s.name, n.name",
            &[],
            |r| {
                Ok(Association {
                    schedule: ScheduleId(r.int(0)?),
                    domain_name: r.text(1)?,
                    schedule_name: r.text(2)?,
                    node: NodeId(r.int(3)?),
                    node_name: r.text(4)?,
                    since: r.int(5)?,
                })
            },
        )
    })
}
