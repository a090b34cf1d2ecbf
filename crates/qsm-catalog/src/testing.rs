//! Throw-away PostgreSQL databases for tests (this crate's and the server's): a real
//! PostgreSQL, never a mock. The server is the one at `QSM_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); when none answers there,
//! `scripts/ensure-postgres.sh` starts or installs one first.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::postgres::{databases, execute_once};

/// The maintenance database's URL, once a server answers there.
pub fn server() -> Result<String, String> {
    static READY: OnceLock<Result<String, String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let url = std::env::var("QSM_TEST_POSTGRES")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
            if execute_once(&url, "SELECT 1").is_ok() {
                drop_abandoned(&url);
                return Ok(url);
            }
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ensure-postgres.sh");
            let status = std::process::Command::new("bash")
                .arg(script)
                .status()
                .map_err(|e| format!("running {script}: {e}"))?;
            if !status.success() {
                return Err(format!("{script} failed ({status}): no PostgreSQL for the tests"));
            }
            execute_once(&url, "SELECT 1").map_err(|e| e.to_string())?;
            drop_abandoned(&url);
            Ok(url)
        })
        .clone()
}

/// Drops the databases of test processes that are gone (a killed run, or a test binary whose
/// statics were never dropped).
fn drop_abandoned(url: &str) {
    for name in databases(url, "qsm_test_").unwrap_or_default() {
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = execute_once(url, &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

/// A new, empty database, dropped (with its connections) when this is.
#[derive(Debug)]
pub struct TempDatabase {
    admin: String,
    name: String,
    /// Its URL.
    pub url: String,
}

impl TempDatabase {
    /// Creates one on [`server`].
    pub fn new() -> Result<TempDatabase, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        let admin = server()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "qsm_test_{}_{}_{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        execute_once(&admin, &format!("CREATE DATABASE {name}")).map_err(|e| e.to_string())?;
        let (base, _) = admin.rsplit_once('/').ok_or("the server URL has no database name")?;
        let url = format!("{base}/{name}");
        Ok(TempDatabase { admin, name, url })
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let _ = execute_once(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// Runs `sql` on the database at `url` (to build states the API refuses to make).
pub fn execute(url: &str, sql: &str) -> Result<(), String> {
    execute_once(url, sql).map_err(|e| e.to_string())
}
