//! Integrity and size: the consistency check, the statistics, the audit's search for the
//! versions of damaged chunks and their marking, and the catalog's named numbers.

use std::collections::HashMap;

use super::*;
use crate::sql;

/// Problems listed by a consistency check before the rest are only counted.
const MAX_PROBLEMS: usize = 1000;

pub(super) fn objects_using(
    b: &dyn Backend,
    chunks: &HashSet<ChunkRowId>,
) -> Result<(Vec<VersionRef>, ObjectId)> {
    let mut found = Vec::new();
    let mut after = 0i64;
    if chunks.is_empty() {
        return Ok((found, ObjectId(after)));
    }
    loop {
        // Pages by id, each its own read: a scan of every version must not pin a snapshot.
        let page = sql::read(b, "finding the objects of chunks", |s| {
            s.all(
                "SELECT id, filespace_id, path, chunk_list FROM objects WHERE id > ?1 \
                 ORDER BY id LIMIT ?2",
                &[after.into(), (PAGE as i64).into()],
                |r| Ok((r.int(0)?, r.int(1)?, r.bytes(2)?, r.bytes(3)?)),
            )
        })?;
        let Some(last) = page.last() else { return Ok((found, ObjectId(after))) };
        after = last.0;
        let full = page.len() == PAGE;
        for (id, fs, path, blob) in page {
            let list = chunk_list::decode(&blob)
                .map_err(|e| CatalogError::Damaged(format!("object {id}: {e}")))?;
            if list.iter().any(|c| chunks.contains(c)) {
                found.push((ObjectId(id), FilespaceId(fs), path));
            }
        }
        if !full {
            return Ok((found, ObjectId(after)));
        }
    }
}

pub(super) fn mark_damaged(
    b: &dyn Backend,
    chunks: &[ChunkRowId],
    objects: &[ObjectId],
    after: ObjectId,
) -> Result<()> {
    let mut t = txn::SqlTxn::begin(b)?;
    t.chunks_gone = !chunks.is_empty();
    t.c.set_op("marking chunks and versions damaged");
    let s: &mut dyn sql::Sql = &mut *t.c;
    let arrays = s.dialect().arrays();
    let ids: Vec<i64> = chunks.iter().map(|c| c.0).collect();
    if arrays {
        s.execute("UPDATE chunks SET damaged = 1 WHERE id = ANY(?1)", &[Arg::Ints(&ids)])?;
    } else {
        for id in &ids {
            s.execute("UPDATE chunks SET damaged = 1 WHERE id = ?1", &[(*id).into()])?;
        }
    }
    // Versions committed since the scan that found `objects`: few, read in this transaction
    // after the chunks were marked, so a version committed later sees the marks (its
    // reference makes it damaged) and one committed earlier is read here.
    let wanted: HashSet<ChunkRowId> = chunks.iter().copied().collect();
    let mut all: Vec<i64> = objects.iter().map(|o| o.0).collect();
    s.each("SELECT id, chunk_list FROM objects WHERE id > ?1", &[after.0.into()], &mut |r| {
        if chunk_list::decode(&r.bytes(1)?)?.iter().any(|c| wanted.contains(c)) {
            all.push(r.int(0)?);
        }
        Ok(())
    })?;
    // The damaged active versions leave the inventory clients compare with: their
    // filespaces get a new generation.
    let changed = &mut t.changed;
    if arrays {
        s.each(
            "UPDATE objects SET damaged = 1 WHERE id = ANY(?1) RETURNING filespace_id",
            &[Arg::Ints(&all)],
            &mut |r| {
                changed.insert(r.int(0)?);
                Ok(())
            },
        )?;
    } else {
        for id in all {
            let sql = "UPDATE objects SET damaged = 1 WHERE id = ?1 RETURNING filespace_id";
            changed.extend(s.opt(sql, &[id.into()], |r| r.int(0))?);
        }
    }
    Box::new(t).commit()
}

pub(super) fn state_value(b: &dyn Backend, name: &str) -> Result<Option<i64>> {
    sql::read(b, "reading the catalog state", |s| {
        s.opt("SELECT value FROM catalog_state WHERE name = ?1", &[name.into()], |r| r.int(0))
    })
}

