//! The catalog conformance suite: every [`Catalog`] implementation must pass it. Each case
//! gets a fresh, empty, migrated catalog from the caller's factory and returns an error
//! naming what failed. `tests/sqlite.rs` runs it on SQLite; the PostgreSQL catalog will run
//! the very same cases.

use crate::model::*;
use crate::{Catalog, CatalogError};

/// The outcome of one case.
pub type CaseResult = std::result::Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!("{}:{}: {}", file!(), line!(), format!($($msg)+)));
        }
    };
}

fn e(err: CatalogError) -> String {
    err.to_string()
}

/// When the cases that test no lock or hold ask for deletions.
const NOW: Timestamp = 1_000_000;

/// One case: it gets a fresh catalog.
pub type Case = fn(&dyn Catalog) -> CaseResult;

/// Every case, by name.
pub const CASES: &[(&str, Case)] = &[
    ("policy", policy),
    ("nodes_and_filespaces", nodes_and_filespaces),
    ("backup_runs_are_recorded_per_filespace", backup_runs_are_recorded_per_filespace),
    ("schedules_and_their_events", schedules_and_their_events),
    ("associations_and_node_events", associations_and_node_events),
    ("client_option_sets", client_option_sets),
    ("versions_and_active_inventory", versions_and_active_inventory),
    ("chunks_and_reference_counts", chunks_and_reference_counts),
    ("transactions_are_atomic", transactions_are_atomic),
    ("large_batches_and_streaming", large_batches_and_streaming),
    ("sessions_processes_activity", sessions_processes_activity),
    ("servers_share_sessions_processes_and_leases", servers_share_sessions_processes_and_leases),
    ("reclamation_moves", reclamation_moves),
    ("dedup_scopes_and_keyed_chunks", dedup_scopes_and_keyed_chunks),
    ("expiration_by_policy", expiration_by_policy),
    ("policy_changes", policy_changes),
    ("expiration_across_pages", expiration_across_pages),
    ("versions_exist_at_backup", versions_exist_at_backup),
    ("retention_locks_and_holds", retention_locks_and_holds),
    ("backup_figures", backup_figures),
    ("replicas", replicas),
    ("damaged_chunks_and_repair", damaged_chunks_and_repair),
    ("state_and_snapshot", state_and_snapshot),
    ("trees_and_generations", trees_and_generations),
    ("deleting_filespaces_and_nodes", deleting_filespaces_and_nodes),
    ("listing_interleaved_with_commits", listing_interleaved_with_commits),
    ("listing_a_path_longer_than_a_page", listing_a_path_longer_than_a_page),
];

/// Cases run at once: each has a catalog of its own, and most of a case's time is its
/// database's (a PostgreSQL catalog's creation, commits waiting for the disk).
const WORKERS: usize = 4;

/// Runs every case on catalogs from `make`, [`WORKERS`] at a time; returns the failures, in
/// the cases' order.
pub fn run_all(make: &(dyn Fn() -> Box<dyn Catalog> + Sync)) -> Vec<String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; CASES.len()]);
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, case)) = CASES.get(i) else { break };
                    let failed = case(make().as_ref()).err().map(|msg| format!("{name}: {msg}"));
                    if let Ok(mut r) = results.lock() {
                        r[i] = failed;
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .flatten()
        .collect()
}

struct Fixture {
    fs: FilespaceId,
    pool: PoolId,
    container: ContainerId,
}

fn fixture(cat: &dyn Catalog) -> std::result::Result<Fixture, String> {
    let domain = cat.define_domain("standard", "").map_err(e)?;
    let node = cat.register_node("alpha", "$argon2id$x", domain).map_err(e)?;
    let fs = cat.filespace(node, "/home").map_err(e)?;
    let pool = cat.define_pool("disk", "dir", "/srv/qsm/pool").map_err(e)?;
    let container = ContainerId(0xfeed_0000_0000_0001);
    let mut t = cat.begin().map_err(e)?;
    t.add_container(pool, container).map_err(e)?;
    t.commit().map_err(e)?;
    Ok(Fixture { fs, pool, container })
}

fn file(fs: FilespaceId, path: &[u8], size: u64, chunks: Vec<ObjectChunk>) -> NewObject {
    NewObject {
        filespace: fs,
        path: path.to_vec(),
        kind: ObjectKind::Backup,
        object_type: ObjectType::File,
        attrs: Attributes {
            size,
            mtime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 1,
            mode: 0o100644,
            uid: 1000,
            gid: 100,
            link_target: None,
            ino: u64::MAX - 7,
            // Carried in the `meta` column: both backends must give them back byte for byte.
            rdev: 0x0801,
            xattrs: vec![
                (b"user.k".to_vec(), vec![0, 0xff]),
                (b"system.posix_acl_access".to_vec(), vec![2, 0, 0, 0, 1, 0, 6, 0]),
            ],
            extents: (size >= 10).then(|| vec![(2, 3), (size - 1, 1)]),
            sealed_by: size.is_multiple_of(2).then_some(*b"sealing key id16"),
        },
        mgmt_class: None,
        description: None,
        retain_until: None,
        chunks,
        replica: None,
    }
}

fn new_chunk(container: ContainerId, offset: u64) -> ObjectChunk {
    ObjectChunk::New(NewChunk { container, offset, stored_len: 100, raw_len: 300, codec: 2 })
}

/// Gives the fixture's domain a default class keeping every version, so a case can store
/// more versions than versions-exist (which applies at backup time), then tighten the
/// policy to TSM's defaults, as an administrator would, with [`default_policy`].
fn keep_every_version(cat: &dyn Catalog) -> std::result::Result<MgmtClassId, String> {
    let domain = cat.domain("standard").map_err(e)?.ok_or("no standard domain")?.id;
    let all =
        BackupCopyGroup { versions_exist: crate::expire::NO_LIMIT, ..BackupCopyGroup::default() };
    cat.define_mgmt_class(domain, "standard", all, ArchiveCopyGroup::default()).map_err(e)
}

fn default_policy(cat: &dyn Catalog, class: MgmtClassId) -> CaseResult {
    cat.update_mgmt_class(class, BackupCopyGroup::default(), ArchiveCopyGroup::default()).map_err(e)
}

fn consistent(cat: &dyn Catalog) -> CaseResult {
    let report = cat.check().map_err(e)?;
    ensure!(report.problems.is_empty(), "inconsistent: {:?}", report.problems);
    Ok(())
}

/// Domains, management classes and copy groups; duplicates and bad references are errors.
pub fn policy(cat: &dyn Catalog) -> CaseResult {
    let d = cat.define_domain("standard", "the default").map_err(e)?;
    ensure!(
        matches!(cat.define_domain("standard", ""), Err(CatalogError::Exists { .. })),
        "duplicate domain accepted"
    );
    ensure!(
        cat.domain("standard").map_err(e)?.map(|x| x.id) == Some(d),
        "domain not found by name"
    );
    ensure!(cat.domain("nope").map_err(e)?.is_none(), "unknown domain found");
    let backup = BackupCopyGroup::default();
    ensure!(
        backup
            == BackupCopyGroup {
                versions_exist: 2,
                versions_deleted: 1,
                retain_extra_days: 30,
                retain_only_days: 60
            },
        "TSM defaults changed"
    );
    let m = cat.define_mgmt_class(d, "default", backup, ArchiveCopyGroup::default()).map_err(e)?;
    let strict = BackupCopyGroup { versions_exist: 5, ..backup };
    cat.define_mgmt_class(d, "critical", strict, ArchiveCopyGroup { retain_version_days: 3650 })
        .map_err(e)?;
    ensure!(
        matches!(
            cat.define_mgmt_class(d, "default", backup, ArchiveCopyGroup::default()),
            Err(CatalogError::Exists { .. })
        ),
        "duplicate class accepted"
    );
    ensure!(
        matches!(
            cat.define_mgmt_class(DomainId(999), "x", backup, ArchiveCopyGroup::default()),
            Err(CatalogError::NotFound { .. })
        ),
        "class in unknown domain accepted"
    );
    let zero = BackupCopyGroup { versions_exist: 0, ..backup };
    ensure!(
        cat.define_mgmt_class(d, "broken", zero, ArchiveCopyGroup::default()).is_err(),
        "versions-exist 0 accepted"
    );
    let classes = cat.mgmt_classes(d).map_err(e)?;
    let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    ensure!(names == ["critical", "default"], "classes {names:?}");
    ensure!(
        classes[1].id == m
            && classes[0].backup.versions_exist == 5
            && classes[0].archive.retain_version_days == 3650,
        "copy groups not stored"
    );
    Ok(())
}

/// Nodes are unique and lockable; filespaces are created once.
/// Schedules are named per domain; one event per schedule, node and window, whoever claims
/// it first; deleting a schedule, its domain or a node takes their events.
pub fn schedules_and_their_events(cat: &dyn Catalog) -> CaseResult {
    let d = cat.define_domain("standard", "").map_err(e)?;
    let other = cat.define_domain("other", "").map_err(e)?;
    let spec = ScheduleSpec {
        action: "expire".into(),
        objects: vec!["/a, b".into(), "/c".into()],
        start: 1_000,
        duration: 60,
        period: 3_600,
        days: vec!["mon".into(), "fri".into()],
    };
    let id = cat.define_schedule(d, "nightly", &spec).map_err(e)?;
    ensure!(
        matches!(cat.define_schedule(d, "nightly", &spec), Err(CatalogError::Exists { .. })),
        "a second schedule of one name in a domain"
    );
    let elsewhere = cat.define_schedule(other, "nightly", &spec).map_err(e)?;
    let all = cat.schedules().map_err(e)?;
    ensure!(all.len() == 2 && all[1].spec == spec && all[1].domain_name == "standard", "{all:?}");
    let changed = ScheduleSpec { action: "reclaim".into(), days: Vec::new(), ..spec.clone() };
    cat.update_schedule(id, &changed).map_err(e)?;
    let all = cat.schedules().map_err(e)?;
    ensure!(all.iter().any(|s| s.id == id && s.spec == changed), "update not kept: {all:?}");
    ensure!(cat.update_schedule(ScheduleId(4242), &spec).is_err(), "an unknown schedule updated");

    let first = cat.claim_event(id, None, 4_600, "started", 4_610).map_err(e)?;
    ensure!(first.is_some(), "the first claim of a window failed");
    let again = cat.claim_event(id, None, 4_600, "started", 4_611).map_err(e)?;
    ensure!(again.is_none(), "a window claimed twice");
    let a = cat.register_node("alpha", "h", d).map_err(e)?;
    cat.claim_event(id, Some(a), 4_600, "missed", 4_700).map_err(e)?;
    cat.claim_event(elsewhere, None, 8_200, "missed", 8_300).map_err(e)?;
    let event = first.ok_or("no event")?;
    cat.end_event(event, "completed", "3 versions expired", 4_620).map_err(e)?;
    let events = cat.events(0).map_err(e)?;
    ensure!(events.len() == 3, "{events:?}");
    let server = events.iter().find(|v| v.id == event).ok_or("the event is gone")?;
    ensure!(
        server.state == "completed"
            && server.detail == "3 versions expired"
            && server.started == Some(4_610)
            && server.ended == Some(4_620)
            && server.node.is_none()
            && server.action == "reclaim"
            && server.schedule_name == "nightly",
        "{server:?}"
    );
    ensure!(
        events.iter().any(|v| v.node.as_deref() == Some("alpha") && v.state == "missed"),
        "{events:?}"
    );
    ensure!(cat.events(5_000).map_err(e)?.len() == 1, "events since a time");
    cat.delete_node(a).map_err(e)?;
    ensure!(cat.events(0).map_err(e)?.len() == 2, "a deleted node's events stayed");
    cat.delete_schedule(id).map_err(e)?;
    ensure!(cat.events(0).map_err(e)?.len() == 1, "a deleted schedule's events stayed");
    ensure!(cat.delete_schedule(id).is_err(), "a schedule deleted twice");
    cat.delete_domain(other).map_err(e)?;
    ensure!(cat.schedules().map_err(e)?.is_empty(), "a deleted domain's schedules stayed");
    ensure!(cat.events(0).map_err(e)?.is_empty(), "a deleted domain's events stayed");
    Ok(())
}

