//! Inventory expiration (issue 7): removes inactive backup versions and archives that their
//! management class no longer keeps, and releases their chunk references, as TSM's `EXPIRE
//! INVENTORY` does. The decision for one path is a pure function ([`expired`]) of its
//! versions, its copy groups and the time; the engine ([`expire_inventory`]) runs it over
//! every filespace with `resource` worker threads, deleting in short transactions so backups
//! running beside it never wait long for the catalog.
//!
//! The rules, per path (versions newest first; TSM's semantics):
//! - **the file exists** (the path has an active version): at most `versions_exist` versions
//!   in all, so inactive versions past `versions_exist − 1` go; the others go
//!   `retain_extra_days` after they became inactive;
//! - **the file was deleted** (no active version): at most `versions_deleted` inactive
//!   versions; of those kept, the newest goes `retain_only_days` after it became inactive, the
//!   others `retain_extra_days` after;
//! - **archives** go `retain_version_days` after they were made, as their class says now (a
//!   longer retention the client asked for, `retain_until`, is kept; a shorter one is not).
//!
//! A count or a number of days of [`NO_LIMIT`] never expires anything (TSM's `NOLIMIT`).
//! Chunks whose last reference goes stay in the pool until reclamation; the catalog raises
//! its dedup epoch so clients stop referencing them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::model::*;
use crate::{Catalog, Result};

pub use qsm_types::model::NO_LIMIT;

const DAY: i64 = 86_400;

/// Where a page of expirable rows ends, in the order of the index both backends page by:
/// (path, state, id). The first page starts after `(empty, -1, -1)`.
pub(crate) type ExpiryCursor = (Vec<u8>, i64, i64);

/// Visits a filespace's expirable rows as `page(after)` returns them, up to `page_size` at a
/// time, each page starting after the last row of the one before; `visit` runs between
/// pages, so a backend reads each page on its own snapshot and holds nothing while it runs.
pub(crate) fn for_each_in_pages(
    page_size: usize,
    mut page: impl FnMut(&ExpiryCursor) -> Result<Vec<ExpiryRow>>,
    visit: &mut dyn FnMut(&ExpiryRow) -> Result<()>,
) -> Result<()> {
    let mut after: ExpiryCursor = (Vec::new(), -1, -1);
    loop {
        let rows = page(&after)?;
        let full = rows.len() == page_size;
        if let Some(last) = rows.last() {
            let state = if last.archive { crate::migrations::STATE_ARCHIVE } else { 0 };
            after = (last.path.clone(), state, last.id.0);
        }
        for row in &rows {
            visit(row)?;
        }
        if !full {
            return Ok(());
        }
    }
}

/// One version as expiration sees it: no chunk list, no attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryRow {
    /// The version.
    pub id: ObjectId,
    /// Its path in the filespace.
    pub path: Vec<u8>,
    /// An archive (else an inactive backup version).
    pub archive: bool,
    /// When it was stored.
    pub inserted: Timestamp,
    /// When it became inactive.
    pub deactivated: Option<Timestamp>,
    /// For archives: when it may go.
    pub retain_until: Option<Timestamp>,
    /// Its management class (`None`: the domain's default).
    pub mgmt_class: Option<MgmtClassId>,
    /// Whether the path has an active version (the file still exists on the client).
    pub has_active: bool,
}

/// Whether `days` have passed since `since` at `now`.
fn past(since: Timestamp, days: u32, now: Timestamp) -> bool {
    days != NO_LIMIT && now.saturating_sub(since) >= i64::from(days) * DAY
}

