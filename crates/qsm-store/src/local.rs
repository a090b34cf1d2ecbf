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
    // A missing catalog beside a pool that holds data is refused before an empty catalog is
    // created in its place: the lost one may still be put back there.
    if !catalog.exists() && pool.join("POOL").exists() {
        let dir_pool = DirPool::open(pool)?;
        crate::owner::refuse_if_holding(&dir_pool, &format!("{} (missing)", catalog.display()))?;
    }
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
    let mut store = open_with_pool(catalog, Arc::new(dir_pool))?;
    store.warnings.extend(readable_by_others(pool));
    Ok(store)
}

/// A warning if the directory `dir` lets others in: the pool creates its own directories and
/// containers owner-only, but one made beforehand (or containers written before they were
/// made owner-only) may not be.
fn readable_by_others(dir: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "the storage pool directory {} has mode {mode:03o}: other users may reach backed-up \
             data; `chmod 700` it",
            dir.display()
        )
    })
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
    // Said once where the store is opened: queries and restores work, anything that writes
    // fails naming the full disk.
    let read_only = match &catalog {
        AnyCatalog::Sqlite(sqlite) => sqlite.read_only(),
        _ => None,
    };
    let catalog: Arc<dyn Catalog> = catalog.into_shared();
    let mut store = Store::new(catalog, pool, &name)?;
    store.warnings.extend(read_only);
    Ok(store)
}
