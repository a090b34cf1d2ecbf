//! Object versions: the streamed inventories (active, every version, expirable), one path's
//! versions, one version and its chunks.

use super::*;
use crate::migrations::OBJECT_COLUMNS;
use crate::sql;

pub(super) fn for_each_active(
    b: &dyn Backend,
    filespace: FilespaceId,
    visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
) -> Result<()> {
    // In pages, each its own read: a backup merges the inventory with its walk as it goes,
    // and a snapshot held open for the whole backup would stop SQLite's WAL checkpoints
    // (PostgreSQL's vacuum). Pages continue after the last path seen, so versions committed
    // meanwhile at paths already passed (the backup's own) do not show up.
    let first = format!(
        "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND state = 1 \
         ORDER BY path LIMIT ?2"
    );
    let next = format!(
        "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND state = 1 \
         AND path > ?3 ORDER BY path LIMIT ?2"
    );
    let mut after: Option<Vec<u8>> = None;
    let mut page = Vec::with_capacity(PAGE);
    loop {
        sql::read(b, "streaming the active inventory", |s| {
            page.clear();
            let mut push = |r: &dyn Row| {
                page.push(object_from_row(r)?);
                Ok(())
            };
            let (fs, limit) = (Arg::Int(filespace.0), Arg::Int(PAGE as i64));
            match &after {
                None => s.each(&first, &[fs, limit], &mut push),
                Some(a) => s.each(&next, &[fs, limit, a.into()], &mut push),
            }
        })?;
        for v in &page {
            visit(v)?;
        }
        match page.pop() {
            Some(last) if page.len() + 1 == PAGE => after = Some(last.path),
            _ => return Ok(()),
        }
    }
}

pub(super) fn for_each_version(
    b: &dyn Backend,
    filespace: FilespaceId,
    visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
) -> Result<()> {
    // In pages of whole paths, each its own short snapshot: a restore or a listing piped
    // into `less` must not hold one while its reader dawdles. `visit` runs between pages.
    crate::paging::for_each_in_pages(|after| versions_page(b, filespace, after), visit)
}

/// One page of [`for_each_version`]: every version of the next paths after `after` (from
/// the first when `None`), in the listing's order, and the page's last path (`None` when it
/// was the last page). Read along the two partial indexes as [`crate::paging`] explains, in
/// one snapshot that ends before the caller sees a row.
fn versions_page(
    b: &dyn Backend,
    filespace: FilespaceId,
    after: Option<&[u8]>,
) -> Result<(Vec<ObjectVersion>, Option<Vec<u8>>)> {
    let from = if after.is_some() { " AND path > ?3" } else { "" };
    let arm = |states: &str| {
        format!(
            "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND {states}{from} \
             ORDER BY path LIMIT ?2"
        )
    };
    let (active_sql, inactive_sql) = (arm("state = 1"), arm("state <> 1"));
    let rest = format!(
        "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND state <> 1 AND path = ?2"
    );
    let fs = Arg::Int(filespace.0);
    let mut args = vec![fs, Arg::Int(crate::paging::VERSION_ARM as i64)];
    args.extend(after.map(Arg::Bytes));
    sql::snapshot(b, "listing versions", |s| {
        let (mut active, mut inactive) = (Vec::new(), Vec::new());
        s.each(&active_sql, &args, &mut |r| {
            active.push(object_from_row(r)?);
            Ok(())
        })?;
        s.each(&inactive_sql, &args, &mut |r| {
            inactive.push(object_from_row(r)?);
            Ok(())
        })?;
        let (last, reread) = crate::paging::cut(&mut active, &mut inactive);
        if let (Some(path), true) = (&last, reread) {
            s.each(&rest, &[fs, path.into()], &mut |r| {
                inactive.push(object_from_row(r)?);
                Ok(())
            })?;
        }
        Ok((crate::paging::sorted(active, inactive), last))
    })
}

pub(super) fn for_each_expirable(
    b: &dyn Backend,
    filespace: FilespaceId,
    visit: &mut dyn FnMut(&ExpiryRow) -> Result<()>,
) -> Result<()> {
    // In pages, each its own read (as the active inventory): a scan of millions of versions
    // must not hold a snapshot for its whole length, and each page sees which paths still
    // have an active version as of its own reading. Pages follow the partial index of
    // non-active rows, (path, state, id), so they never skip or repeat a row; `visit` runs
    // between pages, outside any read.
    crate::expire::for_each_in_pages(PAGE, |after| expirable_page(b, filespace, after), visit)
}

/// One page of [`for_each_expirable`]: the non-active rows after `after` (path, state, id)
/// in index order, each with whether its path has an active version.
fn expirable_page(
    b: &dyn Backend,
    filespace: FilespaceId,
    after: &crate::expire::ExpiryCursor,
) -> Result<Vec<ExpiryRow>> {
    sql::read(b, "listing expirable versions", |s| {
        s.all(
            "SELECT o.id, o.path, o.state, o.inserted, o.deactivated, o.retain_until, \
             o.mgmt_class_id, EXISTS (SELECT 1 FROM objects a WHERE a.filespace_id = \
             o.filespace_id AND a.path = o.path AND a.state = 1) FROM objects o \
             WHERE o.filespace_id = ?1 AND o.state <> 1 AND (o.path, o.state, o.id) > (?2, ?3, ?4) \
             ORDER BY o.path, o.state, o.id LIMIT ?5",
            &[
                filespace.0.into(),
                (&after.0).into(),
                after.1.into(),
                after.2.into(),
                (PAGE as i64).into(),
            ],
            |r| {
                Ok(ExpiryRow {
                    id: ObjectId(r.int(0)?),
                    path: r.bytes(1)?,
                    archive: r.int(2)? == STATE_ARCHIVE,
                    inserted: r.int(3)?,
                    deactivated: r.opt_int(4)?,
                    retain_until: r.opt_int(5)?,
                    mgmt_class: r.opt_int(6)?.map(MgmtClassId),
                    has_active: r.int(7)? != 0,
                })
            },
        )
    })
}

