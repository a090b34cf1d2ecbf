//! Schedules (issue 26, TSM's DEFINE SCHEDULE): the windows a schedule opens, and the server
//! running its own actions (expire, reclaim, audit, backup-db, replicate) in them by itself.
//! Each run is an event in the catalog; the server that records it first runs it, so servers
//! sharing a catalog run it once. A window that closed with no run (the server was down) is
//! recorded missed.
//!
//! Client actions (incremental, selective, archive) run on the nodes associated with the
//! schedule, whose client scheduler (`qsm sched`) asks for its windows ([`due`]), starts and
//! ends its own event; a node whose window closed with no event missed it, and a started
//! event whose node has no session left after its window was severed.

use std::sync::Arc;

use qsm_catalog::{Coordination, Schedule, ScheduleId, ScheduleSpec, Severity, Timestamp};
use qsm_proto::{AdminApi, v1};
use qsm_types::ServerError;

use crate::admin_core::{Actor, AdminSession};
use crate::state::State;

/// The actions the server runs itself.
pub const SERVER_ACTIONS: [&str; 5] = ["expire", "reclaim", "audit", "backup-db", "replicate"];
/// The actions a client scheduler would run.
pub const CLIENT_ACTIONS: [&str; 3] = ["incremental", "selective", "archive"];
/// Weekday names, from the epoch's (1970-01-01 was a Thursday) onwards: `DAYS[(d + 4) % 7]`
/// is the weekday of day `d`, counting Sunday first.
pub const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Refuses what no schedule can say: an unknown or client action, a window that is empty or
/// longer than its period, an unknown day, objects that do not fit.
pub fn check(spec: &ScheduleSpec) -> Result<(), ServerError> {
    let action = spec.action.as_str();
    if !SERVER_ACTIONS.contains(&action) && !CLIENT_ACTIONS.contains(&action) {
        return Err(ServerError::invalid(format!(
            "no action {action:?}; the server runs {}, its nodes {}",
            SERVER_ACTIONS.join(", "),
            CLIENT_ACTIONS.join(", ")
        )));
    }
    // An incremental with no objects backs up each of the node's filespaces (TSM's domain);
    // a selective backup or an archive must say what.
    if action != "incremental" && CLIENT_ACTIONS.contains(&action) && spec.objects.is_empty() {
        return Err(ServerError::invalid(format!("a {action} schedule needs --objects")));
    }
    if action == "replicate" && spec.objects.is_empty() {
        return Err(ServerError::invalid(
            "a replicate schedule needs --objects: the nodes it replicates (and, optionally, \
             target=SERVER)",
        ));
    }
    if !(1..=366 * 86_400).contains(&spec.period) {
        return Err(ServerError::invalid(format!(
            "a period of {} s: it is 1 s to 366 days",
            spec.period
        )));
    }
    if !(1..=spec.period).contains(&spec.duration) {
        return Err(ServerError::invalid(format!(
            "a window of {} s in a period of {} s: it is 1 s to the period",
            spec.duration, spec.period
        )));
    }
    if spec.start < 0 {
        return Err(ServerError::invalid("a start before 1970"));
    }
    if let Some(d) = spec.days.iter().find(|d| !DAYS.contains(&d.as_str())) {
        return Err(ServerError::invalid(format!("no day {d:?}; the days are {}", DAYS.join(","))));
    }
    if spec.objects.len() > 64
        || spec.objects.iter().any(|o| o.is_empty() || o.len() > 4096 || o.contains(['\n', '\0']))
    {
        return Err(ServerError::invalid(
            "objects: at most 64, each 1 to 4096 bytes without a newline or NUL",
        ));
    }
    Ok(())
}

/// Whether a window starting at `start` falls on one of `days` (all, when none).
fn on_day(spec: &ScheduleSpec, start: Timestamp) -> bool {
    let day = DAYS[(start.div_euclid(86_400) + 4).rem_euclid(7) as usize];
    spec.days.is_empty() || spec.days.iter().any(|d| d == day)
}

/// How many windows back (or ahead) a day filter is searched: a week of the shortest period
/// is more than any schedule needs, and bounds the search.
const SEARCH: i64 = 10_000;

/// The start of the last window that began at `now` or before, if any.
pub fn last_window(spec: &ScheduleSpec, now: Timestamp) -> Option<Timestamp> {
    if now < spec.start || spec.period <= 0 {
        return None;
    }
    let k = (now - spec.start) / spec.period;
    (0..=k.min(SEARCH)).map(|back| spec.start + (k - back) * spec.period).find(|&w| on_day(spec, w))
}

/// The start of the first window that begins after `now`, if any.
pub fn next_window(spec: &ScheduleSpec, now: Timestamp) -> Option<Timestamp> {
    if spec.period <= 0 {
        return None;
    }
    let k = if now < spec.start { 0 } else { (now - spec.start) / spec.period + 1 };
    (0..SEARCH).map(|ahead| spec.start + (k + ahead) * spec.period).find(|&w| on_day(spec, w))
}