pub(super) fn set_state_value(b: &dyn Backend, name: &str, value: i64) -> Result<()> {
    sql::auto(b, "writing the catalog state", |s| {
        s.execute(
            "INSERT INTO catalog_state (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            &[name.into(), value.into()],
        )
    })
    .map(|_| ())
}

fn problem(report: &mut ConsistencyReport, text: String) {
    if report.problems.len() < MAX_PROBLEMS {
        report.problems.push(text);
    }
}

pub(super) fn check(b: &dyn Backend) -> Result<ConsistencyReport> {
    // Both tables from one snapshot, in pages by id: a table may not fit in memory as one
    // result.
    sql::snapshot(b, "checking", |s| {
        let mut report = ConsistencyReport::default();
        let mut refs: HashMap<i64, u64> = HashMap::new();
        let page = Arg::Int(PAGE as i64);
        let mut after = i64::MIN;
        loop {
            let mut n = 0;
            s.each(
                "SELECT id, chunk_list FROM objects WHERE id > ?1 ORDER BY id LIMIT ?2",
                &[after.into(), page],
                &mut |r| {
                    n += 1;
                    report.objects += 1;
                    let id = r.int(0)?;
                    after = id;
                    match chunk_list::decode(&r.bytes(1)?) {
                        Ok(list) => list.iter().for_each(|ch| *refs.entry(ch.0).or_default() += 1),
                        Err(e) => problem(&mut report, format!("object {id}: {e}")),
                    }
                    Ok(())
                },
            )?;
            if n < PAGE {
                break;
            }
        }
        let mut after = i64::MIN;
        loop {
            let mut n = 0;
            s.each(
                "SELECT c.id, c.refcount, c.container_id, k.id FROM chunks c \
                 LEFT JOIN containers k ON k.id = c.container_id WHERE c.id > ?1 \
                 ORDER BY c.id LIMIT ?2",
                &[after.into(), page],
                &mut |r| {
                    n += 1;
                    report.chunks += 1;
                    let id = r.int(0)?;
                    after = id;
                    let refcount = r.int(1)?;
                    let counted = refs.remove(&id).unwrap_or(0);
                    if refcount as u64 != counted {
                        problem(
                            &mut report,
                            format!(
                                "chunk {id}: reference count {refcount}, but {counted} references"
                            ),
                        );
                    }
                    if counted == 0 {
                        report.unreferenced_chunks += 1;
                    }
                    if r.opt_int(3)?.is_none() {
                        let container = r.int(2)? as u64;
                        problem(
                            &mut report,
                            format!("chunk {id}: container {container:016x} is not recorded"),
                        );
                    }
                    Ok(())
                },
            )?;
            if n < PAGE {
                break;
            }
        }
        for (id, n) in refs.drain() {
            problem(&mut report, format!("chunk {id} is missing but referenced {n} times"));
        }
        Ok(report)
    })
}

pub(super) fn stats(b: &dyn Backend) -> Result<CatalogStats> {
    sql::read(b, "counting", |s| {
        let size = s.dialect().database_bytes();
        let mut n = |sql: &str| -> Result<u64> { Ok(s.int(sql, &[])? as u64) };
        Ok(CatalogStats {
            objects: n("SELECT count(*) FROM objects")?,
            chunks: n("SELECT count(*) FROM chunks")?,
            containers: n("SELECT count(*) FROM containers")?,
            damaged_chunks: n("SELECT count(*) FROM chunks WHERE damaged <> 0")?,
            damaged_objects: n("SELECT count(*) FROM objects WHERE damaged <> 0")?,
            database_bytes: n(size)?,
            // PostgreSQL sums BIGINTs as NUMERIC: cast back.
            version_bytes: n("SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM objects")?,
            chunk_raw_bytes: n("SELECT CAST(COALESCE(SUM(raw_len), 0) AS BIGINT) FROM chunks")?,
            chunk_stored_bytes: n(
                "SELECT CAST(COALESCE(SUM(stored_len), 0) AS BIGINT) FROM chunks",
            )?,
        })
    })
}