/// The versions of one path that expire at `now`, given its inactive versions and archives
/// (any order) and the copy groups of each management class.
pub fn expired(
    rows: &[ExpiryRow],
    policy: &dyn Fn(Option<MgmtClassId>) -> (BackupCopyGroup, ArchiveCopyGroup),
    now: Timestamp,
) -> Vec<ObjectId> {
    let mut out = Vec::new();
    for a in rows.iter().filter(|r| r.archive) {
        // The class's retention, from the archive's date, as it is now (TSM's RETVER): the
        // server's policy decides. A retention the client asked for can only lengthen it.
        let days = policy(a.mgmt_class).1.retain_version_days;
        let by_policy =
            if days == NO_LIMIT { Timestamp::MAX } else { a.inserted + i64::from(days) * DAY };
        let until = by_policy.max(a.retain_until.unwrap_or(Timestamp::MIN));
        if until <= now {
            out.push(a.id);
        }
    }
    let mut inactive: Vec<&ExpiryRow> = rows.iter().filter(|r| !r.archive).collect();
    // Newest first, as the versions were backed up.
    inactive.sort_by_key(|r| std::cmp::Reverse((r.inserted, r.id)));
    for (k, v) in inactive.iter().enumerate() {
        let group = policy(v.mgmt_class).0;
        let since = v.deactivated.unwrap_or(v.inserted);
        let k = k as u64;
        let gone = if v.has_active {
            // The active version is one of the versions_exist.
            let keep = u64::from(group.versions_exist).saturating_sub(1);
            (group.versions_exist != NO_LIMIT && k >= keep)
                || past(since, group.retain_extra_days, now)
        } else {
            let keep = u64::from(group.versions_deleted);
            let days = if k == 0 { group.retain_only_days } else { group.retain_extra_days };
            (group.versions_deleted != NO_LIMIT && k >= keep) || past(since, days, now)
        };
        if gone {
            out.push(v.id);
        }
    }
    out
}

/// How to run an expiration.
#[derive(Debug)]
pub struct ExpireOptions<'a> {
    /// Worker threads, each taking whole filespaces (TSM's `RESOURCE=`).
    pub resource: usize,
    /// Only these nodes (`None`: all).
    pub nodes: Option<Vec<NodeId>>,
    /// Stop after this long; a later run goes on where it stopped (what is left is found again).
    pub duration: Option<Duration>,
    /// Set to stop at the next transaction boundary.
    pub cancel: &'a AtomicBool,
    /// The time versions are judged at.
    pub now: Timestamp,
    /// Versions deleted per transaction: short, so backups wait little for the catalog.
    pub batch: usize,
    /// Counted as it goes, for progress displays.
    pub progress: &'a ExpireProgress,
}

impl<'a> ExpireOptions<'a> {
    /// One worker, all nodes, no time limit, [`DEFAULT_BATCH`] deletions per transaction:
    /// callers set what they want otherwise with struct update syntax.
    pub fn new(
        now: Timestamp,
        cancel: &'a AtomicBool,
        progress: &'a ExpireProgress,
    ) -> ExpireOptions<'a> {
        ExpireOptions {
            resource: 1,
            nodes: None,
            duration: None,
            cancel,
            now,
            batch: DEFAULT_BATCH,
            progress,
        }
    }
}

/// Counters an expiration updates as it goes.
#[derive(Debug, Default)]
pub struct ExpireProgress {
    /// Versions looked at.
    pub examined: AtomicU64,
    /// Backup versions deleted.
    pub backups: AtomicU64,
    /// Archives deleted.
    pub archives: AtomicU64,
    /// Versions due that a retention lock or a hold kept.
    pub protected: AtomicU64,
    /// Filespaces finished.
    pub filespaces: AtomicU64,
}

/// What an expiration did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireReport {
    /// Versions looked at.
    pub examined: u64,
    /// Backup versions deleted.
    pub backups: u64,
    /// Archives deleted.
    pub archives: u64,
    /// Versions due that a retention lock or a hold kept.
    pub protected: u64,
    /// Filespaces finished.
    pub filespaces: u64,
    /// Why it stopped before the end (cancelled, out of time), if it did.
    pub stopped: Option<String>,
}

/// Versions deleted per transaction by default: a transaction of 2,000 deletions holds the
/// catalog's writer for tens of milliseconds.
pub const DEFAULT_BATCH: usize = 2000;

