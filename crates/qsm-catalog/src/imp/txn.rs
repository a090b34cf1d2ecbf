//! The write transaction ([`Txn`]) written once: what a commit of a backup, an expiration
//! or a reclamation changes, on one connection held from `begin` to `commit`.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::sql::{Open, Sql};

/// A write transaction. Dropped uncommitted, its connection rolls it back.
pub(super) struct SqlTxn<'a> {
    pub(super) c: Box<dyn Open + 'a>,
    /// A chunk lost its last reference or was deleted: the dedup epoch rises at commit.
    pub(super) chunks_gone: bool,
    /// Filespaces whose active inventory changed: a new generation at commit. In id order,
    /// so concurrent commits lock filespaces in one order.
    pub(super) changed: BTreeSet<i64>,
    /// What the class of (management class, filespace) says, read once per transaction.
    pub(super) policies: BTreeMap<(Option<i64>, i64), ClassPolicy>,
}

/// The parts of a management class a version's insert applies ([`class_policy`]).
#[derive(Clone, Copy)]
pub(super) struct ClassPolicy {
    versions_exist: i64,
    retain_min_days: i64,
}

impl<'a> SqlTxn<'a> {
    pub(super) fn begin(b: &'a dyn Backend) -> Result<SqlTxn<'a>> {
        Ok(SqlTxn {
            c: b.open_txn("starting a transaction")?,
            chunks_gone: false,
            changed: BTreeSet::new(),
            policies: BTreeMap::new(),
        })
    }

    /// The connection, its statements' errors saying they were `op`.
    fn sql(&mut self, op: &'static str) -> &mut dyn Sql {
        self.c.set_op(op);
        &mut *self.c
    }
}

/// Deletes an object version and releases its chunk references; returns whether a chunk
/// lost its last one. The one statement that deletes a version: a version under a retention
/// lock or a hold at `now` is refused ([`CatalogError::Protected`]), whoever asks.
fn delete_object(s: &mut dyn Sql, id: ObjectId, now: Timestamp) -> Result<bool> {
    let sql = format!(
        "DELETE FROM objects WHERE id = ?1 AND {} RETURNING chunk_list",
        super::holds::unprotected("?2")
    );
    let Some(list) = s.opt(&sql, &[id.0.into(), now.into()], |r| r.bytes(0))? else {
        return Err(super::holds::why_kept(s, id, now)?);
    };
    release(s, &chunk_list::decode(&list)?)
}

/// Drops one reference to each of `chunks` (a chunk listed twice loses two); returns whether
/// one lost its last.
fn release(s: &mut dyn Sql, chunks: &[ChunkRowId]) -> Result<bool> {
    let mut gone = false;
    if !s.dialect().arrays() {
        for chunk in chunks {
            let left = s.opt(
                "UPDATE chunks SET refcount = refcount - 1 WHERE id = ?1 RETURNING refcount",
                &[chunk.0.into()],
                |r| r.int(0),
            )?;
            gone |= left == Some(0);
        }
        return Ok(gone);
    }
    // One statement for all of a version's chunks, a repeated chunk counted once per
    // occurrence. Two transactions locking shared chunks in opposite orders can deadlock;
    // PostgreSQL aborts one, and the error says it is worth retrying (`is_transient`).
    let mut counts: BTreeMap<i64, i64> = BTreeMap::new();
    for ch in chunks {
        *counts.entry(ch.0).or_default() += 1;
    }
    let ids: Vec<i64> = counts.keys().copied().collect();
    let by: Vec<i64> = counts.values().copied().collect();
    s.each(
        "UPDATE chunks k SET refcount = k.refcount - d.n FROM \
         (SELECT unnest(CAST(?1 AS BIGINT[])) AS id, unnest(CAST(?2 AS BIGINT[])) AS n) d \
         WHERE k.id = d.id RETURNING k.refcount",
        &[Arg::Ints(&ids), Arg::Ints(&by)],
        &mut |r| {
            gone |= r.int(0)? == 0;
            Ok(())
        },
    )?;
    Ok(gone)
}

/// A new backup version of `object.path` is about to become active: the inactive versions
/// beyond its class's versions-exist (the active one counts) are deleted in this
/// transaction, as TSM does at backup time, so a file backed up hourly keeps its limit
/// between expirations. The class is the new version's (the domain's default if unbound).
/// A version under a retention lock or a hold is kept past the limit: expiration deletes
/// it once it is free.
fn enforce_versions_exist(
    s: &mut dyn Sql,
    object: &NewObject,
    limit: i64,
    now: Timestamp,
) -> Result<bool> {
    if limit >= i64::from(crate::expire::NO_LIMIT) {
        return Ok(false);
    }
    // `state <> 1` repeated for the partial index of inactive versions; the LIMIT is none
    // (SQLite wants one before an OFFSET, PostgreSQL refuses -1).
    let doomed = s.all(
        "SELECT id FROM objects WHERE filespace_id = ?1 AND path = ?2 AND state <> 1 \
         AND state = 0 ORDER BY inserted DESC, id DESC LIMIT ?3 OFFSET ?4",
        &[
            object.filespace.0.into(),
            (&object.path).into(),
            i64::MAX.into(),
            (limit - 1).max(0).into(),
        ],
        |r| r.int(0),
    )?;
    let mut gone = false;
    for id in doomed {
        match delete_object(s, ObjectId(id), now) {
            Ok(g) => gone |= g,
            Err(CatalogError::Protected(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(gone)
}

/// What a new version's class says at insert time: its versions-exist and its minimum
/// retention in days. The class is the version's, or its domain's default (`standard`) when
/// it is bound to none; without either, the built-in defaults.
fn class_policy(s: &mut dyn Sql, object: &NewObject) -> Result<ClassPolicy> {
    let standard = "FROM filespaces f JOIN nodes n ON n.id = f.node_id \
                    JOIN mgmt_classes m ON m.domain_id = n.domain_id AND m.name = 'standard'";
    let sql = format!(
        "SELECT COALESCE(\
               (SELECT b.versions_exist FROM backup_copygroups b WHERE b.mgmt_class_id = ?1), \
               (SELECT b.versions_exist {standard} \
                  JOIN backup_copygroups b ON b.mgmt_class_id = m.id WHERE f.id = ?2), \
               ?3), \
           COALESCE(\
               (SELECT m.retain_min_days FROM mgmt_classes m WHERE m.id = ?1), \
               (SELECT m.retain_min_days {standard} WHERE f.id = ?2), \
               0)"
    );
    let args = [
        object.mgmt_class.map(|m| m.0).into(),
        object.filespace.0.into(),
        i64::from(BackupCopyGroup::default().versions_exist).into(),
    ];
    s.opt(&sql, &args, |r| {
        Ok(ClassPolicy { versions_exist: r.int(0)?, retain_min_days: r.int(1)? })
    })?
    .ok_or_else(|| CatalogError::Damaged(format!("no row from {sql}")))
}

/// The error of an insert refused by its foreign key to a missing container.
fn missing_container(id: ContainerId) -> impl FnOnce(CatalogError) -> CatalogError {
    move |e| {
        if e.is_foreign_key() {
            CatalogError::NotFound { what: "container", key: format!("{:016x}", id.0) }
        } else {
            e
        }
    }
}

impl Txn for SqlTxn<'_> {
    fn add_container(&mut self, pool: PoolId, id: ContainerId) -> Result<()> {
        self.sql("recording a container").execute(
            "INSERT INTO containers (id, pool_id, size, sealed) VALUES (?1, ?2, 0, 0) \
             ON CONFLICT DO NOTHING",
            &[container(id), pool.0.into()],
        )?;
        Ok(())
    }

    fn set_container(&mut self, id: ContainerId, size: u64, sealed: bool) -> Result<()> {
        let n = self.sql("updating a container").execute(
            "UPDATE containers SET size = ?1, sealed = ?2 WHERE id = ?3",
            &[(size as i64).into(), i64::from(sealed).into(), container(id)],
        )?;
        if n == 0 {
            return Err(CatalogError::NotFound {
                what: "container",
                key: format!("{:016x}", id.0),
            });
        }
        Ok(())
    }

    fn insert_object(&mut self, object: &NewObject, now: Timestamp) -> Result<ObjectId> {
        if object.kind == ObjectKind::Backup {
            self.changed.insert(object.filespace.0);
        }
        self.c.set_op("inserting an object version");
        let s: &mut dyn Sql = &mut *self.c;
        // A replicated version keeps its source's time, never later than now (a source's clock
        // ahead, or a hostile one, must not make anything look older than it is); protection
        // is always judged at the real time, and a lock runs from the version's arrival here.
        let at = object.replica.map_or(now, |r| r.inserted.min(now));
        let key = (object.mgmt_class.map(|m| m.0), object.filespace.0);
        let policy = match self.policies.get(&key) {
            Some(p) => *p,
            None => {
                let p = class_policy(s, object)?;
                self.policies.insert(key, p);
                p
            }
        };
        let days = policy.retain_min_days;
        let locked_until = (days > 0).then(|| now.saturating_add(days.saturating_mul(86_400)));
        // A replicated backup version arrives inactive when its source made it so, or when a
        // later version of its path (by source id) is here already, active or not: one sent
        // late (its chunk was unreadable at first) never takes over from its successors.
        let inactive_since = match object.replica {
            Some(r) if object.kind == ObjectKind::Backup => match r.deactivated {
                Some(when) => Some(when.min(now)),
                None => s
                    .opt(
                        "SELECT MIN(inserted) FROM objects WHERE filespace_id = ?1 AND path = ?2 \
                         AND origin > ?3",
                        &[object.filespace.0.into(), (&object.path).into(), r.origin.0.into()],
                        |r| r.opt_int(0),
                    )?
                    .flatten(),
            },
            _ => None,
        };
        let state = match object.kind {
            ObjectKind::Backup => {
                // It replaces the active version of its path, as it did on its source when it
                // was stored there; a replicated one replaces only older ones.
                let replaced = match object.replica {
                    None => s.execute(
                        "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 \
                         AND path = ?3 AND state = 1",
                        &[at.into(), object.filespace.0.into(), (&object.path).into()],
                    )?,
                    Some(r) => s.execute(
                        "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 \
                         AND path = ?3 AND state = 1 AND (origin IS NULL OR origin < ?4)",
                        &[
                            at.into(),
                            object.filespace.0.into(),
                            (&object.path).into(),
                            r.origin.0.into(),
                        ],
                    )?,
                };
                if replaced > 0 {
                    self.chunks_gone |=
                        enforce_versions_exist(s, object, policy.versions_exist, now)?;
                }
                if inactive_since.is_some() { 0 } else { STATE_ACTIVE }
            }
            ObjectKind::Archive => STATE_ARCHIVE,
        };
        let mut ids = Vec::with_capacity(object.chunks.len());
        let mut damaged = false;
        for chunk in &object.chunks {
            match chunk {
                ObjectChunk::New(n) => {
                    let id = s
                        .insert(
                            "INSERT INTO chunks (container_id, frame_offset, stored_len, raw_len, \
                             codec, refcount) VALUES (?1, ?2, ?3, ?4, ?5, 1)",
                            &[
                                container(n.container),
                                (n.offset as i64).into(),
                                i64::from(n.stored_len).into(),
                                i64::from(n.raw_len).into(),
                                i64::from(n.codec).into(),
                            ],
                        )
                        .map_err(missing_container(n.container))?;
                    ids.push(ChunkRowId(id));
                }
                ObjectChunk::Keyed(n, key) => {
                    // With a scope, the unique index (scope, sealed, hash) decides who stored
                    // it first: a second copy adds a reference to the first, and its frame
                    // stays unreferenced for reclamation, unless an audit found the first
                    // damaged: then the new frame repairs every object that refers to it.
                    let id = s
                        .int(
                            "INSERT INTO chunks AS k (container_id, frame_offset, stored_len, \
                             raw_len, codec, refcount, hash, scope, sealed) \
                             VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8) \
                             ON CONFLICT (scope, sealed, hash) WHERE scope IS NOT NULL \
                             DO UPDATE SET refcount = k.refcount + 1, \
                             container_id = CASE WHEN k.damaged <> 0 THEN excluded.container_id ELSE k.container_id END, \
                             frame_offset = CASE WHEN k.damaged <> 0 THEN excluded.frame_offset ELSE k.frame_offset END, \
                             stored_len = CASE WHEN k.damaged <> 0 THEN excluded.stored_len ELSE k.stored_len END, \
                             codec = CASE WHEN k.damaged <> 0 THEN excluded.codec ELSE k.codec END, \
                             damaged = 0 RETURNING id",
                            &[
                                container(n.container),
                                (n.offset as i64).into(),
                                i64::from(n.stored_len).into(),
                                i64::from(n.raw_len).into(),
                                i64::from(n.codec).into(),
                                key.hash[..].into(),
                                key.scope.map(|s| s.0).into(),
                                i64::from(key.sealed).into(),
                            ],
                        )
                        .map_err(missing_container(n.container))?;
                    ids.push(ChunkRowId(id));
                }
                ObjectChunk::Existing(id) => {
                    let found = s.opt(
                        "UPDATE chunks SET refcount = refcount + 1 WHERE id = ?1 RETURNING damaged",
                        &[id.0.into()],
                        |r| r.int(0),
                    )?;
                    match found {
                        None => {
                            return Err(CatalogError::NotFound {
                                what: "chunk",
                                key: id.0.to_string(),
                            });
                        }
                        // Looked up before an audit marked it: the version is damaged too, so
                        // the next incremental backup sends its file again.
                        Some(d) => damaged |= d != 0,
                    }
                    ids.push(*id);
                }
            }
        }
        let a = &object.attrs;
        let (list, meta) = (chunk_list::encode(&ids), crate::meta::encode(a));
        let id = s
            .insert(
                "INSERT INTO objects (filespace_id, state, path, object_type, size, mtime_ns, \
                 ctime_ns, mode, uid, gid, inserted, mgmt_class_id, description, retain_until, \
                 link_target, chunk_list, ino, damaged, meta, locked_until, origin, deactivated) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
                 ?17, ?18, ?19, ?20, ?21, ?22)",
                &[
                    object.filespace.0.into(),
                    state.into(),
                    (&object.path).into(),
                    object.object_type.code().into(),
                    (a.size as i64).into(),
                    a.mtime_ns.into(),
                    a.ctime_ns.into(),
                    i64::from(a.mode).into(),
                    i64::from(a.uid).into(),
                    i64::from(a.gid).into(),
                    at.into(),
                    object.mgmt_class.map(|m| m.0).into(),
                    object.description.as_deref().into(),
                    object.retain_until.into(),
                    a.link_target.as_deref().into(),
                    (&list).into(),
                    (a.ino as i64).into(),
                    i64::from(damaged).into(),
                    meta.as_deref().into(),
                    locked_until.into(),
                    object.replica.map(|r| r.origin.0).into(),
                    inactive_since.into(),
                ],
            )
            .map_err(|e| {
                if e.is_foreign_key() {
                    CatalogError::NotFound {
                        what: "filespace or management class",
                        key: format!("{} / {:?}", object.filespace.0, object.mgmt_class),
                    }
                } else {
                    e
                }
            })?;
        Ok(ObjectId(id))
    }

    fn deactivate(&mut self, filespace: FilespaceId, path: &[u8], now: Timestamp) -> Result<bool> {
        self.changed.insert(filespace.0);
        let n = self.sql("deactivating a version").execute(
            "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND path = ?3 \
             AND state = 1",
            &[now.into(), filespace.0.into(), path.into()],
        )?;
        Ok(n > 0)
    }

    fn deactivate_tree(
        &mut self,
        filespace: FilespaceId,
        path: &[u8],
        now: Timestamp,
    ) -> Result<u64> {
        self.changed.insert(filespace.0);
        let s = self.sql("deactivating a tree");
        if path.is_empty() {
            // The root's subtree is everything.
            return s.execute(
                "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND state = 1",
                &[now.into(), filespace.0.into()],
            );
        }
        // Everything in `path/`: from "path/" up to, not including, "path0" ('0' follows '/'),
        // one range of the active index.
        let (mut low, mut high) = (path.to_vec(), path.to_vec());
        low.push(b'/');
        high.push(b'0');
        s.execute(
            "UPDATE objects SET state = 0, deactivated = ?1 WHERE filespace_id = ?2 AND state = 1 \
             AND path >= ?3 AND path < ?4",
            &[now.into(), filespace.0.into(), (&low).into(), (&high).into()],
        )
    }

    fn delete_object(&mut self, id: ObjectId, now: Timestamp) -> Result<()> {
        self.chunks_gone |= delete_object(self.sql("deleting an object version"), id, now)?;
        Ok(())
    }

    fn move_chunk(
        &mut self,
        id: ChunkRowId,
        from: (ContainerId, u64),
        to: ContainerId,
        offset: u64,
    ) -> Result<()> {
        let s = self.sql("moving a chunk");
        let n = s.execute(
            "UPDATE chunks SET container_id = ?1, frame_offset = ?2 WHERE id = ?3 \
             AND container_id = ?4 AND frame_offset = ?5",
            &[
                container(to),
                (offset as i64).into(),
                id.0.into(),
                container(from.0),
                (from.1 as i64).into(),
            ],
        )?;
        if n == 0 {
            let exists = s.int("SELECT count(*) FROM chunks WHERE id = ?1", &[id.0.into()])? > 0;
            return Err(if exists {
                CatalogError::Refused(format!("chunk {} moved since it was read", id.0))
            } else {
                CatalogError::NotFound { what: "chunk", key: id.0.to_string() }
            });
        }
        Ok(())
    }

    fn delete_chunk(&mut self, id: ChunkRowId) -> Result<()> {
        let s = self.sql("deleting a chunk");
        // One statement: a backup on another PostgreSQL connection that references the chunk
        // meanwhile holds its row lock, and after it commits the condition no longer holds.
        let n = s.execute("DELETE FROM chunks WHERE id = ?1 AND refcount = 0", &[id.0.into()])?;
        if n == 0 {
            let refs =
                s.opt("SELECT refcount FROM chunks WHERE id = ?1", &[id.0.into()], |r| r.int(0))?;
            return Err(match refs {
                None => CatalogError::NotFound { what: "chunk", key: id.0.to_string() },
                Some(n) => {
                    CatalogError::Refused(format!("chunk {} is still referenced {n} times", id.0))
                }
            });
        }
        self.chunks_gone = true;
        Ok(())
    }

    fn delete_container(&mut self, id: ContainerId) -> Result<()> {
        let s = self.sql("deleting a container");
        let chunks =
            s.int("SELECT count(*) FROM chunks WHERE container_id = ?1", &[container(id)])?;
        if chunks > 0 {
            return Err(CatalogError::Refused(format!(
                "container {:016x} still holds {chunks} chunks",
                id.0
            )));
        }
        // A chunk inserted into it meanwhile (PostgreSQL) makes this fail on the foreign key.
        s.execute("DELETE FROM containers WHERE id = ?1", &[container(id)]).map_err(
            on_constraint(|| {
                CatalogError::Refused(format!("container {:016x} just received chunks", id.0))
            }),
        )?;
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let SqlTxn { mut c, chunks_gone, changed, .. } = *self;
        if chunks_gone {
            c.set_op("raising the dedup epoch");
            c.execute(
                "UPDATE catalog_state SET value = value + 1 WHERE name = 'dedup_epoch'",
                &[],
            )?;
        }
        if !changed.is_empty() {
            c.set_op("renewing a filespace's generation");
            let sql = format!(
                "UPDATE filespaces SET generation = {} WHERE id = ?1",
                c.dialect().random_bigint()
            );
            for fs in changed {
                c.execute(&sql, &[fs.into()])?;
            }
        }
        c.set_op("committing");
        c.commit()
    }
}
