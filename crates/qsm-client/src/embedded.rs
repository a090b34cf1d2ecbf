//! The embedded server: catalog and pool under one directory (`$QSM_HOME`, default
//! `~/.local/share/qsm`), opened in process, created on first use, with one node, `local`.

use qsm_catalog::NodeId;
use qsm_store::Store;
use std::io::Write as _;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{ClientError, Result};
use crate::server::LocalServer;

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
        let store = qsm_store::open_local(&home.join("catalog.db"), &home.join("pool"), "local")?;
        for warning in store.warnings() {
            // A closed stderr loses the warning rather than panicking.
            let _ = writeln!(std::io::stderr(), "qsm: warning: {warning}");
        }
        let catalog = store.catalog();
        let node = match catalog.node(LOCAL_NODE)? {
            Some(n) => n.id,
            // The embedded node never authenticates: it is this machine's own store.
            None => catalog.register_node(
                LOCAL_NODE,
                "!embedded",
                qsm_catalog::standard_domain(catalog.as_ref())?,
            )?,
        };
        Ok(Embedded { store, node, home: home.to_path_buf() })
    }

    /// The local node's view of the store.
    pub fn server(&self) -> LocalServer<'_> {
        LocalServer::new(
            &self.store,
            self.node,
            format!("embedded store in {}", self.home.display()),
        )
    }
}
