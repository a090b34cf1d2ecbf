//! The server's configuration: one TOML file; the settings changed at start are also flags
//! (`qsm server --help`), the limits and the lease are set in the file only.

use std::path::{Path, PathBuf};

use qsm_store::TxnLimits;
use serde::{Deserialize, Serialize};

/// The most sessions a server may be told to hold open, in all or for one node (TSM's
/// largest `MAXSESSIONS`).
pub const MAX_SESSIONS: usize = 99_999;
/// The most streams a server may be told to run at once: each holds one of tokio's 512
/// blocking threads, and the catalog's calls (logins included) must always find one free.
pub const MAX_STREAMS: usize = 448;
/// The longest idle timeout, in minutes (TSM's largest `IDLETIMEOUT`).
pub const MAX_IDLE_MINUTES: u64 = 9_999;

/// Everything `qsm server` can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Where the server keeps what is not placed elsewhere: catalog, pool, certificate, socket.
    pub data_dir: PathBuf,
    /// TCP addresses to listen on (`HOST:PORT`; port 0 picks a free one).
    pub listen: Vec<String>,
    /// Where to serve Prometheus metrics over plain HTTP (`HOST:PORT`, path `/metrics`); none
    /// by default. They name nodes and filespaces: keep it on loopback or a monitoring
    /// network.
    pub metrics_listen: Option<String>,
    /// Where to serve the web console and its HTTP/JSON API, over HTTPS with the server's
    /// certificate (`HOST:PORT`); none by default.
    pub http_listen: Option<String>,
    /// Serve TCP without TLS: refused on an address other machines reach unless `insecure`.
    pub plaintext: bool,
    /// Allow `plaintext` on addresses other machines reach (passwords and data in clear).
    pub insecure: bool,
    /// The local socket (default `DATA_DIR/qsm.sock`); `""` for none.
    pub socket: Option<PathBuf>,
    /// The catalog: a SQLite file (default `DATA_DIR/catalog.db`; an SSD keeps it fast) or a
    /// PostgreSQL database `postgres://USER@HOST:PORT/DB` (several servers may share one).
    pub catalog: Option<PathBuf>,
    /// The storage pool directory (default `DATA_DIR/pool`): large, sequential, any disk.
    pub pool: Option<PathBuf>,
    /// The storage pool on an S3-compatible object store instead of `pool` (an `[s3]` table:
    /// endpoint, bucket, prefix, region, credentials; see docs/ADMIN.md).
    pub s3: Option<qsm_pool_s3::S3PoolConfig>,
    /// The server's certificate and key (PEM). Default `DATA_DIR/tls/cert.pem` and `key.pem`,
    /// generated self-signed on first start.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Names the generated certificate is valid for, besides localhost, 127.0.0.1, ::1 and
    /// this host's name.
    pub tls_names: Vec<String>,
    /// Objects per transaction at most (TSM's `TXNGROUPMAX`); clients may ask for fewer.
    pub txn_group_max: usize,
    /// Frame bytes per transaction at most (TSM's `TXNBYTELIMIT`).
    pub txn_byte_limit: u64,
    /// Sessions idle this long are ended.
    pub idle_timeout_minutes: u64,
    /// Sessions open at once at most; logins beyond are refused.
    pub max_sessions: usize,
    /// Sessions of one node open at once at most, so one node (or a client killed over and
    /// over) cannot take every session.
    pub max_node_sessions: usize,
    /// Backup, inventory and fetch streams running at once at most, and per node: each holds a
    /// thread while it runs, and the catalog's calls need threads too.
    pub max_streams: usize,
    pub max_node_streams: usize,
    /// Whether clients deduplicate when neither their flags nor their configuration say.
    pub dedup: bool,
    /// Seconds without a heartbeat after which the servers sharing this server's catalog take
    /// it for dead: they end its sessions and processes, and its unfinished containers become
    /// orphans. It beats every 3 s; the lease must outlast a slow catalog.
    pub lease_seconds: u64,
    /// Webhooks told of failed backups, damaged chunks and a pool nearly full (module
    /// `alerts`): `[[alert]]` tables.
    #[serde(rename = "alert")]
    pub alerts: Vec<crate::alerts::AlertConfig>,
    /// How full (percent) the pool's file system may get before a `pool-full` alert.
    pub pool_full_percent: u8,
}

