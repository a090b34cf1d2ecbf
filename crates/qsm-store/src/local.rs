//! Opening a store on local disks, as the embedded server and `qsm server` both do.

use std::path::Path;
use std::sync::Arc;

use qsm_catalog::{AnyCatalog, Catalog, SqliteCatalog};
use qsm_pool::{DirPool, DirPoolOptions, Pool};

use crate::{Result, Store, StoreError};

/// Opens (creating on first use) a SQLite catalog at `catalog` and a directory pool named
/// `pool_name` at `pool`; they may sit on different disks. A pool the catalog knows but that is
/// missing is refused, never replaced by an empty one: later incremental backups would skip
/// files whose data is stored nowhere.
pub fn open_local(catalog: &Path, pool: &Path, pool_name: &str) -> Result<Store> {
    open_catalog(AnyCatalog::Sqlite(SqliteCatalog::open(catalog)?), pool, pool_name)
}

/// [`open_local`] with a catalog of either backend (`qsm server --catalog postgres://...`).
pub fn open_catalog(catalog: AnyCatalog, pool: &Path, pool_name: &str) -> Result<Store> {
    let name = catalog.tables().describe();
    let dir_pool = if pool.join("POOL").exists() {
        DirPool::open(pool)?
    } else if !catalog.catalog().pools()?.is_empty() {
        return Err(StoreError::MissingPool(format!(
            "the catalog {name} refers to a storage pool, but {} holds none: mount or restore it",
            pool.display()
        )));
    } else {
        DirPool::create(pool, pool_name, &DirPoolOptions::default())?
    };
    open_with_pool(catalog, Arc::new(dir_pool))
}

/// A store over `catalog` and an already open `pool` of any kind (an S3 pool, say).
pub fn open_with_pool(catalog: AnyCatalog, pool: Arc<dyn Pool>) -> Result<Store> {
    let name = catalog.tables().describe();
    if let AnyCatalog::Sqlite(sqlite) = &catalog
        && let Some(u) = sqlite.upgraded()
    {
        let _ = sqlite.log(
            qsm_catalog::Severity::Info,
            &format!(
                "catalog {name} upgraded from schema {} to {}; the catalog as it was is {}",
                u.from,
                u.to,
                u.backup.display()
            ),
            None,
            None,
            None,
        );
    }
    let catalog: Arc<dyn Catalog> = catalog.into_shared();
    Store::new(catalog, pool)
}