/// A client schedule runs for the nodes associated with it, once each; a node ends only its
/// own started event; moving a node to another domain or deleting it, or deleting the
/// schedule, ends its associations.
pub fn associations_and_node_events(cat: &dyn Catalog) -> CaseResult {
    let d = cat.define_domain("standard", "").map_err(e)?;
    let other = cat.define_domain("other", "").map_err(e)?;
    let spec = ScheduleSpec {
        action: "incremental".into(),
        objects: vec!["/home".into()],
        start: 0,
        duration: 60,
        period: 3_600,
        days: Vec::new(),
    };
    let s = cat.define_schedule(d, "nightly", &spec).map_err(e)?;
    let a = cat.register_node("alpha", "h", d).map_err(e)?;
    let b = cat.register_node("beta", "h", d).map_err(e)?;
    ensure!(cat.associate(s, a).map_err(e)?, "a first association");
    ensure!(!cat.associate(s, a).map_err(e)?, "an association made twice");
    cat.associate(s, b).map_err(e)?;
    let all = cat.associations().map_err(e)?;
    let names: Vec<&str> = all.iter().map(|x| x.node_name.as_str()).collect();
    ensure!(names == ["alpha", "beta"] && all[0].schedule_name == "nightly", "{all:?}");

    let ea = cat.claim_event(s, Some(a), 3_600, "started", 3_610).map_err(e)?.ok_or("claim")?;
    let eb = cat.claim_event(s, Some(b), 3_600, "started", 3_620).map_err(e)?.ok_or("claim")?;
    ensure!(
        cat.end_node_event(b, ea, "completed", "not mine", 3_700).is_err(),
        "a node ended another's event"
    );
    cat.end_node_event(a, ea, "completed with warnings", "2 files skipped", 3_700).map_err(e)?;
    ensure!(
        cat.end_node_event(a, ea, "failed", "again", 3_800).is_err(),
        "an ended event ended again"
    );
    cat.end_event(eb, "severed", "the node's session ended", 3_900).map_err(e)?;
    ensure!(cat.end_event(eb, "severed", "again", 3_901).is_err(), "an event severed twice");
    ensure!(
        cat.end_node_event(b, eb, "completed", "late", 4_000).is_err(),
        "a severed event ended"
    );
    let events = cat.events(0).map_err(e)?;
    let of = |n: &str| events.iter().find(|v| v.node.as_deref() == Some(n)).cloned();
    let (va, vb) = (of("alpha").ok_or("alpha's event")?, of("beta").ok_or("beta's event")?);
    ensure!(va.state == "completed with warnings" && va.detail == "2 files skipped", "{va:?}");
    ensure!(vb.state == "severed", "{vb:?}");
    let mine = cat.node_events(a, 0).map_err(e)?;
    ensure!(mine.len() == 1 && mine[0].id == ea, "alpha's events only: {mine:?}");
    ensure!(cat.node_events(a, 3_601).map_err(e)?.is_empty(), "events since a time");
    ensure!(cat.started_node_events().map_err(e)?.is_empty(), "ended events listed as started");
    let ec = cat.claim_event(s, Some(a), 7_200, "started", 7_210).map_err(e)?.ok_or("claim")?;
    cat.claim_event(s, None, 7_200, "started", 7_210).map_err(e)?;
    let started = cat.started_node_events().map_err(e)?;
    ensure!(started.len() == 1 && started[0].id == ec, "a node's started event: {started:?}");

    cat.set_node_domain(b, other).map_err(e)?;
    let all = cat.associations().map_err(e)?;
    ensure!(all.len() == 1 && all[0].node == a, "a node moved away kept its schedule: {all:?}");
    cat.dissociate(s, a).map_err(e)?;
    ensure!(cat.dissociate(s, a).is_err(), "an association removed twice");
    cat.associate(s, a).map_err(e)?;
    cat.delete_schedule(s).map_err(e)?;
    ensure!(cat.associations().map_err(e)?.is_empty(), "a deleted schedule's associations");
    let s2 = cat.define_schedule(d, "again", &spec).map_err(e)?;
    let c = cat.register_node("gamma", "h", d).map_err(e)?;
    cat.associate(s2, c).map_err(e)?;
    cat.delete_node(c).map_err(e)?;
    ensure!(cat.associations().map_err(e)?.is_empty(), "a deleted node's associations");
    Ok(())
}

/// Option sets keep their options in the order defined, replace a single-valued one, and
/// give them to the nodes that use them; deleting a set leaves its nodes without one.
pub fn client_option_sets(cat: &dyn Catalog) -> CaseResult {
    let d = cat.define_domain("standard", "").map_err(e)?;
    let a = cat.register_node("alpha", "h", d).map_err(e)?;
    cat.define_cloptset("servers", "the data centre").map_err(e)?;
    ensure!(
        matches!(cat.define_cloptset("servers", ""), Err(CatalogError::Exists { .. })),
        "a second set of one name"
    );
    let opt = |name: &str, value: &str, force: bool| ClientOpt {
        name: name.into(),
        value: value.into(),
        force,
    };
    cat.add_clientopt("servers", &opt("exclude", "*.tmp", true), false).map_err(e)?;
    cat.add_clientopt("servers", &opt("compression", "lz4", false), true).map_err(e)?;
    cat.add_clientopt("servers", &opt("exclude", "/var/cache", false), false).map_err(e)?;
    cat.add_clientopt("servers", &opt("compression", "zstd:9", true), true).map_err(e)?;
    ensure!(
        cat.add_clientopt("nothing", &opt("threads", "2", false), true).is_err(),
        "an option added to no set"
    );
    ensure!(cat.node_cloptset(a).map_err(e)?.is_none(), "a node with a set it was not given");
    cat.set_node_cloptset(a, Some("servers")).map_err(e)?;
    ensure!(cat.set_node_cloptset(a, Some("nothing")).is_err(), "a node given no set");
    let set = cat.node_cloptset(a).map_err(e)?.ok_or("the node's set")?;
    ensure!(
        set.name == "servers"
            && set.description == "the data centre"
            && set.options
                == [
                    opt("exclude", "*.tmp", true),
                    opt("exclude", "/var/cache", false),
                    opt("compression", "zstd:9", true),
                ],
        "{set:?}"
    );
    ensure!(cat.delete_clientopt("servers", "exclude").map_err(e)? == 2, "two excludes deleted");
    ensure!(cat.cloptsets().map_err(e)?[0].options.len() == 1, "{:?}", cat.cloptsets());
    cat.delete_cloptset("servers").map_err(e)?;
    ensure!(cat.node_cloptset(a).map_err(e)?.is_none(), "a deleted set still given");
    ensure!(cat.cloptsets().map_err(e)?.is_empty(), "a deleted set listed");
    ensure!(cat.delete_cloptset("servers").is_err(), "a set deleted twice");
    Ok(())
}

/// A filespace's last backup is its latest, however it ended; its last completed one is not
/// replaced by a failure (the age alerts and metrics go by).
pub fn backup_runs_are_recorded_per_filespace(cat: &dyn Catalog) -> CaseResult {
    let d = cat.define_domain("standard", "").map_err(e)?;
    let a = cat.register_node("alpha", "h", d).map_err(e)?;
    let home = cat.filespace(a, "/home").map_err(e)?;
    cat.filespace(a, "/etc").map_err(e)?;
    let fs = |name: &str| -> Result<Filespace, String> {
        let all = cat.filespaces(a).map_err(e)?;
        all.into_iter().find(|f| f.name == name).ok_or_else(|| format!("no filespace {name}"))
    };
    ensure!(
        fs("/home")?.last_backup.is_none() && fs("/home")?.last_completed.is_none(),
        "a filespace never backed up has a last backup"
    );
    let run = |started, result, objects| BackupRun {
        started,
        ended: started + 30,
        result,
        objects,
        bytes: objects * 1000 + (1 << 40),
        warnings: 2,
    };
    let ok = run(1_000, RunResult::CompletedWithWarnings, 7);
    cat.record_backup(home, &ok).map_err(e)?;
    let f = fs("/home")?;
    ensure!(f.last_backup == Some(ok) && f.last_completed == Some(ok), "recorded {f:?}");
    let failed = run(2_000, RunResult::Failed, 3);
    cat.record_backup(home, &failed).map_err(e)?;
    let f = fs("/home")?;
    ensure!(f.last_backup == Some(failed) && f.last_completed == Some(ok), "after a failure {f:?}");
    let done = run(3_000, RunResult::Completed, 0);
    cat.record_backup(home, &done).map_err(e)?;
    let f = fs("/home")?;
    ensure!(f.last_backup == Some(done) && f.last_completed == Some(done), "after {f:?}");
    ensure!(fs("/etc")?.last_backup.is_none(), "another filespace's run recorded on /etc");
    ensure!(
        matches!(cat.record_backup(FilespaceId(4242), &done), Err(CatalogError::NotFound { .. })),
        "a run recorded for an unknown filespace"
    );
    // The history keeps every run, oldest first, and only the filespace's own.
    let history = cat.backup_runs(home, 0).map_err(e)?;
    ensure!(history == [ok, failed, done], "history {history:?}");
    ensure!(cat.backup_runs(home, 2_030).map_err(e)? == [failed, done], "since 2030");
    let etc = fs("/etc")?.id;
    ensure!(cat.backup_runs(etc, 0).map_err(e)?.is_empty(), "/etc has /home's history");
    ensure!(cat.backup_runs(FilespaceId(4242), 0).map_err(e)?.is_empty(), "unknown filespace");
    // Bounded: past RUNS_KEPT runs, the oldest go.
    for i in 0..crate::RUNS_KEPT as i64 {
        cat.record_backup(etc, &run(10_000 + i, RunResult::Completed, 1)).map_err(e)?;
    }
    cat.record_backup(etc, &run(20_000, RunResult::Failed, 1)).map_err(e)?;
    let kept = cat.backup_runs(etc, 0).map_err(e)?;
    ensure!(kept.len() == crate::RUNS_KEPT, "{} runs kept", kept.len());
    ensure!(
        kept[0].started == 10_001 && kept.last() == Some(&run(20_000, RunResult::Failed, 1)),
        "kept from {:?} to {:?}",
        kept.first(),
        kept.last()
    );
    ensure!(cat.backup_runs(home, 0).map_err(e)?.len() == 3, "/etc's bound cut /home's runs");
    Ok(())
}

