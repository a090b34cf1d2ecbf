//! How `qsm admin`'s reports read on a terminal.

use qsm_proto::reports::{
    ActlogReport, AssociationRow, AuditReport, BackupDbReport, BackupRunRow, CloptsetRow,
    DomainRow, EventRow, ExpireReport, HoldRow, NodeRow, ProcessRow, ReclaimReport, RepairReport,
    ReplicateReport, ScheduleRow, ServerRow, SessionRow, StgpoolRow, VolhistRow,
};
use qsm_types::model::NO_LIMIT;
use qsm_types::time::format_time;

use super::FilespaceDeleted;
use crate::render::Text;

/// A count or number of days as `define mgmtclass` takes it.
fn limit(v: u32) -> String {
    if v == NO_LIMIT { "nolimit".to_owned() } else { v.to_string() }
}

/// The process's end: "ended", or why it stopped early.
fn ended(stopped: &Option<String>) -> &str {
    stopped.as_deref().unwrap_or("ended")
}

impl Text for [BackupRunRow] {
    fn text(&self) {
        if self.is_empty() {
            outln!("No backup recorded.");
        }
        for r in self {
            let mut line = format!(
                "{}  {:>6} s  {:<23}  {} objects, {} bytes",
                format_time(r.started),
                (r.ended - r.started).max(0),
                r.result,
                r.objects,
                r.bytes
            );
            if r.warnings > 0 {
                line += &format!(", {} files skipped", r.warnings);
            }
            outln!("{line}  {}", r.filespace);
        }
    }
}

impl Text for [NodeRow] {
    fn text(&self) {
        for n in self {
            let mut about = Vec::new();
            if n.locked {
                about.push("locked".to_owned());
            }
            if let Some(by) = &n.replica_of {
                about.push(format!("replica (made by {by}; restore only)"));
            }
            outln!("{:<24} {}", n.name, about.join(", "));
        }
    }
}

impl Text for [SessionRow] {
    fn text(&self) {
        // Servers sharing a catalog list each other's sessions: then each says where.
        let several = self.iter().any(|s| s.server != self[0].server);
        outln!(
            "{:>6}  {:<16} {:<9} {:>12} {:>9} {:>10}  {:<24} client",
            "id",
            "account",
            "state",
            "bytes",
            "objects",
            "MB/s",
            "peer"
        );
        for s in self {
            outln!(
                "{:>6}  {:<16} {:<9} {:>12} {:>9} {:>10.2}  {:<24} {}{}",
                s.id,
                if s.admin { format!("{} (admin)", s.account) } else { s.account.clone() },
                s.state,
                s.bytes,
                s.objects,
                s.bytes_per_second / 1e6,
                s.peer,
                s.client,
                if several { format!("  (on {})", s.server) } else { String::new() }
            );
        }
    }
}

impl Text for [ProcessRow] {
    fn text(&self) {
        let several = self.iter().any(|p| p.server != self[0].server);
        for p in self {
            let on = if several { format!("  (on {})", p.server) } else { String::new() };
            outln!("{:>6}  {:<18} {}{on}", p.id, p.kind, p.progress);
        }
    }
}

impl Text for [DomainRow] {
    fn text(&self) {
        for d in self {
            outln!("{}  ({} nodes) {}", d.name, d.nodes.len(), d.description);
            for c in &d.classes {
                let min = if c.retain_min_days > 0 {
                    format!(", retain-min {}", c.retain_min_days)
                } else {
                    String::new()
                };
                outln!(
                    "  {:<16} versions-exist {}, versions-deleted {}, retain-extra {}, retain-only {}, retain-archive {}{min}",
                    c.name,
                    limit(c.versions_exist),
                    limit(c.versions_deleted),
                    limit(c.retain_extra_days),
                    limit(c.retain_only_days),
                    limit(c.retain_version_days)
                );
            }
        }
    }
}

impl Text for [StgpoolRow] {
    fn text(&self) {
        outln!(
            "{:<16} {:<5} {:>10} {:>14} {:>14} {:>12} {:>8}  location",
            "pool",
            "kind",
            "containers",
            "bytes",
            "live bytes",
            "reclaimable",
            "damaged"
        );
        for p in self {
            outln!(
                "{:<16} {:<5} {:>10} {:>14} {:>14} {:>11.1}% {:>8}  {}",
                p.name,
                p.kind,
                p.containers,
                p.bytes,
                p.live_bytes,
                p.reclaimable_percent,
                p.damaged_chunks,
                p.location
            );
        }
    }
}

