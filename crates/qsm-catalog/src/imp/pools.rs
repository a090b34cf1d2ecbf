//! Storage pools, their containers, and the chunks stored in them.

use super::*;
use crate::sql;

pub(super) fn define_pool(
    b: &dyn Backend,
    name: &str,
    kind: &str,
    location: &str,
) -> Result<PoolId> {
    sql::auto(b, "defining a storage pool", |s| {
        s.insert(
            "INSERT INTO storage_pools (name, kind, location) VALUES (?1, ?2, ?3)",
            &[name.into(), kind.into(), location.into()],
        )
    })
    .map(PoolId)
    .map_err(on_constraint(|| CatalogError::Exists { what: "storage pool", name: name.into() }))
}

pub(super) fn pools(b: &dyn Backend) -> Result<Vec<StoragePool>> {
    sql::read(b, "reading pools", |s| {
        s.all("SELECT id, name, kind, location FROM storage_pools ORDER BY name", &[], |r| {
            Ok(StoragePool {
                id: PoolId(r.int(0)?),
                name: r.text(1)?,
                kind: r.text(2)?,
                location: r.text(3)?,
            })
        })
    })
}

pub(super) fn containers(b: &dyn Backend, pool: PoolId) -> Result<Vec<Container>> {
    sql::read(b, "reading containers", |s| {
        s.all(
            "SELECT id, size, sealed FROM containers WHERE pool_id = ?1 ORDER BY id",
            &[pool.0.into()],
            |r| {
                Ok(Container {
                    id: ContainerId(r.int(0)? as u64),
                    pool,
                    size: r.int(1)? as u64,
                    sealed: r.int(2)? != 0,
                })
            },
        )
    })
}

pub(super) fn pool_usage(b: &dyn Backend, pool: PoolId) -> Result<PoolUsage> {
    sql::read(b, "measuring a pool", |s| {
        let id = [pool.0.into()];
        let (containers, bytes) = s
            .opt(
                "SELECT count(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM containers \
                 WHERE pool_id = ?1",
                &id,
                |r| Ok((r.int(0)?, r.int(1)?)),
            )?
            .unwrap_or_default();
        let (chunks, live, damaged) = s
            .opt(
                "SELECT count(*), \
                 CAST(COALESCE(SUM(CASE WHEN k.refcount > 0 THEN k.stored_len ELSE 0 END), 0) AS BIGINT), \
                 CAST(COALESCE(SUM(k.damaged), 0) AS BIGINT) \
                 FROM chunks k JOIN containers t ON t.id = k.container_id WHERE t.pool_id = ?1",
                &id,
                |r| Ok((r.int(0)?, r.int(1)?, r.int(2)?)),
            )?
            .unwrap_or_default();
        Ok(PoolUsage {
            containers: containers as u64,
            bytes: bytes as u64,
            chunks: chunks as u64,
            live_bytes: live as u64,
            damaged_chunks: damaged as u64,
        })
    })
}

pub(super) fn chunks_in_container(b: &dyn Backend, container: ContainerId) -> Result<Vec<Chunk>> {
    let sql =
        format!("SELECT {CHUNK_COLUMNS} FROM chunks WHERE container_id = ?1 ORDER BY frame_offset");
    sql::read(b, "reading chunks", |s| s.all(&sql, &[super::container(container)], chunk_from_row))
}