/// Looks at every schedule: runs the server's whose window is open and not yet run (each
/// on a thread of its own), and records as missed the last window of each that closed with
/// no run; then the same for each node of the client schedules, and severs the events of
/// nodes that went away mid-run. Called every few seconds.
pub fn tick(state: &Arc<State>) {
    let catalog = state.store.catalog();
    let Ok(schedules) = catalog.schedules() else { return };
    let now = qsm_types::now();
    for s in schedules.iter().filter(|s| SERVER_ACTIONS.contains(&s.spec.action.as_str())) {
        let Some(window) = last_window(&s.spec, now) else { continue };
        if now < window + s.spec.duration {
            if let Ok(Some(event)) = catalog.claim_event(s.id, None, window, "started", now) {
                let (state, s) = (Arc::clone(state), s.clone());
                std::thread::spawn(move || run(&state, &s, event));
            }
        } else if window >= s.defined
            && let Ok(Some(_)) = catalog.claim_event(s.id, None, window, "missed", now)
        {
            state.log(
                Severity::Warning,
                &format!(
                    "schedule {}/{} missed its window of {} (the server was not running)",
                    s.domain_name,
                    s.name,
                    qsm_types::time::format_time(window)
                ),
                None,
                None,
            );
        }
    }
    let Ok(associations) = catalog.associations() else { return };
    for a in &associations {
        let Some(s) = schedules.iter().find(|s| s.id == a.schedule) else { continue };
        let Some(window) = last_window(&s.spec, now) else { continue };
        if now < window + s.spec.duration || window < s.defined.max(a.since) {
            continue;
        }
        if let Ok(Some(_)) = catalog.claim_event(s.id, Some(a.node), window, "missed", now) {
            let what = format!(
                "node {} missed the window of {} of schedule {}/{} (no client scheduler \
                 started it)",
                a.node_name,
                qsm_types::time::format_time(window),
                s.domain_name,
                s.name
            );
            state.log(Severity::Warning, &what, Some(a.node), None);
            state.alert("missed", &what, Some(a.node), None, None);
        }
    }
    sever(state, &schedules, now);
}

/// Ends as severed the started events of nodes that have no session left once their window
/// closed: their scheduler was killed or lost its server mid-run, and will not report.
fn sever(state: &State, schedules: &[Schedule], now: Timestamp) {
    let catalog = state.store.catalog();
    let Ok(events) = catalog.started_node_events() else { return };
    let mut started = events.into_iter();
    let Some(first) = started.next() else { return };
    // The sessions open on live servers (those of a server that died end with its lease).
    let Ok(sessions) = catalog.open_sessions() else { return };
    let Ok(nodes) = catalog.nodes() else { return };
    for e in std::iter::once(first).chain(started) {
        let Some(s) = schedules.iter().find(|s| s.id == e.schedule) else { continue };
        let Some(node) = nodes.iter().find(|n| Some(&n.name) == e.node.as_ref()) else { continue };
        let open = e.window_start + s.spec.duration > now;
        if open || sessions.iter().any(|x| x.node == Some(node.id)) {
            continue;
        }
        let why = "the node's sessions ended before it reported an outcome";
        if catalog.end_event(e.id, "severed", why, now).is_ok() {
            let what = format!(
                "schedule {}/{} of node {} severed: {why}",
                s.domain_name, s.name, node.name
            );
            state.log(Severity::Warning, &what, Some(node.id), None);
            state.alert("failed", &what, Some(node.id), None, None);
        }
    }
}

/// A client schedule's window for a node: the one open now if the node has not run it, else
/// the next.
pub fn due(
    state: &State,
    node: &qsm_catalog::Node,
    now: Timestamp,
) -> Result<Vec<(Schedule, Timestamp)>, ServerError> {
    use crate::node_core::catalog_error;
    let catalog = state.store.catalog();
    let mine: Vec<ScheduleId> = catalog
        .associations()
        .map_err(catalog_error)?
        .into_iter()
        .filter(|a| a.node == node.id)
        .map(|a| a.schedule)
        .collect();
    if mine.is_empty() {
        return Ok(Vec::new());
    }
    let schedules: Vec<Schedule> = catalog
        .schedules()
        .map_err(catalog_error)?
        .into_iter()
        .filter(|s| mine.contains(&s.id))
        .collect();
    let open = |s: &Schedule| last_window(&s.spec, now).filter(|&w| now < w + s.spec.duration);
    // The node's events of the windows open now, no older ones.
    let since = schedules.iter().filter_map(open).min().unwrap_or(now);
    let events = catalog.node_events(node.id, since).map_err(catalog_error)?;
    let mut due = Vec::new();
    for s in schedules {
        let ran = |w: Timestamp| events.iter().any(|e| e.schedule == s.id && e.window_start == w);
        let window = match open(&s) {
            Some(w) if !ran(w) => Some(w),
            _ => next_window(&s.spec, now),
        };
        if let Some(w) = window {
            due.push((s, w));
        }
    }
    Ok(due)
}