impl Text for [VolhistRow] {
    fn text(&self) {
        outln!("{:<20} {:<10} {:>12} {:>6}  path", "time (UTC)", "kind", "bytes", "schema");
        for e in self {
            outln!(
                "{:<20} {:<10} {:>12} {:>6}  {}{}",
                format_time(e.time),
                e.kind,
                e.bytes,
                e.schema,
                e.path,
                if e.detail.is_empty() { String::new() } else { format!(" ({})", e.detail) }
            );
        }
    }
}

impl Text for ActlogReport {
    fn text(&self) {
        for e in &self.entries {
            outln!("{}  {:<7}  {}", format_time(e.time), e.severity, e.message);
        }
    }
}

impl Text for ExpireReport {
    fn text(&self) {
        outln!(
            "Process {}: expire inventory {}: examined {} versions, deleted {} backup versions and {} archives in {} filespaces, {:.1} s ({:.0} versions/s).",
            self.process,
            ended(&self.stopped),
            self.examined,
            self.backups,
            self.archives,
            self.filespaces,
            self.seconds,
            (self.backups + self.archives) as f64 / self.seconds.max(1e-9)
        );
        if self.protected > 0 {
            outln!(
                "{} versions due were kept by retention locks (query domain) or holds (query hold).",
                self.protected
            );
        }
    }
}

impl Text for ReclaimReport {
    fn text(&self) {
        let orphans = if self.orphans_skipped {
            "orphan removal skipped (servers may share the pool)".to_owned()
        } else {
            format!("{} orphan containers removed", self.orphans)
        };
        outln!(
            "Process {}: reclaim stgpool {}: {} containers reclaimed, {orphans}, {:.1} s.",
            self.process,
            ended(&self.stopped),
            self.containers,
            self.seconds
        );
    }
}

impl Text for [ServerRow] {
    fn text(&self) {
        for s in self {
            outln!(
                "{}  {}  as {}  defined {}",
                s.name,
                s.address,
                s.account,
                format_time(s.created)
            );
        }
    }
}

impl Text for ReplicateReport {
    fn text(&self) {
        outln!(
            "Process {}: replicate node {}: {} nodes, {} filespaces to {}: {} versions sent \
             ({} chunks, {} bytes stored; {} chunks it held sent as references), {} versions \
             it had already, {} made inactive; {} bytes sent in {:.1} s.",
            self.process,
            ended(&self.stopped),
            self.nodes,
            self.filespaces,
            self.target,
            self.versions,
            self.chunks,
            self.frame_bytes,
            self.references,
            self.skipped,
            self.deactivated,
            self.wire_bytes,
            self.seconds
        );
        if !self.problems.is_empty() {
            outln!("Left for the next run ({} versions refused by the target):", self.refused);
            for p in &self.problems {
                outln!("  {p}");
            }
        }
    }
}

impl Text for RepairReport {
    fn text(&self) {
        outln!(
            "Process {}: repair stgpool: {} damaged chunks, {} repaired, {} left, {:.1} s.",
            self.process,
            self.damaged,
            self.repaired,
            self.unrepaired,
            self.seconds
        );
        for p in &self.problems {
            outln!("  {p}");
        }
    }
}

impl Text for BackupDbReport {
    fn text(&self) {
        outln!(
            "Process {}: catalog backed up to {}: {} bytes of catalog (schema {}) in {} bytes, {:.1} s.",
            self.process,
            self.path,
            self.catalog_bytes,
            self.schema,
            self.bytes,
            self.seconds
        );
    }
}

impl Text for FilespaceDeleted<'_> {
    fn text(&self) {
        let r = &self.report;
        outln!(
            "Process {}: filespace {} of node {} {}: {} versions deleted, {:.1} s.",
            r.process,
            self.filespace,
            self.node,
            if r.stopped.is_none() { "deleted" } else { "partly deleted (cancelled)" },
            r.versions,
            r.seconds
        );
    }
}

