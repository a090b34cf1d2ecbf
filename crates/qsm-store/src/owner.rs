//! Catalog and pool know each other. A pool's containers are only as good as the catalog that
//! indexes them: opened with a new or another catalog, every container would look like an
//! orphan, and orphan removal or reclamation would delete the whole pool. So the catalog
//! records the pool (its 128-bit id, in `storage_pools`), the pool records the catalog (the
//! catalog's random id, [`CatalogTag`]), and a store is opened only when they agree:
//!
//! - a pool holding containers that the catalog does not know is refused, naming both, and
//!   nothing is written to either;
//! - a catalog that knows the pool while the pool names another catalog is a copy (put back
//!   by hand, or an older one): it is opened as a restored catalog ([`RESTORED_AT`]), which
//!   keeps reclamation and orphan removal off until an audit has looked at what it does not
//!   know.

use qsm_catalog::{Catalog, Severity};
use qsm_pool::{CatalogTag, Pool};

use crate::{RESTORED_AT, Result, StoreError};

/// The catalog state value holding the catalog's random id. Whole-catalog copies
/// (`backup db`, `restore-db`, `migrate-catalog`) carry it, so a copy is the same catalog.
pub const CATALOG_ID: &str = "catalog_id";

/// The catalog state value naming this incarnation of the catalog. A copy put back in
/// service (`restore-db`, or an older copy its pool finds) gets a new one: it gives out again
/// the ids issued after the copy was taken, and a replication target, which keys what it holds
/// by its source's ids, must not take them for the old ones (issue 30).
pub const INCARNATION: &str = "incarnation";

/// This catalog's incarnation, made on first use.
pub fn incarnation(catalog: &dyn Catalog) -> Result<i64> {
    match catalog.state_value(INCARNATION)?.filter(|v| *v != 0) {
        Some(v) => Ok(v),
        None => renew_incarnation(catalog),
    }
}

/// Gives the catalog a new incarnation.
pub fn renew_incarnation(catalog: &dyn Catalog) -> Result<i64> {
    let mut bytes = [0u8; 8];
    qsm_pool::descriptor::random_bytes(&mut bytes)?;
    let v = i64::from_le_bytes(bytes) | 1; // never 0, which reads as "unset"
    catalog.set_state_value(INCARNATION, v)?;
    Ok(v)
}

/// Refuses `pool` for the catalog at `location`, which has no record of it, if the pool
/// holds containers (a new or emptied pool may be adopted by any catalog).
pub(crate) fn refuse_if_holding(pool: &dyn Pool, location: &str) -> Result<()> {
    let containers = pool.containers()?;
    if containers.is_empty() {
        return Ok(());
    }
    Err(StoreError::ForeignCatalog {
        pool: format!("'{}' (id {})", pool.name(), pool.id()),
        containers: containers.len() as u64,
        bytes: containers.iter().map(|c| c.size).sum(),
        recorded: pool.catalog()?,
        catalog: location.to_owned(),
    })
}

/// This catalog's id, made on first use.
fn catalog_id(catalog: &dyn Catalog) -> Result<String> {
    if let Some(id) = catalog.state_value(CATALOG_ID)?.filter(|id| *id != 0) {
        return Ok(format!("{:016x}", id as u64));
    }
    let mut bytes = [0u8; 8];
    qsm_pool::descriptor::random_bytes(&mut bytes)?;
    let id = i64::from_le_bytes(bytes) | 1; // never 0, which reads as "unset"
    catalog.set_state_value(CATALOG_ID, id)?;
    Ok(format!("{:016x}", id as u64))
}

/// Records the catalog in the pool, once the catalog is known to hold the pool's record. A
/// pool that names another catalog makes this one a restored copy (see the module doc).
pub(crate) fn claim(catalog: &dyn Catalog, pool: &dyn Pool, location: &str) -> Result<()> {
    let ours = CatalogTag { id: catalog_id(catalog)?, location: location.to_owned() };
    match pool.catalog()? {
        Some(tag) if tag == ours => return Ok(()),
        Some(tag) if tag.id != ours.id => {
            let already = catalog.state_value(RESTORED_AT)?.is_some_and(|t| t != 0);
            if !already {
                catalog.set_state_value(RESTORED_AT, qsm_catalog::now().max(1))?;
                renew_incarnation(catalog)?;
            }
            let warning = format!(
                "storage pool '{}' was last used with catalog {} ({}), not with this one ({}, \
                 {location}), which knows the pool: it is taken for an older copy, so \
                 reclamation and orphan removal wait until `qsm admin audit stgpool \
                 --release-unknown` has reported what it does not know",
                pool.name(),
                tag.id,
                tag.location,
                ours.id
            );
            let _ = catalog.log(Severity::Warning, &warning, None, None, None);
        }
        // Unrecorded (a pool from before the record), or the same catalog moved.
        _ => {}
    }
    pool.set_catalog(&ours)?;
    Ok(())
}