/// Runs a schedule's action as the server itself and ends its event with what it reported.
fn run(state: &State, s: &Schedule, event: i64) {
    let who = format!("schedule {}/{}", s.domain_name, s.name);
    let admin = AdminSession::new(state, Actor::Owner(who.clone()));
    let done: Result<String, ServerError> = match s.spec.action.as_str() {
        "expire" => admin
            .expire_inventory(v1::ExpireRequest::default())
            .map(|r| format!("{} backup versions and {} archives expired", r.backups, r.archives)),
        "reclaim" => admin
            .reclaim_stgpool(v1::ReclaimRequest::default())
            .map(|r| format!("{} containers reclaimed", r.containers)),
        "audit" => admin
            .audit_stgpool(v1::AuditRequest::default())
            .map(|r| format!("{} chunks verified, {} damaged", r.chunks_read, r.damaged.len())),
        "backup-db" => admin
            .backup_db(v1::BackupDbRequest::default())
            .map(|r| format!("catalog backed up to {} ({} bytes)", r.path, r.bytes)),
        "replicate" => {
            // Its objects are the nodes, and perhaps `target=SERVER`.
            let (targets, nodes): (Vec<&String>, Vec<&String>) =
                s.spec.objects.iter().partition(|o| o.starts_with("target="));
            let target = targets.first().map_or("", |t| &t["target=".len()..]).to_owned();
            let nodes = nodes.into_iter().cloned().collect();
            admin.replicate_node(v1::ReplicateRequest { nodes, target }).map(|r| {
                format!(
                    "{} versions replicated to {} ({} bytes), {} there already",
                    r.versions, r.target, r.wire_bytes, r.skipped
                )
            })
        }
        other => Err(ServerError::invalid(format!("no action {other}"))),
    };
    let (end, detail, severity) = match done {
        Ok(detail) => ("completed", detail, Severity::Info),
        Err(e) => ("failed", e.to_string(), Severity::Error),
    };
    let _ = state.store.catalog().end_event(event, end, &detail, qsm_types::now());
    state.log(severity, &format!("{who} {end}: {detail}"), None, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(start: i64, period: i64, days: &[&str]) -> ScheduleSpec {
        ScheduleSpec {
            action: "expire".into(),
            objects: Vec::new(),
            start,
            duration: 60,
            period,
            days: days.iter().map(|d| (*d).to_owned()).collect(),
        }
    }

    #[test]
    fn windows_follow_the_period_and_the_days() {
        let s = spec(1_000, 100, &[]);
        assert_eq!(last_window(&s, 999), None);
        assert_eq!(last_window(&s, 1_000), Some(1_000));
        assert_eq!(last_window(&s, 1_250), Some(1_200));
        assert_eq!(next_window(&s, 1_250), Some(1_300));
        assert_eq!(next_window(&s, 10), Some(1_000));
        // 1970-01-05 was a Monday: daily windows at 02:00 fall on Mondays only.
        let monday = 4 * 86_400 + 7_200;
        let daily = spec(7_200, 86_400, &["mon"]);
        assert_eq!(last_window(&daily, monday + 5), Some(monday));
        assert_eq!(last_window(&daily, monday + 3 * 86_400), Some(monday));
        assert_eq!(next_window(&daily, monday), Some(monday + 7 * 86_400));
        assert_eq!(DAYS[((monday / 86_400) + 4).rem_euclid(7) as usize], "mon");
    }

    #[test]
    fn what_no_schedule_can_say_is_refused() {
        let ok = spec(0, 60, &["mon"]);
        assert!(check(&ok).is_ok());
        assert!(check(&ScheduleSpec { action: "incremental".into(), ..ok.clone() }).is_ok());
        let e = check(&ScheduleSpec { action: "archive".into(), ..ok.clone() }).unwrap_err();
        assert!(e.to_string().contains("--objects"), "{e}");
        let e = check(&ScheduleSpec { action: "replicate".into(), ..ok.clone() }).unwrap_err();
        assert!(e.to_string().contains("the nodes it replicates"), "{e}");
        let nodes = vec!["alpha".to_owned(), "target=dr".to_owned()];
        assert!(
            check(&ScheduleSpec { action: "replicate".into(), objects: nodes, ..ok.clone() })
                .is_ok()
        );
        let e = check(&ScheduleSpec { action: "dance".into(), ..ok.clone() }).unwrap_err();
        assert!(e.to_string().contains("backup-db"), "{e}");
        assert!(check(&ScheduleSpec { duration: 61, ..ok.clone() }).is_err());
        assert!(check(&ScheduleSpec { period: 0, ..ok.clone() }).is_err());
        assert!(check(&spec(0, 60, &["funday"])).is_err());
        assert!(check(&ScheduleSpec { objects: vec!["a\nb".into()], ..ok }).is_err());
    }
}