pub fn nodes_and_filespaces(cat: &dyn Catalog) -> CaseResult {
    let d = cat.define_domain("standard", "").map_err(e)?;
    let a = cat.register_node("alpha", "$argon2id$hash", d).map_err(e)?;
    ensure!(
        matches!(cat.register_node("alpha", "h", d), Err(CatalogError::Exists { .. })),
        "duplicate node accepted"
    );
    ensure!(
        matches!(cat.register_node("beta", "h", DomainId(77)), Err(CatalogError::NotFound { .. })),
        "node in unknown domain accepted"
    );
    let node = cat.node("alpha").map_err(e)?.ok_or("registered node not found")?;
    ensure!(
        node.id == a && !node.locked && node.password_hash == "$argon2id$hash" && node.domain == d,
        "node record {node:?}"
    );
    cat.set_node_locked(a, true).map_err(e)?;
    ensure!(cat.node("alpha").map_err(e)?.is_some_and(|n| n.locked), "lock not stored");
    ensure!(cat.set_node_locked(NodeId(4242), true).is_err(), "locking an unknown node succeeded");
    let f1 = cat.filespace(a, "/home").map_err(e)?;
    let f2 = cat.filespace(a, "/home").map_err(e)?;
    let f3 = cat.filespace(a, "/etc").map_err(e)?;
    ensure!(f1 == f2 && f1 != f3, "filespace get-or-create");
    let names: Vec<String> = cat.filespaces(a).map_err(e)?.into_iter().map(|f| f.name).collect();
    ensure!(names == ["/etc", "/home"], "filespaces {names:?}");
    ensure!(cat.filespace(NodeId(999), "/x").is_err(), "filespace of unknown node created");
    ensure!(cat.nodes().map_err(e)?.len() == 1, "node list");
    // Administrators are separate accounts: the same name may be a node and an administrator.
    cat.register_admin("alpha", "$argon2id$admin", &[]).map_err(e)?;
    ensure!(
        matches!(
            cat.register_admin("alpha", "h", &[Privilege::System]),
            Err(CatalogError::Exists { .. })
        ),
        "duplicate administrator accepted"
    );
    let admin = cat.admin("alpha").map_err(e)?.ok_or("registered administrator not found")?;
    ensure!(
        admin.password_hash == "$argon2id$admin" && !admin.locked && admin.privileges.is_empty(),
        "admin record {admin:?}"
    );
    cat.set_admin_privileges("alpha", &[Privilege::Policy, Privilege::Operator]).map_err(e)?;
    let admin = cat.admin("alpha").map_err(e)?.ok_or("administrator gone")?;
    ensure!(
        admin.privileges == [Privilege::Policy, Privilege::Operator],
        "granted {:?}",
        admin.privileges
    );
    ensure!(
        matches!(cat.set_admin_privileges("nobody", &[]), Err(CatalogError::NotFound { .. })),
        "privileges granted to nobody"
    );
    ensure!(cat.admin("nobody").map_err(e)?.is_none(), "unknown administrator found");
    ensure!(cat.nodes().map_err(e)?.len() == 1, "an administrator listed as a node");
    // Passwords change per account kind; administrators are locked and removed (issue 23).
    cat.set_password(true, "alpha", "$argon2id$new-admin").map_err(e)?;
    cat.set_password(false, "alpha", "$argon2id$new-node").map_err(e)?;
    let admin = cat.admin("alpha").map_err(e)?.ok_or("administrator gone")?;
    let node = cat.node("alpha").map_err(e)?.ok_or("node gone")?;
    ensure!(
        admin.password_hash == "$argon2id$new-admin" && node.password_hash == "$argon2id$new-node",
        "passwords {admin:?} {node:?}"
    );
    for admin_kind in [true, false] {
        ensure!(
            matches!(
                cat.set_password(admin_kind, "nobody", "h"),
                Err(CatalogError::NotFound { .. })
            ),
            "a password set for nobody"
        );
    }
    cat.set_admin_locked("alpha", true).map_err(e)?;
    ensure!(cat.admin("alpha").map_err(e)?.is_some_and(|a| a.locked), "not locked");
    cat.set_admin_locked("alpha", false).map_err(e)?;
    ensure!(cat.admin("alpha").map_err(e)?.is_some_and(|a| !a.locked), "not unlocked");
    ensure!(cat.set_admin_locked("nobody", true).is_err(), "nobody locked");
    cat.remove_admin("alpha").map_err(e)?;
    ensure!(cat.admin("alpha").map_err(e)?.is_none(), "removed administrator found");
    ensure!(cat.node("alpha").map_err(e)?.is_some(), "removing the administrator removed the node");
    ensure!(
        matches!(cat.remove_admin("alpha"), Err(CatalogError::NotFound { .. })),
        "removed twice"
    );
    Ok(())
}

/// A new backup version deactivates the previous one; the active inventory streams in bytewise
/// path order (non-UTF-8 names included) and excludes inactive versions and archives.
pub fn versions_and_active_inventory(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let mut t = cat.begin().map_err(e)?;
    let paths: [&[u8]; 5] = [b"/b", b"/a/z", b"/a", b"/\xff\xfename", b"/a/b"];
    for (i, p) in paths.iter().enumerate() {
        t.insert_object(&file(fx.fs, p, 10, vec![new_chunk(fx.container, i as u64 * 200)]), 100)
            .map_err(e)?;
    }
    t.commit().map_err(e)?;
    let mut t = cat.begin().map_err(e)?;
    let v2 = t
        .insert_object(&file(fx.fs, b"/a", 20, vec![new_chunk(fx.container, 5000)]), 200)
        .map_err(e)?;
    let mut archive = file(fx.fs, b"/a", 20, vec![]);
    archive.kind = ObjectKind::Archive;
    archive.description = Some("year end".into());
    archive.retain_until = Some(9_999);
    t.insert_object(&archive, 250).map_err(e)?;
    ensure!(t.deactivate(fx.fs, b"/b", 300).map_err(e)?, "deactivate found nothing");
    ensure!(!t.deactivate(fx.fs, b"/nope", 300).map_err(e)?, "deactivated a missing path");
    t.commit().map_err(e)?;

    let mut seen = Vec::new();
    cat.for_each_active(fx.fs, &mut |o| {
        seen.push((o.path.clone(), o.attrs.size));
        Ok(())
    })
    .map_err(e)?;
    let expected: Vec<(Vec<u8>, u64)> = vec![
        (b"/a".to_vec(), 20),
        (b"/a/b".to_vec(), 10),
        (b"/a/z".to_vec(), 10),
        (b"/\xff\xfename".to_vec(), 10),
    ];
    ensure!(seen == expected, "active inventory {seen:?}");

    let versions = cat.versions(fx.fs, b"/a").map_err(e)?;
    ensure!(versions.len() == 3, "{} versions of /a", versions.len());
    ensure!(
        versions[0].kind == ObjectKind::Archive
            && versions[0].description.as_deref() == Some("year end")
            && !versions[0].active,
        "archive first: {:?}",
        versions[0]
    );
    ensure!(
        versions[1].id == v2 && versions[1].active && versions[1].deactivated.is_none(),
        "new version active"
    );
    ensure!(
        !versions[2].active && versions[2].deactivated == Some(200) && versions[2].inserted == 100,
        "old version inactive at 200: {:?}",
        versions[2]
    );
    let mut all = Vec::new();
    cat.for_each_version(fx.fs, &mut |v| {
        all.push((v.path.clone(), v.kind, v.active, v.inserted));
        Ok(())
    })
    .map_err(e)?;
    let expected_all = vec![
        (b"/a".to_vec(), ObjectKind::Archive, false, 250),
        (b"/a".to_vec(), ObjectKind::Backup, true, 200),
        (b"/a".to_vec(), ObjectKind::Backup, false, 100),
        (b"/a/b".to_vec(), ObjectKind::Backup, true, 100),
        (b"/a/z".to_vec(), ObjectKind::Backup, true, 100),
        (b"/b".to_vec(), ObjectKind::Backup, false, 100),
        (b"/\xff\xfename".to_vec(), ObjectKind::Backup, true, 100),
    ];
    ensure!(all == expected_all, "all versions {all:?}");
    let b = cat.versions(fx.fs, b"/b").map_err(e)?;
    ensure!(
        b.len() == 1 && !b[0].active && b[0].deactivated == Some(300),
        "deleted file's version"
    );
    let got = cat.object(v2).map_err(e)?.ok_or("object by id")?;
    ensure!(
        got.attrs.mode == 0o100644
            && got.attrs.uid == 1000
            && got.attrs.mtime_ns == 1_700_000_000_000_000_000
            && got.attrs.ino == u64::MAX - 7
            && got.attrs.rdev == 0x0801
            && got.attrs.xattrs.len() == 2
            && got.attrs.xattrs[0] == (b"user.k".to_vec(), vec![0, 0xff])
            && got.attrs.extents == Some(vec![(2, 3), (19, 1)]),
        "attributes {:?}",
        got.attrs
    );
    // A visitor's error stops the walk and comes back.
    let mut n = 0;
    let r = cat.for_each_active(fx.fs, &mut |_| {
        n += 1;
        Err(CatalogError::Refused("stop".into()))
    });
    ensure!(n == 1 && matches!(r, Err(CatalogError::Refused(_))), "visitor error ignored");
    consistent(cat)
}

/// Reference counts follow objects; chunks and containers in use cannot be deleted.
pub fn chunks_and_reference_counts(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let mut t = cat.begin().map_err(e)?;
    let a = t
        .insert_object(
            &file(
                fx.fs,
                b"/a",
                600,
                vec![new_chunk(fx.container, 0), new_chunk(fx.container, 100)],
            ),
            1,
        )
        .map_err(e)?;
    t.commit().map_err(e)?;
    let chunks = cat.object_chunks(a).map_err(e)?;
    ensure!(
        chunks.len() == 2
            && chunks[1].location.offset == 100
            && chunks[0].location.container == fx.container,
        "chunks {chunks:?}"
    );
    let (c0, c1) = (chunks[0].id, chunks[1].id);
    // A second object shares chunk 0 twice (deduplication within and across files).
    let mut t = cat.begin().map_err(e)?;
    let b = t
        .insert_object(
            &file(
                fx.fs,
                b"/b",
                900,
                vec![
                    ObjectChunk::Existing(c0),
                    ObjectChunk::Existing(c0),
                    ObjectChunk::Existing(c1),
                ],
            ),
            2,
        )
        .map_err(e)?;
    ensure!(
        matches!(
            t.insert_object(
                &file(fx.fs, b"/c", 1, vec![ObjectChunk::Existing(ChunkRowId(999_999))]),
                2
            ),
            Err(CatalogError::NotFound { .. })
        ),
        "unknown chunk referenced"
    );
    t.commit().map_err(e)?;
    // In batches, in the order asked, an unknown object as `None` among the others.
    let batch = cat.objects_chunks(&[b, ObjectId(999_999), a]).map_err(e)?;
    let ids = |c: &[ChunkRef]| c.iter().map(|c| c.id).collect::<Vec<_>>();
    ensure!(
        matches!(&batch[..], [Some((f1, b1)), None, Some((f2, a1))]
            if *f1 == fx.fs && *f2 == fx.fs && ids(b1) == [c0, c0, c1] && ids(a1) == [c0, c1]),
        "objects_chunks {batch:?}"
    );
    ensure!(cat.objects_chunks(&[]).map_err(e)?.is_empty(), "an empty batch");
    let refcounts = |cat: &dyn Catalog| -> std::result::Result<Vec<u64>, String> {
        Ok(cat.chunks_in_container(fx.container).map_err(e)?.iter().map(|c| c.refcount).collect())
    };
    ensure!(refcounts(cat)? == [3, 2], "refcounts {:?}", refcounts(cat)?);
    consistent(cat)?;
    let mut t = cat.begin().map_err(e)?;
    ensure!(
        matches!(t.delete_chunk(c0), Err(CatalogError::Refused(_))),
        "deleted a referenced chunk"
    );
    ensure!(
        matches!(t.delete_container(fx.container), Err(CatalogError::Refused(_))),
        "deleted a container in use"
    );
    t.delete_object(b, NOW).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(refcounts(cat)? == [1, 1], "after deleting /b: {:?}", refcounts(cat)?);
    let mut t = cat.begin().map_err(e)?;
    t.delete_object(a, NOW).map_err(e)?;
    t.commit().map_err(e)?;
    let report = cat.check().map_err(e)?;
    ensure!(
        report.problems.is_empty() && report.unreferenced_chunks == 2 && report.objects == 0,
        "report {report:?}"
    );
    let mut t = cat.begin().map_err(e)?;
    t.delete_chunk(c0).map_err(e)?;
    t.delete_chunk(c1).map_err(e)?;
    t.delete_container(fx.container).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(cat.containers(fx.pool).map_err(e)?.is_empty(), "container not deleted");
    let mut t = cat.begin().map_err(e)?;
    ensure!(
        t.insert_object(&file(fx.fs, b"/x", 1, vec![new_chunk(fx.container, 0)]), 3).is_err(),
        "chunk in an unrecorded container accepted"
    );
    drop(t);
    // Ids are never reused: a stale id must not name other data.
    let mut t = cat.begin().map_err(e)?;
    t.add_container(fx.pool, fx.container).map_err(e)?;
    let again =
        t.insert_object(&file(fx.fs, b"/b", 1, vec![new_chunk(fx.container, 0)]), 4).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(again != a && again != b, "object id {} reused", again.0);
    let chunk = cat.object_chunks(again).map_err(e)?[0].id;
    ensure!(chunk != c0 && chunk != c1, "chunk id {} reused", chunk.0);
    consistent(cat)
}

/// Nothing is visible before commit; a dropped transaction leaves no trace.
pub fn transactions_are_atomic(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    {
        let mut t = cat.begin().map_err(e)?;
        t.insert_object(&file(fx.fs, b"/lost", 1, vec![new_chunk(fx.container, 0)]), 1)
            .map_err(e)?;
        let mut n = 0;
        cat.for_each_active(fx.fs, &mut |_| {
            n += 1;
            Ok(())
        })
        .map_err(e)?;
        ensure!(n == 0, "uncommitted object visible to a reader");
        // dropped here: rolled back
    }
    let stats = cat.stats().map_err(e)?;
    ensure!(stats.objects == 0 && stats.chunks == 0, "rolled-back rows remain: {stats:?}");
    let mut t = cat.begin().map_err(e)?;
    t.insert_object(&file(fx.fs, b"/kept", 1, vec![new_chunk(fx.container, 0)]), 1).map_err(e)?;
    t.set_container(fx.container, 4096, true).map_err(e)?;
    t.commit().map_err(e)?;
    let c = cat.containers(fx.pool).map_err(e)?;
    ensure!(c.len() == 1 && c[0].size == 4096 && c[0].sealed, "container record {c:?}");
    let stats = cat.stats().map_err(e)?;
    ensure!(stats.objects == 1, "committed object missing");
    ensure!(
        (stats.version_bytes, stats.chunk_raw_bytes, stats.chunk_stored_bytes) == (1, 300, 100),
        "bytes counted: {stats:?}"
    );
    consistent(cat)
}

