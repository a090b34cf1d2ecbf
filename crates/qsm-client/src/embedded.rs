//! The embedded server: catalog and pool under one directory (`$QSM_HOME`, default
//! `~/.local/share/qsm`), opened in process, created on first use, with one node, `local`.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qsm_catalog::{Catalog, NodeId, SqliteCatalog};
use qsm_pool::{DirPool, DirPoolOptions, Pool};
use qsm_store::Store;

use crate::error::{ClientError, Result};

/// The node an embedded server backs up as.
pub const LOCAL_NODE: &str = "local";

/// A store opened in process.
#[derive(Debug)]
pub struct Embedded {
    /// The store.
    pub store: Store,
    /// The local node.
    pub node: NodeId,
    /// Where it lives.
    pub home: PathBuf,
}

/// `$QSM_HOME`, or `~/.local/share/qsm`.
pub fn default_home() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os("QSM_HOME") {
        return Ok(PathBuf::from(home));
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")));
    base.map(|b| b.join("qsm")).ok_or_else(|| {
        ClientError::Invalid(
            "neither QSM_HOME nor HOME is set: say where to keep the data with QSM_HOME".into(),
        )
    })
}

impl Embedded {
    /// Opens the embedded server in `home`, creating catalog, pool and node on first use.
    pub fn open(home: &Path) -> Result<Embedded> {
        // Owner-only: the pool holds every backed-up file unencrypted, including ones that were
        // private at the source.
        if !home.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(home)
                .map_err(ClientError::io("creating", home))?;
        }
        let catalog = SqliteCatalog::open(&home.join("catalog.db"))?;
        let pool_dir = home.join("pool");
        let pool = if pool_dir.join("POOL").exists() {
            DirPool::open(&pool_dir)?
        } else if !catalog.pools()?.is_empty() {
            // The catalog knows a pool that is gone (an unmounted disk, a deleted directory):
            // a new empty pool would make later incremental backups skip data stored nowhere.
            return Err(ClientError::Invalid(format!(
                "the catalog in {} refers to a storage pool, but {} holds none: mount or restore it",
                home.display(),
                pool_dir.display()
            )));
        } else {
            DirPool::create(&pool_dir, "local", &DirPoolOptions::default())?
        };
        let node = match catalog.node(LOCAL_NODE)? {
            Some(n) => n.id,
            None => {
                let domain = match catalog.domain("standard")? {
                    Some(d) => d.id,
                    None => catalog.define_domain("standard", "the default policy domain")?,
                };
                // The embedded node never authenticates: it is this machine's own store.
                catalog.register_node(LOCAL_NODE, "!embedded", domain)?
            }
        };
        let catalog: Arc<dyn Catalog> = Arc::new(catalog);
        let pool: Arc<dyn Pool> = Arc::new(pool);
        Ok(Embedded { store: Store::new(catalog, pool)?, node, home: home.to_path_buf() })
    }
}