pub(super) fn versions(
    b: &dyn Backend,
    filespace: FilespaceId,
    path: &[u8],
) -> Result<Vec<ObjectVersion>> {
    // Each state through its own partial index.
    let query = |states: &str| {
        format!(
            "SELECT {OBJECT_COLUMNS} FROM objects WHERE filespace_id = ?1 AND path = ?2 AND {states}"
        )
    };
    let (active, others) = (query("state = 1"), query("state <> 1"));
    sql::read(b, "reading versions", |s| {
        let args = [filespace.0.into(), path.into()];
        let mut out = s.all(&active, &args, object_from_row)?;
        out.extend(s.all(&others, &args, object_from_row)?);
        out.sort_by_key(|v| std::cmp::Reverse((v.inserted, v.id)));
        Ok(out)
    })
}

fn object_in(s: &mut dyn crate::sql::Sql, id: ObjectId) -> Result<Option<ObjectVersion>> {
    let sql = format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE id = ?1");
    s.opt(&sql, &[id.0.into()], object_from_row)
}

pub(super) fn object(b: &dyn Backend, id: ObjectId) -> Result<Option<ObjectVersion>> {
    sql::read(b, "reading an object version", |s| object_in(s, id))
}

/// A chunk from a row of [`CHUNK_COLUMNS`] followed by `hash, scope, sealed`.
pub(super) fn chunk_ref(r: &dyn Row) -> Result<ChunkRef> {
    let chunk = chunk_from_row(r)?;
    let hash = match r.opt_bytes(7)? {
        None => None,
        Some(h) => Some(<[u8; 32]>::try_from(h).map_err(|_| {
            CatalogError::Damaged(format!("chunk {} has an id of the wrong length", chunk.id.0))
        })?),
    };
    let (scoped, sealed) = (r.opt_int(8)?.is_some(), r.int(9)? != 0);
    Ok(ChunkRef { id: chunk.id, location: chunk.location, hash, scoped, sealed })
}

pub(super) fn object_chunks(b: &dyn Backend, object: ObjectId) -> Result<Vec<ChunkRef>> {
    sql::read(b, "reading chunks", |s| {
        let Some(obj) = object_in(s, object)? else {
            return Err(CatalogError::NotFound { what: "object", key: object.0.to_string() });
        };
        chunks_of(s, &obj)
    })
}

/// Each object's filespace and chunks, in one snapshot: a restore's fetch reads its objects
/// ahead in batches instead of paying a transaction (and SQLite its file locks) for every
/// statement, two or more per file.
pub(super) fn objects_chunks(
    b: &dyn Backend,
    objects: &[ObjectId],
) -> Result<Vec<Option<crate::ObjectChunks>>> {
    sql::snapshot(b, "reading chunks", |s| {
        let mut out = Vec::with_capacity(objects.len());
        for &id in objects {
            out.push(match object_in(s, id)? {
                None => None,
                Some(obj) => Some((obj.filespace, chunks_of(s, &obj)?)),
            });
        }
        Ok(out)
    })
}

/// The chunks of `obj` in order, with their locations.
fn chunks_of(s: &mut dyn crate::sql::Sql, obj: &ObjectVersion) -> Result<Vec<ChunkRef>> {
    let missing = |id: &ChunkRowId| {
        CatalogError::Damaged(format!("object {} refers to missing chunk {}", obj.id.0, id.0))
    };
    if s.dialect().arrays() {
        let ids: Vec<i64> = obj.chunks.iter().map(|c| c.0).collect();
        let mut found = std::collections::HashMap::with_capacity(ids.len());
        let sql =
            format!("SELECT {CHUNK_COLUMNS}, hash, scope, sealed FROM chunks WHERE id = ANY(?1)");
        s.each(&sql, &[Arg::Ints(&ids)], &mut |r| {
            let chunk = chunk_ref(r)?;
            found.insert(chunk.id, chunk);
            Ok(())
        })?;
        obj.chunks.iter().map(|id| found.get(id).cloned().ok_or_else(|| missing(id))).collect()
    } else {
        let sql = format!("SELECT {CHUNK_COLUMNS}, hash, scope, sealed FROM chunks WHERE id = ?1");
        let args: Vec<Arg<'_>> = obj.chunks.iter().map(|id| Arg::Int(id.0)).collect();
        let mut found = vec![None; args.len()];
        s.each_of(&sql, &args, 1, &mut |i, r| {
            found[i] = Some(chunk_ref(r)?);
            Ok(())
        })?;
        found.into_iter().zip(&obj.chunks).map(|(c, id)| c.ok_or_else(|| missing(id))).collect()
    }
}