/// Thousands of objects in one transaction, streamed back in order.
pub fn large_batches_and_streaming(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let n = 20_000u64;
    let mut t = cat.begin().map_err(e)?;
    for i in 0..n {
        let path = format!("/data/dir{:03}/file{:06}", i % 97, i);
        t.insert_object(
            &file(fx.fs, path.as_bytes(), i, vec![new_chunk(fx.container, i * 100)]),
            1,
        )
        .map_err(e)?;
    }
    t.commit().map_err(e)?;
    let mut prev: Option<Vec<u8>> = None;
    let mut count = 0u64;
    cat.for_each_active(fx.fs, &mut |o| {
        if prev.as_ref().is_some_and(|p| p >= &o.path) {
            return Err(CatalogError::Damaged("out of order".into()));
        }
        prev = Some(o.path.clone());
        count += 1;
        Ok(())
    })
    .map_err(e)?;
    ensure!(count == n, "streamed {count} of {n}");
    consistent(cat)
}

/// Sessions, processes and the activity log.
pub fn sessions_processes_activity(cat: &dyn Catalog) -> CaseResult {
    use crate::coord::Coordination;
    let d = cat.define_domain("standard", "").map_err(e)?;
    let node = cat.register_node("alpha", "h", d).map_err(e)?;
    let server = cat.register_server("conformance", 60).map_err(e)?;
    let (number, s) = cat.open_session(server, "alpha", Some(node), "qsm", "[::1]:1").map_err(e)?;
    let s = s.ok_or("a node's session has no record")?;
    cat.update_session(s, 1000, 3).map_err(e)?;
    cat.update_session(s, 24, 1).map_err(e)?;
    let running = cat.running_sessions().map_err(e)?;
    ensure!(
        running.len() == 1
            && running[0].bytes == 1024
            && running[0].objects == 4
            && running[0].state == "running",
        "sessions {running:?}"
    );
    cat.close_session(number, "cancelled").map_err(e)?;
    ensure!(cat.running_sessions().map_err(e)?.is_empty(), "ended session still running");
    let p = cat.start_process_on(server, "expire inventory", "starting", &[]).map_err(e)?;
    let p = p.map_err(|x| format!("refused: {x:?}"))?;
    cat.end_process(p, "ended", "deleted 12 versions").map_err(e)?;
    let proc = cat.process(p).map_err(e)?.ok_or("process missing")?;
    ensure!(
        proc.state == "ended" && proc.detail == "deleted 12 versions" && proc.ended.is_some(),
        "process {proc:?}"
    );
    cat.log(Severity::Info, "session started", Some(node), Some(s), None).map_err(e)?;
    cat.log(Severity::Warning, "expiration slow", None, None, Some(p)).map_err(e)?;
    let log = cat.activity(0, 10).map_err(e)?;
    ensure!(
        log.len() == 2
            && log[0].message == "session started"
            && log[1].severity == Severity::Warning
            && log[1].process == Some(p),
        "log {log:?}"
    );
    ensure!(cat.activity(0, 1).map_err(e)?.len() == 1, "limit ignored");
    Ok(())
}

/// Several servers on one catalog (module `coord`): sessions and processes of each are seen
/// and cancelled by the others, one process of a kind runs across them, leases follow the
/// heartbeat, and a server whose heartbeat lapsed loses what it held to the first live one.
pub fn servers_share_sessions_processes_and_leases(cat: &dyn Catalog) -> CaseResult {
    use crate::coord::{Coordination, Excluded, SessionsOf};
    let d = cat.define_domain("standard", "").map_err(e)?;
    let node = cat.register_node("alpha", "h", d).map_err(e)?;
    let a = cat.register_server("a", 60).map_err(e)?;
    let b = cat.register_server("b", 60).map_err(e)?;
    ensure!(a != b, "one id for two servers");

    // Sessions: numbered by the catalog, listed with their server, cancelled from anywhere.
    let (s1, record) = cat.open_session(a, "alpha", Some(node), "qsm", "10.0.0.1:1").map_err(e)?;
    let record = record.ok_or("a node's session has no record")?;
    let (s2, none) = cat.open_session(b, "root", None, "qsm", "10.0.0.2:1").map_err(e)?;
    ensure!(none.is_none() && s1 != s2, "sessions {s1} {s2} {none:?}");
    cat.update_session(record, 500, 2).map_err(e)?;
    let open = cat.open_sessions().map_err(e)?;
    ensure!(
        open.len() == 2
            && open[0].id == s1
            && open[0].server_name == "a"
            && open[0].bytes == 500
            && open[1].server_name == "b"
            && open[1].node.is_none(),
        "open sessions {open:?}"
    );
    ensure!(cat.cancel_sessions(SessionsOf::Node(node)).map_err(e)? == 1, "node's sessions");
    ensure!(cat.cancel_sessions(SessionsOf::Admin("root")).map_err(e)? == 1, "admin's sessions");
    ensure!(cat.cancel_sessions(SessionsOf::Id(s2 + 1000)).map_err(e)? == 0, "no such session");
    let beat = cat.heartbeat(a, &[], &[]).map_err(e)?;
    ensure!(beat.cancel_sessions == [s1] && beat.lost.is_empty(), "beat of a {beat:?}");
    let beat = cat.heartbeat(b, &[], &[]).map_err(e)?;
    ensure!(beat.cancel_sessions == [s2], "beat of b {beat:?}");
    cat.close_session(s1, "cancelled").map_err(e)?;
    ensure!(cat.running_sessions().map_err(e)?.is_empty(), "the record is still running");
    ensure!(cat.open_sessions().map_err(e)?.len() == 1, "closed session still listed");

    // Processes: one of a kind across servers; cancelled through the catalog.
    let expire = ["expire inventory"];
    let p = cat.start_process_on(a, "expire inventory", "all", &expire).map_err(e)?;
    let p = p.map_err(|x| format!("refused: {x:?}"))?;
    let refused = cat.start_process_on(b, "expire inventory", "all", &expire).map_err(e)?;
    ensure!(
        refused == Err(Excluded { id: p, kind: "expire inventory".into(), server: "a".into() }),
        "second expiration: {refused:?}"
    );
    let pool = ["reclaim stgpool", "audit stgpool"];
    let q = cat.start_process_on(b, "audit stgpool", "", &pool).map_err(e)?;
    let q = q.map_err(|x| format!("refused: {x:?}"))?;
    let r = cat.start_process_on(a, "reclaim stgpool", "", &pool).map_err(e)?;
    ensure!(r.as_ref().is_err_and(|x| x.id == q), "reclaim beside an audit: {r:?}");
    cat.heartbeat(b, &[], &[(q, "12 chunks read".into())]).map_err(e)?;
    let running = cat.running_processes().map_err(e)?;
    ensure!(
        running.len() == 2
            && running[1].server_name == "b"
            && running[1].progress == "12 chunks read",
        "running {running:?}"
    );
    ensure!(cat.cancel_process(q).map_err(e)?, "cancel of a running process");
    let beat = cat.heartbeat(b, &[], &[]).map_err(e)?;
    ensure!(beat.cancel_processes == [q], "beat of b {beat:?}");
    cat.end_process(q, "cancelled", "stopped").map_err(e)?;
    ensure!(!cat.cancel_process(q).map_err(e)?, "cancel of an ended process");
    cat.end_process(p, "ended", "done").map_err(e)?;

    // Leases: taken when a container opens, then exactly what each beat says is open. Ids
    // use all 64 bits.
    let big = ContainerId(u64::MAX - 7);
    cat.lease_container(a, big).map_err(e)?;
    cat.lease_container(b, ContainerId(5)).map_err(e)?;
    let leased = cat.leased_containers().map_err(e)?;
    ensure!(leased.len() == 2 && leased.contains(&big), "leases {leased:?}");
    cat.heartbeat(a, &[ContainerId(7)], &[]).map_err(e)?;
    let leased = cat.leased_containers().map_err(e)?;
    ensure!(
        leased == [ContainerId(5), ContainerId(7)].into_iter().collect(),
        "leases after a's beat {leased:?}"
    );

    // Server c stops beating: what it holds is no longer listed, and the first live server to
    // beat ends it.
    let c = cat.register_server("c", 10).map_err(e)?;
    let (s3, record3) = cat.open_session(c, "alpha", Some(node), "qsm", "p").map_err(e)?;
    let pc = cat.start_process_on(c, "backup db", "", &["backup db"]).map_err(e)?;
    let pc = pc.map_err(|x| format!("refused: {x:?}"))?;
    cat.lease_container(c, ContainerId(9)).map_err(e)?;
    crate::sql::write(cat.sql(), "ageing a heartbeat", |s| {
        s.exec(
            "UPDATE servers SET heartbeat = heartbeat - 100 WHERE id = ?1",
            &[crate::sql::Value::Int(c.0)],
        )
    })
    .map_err(e)?;
    ensure!(
        !cat.open_sessions().map_err(e)?.iter().any(|o| o.id == s3),
        "a dead server's session listed"
    );
    ensure!(!cat.leased_containers().map_err(e)?.contains(&ContainerId(9)), "a dead lease");
    let again = cat.start_process_on(a, "backup db", "", &["backup db"]).map_err(e)?;
    let again = again.map_err(|x| format!("a dead server's process blocks: {x:?}"))?;
    cat.end_process(again, "ended", "").map_err(e)?;
    let beat = cat.heartbeat(a, &[], &[]).map_err(e)?;
    ensure!(beat.lost == ["c"], "beat of a {beat:?}");
    let ended = cat.process(pc).map_err(e)?.ok_or("process missing")?;
    ensure!(ended.ended.is_some() && ended.state == "failed", "c's process {ended:?}");
    ensure!(
        !cat.running_sessions().map_err(e)?.iter().any(|r| Some(r.id) == record3),
        "c's session record still running"
    );
    let beat = cat.heartbeat(c, &[], &[]).map_err(e)?;
    ensure!(beat.revived, "c came back unnoticed {beat:?}");

    // A server stopping ends what it holds.
    let (s4, _) = cat.open_session(b, "alpha", Some(node), "qsm", "p").map_err(e)?;
    cat.stop_server(b, "failed: its server stopped").map_err(e)?;
    ensure!(
        !cat.open_sessions().map_err(e)?.iter().any(|o| o.id == s4 || o.id == s2),
        "a stopped server's sessions listed"
    );
    Ok(())
}

/// Reclamation repoints chunks to a new container in one transaction.
pub fn reclamation_moves(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let mut t = cat.begin().map_err(e)?;
    let obj =
        t.insert_object(&file(fx.fs, b"/a", 1, vec![new_chunk(fx.container, 64)]), 1).map_err(e)?;
    t.commit().map_err(e)?;
    let chunk = cat.object_chunks(obj).map_err(e)?[0].id;
    let target = ContainerId(u64::MAX - 5); // ids use all 64 bits
    let mut t = cat.begin().map_err(e)?;
    t.add_container(fx.pool, target).map_err(e)?;
    t.add_container(fx.pool, target).map_err(e)?; // idempotent
    ensure!(
        matches!(
            t.move_chunk(chunk, (fx.container, 65), target, 128),
            Err(CatalogError::Refused(_))
        ),
        "moved from where the chunk is not"
    );
    t.move_chunk(chunk, (fx.container, 64), target, 128).map_err(e)?;
    t.delete_container(fx.container).map_err(e)?;
    t.commit().map_err(e)?;
    let loc = cat.object_chunks(obj).map_err(e)?[0].location;
    ensure!(loc.container == target && loc.offset == 128, "moved to {loc:?}");
    let ids: Vec<ContainerId> = cat.containers(fx.pool).map_err(e)?.iter().map(|c| c.id).collect();
    ensure!(ids == [target], "containers {ids:?}");
    consistent(cat)
}

