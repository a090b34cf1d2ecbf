//! Filespaces: made on first use, listed, deleted with their versions in batches.

use super::*;
use crate::sql;

pub(super) fn filespace(b: &dyn Backend, node: NodeId, name: &str) -> Result<FilespaceId> {
    let find = "SELECT id FROM filespaces WHERE node_id = ?1 AND name = ?2";
    let args = [node.0.into(), name.into()];
    sql::auto(b, "creating a filespace", |s| {
        // Looked up first: usually there, and a catalog opened read-only (its disk full)
        // still finds it.
        if let Some(id) = s.opt(find, &args, |r| r.int(0))? {
            return Ok(FilespaceId(id));
        }
        // Two sessions of a node creating one filespace at once: one inserts, the other
        // finds its row.
        let inserted = s
            .opt(
                "INSERT INTO filespaces (node_id, name, created) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (node_id, name) DO NOTHING RETURNING id",
                &[node.0.into(), name.into(), crate::now().into()],
                |r| r.int(0),
            )
            .map_err(on_constraint(|| CatalogError::NotFound {
                what: "node",
                key: node.0.to_string(),
            }))?;
        match inserted {
            Some(id) => Ok(FilespaceId(id)),
            None => s.int(find, &args).map(FilespaceId),
        }
    })
}

/// The columns of a filespace's backup runs, after its `last_` or `ok_` prefix.
const RUN: [&str; 6] = ["started", "ended", "result", "objects", "bytes", "warnings"];

pub(super) fn filespaces(b: &dyn Backend, node: NodeId) -> Result<Vec<Filespace>> {
    let runs: Vec<String> =
        ["last_", "ok_"].iter().flat_map(|p| RUN.iter().map(move |c| format!("{p}{c}"))).collect();
    let sql = format!(
        "SELECT id, name, created, generation, {} FROM filespaces WHERE node_id = ?1 \
         ORDER BY name",
        runs.join(", ")
    );
    sql::read(b, "reading filespaces", |s| {
        s.all(&sql, &[node.0.into()], |r| {
            Ok(Filespace {
                id: FilespaceId(r.int(0)?),
                node,
                name: r.text(1)?,
                created: r.int(2)?,
                generation: r.int(3)?,
                last_backup: run(r, 4)?,
                last_completed: run(r, 4 + RUN.len())?,
            })
        })
    })
}

/// The run in the [`RUN`] columns from `at`, if one was recorded.
fn run(r: &dyn sql::Row, at: usize) -> Result<Option<BackupRun>> {
    let Some(started) = r.opt_int(at)? else { return Ok(None) };
    let count = |i: usize| -> Result<u64> { Ok(r.opt_int(at + i)?.unwrap_or(0).max(0) as u64) };
    // A result this version does not know (written by a newer server sharing the catalog)
    // leaves the run out rather than failing every read of the node's filespaces.
    let Some(result) = RunResult::parse(&r.opt_text(at + 2)?.unwrap_or_default()) else {
        return Ok(None);
    };
    Ok(Some(BackupRun {
        started,
        ended: r.opt_int(at + 1)?.unwrap_or(started),
        result,
        objects: count(3)?,
        bytes: count(4)?,
        warnings: count(5)?,
    }))
}

pub(super) fn record_backup(b: &dyn Backend, filespace: FilespaceId, r: &BackupRun) -> Result<()> {
    let completed = r.result != RunResult::Failed;
    let prefixes: &[&str] = if completed { &["last_", "ok_"] } else { &["last_"] };
    let set: Vec<String> = prefixes
        .iter()
        .flat_map(|p| RUN.iter().enumerate().map(move |(i, c)| format!("{p}{c} = ?{}", i + 1)))
        .collect();
    let sql = format!("UPDATE filespaces SET {} WHERE id = ?7", set.join(", "));
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let args = [
        r.started.into(),
        r.ended.into(),
        r.result.name().into(),
        int(r.objects).into(),
        int(r.bytes).into(),
        int(r.warnings).into(),
        filespace.0.into(),
    ];
    // The last runs and the history change together: a chart never shows a run the
    // filespace's row does not, or misses the one it does.
    let found = sql::txn(b, "recording a backup", |s| {
        if s.execute(&sql, &args)? == 0 {
            return Ok(false);
        }
        s.execute(
            &format!(
                "INSERT INTO backup_runs (filespace_id, {}) VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)",
                RUN.join(", ")
            ),
            &args,
        )?;
        // The history is bounded: past its newest RUNS_KEPT, the oldest go.
        s.execute(
            "DELETE FROM backup_runs WHERE filespace_id = ?1 AND id <= \
             (SELECT id FROM backup_runs WHERE filespace_id = ?1 ORDER BY id DESC \
              LIMIT 1 OFFSET ?2)",
            &[filespace.0.into(), (crate::RUNS_KEPT as i64).into()],
        )?;
        Ok(true)
    })?;
    if !found {
        return Err(CatalogError::NotFound { what: "filespace", key: filespace.0.to_string() });
    }
    Ok(())
}

pub(super) fn backup_runs(
    b: &dyn Backend,
    filespace: FilespaceId,
    since: Timestamp,
) -> Result<Vec<BackupRun>> {
    let sql = format!(
        "SELECT {} FROM backup_runs WHERE filespace_id = ?1 AND ended >= ?2 ORDER BY id",
        RUN.join(", ")
    );
    sql::read(b, "reading a filespace's backup history", |s| {
        let runs = s.all(&sql, &[filespace.0.into(), since.into()], |r| run(r, 0))?;
        Ok(runs.into_iter().flatten().collect())
    })
}

pub(super) fn delete_filespace(
    b: &(impl Backend + Catalog),
    filespace: FilespaceId,
    batch: usize,
    stop: &AtomicBool,
) -> Result<u64> {
    let op = "deleting a filespace";
    let fs = Arg::Int(filespace.0);
    let ids = |limit: i64| {
        sql::read(b, op, |s| {
            // Each state through its own partial index (`state = 1`, `state <> 1` literally).
            let mut ids = Vec::new();
            for sql in [
                "SELECT id FROM objects WHERE filespace_id = ?1 AND state = 1 LIMIT ?2",
                "SELECT id FROM objects WHERE filespace_id = ?1 AND state <> 1 LIMIT ?2",
            ] {
                ids.extend(s.all(sql, &[fs, limit.into()], |r| r.int(0))?);
            }
            Ok(ids)
        })
    };
    let remove = || {
        sql::txn(b, op, |s| {
            let gone = s.execute(
                "DELETE FROM filespaces WHERE id = ?1 AND NOT EXISTS \
                 (SELECT 1 FROM objects WHERE filespace_id = ?1)",
                &[fs],
            )? > 0;
            if gone {
                s.execute("DELETE FROM backup_stats WHERE filespace_id = ?1", &[fs])?;
                s.execute("DELETE FROM backup_runs WHERE filespace_id = ?1", &[fs])?;
                s.execute("DELETE FROM holds WHERE filespace_id = ?1", &[fs])?;
            }
            Ok(gone)
        })
    };
    let exists = || {
        sql::read(b, op, |s| s.int("SELECT count(*) FROM filespaces WHERE id = ?1", &[fs]))
            .map(|n| n > 0)
    };
    crate::delete_filespace_in_batches(b, filespace, batch, stop, &ids, &remove, &exists)
}
