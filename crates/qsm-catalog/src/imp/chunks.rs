//! Deduplication: the nodes' dedup scopes, the lookup of stored chunks by keyed id, and the
//! epoch that tells clients their cache of what is stored went stale.

use std::collections::HashMap;

use super::*;
use crate::sql::{self, Sql};

/// The id of the dedup scope `name`, made with `secret` if it does not exist (an existing
/// scope keeps its own secret).
fn scope_named(s: &mut dyn Sql, name: &str, secret: &[u8; 32]) -> Result<i64> {
    s.execute(
        "INSERT INTO dedup_scopes (name, secret) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
        &[name.into(), secret[..].into()],
    )?;
    s.int("SELECT id FROM dedup_scopes WHERE name = ?1", &[name.into()])
}

fn scope_by_id(s: &mut dyn Sql, id: DedupScopeId) -> Result<DedupScope> {
    let found =
        s.opt("SELECT name, secret FROM dedup_scopes WHERE id = ?1", &[id.0.into()], |r| {
            Ok((r.text(0)?, r.bytes(1)?))
        })?;
    let (name, secret) = found
        .ok_or_else(|| CatalogError::NotFound { what: "dedup scope", key: id.0.to_string() })?;
    let secret = secret.try_into().map_err(|_| {
        CatalogError::Damaged(format!("dedup scope {name} has a secret of the wrong length"))
    })?;
    Ok(DedupScope { id, name, secret })
}

pub(super) fn dedup_scope(
    b: &dyn Backend,
    node: NodeId,
    new_secret: [u8; 32],
) -> Result<DedupScope> {
    sql::txn(b, "reading a node's dedup scope", |s| {
        // The node's row locked: an administrator's set-dedup-scope at the same moment is
        // either before (and kept) or after, and a node's first scope is set only where none
        // is.
        let sql = format!(
            "SELECT name, dedup_scope FROM nodes WHERE id = ?1{}",
            s.dialect().for_update()
        );
        let found = s.opt(&sql, &[node.0.into()], |r| Ok((r.text(0)?, r.opt_int(1)?)))?;
        let (name, scope) = found
            .ok_or_else(|| CatalogError::NotFound { what: "node", key: node.0.to_string() })?;
        let id = match scope {
            Some(id) => id,
            None => {
                let id = scope_named(s, &format!("node:{name}"), &new_secret)?;
                s.execute(
                    "UPDATE nodes SET dedup_scope = ?1 WHERE id = ?2 AND dedup_scope IS NULL",
                    &[id.into(), node.0.into()],
                )?;
                id
            }
        };
        scope_by_id(s, DedupScopeId(id))
    })
}

pub(super) fn set_dedup_scope(
    b: &dyn Backend,
    node: NodeId,
    name: &str,
    new_secret: [u8; 32],
) -> Result<DedupScope> {
    sql::txn(b, "setting a node's dedup scope", |s| {
        let id = scope_named(s, name, &new_secret)?;
        let n = s.execute(
            "UPDATE nodes SET dedup_scope = ?1 WHERE id = ?2",
            &[id.into(), node.0.into()],
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        scope_by_id(s, DedupScopeId(id))
    })
}

pub(super) fn find_chunks(
    b: &dyn Backend,
    scope: DedupScopeId,
    sealed: bool,
    hashes: &[[u8; 32]],
) -> Result<Vec<Option<ChunkRowId>>> {
    if hashes.is_empty() {
        return Ok(Vec::new());
    }
    let (scope, sealed) = (Arg::Int(scope.0), Arg::Int(i64::from(sealed)));
    sql::read(b, "looking up chunks", |s| {
        if !s.dialect().arrays() {
            let args: Vec<Arg<'_>> =
                hashes.iter().flat_map(|h| [scope, h[..].into(), sealed]).collect();
            let mut found = vec![None; hashes.len()];
            s.each_of(
                "SELECT id FROM chunks WHERE scope = ?1 AND sealed = ?3 AND hash = ?2 \
                 AND refcount > 0 AND damaged = 0",
                &args,
                3,
                &mut |i, r| {
                    found[i] = Some(ChunkRowId(r.int(0)?));
                    Ok(())
                },
            )?;
            return Ok(found);
        }
        // One round trip for the whole list, however long.
        let list: Vec<&[u8]> = hashes.iter().map(|h| &h[..]).collect();
        let mut found: HashMap<Vec<u8>, i64> = HashMap::with_capacity(hashes.len());
        s.each(
            "SELECT id, hash FROM chunks WHERE scope = ?1 AND sealed = ?2 AND hash = ANY(?3) \
             AND refcount > 0 AND damaged = 0",
            &[scope, sealed, Arg::ByteList(&list)],
            &mut |r| {
                found.insert(r.bytes(1)?, r.int(0)?);
                Ok(())
            },
        )?;
        Ok(hashes.iter().map(|h| found.get(&h[..]).map(|id| ChunkRowId(*id))).collect())
    })
}

pub(super) fn dedup_epoch(b: &dyn Backend) -> Result<u64> {
    sql::read(b, "reading the dedup epoch", |s| {
        s.int("SELECT value FROM catalog_state WHERE name = 'dedup_epoch'", &[])
    })
    .map(|v| v as u64)
}