/// Keyed chunks: unique per scope (a second copy references the first), invisible to other
/// scopes, found only while referenced; the epoch rises when a chunk loses its last
/// reference; scopes and key copies per node.
pub fn dedup_scopes_and_keyed_chunks(cat: &dyn Catalog) -> CaseResult {
    let f = fixture(cat)?;
    let alpha = cat.node("alpha").map_err(e)?.ok_or("no node alpha")?.id;
    let domain = cat.domain("standard").map_err(e)?.ok_or("no domain")?.id;
    let beta = cat.register_node("beta", "$argon2id$y", domain).map_err(e)?;
    let sa = cat.dedup_scope(alpha, [1; 32]).map_err(e)?;
    ensure!(sa.name == "node:alpha" && sa.secret == [1; 32], "alpha's own scope: {sa:?}");
    ensure!(cat.dedup_scope(alpha, [9; 32]).map_err(e)? == sa, "a scope is made once");
    let sb = cat.dedup_scope(beta, [2; 32]).map_err(e)?;
    ensure!(sb.id != sa.id, "each node has its own scope by default");

    let sealed_keyed =
        |offset: u64, hash: u8, scope: Option<DedupScopeId>, sealed: bool| match new_chunk(
            f.container,
            offset,
        ) {
            ObjectChunk::New(n) => {
                ObjectChunk::Keyed(n, ChunkKey { hash: [hash; 32], scope, sealed })
            }
            other => other,
        };
    let keyed = |offset, hash, scope| sealed_keyed(offset, hash, scope, false);
    let epoch0 = cat.dedup_epoch().map_err(e)?;
    let mut t = cat.begin().map_err(e)?;
    let a =
        t.insert_object(&file(f.fs, b"a", 10, vec![keyed(48, 7, Some(sa.id))]), 1).map_err(e)?;
    // The same content stored again in the same scope (a concurrent session): one chunk.
    let b =
        t.insert_object(&file(f.fs, b"b", 10, vec![keyed(1000, 7, Some(sa.id))]), 1).map_err(e)?;
    // The same id without a scope (dedup off) and in beta's scope: separate chunks.
    let c = t.insert_object(&file(f.fs, b"c", 10, vec![keyed(2000, 7, None)]), 1).map_err(e)?;
    let d =
        t.insert_object(&file(f.fs, b"d", 10, vec![keyed(3000, 7, Some(sb.id))]), 1).map_err(e)?;
    // The same id sealed, in alpha's scope: another chunk, never given for a plaintext one.
    let s = t
        .insert_object(&file(f.fs, b"s", 10, vec![sealed_keyed(4000, 7, Some(sa.id), true)]), 1)
        .map_err(e)?;
    t.commit().map_err(e)?;
    let chunk = |o| {
        cat.object_chunks(o).map_err(e).and_then(|v| v.first().cloned().ok_or("no chunk".into()))
    };
    let (ca, cb, cc, cd, cs) = (chunk(a)?, chunk(b)?, chunk(c)?, chunk(d)?, chunk(s)?);
    ensure!(cs.id != ca.id, "sealed and plaintext chunks of one id are apart");
    ensure!(
        cat.find_chunks(sa.id, true, &[[7; 32]]).map_err(e)? == vec![Some(cs.id)],
        "the sealed lookup finds the sealed chunk only"
    );
    ensure!(
        ca.id == cb.id && ca.location.offset == 48,
        "one chunk per scope and id: {ca:?} {cb:?}"
    );
    ensure!(cc.id != ca.id && cd.id != ca.id && cc.id != cd.id, "no sharing across scopes");
    ensure!(ca.hash == Some([7; 32]) && cc.hash == Some([7; 32]), "ids are kept for restore");
    ensure!(
        cat.find_chunks(sa.id, false, &[[7; 32], [8; 32]]).map_err(e)? == vec![Some(ca.id), None],
        "lookup in alpha's scope"
    );
    ensure!(
        cat.find_chunks(sb.id, false, &[[7; 32]]).map_err(e)? == vec![Some(cd.id)],
        "lookup in beta's scope"
    );
    consistent(cat)?;
    ensure!(cat.dedup_epoch().map_err(e)? == epoch0, "nothing gone, same epoch");

    // One reference gone: still live. Both gone: not found, and the epoch rises.
    let mut t = cat.begin().map_err(e)?;
    t.delete_object(a, NOW).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(
        cat.find_chunks(sa.id, false, &[[7; 32]]).map_err(e)? == vec![Some(ca.id)],
        "still referenced by b"
    );
    ensure!(cat.dedup_epoch().map_err(e)? == epoch0, "a chunk still referenced is not gone");
    let mut t = cat.begin().map_err(e)?;
    t.delete_object(b, NOW).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(
        cat.find_chunks(sa.id, false, &[[7; 32]]).map_err(e)? == vec![None],
        "an unreferenced chunk is not offered"
    );
    ensure!(
        cat.dedup_epoch().map_err(e)? > epoch0,
        "the epoch rises when a chunk loses its last reference"
    );
    consistent(cat)?;

    // An administrator groups the nodes: beta joins alpha's scope.
    let grouped = cat.set_dedup_scope(beta, "node:alpha", [3; 32]).map_err(e)?;
    ensure!(grouped == sa, "joining an existing scope keeps its secret: {grouped:?}");
    ensure!(cat.dedup_scope(beta, [4; 32]).map_err(e)?.id == sa.id, "beta is in alpha's scope");

    // The server's copy of a node's key file.
    ensure!(cat.node_key(alpha).map_err(e)?.is_none(), "no key stored yet");
    cat.set_node_key(alpha, b"wrapped key").map_err(e)?;
    ensure!(cat.node_key(alpha).map_err(e)?.as_deref() == Some(&b"wrapped key"[..]), "key stored");
    ensure!(cat.node_key(beta).map_err(e)?.is_none(), "keys are per node");
    ensure!(cat.set_node_key(NodeId(9999), b"k").is_err(), "an unknown node has no key");
    Ok(())
}

/// Inventory expiration on a real catalog: versions made at chosen dates expire as the
/// default copy groups say (2 / 1 / 30 / 60 days, archives at their retention), with several
/// workers, only for the nodes named, and the catalog stays consistent.
pub fn expiration_by_policy(cat: &dyn Catalog) -> CaseResult {
    use crate::expire::{ExpireOptions, ExpireProgress, expire_inventory};
    let f = fixture(cat)?;
    let class = keep_every_version(cat)?;
    let day = 86_400;
    let now = 1_800_000_000;
    let at = |days: i64| now - days * day;
    let mut offset = 48;
    let mut chunk = || {
        offset += 100;
        new_chunk(f.container, offset)
    };
    let mut t = cat.begin().map_err(e)?;
    // a: three versions, the newest active: one inactive kept (10 days), the older one goes.
    for d in [100, 50, 10] {
        t.insert_object(&file(f.fs, b"a", 1, vec![chunk()]), at(d)).map_err(e)?;
    }
    // b: deleted 61 days ago: past retain-only, both versions go.
    for d in [100, 70] {
        t.insert_object(&file(f.fs, b"b", 1, vec![chunk()]), at(d)).map_err(e)?;
    }
    t.deactivate(f.fs, b"b", at(61)).map_err(e)?;
    // c: deleted 5 days ago: kept.
    t.insert_object(&file(f.fs, b"c", 1, vec![chunk()]), at(5)).map_err(e)?;
    t.deactivate(f.fs, b"c", at(5)).map_err(e)?;
    // Archives: one past its retention, one not.
    let mut archive = |path: &[u8], until: i64| {
        let mut o = file(f.fs, path, 1, vec![chunk()]);
        o.kind = ObjectKind::Archive;
        o.retain_until = Some(until);
        o
    };
    let (old, young) = (archive(b"d", at(1)), archive(b"e", at(-1)));
    t.insert_object(&old, at(400)).map_err(e)?;
    t.insert_object(&young, at(2)).map_err(e)?;
    t.commit().map_err(e)?;
    default_policy(cat, class)?;
    let epoch = cat.dedup_epoch().map_err(e)?;

    let cancel = std::sync::atomic::AtomicBool::new(false);
    let progress = ExpireProgress::default();
    let mut options = ExpireOptions {
        resource: 3,
        nodes: Some(vec![NodeId(i64::MAX)]),
        ..ExpireOptions::new(now, &cancel, &progress)
    };
    // Another node only: nothing of alpha's goes.
    let none = expire_inventory(cat, &options).map_err(e)?;
    ensure!(none.backups + none.archives == 0 && none.examined == 0, "{none:?}");
    options.nodes = None;
    options.batch = 1; // a transaction per version: the batching must not change the outcome
    let report = expire_inventory(cat, &options).map_err(e)?;
    ensure!(report.backups == 3 && report.archives == 1, "{report:?}");
    ensure!(
        report.examined == 7 && report.filespaces == 1 && report.stopped.is_none(),
        "{report:?}"
    );
    let left = |path: &[u8]| cat.versions(f.fs, path).map(|v| v.len()).map_err(e);
    ensure!(left(b"a")? == 2 && left(b"b")? == 0 && left(b"c")? == 1, "versions left");
    ensure!(left(b"d")? == 0 && left(b"e")? == 1, "archives left");
    ensure!(cat.dedup_epoch().map_err(e)? > epoch, "chunks lost their last reference");
    consistent(cat)?;
    // Run again: nothing more to do.
    let progress = ExpireProgress::default();
    options.progress = &progress;
    let again = expire_inventory(cat, &options).map_err(e)?;
    ensure!(again.backups + again.archives == 0, "{again:?}");
    // Cancelled before it starts: it stops, says why, and deletes nothing it did not finish.
    cancel.store(true, std::sync::atomic::Ordering::Relaxed);
    let progress = ExpireProgress::default();
    options.progress = &progress;
    let stopped = expire_inventory(cat, &options).map_err(e)?;
    ensure!(stopped.stopped.as_deref() == Some("cancelled"), "{stopped:?}");
    Ok(())
}

/// Domains and classes change and go only while nothing depends on them; nodes move between
/// domains; bad copy groups are refused.
pub fn policy_changes(cat: &dyn Catalog) -> CaseResult {
    let f = fixture(cat)?;
    let standard = cat.domain("standard").map_err(e)?.ok_or("no standard domain")?.id;
    let short = cat.define_domain("short", "days, not months").map_err(e)?;
    let names: Vec<String> = cat.domains().map_err(e)?.into_iter().map(|d| d.name).collect();
    ensure!(names == ["short", "standard"], "{names:?}");
    let group = BackupCopyGroup {
        versions_exist: 1,
        versions_deleted: 1,
        retain_extra_days: 0,
        retain_only_days: 1,
    };
    let class = cat
        .define_mgmt_class(short, "quick", group, ArchiveCopyGroup { retain_version_days: 7 })
        .map_err(e)?;
    let wider = BackupCopyGroup { versions_exist: 3, ..group };
    cat.update_mgmt_class(class, wider, ArchiveCopyGroup { retain_version_days: 9 }).map_err(e)?;
    let classes = cat.mgmt_classes(short).map_err(e)?;
    ensure!(
        classes.len() == 1
            && classes[0].backup == wider
            && classes[0].archive.retain_version_days == 9,
        "{classes:?}"
    );
    let bad = BackupCopyGroup { versions_exist: 0, ..group };
    ensure!(
        matches!(
            cat.update_mgmt_class(class, bad, ArchiveCopyGroup::default()),
            Err(CatalogError::Refused(_))
        ),
        "versions-exist 0 refused"
    );
    ensure!(
        matches!(
            cat.update_mgmt_class(MgmtClassId(9999), group, ArchiveCopyGroup::default()),
            Err(CatalogError::NotFound { .. })
        ),
        "unknown class"
    );

    // A node moves to the short domain: the domain is in use and cannot go.
    let node = cat.node("alpha").map_err(e)?.ok_or("no node")?.id;
    cat.set_node_domain(node, short).map_err(e)?;
    ensure!(cat.node("alpha").map_err(e)?.map(|n| n.domain) == Some(short), "moved");
    ensure!(
        matches!(cat.delete_domain(short), Err(CatalogError::Refused(_))),
        "a domain with nodes stays"
    );
    ensure!(cat.set_node_domain(node, DomainId(9999)).is_err(), "unknown domain");
    // A version bound to the class keeps the class and its domain.
    let mut t = cat.begin().map_err(e)?;
    let mut o = file(f.fs, b"bound", 1, vec![new_chunk(f.container, 48)]);
    o.mgmt_class = Some(class);
    let bound = t.insert_object(&o, 1).map_err(e)?;
    t.commit().map_err(e)?;
    cat.set_node_domain(node, standard).map_err(e)?;
    ensure!(
        matches!(cat.delete_mgmt_class(class), Err(CatalogError::Refused(_))),
        "a bound class stays"
    );
    ensure!(
        matches!(cat.delete_domain(short), Err(CatalogError::Refused(_))),
        "a domain with bound versions stays"
    );
    let mut t = cat.begin().map_err(e)?;
    t.delete_object(bound, NOW).map_err(e)?;
    t.commit().map_err(e)?;
    cat.delete_mgmt_class(class).map_err(e)?;
    ensure!(cat.mgmt_classes(short).map_err(e)?.is_empty(), "class gone");
    cat.delete_domain(short).map_err(e)?;
    ensure!(cat.domain("short").map_err(e)?.is_none(), "domain gone");
    ensure!(matches!(cat.delete_domain(short), Err(CatalogError::NotFound { .. })), "gone twice");
    consistent(cat)
}

