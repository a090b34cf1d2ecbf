//! Node replication (issue 30): on a source, the servers it replicates to; on a target, the
//! nodes replicated into it and their versions' ids on their source (`objects.origin`); and
//! the repair of a damaged chunk from a copy.

use super::*;
use crate::sql::{self, Sql};

/// Creates node `name` as a replica made by `account` from the source catalog's
/// `incarnation`, or updates the one `account` made before from the same incarnation (its
/// password hash; its domain only when created): one transaction, so two runs at once make
/// one node. A node of this server's own, another account's replica, or one from another
/// incarnation of its source's catalog (restored since: its ids name other versions now), is
/// refused.
pub(super) fn put_replica_node(
    b: &dyn Backend,
    name: &str,
    account: &str,
    password_hash: &str,
    domain: DomainId,
    incarnation: i64,
) -> Result<NodeId> {
    sql::txn(b, "storing a replicated node", |s| {
        let sql = format!(
            "SELECT id, replica_of, replica_incarnation FROM nodes WHERE name = ?1{}",
            s.dialect().for_update()
        );
        let row = |r: &dyn Row| Ok((r.int(0)?, r.opt_text(1)?, r.opt_int(2)?));
        match s.opt(&sql, &[name.into()], row)? {
            Some((_, Some(by), Some(was))) if by == account && was != incarnation => {
                Err(CatalogError::Refused(format!(
                    "node {name} was replicated from another incarnation of its source's \
                     catalog (restored since, so its version ids now name other versions): \
                     delete its replica here (its filespaces, then the node) and replicate it \
                     again"
                )))
            }
            Some((id, Some(by), _)) if by == account => {
                s.execute(
                    "UPDATE nodes SET password_hash = ?1, replica_incarnation = ?2 WHERE id = ?3",
                    &[password_hash.into(), incarnation.into(), id.into()],
                )?;
                Ok(NodeId(id))
            }
            Some((_, by, _)) => Err(CatalogError::Exists {
                what: match by {
                    Some(_) => "node replicated by another server",
                    None => "node of this server's own",
                },
                name: name.into(),
            }),
            None => s
                .insert(
                    "INSERT INTO nodes (name, password_hash, domain_id, locked, registered, \
                     replica_of, replica_incarnation) VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6)",
                    &[
                        name.into(),
                        password_hash.into(),
                        domain.0.into(),
                        crate::now().into(),
                        account.into(),
                        incarnation.into(),
                    ],
                )
                .map(NodeId),
        }
    })
}

/// The replicated versions of `filespace`: each one's id on its source, and whether it is
/// active here.
pub(super) fn replica_versions(
    b: &dyn Backend,
    filespace: FilespaceId,
) -> Result<Vec<(ObjectId, bool)>> {
    sql::read(b, "reading a filespace's replicated versions", |s| {
        s.all(
            "SELECT origin, state FROM objects WHERE filespace_id = ?1 AND origin IS NOT NULL \
             ORDER BY origin",
            &[filespace.0.into()],
            |r| Ok((ObjectId(r.int(0)?), r.int(1)? == STATE_ACTIVE)),
        )
    })
}

/// Marks inactive, at the time given with each, the active replicated versions of
/// `filespace` whose source ids are listed (their source made them inactive); how many were.
pub(super) fn deactivate_origins(
    b: &dyn Backend,
    filespace: FilespaceId,
    origins: &[(ObjectId, Timestamp)],
) -> Result<u64> {
    if origins.is_empty() {
        return Ok(0);
    }
    let mut t = txn::SqlTxn::begin(b)?;
    t.changed.insert(filespace.0);
    t.c.set_op("deactivating replicated versions");
    let s: &mut dyn Sql = &mut *t.c;
    let (mut n, now) = (0, crate::now());
    for (origin, when) in origins {
        // Never in the future: a hostile clock must not delay expiration either way.
        let when = (*when).min(now);
        n += s.execute(
            "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 \
             AND origin = ?3 AND state = 1",
            &[when.into(), filespace.0.into(), origin.0.into()],
        )?;
    }
    Box::new(t).commit()?;
    Ok(n)
}

/// The version of `filespace` replicated from source id `origin`, if it is here.
pub(super) fn object_by_origin(
    b: &dyn Backend,
    filespace: FilespaceId,
    origin: ObjectId,
) -> Result<Option<ObjectId>> {
    sql::read(b, "finding a replicated version", |s| {
        s.opt(
            "SELECT id FROM objects WHERE filespace_id = ?1 AND origin = ?2",
            &[filespace.0.into(), origin.0.into()],
            |r| r.int(0).map(ObjectId),
        )
    })
}