impl Text for AuditReport {
    fn text(&self) {
        outln!(
            "Process {}: audit stgpool {}: {} containers, {} chunks ({} bytes) verified, {:.1} s.",
            self.process,
            ended(&self.stopped),
            self.containers,
            self.chunks_read,
            self.bytes_read,
            self.seconds
        );
        for d in &self.damaged {
            outln!(
                "damaged: chunk {} in container {} at {}: {}",
                d.chunk,
                d.container,
                d.offset,
                d.reason
            );
        }
        for o in &self.damaged_objects {
            outln!("damaged version: {o}");
        }
        if !self.damaged.is_empty() {
            outln!(
                "{} damaged chunks in {} versions{}.",
                self.damaged.len(),
                self.damaged_objects.len(),
                if self.marked {
                    ": marked; the next backup of those files sends them again"
                } else {
                    "; --mark-damaged makes the next backup of those files send them again"
                }
            );
        }
        if !self.unknown_containers.is_empty() {
            outln!(
                "{} containers ({} bytes) the catalog does not know: {}",
                self.unknown_containers.len(),
                self.unknown_bytes,
                self.unknown_containers.join(" ")
            );
        }
        if self.unrecorded_bytes > 0 {
            outln!(
                "{} bytes in known containers past what the catalog recorded.",
                self.unrecorded_bytes
            );
        }
        if let Some(at) = self.restored_at {
            outln!(
                "The catalog was restored from a copy at {}: the unknown data above holds backups made after the copy, which the catalog cannot name; back those clients up again. {}",
                format_time(at),
                if self.released {
                    "Released: reclamation may now delete it."
                } else {
                    "Reclamation keeps it until `--release-unknown`."
                }
            );
        }
    }
}

impl Text for qsm_catalog::copy::Migration {
    fn text(&self) {
        for t in &self.tables {
            outln!("{:<20} {:>12} rows", t.table, t.rows);
        }
        outln!(
            "Copied {} rows from {} to {} in {:.1} s; every table's rows and checksum verified.",
            self.rows,
            self.from,
            self.to,
            self.seconds
        );
    }
}

impl Text for [ScheduleRow] {
    fn text(&self) {
        for s in self {
            let days = if s.days.is_empty() { "every day".into() } else { s.days.join(",") };
            let objects = if s.objects.is_empty() {
                String::new()
            } else {
                format!(" {}", s.objects.join(" "))
            };
            outln!(
                "{}/{}: {}{objects} every {} s from {}, windows of {} s, {days}; next {}",
                s.domain,
                s.name,
                s.action,
                s.period,
                format_time(s.start),
                s.duration,
                s.next_window.map_or_else(|| "none".into(), format_time)
            );
        }
    }
}

impl Text for [AssociationRow] {
    fn text(&self) {
        for a in self {
            outln!("{}/{}: {} (since {})", a.domain, a.schedule, a.node, format_time(a.since));
        }
    }
}

impl Text for [HoldRow] {
    fn text(&self) {
        for h in self {
            let on = if h.filespace.is_empty() {
                format!("node {}", h.node)
            } else {
                format!("node {} filespace {}", h.node, h.filespace)
            };
            let why = if h.reason.is_empty() { String::new() } else { format!(": {}", h.reason) };
            outln!("{on}  {} since {} by {}{why}", h.kind, format_time(h.since), h.by);
        }
    }
}

impl Text for [CloptsetRow] {
    fn text(&self) {
        for c in self {
            let about = if c.description.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.description)
            };
            outln!("{}{about}:", c.name);
            for o in &c.options {
                outln!("  {} = {}{}", o.name, o.value, if o.force { " (forced)" } else { "" });
            }
        }
    }
}

impl Text for [EventRow] {
    fn text(&self) {
        for e in self {
            outln!(
                "{}  {:<9} {}/{} ({}{}){}",
                format_time(e.window_start),
                e.state,
                e.domain,
                e.schedule,
                e.action,
                e.node.as_ref().map_or_else(String::new, |n| format!(" for {n}")),
                if e.detail.is_empty() { String::new() } else { format!(": {}", e.detail) }
            );
        }
    }
}
