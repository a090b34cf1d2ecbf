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

/// A PostgreSQL server of the test's own: a new cluster (`initdb`) in a temporary directory,
/// listening on a free port of 127.0.0.1 with trust authentication, so that a test can stop
/// and restart it without disturbing the shared server other tests use. It runs PostgreSQL's
/// own binaries (installed by `scripts/ensure-postgres.sh` where missing), as user `postgres`
/// when this process is root, since PostgreSQL refuses to run as root. Stopped (immediately)
/// and removed when dropped.
#[derive(Debug)]
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
    as_postgres: bool,
}

impl Cluster {
    /// Creates the cluster and starts it.
    pub fn start() -> Result<Cluster, String> {
        use std::os::unix::fs::MetadataExt;
        server()?;
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|e| format!("/usr/lib/postgresql (PostgreSQL's binaries): {e}"))?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .max_by_key(|b| {
                b.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
            })
            .ok_or("no /usr/lib/postgresql/VERSION/bin/initdb")?;
        let dir = tempfile::Builder::new()
            .prefix("qsm-pg-")
            .tempdir()
            .map_err(|e| format!("a directory for a PostgreSQL cluster: {e}"))?;
        // The effective user owns /proc/self.
        let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let cluster = Cluster { dir, bin, port, as_postgres: root };
        if root {
            cluster.run("chown", &["postgres:".as_ref(), cluster.dir.path().as_os_str()], false)?;
        }
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-A".as_ref(),
                "trust".as_ref(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--no-sync".as_ref(),
                "--no-instructions".as_ref(),
            ],
            true,
        )?;
        let settings = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\n",
            cluster.dir.path().display()
        );
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).map_err(|e| format!("{conf:?}: {e}"))?;
        text.push_str(&settings);
        std::fs::write(&conf, text).map_err(|e| format!("{conf:?}: {e}"))?;
        cluster.resume()?;
        Ok(cluster)
    }

    /// The URL of its database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `db` and returns its URL.
    pub fn create_database(&self, db: &str) -> Result<String, String> {
        execute(&self.url("postgres"), &format!("CREATE DATABASE {db}"))?;
        Ok(self.url(db))
    }

    /// Stops the server as `pg_ctl stop -m fast` does for a restart: every session is
    /// terminated, open transactions are rolled back, and connections are refused until
    /// [`Cluster::resume`].
    pub fn stop(&self) -> Result<(), String> {
        self.pg_ctl(&["-m", "fast", "-w", "stop"])
    }

    /// Starts it (again) and waits until it accepts connections.
    pub fn resume(&self) -> Result<(), String> {
        self.pg_ctl(&["-w", "start"])
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let data = self.data();
        let log = self.dir.path().join("log");
        let mut all: Vec<&std::ffi::OsStr> =
            vec!["-D".as_ref(), data.as_os_str(), "-l".as_ref(), log.as_os_str()];
        all.extend(args.iter().map(std::ffi::OsStr::new));
        self.run("pg_ctl", &all, true)
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `program` (one of PostgreSQL's if `postgres_bin`), as user postgres if root.
    fn run(
        &self,
        program: &str,
        args: &[&std::ffi::OsStr],
        postgres_bin: bool,
    ) -> Result<(), String> {
        let program = if postgres_bin { self.bin.join(program) } else { program.into() };
        let mut cmd = if self.as_postgres && postgres_bin {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            std::process::Command::new(&program)
        };
        cmd.args(args);
        let out = cmd.output().map_err(|e| format!("running {}: {e}", program.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}): {}",
                program.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
    }
}

/// A small tmpfs mounted for a test that needs a disk of its own to fill (issue 23: a full
/// disk under the catalog), unmounted when dropped. Mounting needs root: [`Tmpfs::mount`]
/// gives `Ok(None)` when not root, after saying on stderr what `test` skipped and why, and an
/// error instead when `QSM_TEST_REQUIRE_ROOT=1` (as CI sets it), so such a test never passes
/// silently without running.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` reads it: "8m") on a new directory.
    pub fn mount(test: &str, size: &str) -> Result<Option<Tmpfs>, String> {
        let skip = |why: String| {
            if std::env::var("QSM_TEST_REQUIRE_ROOT").as_deref() == Ok("1") {
                return Err(format!("{test}: QSM_TEST_REQUIRE_ROOT=1, but {why}"));
            }
            eprintln!("{test}: skipped: {why}");
            Ok(None)
        };
        if !rustix::process::geteuid().is_root() {
            return skip("mounting a tmpfs to fill needs root".into());
        }
        let dir = tempfile::TempDir::new().map_err(|e| format!("a directory to mount on: {e}"))?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            // Root without the capability (an unprivileged container): the test cannot run.
            return skip(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Some(Tmpfs { dir }))
    }

    /// Where it is mounted.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills it: writes a file (`fill` in its root) until the disk refuses with ENOSPC.
    /// Returns the bytes written.
    pub fn fill(&self) -> Result<u64, String> {
        use std::io::Write;
        let path = self.path().join("fill");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let block = vec![0x5a_u8; 4096];
        let mut written = 0u64;
        loop {
            match f.write(&block) {
                Ok(0) => return Err(format!("{}: wrote nothing, yet no error", path.display())),
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => return Ok(written),
                Err(e) => return Err(format!("filling {}: {e}", path.display())),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a file still open (a child killed mid-test) must not leave the mount behind.
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