/// The shortest lease: two heartbeats.
pub const MIN_LEASE_SECONDS: u64 = 6;

impl Default for ServerConfig {
    fn default() -> Self {
        let limits = qsm_store::TxnLimits::default();
        ServerConfig {
            data_dir: PathBuf::from("qsm-server"),
            // TSM's port.
            listen: vec!["0.0.0.0:1500".into()],
            metrics_listen: None,
            http_listen: None,
            plaintext: false,
            insecure: false,
            socket: None,
            catalog: None,
            pool: None,
            s3: None,
            tls_cert: None,
            tls_key: None,
            tls_names: Vec::new(),
            txn_group_max: limits.group_max,
            txn_byte_limit: limits.byte_limit,
            idle_timeout_minutes: 60,
            max_sessions: 256,
            // A client runs one backup or restore per filespace at a time, each a session of
            // one or two streams; 16 leaves room for parallel clients of one machine.
            max_node_sessions: 16,
            // Below tokio's 512 blocking threads, so catalog calls always find one.
            max_streams: 128,
            max_node_streams: 16,
            dedup: false,
            lease_seconds: 30,
            alerts: Vec::new(),
            pool_full_percent: 90,
        }
    }
}

impl ServerConfig {
    /// Reads a configuration file; unknown settings are errors, not silently ignored.
    pub fn load(path: &Path) -> Result<ServerConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the server configuration {}: {e}", path.display()))?;
        let config: ServerConfig = toml::from_str(&text)
            .map_err(|e| format!("server configuration {}: {e}", path.display()))?;
        config.validate().map_err(|e| format!("server configuration {}: {e}", path.display()))?;
        Ok(config)
    }

    /// Refuses settings that would stop the server from working or that no server needs: a
    /// transaction of no objects or bytes, no sessions, sessions ended as soon as they start,
    /// more streams than there are threads to run them, an address that is not `HOST:PORT`.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value, max, unit) in [
            ("txn_group_max", self.txn_group_max as u64, TxnLimits::MAX_GROUP as u64, "objects"),
            ("txn_byte_limit", self.txn_byte_limit, TxnLimits::MAX_BYTES, "bytes"),
            ("max_sessions", self.max_sessions as u64, MAX_SESSIONS as u64, "sessions"),
            ("max_node_sessions", self.max_node_sessions as u64, MAX_SESSIONS as u64, "sessions"),
            ("max_streams", self.max_streams as u64, MAX_STREAMS as u64, "streams"),
            ("max_node_streams", self.max_node_streams as u64, MAX_STREAMS as u64, "streams"),
            ("idle_timeout_minutes", self.idle_timeout_minutes, MAX_IDLE_MINUTES, "minutes"),
        ] {
            if !(1..=max).contains(&value) {
                return Err(format!("{name} {value} is outside 1 to {max} {unit}"));
            }
        }
        for (what, addr) in self
            .listen
            .iter()
            .map(|a| ("listen", a))
            .chain(self.metrics_listen.iter().map(|a| ("metrics_listen", a)))
            .chain(self.http_listen.iter().map(|a| ("http_listen", a)))
        {
            let port = addr.rsplit_once(':').filter(|(host, _)| !host.is_empty());
            if port.is_none_or(|(_, port)| port.parse::<u16>().is_err()) {
                return Err(format!(
                    "{what} address {addr:?}: write HOST:PORT (port 0 to 65535; 0 picks one)"
                ));
            }
        }
        for alert in &self.alerts {
            alert.validate()?;
        }
        if !(1..=100).contains(&self.pool_full_percent) {
            return Err(format!(
                "pool_full_percent {} is outside 1 to 100 percent",
                self.pool_full_percent
            ));
        }
        if !(MIN_LEASE_SECONDS..=3600).contains(&self.lease_seconds) {
            return Err(format!(
                "lease_seconds {} is outside {MIN_LEASE_SECONDS} to 3600 seconds",
                self.lease_seconds
            ));
        }
        if self.plaintext && !self.insecure {
            let reachable: Vec<&String> =
                self.listen.iter().filter(|a| !listens_on_loopback(a)).collect();
            if !reachable.is_empty() {
                return Err(format!(
                    "--plaintext would serve passwords and data in clear on {}, which other \
                     machines reach: listen on 127.0.0.1 only, drop --plaintext (TLS), or say \
                     --insecure if the network is private",
                    reachable.iter().map(|a| a.as_str()).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Checks the certificate and key TLS would serve, when TLS is served and they exist or
    /// are configured (the default pair is generated on first start): a file that is not PEM
    /// of its kind is named here, not left to fail the TLS setup without saying which.
    pub fn check_tls_files(&self) -> Result<(), String> {
        if self.plaintext || self.listen.is_empty() {
            return Ok(());
        }
        let (cert, key) = self.tls_paths();
        if !cert.exists() && !key.exists() {
            if self.tls_cert.is_some() || self.tls_key.is_some() {
                return Err(format!(
                    "the configured certificate {} and key {} do not exist",
                    cert.display(),
                    key.display()
                ));
            }
            return Ok(());
        }
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|e| format!("the TLS {what} {}: {e}", path.display()))
        };
        qsm_proto::pem::check_certificates(&read(&cert, "certificate")?)
            .map_err(|why| format!("the TLS certificate {}: {why}", cert.display()))?;
        qsm_proto::pem::check_private_key(&read(&key, "key")?)
            .map_err(|why| format!("the TLS key {}: {why}", key.display()))?;
        Ok(())
    }

    /// The PostgreSQL catalog's URL, when the catalog is one.
    pub fn catalog_url(&self) -> Option<String> {
        let c = self.catalog.as_ref()?.to_str()?;
        qsm_catalog::is_postgres(c).then(|| c.to_owned())
    }

    /// Opens the catalog this configuration names.
    pub fn open_catalog(&self) -> Result<qsm_catalog::AnyCatalog, qsm_catalog::CatalogError> {
        Ok(match self.catalog_url() {
            Some(url) => qsm_catalog::AnyCatalog::Postgres(Box::new(
                qsm_catalog::PostgresCatalog::open(&url)?,
            )),
            None => qsm_catalog::AnyCatalog::Sqlite(qsm_catalog::SqliteCatalog::open(
                &self.catalog_path(),
            )?),
        })
    }

    /// Opens the store: the catalog, and the pool this configuration names (created on first
    /// use, unless the catalog already refers to a pool: then a missing pool is an error).
    pub fn open_store(&self) -> Result<qsm_store::Store, String> {
        if self.s3.is_none() && self.catalog_url().is_none() {
            // The local case in one place: it refuses a missing catalog beside a pool with
            // data before an empty one is created there.
            return qsm_store::open_local(&self.catalog_path(), &self.pool_path(), "primary")
                .map_err(|e| e.to_string());
        }
        let catalog = self.open_catalog().map_err(|e| e.to_string())?;
        let Some(s3) = &self.s3 else {
            return qsm_store::open_catalog(catalog, &self.pool_path(), "primary")
                .map_err(|e| e.to_string());
        };
        let pool = match qsm_pool_s3::S3Pool::open(s3) {
            Ok(p) => p,
            Err(qsm_pool::PoolError::NotAPool { .. })
                if catalog.catalog().pools().map_err(|e| e.to_string())?.is_empty() =>
            {
                // Two servers starting on a new bucket: one creates, the other opens.
                qsm_pool_s3::S3Pool::create(s3, "primary", None)
                    .or_else(|_| qsm_pool_s3::S3Pool::open(s3))
                    .map_err(|e| e.to_string())?
            }
            Err(e) => return Err(format!("opening the S3 storage pool: {e}")),
        };
        qsm_store::open_with_pool(catalog, std::sync::Arc::new(pool)).map_err(|e| e.to_string())
    }

    /// The SQLite catalog's path (meaningless for a PostgreSQL catalog).
    pub fn catalog_path(&self) -> PathBuf {
        self.catalog.clone().unwrap_or_else(|| self.data_dir.join("catalog.db"))
    }

    /// The pool's path.
    pub fn pool_path(&self) -> PathBuf {
        self.pool.clone().unwrap_or_else(|| self.data_dir.join("pool"))
    }

    /// The local socket's path, if there is one.
    pub fn socket_path(&self) -> Option<PathBuf> {
        match &self.socket {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => Some(self.data_dir.join("qsm.sock")),
        }
    }

    /// The certificate and key paths.
    pub fn tls_paths(&self) -> (PathBuf, PathBuf) {
        (
            self.tls_cert.clone().unwrap_or_else(|| self.data_dir.join("tls/cert.pem")),
            self.tls_key.clone().unwrap_or_else(|| self.data_dir.join("tls/key.pem")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_what_it_names_and_rejects_what_it_does_not_know() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.toml");
        std::fs::write(
            &path,
            "data_dir = \"/srv/qsm\"\ncatalog = \"/ssd/catalog.db\"\ntxn_group_max = 10\n",
        )
        .unwrap();
        let c = ServerConfig::load(&path).unwrap();
        assert_eq!(c.catalog_path(), PathBuf::from("/ssd/catalog.db"));
        assert_eq!(c.pool_path(), PathBuf::from("/srv/qsm/pool"));
        assert_eq!(c.txn_group_max, 10);
        assert_eq!(c.listen, ServerConfig::default().listen);
        std::fs::write(&path, "data_dri = \"/srv\"\n").unwrap();
        let e = ServerConfig::load(&path).unwrap_err();
        assert!(e.contains("data_dri"), "{e}");
        std::fs::write(&path, "txn_byte_limit = 0\n").unwrap();
        let e = ServerConfig::load(&path).unwrap_err();
        assert!(e.contains("txn_byte_limit 0 is outside 1 to 34359738368 bytes"), "{e}");
        std::fs::write(&path, "listen = [\"1500\"]\n").unwrap();
        let e = ServerConfig::load(&path).unwrap_err();
        assert!(e.contains("write HOST:PORT"), "{e}");
    }
}

/// Whether a listen address (`HOST:PORT`) is reached from this machine only.
fn listens_on_loopback(addr: &str) -> bool {
    qsm_proto::is_loopback(addr.rsplit_once(':').map_or(addr, |(host, _)| host))
}

#[cfg(test)]
mod plaintext_tests {
    use super::*;

    #[test]
    fn alerts_are_checked_before_the_server_starts() {
        let with = |text: &str| -> Result<ServerConfig, String> {
            let c: ServerConfig = toml::from_str(text).map_err(|e| e.to_string())?;
            c.validate().map(|()| c)
        };
        let c = with("[[alert]]\nurl = \"https://hooks.example/qsm\"\n").unwrap();
        assert_eq!(
            c.alerts[0].events,
            ["failed", "missed", "damaged", "pool-full", "suspect"],
            "every kind by default"
        );
        let e = with("[[alert]]\nurl = \"ftp://x/y\"\n").unwrap_err();
        assert!(e.contains("ftp://x/y"), "{e}");
        let e = with("[[alert]]\nurl = \"http://h/\"\nevents = [\"failed\", \"exploded\"]\n")
            .unwrap_err();
        assert!(e.contains("exploded") && e.contains("pool-full"), "{e}");
        let e = with("pool_full_percent = 0\n").unwrap_err();
        assert!(e.contains("pool_full_percent 0"), "{e}");
        let e = with("[[alert]]\nurl = \"http://h/\"\nheaders = 1\n").unwrap_err();
        assert!(e.contains("headers"), "{e}");
    }

    #[test]
    fn plaintext_is_refused_where_other_machines_listen_unless_insecure() {
        let mut c = ServerConfig { plaintext: true, ..ServerConfig::default() };
        for (listen, ok) in [
            ("127.0.0.1:0", true),
            ("[::1]:1500", true),
            ("localhost:1500", true),
            ("0.0.0.0:1500", false),
            ("[::]:1500", false),
            ("backup.example:1500", false),
        ] {
            c.listen = vec![listen.into()];
            assert_eq!(c.validate().is_ok(), ok, "{listen}: {:?}", c.validate());
        }
        c.insecure = true;
        assert!(c.validate().is_ok());
        c.plaintext = false;
        c.insecure = false;
        assert!(c.validate().is_ok(), "TLS anywhere");
    }
}
