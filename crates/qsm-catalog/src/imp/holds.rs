//! What keeps versions from deletion (issue 30): retention locks stamped on versions, holds
//! on nodes and filespaces, and the figures of recent backups that anomaly detection reads.

use super::*;
use crate::sql::{self, Sql};

/// The SQL condition, on a row of `objects`, that nothing keeps it at the time bound as
/// `now`: no retention lock still running, no hold on its node or its filespace. Every
/// deletion of a version goes through it ([`super::txn`]).
pub(super) fn unprotected(now: &str) -> String {
    format!(
        "(objects.locked_until IS NULL OR objects.locked_until <= {now}) AND NOT EXISTS \
         (SELECT 1 FROM holds h JOIN filespaces f ON f.node_id = h.node_id \
          WHERE f.id = objects.filespace_id AND h.filespace_id IN (0, objects.filespace_id))"
    )
}

/// Why version `id` was not deleted at `now`: [`CatalogError::Protected`] naming the lock or
/// the hold, or `NotFound` when there is no such version.
pub(super) fn why_kept(s: &mut dyn Sql, id: ObjectId, now: Timestamp) -> Result<CatalogError> {
    let row = s.opt(
        "SELECT filespace_id, locked_until FROM objects WHERE id = ?1",
        &[id.0.into()],
        |r| Ok((r.int(0)?, r.opt_int(1)?)),
    )?;
    let Some((fs, locked)) = row else {
        return Ok(CatalogError::NotFound { what: "object", key: id.0.to_string() });
    };
    if let Some(until) = locked.filter(|u| *u > now) {
        return Ok(CatalogError::Protected(format!(
            "version {} is retention-locked until {} UTC",
            id.0,
            qsm_types::time::format_time(until)
        )));
    }
    let hold = s.opt(
        "SELECT h.kind, h.filespace_id, h.by_whom FROM holds h JOIN filespaces f \
         ON f.node_id = h.node_id WHERE f.id = ?1 AND h.filespace_id IN (0, ?1) \
         ORDER BY h.id LIMIT 1",
        &[fs.into()],
        |r| Ok((r.text(0)?, r.int(1)?, r.text(2)?)),
    )?;
    Ok(match hold {
        Some((kind, on, by)) => CatalogError::Protected(format!(
            "version {} is under a {kind} on its {} (placed by {by})",
            id.0,
            if on == 0 { "node" } else { "filespace" }
        )),
        // Freed between the two statements (a hold released, a lock run out): gone next time.
        None => CatalogError::Protected(format!("version {} was kept; try again", id.0)),
    })
}