/// Points damaged chunk `id`, read at `from`, at a good copy of its frame written at `to`,
/// and clears its damage; the versions left with no damaged chunk are whole again. Refused
/// (false) if the chunk moved since or is not damaged.
pub(super) fn repair_chunk(
    b: &dyn Backend,
    id: ChunkRowId,
    from: (ContainerId, u64),
    to: &NewChunk,
    users: &[ObjectId],
) -> Result<bool> {
    let mut t = txn::SqlTxn::begin(b)?;
    t.c.set_op("repairing a chunk");
    let s: &mut dyn Sql = &mut *t.c;
    let n = s.execute(
        "UPDATE chunks SET container_id = ?1, frame_offset = ?2, stored_len = ?3, codec = ?4, \
         damaged = 0 WHERE id = ?5 AND container_id = ?6 AND frame_offset = ?7 AND damaged <> 0",
        &[
            (to.container.0 as i64).into(),
            (to.offset as i64).into(),
            i64::from(to.stored_len).into(),
            i64::from(to.codec).into(),
            id.0.into(),
            (from.0.0 as i64).into(),
            (from.1 as i64).into(),
        ],
    )?;
    if n == 0 {
        return Ok(false);
    }
    // The versions using it that are whole now.
    for object in users {
        let row = s.opt(
            "SELECT chunk_list, filespace_id FROM objects WHERE id = ?1 AND damaged <> 0",
            &[object.0.into()],
            |r| Ok((chunk_list::decode(&r.bytes(0)?)?, r.int(1)?)),
        )?;
        let Some((chunks, fs)) = row else { continue };
        let mut whole = true;
        for c in &chunks {
            let d =
                s.opt("SELECT damaged FROM chunks WHERE id = ?1", &[c.0.into()], |r| r.int(0))?;
            whole &= d == Some(0);
        }
        if whole {
            s.execute("UPDATE objects SET damaged = 0 WHERE id = ?1", &[object.0.into()])?;
            t.changed.insert(fs);
        }
    }
    Box::new(t).commit()?;
    Ok(true)
}

fn server_from_row(r: &dyn Row) -> Result<PeerServer> {
    Ok(PeerServer {
        name: r.text(0)?,
        address: r.text(1)?,
        ca: r.text(2)?,
        account: r.text(3)?,
        password: r.text(4)?,
        created: r.int(5)?,
    })
}

pub(super) fn define_peer_server(b: &dyn Backend, server: &PeerServer) -> Result<()> {
    sql::auto(b, "defining a server", |s| {
        s.execute(
            "INSERT INTO peer_servers (name, address, ca, account, password, created) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            &[
                server.name.as_str().into(),
                server.address.as_str().into(),
                server.ca.as_str().into(),
                server.account.as_str().into(),
                server.password.as_str().into(),
                server.created.into(),
            ],
        )
    })
    .map(|_| ())
    .map_err(|e| {
        if e.is_unique() {
            CatalogError::Exists { what: "server", name: server.name.clone() }
        } else {
            e
        }
    })
}

pub(super) fn delete_peer_server(b: &dyn Backend, name: &str) -> Result<()> {
    let n = sql::auto(b, "deleting a server", |s| {
        s.execute("DELETE FROM peer_servers WHERE name = ?1", &[name.into()])
    })?;
    if n == 0 {
        return Err(CatalogError::NotFound { what: "server", key: name.into() });
    }
    Ok(())
}

pub(super) fn peer_servers(b: &dyn Backend) -> Result<Vec<PeerServer>> {
    sql::read(b, "reading servers", |s| {
        s.all(
            "SELECT name, address, ca, account, password, created FROM peer_servers ORDER BY name",
            &[],
            server_from_row,
        )
    })
}

/// The chunks an audit marked damaged that versions still use.
pub(super) fn damaged_chunks(b: &dyn Backend) -> Result<Vec<ChunkRef>> {
    sql::read(b, "reading damaged chunks", |s| {
        s.all(
            &format!(
                "SELECT {CHUNK_COLUMNS}, hash, scope, sealed FROM chunks \
                 WHERE damaged <> 0 AND refcount > 0 ORDER BY id"
            ),
            &[],
            super::inventory::chunk_ref,
        )
    })
}