/// Expires the inventory of every filespace (of `options.nodes`), with `options.resource`
/// threads. Errors stop everything and are returned; what was committed stays committed.
pub fn expire_inventory(
    catalog: &dyn Catalog,
    options: &ExpireOptions<'_>,
) -> Result<ExpireReport> {
    let started = Instant::now();
    let nodes = catalog.nodes()?;
    let mut filespaces = Vec::new();
    let mut classes: HashMap<MgmtClassId, (BackupCopyGroup, ArchiveCopyGroup)> = HashMap::new();
    let mut defaults: HashMap<DomainId, (BackupCopyGroup, ArchiveCopyGroup)> = HashMap::new();
    for node in &nodes {
        if options.nodes.as_ref().is_some_and(|only| !only.contains(&node.id)) {
            continue;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = defaults.entry(node.domain) {
            let list = catalog.mgmt_classes(node.domain)?;
            // The domain's default class is the one called "standard"; without one, TSM's
            // defaults.
            let standard = list
                .iter()
                .find(|c| c.name == "standard")
                .map_or_else(Default::default, |c| (c.backup, c.archive));
            e.insert(standard);
            for c in list {
                classes.insert(c.id, (c.backup, c.archive));
            }
        }
        for fs in catalog.filespaces(node.id)? {
            filespaces.push((fs.id, node.domain));
        }
    }
    let queue = Mutex::new(filespaces.into_iter());
    let stop_reason: Mutex<Option<String>> = Mutex::new(None);
    let failed: Mutex<Option<crate::CatalogError>> = Mutex::new(None);
    let should_stop = || -> Option<String> {
        if options.cancel.load(Ordering::Relaxed) {
            return Some("cancelled".into());
        }
        match options.duration {
            Some(d) if started.elapsed() >= d => Some(format!("stopped after {} s", d.as_secs())),
            _ => None,
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..options.resource.max(1) {
            scope.spawn(|| {
                loop {
                    if let Some(why) = should_stop() {
                        *stop_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                        return;
                    }
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some((fs, domain)) = next else { return };
                    let default = defaults.get(&domain).copied().unwrap_or_default();
                    let policy = |class: Option<MgmtClassId>| {
                        class.and_then(|c| classes.get(&c).copied()).unwrap_or(default)
                    };
                    match expire_filespace(catalog, fs, &policy, options, &should_stop) {
                        Ok(None) => {
                            options.progress.filespaces.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Some(why)) => {
                            *stop_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                            return;
                        }
                        Err(e) => {
                            options.cancel.store(true, Ordering::Relaxed);
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let p = options.progress;
    Ok(ExpireReport {
        examined: p.examined.load(Ordering::Relaxed),
        backups: p.backups.load(Ordering::Relaxed),
        archives: p.archives.load(Ordering::Relaxed),
        protected: p.protected.load(Ordering::Relaxed),
        filespaces: p.filespaces.load(Ordering::Relaxed),
        stopped: stop_reason.into_inner().unwrap_or_else(|p| p.into_inner()),
    })
}

/// One filespace: its expirable versions path by path, deleted in batches. Returns why it
/// stopped early, if it did.
fn expire_filespace(
    catalog: &dyn Catalog,
    fs: FilespaceId,
    policy: &dyn Fn(Option<MgmtClassId>) -> (BackupCopyGroup, ArchiveCopyGroup),
    options: &ExpireOptions<'_>,
    should_stop: &dyn Fn() -> Option<String>,
) -> Result<Option<String>> {
    let mut doomed: Vec<(ObjectId, bool)> = Vec::new();
    let mut group: Vec<ExpiryRow> = Vec::new();
    let mut stopped = None;
    // A held filespace keeps everything: what is due is counted, not tried one by one (the
    // catalog would refuse each deletion anyway, should a hold come during the scan).
    let held = !catalog.protection(fs, options.now)?.holds.is_empty();
    // Transactions of at most `batch` deletions, whatever the paths: one path with a million
    // archives must not hold the writer for all of them.
    let flush = |doomed: &mut Vec<(ObjectId, bool)>| -> Result<()> {
        if held {
            options.progress.protected.fetch_add(doomed.len() as u64, Ordering::Relaxed);
            doomed.clear();
            return Ok(());
        }
        for part in doomed.chunks(options.batch.max(1)) {
            let mut t = catalog.begin()?;
            let (mut backups, mut archives, mut protected) = (0u64, 0u64, 0u64);
            for (id, archive) in part {
                match t.delete_object(*id, options.now) {
                    Ok(()) => *(if *archive { &mut archives } else { &mut backups }) += 1,
                    // Under a retention lock or a hold: kept, and expired once free.
                    Err(crate::CatalogError::Protected(_)) => protected += 1,
                    // A backup applied versions-exist to it since the scan read it: gone
                    // already, which is what expiration wanted.
                    Err(crate::CatalogError::NotFound { what: "object", .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            t.commit()?;
            options.progress.archives.fetch_add(archives, Ordering::Relaxed);
            options.progress.backups.fetch_add(backups, Ordering::Relaxed);
            options.progress.protected.fetch_add(protected, Ordering::Relaxed);
        }
        doomed.clear();
        Ok(())
    };
    let decide = |group: &mut Vec<ExpiryRow>, doomed: &mut Vec<(ObjectId, bool)>| {
        let archives: std::collections::HashSet<ObjectId> =
            group.iter().filter(|r| r.archive).map(|r| r.id).collect();
        for id in expired(group, policy, options.now) {
            doomed.push((id, archives.contains(&id)));
        }
        options.progress.examined.fetch_add(group.len() as u64, Ordering::Relaxed);
        group.clear();
    };
    // The scan reads on its own connection while batches commit on the writer: the scan's
    // snapshot does not see them, and never needs to (each path is decided once).
    let result = catalog.for_each_expirable(fs, &mut |row| {
        if group.first().is_some_and(|g| g.path != row.path) {
            decide(&mut group, &mut doomed);
            if doomed.len() >= options.batch {
                flush(&mut doomed)?;
            }
            // Checked at every path, so a cancel or a deadline stops a long scan that finds
            // little to delete too; what was decided is deleted first.
            if let Some(why) = should_stop() {
                flush(&mut doomed)?;
                stopped = Some(why);
                return Err(crate::CatalogError::Refused("expiration stopped".into()));
            }
        }
        group.push(row.clone());
        Ok(())
    });
    if let Some(why) = stopped {
        return Ok(Some(why));
    }
    result?;
    decide(&mut group, &mut doomed);
    flush(&mut doomed)?;
    // The filespace is done: finished, whatever the flag says now.
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = 1_800_000_000;

    fn policy(
        g: BackupCopyGroup,
    ) -> impl Fn(Option<MgmtClassId>) -> (BackupCopyGroup, ArchiveCopyGroup) {
        move |_| (g, ArchiveCopyGroup::default())
    }

    /// Inactive versions made `ages` days ago (newest first), each inactive for as long.
    fn inactive(ages: &[i64], has_active: bool) -> Vec<ExpiryRow> {
        ages.iter()
            .enumerate()
            .map(|(i, days)| ExpiryRow {
                id: ObjectId(100 - i as i64),
                path: b"f".to_vec(),
                archive: false,
                inserted: NOW - days * DAY - 10,
                deactivated: Some(NOW - days * DAY),
                retain_until: None,
                mgmt_class: None,
                has_active,
            })
            .collect()
    }

    fn ids(v: Vec<ObjectId>) -> Vec<i64> {
        let mut v: Vec<i64> = v.into_iter().map(|i| i.0).collect();
        v.sort_unstable();
        v.reverse();
        v
    }

    /// The copy-group rules over dates: each row is a policy, the ages in days of the
    /// inactive versions (newest first), whether the file exists, and which of them (by
    /// position, 0 = newest) expire.
    #[test]
    fn copy_group_rules_over_dates() {
        let tsm = BackupCopyGroup::default(); // 2 / 1 / 30 / 60
        let g = |ve, vd, re, ro| BackupCopyGroup {
            versions_exist: ve,
            versions_deleted: vd,
            retain_extra_days: re,
            retain_only_days: ro,
        };
        let cases: &[(BackupCopyGroup, &[i64], bool, &[usize])] = &[
            // File exists: 2 versions in all, so one inactive is kept for 30 days.
            (tsm, &[1], true, &[]),
            (tsm, &[29], true, &[]),
            (tsm, &[30], true, &[0]),
            (tsm, &[1, 2, 3], true, &[1, 2]),
            // File deleted: one inactive kept, for 60 days (retain-only), not 30.
            (tsm, &[45], false, &[]),
            (tsm, &[60], false, &[0]),
            (tsm, &[1, 2], false, &[1]),
            // versions-deleted 3: the newest by retain-only, the others by retain-extra.
            (g(5, 3, 10, 100), &[5, 20, 50, 90], false, &[1, 2, 3]),
            (g(5, 3, 10, 100), &[5, 6, 7], false, &[]),
            (g(5, 3, 10, 100), &[101, 102], false, &[0, 1]),
            // versions-exist 5: four inactive kept while young.
            (g(5, 3, 10, 100), &[1, 2, 3, 4, 5], true, &[4]),
            // NOLIMIT keeps everything the other rule keeps.
            (g(NO_LIMIT, NO_LIMIT, NO_LIMIT, NO_LIMIT), &[1, 500, 5000], true, &[]),
            (g(NO_LIMIT, NO_LIMIT, NO_LIMIT, NO_LIMIT), &[1, 500, 5000], false, &[]),
            (g(NO_LIMIT, 1, 30, NO_LIMIT), &[5000, 6000], false, &[1]),
            (g(NO_LIMIT, 1, 30, 60), &[20, 40, 400], true, &[1, 2]),
            // versions-exist 1: no inactive version survives while the file exists.
            (g(1, 1, NO_LIMIT, NO_LIMIT), &[0], true, &[0]),
            // retain 0 days: gone at once.
            (g(2, 1, 0, 0), &[0], false, &[0]),
        ];
        for (i, (group, ages, exists, gone)) in cases.iter().enumerate() {
            let rows = inactive(ages, *exists);
            let want: Vec<i64> = gone.iter().map(|k| rows[*k].id.0).collect();
            assert_eq!(
                ids(expired(&rows, &policy(*group), NOW)),
                want,
                "case {i}: {group:?} {ages:?} exists={exists}"
            );
        }
    }

    #[test]
    fn archives_go_when_their_retention_has_passed() {
        let archive = |id: i64, until: Option<Timestamp>, inserted: Timestamp| ExpiryRow {
            id: ObjectId(id),
            path: b"a".to_vec(),
            archive: true,
            inserted,
            deactivated: None,
            retain_until: until,
            mgmt_class: None,
            has_active: false,
        };
        let rows = vec![
            // Past the class's 365 days: the client's shorter retention changes nothing...
            archive(1, Some(NOW - 1), NOW - 365 * DAY),
            archive(2, Some(NOW - 1), NOW - 364 * DAY),
            // ...and a longer one is kept.
            archive(3, Some(NOW + 1), NOW - 400 * DAY),
            archive(4, Some(NOW), NOW - 400 * DAY),
            archive(5, None, NOW - 365 * DAY),
            archive(6, None, NOW - 364 * DAY),
        ];
        let p = policy(BackupCopyGroup::default());
        assert_eq!(ids(expired(&rows, &p, NOW)), vec![5, 4, 1]);
        let forever = |_: Option<MgmtClassId>| {
            (BackupCopyGroup::default(), ArchiveCopyGroup { retain_version_days: NO_LIMIT })
        };
        assert!(expired(&rows, &forever, NOW).is_empty(), "nolimit keeps every archive");
    }
}