/// Places a hold; false if there was one of that kind on that node or filespace already.
pub(super) fn hold(
    b: &dyn Backend,
    node: NodeId,
    filespace: Option<FilespaceId>,
    kind: HoldKind,
    by: &str,
    reason: &str,
    now: Timestamp,
) -> Result<bool> {
    sql::txn(b, "placing a hold", |s| {
        if s.opt("SELECT id FROM nodes WHERE id = ?1", &[node.0.into()], |r| r.int(0))?.is_none() {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        if let Some(fs) = filespace {
            let owner =
                s.opt("SELECT node_id FROM filespaces WHERE id = ?1", &[fs.0.into()], |r| {
                    r.int(0)
                })?;
            if owner != Some(node.0) {
                return Err(CatalogError::NotFound { what: "filespace", key: fs.0.to_string() });
            }
        }
        let n = s.execute(
            "INSERT INTO holds (node_id, filespace_id, kind, since, by_whom, reason) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
            &[
                node.0.into(),
                filespace.map_or(0, |f| f.0).into(),
                kind.name().into(),
                now.into(),
                by.into(),
                reason.into(),
            ],
        )?;
        Ok(n > 0)
    })
}

/// Releases the hold of `kind` on `node` (`filespace` `None`) or its filespace; false if
/// there was none.
pub(super) fn release(
    b: &dyn Backend,
    node: NodeId,
    filespace: Option<FilespaceId>,
    kind: HoldKind,
) -> Result<bool> {
    sql::auto(b, "releasing a hold", |s| {
        s.execute(
            "DELETE FROM holds WHERE node_id = ?1 AND filespace_id = ?2 AND kind = ?3",
            &[node.0.into(), filespace.map_or(0, |f| f.0).into(), kind.name().into()],
        )
    })
    .map(|n| n > 0)
}

/// Every hold, by node, filespace and kind.
pub(super) fn holds(b: &dyn Backend) -> Result<Vec<Hold>> {
    sql::read(b, "reading holds", |s| {
        s.all(
            "SELECT h.node_id, n.name, h.filespace_id, COALESCE(f.name, ''), h.kind, h.since, \
             h.by_whom, h.reason FROM holds h JOIN nodes n ON n.id = h.node_id \
             LEFT JOIN filespaces f ON f.id = h.filespace_id \
             ORDER BY n.name, COALESCE(f.name, ''), h.kind",
            &[],
            |r| {
                let kind = r.text(4)?;
                Ok(Hold {
                    node: NodeId(r.int(0)?),
                    node_name: r.text(1)?,
                    filespace: Some(r.int(2)?).filter(|f| *f != 0).map(FilespaceId),
                    filespace_name: r.text(3)?,
                    kind: HoldKind::parse(&kind).ok_or_else(|| {
                        CatalogError::Damaged(format!("a hold of unknown kind {kind:?}"))
                    })?,
                    since: r.int(5)?,
                    by: r.text(6)?,
                    reason: r.text(7)?,
                })
            },
        )
    })
}

/// What keeps versions of `filespace` at `now`: its holds (and its node's), and how many of
/// its versions are retention-locked with the latest lock's end.
pub(super) fn protection(
    b: &dyn Backend,
    filespace: FilespaceId,
    now: Timestamp,
) -> Result<Protection> {
    sql::read(b, "reading what protects a filespace", |s| {
        let fs = [filespace.0.into()];
        let holds = s.all(
            "SELECT h.kind, h.filespace_id FROM holds h JOIN filespaces f \
             ON f.node_id = h.node_id WHERE f.id = ?1 AND h.filespace_id IN (0, ?1) ORDER BY h.id",
            &fs,
            |r| Ok((r.text(0)?, r.int(1)? != 0)),
        )?;
        let (locked, until) = s
            .opt(
                "SELECT count(*), COALESCE(max(locked_until), 0) FROM objects \
                 WHERE filespace_id = ?1 AND locked_until > ?2",
                &[filespace.0.into(), now.into()],
                |r| Ok((r.int(0)? as u64, r.int(1)?)),
            )?
            .unwrap_or((0, 0));
        Ok(Protection {
            holds: holds
                .into_iter()
                .filter_map(|(k, on_fs)| HoldKind::parse(&k).map(|k| (k, on_fs)))
                .collect(),
            locked,
            locked_until: until,
        })
    })
}

/// Judges and records an upload's figures ([`crate::Catalog::add_backup_stats`]).
pub(super) fn add_backup_stats(
    b: &dyn Backend,
    filespace: FilespaceId,
    stats: &BackupStats,
    keep: usize,
    baseline: bool,
    judge: &dyn Fn(&[BackupStats], &BackupStats) -> Option<String>,
) -> Result<(BackupStats, Option<String>)> {
    let fs = filespace.0;
    // Counted on a snapshot, not under the writer's lock: a filespace of millions of entries
    // takes a while (through the active index alone), and a commit meanwhile changes little.
    let (files, history) = sql::read(b, "reading a filespace's backup figures", |s| {
        let files = s.int(
            "SELECT count(*) FROM objects WHERE filespace_id = ?1 AND state = 1",
            &[fs.into()],
        )? as u64;
        Ok((files, read_stats(s, filespace)?))
    })?;
    let mut run = BackupStats { files, suspect: false, ..*stats };
    let why = judge(&history, &run);
    run.suspect = why.is_some();
    if !baseline && !run.suspect {
        return Ok((run, None));
    }
    sql::txn(b, "recording a backup's figures", |s| {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        s.execute(
            "INSERT INTO backup_stats (filespace_id, ended, files, changed, raw_bytes, \
             stored_bytes, chunks, refs, suspect) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            &[
                fs.into(),
                run.ended.into(),
                n(run.files).into(),
                n(run.changed).into(),
                n(run.raw_bytes).into(),
                n(run.stored_bytes).into(),
                n(run.chunks).into(),
                n(run.refs).into(),
                i64::from(run.suspect).into(),
            ],
        )?;
        // The newest `keep` stay: ids rise with time.
        s.execute(
            "DELETE FROM backup_stats WHERE filespace_id = ?1 AND id NOT IN \
             (SELECT id FROM backup_stats WHERE filespace_id = ?1 ORDER BY id DESC LIMIT ?2)",
            &[fs.into(), (keep as i64).into()],
        )?;
        Ok(run)
    })
    .map(|run| (run, why))
}

fn read_stats(s: &mut dyn Sql, filespace: FilespaceId) -> Result<Vec<BackupStats>> {
    s.all(
        "SELECT ended, files, changed, raw_bytes, stored_bytes, chunks, refs, suspect \
         FROM backup_stats WHERE filespace_id = ?1 ORDER BY id",
        &[filespace.0.into()],
        |r| {
            Ok(BackupStats {
                ended: r.int(0)?,
                files: r.int(1)? as u64,
                changed: r.int(2)? as u64,
                raw_bytes: r.int(3)? as u64,
                stored_bytes: r.int(4)? as u64,
                chunks: r.int(5)? as u64,
                refs: r.int(6)? as u64,
                suspect: r.int(7)? != 0,
            })
        },
    )
}

/// The recorded figures of `filespace`'s recent whole backups, oldest first.
pub(super) fn backup_stats(b: &dyn Backend, filespace: FilespaceId) -> Result<Vec<BackupStats>> {
    sql::read(b, "reading a filespace's backup figures", |s| read_stats(s, filespace))
}