/// Expiration over more rows than one page of the scan, with a path's rows straddling every
/// page boundary (3 per path): each path is decided whole, once.
pub fn expiration_across_pages(cat: &dyn Catalog) -> CaseResult {
    use crate::expire::{ExpireOptions, ExpireProgress, expire_inventory};
    let f = fixture(cat)?;
    let class = keep_every_version(cat)?;
    let now = 1_800_000_000;
    let paths = 4_001u64;
    let mut t = cat.begin().map_err(e)?;
    for p in 0..paths {
        let path = format!("d{:02}/f{p:05}", p % 37);
        // Three inactive versions (since 50, 40 and 10 days) and an active one: the newest
        // inactive stays (30 days), the other two go.
        for days in [60, 50, 40, 10] {
            t.insert_object(&file(f.fs, path.as_bytes(), 1, vec![]), now - days * 86_400)
                .map_err(e)?;
        }
    }
    t.commit().map_err(e)?;
    default_policy(cat, class)?;
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let progress = ExpireProgress::default();
    let options = ExpireOptions::new(now, &cancel, &progress);
    let r = expire_inventory(cat, &options).map_err(e)?;
    ensure!(r.examined == 3 * paths && r.backups == 2 * paths, "{r:?}");
    for p in [0, 3_332, 3_333, 3_334, 4_000] {
        let path = format!("d{:02}/f{p:05}", p % 37);
        let left = cat.versions(f.fs, path.as_bytes()).map_err(e)?;
        ensure!(
            left.len() == 2 && left.iter().filter(|v| v.active).count() == 1,
            "{path}: {} left",
            left.len()
        );
    }
    consistent(cat)
}

/// A new active version deletes, in its own transaction, the inactive versions beyond its
/// class's versions-exist (the active one counts), releasing their chunks; an unlimited class
/// keeps them all; a domain without a "standard" class uses TSM's default of 2.
pub fn versions_exist_at_backup(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let domain = cat.domain("standard").map_err(e)?.ok_or("no domain")?.id;
    let three = BackupCopyGroup { versions_exist: 3, ..BackupCopyGroup::default() };
    let keep3 =
        cat.define_mgmt_class(domain, "three", three, ArchiveCopyGroup::default()).map_err(e)?;
    let all = BackupCopyGroup { versions_exist: crate::expire::NO_LIMIT, ..three };
    let keep_all =
        cat.define_mgmt_class(domain, "all", all, ArchiveCopyGroup::default()).map_err(e)?;
    let backup = |path: &[u8], class: Option<MgmtClassId>, k: u64| -> CaseResult {
        let mut object = file(fx.fs, path, k, vec![new_chunk(fx.container, k * 1000)]);
        object.mgmt_class = class;
        let mut t = cat.begin().map_err(e)?;
        t.insert_object(&object, 100 + k as i64).map_err(e)?;
        t.commit().map_err(e)
    };
    for k in 0..6 {
        backup(b"/default", None, k)?;
        backup(b"/three", Some(keep3), 10 + k)?;
        backup(b"/all", Some(keep_all), 20 + k)?;
    }
    let sizes = |path: &[u8]| -> std::result::Result<Vec<(u64, bool)>, String> {
        Ok(cat.versions(fx.fs, path).map_err(e)?.iter().map(|v| (v.attrs.size, v.active)).collect())
    };
    ensure!(sizes(b"/default")? == [(5, true), (4, false)], "default: {:?}", sizes(b"/default")?);
    ensure!(
        sizes(b"/three")? == [(15, true), (14, false), (13, false)],
        "three: {:?}",
        sizes(b"/three")?
    );
    ensure!(sizes(b"/all")?.len() == 6, "unlimited: {:?}", sizes(b"/all")?);
    // The deleted versions' chunks lost their references (6 + 3 + 2 live).
    let mut live = 0;
    for c in cat.chunks_in_container(fx.container).map_err(e)? {
        live += u64::from(c.refcount > 0);
    }
    ensure!(live == 11, "{live} chunks still referenced");
    // A file deleted on the client keeps its versions until expiration decides.
    let mut t = cat.begin().map_err(e)?;
    t.deactivate(fx.fs, b"/three", 200).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(sizes(b"/three")?.len() == 3, "deactivation deleted versions");
    consistent(cat)
}

