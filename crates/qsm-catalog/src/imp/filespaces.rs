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

pub(super) fn filespaces(b: &dyn Backend, node: NodeId) -> Result<Vec<Filespace>> {
    sql::read(b, "reading filespaces", |s| {
        s.all(
            "SELECT id, name, created, generation FROM filespaces WHERE node_id = ?1 \
             ORDER BY name",
            &[node.0.into()],
            |r| {
                Ok(Filespace {
                    id: FilespaceId(r.int(0)?),
                    node,
                    name: r.text(1)?,
                    created: r.int(2)?,
                    generation: r.int(3)?,
                })
            },
        )
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
        sql::auto(b, op, |s| {
            s.execute(
                "DELETE FROM filespaces WHERE id = ?1 AND NOT EXISTS \
                 (SELECT 1 FROM objects WHERE filespace_id = ?1)",
                &[fs],
            )
        })
        .map(|n| n > 0)
    };
    let exists = || {
        sql::read(b, op, |s| s.int("SELECT count(*) FROM filespaces WHERE id = ?1", &[fs]))
            .map(|n| n > 0)
    };
    crate::delete_filespace_in_batches(b, filespace, batch, stop, &ids, &remove, &exists)
}