/// A class's minimum retention is stamped on the versions stored under it: neither the
/// versions-exist roll-off, nor a deletion, nor expiration removes one before its lock ends,
/// and lowering the class later does not free it. A hold on the node or the filespace stops
/// every deletion until released; a filespace with either is not deleted at all.
pub fn retention_locks_and_holds(cat: &dyn Catalog) -> CaseResult {
    const DAY: i64 = 86_400;
    let fx = fixture(cat)?;
    let node = cat.node("alpha").map_err(e)?.ok_or("no node")?.id;
    let domain = cat.domain("standard").map_err(e)?.ok_or("no domain")?.id;
    let one = BackupCopyGroup { versions_exist: 1, ..BackupCopyGroup::default() };
    let class =
        cat.define_mgmt_class(domain, "standard", one, ArchiveCopyGroup::default()).map_err(e)?;
    ensure!(
        matches!(
            cat.set_retain_min(MgmtClassId(class.0 + 99), 1),
            Err(CatalogError::NotFound { .. })
        ),
        "a minimum retention set on a class that does not exist"
    );
    cat.set_retain_min(class, 10).map_err(e)?;
    let classes = cat.mgmt_classes(domain).map_err(e)?;
    ensure!(classes[0].retain_min_days == 10, "{classes:?}");
    let t0 = 1_000_000;
    let store = |path: &[u8], k: u64, at: Timestamp| -> std::result::Result<ObjectId, String> {
        let mut t = cat.begin().map_err(e)?;
        let id = t
            .insert_object(&file(fx.fs, path, k, vec![new_chunk(fx.container, k * 100)]), at)
            .map_err(e)?;
        t.commit().map_err(e)?;
        Ok(id)
    };
    let delete = |id: ObjectId, at: Timestamp| -> crate::Result<()> {
        let mut t = cat.begin()?;
        t.delete_object(id, at)?;
        t.commit()
    };
    let v1 = store(b"/f", 1, t0)?;
    // Lowered after v1 was stored: v1 keeps its 10 days, v2 gets none.
    cat.set_retain_min(class, 0).map_err(e)?;
    let v2 = store(b"/f", 2, t0 + DAY)?;
    ensure!(
        cat.versions(fx.fs, b"/f").map_err(e)?.len() == 2,
        "versions-exist 1 rolled a locked version off"
    );
    match delete(v1, t0 + 10 * DAY - 1) {
        Err(CatalogError::Protected(why)) => {
            ensure!(why.contains("retention-locked until"), "{why}")
        }
        other => return Err(format!("a locked version's deletion gave {other:?}")),
    }
    // Expiration is refused it too, and counts it as kept.
    let (cancel, progress) = (std::sync::atomic::AtomicBool::new(false), Default::default());
    let opts = crate::expire::ExpireOptions::new(t0 + 2 * DAY, &cancel, &progress);
    let report = crate::expire::expire_inventory(cat, &opts).map_err(e)?;
    ensure!(report.protected == 1 && report.backups == 0, "{report:?}");
    cat.set_retain_min(class, 3).map_err(e)?;
    let v3 = store(b"/f", 3, t0 + 2 * DAY)?;
    // v2 had no lock: the roll-off took it; v1 is still locked.
    let ids: Vec<ObjectId> = cat.versions(fx.fs, b"/f").map_err(e)?.iter().map(|v| v.id).collect();
    ensure!(ids == [v3, v1], "after v3: {ids:?} (v1 {v1:?}, v2 {v2:?})");

    // Holds: the node's, then the filespace's.
    ensure!(
        cat.hold(node, None, HoldKind::Hold, "administrator a", "case 7", t0).map_err(e)?,
        "hold"
    );
    ensure!(
        !cat.hold(node, None, HoldKind::Hold, "administrator b", "again", t0).map_err(e)?,
        "second hold"
    );
    match delete(v1, t0 + 100 * DAY) {
        Err(CatalogError::Protected(why)) => ensure!(why.contains("hold on its node"), "{why}"),
        other => return Err(format!("a held version's deletion gave {other:?}")),
    }
    ensure!(cat.release(node, None, HoldKind::Hold).map_err(e)?, "release");
    ensure!(!cat.release(node, None, HoldKind::Hold).map_err(e)?, "second release");
    ensure!(
        cat.hold(node, Some(fx.fs), HoldKind::Suspect, "server", "odd", t0).map_err(e)?,
        "suspect"
    );
    let other = cat.register_node("beta", "$argon2id$x", domain).map_err(e)?;
    ensure!(
        matches!(
            cat.hold(other, Some(fx.fs), HoldKind::Hold, "a", "", t0),
            Err(CatalogError::NotFound { .. })
        ),
        "a hold on another node's filespace"
    );
    let holds = cat.holds().map_err(e)?;
    ensure!(
        holds.len() == 1
            && holds[0].node_name == "alpha"
            && holds[0].filespace == Some(fx.fs)
            && holds[0].filespace_name == "/home"
            && holds[0].kind == HoldKind::Suspect
            && holds[0].reason == "odd",
        "{holds:?}"
    );
    let p = cat.protection(fx.fs, t0 + 3 * DAY).map_err(e)?;
    ensure!(p.holds == [(HoldKind::Suspect, true)] && p.locked == 2, "{p:?}");
    ensure!(
        matches!(delete(v1, t0 + 100 * DAY), Err(CatalogError::Protected(_))),
        "deleted under a suspect hold"
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    match cat.delete_filespace(fx.fs, 10, &stop) {
        Err(CatalogError::Protected(why)) => {
            ensure!(why.contains("filespace is under a suspect"), "{why}")
        }
        other => return Err(format!("deleting a held filespace gave {other:?}")),
    }
    ensure!(cat.release(node, Some(fx.fs), HoldKind::Suspect).map_err(e)?, "release suspect");
    // Free at last: the lock ended, nothing holds it.
    delete(v1, t0 + 10 * DAY).map_err(e)?;
    ensure!(
        matches!(delete(v1, t0 + 10 * DAY), Err(CatalogError::NotFound { .. })),
        "deleted twice"
    );
    // A version locked at the real time keeps its whole filespace.
    cat.set_retain_min(class, 1).map_err(e)?;
    store(b"/g", 4, now())?;
    match cat.delete_filespace(fx.fs, 10, &stop) {
        Err(CatalogError::Protected(why)) => {
            ensure!(why.contains("1 versions are retention-locked"), "{why}")
        }
        other => return Err(format!("deleting a locked filespace gave {other:?}")),
    }
    ensure!(cat.versions(fx.fs, b"/f").map_err(e)?.len() == 1, "a refused deletion deleted");
    consistent(cat)
}

/// The figures of a filespace's recent whole backups: the newest kept, files counted from
/// the active inventory.
pub fn backup_figures(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let mut t = cat.begin().map_err(e)?;
    for k in 0..3u64 {
        t.insert_object(&file(fx.fs, format!("/f{k}").as_bytes(), k, vec![]), 100).map_err(e)?;
    }
    t.commit().map_err(e)?;
    // The judge sees the figures before, oldest first, and the new ones with their files.
    let judge = |before: &[BackupStats], run: &BackupStats| {
        let seen: Vec<u64> = before.iter().map(|s| s.changed).collect();
        (run.changed == 4).then(|| format!("after {seen:?}, {} files", run.files))
    };
    for k in 0..5u64 {
        let stats = BackupStats {
            ended: 200 + k as i64,
            changed: k,
            raw_bytes: 10 * k,
            ..Default::default()
        };
        let (kept, why) = cat.add_backup_stats(fx.fs, &stats, 3, true, &judge).map_err(e)?;
        ensure!(kept.files == 3 && kept.changed == k && kept.suspect == (k == 4), "{kept:?}");
        ensure!(why.is_some() == (k == 4), "{why:?}");
        if let Some(why) = why {
            ensure!(why == "after [1, 2, 3], 3 files", "{why}");
        }
    }
    // Figures outside the baseline are kept only when suspect.
    let partial = BackupStats { ended: 300, changed: 2, ..Default::default() };
    cat.add_backup_stats(fx.fs, &partial, 3, false, &judge).map_err(e)?;
    let all = cat.backup_stats(fx.fs).map_err(e)?;
    let ended: Vec<Timestamp> = all.iter().map(|s| s.ended).collect();
    ensure!(ended == [202, 203, 204], "{all:?}");
    ensure!(all[2].raw_bytes == 40 && all[2].files == 3 && all[2].suspect, "{all:?}");
    ensure!(
        cat.backup_stats(FilespaceId(fx.fs.0 + 50)).map_err(e)?.is_empty(),
        "another filespace's"
    );
    Ok(())
}

/// An audit's marks: a damaged chunk is no longer offered for deduplication and the next
/// copy of its data repairs it in place; its objects are found, flagged, and the dedup epoch
/// rises.
pub fn damaged_chunks_and_repair(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let node = cat.node("alpha").map_err(e)?.ok_or("no node")?;
    let scope = cat.dedup_scope(node.id, [7; 32]).map_err(e)?;
    let key = ChunkKey { hash: [9; 32], scope: Some(scope.id), sealed: false };
    let keyed = |offset: u64| {
        ObjectChunk::Keyed(
            NewChunk { container: fx.container, offset, stored_len: 50, raw_len: 80, codec: 1 },
            key,
        )
    };
    let mut t = cat.begin().map_err(e)?;
    let a = t.insert_object(&file(fx.fs, b"/a", 80, vec![keyed(0)]), 100).map_err(e)?;
    let b = t
        .insert_object(&file(fx.fs, b"/b", 80, vec![new_chunk(fx.container, 100)]), 100)
        .map_err(e)?;
    t.commit().map_err(e)?;
    let chunk = cat.find_chunks(scope.id, false, &[[9; 32]]).map_err(e)?[0].ok_or("no chunk")?;
    let (used, scanned) = cat.objects_using(&[chunk].into_iter().collect()).map_err(e)?;
    ensure!(used == [(a, fx.fs, b"/a".to_vec())], "objects using the chunk: {used:?}");
    // Committed after the scan, before the marks: found by `mark_damaged` itself. And a
    // reference made after the marks (looked up before them) makes its version damaged.
    let mut t = cat.begin().map_err(e)?;
    let late = t
        .insert_object(&file(fx.fs, b"/late", 80, vec![ObjectChunk::Existing(chunk)]), 150)
        .map_err(e)?;
    t.commit().map_err(e)?;
    let epoch = cat.dedup_epoch().map_err(e)?;
    cat.mark_damaged(&[chunk], &[a], scanned).map_err(e)?;
    let mut t = cat.begin().map_err(e)?;
    let later = t
        .insert_object(&file(fx.fs, b"/later", 80, vec![ObjectChunk::Existing(chunk)]), 160)
        .map_err(e)?;
    t.commit().map_err(e)?;
    for (what, id) in [("late", late), ("later", later)] {
        ensure!(
            cat.object(id).map_err(e)?.is_some_and(|o| o.damaged),
            "the {what} version is not marked damaged"
        );
    }
    ensure!(cat.dedup_epoch().map_err(e)? > epoch, "epoch did not rise");
    ensure!(
        cat.find_chunks(scope.id, false, &[[9; 32]]).map_err(e)?[0].is_none(),
        "a damaged chunk offered for deduplication"
    );
    let flagged: Vec<bool> = [a, b]
        .iter()
        .map(|id| cat.object(*id).map(|o| o.is_some_and(|o| o.damaged)))
        .collect::<crate::Result<_>>()
        .map_err(e)?;
    ensure!(flagged == [true, false], "damaged flags {flagged:?}");
    let usage = cat.pool_usage(fx.pool).map_err(e)?;
    ensure!(
        usage.chunks == 2 && usage.live_bytes == 150 && usage.damaged_chunks == 1,
        "usage {usage:?}"
    );
    let stats = cat.stats().map_err(e)?;
    ensure!(
        stats.damaged_chunks == 1 && stats.damaged_objects == 3,
        "stats {} damaged chunks, {} objects",
        stats.damaged_chunks,
        stats.damaged_objects
    );
    // The same data stored again (the file sent anew): one chunk, now at the new frame.
    let mut t = cat.begin().map_err(e)?;
    t.insert_object(&file(fx.fs, b"/a", 80, vec![keyed(500)]), 200).map_err(e)?;
    t.commit().map_err(e)?;
    let again = cat.find_chunks(scope.id, false, &[[9; 32]]).map_err(e)?[0];
    ensure!(again == Some(chunk), "repair made a new chunk: {again:?}");
    let refs = cat.object_chunks(a).map_err(e)?;
    ensure!(refs[0].location.offset == 500, "old version not repaired: {:?}", refs[0]);
    ensure!(cat.stats().map_err(e)?.damaged_chunks == 0, "chunk still damaged");
    ensure!(cat.objects_using(&Default::default()).map_err(e)?.0.is_empty(), "empty set matched");
    consistent(cat)
}

/// Named state values, and a snapshot that refuses to overwrite a file.
pub fn state_and_snapshot(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    ensure!(cat.state_value("restored_at").map_err(e)?.is_none(), "unset state has a value");
    cat.set_state_value("restored_at", 42).map_err(e)?;
    cat.set_state_value("restored_at", 43).map_err(e)?;
    ensure!(cat.state_value("restored_at").map_err(e)? == Some(43), "state value");
    let mut t = cat.begin().map_err(e)?;
    t.insert_object(&file(fx.fs, b"/x", 1, vec![new_chunk(fx.container, 0)]), 100).map_err(e)?;
    t.commit().map_err(e)?;
    let dir = tempfile::TempDir::new().map_err(|x| x.to_string())?;
    let dest = dir.path().join("copy.db");
    cat.snapshot(&dest).map_err(e)?;
    ensure!(
        matches!(cat.snapshot(&dest), Err(CatalogError::Refused(_))),
        "a snapshot overwrote a file"
    );
    // What a copy holds is checked per backend (it is that backend's file format).
    ensure!(dest.metadata().map_err(|x| x.to_string())?.len() > 0, "empty snapshot");
    Ok(())
}

/// A directory's contents are deactivated in one call, and nothing that only shares its
/// name's prefix; a filespace's generation changes with its active inventory and
/// only then.
pub fn trees_and_generations(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let node = cat.node("alpha").map_err(e)?.ok_or("no node")?.id;
    let generation = || -> std::result::Result<i64, String> {
        Ok(cat
            .filespaces(node)
            .map_err(e)?
            .into_iter()
            .find(|f| f.id == fx.fs)
            .ok_or("no filespace")?
            .generation)
    };
    let g0 = generation()?;
    let mut t = cat.begin().map_err(e)?;
    for p in [&b"d"[..], b"d/a", b"d/sub", b"d/sub/b", b"d.txt", b"d0", b"dd/x", b"e"] {
        t.insert_object(&file(fx.fs, p, 1, vec![]), 100).map_err(e)?;
    }
    t.commit().map_err(e)?;
    let g1 = generation()?;
    ensure!(g1 != g0, "a backup left the generation at {g1}");
    let mut archive = file(fx.fs, b"z", 1, vec![]);
    archive.kind = ObjectKind::Archive;
    let mut t = cat.begin().map_err(e)?;
    t.insert_object(&archive, 150).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(generation()? == g1, "an archive changed the active inventory's generation");
    let mut t = cat.begin().map_err(e)?;
    let n = t.deactivate_tree(fx.fs, b"d", 200).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(n == 3, "{n} versions deactivated under d");
    ensure!(generation()? != g1, "deactivation left the generation");
    let mut active = Vec::new();
    cat.for_each_active(fx.fs, &mut |v| {
        active.push(String::from_utf8_lossy(&v.path).into_owned());
        Ok(())
    })
    .map_err(e)?;
    ensure!(
        active == ["d", "d.txt", "d0", "dd/x", "e"],
        "active after d's contents went: {active:?}"
    );
    let mut t = cat.begin().map_err(e)?;
    ensure!(t.deactivate_tree(fx.fs, b"", 300).map_err(e)? == 5, "the whole filespace");
    t.commit().map_err(e)?;
    // No version had a chunk: the pool holds one empty container.
    let usage = cat.pool_usage(fx.pool).map_err(e)?;
    ensure!(
        usage == PoolUsage { containers: 1, ..PoolUsage::default() },
        "usage of an empty pool: {usage:?}"
    );
    consistent(cat)
}

/// A filespace goes with all its versions (in small transactions, releasing their chunks, and
/// not while told to stop); a node only once it has no filespace.
pub fn deleting_filespaces_and_nodes(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let node = cat.node("alpha").map_err(e)?.ok_or("no node")?.id;
    let mut t = cat.begin().map_err(e)?;
    for (k, p) in [&b"a"[..], b"a", b"b", b"c", b"c"].iter().enumerate() {
        t.insert_object(&file(fx.fs, p, 1, vec![new_chunk(fx.container, k as u64 * 100)]), 100)
            .map_err(e)?;
    }
    let mut archive = file(fx.fs, b"z", 1, vec![]);
    archive.kind = ObjectKind::Archive;
    t.insert_object(&archive, 100).map_err(e)?;
    t.commit().map_err(e)?;
    ensure!(
        matches!(cat.delete_node(node), Err(CatalogError::Refused(_))),
        "a node with filespaces was deleted"
    );
    let stop = std::sync::atomic::AtomicBool::new(true);
    ensure!(cat.delete_filespace(fx.fs, 2, &stop).map_err(e)? == 0, "deleted while stopped");
    ensure!(cat.filespaces(node).map_err(e)?.len() == 1, "stopped, yet the filespace went");
    stop.store(false, std::sync::atomic::Ordering::Relaxed);
    let n = cat.delete_filespace(fx.fs, 2, &stop).map_err(e)?;
    ensure!(n == 6, "{n} versions deleted");
    ensure!(cat.filespaces(node).map_err(e)?.is_empty(), "the filespace is still there");
    ensure!(
        cat.chunks_in_container(fx.container).map_err(e)?.iter().all(|c| c.refcount == 0),
        "chunks still referenced"
    );
    ensure!(
        matches!(cat.delete_filespace(fx.fs, 2, &stop), Err(CatalogError::NotFound { .. })),
        "a deleted filespace deleted again"
    );
    use crate::coord::Coordination;
    let server = cat.register_server("conformance", 60).map_err(e)?;
    let (session, _) =
        cat.open_session(server, "alpha", Some(node), "qsm", "[::1]:1").map_err(e)?;
    cat.close_session(session, "ended").map_err(e)?;
    cat.delete_node(node).map_err(e)?;
    ensure!(cat.node("alpha").map_err(e)?.is_none(), "the node is still there");
    consistent(cat)
}

/// Issue 23: the full version listing, over several pages, interleaved with commits made
/// while its caller holds a row (as a restore or `query backup --inactive | less` does): it
/// neither skips nor repeats a path, returns exactly what the catalog holds past the point
/// each commit was made, and stays in path order, newest first within a path.
pub fn listing_interleaved_with_commits(cat: &dyn Catalog) -> CaseResult {
    listing_interleaved_with_commits_probed(cat, &|| Ok(()))
}

/// [`listing_interleaved_with_commits`], calling `idle_reader` while the listing is paused in
/// its caller after commits: a backend's check that the paused listing holds no read
/// transaction (on SQLite, that the WAL can be checkpointed and truncated).
pub fn listing_interleaved_with_commits_probed(
    cat: &dyn Catalog,
    idle_reader: &dyn Fn() -> CaseResult,
) -> CaseResult {
    let f = fixture(cat)?;
    keep_every_version(cat)?;
    // More rows than a page on either backend (SQLite reads up to 5,000 rows from each of its
    // two indexes, PostgreSQL 10,000 a page), with an archive on every seventh path so pages
    // end inside a path's versions as well as between paths.
    let paths = 6_007u64;
    let name = |p: u64| format!("/d/f{p:05}").into_bytes();
    let mut t = cat.begin().map_err(e)?;
    for p in 0..paths {
        t.insert_object(&file(f.fs, &name(p), 1, vec![]), 100).map_err(e)?;
        if p % 7 == 0 {
            let archive =
                NewObject { kind: ObjectKind::Archive, ..file(f.fs, &name(p), 3, vec![]) };
            t.insert_object(&archive, 150).map_err(e)?;
        }
        t.insert_object(&file(f.fs, &name(p), 2, vec![]), 200).map_err(e)?;
    }
    t.commit().map_err(e)?;
    let expire = cat
        .versions(f.fs, &name(paths - 3))
        .map_err(e)?
        .into_iter()
        .find(|v| !v.active)
        .ok_or("no inactive version to expire")?
        .id;

    let mut seen: Vec<(Vec<u8>, ObjectId, Timestamp, bool)> = Vec::new();
    let mut behind = Vec::new();
    let mut probe_failed = None;
    let mut probes = 0;
    cat.for_each_version(f.fs, &mut |v| {
        seen.push((v.path.clone(), v.id, v.inserted, v.active));
        let at = |p: u64| v.path == name(p) && v.inserted == 200;
        if at(1_000) {
            // Behind the listing: a new version of a path already passed and a path before
            // every other. Ahead: a new version, a deactivation, an expired version, a new
            // path after every other.
            let mut t = cat.begin()?;
            behind.push(t.insert_object(&file(f.fs, &name(0), 4, vec![]), 300)?);
            behind.push(t.insert_object(&file(f.fs, b"/a/new", 5, vec![]), 300)?);
            t.insert_object(&file(f.fs, &name(paths - 1), 6, vec![]), 300)?;
            t.deactivate(f.fs, &name(paths - 2), 300)?;
            t.delete_object(expire, 300)?;
            t.insert_object(&file(f.fs, b"/e/new", 7, vec![]), 300)?;
            t.commit()?;
        }
        if at(1_000) || at(5_500) {
            if at(5_500) {
                // Behind again: the page holding the rest may already be read.
                let mut t = cat.begin()?;
                behind.push(t.insert_object(&file(f.fs, &name(1), 8, vec![]), 400)?);
                t.commit()?;
            }
            probes += 1;
            if let Err(msg) = idle_reader() {
                probe_failed = Some(msg);
                return Err(CatalogError::Refused("the paused listing holds a reader".into()));
            }
        }
        Ok(())
    })
    .map_err(|err| probe_failed.clone().unwrap_or_else(|| e(err)))?;
    ensure!(probes == 2, "the listing never reached the paths where it commits ({probes})");

    // What the catalog holds now, less what was committed behind the listing.
    let mut now = Vec::new();
    cat.for_each_version(f.fs, &mut |v| {
        now.push((v.path.clone(), v.id, v.inserted, v.active));
        Ok(())
    })
    .map_err(e)?;
    let ordered = now.windows(2).all(|w| {
        (&w[0].0, std::cmp::Reverse((w[0].2, w[0].1.0)))
            < (&w[1].0, std::cmp::Reverse((w[1].2, w[1].1.0)))
    });
    ensure!(ordered, "versions out of order (path, then newest first)");
    ensure!(now.len() as u64 == paths * 2 + paths.div_ceil(7) + 4, "{} versions now", now.len());
    let key = |r: &(Vec<u8>, ObjectId, Timestamp, bool)| (r.0.clone(), r.1, r.2);
    let expected: Vec<_> = now.iter().filter(|r| !behind.contains(&r.1)).map(key).collect();
    let listed: Vec<_> = seen.iter().map(key).collect();
    if listed != expected {
        let first = listed.iter().zip(&expected).position(|(a, b)| a != b);
        return Err(format!(
            "{}:{}: the listing interleaved with commits differs from the catalog: {} rows \
             listed, {} expected, first difference at {first:?}: {:?} vs {:?}",
            file!(),
            line!(),
            listed.len(),
            expected.len(),
            first.map(|i| &listed[i]),
            first.map(|i| &expected[i]),
        ));
    }
    let mut actives = std::collections::HashMap::new();
    for r in seen.iter().filter(|r| r.3) {
        *actives.entry(r.0.clone()).or_insert(0) += 1;
    }
    ensure!(actives.values().all(|&n| n == 1), "a path listed with two active versions");
    // Every path had its active version when listed but the one deactivated ahead, and
    // "/e/new" is one more.
    ensure!(actives.len() as u64 == paths, "{} active paths listed", actives.len());
    consistent(cat)
}

/// Issue 23: one path with more versions than a page of the listing reads from an index (its
/// archives), between paths with few: the listing gives every path whole, once, in path order
/// and newest first, exactly as [`Catalog::versions`] gives each path.
pub fn listing_a_path_longer_than_a_page(cat: &dyn Catalog) -> CaseResult {
    let f = fixture(cat)?;
    keep_every_version(cat)?;
    let mut t = cat.begin().map_err(e)?;
    for (path, backups) in [(&b"/p0"[..], 3), (b"/p1", 1), (b"/p2", 2)] {
        for k in 0..backups {
            t.insert_object(&file(f.fs, path, 1, vec![]), 100 + k).map_err(e)?;
        }
    }
    for k in 0..5_003 {
        let archive = NewObject { kind: ObjectKind::Archive, ..file(f.fs, b"/p1", 2, vec![]) };
        // Some at the same time, so the id decides among them.
        t.insert_object(&archive, 1_000 + k / 2).map_err(e)?;
    }
    t.commit().map_err(e)?;
    let mut listed = Vec::new();
    cat.for_each_version(f.fs, &mut |v| {
        listed.push((v.path.clone(), v.id));
        Ok(())
    })
    .map_err(e)?;
    let mut expected = Vec::new();
    for path in [&b"/p0"[..], b"/p1", b"/p2"] {
        let versions = cat.versions(f.fs, path).map_err(e)?;
        expected.extend(versions.into_iter().map(|v| (v.path, v.id)));
    }
    ensure!(expected.len() == 3 + 1 + 2 + 5_003, "{} versions stored", expected.len());
    ensure!(
        listed == expected,
        "{} listed, {} expected; first difference at {:?}",
        listed.len(),
        expected.len(),
        listed.iter().zip(&expected).position(|(a, b)| a != b)
    );
    Ok(())
}

/// Node replication's records: a replicated node belongs to the account that made it; its
/// versions keep their source ids and times, arrive in any order without making an older one
/// active, and are deactivated by source id; a damaged chunk repaired makes its versions
/// whole; the servers defined are kept with their account.
pub fn replicas(cat: &dyn Catalog) -> CaseResult {
    let fx = fixture(cat)?;
    let domain = cat.domain("standard").map_err(e)?.ok_or("no domain")?.id;
    let beta = cat.put_replica_node("beta", "repl", "$argon2id$b", domain, 7).map_err(e)?;
    ensure!(
        cat.put_replica_node("beta", "repl", "$argon2id$c", domain, 7).map_err(e)? == beta,
        "the same account's second put made another node"
    );
    let node = cat.node("beta").map_err(e)?.ok_or("no beta")?;
    ensure!(
        node.password_hash == "$argon2id$c" && node.replica_of.as_deref() == Some("repl"),
        "{node:?}"
    );
    for (name, account) in [("beta", "other"), ("alpha", "repl")] {
        ensure!(
            matches!(
                cat.put_replica_node(name, account, "$argon2id$x", domain, 7),
                Err(CatalogError::Exists { .. })
            ),
            "{account} took over node {name}"
        );
    }
    ensure!(
        matches!(
            cat.put_replica_node("beta", "repl", "$argon2id$c", domain, 8),
            Err(CatalogError::Refused(_))
        ),
        "a replica of another incarnation of its source's catalog was taken"
    );
    let fs = cat.filespace(beta, "/data").map_err(e)?;
    let store = |path: &[u8],
                 origin: i64,
                 at: Timestamp|
     -> std::result::Result<ObjectId, String> {
        let mut t = cat.begin().map_err(e)?;
        let object = NewObject {
            replica: Some(Replicated { origin: ObjectId(origin), inserted: at, deactivated: None }),
            ..file(fs, path, 1, vec![new_chunk(fx.container, origin as u64 * 100)])
        };
        let id = t.insert_object(&object, 9_999_999).map_err(e)?;
        t.commit().map_err(e)?;
        Ok(id)
    };
    store(b"/a", 7, 1_000)?;
    store(b"/a", 9, 2_000)?;
    // Sent late (its chunk was unreadable at first): older than the active one, so inactive.
    store(b"/a", 8, 1_500)?;
    store(b"/b", 12, 3_000)?;
    let versions = cat.versions(fs, b"/a").map_err(e)?;
    let seen: Vec<(Timestamp, bool)> = versions.iter().map(|v| (v.inserted, v.active)).collect();
    ensure!(seen == [(2_000, true), (1_500, false), (1_000, false)], "{seen:?}");
    let held = cat.replica_versions(fs).map_err(e)?;
    let want = [(7, false), (8, false), (9, true), (12, true)].map(|(o, a)| (ObjectId(o), a));
    ensure!(held == want, "{held:?}");
    let n =
        cat.deactivate_origins(fs, &[(ObjectId(12), 4_000), (ObjectId(7), 4_000)]).map_err(e)?;
    ensure!(n == 1, "{n} deactivated: only 12 was active");
    let b = cat.versions(fs, b"/b").map_err(e)?;
    ensure!(!b[0].active && b[0].deactivated == Some(4_000), "{b:?}");
    // Sent inactive, and from a clock ahead of this one: inactive as sent, stored as of now.
    let mut t = cat.begin().map_err(e)?;
    let late =
        Replicated { origin: ObjectId(20), inserted: 5_000_000_000, deactivated: Some(3_500) };
    let c = t
        .insert_object(&NewObject { replica: Some(late), ..file(fs, b"/c", 1, vec![]) }, 9_000)
        .map_err(e)?;
    t.commit().map_err(e)?;
    let c = cat.object(c).map_err(e)?.ok_or("no /c")?;
    ensure!((c.inserted, c.active, c.deactivated) == (9_000, false, Some(3_500)), "{c:?}");
    let there = cat.object_by_origin(fs, ObjectId(9)).map_err(e)?;
    ensure!(there == Some(versions[0].id), "{there:?}");
    ensure!(cat.object_by_origin(fx.fs, ObjectId(9)).map_err(e)?.is_none(), "another filespace's");

    // A damaged chunk repaired: its version is whole again; a second repair changes nothing.
    let chunk = cat.object_chunks(versions[0].id).map_err(e)?[0];
    cat.mark_damaged(&[chunk.id], &[versions[0].id], versions[0].id).map_err(e)?;
    ensure!(cat.damaged_chunks().map_err(e)?.len() == 1, "no damaged chunk listed");
    ensure!(cat.object(versions[0].id).map_err(e)?.ok_or("gone")?.damaged, "not marked");
    let to = NewChunk { offset: 77_777, ..chunk.location };
    let from = (chunk.location.container, chunk.location.offset);
    ensure!(
        cat.repair_chunk(chunk.id, from, &to, &[versions[0].id]).map_err(e)?,
        "the repair was refused"
    );
    ensure!(
        !cat.repair_chunk(chunk.id, from, &to, &[versions[0].id]).map_err(e)?,
        "repaired twice"
    );
    ensure!(cat.damaged_chunks().map_err(e)?.is_empty(), "still damaged");
    let after = cat.object(versions[0].id).map_err(e)?.ok_or("gone")?;
    ensure!(!after.damaged, "the version is still damaged");
    ensure!(cat.object_chunks(after.id).map_err(e)?[0].location.offset == 77_777, "not moved");

    let server = PeerServer {
        name: "dr".into(),
        address: "https://dr.example:7300".into(),
        ca: "-----BEGIN CERTIFICATE-----".into(),
        account: "from-here".into(),
        password: "secret".into(),
        created: 5,
    };
    cat.define_peer_server(&server).map_err(e)?;
    ensure!(
        matches!(cat.define_peer_server(&server), Err(CatalogError::Exists { .. })),
        "defined twice"
    );
    ensure!(cat.peer_servers().map_err(e)? == [server.clone()], "not read back");
    cat.delete_peer_server("dr").map_err(e)?;
    ensure!(
        matches!(cat.delete_peer_server("dr"), Err(CatalogError::NotFound { .. })),
        "deleted twice"
    );
    Ok(())
}
